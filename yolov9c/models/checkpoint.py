"""Checkpoint files: ours (plain data, atomic writes) and published YOLOv9 `.pt` files (restricted unpickler).

Our format is a dict of plain data only, so it loads with `torch.load(path, weights_only=True)`:

    format 'yolov9c', version 1, model (state_dict), ema (state_dict or None), updates, optimizer (state_dict or
    None), epoch, best_fitness, opt (dict), hyp (dict), yaml (the model dict), yaml_file (its file name or ''),
    names, nc, stride (list), date, git

Published YOLOv9 files (train_dual.py's last.pt/best.pt, the released yolov9-c.pt, converted gelan files) pickle
whole model objects (`models.yolo.DetectionModel`, `models.common.Conv`, ...). They are read through
`RestrictedUnpickler`, whose `find_class` resolves only a closed list of names: the published model classes
(mapped by name onto ours), a list of torch.nn layers, torch's tensor rebuild helpers and a few harmless
containers. Any other global (os.system, builtins.eval, an unknown models.foo.Bar) stops the load with
`UnsafeCheckpointError` before anything from the file runs. From the unpickled model only `.yaml`, `.names`,
`.hyp` and the state_dict are kept; our own DetectionModel is built from the yaml and receives the weights.

    ckpt = read_checkpoint("yolov9-c.pt")     # ours or published -> dict in our format (tensors on the CPU)
    model = load_model("yolov9-c.pt")         # float32 DetectionModel, eval mode, EMA weights when present
    save_checkpoint("last.pt", model, ema=ema, optimizer=opt, epoch=3, opt=vars(args), hyp=hyp)

Every write is atomic (atomic_write / atomic_torch_save: a temp ".<name>.<random>.tmp" next to the file, fsync,
rename): a reader or a crash sees the old file or the whole new one. A full disk raises DiskFullError (an
OSError whose str is one `error:` line: the file, its estimated size, the free space); the old file stays.

Test: python -m pytest -q tests/test_checkpoint.py
"""

from __future__ import annotations

import argparse
import collections
import copy
import datetime
import errno
import logging
import os
import pathlib
import pickle
import shutil
import tempfile
import types
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

LOGGER = logging.getLogger("yolov9c")

FORMAT = "yolov9c"
VERSION = 1

# Keys of a checkpoint dict in our format, in the order they are written.
CHECKPOINT_KEYS = ("format", "version", "epoch", "best_fitness", "model", "ema", "updates", "optimizer", "opt",
                   "hyp", "yaml", "yaml_file", "names", "nc", "stride", "date", "git")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read or does not fit the model it is loaded into."""


class UnsafeCheckpointError(CheckpointError, pickle.UnpicklingError):
    """The file names a global that a YOLOv9 checkpoint never contains; nothing from the file was run."""


# ----------------------------------------------------------------------------------------------------------
# Writing: plain data, atomically
# ----------------------------------------------------------------------------------------------------------

def _unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside DataParallel / DistributedDataParallel wrappers."""
    while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        model = model.module
    return model


def to_plain(obj: Any, where: str = "value") -> Any:
    """A copy of `obj` made only of what `torch.load(weights_only=True)` accepts: None, bool, int, float, str,
    tensors, and lists/tuples/dicts of those. Paths become str, argparse.Namespace a dict, sets sorted lists,
    numpy scalars/arrays Python numbers/lists, torch.device/dtype their str. Anything else raises TypeError
    naming `where` (a key path such as "opt['save_dir']"), so a checkpoint never silently pickles an object."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, (pathlib.PurePath, torch.device, torch.dtype)):
        return str(obj)
    if isinstance(obj, argparse.Namespace):
        obj = vars(obj)
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not (k is None or isinstance(k, (bool, int, float, str))):
                raise TypeError(f"save_checkpoint: {where} has a key of type {type(k).__name__}; keys must be str "
                                f"or numbers")
            out[k] = to_plain(v, f"{where}[{k!r}]")
        return out
    if isinstance(obj, (list, tuple)):
        items = [to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return tuple(items) if isinstance(obj, tuple) else items
    if isinstance(obj, (set, frozenset)):
        return sorted((to_plain(v, f"{where}{{}}") for v in obj), key=repr)
    # numpy without importing it: scalars and arrays both have .tolist()
    if type(obj).__module__ == "numpy" and hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"save_checkpoint: {where} holds a {type(obj).__module__}.{type(obj).__qualname__}, which is "
                    f"not plain data (allowed: None, bool, int, float, str, tensors, lists, tuples, dicts)")


def _state_dict(module: nn.Module, half: bool) -> dict:
    """state_dict of `module` as CPU tensors detached from autograd; floating tensors cast to fp16 if `half`.
    Returns an OrderedDict name -> tensor (registration order, as in spec/goldens/<cfg>.keys.txt). fp32 CPU
    tensors still share memory with the model: write the dict out before the model changes."""
    sd = collections.OrderedDict()
    for k, v in _unwrap(module).state_dict().items():
        v = v.detach().cpu()
        sd[k] = v.half() if half and v.is_floating_point() else v
    return sd


def _default_file_mode() -> int:
    """Permission bits a plain open(path, 'w') would give (0o666 minus the umask); mkstemp would use 0o600."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    return 0o644


