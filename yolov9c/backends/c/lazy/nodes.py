"""Lazy activations: the node types a layer of the c backend hands on instead of its activated output.

A lazy value is a small expression tree whose leaves hold stored tensors; nothing activated is kept:
    BNAct(BN(z, mean, invstd, γ, β), act)  act(BN(z)), a Conv–BN–act output (z the only full-size tensor stored)
    RepAct(BN(z1, ...), BN(z2, ...))    silu(BN1(z1) + BN2(z2)), RepConvN's training form
    Plain(t)                            an ordinary tensor (a float image, a CBLinear output, a fallback)
    Image(t)                            a uint8 batch read as t/255 (no float image stored)
    Sum(children) / Cat(children)       elementwise sum (shortcut, CBFuse) / channel concatenation (ELAN, ADown)
    Spatial(fn, child[, grad])          a per-channel spatial op after activation (pools, nearest upsample,
                                        pad); grad from the output gradient alone, or also the child's value
                                        (max pools: grad_reads_x)
Invariant: every leaf carries a channel range [c0, c1), so a channel slice is pushed down to the leaves and
copies nothing (slicing commutes with every node type). Values are computed by evaluator.py, gradients sent to
leaves through grads.py's Grads; LeafIndex numbers a value's tensors (segment.py's templates). Shapes (B, C, H, W).
Test: python -m pytest -q tests/backends/test_backend_c.py
"""

import functools

import torch

from yolov9c.ops import bn_silu as ops


def _sl(t, c0, c1, full):
    """Channels [c0, c1) of a (C,) or (B, C, H, W) tensor; the tensor itself when that is all of it."""
    if c0 == 0 and c1 == full:
        return t
    return t[c0:c1] if t.ndim == 1 else t[:, c0:c1]


class Node:
    """Base of the lazy values. `shape` is the activated tensor's (B, C, H, W); `first` is the first stored tensor
    it reads (its device, dtype and layout stand for the value's)."""

    __slots__ = ("shape", "first")

    def slice(self, c0, c1):
        """The lazy value of channels [c0, c1) of this one."""
        raise NotImplementedError

    def map(self, fn, memo):
        """A copy with every tensor t replaced by fn(t); shared sub-nodes stay shared (memo: id → copy)."""
        k = id(self)
        if k not in memo:
            memo[k] = self._mapped(fn, memo)
        return memo[k]

    def _mapped(self, fn, memo):
        """map()'s copy of this node (its children mapped through memo)."""
        raise NotImplementedError

    def tensors(self):
        """Every tensor the node reads (with repeats)."""
        raise NotImplementedError


class _Leaf(Node):
    """A node over stored tensors of `full` channels, of which it stands for channels [c0, c1) (c1=None: to
    the end). A subclass gives `_ranged(c0, c1)`: the same node over the same tensors, channels [c0, c1).
    size: the stored tensors' (B, C, H, W) when they are not tensors (a segment template holds indices)."""

    __slots__ = ("c0", "c1", "full")

    def __init__(self, first, c0, c1, size=None):
        s = first.shape if size is None else size
        self.first, self.full = first, s[1]
        self.c0, self.c1 = c0, s[1] if c1 is None else c1
        self.shape = (s[0], self.c1 - c0, s[2], s[3])

    def slice(self, c0, c1):
        if not 0 <= c0 < c1 <= self.c1 - self.c0:
            raise ValueError(f"lazy slice [{c0}, {c1}) out of range for {self.c1 - self.c0} channels")
        return self._ranged(self.c0 + c0, self.c0 + c1)

    def _size(self):
        """(B, C, H, W) of the stored tensors (all `full` channels)."""
        return (self.shape[0], self.full, self.shape[2], self.shape[3])

    def joined(self, other):
        """self and then `other` along channels as one leaf when other stands for the next channels of the same
        stored value (an ELAN block concatenates its cv1 output's two halves back in order), else None. Only
        leaves over tensors join (a segment template's leaves hold indices)."""
        if (type(other) is type(self) and other.c0 == self.c1 and self._same_source(other)
                and isinstance(self.first, torch.Tensor)):
            return self._ranged(self.c0, other.c1)
        return None

    def _same_source(self, other):
        """Whether other (of self's type) reads the same stored value as self."""
        raise NotImplementedError


