"""Lazy activations: what a layer of the c backend hands on instead of its activated output.

A lazy value is a small expression tree whose leaves hold stored tensors; nothing activated is kept:
    BNAct(z, mean, invstd, γ, β, act)    act(BN(z)), a Conv–BN–act output (z: the conv output, the only
                                         full-size tensor stored for it)
    RepAct(z1, ..., z2, ...)             silu(BN1(z1) + BN2(z2)), RepConvN's training form
    Plain(t)                             an ordinary tensor (a float image, a CBLinear conv output, a fallback)
    Image(t)                             a uint8 image batch read as t/255 (DESIGN.md item 4: the float image
                                         is never stored; a consumer normalises it on the fly)
    Sum(children)                        elementwise sum (RepNBottleneck's shortcut, CBFuse)
    Cat(children)                        channel concatenation (ELAN/GELAN, ADown, yaml Concat rows)
    Spatial(fn, child[, grad])           a per-channel spatial op applied after activation (max/avg pool,
                                         nearest upsample/resize, zero pad); grad: its input gradient from
                                         the output gradient alone, when it has one (ADown's average pool, nearest upsampling),
                                         or from the gradient and the child's value (max pools: grad_reads_x)
Every leaf node carries a channel range [c0, c1) of its tensors, so a channel slice (the chunk of an ELAN
block, ADown's halves) is pushed down to the leaves and never copies anything: slicing commutes with every
node type (BN, activation and the spatial ops are per-channel).

`Evaluator.value(node)` computes the activated tensor; `Evaluator.fill(node, out)` writes it into a given
view (a channel slice of a concat buffer), so a concat is built in place. With grad enabled the same code
builds an autograd graph through the differentiable ops of yolov9c.ops.bn_silu (used by the backward
recompute in conv.py and by layers that fall back to plain torch). `Evaluator.keep_for_backward(node)` trims
the memo to what node's backward reads (backward_reads: node's value and the inputs of Spatial ops without a
gradient function or whose gradient reads them): what a conv input kept from forward for its backward holds
(conv.inputs_kept).
Shapes: (B, C, H, W). Test: python -m pytest -q tests/test_backend_c.py
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
    """Base of the lazy values. `shape` is the activated tensor's (B, C, H, W)."""

    __slots__ = ("shape",)

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

    def first_tensor(self):
        raise NotImplementedError


class _Leaf(Node):
    """A node over stored tensors of `full` channels, of which it stands for channels [c0, c1).
    A subclass gives `_make(tensors, c0, c1)`: the same node over `tensors` (in the order of tensors())."""

    __slots__ = ("c0", "c1", "full")

    def _set_range(self, t, c0, c1, shape):
        """Channels [c0, c1) (c1=None: to the end) of stored tensors of (B, C, H, W) `shape` (t's when None)."""
        s = t.shape if shape is None else shape
        self.full = s[1]
        self.c0, self.c1 = c0, self.full if c1 is None else c1
        self.shape = (s[0], self.c1 - self.c0, s[2], s[3])

    def _full_shape(self):
        """(B, C, H, W) of the stored tensors (all `full` channels)."""
        return (self.shape[0], self.full, self.shape[2], self.shape[3])

    def slice(self, c0, c1):
        if not 0 <= c0 < c1 <= self.c1 - self.c0:
            raise ValueError(f"lazy slice [{c0}, {c1}) out of range for {self.c1 - self.c0} channels")
        return self._make(self.tensors(), self.c0 + c0, self.c0 + c1)

    def _mapped(self, fn, memo):
        return self._make(tuple(map(fn, self.tensors())), self.c0, self.c1)


class BNAct(_Leaf):
    """act(BN(z)) with batch statistics (mean, invstd); act is 'silu' or 'identity'."""

    __slots__ = ("z", "mean", "invstd", "weight", "bias", "act")

    def __init__(self, z, mean, invstd, weight, bias, act, c0=0, c1=None, shape=None):
        self.z, self.mean, self.invstd, self.weight, self.bias, self.act = z, mean, invstd, weight, bias, act
        self._set_range(z, c0, c1, shape)

    def _make(self, tensors, c0, c1):
        return BNAct(*tensors, self.act, c0, c1, self._full_shape())

    def operand(self):
        """The BN operand of channels [c0, c1)."""
        c0, c1, f = self.c0, self.c1, self.full
        return ops.BN(_sl(self.z, c0, c1, f), _sl(self.mean, c0, c1, f), _sl(self.invstd, c0, c1, f),
                      _sl(self.weight, c0, c1, f), _sl(self.bias, c0, c1, f))

    def tensors(self):
        return (self.z, self.mean, self.invstd, self.weight, self.bias)

    def first_tensor(self):
        return self.z

    def fill(self, out, ev):
        return ops.forward(self.operand(), act=self.act, out=out)

    def compute(self, ev):
        return ops.forward(self.operand(), act=self.act)

    def backward(self, g, ev, acc):
        shared = acc.shared(self.z)
        if shared is not None:  # summed with the other readers' and sent back by z's producer (SharedGrad)
            shared.stash(g, self.c0, self.c1)
            return
        need_z, need_w, need_b = acc.needs(self.z), acc.needs(self.weight), acc.needs(self.bias)
        if not (need_z or need_w or need_b):
            return
        dz, accumulate = acc.slot(self.z, self.c0, self.c1) if need_z else (None, False)
        _, dw, db = ops.backward(self.operand(), g, act=self.act, dz=dz, accumulate=accumulate)
        if need_w:
            acc.put(self.weight, self.c0, self.c1, dw, owned=True)
        if need_b:
            acc.put(self.bias, self.c0, self.c1, db, owned=True)


