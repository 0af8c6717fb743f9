"""Checkpoint files in our format: made, written atomically, stripped, and read (ours or published).

Our format is a dict of plain data only, so it loads with `torch.load(path, weights_only=True)`:
    format 'yolov9c', version 1, model (state_dict), ema (state_dict or None), updates, optimizer (state_dict or
    None), epoch, best_fitness, opt (dict), hyp (dict), yaml (the model dict), yaml_file (its file name or ''),
    names, nc, stride (list), date, git

    ckpt = read_checkpoint("yolov9-c.pt")     # ours or published -> dict in our format (tensors on the CPU)
    save_checkpoint("last.pt", model, ema=ema, optimizer=opt, epoch=3, opt=vars(args), hyp=hyp)

Published files go through the restricted unpickler (models/published.py); writes through models/atomic_io.py;
weights into a model: models/weights.py; overflow-free fp16 casts and the inf/NaN warning: models/finite.py.
Test: python -m pytest -q tests/models/test_checkpoint.py
"""

from __future__ import annotations

import collections
import copy
import datetime
import logging
import os
import pickle
import warnings
from pathlib import Path

import torch
from torch import nn

from yolov9c.models.atomic_io import atomic_torch_save
from yolov9c.models.ckpt_data import (CHECKPOINT_KEYS, FORMAT, VERSION, CheckpointError, UnsafeCheckpointError,
                                      to_plain, unwrap)
from yolov9c.models.finite import FP16_MAX, describe, half_where_safe, warn_nonfinite
from yolov9c.models.published import from_published, restricted_pickle

LOGGER = logging.getLogger("yolov9c")

__all__ = ["CHECKPOINT_KEYS", "FORMAT", "VERSION", "CheckpointError", "UnsafeCheckpointError", "make_checkpoint",
           "read_checkpoint", "save_checkpoint", "strip_checkpoint", "to_plain"]


def _state_dict(module: nn.Module, half: bool) -> dict:
    """state_dict of `module` as CPU tensors detached from autograd; floating tensors cast to fp16 if `half`
    (finite.half_where_safe: a tensor with a finite value beyond the fp16 range stays float32).
    Returns an OrderedDict name -> tensor (registration order, as the published state_dict). fp32 CPU
    tensors still share memory with the model: write the dict out before the model changes."""
    sd = collections.OrderedDict()
    for k, v in unwrap(module).state_dict().items():
        v = v.detach().cpu()
        sd[k] = v
    return half_where_safe(sd)[0] if half else sd


def make_checkpoint(model: nn.Module, *, ema=None, optimizer=None, epoch: int = -1, opt=None, hyp=None,
                    best_fitness=None, updates=None, half: bool = True, date: str | None = None,
                    git=None) -> dict:
    """The checkpoint dict in our format (see CHECKPOINT_KEYS), without writing it.

    model: a DetectionModel (wrappers such as DDP are removed). ema: a module, or an EMA holder with `.ema`
    (module) and `.updates` (int). optimizer: a torch optimizer or its state_dict. half: store the model/EMA
    floating tensors as fp16, as the published train_dual.py does (halves the file; the optimizer state keeps
    its dtype). yaml/names/nc/stride/hyp come from the model's attributes; `hyp` overrides model.hyp."""
    model = unwrap(model)
    ema_module = getattr(ema, "ema", ema)
    if updates is None and ema is not None:
        updates = getattr(ema, "updates", None)
    if optimizer is not None and hasattr(optimizer, "state_dict"):
        optimizer = optimizer.state_dict()
    if hyp is None:
        hyp = getattr(model, "hyp", None)
    stride = getattr(model, "stride", None)
    if isinstance(stride, torch.Tensor):
        stride = stride.tolist()
    yaml_dict = getattr(model, "yaml", None)
    names = getattr(model, "names", None)
    nc = getattr(model, "nc", None)
    if nc is None and isinstance(yaml_dict, dict):
        nc = yaml_dict.get("nc")
    ckpt = {
        "format": FORMAT,
        "version": VERSION,
        "epoch": int(epoch),
        "best_fitness": to_plain(best_fitness, "best_fitness"),
        "model": _state_dict(model, half),
        "ema": _state_dict(ema_module, half) if ema_module is not None else None,
        "updates": None if updates is None else int(updates),
        "optimizer": to_plain(optimizer, "optimizer"),
        "opt": to_plain(opt, "opt"),
        "hyp": to_plain(hyp, "hyp"),
        "yaml": to_plain(copy.deepcopy(yaml_dict), "yaml"),
        "yaml_file": str(getattr(model, "yaml_file", "") or ""),
        "names": to_plain(names, "names"),
        "nc": None if nc is None else int(nc),
        "stride": to_plain(stride, "stride"),
        "date": date if date is not None else datetime.datetime.now().isoformat(),
        "git": to_plain(git, "git"),
    }
    return ckpt


def save_checkpoint(path: str | os.PathLike, model: nn.Module, *, ema=None, optimizer=None, epoch: int = -1,
                    opt=None, hyp=None, best_fitness=None, updates=None, half: bool = True,
                    git=None) -> Path:
    """Write a checkpoint in our format to `path`, atomically (see make_checkpoint for the arguments and
    atomic_torch_save for the write). Returns the path. The file loads with torch.load(weights_only=True)."""
    ckpt = make_checkpoint(model, ema=ema, optimizer=optimizer, epoch=epoch, opt=opt, hyp=hyp,
                           best_fitness=best_fitness, updates=updates, half=half, git=git)
    return atomic_torch_save(ckpt, path)