# Temp files of an atomic write: ".<name>.<random>.tmp" next to the target, so that a run folder can find and
# remove those of a killed writer (yolov9c/engine/train/run_folder.py).
TEMP_PREFIX, TEMP_SUFFIX = ".", ".tmp"
# errno values meaning "the disk (or the quota) is full"
_NO_SPACE = {errno.ENOSPC} | ({errno.EDQUOT} if hasattr(errno, "EDQUOT") else set())


def is_temp_name(name: str) -> bool:
    """True for the name of an atomic write's temp file (".last.pt.k2j4x9_a.tmp")."""
    return name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX) and len(name) > 5


class DiskFullError(OSError):
    """A write ran out of disk space (ENOSPC / EDQUOT). The file being replaced is intact and no temp file is
    left. str(e) is one line for `error:`: what was written, about how much it needs and how much is free.
    Attributes: path, what, needed (bytes, an estimate), free (bytes)."""

    def __init__(self, path: Path, what: str, needed: int, free: int | None, err: int = errno.ENOSPC):
        self.path, self.what, self.needed, self.free = Path(path), what, needed, free
        mb = lambda n: f"{n / 1e6:.1f} MB"  # noqa: E731
        if free is None:
            room = f"it needs about {mb(needed)}, free space in {self.path.parent} unknown"
        elif free < needed:
            room = f"it needs about {mb(needed)}, {mb(free)} free in {self.path.parent}"
        else:  # the estimate fits the free space the failed write left: the file system's overhead did not
            room = (f"about {mb(needed)} did not fit in the {mb(free)} free in {self.path.parent} (file-system "
                    f"blocks, a quota or space reserved for root take the rest)")
        kept = f"the previous {self.path.name} is intact" if self.path.exists() else "nothing was written"
        # --resume needs a saved checkpoint: a run whose first save failed starts again with the same command
        saved = [p for p in (self.path.parent / "last.pt", self.path.parent / "weights" / "last.pt") if p.is_file()]
        again = (f"run again with --resume {saved[0]} (it continues from the last saved epoch)" if saved else
                 "run the same command again (no checkpoint was saved yet: nothing to resume)")
        msg = (f"No space left on device writing {self.path} ({what}): {room}; {kept}. Free some space (or use "
               f"another --project), then {again}")
        super().__init__(err, msg)

    def __str__(self) -> str:
        return self.strerror


class _CountingWriter:
    """The temp file as torch.save sees it: counts the bytes written and keeps the first OSError, which torch
    otherwise turns into "RuntimeError: [enforce fail at inline_container.cc:...] unexpected pos"."""

    def __init__(self, f):
        self.f, self.written, self.error = f, 0, None

    def write(self, b):
        try:
            n = self.f.write(b)
        except OSError as e:
            self.error = self.error or e
            raise
        self.written += len(b)
        return n

    def flush(self):
        self.f.flush()


