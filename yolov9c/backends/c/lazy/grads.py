"""Gradients of lazy values without autograd: Grads accumulates each leaf tensor's gradient by channel range
(the first write of a range is a store, later ones add), and SharedGrad sums the dL/dy of a conv output that
several lazy convs read so that its BN backward runs once, in its producer.
Test: python -m pytest -q tests/backends/test_backend_c.py dev/tests/test_backend_grads.py
"""

import torch

from yolov9c.backends.c.lazy.evaluator import memory_format_of
from yolov9c.backends.c.lazy.nodes import _sl


class SharedGrad:
    """dL/dy of y = act(BN(z)) for a conv output z that several lazy convs read (an ELAN block's first output:
    its halves go to the next stage and to the last conv), summed over its readers so that BN's backward runs
    once, in z's producer's backward, instead of once per reader followed by autograd adding their dz.

    conv.lazy_conv makes one per output when it runs with grad and is given the output's BatchNorm, and hangs it
    on the output (`z.yv_shared`); layers' BN-act binds the batch statistics and activation (bind); every
    lazy_conv that reads z counts itself (readers). When deferred() (bound, two or more readers), a reader's
    BNAct.backward stashes its channel slice of dL/dy here and returns no gradient for z and the BN parameters;
    the producer's backward takes the sum (take: channels nobody wrote are zero) and runs the fused BN
    backward on it, returning dz to its convs and dγ, dβ as its own inputs' gradients. A reader that is not a
    lazy conv (a torch fallback) sends its dz through autograd as before; both add up in the producer. The
    count only decides whether to defer: a reader whose backward never runs stashes nothing, and the sum is
    exact whatever the order (BN's backward is linear in dL/dy)."""

    __slots__ = ("weight", "bias", "stats", "readers", "buf", "done")

    def __init__(self, weight, bias):
        self.weight, self.bias = weight, bias  # the BN affine parameters the producer takes as inputs
        self.stats, self.readers, self.buf, self.done = None, 0, None, []

    def bind(self, mean, invstd, weight, act):
        """The statistics and activation y is computed with (weight: the BN's, checked against the producer's)."""
        if weight is self.weight:
            self.stats = (mean, invstd, act)

    def deferred(self):
        return self.stats is not None and self.readers >= 2

    def stash(self, g, c0, c1):
        """Add g, dL/dy of channels [c0, c1), into the sum (the first write of a range is a copy)."""
        full = self.stats[0].shape[0]
        if self.buf is None:
            b, _, h, w = g.shape
            self.buf = torch.empty((b, full, h, w), dtype=g.dtype, device=g.device, memory_format=memory_format_of(g))
        gaps = _gaps(self.done, c0, c1) if self.done else None
        view = _sl(self.buf, c0, c1, full)
        if gaps is None or gaps == [(c0, c1)]:
            view.copy_(g)
        else:
            for a, b in gaps:
                _sl(self.buf, a, b, full).zero_()
            view.add_(g)
        self.done.append((c0, c1))

    def take(self):
        """The summed dL/dy (None when no reader stashed), zero where nobody wrote; the sum is released."""
        buf, self.buf = self.buf, None
        if buf is not None:
            full = buf.shape[1]
            if self.done[0] != (0, full):  # (the first write covering everything: nothing to zero)
                for a, b in _gaps(self.done, 0, full):
                    _sl(buf, a, b, full).zero_()
        self.done = []
        return buf


class Grads:
    """Gradients of a lazy value's leaf tensors, accumulated by Node.backward without autograd.

    leaves: the stored tensors; needed: which of them want a gradient; index: {id(leaf): position} (a node finds
    its tensors' positions there, then works by position). A leaf's gradient is one full-size buffer (the leaf's
    dtype and strides), allocated uninitialised on first use; each channel range a node writes is recorded, so
    the first write of a range is a plain store (the kernels' dz=, a copy_) and only a range written before is
    accumulated into (accumulate=True, add_). result() zeroes the ranges nobody wrote (a chunk read by another
    consumer) and returns one gradient per leaf (None: not needed/unreached)."""

    __slots__ = ("leaves", "index", "needed", "bufs", "done")

    def __init__(self, leaves, needed, index):
        self.leaves, self.needed, self.index = leaves, needed, index
        self.bufs = [None] * len(leaves)
        self.done = [None] * len(leaves)  # per leaf: list of written [c0, c1) ranges

    def slot(self, i, c0, c1):
        """(view, accumulate): channels [c0, c1) of leaf i's gradient buffer and whether it already holds a value
        (a partly written range gets its unwritten parts zeroed first, so accumulate covers all of it)."""
        buf, done = self.bufs[i], self.done[i]
        t = self.leaves[i]
        if buf is None:
            buf = self.bufs[i] = torch.empty_like(t)
            done = self.done[i] = []
        full = t.shape[0] if t.ndim == 1 else t.shape[1]
        view = _sl(buf, c0, c1, full)
        accumulate = False
        if done:  # (else the first write of this gradient: the common case)
            gaps = _gaps(done, c0, c1)
            accumulate = gaps != [(c0, c1)]
            if accumulate:
                for a, b in gaps:
                    _sl(buf, a, b, full).zero_()
        done.append((c0, c1))
        return view, accumulate

    def put(self, i, c0, c1, value, owned=False):
        """Add value (channels [c0, c1) of leaf i's gradient) in. owned=True: value is a fresh tensor nobody else
        reads (a BN parameter gradient); when it is the first write of all of the leaf's gradient it becomes the
        buffer itself (no allocation and copy)."""
        t = self.leaves[i]
        if (owned and self.bufs[i] is None and c0 == 0 and c1 == (t.shape[0] if t.ndim == 1 else t.shape[1])
                and value.dtype == t.dtype and value.shape == t.shape and value.stride() == t.stride()):
            self.bufs[i] = value
            self.done[i] = [(c0, c1)]
            return
        view, accumulate = self.slot(i, c0, c1)
        if accumulate:
            view.add_(value)
        else:
            view.copy_(value)

    def result(self):
        for buf, done in zip(self.bufs, self.done):
            if buf is not None:
                full = buf.shape[0] if buf.ndim == 1 else buf.shape[1]
                if done[0] != (0, full):  # (the first write covering everything: the common case)
                    for a, b in _gaps(done, 0, full):
                        _sl(buf, a, b, full).zero_()
        return self.bufs


def _gaps(done, c0, c1):
    """The parts of [c0, c1) not covered by the ranges in done."""
    if not done:  # the first write of a gradient (the common case)
        return [(c0, c1)]
    gaps, pos = [], c0
    for a, b in sorted(done):
        if b <= pos or a >= c1:
            continue
        if a > pos:
            gaps.append((pos, a))
        pos = max(pos, b)
        if pos >= c1:
            break
    if pos < c1:
        gaps.append((pos, c1))
    return gaps
