"""The c-backend forward of every yaml layer type, on lazy values (lazy/) and lazy convs (conv.py).

`layer_forward(m, x)` replaces a top-level layer's forward while the backend is applied. In training each layer
takes lazy values or tensors and hands on lazy values; the detect head returns plain tensors (the loss reads
them). Stored per layer: each conv's output z (compute dtype), per-channel batch statistics and the head's final
conv outputs — never an activated tensor, a concat or a pool output.
Plain torch (the layer's own forward on materialised inputs) runs when: the layer is in eval mode (validation,
fused/deploy models); a BatchNorm is missing, not training, not affine or not float32; a conv is not a plain
zero-padded nn.Conv2d; parameters are not float32; the type is unknown (users' modules) or random in training
(nn.Dropout p > 0: a recompute would draw a different mask).
A Conv whose activation is neither SiLU nor identity keeps its lazy conv but applies BN and activation with torch
(correct, without the memory saving for that Conv). The node builders up2, max_pool and nearest_backward are
read at call time: tests swap them for the path before the ops.
Test: python -m pytest -q tests/backends/test_backend_c.py
"""

import contextlib
import functools
import operator
import sys
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

from yolov9c.backends.c.conv import conv_supported, lazy_conv
from yolov9c.backends.c.lazy import BNAct, Cat, Image, Node, Plain, RepAct, Spatial, Sum, materialise_any
from yolov9c.models.common import (ADown, AConv, CBFuse, CBLinear, Concat, Conv, ELAN1, RepConvN, RepNBottleneck,
                                   RepNCSP, RepNCSPELAN4, SP, SPPELAN, Silence)
from yolov9c.models.head import DFL, DDetect, DualDDetect
from yolov9c.ops import bn_silu as ops
from yolov9c.ops import pool
from yolov9c.ops.extension import lean_host


def _node(x):
    """A tensor as a lazy leaf (a uint8 image batch as an Image); lazy values pass through."""
    if isinstance(x, Node):
        return x
    return Image(x) if x.dtype == torch.uint8 else Plain(x)


_ACTS = {nn.SiLU: "silu", nn.Identity: "identity"}  # the activations the fused kernels apply, by module type

# The per-step path reads sub-modules, parameters and buffers from nn.Module's own dicts (_modules, _parameters,
# _buffers), where supported() found them: nn.Module.__getattr__ is a Python call per attribute read.


class StatsTape:
    """The batch statistics of one recomputed segment (pgi.py): recorded in order by its forward, handed back
    in the same order by its backward recompute, so that the recompute normalises with exactly the forward's
    statistics and never updates a BatchNorm's running statistics (or num_batches_tracked) a second time."""

    __slots__ = ("stats", "pos")

    def __init__(self):
        self.stats, self.pos = [], None

    def take(self, bn, z):
        if self.pos is None:  # recording (the segment's forward)
            got = _batch_stats(bn, z)
            self.stats.append(got)
            return got
        got = self.stats[self.pos]
        self.pos += 1
        return got


_TAPE = [None]  # the StatsTape in use, if any (one segment runs at a time: forward, or its backward recompute)


def use_tape(tape):
    """Make `tape` the one _stats reads (None: none); returns the previous one (restore it with use_tape)."""
    prev, _TAPE[0] = _TAPE[0], tape
    return prev


def _stats(bn, z):
    """Batch (mean, invstd) of z (from the tape inside a recomputed segment, see StatsTape)."""
    tape = _TAPE[0]
    return _batch_stats(bn, z) if tape is None else tape.take(bn, z)


def _batch_stats(bn, z):
    """Batch (mean, invstd) of z, updating bn's running statistics and num_batches_tracked exactly as
    nn.BatchNorm2d.forward does in training mode (momentum None = cumulative average). With
    extension.lean_host(): written into bn's kept vectors when nothing holds them (_stats_out), and inside
    counting_batches() num_batches_tracked is counted when the block ends, with the others in one call."""
    momentum = 0.0 if bn.momentum is None else bn.momentum
    lean = lean_host()
    out = _stats_out(bn, z) if lean else None
    if bn.track_running_stats:
        buffers = bn._buffers
        n = buffers["num_batches_tracked"]
        pending = _COUNTS[0]
        if pending is None or bn.momentum is None:
            n.add_(1)
        else:
            pending.append(n)
        if bn.momentum is None:
            momentum = 1.0 / float(n)
        return ops.stats(z, buffers["running_mean"], buffers["running_var"], momentum, bn.eps, out)
    return ops.stats(z, None, None, momentum, bn.eps, out)


