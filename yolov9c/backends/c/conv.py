"""Convolutions that read a lazy input: activate on the fly, keep only the stored leaves, recompute in backward.

    zs = lazy_conv(x, [conv_a, conv_b])   # x: a lazy value (lazy/); conv_*: nn.Conv2d reading it

LazyConvFunction materialises x into one temporary buffer (a concat is written slice by slice), runs every conv
on it through torch, frees it, and saves only x's leaves (pre-BN z, statistics, BN parameters, plain tensors),
the weights and the tree x (no tensor of its own; backward frees it). Backward rebuilds the buffer from the
leaves (yolov9c.ops.bn_silu), computes the conv gradients with aten.convolution_backward and sends the input
gradient into the leaves; a z read by several consumers gets each share of dz, summed by autograd (exact).
Convs reading one input (RepConvN's 3x3/1x1, RepNCSP's cv1/cv2) share one Function: one materialisation each way.
inputs_kept(True) (switches.Switches.keep_inputs, default off: it raises the peak; benchmarks/RESULTS.md §16) keeps a
recomputed segment's conv inputs for their own backward instead of activating the leaves again; same gradients.
Autocast: convs run in the autocast dtype (z stored in it), BN arithmetic in fp32; inside the Function autocast
is off and casts are explicit, so forward and recompute give the same values.
Test: python -m pytest -q tests/backends/test_backend_c.py
"""

import contextlib

import torch
import torch.nn.functional as F

from yolov9c.backends.c.lazy import Evaluator, Grads, SharedGrad, memory_format_of
from yolov9c.ops import bn_silu as ops


class _Plan:
    """What LazyConvFunction needs besides tensors: the leaves' positions by id (`index`, for lazy.Grads) and
    their number, the conv geometry, the compute dtype / memory format, whether autocast was on (forward turns it
    off inside), and the SharedGrads of the leaves it reads (`reads`: {leaf position: SharedGrad}) and of its
    outputs (`outs`: one per conv, or None)."""

    __slots__ = ("n_leaves", "index", "convs", "dtype", "fmt", "device_type", "autocast", "reads", "outs")

    def __init__(self, index, convs, dtype, fmt, device_type, autocast, reads, outs):
        self.n_leaves, self.index, self.convs = len(index), index, convs
        self.dtype, self.fmt, self.device_type, self.autocast = dtype, fmt, device_type, autocast
        self.reads, self.outs = reads, outs


_KEEP = [False]  # inside inputs_kept(): each forward keeps its materialised input for its own backward


@contextlib.contextmanager
def inputs_kept(enabled=True):
    """Inside, when `enabled` (the keep_inputs switch: off by default, it raises the step's peak),
    LazyConvFunction.forward keeps the input it materialised (with the Evaluator's memo: the values a Spatial
    backward reads) for its own backward, which then runs on it instead of activating the leaves again, and frees
    it. For a segment's backward recompute (segment.py), whose backward follows at once: the kept inputs are a
    transient of one segment. Elsewhere (and by default) the input is a temporary, rebuilt in backward."""
    prev, _KEEP[0] = _KEEP[0], bool(enabled)
    try:
        yield
    finally:
        _KEEP[0] = prev


class KeptInput:
    """A conv input's value kept from forward for backward (inputs_kept): the Evaluator whose memo holds it."""

    __slots__ = ("ev",)

    def __init__(self, ev):
        self.ev = ev


def _autocast_dtype_2_4(device_type):
    """The autocast dtype of `device_type` ('cuda', 'cpu') when autocast is on there, else None (torch >= 2.4)."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def _autocast_dtype_2_1(device_type):
    """_autocast_dtype_2_4 through torch 2.1-2.3's per-device functions (deprecated since 2.4, still there)."""
    if device_type == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return None


autocast_dtype = _autocast_dtype_2_4 if hasattr(torch, "get_autocast_dtype") else _autocast_dtype_2_1


_NO_CONTEXT = contextlib.nullcontext()


def _autocast_off(device_type, on):
    """Autocast off inside when it is `on` (the Function casts explicitly); nothing to enter when it is off."""
    return torch.autocast(device_type, enabled=False) if on else _NO_CONTEXT


def _no_grad():
    """torch.no_grad() when grad is on (a backward run with create_graph=True); nothing to enter otherwise."""
    return torch.no_grad() if torch.is_grad_enabled() else _NO_CONTEXT