class BNAct(_Leaf):
    """act(BN(z)) with batch statistics: bn is the ops.BN operand (z, mean, invstd, γ, β) of all of z's channels;
    act is 'silu' or 'identity'. shared: the lazy.SharedGrad of z when several lazy convs may read it (its readers'
    dL/dy go there, grads.py), else None. op: the operand of channels [c0, c1) once made (bn itself for all
    channels; `node.op or node.operand()` reads it without a call when it is there)."""

    __slots__ = ("bn", "act", "shared", "op")

    def __init__(self, bn, act, shared=None, c0=0, c1=None, size=None):
        self.bn, self.act, self.shared = bn, act, shared
        _Leaf.__init__(self, bn[0], c0, c1, size)
        self.op = bn if c0 == 0 and self.c1 == self.full else None

    def _ranged(self, c0, c1):
        return BNAct(self.bn, self.act, self.shared, c0, c1)

    def _same_source(self, other):
        return other.bn is self.bn and other.act == self.act and other.shared is self.shared

    def _mapped(self, fn, memo):  # a copy over other tensors is no reader of z's SharedGrad
        return BNAct(ops.BN(*map(fn, self.bn)), self.act, None, self.c0, self.c1, self._size())

    def operand(self):
        """The BN operand of channels [c0, c1) (made once: channel slices of the stored tensors)."""
        if self.op is None:
            c0, c1, f = self.c0, self.c1, self.full
            self.op = ops.BN(*[_sl(t, c0, c1, f) for t in self.bn])
        return self.op

    def tensors(self):
        return self.bn

    def fill(self, out, ev):
        return ops.forward(self.op or self.operand(), act=self.act, out=out)

    def compute(self, ev):
        return ops.forward(self.op or self.operand(), act=self.act)

    def backward(self, g, ev, acc):
        shared = self.shared
        if shared is not None and shared.deferred():  # summed with the other readers' and sent back by z's
            shared.stash(g, self.c0, self.c1)          # producer (SharedGrad)
            return
        z, _, _, w, b = self.bn
        index, needed = acc.index, acc.needed
        iz, iw, ib = index[id(z)], index[id(w)], index[id(b)]
        need_w, need_b = needed[iw], needed[ib]
        if not (needed[iz] or need_w or need_b):
            return
        dz, accumulate = acc.slot(iz, self.c0, self.c1) if needed[iz] else (None, False)
        _, dw, db = ops.backward(self.op or self.operand(), g, act=self.act, dz=dz, accumulate=accumulate)
        if need_w:
            acc.put(iw, self.c0, self.c1, dw, owned=True)
        if need_b:
            acc.put(ib, self.c0, self.c1, db, owned=True)


class RepAct(_Leaf):
    """silu(BN1(z1) + BN2(z2)): RepConvN's two branches (3×3 and 1×1 convs of one input); bn1, bn2 are their ops.BN
    operands over all channels. pair: the two operands of channels [c0, c1) once made (as BNAct.op)."""

    __slots__ = ("bn1", "bn2", "pair")

    def __init__(self, bn1, bn2, c0=0, c1=None, size=None):
        self.bn1, self.bn2 = bn1, bn2
        _Leaf.__init__(self, bn1[0], c0, c1, size)
        self.pair = (bn1, bn2) if c0 == 0 and self.c1 == self.full else None

    def _ranged(self, c0, c1):
        return RepAct(self.bn1, self.bn2, c0, c1)

    def _same_source(self, other):
        return other.bn1 is self.bn1 and other.bn2 is self.bn2

    def _mapped(self, fn, memo):
        return RepAct(ops.BN(*map(fn, self.bn1)), ops.BN(*map(fn, self.bn2)), self.c0, self.c1, self._size())

    def tensors(self):
        return self.bn1 + self.bn2

    def operands(self):
        """The two BN operands of channels [c0, c1) (made once: channel slices of the stored tensors)."""
        if self.pair is None:
            c0, c1, f = self.c0, self.c1, self.full
            self.pair = (ops.BN(*[_sl(t, c0, c1, f) for t in self.bn1]),
                         ops.BN(*[_sl(t, c0, c1, f) for t in self.bn2]))
        return self.pair

    def fill(self, out, ev):
        return ops.forward(*(self.pair or self.operands()), out=out)

    def compute(self, ev):
        return ops.forward(*(self.pair or self.operands()))

    def backward(self, g, ev, acc):
        (z1, _, _, w1, b1), (z2, _, _, w2, b2) = self.bn1, self.bn2
        index, needed = acc.index, acc.needed
        at = [index[id(t)] for t in (z1, w1, b1, z2, w2, b2)]
        need = [needed[i] for i in at]
        if not any(need):
            return
        c0, c1 = self.c0, self.c1
        dz1, acc1 = acc.slot(at[0], c0, c1) if need[0] else (None, False)
        dz2, acc2 = acc.slot(at[3], c0, c1) if need[3] else (None, False)
        if dz1 is not None and dz2 is not None and acc1 != acc2:
            (dz2 if acc1 else dz1).zero_()  # the kernel takes one accumulate flag for both
            acc1 = acc2 = True
        accumulate = acc1 if dz1 is not None else acc2
        bn1, bn2 = self.pair or self.operands()
        r = ops.backward(bn1, g, bn2, dz=dz1, dz2=dz2, accumulate=accumulate)
        for k, v in ((1, r[1]), (2, r[2]), (4, r[4]), (5, r[5])):
            if need[k]:
                acc.put(at[k], c0, c1, v, owned=True)


