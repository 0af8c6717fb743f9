"""The conv weights in the autocast dtype, cast once a forward instead of once a conv (extension.lean_host()).

    with casts.weights_cast(model, dtype):   # pgi.model_forward: one foreach copy of every conv weight and bias
        ...                                  # lazy convs call cast(w, dtype): the kept copy, else w.to(dtype)

Under autocast every lazy conv call casts its fp32 weight (and bias) to the compute dtype, each cast a Python call,
an allocation and a launch. With lean_host() the c model's training forward instead refreshes
one kept copy per parameter (CastTable, made on first use, outside CUDA-graph capture) with one
torch._foreach_copy_, and a recomputed segment's backward reads the table its forward read (segment.py), so the
weights are cast once a forward, captured into a CUDA graph's forward as well. Values equal w.to(dtype) exactly:
the refresh runs at every training forward (graph replays update weights without a version bump, so no version
check could tell a stale copy), and the weights do not change between a forward and its backward. The refresh
writes through `.data` aliases (their own version counters), so a copy saved for an earlier forward's backward
does not fail autograd's in-place check when a second forward refreshes it with the same weights.
Test: python -m pytest -q tests/backends/test_lean_host.py
"""

import contextlib
import weakref

import torch

from yolov9c.ops.extension import lean_host

_ACTIVE = [None]  # the CastTable lazy convs read now (weights_cast, reading)
_TABLES = weakref.WeakKeyDictionary()  # model -> its CastTable


class CastTable:
    """Kept copies of `params` (the model's conv weights and biases, float32) in `dtype` on their device:
    copies {param: its copy}; refresh() writes every copy from its parameter in one foreach call."""

    __slots__ = ("dtype", "device", "params", "copies", "_targets", "__weakref__")

    def __init__(self, params, dtype):
        self.dtype, self.device, self.params = dtype, params[0].device, params
        with torch.no_grad():
            kept = [torch.empty_like(p, dtype=dtype) for p in params]
        self.copies = dict(zip(params, kept))
        self._targets = [k.data for k in kept]

    def fits(self, dtype):
        """The copies still stand for the parameters in `dtype` (Module.to moves a parameter's data, not it)."""
        p = self.params[0]
        return self.dtype == dtype and p.device == self.device and p.dtype == torch.float32

    def refresh(self):
        with torch.no_grad():
            torch._foreach_copy_(self._targets, self.params)


def _conv_params(model):
    """The float32 weights and biases of model's nn.Conv2d modules (what lazy convs cast), each once."""
    out, seen = [], set()
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            for p in (m._parameters.get("weight"), m._parameters.get("bias")):
                if p is not None and p.dtype == torch.float32 and id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
    return out


def _table(model, dtype):
    """model's CastTable for `dtype`, refreshed; None when there is nothing to cast or none can be made now (a
    CUDA graph being captured: a table made there would live in the graph's pool). The parameter list is read
    when the table is made (a model's conv parameters are fixed once it trains)."""
    table = _TABLES.get(model)
    if table is None or not table.fits(dtype):
        params = _conv_params(model)
        if not params or (params[0].is_cuda and torch.cuda.is_current_stream_capturing()):
            return None
        table = _TABLES[model] = CastTable(params, dtype)
    table.refresh()
    return table


@contextlib.contextmanager
def weights_cast(model, dtype):
    """Inside, with lean_host(), in a training forward (model.training, grad enabled) under autocast (`dtype`:
    the autocast dtype of the input's device, None when off), lazy convs read model's conv weights in `dtype` from
    its CastTable, refreshed on entry; otherwise (and in a nested block, which keeps the outer table) nothing
    changes."""
    if dtype is None or _ACTIVE[0] is not None or not (lean_host() and model.training and torch.is_grad_enabled()):
        yield
        return
    _ACTIVE[0] = _table(model, dtype)
    try:
        yield
    finally:
        _ACTIVE[0] = None


def current():
    """The table lazy convs read now (None: they cast), for a recomputed segment to read again in backward."""
    return _ACTIVE[0]


@contextlib.contextmanager
def reading(table):
    """Inside, lazy convs read `table` (a current() of an earlier forward; None: they cast)."""
    prev, _ACTIVE[0] = _ACTIVE[0], table
    try:
        yield
    finally:
        _ACTIVE[0] = prev


def cast(w, dtype):
    """w in `dtype`: its kept copy in the table being read, else w.to(dtype)."""
    table = _ACTIVE[0]
    if table is not None and table.dtype == dtype:
        got = table.copies.get(w)
        if got is not None:
            return got
    return w.to(dtype)
