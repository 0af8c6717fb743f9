"""The checkpoint format's vocabulary: its tag and version, the keys it writes, what it may hold, its errors.

A checkpoint in our format is a dict of plain data only (to_plain), so it loads with
`torch.load(path, weights_only=True)`. CheckpointError: a file cannot be read or does not fit the model;
UnsafeCheckpointError: a published file names a global outside the allowed list (nothing from it was run).

Test: python -m pytest -q tests/models/test_checkpoint.py
"""

from __future__ import annotations

import argparse
import pathlib
import pickle
from typing import Any

import torch
from torch import nn

FORMAT = "yolov9c"
VERSION = 1

# Keys of a checkpoint dict in our format, in the order they are written.
CHECKPOINT_KEYS = ("format", "version", "epoch", "best_fitness", "model", "ema", "updates", "optimizer", "opt",
                   "hyp", "yaml", "yaml_file", "names", "nc", "stride", "date", "git")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read or does not fit the model it is loaded into."""


class UnsafeCheckpointError(CheckpointError, pickle.UnpicklingError):
    """The file names a global that a YOLOv9 checkpoint never contains; nothing from the file was run."""


def unwrap(model: nn.Module) -> nn.Module:
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