class _TensorLeaf(_Leaf):
    """A leaf over one stored tensor t (B, C, H, W), channels [c0, c1)."""

    __slots__ = ("t",)

    def __init__(self, t, c0=0, c1=None, size=None):
        self.t = t
        _Leaf.__init__(self, t, c0, c1, size)

    def _ranged(self, c0, c1):
        return type(self)(self.t, c0, c1)

    def _same_source(self, other):
        return other.t is self.t

    def _mapped(self, fn, memo):
        return type(self)(fn(self.t), self.c0, self.c1, self._size())

    def tensors(self):
        return (self.t,)


class Plain(_TensorLeaf):
    """An ordinary tensor t (B, C, H, W), channels [c0, c1)."""

    __slots__ = ()

    def view(self):
        return _sl(self.t, self.c0, self.c1, self.full)

    def fill(self, out, ev):
        return out.copy_(self.view())

    def compute(self, ev):
        return self.view()

    def backward(self, g, ev, acc):
        i = acc.index[id(self.t)]
        if acc.needed[i]:
            acc.put(i, self.c0, self.c1, g)


class Image(_TensorLeaf):
    """A uint8 image batch t (B, C, H, W) standing for t.float() / 255: the value the trainer's
    `imgs.float() / 255` gives, computed by its consumer (in float32, then cast to the compute dtype) instead
    of stored. No gradient (the image is data)."""

    __slots__ = ()

    def __init__(self, t, c0=0, c1=None, size=None):
        if isinstance(t, torch.Tensor) and t.dtype != torch.uint8:  # (a template holds an index instead)
            raise TypeError(f"lazy Image: expected a uint8 tensor, got {t.dtype}")
        super().__init__(t, c0, c1, size)

    def normalised(self, dtype=torch.float32):
        """t/255 of channels [c0, c1) in `dtype` (float32 arithmetic, as the trainer's float path)."""
        v = _sl(self.t, self.c0, self.c1, self.full).float().div_(255.0)
        return v if dtype == torch.float32 else v.to(dtype)

    def fill(self, out, ev):
        return out.copy_(self.normalised())

    def compute(self, ev):
        return self.normalised(ev.dtype)

    def backward(self, g, ev, acc):
        pass  # data: no gradient


class _Group(Node):
    """A node over child nodes (nested groups of the same kind are flattened into one)."""

    __slots__ = ("children",)

    @classmethod
    def _flatten(cls, children):
        flat = []
        for c in children:
            flat += c.children if type(c) is cls else (c,)
        return flat

    def _mapped(self, fn, memo):
        return type(self)([c.map(fn, memo) for c in self.children])

    def tensors(self):
        out = []
        for c in self.children:
            out += c.tensors()
        return tuple(out)



class Sum(_Group):
    """Elementwise sum of same-shape children (nested sums are flattened)."""

    __slots__ = ()

    def __init__(self, children):
        flat = self._flatten(children)
        shape = tuple(flat[0].shape)
        for c in flat:
            if tuple(c.shape) != shape:
                raise ValueError(f"lazy sum of different shapes: {[tuple(c.shape) for c in flat]}")
        self.children, self.first, self.shape = flat, flat[0].first, shape

    def slice(self, c0, c1):
        return Sum([c.slice(c0, c1) for c in self.children])

    def fill(self, out, ev):
        first = self.children[0]
        known = first in ev.memo
        ev.fill(first, out)
        if not known:  # out is overwritten by the sum below: it no longer holds the first term's value
            ev.memo.pop(first, None)
        for c in self.children[1:]:
            if isinstance(c, BNAct):
                # out = out + act(BN(z)) in one pass; reading and writing the same element is safe for an
                # elementwise kernel (fill() runs without grad only; see Evaluator).
                ops.forward(c.op or c.operand(), residual=out, act=c.act, out=out)
            else:
                # the term's value is not kept in the memo (unless something else put it there): a CBFuse's
                # upsampled inputs are each as large as the sum, five of them held 4 GiB in yolov9-e's stem
                known = c in ev.memo
                out.add_(ev.value(c))
                if not known:
                    ev.memo.pop(c, None)
        return out

    def compute(self, ev):
        y = ev.value(self.children[0])
        for c in self.children[1:]:
            y = y + ev.value(c)
        return y

    def backward(self, g, ev, acc):
        for c in self.children:
            c.backward(g, ev, acc)