def strip_checkpoint(path: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """The end-of-training strip of train_dual.py: model := EMA (when present), fp16 (a tensor with a finite value
    beyond the fp16 range stays float32, logged: never a finite value made inf); ema, optimizer, updates and
    best_fitness := None; epoch := -1. Reads ours or a published file, writes ours to `out` (default: in place,
    atomically). Returns the written path."""
    ckpt = read_checkpoint(path)
    sd = ckpt["ema"] if ckpt.get("ema") else ckpt["model"]
    ckpt["model"], kept = half_where_safe(collections.OrderedDict(sd))
    if kept:
        LOGGER.info(f"{Path(path).name}: {len(kept)} tensors kept in float32 (values beyond the fp16 range "
                    f"±{FP16_MAX:g}: {describe(kept)})")
    ckpt.update(ema=None, optimizer=None, updates=None, best_fitness=None, epoch=-1)
    ckpt.pop("source", None)
    return atomic_torch_save(ckpt, out if out is not None else path, what="stripped checkpoint")


def _unreadable(path: Path, e: Exception) -> str:
    """read_checkpoint's one-line message for a file torch.load refused with `e`: what the file is when that is
    plain (a zip cut short, a TorchScript archive, a text file), in our words (torch's own advice for
    TorchScript, to load it with weights_only=False, would run the file's code). Test:
    tests/models/test_checkpoint.py."""
    import zipfile

    with open(path, "rb") as f:
        head = f.read(4096)
    if head.startswith(b"PK\x03\x04") and not zipfile.is_zipfile(path):  # torch.save's zip without its end
        return (f"{path}: incomplete or damaged checkpoint (its zip archive is cut short, {path.stat().st_size} "
                f"bytes: an interrupted copy or download); copy it again, or give another checkpoint")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            if any(n.endswith("constants.pkl") or "/code/" in n for n in z.namelist()):
                return (f"{path}: a TorchScript archive (torch.jit.save), not a checkpoint; yolov9c reads "
                        f"torch.save files only: give the .pt that training wrote (ours or the published code's)")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if not head or (text is not None and "\0" not in text):
        first = " ".join(text.split())[:40] if text else ""
        return (f"{path}: not a torch checkpoint: the file is {'empty' if not head else f'text ({first!r} ...)'}; "
                f"give a .pt written by training (weights/best.pt)")
    return f"{path}: not a readable torch checkpoint ({type(e).__name__}: {e})"


def read_checkpoint(path: str | os.PathLike, warn: bool = True) -> dict:
    """Read a checkpoint, ours or published, into a dict in our format with every tensor on the CPU.

    Ours load with torch.load(weights_only=True). A file that this refuses is read again through
    RestrictedUnpickler (published files hold model objects); it gets 'source': 'published'. A bare state_dict
    (all tensors) comes back as {'model': sd, 'yaml': None, ...}. Raises FileNotFoundError, CheckpointError,
    UnsafeCheckpointError (a global outside the allowed list: nothing from the file was run). warn: one WARNING
    line (finite.warn_nonfinite) when the model or EMA weights hold inf/NaN, naming them."""
    ckpt = _read(Path(path))
    if warn:
        warn_nonfinite(ckpt, path)
    return ckpt


def _read(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        with warnings.catch_warnings():  # the weights-only unpickler warns about protocol-4 pickles it may refuse
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # globals outside torch's weights-only list: a published file, or hostile
        try:
            raw = torch.load(path, map_location="cpu", pickle_module=restricted_pickle, weights_only=False)
        except UnsafeCheckpointError as e:
            raise UnsafeCheckpointError(f"{path}: {e}") from None
        except Exception as e:  # truncated or corrupt data surfaces as many exception types
            raise CheckpointError(_unreadable(path, e)) from None
    except Exception as e:
        raise CheckpointError(_unreadable(path, e)) from None

    if isinstance(raw, nn.Module):  # torch.save(model) of a whole published model, without the dict
        raw = {"model": raw}
    if isinstance(raw, dict) and raw.get("format") == FORMAT:
        if not isinstance(raw.get("version"), int) or raw["version"] > VERSION:
            raise CheckpointError(f"{path}: yolov9c checkpoint version {raw.get('version')!r} is newer than this "
                                  f"code understands ({VERSION}); upgrade yolov9c")
        raw.setdefault("source", FORMAT)
        return raw
    if isinstance(raw, dict) and ("model" in raw or "ema" in raw) and (
            isinstance(raw.get("model"), nn.Module) or isinstance(raw.get("ema"), nn.Module)):
        return from_published(raw, path)
    if isinstance(raw, dict) and raw and all(isinstance(v, torch.Tensor) for v in raw.values()):
        ckpt = {k: None for k in CHECKPOINT_KEYS}
        ckpt.update(format=FORMAT, version=VERSION, source="state_dict", epoch=-1,
                    model=collections.OrderedDict(raw))
        return ckpt
    found = type(raw).__name__ + (f" with keys {list(raw)[:8]}" if isinstance(raw, dict) else "")
    raise CheckpointError(f"{path}: neither a yolov9c checkpoint, a published YOLOv9 checkpoint nor a "
                          f"state_dict (found {found})")