_COUNTS = [None]  # inside counting_batches(): the num_batches_tracked tensors to add 1 to when it ends
_KEPT = weakref.WeakKeyDictionary()  # lean_host: BatchNorm -> (mean, invstd) float32 rows of one (2, C) tensor


@contextlib.contextmanager
def counting_batches():
    """Inside (the c model's forward, pgi.model_forward), with lean_host(), each BatchNorm's num_batches_tracked
    += 1 is collected and done for all of them in one torch._foreach_add_ when the block ends (also on an
    error: the counts the forward reached, as nn.BatchNorm2d leaves them). Nested blocks count in the outer."""
    if _COUNTS[0] is not None or not lean_host():
        yield
        return
    _COUNTS[0] = pending = []
    try:
        yield
    finally:
        _COUNTS[0] = None
        if pending:
            torch._foreach_add_(pending, 1)


def _stats_out(bn, z):
    """bn's kept (mean, invstd) for z's statistics, or None (ops.stats allocates) while anything still holds the
    last ones: a backward not yet run saved them (their TensorImpl's use count), or Python code holds the tensors
    (their reference count beyond the kept tuple's). Made on first use, again for another device or width."""
    got = _KEPT.get(bn)
    c = z.shape[1]
    if got is not None and got[0].device == z.device and got[0].shape[0] == c:
        mean, invstd = got
        if mean._use_count() == 1 and invstd._use_count() == 1 and sys.getrefcount(mean) <= _FREE_REFS \
                and sys.getrefcount(invstd) <= _FREE_REFS:
            return got
        return None
    got = _KEPT[bn] = tuple(torch.empty((2, c), dtype=torch.float32, device=z.device).unbind(0))
    return got


def _free_refs():
    """sys.getrefcount of a kept vector that nothing else holds, seen from _stats_out (the kept tuple, the local
    name, the call's argument): measured here the same way, not assumed, so that an interpreter that counts
    otherwise makes the check stricter or looser by the same amount."""
    got = (torch.empty(1), torch.empty(1))
    mean, invstd = got
    return sys.getrefcount(mean)


_FREE_REFS = _free_refs()


def _bn_act(m, z):
    """Conv m's BN + activation on its conv output z, as a lazy value."""
    mods = m._modules
    bn, act = mods["bn"], mods["act"]
    name = _ACTS[type(act)] if type(act) in _ACTS else None
    if name is None:  # no fused kernel for this activation: torch BN + act, stored as in the torch backend
        return Plain(act(bn(z)))
    mean, invstd = _stats(bn, z)
    params = bn._parameters
    weight = params["weight"]
    shared = getattr(z, "yv_shared", None)  # (lazy.SharedGrad: lazy_conv made one for m.bn)
    if shared is not None:
        shared.bind(mean, invstd, weight, name)
    return BNAct(ops.BN(z, mean, invstd, weight, params["bias"]), name, shared)


def conv(m, x):
    """Conv: lazy conv → lazy BN-act."""
    mods = m._modules
    return _bn_act(m, lazy_conv(_node(x), [mods["conv"]], [mods["bn"]])[0])


def convs(ms, x):
    """Several Convs reading the same input (one materialisation of x)."""
    zs = lazy_conv(_node(x), [m._modules["conv"] for m in ms], [m._modules["bn"] for m in ms])
    return [_bn_act(m, z) for m, z in zip(ms, zs)]


def repconvn(m, x):
    mods = m._modules
    c1, c2 = mods["conv1"]._modules, mods["conv2"]._modules
    z1, z2 = lazy_conv(_node(x), [c1["conv"], c2["conv"]])
    bn1, bn2 = c1["bn"], c2["bn"]
    if type(mods["act"]) is not nn.SiLU:  # no fused kernel: torch BNs + act on the stored conv outputs
        return Plain(mods["act"](bn1(z1) + bn2(z2)))
    s1, s2 = _stats(bn1, z1), _stats(bn2, z2)
    p1, p2 = bn1._parameters, bn2._parameters
    return RepAct(ops.BN(z1, *s1, p1["weight"], p1["bias"]), ops.BN(z2, *s2, p2["weight"], p2["bias"]))