class Cat(_Group):
    """Channel concatenation of children with equal B, H, W (nested concats are flattened, and adjacent leaves
    over consecutive channels of one stored value joined: one activation pass instead of one per part)."""

    __slots__ = ()

    def __init__(self, children):
        flat = []
        for c in self._flatten(children):
            joined = flat[-1].joined(c) if flat and isinstance(c, _Leaf) and isinstance(flat[-1], _Leaf) else None
            if joined is None:
                flat.append(c)
            else:
                flat[-1] = joined
        b, _, h, w = flat[0].shape
        channels = 0
        for c in flat:
            if (c.shape[0], c.shape[2], c.shape[3]) != (b, h, w):
                raise ValueError(f"lazy concat of different sizes: {[tuple(c.shape) for c in flat]}")
            channels += c.shape[1]
        self.children, self.first, self.shape = flat, flat[0].first, (b, channels, h, w)

    def slice(self, c0, c1):
        parts, off = [], 0
        for c in self.children:
            n = c.shape[1]
            a, b = max(c0, off), min(c1, off + n)
            if a < b:
                parts.append(c if (a, b) == (off, off + n) else c.slice(a - off, b - off))
            off += n
        return parts[0] if len(parts) == 1 else Cat(parts)

    def fill(self, out, ev):
        off = 0
        for c in self.children:
            n = c.shape[1]
            ev.fill(c, out[:, off:off + n])
            off += n
        return out

    def compute(self, ev):
        return torch.cat([ev.value(c) for c in self.children], 1)

    def backward(self, g, ev, acc):
        off = 0
        for c in self.children:
            n = c.shape[1]
            c.backward(g[:, off:off + n], ev, acc)
            off += n


_SHAPES = {}


def _spatial_shape(fn, shape):
    """fn's output shape for an input of `shape`: the op's own shape rule on a data-less tensor, cached (a meta-tensor
    run costs host time on every step). A functools.partial is keyed by its function, arguments (modules by
    identity) and keywords.
    """
    if isinstance(fn, functools.partial):
        fkey = (fn.func, fn.args, tuple(sorted(fn.keywords.items())))
    else:
        fkey = fn
    key = (fkey, shape)
    try:
        got = _SHAPES.get(key)
    except TypeError:  # an unhashable argument: not cached
        return tuple(fn(torch.empty(shape, device="meta")).shape)
    if got is None:
        if len(_SHAPES) > 4096:
            _SHAPES.clear()
        got = _SHAPES[key] = tuple(fn(torch.empty(shape, device="meta")).shape)
    return got


class Spatial(Node):
    """fn(child) for a per-channel spatial op fn (a module such as nn.MaxPool2d, or a function).

    grad: the op's input gradient without re-running fn: grad(g) from the output gradient alone (the 2×2
    average pool's and nearest upsampling's), or grad(g, x) with the child's value x too when grad_reads_x
    (the max pool's, which recomputes its argmax from x; x comes from the evaluator's memo); or None: backward
    then re-runs fn on the child's value under autograd."""

    __slots__ = ("fn", "child", "grad", "grad_reads_x")

    def __init__(self, fn, child, shape=None, grad=None, grad_reads_x=False):
        self.fn, self.child, self.grad, self.grad_reads_x = fn, child, grad, grad_reads_x
        self.first = child.first
        if shape is None:
            shape = _spatial_shape(fn, tuple(child.shape))
        self.shape = tuple(shape)

    def slice(self, c0, c1):
        b, _, h, w = self.shape
        return Spatial(self.fn, self.child.slice(c0, c1), (b, c1 - c0, h, w), self.grad, self.grad_reads_x)

    def _mapped(self, fn, memo):
        return Spatial(self.fn, self.child.map(fn, memo), self.shape, self.grad, self.grad_reads_x)

    def tensors(self):
        return self.child.tensors()


    def fill(self, out, ev):
        return out.copy_(self.fn(ev.value(self.child)))

    def compute(self, ev):
        return self.fn(ev.value(self.child))

    def backward(self, g, ev, acc):
        if self.grad is not None:
            gv = self.grad(g, ev.value(self.child).detach()) if self.grad_reads_x else self.grad(g)
        else:
            # the op's own backward through autograd, on the child's value (memoised by the recompute)
            with torch.enable_grad():
                v = ev.value(self.child).detach().requires_grad_()
                (gv,) = torch.autograd.grad(self.fn(v), v, g)
        self.child.backward(gv, ev, acc)


class LeafIndex:
    """Numbers the distinct tensors of lazy values by identity, in the order first met: `add` is the map()
    function that turns a value into its template (each tensor replaced by its number); `tensors` holds the
    numbered tensors, `ids` their numbers by id."""

    __slots__ = ("tensors", "ids")

    def __init__(self):
        self.tensors = []
        self.ids = {}

    def add(self, t):
        k = id(t)
        if k not in self.ids:
            self.ids[k] = len(self.tensors)
            self.tensors.append(t)
        return self.ids[k]