def _space_error(exc: BaseException, writer: _CountingWriter) -> OSError | None:
    """The OSError behind a failed write when it means "no space left", else None. torch wraps the error of a
    file-like object's write in a RuntimeError (inline_container.cc); its context or our writer still has it."""
    for e in (exc, writer.error, exc.__context__, exc.__cause__):
        if isinstance(e, OSError) and e.errno in _NO_SPACE:
            return e
    if isinstance(exc, RuntimeError) and "No space left on device" in str(exc):
        return OSError(errno.ENOSPC, str(exc))
    return None


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _fsync_dir(folder: Path) -> None:
    """The rename itself must reach the disk too, or a power cut can bring back the old directory entry."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _atomic(path: Path, write: Callable[[Any], None], what: str, size_hint: int) -> Path:
    """write(f) fills a temp file next to `path`; flush + fsync; os.replace over `path`; fsync the directory.
    On any failure (KeyboardInterrupt included) the temp file is removed and the error re-raised, as
    DiskFullError when the disk is full."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else _default_file_mode()
    fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    writer = None
    try:
        with os.fdopen(fd, "wb") as f:
            writer = _CountingWriter(f)
            write(writer)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        full = _space_error(e, writer or _CountingWriter(None)) if isinstance(e, Exception) else None
        if full is not None:
            needed = max(size_hint, writer.written if writer else 0)
            raise DiskFullError(path, what, needed, _free_bytes(path.parent), full.errno) from e
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write(path: str | os.PathLike, data: bytes | str, what: str = "file") -> Path:
    """Write `data` (str: UTF-8) to `path` atomically: `path` is the old file or the whole new one, never a
    torso (temp + fsync + rename). A full disk raises DiskFullError naming `what`, the old file intact."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    return _atomic(Path(path), lambda f: f.write(raw), what, len(raw))


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike, what: str = "file") -> Path:
    """Make `dst` an atomic copy of `src`: a hard link under a temp name renamed over `dst` (no bytes written,
    no space needed; `src` replaced later by a rename leaves `dst` unchanged), or, where the file system has no
    hard links, a full copy written as atomic_write does. A full disk raises DiskFullError."""
    src, dst = Path(src), Path(dst)
    tmp = dst.with_name(f"{TEMP_PREFIX}{dst.name}.{os.urandom(4).hex()}{TEMP_SUFFIX}")
    try:
        os.link(src, tmp)
    except OSError:
        pass
    else:
        try:
            os.replace(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(dst.parent)
        return dst

    def copy(f):
        with open(src, "rb") as s:
            shutil.copyfileobj(s, f, 1 << 20)

    return _atomic(dst, copy, what, src.stat().st_size)


def _tensor_bytes(obj: Any) -> int:
    """Bytes of all tensors in a nest of dicts/lists/tuples: the size of a torch.save file, give or take the
    pickled metadata."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def atomic_torch_save(obj: Any, path: str | os.PathLike, what: str = "checkpoint") -> Path:
    """torch.save(obj) to `path` so that `path` is either the old file or the complete new one, never a torso:
    write a temp file in the same directory (".<name>.<random>.tmp"), flush + fsync it, os.replace it over
    `path`, fsync the directory. On any failure (including KeyboardInterrupt) the temp file is removed and the
    exception re-raised; a full disk (ENOSPC/EDQUOT, also when torch wraps it in its inline_container.cc
    RuntimeError) raises DiskFullError with the file's estimated size and the free space."""
    return _atomic(Path(path), lambda f: torch.save(obj, f), what, _tensor_bytes(obj) + 65536)


def make_checkpoint(model: nn.Module, *, ema=None, optimizer=None, epoch: int = -1, opt=None, hyp=None,
                    best_fitness=None, updates=None, half: bool = True, date: str | None = None,
                    git=None) -> dict:
    """The checkpoint dict in our format (see CHECKPOINT_KEYS), without writing it.

    model: a DetectionModel (wrappers such as DDP are removed). ema: a module, or an EMA holder with `.ema`
    (module) and `.updates` (int). optimizer: a torch optimizer or its state_dict. half: store the model/EMA
    floating tensors as fp16, as the published train_dual.py does (halves the file; the optimizer state keeps
    its dtype). yaml/names/nc/stride/hyp come from the model's attributes; `hyp` overrides model.hyp."""
    model = _unwrap(model)
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
    """The end-of-training strip of train_dual.py: model := EMA (when present), fp16; ema, optimizer, updates and
    best_fitness := None; epoch := -1. Reads ours or a published file, writes ours to `out` (default: in place,
    atomically). Returns the written path."""
    ckpt = read_checkpoint(path)
    sd = ckpt["ema"] if ckpt.get("ema") else ckpt["model"]
    ckpt["model"] = collections.OrderedDict(
        (k, v.half() if v.is_floating_point() else v) for k, v in sd.items())
    ckpt.update(ema=None, optimizer=None, updates=None, best_fitness=None, epoch=-1)
    ckpt.pop("source", None)
    return atomic_torch_save(ckpt, out if out is not None else path, what="stripped checkpoint")