def repnbottleneck(m, x):
    x = _node(x)
    mods = m._modules
    y = run(mods["cv2"], run(mods["cv1"], x))
    return Sum([x, y]) if m.add else y


def repncsp(m, x):
    mods = m._modules
    a, b = convs([mods["cv1"], mods["cv2"]], x)
    a = run(mods["m"], a)
    return conv(mods["cv3"], Cat([a, b]))


def elan(m, x):
    """RepNCSPELAN4 and ELAN1: the cv1 output's halves, two stages, and a concat-free cv4."""
    mods = m._modules
    y0 = conv(mods["cv1"], x)
    c = y0.shape[1]
    h = (c + 1) // 2  # Tensor.chunk(2, 1) sizes
    y1, y2 = y0.slice(0, h), y0.slice(h, c)
    y3 = run(mods["cv2"], y2)
    y4 = run(mods["cv3"], y3)
    return conv(mods["cv4"], Cat([y1, y2, y3, y4]))


def _avg2(x):
    """ADown/AConv's F.avg_pool2d(x, 2, 1, 0, False, True) as a lazy value: the yolov9c.ops.pool op (C on the
    CPU, CUDA kernels on a GPU), whose backward reads only the incoming gradient (no forward re-run)."""
    return Spatial(pool.avg_pool2x2, _node(x), grad=pool.avg_pool2x2_backward)


def _max_pool_grad(k, s, p, g, x):
    """Spatial's direct gradient of max_pool2d(x, k, s, p): from g and the pool's input x (no forward re-run)."""
    return pool.max_pool2d_backward(x, g.to(x.dtype), k, s, p)


def max_pool(child, k, s, p):
    """F.max_pool2d(child, k, s, p) as a lazy value: the yolov9c.ops.pool op, whose backward reads the memoised
    input and the gradient (grad_reads_x), not a re-run of the forward under autograd."""
    return Spatial(functools.partial(pool.max_pool2d, k=k, s=s, p=p), child,
                   grad=functools.partial(_max_pool_grad, k, s, p), grad_reads_x=True)


def _max_geometry(m):
    """(k, s, p) of an nn.MaxPool2d the op covers (square, dilation 1, floor mode, no indices), else None."""
    def pair(v):
        return tuple(v) if isinstance(v, (tuple, list)) else (v, v)

    k, s, p, d = (pair(v) for v in (m.kernel_size, m.stride if m.stride else m.kernel_size, m.padding, m.dilation))
    if k[0] != k[1] or s[0] != s[1] or p[0] != p[1] or d != (1, 1) or m.ceil_mode or m.return_indices:
        return None
    # k <= 15: the op's backward stores each window's argmax as one uint8 (k*k <= 255)
    if not 1 <= k[0] <= 15 or not 1 <= s[0] <= 63 or not 0 <= p[0] <= k[0] // 2:
        return None
    return k[0], s[0], p[0]


def aconv(m, x):
    return conv(m.cv1, _avg2(x))


def adown(m, x):
    p = _avg2(x)
    c = p.shape[1]
    h = (c + 1) // 2
    a = conv(m.cv1, p.slice(0, h))
    b = conv(m.cv2, max_pool(p.slice(h, c), 3, 2, 1))
    return Cat([a, b])


def sppelan(m, x):
    y = [conv(m.cv1, x)]
    for sp in (m.cv2, m.cv3, m.cv4):
        y.append(run(sp, y[-1]))
    return conv(m.cv5, Cat(y))


def _nearest_grad(in_hw, scales, g):
    """Nearest upsampling's input gradient from the output gradient alone: the op autograd runs for it
    (aten.upsample_nearest2d_backward, the same scales), without re-running the upsampling first."""
    return torch.ops.aten.upsample_nearest2d_backward(g, list(g.shape[2:]), [g.shape[0], g.shape[1], *in_hw],
                                                      *scales)


