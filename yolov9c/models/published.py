"""Published YOLOv9 `.pt` files (pickled model objects) read safely and converted to our checkpoint format.

train_dual.py's last.pt/best.pt, the released yolov9-c.pt and converted gelan files pickle whole model objects
(`models.yolo.DetectionModel`, `models.common.Conv`, ...). They are read through RestrictedUnpickler, whose
find_class resolves only a closed list of names: the published model classes (mapped by name onto ours), a list of
torch.nn layers, torch's tensor rebuild helpers and a few harmless containers. Any other global (os.system,
builtins.eval, an unknown models.foo.Bar) stops the load with UnsafeCheckpointError before anything from the file
runs. from_published keeps only `.yaml`, `.names`, `.hyp` and the state_dicts of the unpickled model.

    raw = torch.load(path, map_location="cpu", pickle_module=restricted_pickle, weights_only=False)
    ckpt = from_published(raw, path)          # a dict in our format, 'source': 'published'
    msg = weights_not_found(path)             # the one message for a missing --weights or a folder (train, val, ...)
    msg = weights_file_error(path)            # train's --weights: missing, a folder, not a .pt (None: a .pt file)

Test: python -m pytest -q tests/models/test_checkpoint.py -k "published or unsafe or restricted"
"""

from __future__ import annotations

import argparse
import collections
import copy
import datetime
import pathlib
import pickle
import re
import types

import torch
from torch import nn

from yolov9c.models.ckpt_data import FORMAT, VERSION, CheckpointError, UnsafeCheckpointError, to_plain

RELEASES = "https://github.com/WongKinYiu/yolov9/releases"
# the release assets' names (yolov9-c.pt, gelan-s.pt, yolov9-e-converted.pt, ...), as the published guides use them
_RELEASE_ASSET = re.compile(r"(yolov9|gelan)-[tsmce](-converted)?\.pt")


def weights_not_found(path) -> str:
    """The message for a --weights path that is not a file, the same in train, val, detect and the tools: for a
    folder, that a .pt file is expected (one found inside named); else the path, and for a published release
    asset's name where to download it (as README.md's FAQ says)."""
    p = pathlib.Path(str(path))
    if p.is_dir():
        found = sorted(p.glob("*.pt")) or sorted(p.glob("weights/*.pt"))
        return f"--weights {path}: a folder, not a checkpoint file: give a .pt file" + (
            f", e.g. {found[0]}" if found else "")
    name = p.name
    where = (f"; {name} is a release asset of the published YOLOv9 repository: download it from {RELEASES} "
             f"(yolov9c downloads nothing)" if _RELEASE_ASSET.fullmatch(name) else "")
    return f"--weights {path}: file not found{where}"


def weights_file_error(path) -> str | None:
    """Why train's --weights `path` cannot be trained from, before it is read, or None for a .pt file: missing
    (weights_not_found), a folder, or another suffix (the published train stops on any suffix but .pt; training
    from scratch instead would hide the mistake)."""
    p = pathlib.Path(str(path))
    if not p.is_file():
        return weights_not_found(path)
    if p.suffix.lower() != ".pt":
        return (f"--weights {path}: not a .pt file; training starts from a .pt checkpoint (ours, or a published "
                f"YOLOv9 .pt), as published")
    return None


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


def from_published(raw: dict, path) -> dict:
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
    if isinstance(best_fitness, list) and len(best_fitness) == 1:  # an unstripped last.pt: fitness()'s (1,) array
        best_fitness = float(best_fitness[0])
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