def _cast(t, dtype):
    """t in dtype (t itself when it has it: no dispatch for a no-op cast)."""
    return t if t.dtype == dtype else t.to(dtype)


def conv_supported(conv):
    """A conv this Function can run: zero padding given as integers (not 'same'/'valid'), not transposed."""
    return (isinstance(conv, torch.nn.Conv2d) and conv.padding_mode == "zeros"
            and not isinstance(conv.padding, str) and not conv.transposed)


_PER_CONV = 4  # parameters per conv: weight, bias, and the γ, β of the BN its output is activated with (or None)


def _run_convs(plan, x, params):
    """The convs of `plan` on x's activated value, a temporary built by an Evaluator and freed on return (rebuilt
    in backward unless kept, inputs_kept). params: w_0, b_0, γ_0, β_0, w_1, ... Returns (outputs, the weights
    in the compute dtype, the Evaluator)."""
    with _autocast_off(plan.device_type, plan.autocast):
        ev = Evaluator(plan.dtype, plan.fmt, grad=False)
        a = ev.run(x)
        outs, cast = [], []
        for k, (stride, padding, dilation, groups, _) in enumerate(plan.convs):
            w, b = params[_PER_CONV * k], params[_PER_CONV * k + 1]
            wc = _cast(w, plan.dtype)  # kept for backward (w itself when no cast is needed)
            cast.append(wc)
            outs.append(F.conv2d(a, wc, None if b is None else _cast(b, plan.dtype), stride, padding, dilation,
                                 groups))
    return outs, cast, ev


class LazyConvFunction(torch.autograd.Function):
    """forward(plan, x, *leaves, w_0, b_0, γ_0, β_0, w_1, ...) -> conv outputs (one per conv). See module
    docstring; x is the lazy input over `leaves` themselves (kept for backward, which frees it: backward runs
    once per forward); γ_k, β_k (the BN of output k, for its SharedGrad) may be None."""

    @staticmethod
    def forward(ctx, plan, x, *args):
        n = plan.n_leaves
        leaves, params = args[:n], args[n:]
        ctx.set_materialize_grads(False)  # an output whose readers all stashed (SharedGrad) has no gradient
        outs, cast, ev = _run_convs(plan, x, params)
        ctx.plan, ctx.input, ctx.kept = plan, (leaves, x), None
        if _KEEP[0]:
            ev.keep_for_backward(x)
            ctx.kept = KeptInput(ev)
        # the leaves are saved as well as kept in ctx.input (autograd's in-place checks and saved-tensor hooks
        # see them); an output with a SharedGrad is kept to its backward (which runs after all its readers')
        ctx.save_for_backward(*leaves, *params, *cast, *[o if sh else None for o, sh in zip(outs, plan.outs)])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        plan = ctx.plan
        n, nc = plan.n_leaves, len(plan.convs)
        saved = ctx.saved_tensors
        np_ = _PER_CONV * nc
        params = saved[n:n + np_]
        cast, outs = saved[n + np_:n + np_ + nc], saved[n + np_ + nc:]
        inp, kept, ctx.input, ctx.kept = ctx.input, ctx.kept, None, None  # freed when this backward returns
        if inp is None:
            raise RuntimeError("LazyConvFunction: a second backward through a retained graph (the input is freed "
                               "by the first)")
        leaves, tree = inp
        need = ctx.needs_input_grad[2:]
        need_leaf = [bool(need[i]) for i in range(n)]
        want_input = any(need_leaf)
        param_grads = [None] * len(params)
        grads = list(grads)
        for k, sh in enumerate(plan.outs):
            if sh is not None:  # the BN backward of the readers that stashed into it, on their summed dL/dy
                grads[k] = _shared_backward(sh, outs[k], grads[k], param_grads, _PER_CONV * k + 2,
                                            need[n + _PER_CONV * k + 2:n + _PER_CONV * k + 4])
        with _autocast_off(plan.device_type, autocast_dtype(plan.device_type) is not None), _no_grad():
            # forward's own input (a memo hit: no activation), or the same evaluation as forward (same kernels,
            # same in-place buffer): a bit-identical input
            ev = kept.ev if kept is not None else Evaluator(plan.dtype, plan.fmt, grad=False)
            a = ev.run(tree)
            grad_a = None
            for k, (stride, padding, dilation, groups, has_bias) in enumerate(plan.convs):
                g = grads[k]
                if g is None:
                    continue
                j = _PER_CONV * k
                mask = [want_input, bool(need[n + j]), has_bias and bool(need[n + j + 1])]
                if not any(mask):
                    continue
                w = params[j]
                gi, gw, gb = torch.ops.aten.convolution_backward(
                    _cast(g, plan.dtype), a, cast[k], [w.shape[0]] if has_bias else None,
                    list(stride), list(padding), list(dilation), False, [0, 0], groups, mask)
                if gi is not None:
                    grad_a = gi if grad_a is None else grad_a.add_(gi)
                if gw is not None:
                    param_grads[j] = _cast(gw, w.dtype)
                if gb is not None:
                    param_grads[j + 1] = _cast(gb, params[j + 1].dtype)
            del a
            leaf_grads = [None] * n
            if want_input and grad_a is not None:
                # dL/da sent down the tree by hand (lazy.Node.backward): each leaf's gradient is written
                # into one buffer, channel slice by slice, by the fused BN backward (dz=, accumulate=);
                # a leaf read by several lazy convs has its dL/dy stashed for its producer instead
                shared = {i: sh for i, sh in plan.reads.items() if sh.deferred()}
                acc = Grads(leaves, need_leaf, shared, plan.index)
                tree.backward(grad_a, ev, acc)
                leaf_grads = acc.result()
        return (None, None, *leaf_grads, *param_grads)