def nearest_backward(child, scales=(None, None)):
    """Spatial's direct gradient of a nearest upsampling of `child` (scales as the forward passed them)."""
    return functools.partial(_nearest_grad, tuple(child.shape[2:]), scales)


def up2(child):
    """A nearest 2× upsampling of child as a lazy value: the yolov9c.ops.pool op (C on the CPU, CUDA kernels on a
    GPU), whose backward reads only the incoming gradient (no forward re-run)."""
    return Spatial(pool.upsample_nearest2x, child, grad=pool.upsample_nearest2x_backward)


def _nearest_scales(m):
    """(sh, sw) of an nn.Upsample in nearest mode with a scale factor (floats), else None."""
    if type(m) is not nn.Upsample or m.mode != "nearest" or m.recompute_scale_factor:
        return None
    if m.size is not None or m.scale_factor is None:
        return None
    sf = m.scale_factor
    return tuple(float(v) for v in sf) if isinstance(sf, tuple) else (float(sf), float(sf))


def _upsample_grad(m, child):
    """Spatial's direct gradient for an nn.Upsample in nearest mode; None (autograd re-runs it) otherwise."""
    if type(m) is not nn.Upsample or m.mode != "nearest" or m.recompute_scale_factor:
        return None
    return nearest_backward(child, _nearest_scales(m) or (None, None))


def spatial(m, x):
    """SP, nn.MaxPool2d, nn.AvgPool2d, nn.Upsample, nn.ZeroPad2d: per-channel, applied after activation."""
    m = m.m if isinstance(m, SP) else m
    child = _node(x)
    geom = _max_geometry(m) if type(m) is nn.MaxPool2d else None
    if geom is not None:
        return max_pool(child, *geom)
    if _nearest_scales(m) == (2.0, 2.0):  # the heads' nn.Upsample(None, 2, 'nearest')
        return up2(child)
    # the class's forward: a top-level layer's own `forward` attribute is the c forward (this function)
    return Spatial(functools.partial(type(m).forward, m), child, grad=_upsample_grad(m, child))


def identity(m, x):
    return x


def concat(m, xs):
    if m.d not in (1, -3):
        return torch.cat(materialise_any(xs), m.d)
    return Cat([_node(x) for x in xs])


def cblinear(m, x):
    """CBLinear's conv output is stored as is (biased, no BN); its chunks are lazy plain slices of it."""
    z = lazy_conv(_node(x), [m.conv])[0]
    out, off = [], 0
    for c in m.c2s:
        out.append(Plain(z, off, off + c))
        off += c
    return tuple(out)


def cbfuse(m, xs):
    last = _node(xs[-1])
    size = tuple(last.shape[2:])
    resize = functools.partial(F.interpolate, size=size, mode="nearest")
    picked = []
    for i, x in enumerate(xs[:-1]):
        child = _node(x[m.idx[i]])
        if tuple(2 * v for v in child.shape[2:]) == size:  # exactly 2× nearest: the op; other sizes on torch
            picked.append(up2(child))
        else:
            picked.append(Spatial(resize, child, grad=nearest_backward(child)))
    return Sum(picked + [last])


def conv2d(m, x):
    """A bare nn.Conv2d (a detect branch's last conv): its output is stored as a plain tensor."""
    return Plain(lazy_conv(_node(x), [m])[0])


def sequential(m, x):
    for sub in m:
        x = run(sub, x)
    return x


def detect_level(seq_a, seq_b, x):
    """A detect level: box and class branches on one input; the first Convs share the materialisation."""
    x = _node(x)
    subs_a, subs_b = list(seq_a._modules.values()), list(seq_b._modules.values())
    if isinstance(subs_a[0], Conv) and isinstance(subs_b[0], Conv):
        a, b = convs([subs_a[0], subs_b[0]], x)
        start = 1
    else:
        a = b = x
        start = 0
    for sub in subs_a[start:]:
        a = run(sub, a)
    for sub in subs_b[start:]:
        b = run(sub, b)
    a, b = materialise_any(a), materialise_any(b)  # plain conv outputs: returned to the loss as maps
    return torch.cat((a, b), 1)