# ----------------------------------------------------------------------------------------------------------
# Reading published files: the restricted unpickler
# ----------------------------------------------------------------------------------------------------------

# Protocol-2 pickles (torch.save's default) name Python 2 modules; the C unpickler's own find_class maps them,
# but an override receives the raw names.
_MODULE_RENAMES = {"__builtin__": "builtins", "copy_reg": "copyreg"}

_TORCH_NN_LAYERS = {
    "torch.nn.modules.conv": ("Conv2d",),
    "torch.nn.modules.batchnorm": ("BatchNorm2d", "SyncBatchNorm"),  # --sync-bn runs pickle SyncBatchNorm
    "torch.nn.modules.activation": ("SiLU", "ReLU", "LeakyReLU", "Hardswish", "Sigmoid"),
    "torch.nn.modules.linear": ("Identity",),
    "torch.nn.modules.container": ("Sequential", "ModuleList"),
    "torch.nn.modules.upsampling": ("Upsample",),
    "torch.nn.modules.pooling": ("MaxPool2d", "AvgPool2d"),
}

# The published modules whose classes we re-implement; any class name found in our model modules is accepted.
_PUBLISHED_MODEL_MODULES = ("models.yolo", "models.common")
_OUR_MODEL_MODULES = ("yolov9c.models.common", "yolov9c.models.head", "yolov9c.models.model")


def _allowed_globals() -> dict:
    """(module, name) -> object for every global a YOLOv9 checkpoint may name, except the published model
    classes (resolved by _our_model_class). Built on first use so that numpy stays optional."""
    allowed = {}
    for mod, names in _TORCH_NN_LAYERS.items():
        for name in names:
            allowed[(mod, name)] = getattr(nn, name)
    # tensors and parameters: torch.save pickles these rebuild functions, not the classes
    import torch._tensor
    import torch._utils
    for name in ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
                 "_rebuild_parameter_with_state"):
        if hasattr(torch._utils, name):
            allowed[("torch._utils", name)] = getattr(torch._utils, name)
    allowed[("torch._tensor", "_rebuild_from_type_v2")] = torch._tensor._rebuild_from_type_v2
    allowed[("torch.nn.parameter", "Parameter")] = nn.Parameter
    allowed[("torch", "Tensor")] = torch.Tensor
    allowed[("torch", "Size")] = torch.Size  # DDetect.shape after an eval forward
    allowed[("torch", "device")] = torch.device
    for name in dir(torch):
        if isinstance(getattr(torch, name, None), torch.dtype):
            allowed[("torch", name)] = getattr(torch, name)
    # plain containers and values found in opt / best_fitness / date
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    allowed[("builtins", "set")] = set
    allowed[("builtins", "frozenset")] = frozenset
    allowed[("argparse", "Namespace")] = argparse.Namespace
    allowed[("_codecs", "encode")] = _bytes_from_latin1
    for name in ("datetime", "date", "time", "timedelta", "timezone"):
        allowed[("datetime", name)] = getattr(datetime, name)
    # paths are rebuilt as pure paths: no file-system access, and a WindowsPath loads on Linux
    for name, cls in (("PosixPath", pathlib.PurePosixPath), ("PurePosixPath", pathlib.PurePosixPath),
                      ("WindowsPath", pathlib.PureWindowsPath), ("PureWindowsPath", pathlib.PureWindowsPath)):
        allowed[("pathlib", name)] = cls
    try:  # best_fitness of an unstripped published last.pt is a numpy array
        import numpy as np
        try:
            from numpy._core import multiarray as np_multiarray
        except ImportError:  # numpy < 2
            from numpy.core import multiarray as np_multiarray
        for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
            allowed[(mod, "_reconstruct")] = np_multiarray._reconstruct
            allowed[(mod, "scalar")] = np_multiarray.scalar
        allowed[("numpy", "ndarray")] = np.ndarray
        allowed[("numpy", "dtype")] = np.dtype
        for name in ("Float64DType", "Float32DType", "Float16DType", "Int64DType", "Int32DType", "BoolDType"):
            if hasattr(getattr(np, "dtypes", None), name):
                allowed[("numpy.dtypes", name)] = getattr(np.dtypes, name)
    except ImportError:
        pass
    return allowed