class RepAct(_Leaf):
    """silu(BN1(z1) + BN2(z2)): RepConvN's two branches (3×3 and 1×1 convs of one input)."""

    __slots__ = ("t1", "t2")

    def __init__(self, t1, t2, c0=0, c1=None, shape=None):
        self.t1, self.t2 = tuple(t1), tuple(t2)  # (z, mean, invstd, weight, bias) each
        self._set_range(t1[0], c0, c1, shape)

    def _make(self, tensors, c0, c1):
        return RepAct(tensors[:5], tensors[5:], c0, c1, self._full_shape())

    def tensors(self):
        return self.t1 + self.t2

    def first_tensor(self):
        return self.t1[0]

    def operands(self):
        """The two BN operands of channels [c0, c1)."""
        c0, c1, f = self.c0, self.c1, self.full
        return (ops.BN(*[_sl(t, c0, c1, f) for t in self.t1]), ops.BN(*[_sl(t, c0, c1, f) for t in self.t2]))

    def fill(self, out, ev):
        return ops.forward(*self.operands(), out=out)

    def compute(self, ev):
        return ops.forward(*self.operands())

    def backward(self, g, ev, acc):
        (z1, _, _, w1, b1), (z2, _, _, w2, b2) = self.t1, self.t2
        if not any(acc.needs(t) for t in (z1, w1, b1, z2, w2, b2)):
            return
        c0, c1 = self.c0, self.c1
        dz1, acc1 = acc.slot(z1, c0, c1) if acc.needs(z1) else (None, False)
        dz2, acc2 = acc.slot(z2, c0, c1) if acc.needs(z2) else (None, False)
        if dz1 is not None and dz2 is not None and acc1 != acc2:
            (dz2 if acc1 else dz1).zero_()  # the kernel takes one accumulate flag for both
            acc1 = acc2 = True
        accumulate = acc1 if dz1 is not None else acc2
        bn1, bn2 = self.operands()
        r = ops.backward(bn1, g, bn2, dz=dz1, dz2=dz2, accumulate=accumulate)
        for t, v in ((w1, r[1]), (b1, r[2]), (w2, r[4]), (b2, r[5])):
            if acc.needs(t):
                acc.put(t, c0, c1, v, owned=True)


class _TensorLeaf(_Leaf):
    """A leaf over one stored tensor t (B, C, H, W), channels [c0, c1)."""

    __slots__ = ("t",)

    def __init__(self, t, c0=0, c1=None, shape=None):
        self.t = t
        self._set_range(t, c0, c1, shape)

    def _make(self, tensors, c0, c1):
        return type(self)(tensors[0], c0, c1, self._full_shape())

    def tensors(self):
        return (self.t,)

    def first_tensor(self):
        return self.t


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
        if acc.needs(self.t):
            acc.put(self.t, self.c0, self.c1, g)


class Image(_TensorLeaf):
    """A uint8 image batch t (B, C, H, W) standing for t.float() / 255: the value the trainer's
    `imgs.float() / 255` gives, computed by its consumer (in float32, then cast to the compute dtype) instead
    of stored. No gradient (the image is data)."""

    __slots__ = ()

    def __init__(self, t, c0=0, c1=None, shape=None):
        if isinstance(t, torch.Tensor) and t.dtype != torch.uint8:  # (a template holds an index instead)
            raise TypeError(f"lazy Image: expected a uint8 tensor, got {t.dtype}")
        super().__init__(t, c0, c1, shape)

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
            flat.extend(c.children if isinstance(c, cls) else [c])
        return flat

    def _mapped(self, fn, memo):
        return type(self)([c.map(fn, memo) for c in self.children])

    def tensors(self):
        return tuple(t for c in self.children for t in c.tensors())

    def first_tensor(self):
        return self.children[0].first_tensor()


