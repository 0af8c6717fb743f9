"""Evaluating lazy values (nodes.py): the activated tensor of a node, computed once per evaluation.

`Evaluator.value(node)` computes the activated tensor; `Evaluator.fill(node, out)` writes it into a given
view (a channel slice of a concat buffer), so a concat is built in place. With grad enabled the same code
builds an autograd graph through the differentiable ops of yolov9c.ops.bn_silu (used by the backward
recompute in conv.py and by layers that fall back to plain torch). `Evaluator.keep_for_backward(node)` trims
the memo to what node's backward reads (backward_reads: node's value and the inputs of Spatial ops without a
gradient function or whose gradient reads them): what a conv input kept from forward for its backward holds
(conv.inputs_kept). materialise() gives a real tensor where a consumer needs one.
Test: python -m pytest -q tests/backends/test_backend_c.py
"""

import torch

from yolov9c.backends.c.lazy.nodes import Image, Node, Plain, Spatial, _Group


def memory_format_of(t):
    """channels-last when t's channel stride is 1 (also a channel slice of a channels-last tensor)."""
    return torch.channels_last if (t.ndim == 4 and t.stride(1) == 1 and t.shape[1] > 1) else torch.contiguous_format


class Evaluator:
    """Computes lazy values in `dtype` and memory format `fmt`. Values computed within one evaluation are
    reused (memo by node identity), e.g. SPPELAN's chained max-pools read the previous pool's output.

    Without grad (forward), values are written in place: a concat into channel slices of one buffer, a
    residual sum into its first term, and fill() remembers the view it wrote so that later reads take it
    from there. With grad (the backward recompute, the torch fallbacks) every node is computed functionally
    (torch.cat, out-of-place sums): no in-place writes into views that autograd would have to track."""

    __slots__ = ("dtype", "fmt", "grad", "memo", "_device")

    def __init__(self, dtype, fmt, grad, device=None):
        self.dtype, self.fmt, self.grad = dtype, fmt, grad
        self.memo = {}  # node -> its value (nodes hash by identity)
        self._device = device  # of the buffers it allocates (run() sets it from the node it is given)

    def fill(self, node, out):
        """Write node's value into `out` (without grad only)."""
        memo = self.memo
        if node in memo:
            return out.copy_(memo[node])
        node.fill(out, self)
        if type(node) is not Plain:
            memo[node] = out
        return out

    def value(self, node):
        """The activated tensor of `node` in self.dtype (a Plain leaf is returned as its own view when its
        dtype fits)."""
        kind = type(node)  # (the node types are final: no subclasses)
        if kind is Plain:
            v = node.view()
            return v if v.dtype == self.dtype else v.to(self.dtype)
        if kind is Image:
            return node.normalised(self.dtype)
        memo = self.memo
        if node in memo:
            return memo[node]
        if self.grad:
            out = node.compute(self)
            if out.dtype != self.dtype:
                out = out.to(self.dtype)
        else:
            # a Spatial op's own output when it already has the dtype and layout (a pool of a channels-last input
            # is channels-last): no buffer to allocate and copy it into
            out = node.compute(self) if kind is Spatial else None
            if out is None or out.dtype != self.dtype or not out.is_contiguous(memory_format=self.fmt):
                # allocated in its memory format directly (an NCHW empty followed by .contiguous(channels_last)
                # would copy the whole uninitialised buffer: one full-size strided copy kernel per input)
                buf = torch.empty(node.shape, dtype=self.dtype, device=self._device, memory_format=self.fmt)
                out = node.fill(buf, self) if out is None else buf.copy_(out)
        memo[node] = out
        return out

    def run(self, node):
        """value(node), the buffers on node's device."""
        self._device = node.first.device
        return self.value(node)

    def keep_for_backward(self, node):
        """Drop from the memo every value but node's and those its backward reads (backward_reads): what a
        conv input kept from forward for its backward holds (conv.inputs_kept)."""
        keep = {node, *backward_reads(node)}
        self.memo = {k: v for k, v in self.memo.items() if k in keep}


def backward_reads(node):
    """The nodes under `node` whose values Node.backward reads from the Evaluator's memo: the input of every
    Spatial op without a gradient function (its backward re-runs the op under autograd on that value) or whose
    gradient reads it (grad_reads_x: the max pools)."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Spatial):
            if n.grad is None or n.grad_reads_x:
                out.append(n.child)
            stack.append(n.child)
        elif isinstance(n, _Group):
            stack.extend(n.children)
    return out


def natural_dtype(node):
    """The dtype a lazy value is materialised in outside a conv: its first stored tensor's (float32 for a
    uint8 image)."""
    t = node.first
    return torch.float32 if t.dtype == torch.uint8 else t.dtype


def materialise(node):
    """The activated tensor of a lazy value (differentiable when grad is enabled): used where a consumer
    needs a real tensor (layers that fall back to plain torch)."""
    if isinstance(node, Plain):
        return node.view()
    if isinstance(node, Image):
        return node.normalised()
    t = node.first
    return Evaluator(natural_dtype(node), memory_format_of(t), torch.is_grad_enabled()).run(node)


def materialise_any(x):
    """materialise() through lists and tuples (the inputs of multi-input layers); tensors pass through."""
    if isinstance(x, Node):
        return materialise(x)
    if isinstance(x, (list, tuple)):
        return type(x)(materialise_any(v) for v in x)
    return x