def ddetect(m, xs):
    if type(m) is DualDDetect:
        nl = m.nl
        d1 = [detect_level(m.cv2[i], m.cv3[i], xs[i]) for i in range(nl)]
        d2 = [detect_level(m.cv4[i], m.cv5[i], xs[nl + i]) for i in range(nl)]
        return [d1, d2]
    return [detect_level(m.cv2[i], m.cv3[i], xs[i]) for i in range(m.nl)]


FORWARDS = {
    Conv: conv, RepConvN: repconvn, RepNBottleneck: repnbottleneck, RepNCSP: repncsp, RepNCSPELAN4: elan,
    ELAN1: elan, AConv: aconv, ADown: adown, SPPELAN: sppelan, SP: spatial, nn.MaxPool2d: spatial,
    nn.AvgPool2d: spatial, nn.Upsample: spatial, nn.ZeroPad2d: spatial, nn.Identity: identity,
    Silence: identity, nn.Dropout: identity, Concat: concat, CBLinear: cblinear, CBFuse: cbfuse,
    nn.Conv2d: conv2d, nn.Sequential: sequential, DDetect: ddetect, DualDDetect: ddetect,
}


def run(m, x):
    """The c forward of sub-module m (its structure was checked by supported())."""
    return FORWARDS[type(m)](m, x)


def _module_ok(m):
    """Whether sub-module m can run (or be read) by the c forwards; see the module docstring."""
    t = type(m)
    if t is nn.BatchNorm2d:
        f32 = m.weight is not None and m.weight.dtype == torch.float32
        return m.training and m.affine and f32 and (m.running_mean is None or m.running_mean.dtype == torch.float32)
    if t is Conv:
        mods = m._modules
        return mods.get("bn") is not None and "act" in mods and conv_supported(mods.get("conv"))
    if t is RepConvN:
        return m._modules.get("conv") is None  # fuse_convs() not run
    if t is nn.Conv2d:
        return conv_supported(m)
    if t is nn.MaxPool2d:
        return not m.return_indices
    if t is nn.Dropout:
        return m.p == 0
    if t in FORWARDS or t in (nn.ModuleList, DFL):
        return True
    return t.__module__ == "torch.nn.modules.activation"  # applied through torch by _bn_act / repconvn


_NOT_NONE = functools.partial(operator.is_not, None)
_TRAINING = operator.attrgetter("training")


def _submodules(layer):
    """layer and every sub-module (a plain walk of _modules; Module.modules() costs ~7× as much)."""
    mods = [layer]
    for m in mods:
        if m._modules:  # (most are leaves)
            mods += filter(_NOT_NONE, m._modules.values())
    return mods


def parameters_of(mods):
    """The distinct parameters of modules `mods` and of their sub-modules (one walk of each module tree, without
    nn.Module.parameters()' generator per sub-module)."""
    found = {}
    for root in mods:
        for m in _submodules(root):
            if m._parameters:
                ps = m._parameters.values()
                found.update(zip(map(id, ps), ps))
    found.pop(id(None), None)
    return list(found.values())


def supported(layer):
    """True when `layer` is in training mode and every sub-module has a c forward (or is a parameter holder
    or an activation) and meets its conditions. The answer is cached on the layer under a key of what it
    depends on that can change between steps: the sub-modules themselves (held, not their ids: fusing removes
    some), their training flags and the BatchNorms' dtypes."""
    if not layer.training or type(layer) not in FORWARDS:
        return False
    mods = _submodules(layer)
    dtypes = ()
    for m in mods:
        if type(m) is nn.BatchNorm2d:
            w = m._parameters["weight"]
            dtypes += (None if w is None else w.dtype,)
    key = (tuple(mods), tuple(map(_TRAINING, mods)), dtypes)
    got = layer.__dict__.get("_c_supported")
    if got is not None and got[0] == key:
        return got[1]
    ok = all(_module_ok(m) for m in mods)
    layer.__dict__["_c_supported"] = (key, ok)
    return ok


def layer_forward(self, x):
    """The forward of a top-level layer while the c backend is applied."""
    if supported(self):
        return run(self, x)
    return type(self).forward(self, materialise_any(x))