class Sum(_Group):
    """Elementwise sum of same-shape children (nested sums are flattened)."""

    __slots__ = ()

    def __init__(self, children):
        flat = self._flatten(children)
        if any(tuple(c.shape) != tuple(flat[0].shape) for c in flat):
            raise ValueError(f"lazy sum of different shapes: {[tuple(c.shape) for c in flat]}")
        self.children = flat
        self.shape = tuple(flat[0].shape)

    def slice(self, c0, c1):
        return Sum([c.slice(c0, c1) for c in self.children])

    def fill(self, out, ev):
        first = self.children[0]
        known = id(first) in ev.memo
        ev.fill(first, out)
        if not known:  # out is overwritten by the sum below: it no longer holds the first term's value
            ev.memo.pop(id(first), None)
        for c in self.children[1:]:
            if isinstance(c, BNAct):
                # out = out + act(BN(z)) in one pass; reading and writing the same element is safe for an
                # elementwise kernel (fill() runs without grad only; see Evaluator).
                ops.forward(c.operand(), residual=out, act=c.act, out=out)
            else:
                # the term's value is not kept in the memo (unless something else put it there): a CBFuse's
                # upsampled inputs are each as large as the sum, five of them held 4 GiB in yolov9-e's stem
                known = id(c) in ev.memo
                out.add_(ev.value(c))
                if not known:
                    ev.memo.pop(id(c), None)
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
    """Channel concatenation of children with equal B, H, W (nested concats are flattened)."""

    __slots__ = ()

    def __init__(self, children):
        flat = self._flatten(children)
        b, _, h, w = flat[0].shape
        if any((c.shape[0], c.shape[2], c.shape[3]) != (b, h, w) for c in flat):
            raise ValueError(f"lazy concat of different sizes: {[tuple(c.shape) for c in flat]}")
        self.children = flat
        self.shape = (b, sum(c.shape[1] for c in flat), h, w)

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
    """fn's output shape for an input of `shape`: the op's own shape rule on a data-less tensor, cached
    (running an op on a meta tensor costs ~0.5 ms of host time). A functools.partial is keyed by its
    function, arguments (modules by identity) and keywords."""
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

    def first_tensor(self):
        return self.child.first_tensor()

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
    numbered tensors."""

    def __init__(self):
        self.tensors = []
        self._ids = {}

    def add(self, t):
        k = id(t)
        if k not in self._ids:
            self._ids[k] = len(self.tensors)
            self.tensors.append(t)
        return self._ids[k]

    def __contains__(self, t):
        return id(t) in self._ids


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

    def __init__(self, dtype, fmt, grad):
        self.dtype, self.fmt, self.grad = dtype, fmt, grad
        self.memo = {}
        self._device = None

    def empty(self, shape):
        # allocated in its memory format directly (an NCHW empty followed by .contiguous(channels_last) would
        # copy the whole uninitialised buffer: one full-size strided copy kernel per materialised input)
        return torch.empty(shape, dtype=self.dtype, device=self._device, memory_format=self.fmt)

    def fill(self, node, out):
        """Write node's value into `out` (without grad only)."""
        got = self.memo.get(id(node))
        if got is not None:
            return out.copy_(got)
        node.fill(out, self)
        if not isinstance(node, Plain):
            self.memo[id(node)] = out
        return out

    def value(self, node):
        """The activated tensor of `node` in self.dtype (a Plain leaf is returned as its own view when its
        dtype fits)."""
        if isinstance(node, Plain):
            v = node.view()
            return v if v.dtype == self.dtype else v.to(self.dtype)
        if isinstance(node, Image):
            return node.normalised(self.dtype)
        got = self.memo.get(id(node))
        if got is not None:
            return got
        if self.grad:
            out = node.compute(self)
            if out.dtype != self.dtype:
                out = out.to(self.dtype)
        elif isinstance(node, Spatial):
            # the op's own output when it already has the dtype and layout (a pool of a channels-last input
            # is channels-last): no buffer to allocate and copy it into
            out = node.compute(self)
            if out.dtype != self.dtype or not out.is_contiguous(memory_format=self.fmt):
                out = self.empty(node.shape).copy_(out)
        else:
            out = node.fill(self.empty(node.shape), self)
        self.memo[id(node)] = out
        return out

    def run(self, node):
        self._device = node.first_tensor().device
        return self.value(node)

    def keep_for_backward(self, node):
        """Drop from the memo every value but node's and those its backward reads (backward_reads): what a
        conv input kept from forward for its backward holds (conv.inputs_kept)."""
        keep = {id(node)} | {id(n) for n in backward_reads(node)}
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
        gaps = _gaps(self.done, c0, c1)
        view = _sl(self.buf, c0, c1, full)
        if gaps == [(c0, c1)]:
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
            for a, b in _gaps(self.done, 0, full):
                _sl(buf, a, b, full).zero_()
        self.done = []
        return buf


