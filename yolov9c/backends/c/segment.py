"""Recomputed segments: run a function of lazy values without storing its inside, re-run it in backward.

    value = run_segment(fn, inputs, params, keep_inputs=False)   # fn(inputs) -> a lazy value / tensor / tuple

`inputs`: a dict of lazy values, tensors or tuples/lists of them; `params`: the parameters fn uses
(layers.parameters_of(its modules)). SegmentFunction runs fn without autograd, so only the tensors of its result that fn created (typically the
last conv output z and its statistics) outlive it. Backward re-runs fn with grad enabled under the forward's
autocast state on the detached saved inputs and sends the incoming gradients through it with
torch.autograd.grad; input and parameter gradients are the Function's (AccumulateGrad and DDP hooks see them).
The recompute runs under conv.inputs_kept(keep_inputs) (the keep_inputs switch: each conv keeps its input for its
own backward; all freed before this backward returns) and reads its forward's weight copies (casts.py).
BatchNorm: the forward records every batch statistic on a layers.StatsTape and the recompute replays it, so it
normalises with the forward's statistics and updates no running statistic twice. fn must otherwise be
deterministic (no dropout): pgi.py hands it only recomputable() layers.
Test: python -m pytest -q tests/backends/test_backend_pgi.py
"""

import torch

from yolov9c.backends.c.casts import current as current_casts, reading as reading_casts
from yolov9c.backends.c.conv import autocast_dtype, direct_apply, inputs_kept
from yolov9c.backends.c.layers import StatsTape, use_tape
from yolov9c.backends.c.lazy import LeafIndex, Node


class _Slot:
    """A tensor's place in an input template (a tensor given directly, not inside a lazy value)."""

    __slots__ = ("k",)

    def __init__(self, k):
        self.k = k


def _template(value, register, memo):
    """value with every tensor t replaced by register(t) (inside lazy values) or _Slot(register(t))."""
    if isinstance(value, Node):
        return value.map(register, memo)
    if isinstance(value, torch.Tensor):
        return _Slot(register(value))
    if isinstance(value, dict):
        return {k: _template(v, register, memo) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_template(v, register, memo) for v in value)
    return value


def _fill(template, tensors, memo):
    """The value of a template with tensors[k] in place of each index k."""
    if isinstance(template, Node):
        return template.map(tensors.__getitem__, memo)
    if isinstance(template, _Slot):
        return tensors[template.k]
    if isinstance(template, dict):
        return {k: _fill(v, tensors, memo) for k, v in template.items()}
    if isinstance(template, (list, tuple)):
        return type(template)(_fill(v, tensors, memo) for v in template)
    return template


def _replace(value, fn, memo):
    """value with every tensor t replaced by fn(t) (a value of lazy values, tensors, tuples and lists)."""
    if isinstance(value, Node):
        return value.map(fn, memo)
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_replace(v, fn, memo) for v in value)
    return value


def _tensors(value, out):
    if isinstance(value, Node):
        out.extend(value.tensors())
    elif isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors(v, out)
    return out


def new_tensors(value, known):
    """The distinct tensors of `value` whose ids are not in `known`, in a fixed traversal order."""
    seen, out = set(known), []
    for t in _tensors(value, []):
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


class _Call:
    """One segment call: what SegmentFunction needs besides tensors."""

    __slots__ = ("fn", "template", "n_leaves", "params", "keep_inputs", "tape", "device_type", "amp", "amp_dtype",
                 "casts", "out", "new_ids")

    def __init__(self, fn, template, n_leaves, params, device_type, keep_inputs):
        self.fn, self.template, self.n_leaves, self.params = fn, template, n_leaves, params
        self.keep_inputs = keep_inputs
        self.tape, self.device_type = StatsTape(), device_type
        self.amp_dtype = autocast_dtype(device_type)
        self.amp = self.amp_dtype is not None
        self.casts = current_casts()  # the recompute reads the weights its forward read
        self.out, self.new_ids = None, None

    def run(self, inputs):
        prev = use_tape(self.tape)
        try:
            return self.fn(inputs)
        finally:
            use_tape(prev)


class SegmentFunction(torch.autograd.Function):
    """forward(call, *input_tensors, *params) -> the new tensors of call.fn's result. See module docstring."""

    @staticmethod
    def forward(ctx, call, *args):
        n = call.n_leaves
        leaves = args[:n]
        out = call.run(_fill(call.template, leaves, {}))
        new = new_tensors(out, set(map(id, args)))
        call.out, call.new_ids = out, list(map(id, new))
        ctx.call = call
        ctx.save_for_backward(*leaves)
        ctx.mark_non_differentiable(*[t for t in new if t.ndim != 4 or not t.is_floating_point()])
        return tuple(new)

    @staticmethod
    def backward(ctx, *grads):
        call = ctx.call
        n = call.n_leaves
        need = ctx.needs_input_grad[1:]
        leaves = [t.detach().requires_grad_() if need[i] else t.detach() for i, t in enumerate(ctx.saved_tensors)]
        call.tape.pos = 0
        try:
            with torch.enable_grad(), torch.autocast(call.device_type, dtype=call.amp_dtype, enabled=call.amp), \
                    inputs_kept(call.keep_inputs), reading_casts(call.casts):
                out = call.run(_fill(call.template, leaves, {}))
        finally:
            call.tape.pos = None
        known = set(map(id, leaves))
        known.update(map(id, call.params))
        new = new_tensors(out, known)
        if len(new) != len(grads):
            raise RuntimeError(f"recomputed segment returned {len(new)} new tensors, its forward {len(grads)}")
        outs, gouts = [], []
        for t, g in zip(new, grads):
            if g is not None and t.requires_grad:
                outs.append(t)
                gouts.append(g)
        wrt = [i for i in range(n) if need[i]]
        wrt_p = [k for k in range(len(call.params)) if need[n + k]]
        targets = [leaves[i] for i in wrt] + [call.params[k] for k in wrt_p]
        got = torch.autograd.grad(outs, targets, gouts, allow_unused=True) if outs and targets else \
            [None] * len(targets)
        grads_in = [None] * (n + len(call.params))
        for j, idx in enumerate(wrt + [n + k for k in wrt_p]):
            grads_in[idx] = got[j]
        return (None, *grads_in)


_apply = direct_apply(SegmentFunction)


def run_segment(fn, inputs, params, keep_inputs=False):
    """fn(inputs) as a recomputed segment (module docstring); returns its value, differentiable w.r.t. the
    tensors of `inputs` and `params` (distinct tensors). keep_inputs: the recompute keeps its conv inputs."""
    index = LeafIndex()
    template = _template(inputs, index.add, {})
    leaves = index.tensors
    params = [p for k, p in zip(map(id, params), params) if k not in index.ids]  # (a parameter given as an input)
    device = leaves[0].device.type if leaves else params[0].device.type
    call = _Call(fn, template, len(leaves), params, device, keep_inputs)
    outs = _apply(call, *leaves, *params)
    mapping = dict(zip(call.new_ids, outs))
    value = _replace(call.out, lambda t: mapping.get(id(t), t), {})
    call.out = call.new_ids = None  # the call (kept by the graph until backward) must not hold the result
    return value