_ALLOWED: dict | None = None


def _bytes_from_latin1(text, encoding="latin1"):
    """Protocol-2 pickles store bytes (e.g. a numpy array's buffer) as _codecs.encode(str, 'latin1'); this
    stand-in does that and nothing else (no other codec is looked up)."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafeCheckpointError(f"refusing _codecs.encode(..., {encoding!r}): only latin1 text is expected")
    return text.encode("latin1")


def _our_model_class(name: str):
    """Our nn.Module class called `name`, from yolov9c.models.{common,head,model}, or None. Only classes
    defined in our package qualify, so names those modules merely import (torch, math, ...) never resolve."""
    import importlib
    for modname in _OUR_MODEL_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        obj = mod.__dict__.get(name)
        if (isinstance(obj, type) and issubclass(obj, nn.Module) and obj.__name__ == name
                and obj.__module__.startswith("yolov9c.")):
            return obj
    return None


class RestrictedUnpickler(pickle.Unpickler):
    """pickle.Unpickler that resolves only the globals a YOLOv9 checkpoint contains (see module docstring).

    torch.load subclasses `pickle_module.Unpickler` and calls this find_class through super() for every name
    except its storage types (names containing 'Storage', which it maps itself to dtype holders)."""

    def find_class(self, module: str, name: str):
        global _ALLOWED
        module = _MODULE_RENAMES.get(module, module)
        if _ALLOWED is None:
            _ALLOWED = _allowed_globals()
        obj = _ALLOWED.get((module, name))
        if obj is None and module in _PUBLISHED_MODEL_MODULES:
            obj = _our_model_class(name)
        if obj is None and module in _PUBLISHED_MODEL_MODULES:
            raise UnsafeCheckpointError(
                f"refusing to unpickle '{module}.{name}': not a model class this package implements, so the file "
                f"is not a known YOLOv9 checkpoint (YOLOv9/GELAN detection models only; nothing from the file was "
                f"executed)")
        if obj is None:
            raise UnsafeCheckpointError(
                f"refusing to unpickle '{module}.{name}': the file is not a known YOLOv9 checkpoint (it names a "
                f"global outside the list a YOLOv9 model file uses; nothing from the file was executed)")
        return obj


def _restricted_load(file, **kwargs):
    return RestrictedUnpickler(file, **kwargs).load()


# torch.load(pickle_module=...) wants a module-like object: Unpickler (subclassed by torch), load (legacy
# format) and __name__ (checked against 'dill').
restricted_pickle = types.ModuleType("yolov9c_restricted_pickle")
restricted_pickle.Unpickler = RestrictedUnpickler
restricted_pickle.load = _restricted_load
restricted_pickle.UnpicklingError = pickle.UnpicklingError


def _module_state_dict(obj: nn.Module) -> collections.OrderedDict:
    """state_dict of an unpickled published model object, via nn.Module's own walk over _modules/_parameters/
    _buffers (never a method the file's class might carry). Tensors detached, on the CPU."""
    sd = nn.Module.state_dict(obj)
    return collections.OrderedDict((k, v.detach().cpu()) for k, v in sd.items())


def _from_published(raw: dict, path) -> dict:
    """Convert a published checkpoint dict (model objects) to our format (state_dicts + plain metadata)."""
    model_obj, ema_obj = raw.get("model"), raw.get("ema")
    ref = ema_obj if isinstance(ema_obj, nn.Module) else model_obj
    if not isinstance(ref, nn.Module):
        raise CheckpointError(f"{path}: no model object under 'model' or 'ema'; not a YOLOv9 checkpoint")
    yaml_dict = getattr(ref, "yaml", None)
    if not isinstance(yaml_dict, dict):
        raise CheckpointError(f"{path}: the stored model carries no yaml dict; cannot rebuild it")
    stride = getattr(ref, "stride", None)
    if isinstance(stride, torch.Tensor):
        stride = stride.tolist()
    names = getattr(ref, "names", None)
    nc = yaml_dict.get("nc", getattr(ref, "nc", None))
    opt = raw.get("opt")
    try:
        opt = to_plain(opt, "opt")
    except TypeError:
        opt = None  # metadata only; never worth refusing a model over
    best_fitness = raw.get("best_fitness")
    try:
        best_fitness = to_plain(best_fitness, "best_fitness")
    except TypeError:
        best_fitness = None
    return {
        "format": FORMAT,
        "version": VERSION,
        "source": "published",
        "epoch": raw.get("epoch", -1),
        "best_fitness": best_fitness,
        "model": _module_state_dict(model_obj) if isinstance(model_obj, nn.Module) else None,
        "ema": _module_state_dict(ema_obj) if isinstance(ema_obj, nn.Module) else None,
        "updates": raw.get("updates"),
        "optimizer": raw.get("optimizer"),
        "opt": opt,
        "hyp": to_plain(getattr(ref, "hyp", None), "hyp") if isinstance(getattr(ref, "hyp", None), dict) else None,
        "yaml": to_plain(copy.deepcopy(yaml_dict), "yaml"),
        "yaml_file": str(getattr(ref, "yaml_file", "") or ""),
        "names": to_plain(names, "names"),
        "nc": nc,
        "stride": stride,
        "date": raw.get("date"),
        "git": raw.get("git"),
    }


def _unreadable(path: Path, e: Exception) -> str:
    """read_checkpoint's one-line message for a file torch.load refused with `e`: what the file is when that is
    plain (a TorchScript archive, a text file), in our words (torch's own advice for TorchScript, to load it
    with weights_only=False, would run the file's code). Test: tests/test_checkpoint.py."""
    import zipfile

    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            if any(n.endswith("constants.pkl") or "/code/" in n for n in z.namelist()):
                return (f"{path}: a TorchScript archive (torch.jit.save), not a checkpoint; yolov9c reads "
                        f"torch.save files only: give the .pt that training wrote (ours or the published code's)")
    with open(path, "rb") as f:
        head = f.read(4096)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if not head or (text is not None and "\0" not in text):
        first = " ".join(text.split())[:40] if text else ""
        return (f"{path}: not a torch checkpoint: the file is {'empty' if not head else f'text ({first!r} ...)'}; "
                f"give a .pt written by training (weights/best.pt)")
    return f"{path}: not a readable torch checkpoint ({type(e).__name__}: {e})"


def read_checkpoint(path: str | os.PathLike) -> dict:
    """Read a checkpoint, ours or published, into a dict in our format with every tensor on the CPU.

    Ours load with torch.load(weights_only=True). A file that this refuses is read again through
    RestrictedUnpickler (published files hold model objects); it gets 'source': 'published'. A bare state_dict
    (all tensors) comes back as {'model': sd, 'yaml': None, ...}. Raises FileNotFoundError, CheckpointError,
    UnsafeCheckpointError (a global outside the allowed list: nothing from the file was run)."""
    path = Path(path)
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
        return _from_published(raw, path)
    if isinstance(raw, dict) and raw and all(isinstance(v, torch.Tensor) for v in raw.values()):
        ckpt = {k: None for k in CHECKPOINT_KEYS}
        ckpt.update(format=FORMAT, version=VERSION, source="state_dict", epoch=-1,
                    model=collections.OrderedDict(raw))
        return ckpt
    found = type(raw).__name__ + (f" with keys {list(raw)[:8]}" if isinstance(raw, dict) else "")
    raise CheckpointError(f"{path}: neither a yolov9c checkpoint, a published YOLOv9 checkpoint nor a "
                          f"state_dict (found {found})")


# ----------------------------------------------------------------------------------------------------------
# Weights into models
# ----------------------------------------------------------------------------------------------------------

def transfer_weights(model: nn.Module, state_dict: dict, *, exclude=("anchor",), source: str = "",
                     verbose: bool = True) -> tuple[int, int]:
    """Copy into `model` every tensor of `state_dict` whose name is one of the model's state_dict keys, whose
    shape equals the model's and whose name contains none of `exclude` (train_dual.py --weights semantics;
    dtypes are cast to the model's). Logs "Transferred X/Y items from <source>" and returns (X, Y), Y being the
    number of entries of the model's state_dict."""
    model = _unwrap(model)
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