def _shared_backward(sh, z, g, param_grads, j, need_wb):
    """z's gradient with the BN backward of sh's stashed dL/dy added (g: what autograd brought, or None);
    dγ, dβ into param_grads[j], [j + 1]."""
    dy = sh.take()
    if dy is None:
        return g
    mean, invstd, act = sh.stats
    dz, dw, db = ops.backward(ops.BN(z, mean, invstd, sh.weight, sh.bias), dy, act=act)
    del dy
    param_grads[j] = dw if need_wb[0] else None
    param_grads[j + 1] = db if need_wb[1] else None
    return dz if g is None else dz.add_(g.to(dz.dtype))


def lazy_conv(x, convs, bns=None):
    """Run nn.Conv2d modules `convs` on the lazy value x; returns a list of their outputs (B, Co, H', W')
    in the compute dtype (the autocast dtype when autocast is on for the weights' device, else the weights'),
    differentiable w.r.t. x's leaves and the conv parameters.
    bns: the nn.BatchNorm2d each output is activated with (or None each): with grad enabled each such
    output gets a SharedGrad (lazy/grads.py), and its γ, β become inputs of the Function."""
    grad = torch.is_grad_enabled()
    bns = bns if (grad and bns is not None) else [None] * len(convs)
    geometry, outs, params = [], [], []
    for c, bn in zip(convs, bns):
        w, b = c.weight, c.bias
        sh = None if bn is None else SharedGrad(bn.weight, bn.bias)
        geometry.append((tuple(c.stride), tuple(c.padding), tuple(c.dilation), c.groups, b is not None))
        outs.append(sh)
        params += [w, b, None if sh is None else sh.weight, None if sh is None else sh.bias]
    w0 = params[0]
    amp = autocast_dtype(w0.device.type)
    fmt = memory_format_of(x.first_tensor())
    if not grad:  # nothing records (a recomputed segment's forward): the same convs without an autograd.Function
        return _run_convs(_Plan({}, geometry, amp or w0.dtype, fmt, w0.device.type, amp is not None, {}, outs), x,
                          params)[0]
    distinct = {id(t): t for t in x.tensors()}  # x's distinct tensors, in the order first met
    leaves = tuple(distinct.values())
    reads = {}
    for i, t in enumerate(leaves):
        # only a conv output z (4-D) carries a SharedGrad; a missing attribute costs an exception
        sh = getattr(t, "yv_shared", None) if t.ndim == 4 else None
        if sh is not None:
            sh.readers += 1
            reads[i] = sh
    index = dict(zip(distinct, range(len(leaves))))
    plan = _Plan(index, geometry, amp or w0.dtype, fmt, w0.device.type, amp is not None, reads, outs)
    zs = list(LazyConvFunction.apply(plan, x, *leaves, *params))
    for z, sh in zip(zs, outs):
        if sh is not None:
            z.yv_shared = sh
    return zs
