"""Weights into models: a checkpoint's state_dict copied into our DetectionModel.

    model = load_model("yolov9-c.pt")         # float32 DetectionModel, eval mode, EMA weights when present
    model, (n, total) = model_from_checkpoint(read_checkpoint(path), cfg=None, strict=True)
    transfer_weights(model, sd)               # train_dual.py --weights: same name and shape, 'anchor' excluded

Test: python -m pytest -q tests/models/test_checkpoint.py -k "load or transfer"
"""

from __future__ import annotations

import copy
import logging
import os

from torch import nn

from yolov9c.models.checkpoint import CheckpointError, read_checkpoint
from yolov9c.models.ckpt_data import unwrap

LOGGER = logging.getLogger("yolov9c")


def transfer_weights(model: nn.Module, state_dict: dict, *, exclude=("anchor",), source: str = "",
                     verbose: bool = True) -> tuple[int, int]:
    """Copy into `model` every tensor of `state_dict` whose name is one of the model's state_dict keys, whose
    shape equals the model's and whose name contains none of `exclude` (train_dual.py --weights semantics;
    dtypes are cast to the model's). Logs "Transferred X/Y items from <source>" and returns (X, Y), Y being the
    number of entries of the model's state_dict."""
    model = unwrap(model)
    msd = model.state_dict()
    matched = {k: v for k, v in state_dict.items()
               if k in msd and v.shape == msd[k].shape and not any(x in k for x in exclude)}
    model.load_state_dict(matched, strict=False)
    if verbose:
        LOGGER.info(f"Transferred {len(matched)}/{len(msd)} items from {source}")
    return len(matched), len(msd)


def _mismatch_report(model_sd: dict, sd: dict, limit: int = 5) -> str:
    missing = [k for k in model_sd if k not in sd]
    unexpected = [k for k in sd if k not in model_sd]
    shapes = [f"{k} {tuple(sd[k].shape)} vs model {tuple(model_sd[k].shape)}"
              for k in model_sd if k in sd and sd[k].shape != model_sd[k].shape]
    parts = []
    for label, items in (("missing from the file", missing), ("not in the model", unexpected),
                         ("shape differs", shapes)):
        if items:
            more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
            parts.append(f"{len(items)} {label}: {', '.join(items[:limit])}{more}")
    return "; ".join(parts)


def model_from_checkpoint(ckpt: dict, *, cfg=None, prefer_ema: bool = True, strict: bool = True,
                          source: str = "") -> tuple[nn.Module, tuple[int, int]]:
    """Build our DetectionModel for a checkpoint dict (from read_checkpoint) and load its weights.

    cfg: model config to build instead of the stored yaml (needed for bare state_dicts). prefer_ema: take the
    EMA weights when the file has them. strict: every key must match by name and shape (else CheckpointError
    naming the differences). Returns (model in float32 and eval mode, (transferred, total))."""
    from yolov9c.models.model import DetectionModel

    sd = ckpt.get("ema") if prefer_ema and ckpt.get("ema") else ckpt.get("model")
    if not sd:
        raise CheckpointError(f"{source}: checkpoint holds no model weights")
    spec = cfg if cfg is not None else ckpt.get("yaml")
    if spec is None:
        raise CheckpointError(f"{source}: checkpoint stores no model yaml; pass the model config (cfg)")
    model = DetectionModel(copy.deepcopy(spec) if isinstance(spec, dict) else spec)
    msd = model.state_dict()
    if strict:
        report = _mismatch_report(msd, sd)
        if report:
            raise CheckpointError(f"{source}: weights do not fit the model "
                                  f"{getattr(model, 'yaml_file', '') or 'built from the stored yaml'}: {report}")
    counts = transfer_weights(model, sd, exclude=(), source=source)
    if ckpt.get("names") is not None:
        names = ckpt["names"]  # the published data loader may have made it a dict {0: 'person', ...}
        model.names = [names[k] for k in sorted(names)] if isinstance(names, dict) else list(names)
    if cfg is None and ckpt.get("yaml_file") and not getattr(model, "yaml_file", ""):
        model.yaml_file = ckpt["yaml_file"]  # built from the stored dict: keep the summary's name
    if ckpt.get("hyp") is not None:
        model.hyp = ckpt["hyp"]
    stored = ckpt.get("stride")
    if stored is not None and hasattr(model, "stride") and [float(s) for s in stored] != model.stride.tolist():
        LOGGER.warning(f"{source}: stored stride {stored} differs from the rebuilt model's {model.stride.tolist()}")
    return model.float().eval(), counts


def load_model(path: str | os.PathLike, *, cfg=None, prefer_ema: bool = True, strict: bool = True) -> nn.Module:
    """The model in a checkpoint file (ours, published, or a bare state_dict with `cfg`).

    Returns our DetectionModel in float32 and **eval mode** (call .train() to train it), unfused (call
    .fuse() for inference speed), with the EMA weights when the file has them (prefer_ema), names and hyp
    restored. strict: every state_dict entry must match by name and shape."""
    ckpt = read_checkpoint(path)
    model, _ = model_from_checkpoint(ckpt, cfg=cfg, prefer_ema=prefer_ema, strict=strict, source=str(path))
    return model