class Grads:
    """Gradients of a lazy value's leaf tensors, accumulated by Node.backward without autograd.

    leaves: the stored tensors; needed: which of them want a gradient; shared: {leaf position: SharedGrad} of
    the leaves whose BN-act gradient goes to their producer (SharedGrad.deferred()). A leaf's gradient is one full-size
    buffer (the leaf's dtype and strides), allocated uninitialised on first use; each channel range a node
    writes is recorded, so the first write of a range is a plain store (the kernels' dz=, a copy_) and only
    a range written before is accumulated into (accumulate=True, add_). result() zeroes the ranges nobody
    wrote (a chunk read by another consumer) and returns one gradient per leaf (None: not needed/unreached)."""

    def __init__(self, leaves, needed, shared=None):
        self.leaves = leaves
        self.index = {id(t): i for i, t in enumerate(leaves)}
        self.needed = needed
        self._shared = shared or {}
        self.bufs = [None] * len(leaves)
        self.done = [None] * len(leaves)  # per leaf: list of written [c0, c1) ranges

    def needs(self, t):
        return self.needed[self.index[id(t)]]

    def shared(self, t):
        """The SharedGrad that takes t's BN-act gradient instead of this reader's BN backward, or None."""
        return self._shared.get(self.index[id(t)]) if self._shared else None

    def slot(self, t, c0, c1):
        """(view, accumulate): channels [c0, c1) of t's gradient buffer and whether it already holds a value
        (a partly written range gets its unwritten parts zeroed first, so accumulate covers all of it)."""
        i = self.index[id(t)]
        if self.bufs[i] is None:
            self.bufs[i] = torch.empty_like(t)
            self.done[i] = []
        buf, done = self.bufs[i], self.done[i]
        gaps = _gaps(done, c0, c1)
        full = t.shape[0] if t.ndim == 1 else t.shape[1]
        view = _sl(buf, c0, c1, full)
        if gaps == [(c0, c1)]:
            accumulate = False
        else:
            for a, b in gaps:
                _sl(buf, a, b, full).zero_()
            accumulate = True
        done.append((c0, c1))
        return view, accumulate

    def put(self, t, c0, c1, value, owned=False):
        """Add value (channels [c0, c1) of t's gradient) in. owned=True: value is a fresh tensor nobody else
        reads (a BN parameter gradient); when it is the first write of all of t's gradient it becomes the
        buffer itself (no allocation and copy)."""
        i = self.index[id(t)]
        if (owned and self.bufs[i] is None and c0 == 0 and c1 == (t.shape[0] if t.ndim == 1 else t.shape[1])
                and value.dtype == t.dtype and value.shape == t.shape and value.stride() == t.stride()):
            self.bufs[i] = value
            self.done[i] = [(c0, c1)]
            return
        view, accumulate = self.slot(t, c0, c1)
        if accumulate:
            view.add_(value)
        else:
            view.copy_(value)

    def result(self):
        for i, buf in enumerate(self.bufs):
            if buf is not None:
                full = buf.shape[0] if buf.ndim == 1 else buf.shape[1]
                for a, b in _gaps(self.done[i], 0, full):
                    _sl(buf, a, b, full).zero_()
        return self.bufs


def _gaps(done, c0, c1):
    """The parts of [c0, c1) not covered by the ranges in done."""
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


def natural_dtype(node):
    """The dtype a lazy value is materialised in outside a conv: its first stored tensor's (float32 for a
    uint8 image)."""
    t = node.first_tensor()
    return torch.float32 if t.dtype == torch.uint8 else t.dtype


def materialise(node):
    """The activated tensor of a lazy value (differentiable when grad is enabled): used where a consumer
    needs a real tensor (layers that fall back to plain torch)."""
    if isinstance(node, Plain):
        return node.view()
    if isinstance(node, Image):
        return node.normalised()
    t = node.first_tensor()
    return Evaluator(natural_dtype(node), memory_format_of(t), torch.is_grad_enabled()).run(node)


def materialise_any(x):
    """materialise() through lists and tuples (the inputs of multi-input layers); tensors pass through."""
    if isinstance(x, Node):
        return materialise(x)
    if isinstance(x, (list, tuple)):
        return type(x)(materialise_any(v) for v in x)
    return x
