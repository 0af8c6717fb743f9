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
import types

import torch
import torch.nn.functional as F

from yolov9c.backends.c.casts import cast as cast_weight
from yolov9c.backends.c.lazy import Evaluator, Grads, SharedGrad, memory_format_of
from yolov9c.ops import bn_silu as ops


class _Call:
    """One lazy conv call: what LazyConvFunction needs besides the tensors autograd must see.
    x: the lazy input, over `leaves`, its distinct stored tensors (all saved for backward; backward frees x and
    leaves: it runs once per forward); index: {id(leaf): position} (for lazy.Grads); grad_leaves: the positions
    of the leaves that require grad, which are the Function's first inputs; convs: per conv (stride, padding,
    dilation, groups); params: per conv (w, b, γ, β), b, γ, β possibly None (γ, β: the BN its output is activated
    with, for its SharedGrad); slots: per conv the positions of w, b, γ, β among the Function's inputs after the
    call object (None for a None): the non-None params follow the leaves in that order; dtype / fmt / device: the
    compute dtype, memory format and x's device; device_type and whether autocast was on (forward turns it off
    inside); outs: one SharedGrad (or None) per conv."""

    __slots__ = ("x", "leaves", "index", "grad_leaves", "convs", "params", "slots", "dtype", "fmt", "device",
                 "device_type", "autocast", "outs")


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


def autocast_dtype(device_type):
    """The autocast dtype of `device_type` ('cuda', 'cpu') when autocast is on there, else None."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


# torch's own functions (torch >= 2.4, the training minimum: cli/train.py TORCH_MIN): no Python frame per call
autocast_on, set_autocast = torch.is_autocast_enabled, torch.set_autocast_enabled


def direct_apply(fn):
    """fn.apply for an autograd.Function class `fn` without setup_context, minus torch's Python wrapper
    (autograd.Function.apply), which checks for functorch transforms and then walks every argument to unwrap dead
    functorch wrappers (none here) before it calls torch's C apply: this calls that C apply directly, and the
    wrapper while functorch transforms are active. fn.apply itself where torch is not laid out so."""
    direct = getattr(super(torch.autograd.Function, fn), "apply", None)
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    if (not isinstance(direct, types.BuiltinMethodType) or active is None
            or fn.setup_context is not torch.autograd.Function.setup_context):
        return fn.apply

    def apply(*args):
        return fn.apply(*args) if active() else direct(*args)

    return apply


def conv_supported(conv):
    """A conv this Function can run: zero padding given as integers (not 'same'/'valid'), not transposed, its
    weight a registered parameter (lazy_conv reads conv._parameters; a parametrized weight is not one)."""
    return (isinstance(conv, torch.nn.Conv2d) and conv.padding_mode == "zeros"
            and not isinstance(conv.padding, str) and not conv.transposed and "weight" in conv._parameters)


def _run_convs(call):
    """The convs of `call` on call.x's activated value, a temporary built by an Evaluator and freed on return
    (rebuilt in backward unless kept, inputs_kept). Returns (outputs, the weights in the compute dtype, the
    Evaluator)."""
    dtype, amp = call.dtype, call.autocast
    # Autocast off inside when it is on (the casts are explicit): the ops run as under torch.autocast(device_type,
    # enabled=False), without that context's Python bookkeeping (it saves and restores the dtype and cache flags,
    # which enabled=False leaves as they are, and counts nesting for the cast cache, which ops without autocast
    # do not read).
    if amp:
        set_autocast(call.device_type, False)
    try:
        ev = Evaluator(dtype, call.fmt, False, call.device)
        a = ev.value(call.x)
        outs, cast = [], []
        for (stride, padding, dilation, groups), (w, b, _, _) in zip(call.convs, call.params):
            if w.dtype != dtype:  # w itself (kept for backward) when no cast is needed
                w = cast_weight(w, dtype)
            if b is not None and b.dtype != dtype:
                b = cast_weight(b, dtype)
            cast.append(w)
            outs.append(F.conv2d(a, w, b, stride, padding, dilation, groups))
    finally:
        if amp:
            set_autocast(call.device_type, True)
    return outs, cast, ev


class LazyConvFunction(torch.autograd.Function):
    """forward(call, *inputs) -> conv outputs (one per conv). See the module docstring and _Call: the inputs are
    the leaves of call.x that require grad, then the convs' non-None parameters (w_0, b_0, γ_0, β_0, w_1, ...)."""

    @staticmethod
    def forward(ctx, call, *inputs):
        ctx.set_materialize_grads(False)  # an output whose readers all stashed (SharedGrad) has no gradient
        outs, cast, ev = _run_convs(call)
        ctx.call, ctx.kept = call, None
        if _KEEP[0]:
            ev.keep_for_backward(call.x)
            ctx.kept = KeptInput(ev)
        # every leaf is saved as well as kept in call (autograd's in-place checks and saved-tensor hooks see
        # them); an output with a SharedGrad is kept to its backward (which runs after all its readers')
        ctx.save_for_backward(*cast, *[o if sh else None for o, sh in zip(outs, call.outs)], *call.leaves,
                              *inputs[len(call.grad_leaves):])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        call, kept = ctx.call, ctx.kept
        tree, leaves = call.x, call.leaves
        call.x = call.leaves = ctx.kept = None  # freed when this backward returns
        if tree is None:
            raise RuntimeError("LazyConvFunction: a second backward through a retained graph (the input is freed "
                               "by the first)")
        nc = len(call.convs)
        saved = ctx.saved_tensors
        need = ctx.needs_input_grad  # (call, *inputs): an input's slot s is need[1 + s]
        in_grads = [None] * (len(need) - 1)
        need_leaf = [False] * len(leaves)
        for j, i in enumerate(call.grad_leaves):
            need_leaf[i] = need[1 + j]
        want_input = True in need_leaf
        grads = list(grads)
        for k, sh in enumerate(call.outs):
            if sh is not None:  # the BN backward of the readers that stashed into it, on their summed dL/dy
                grads[k], dw, db = _shared_backward(sh, saved[nc + k], grads[k])
                _, _, sw, sb = call.slots[k]
                in_grads[sw] = dw if need[1 + sw] else None
                in_grads[sb] = db if need[1 + sb] else None
        # nothing here records (grad is on in a backward with create_graph=True); autocast off as in forward
        record = torch.is_grad_enabled()
        amp = autocast_on(call.device_type)
        if record:
            torch.set_grad_enabled(False)
        if amp:
            set_autocast(call.device_type, False)
        try:
            # forward's own input (a memo hit: no activation), or the same evaluation as forward (same kernels,
            # same in-place buffer): a bit-identical input
            ev = kept.ev if kept is not None else Evaluator(call.dtype, call.fmt, False, call.device)
            a = ev.value(tree)
            grad_a = None
            dtype = call.dtype
            for k, (stride, padding, dilation, groups) in enumerate(call.convs):
                g = grads[k]
                if g is None:
                    continue
                sw, sb = call.slots[k][:2]
                has_bias = sb is not None
                mask = (want_input, need[1 + sw], has_bias and need[1 + sb])
                if not (mask[0] or mask[1] or mask[2]):
                    continue
                w = call.params[k][0]
                gi, gw, gb = torch.ops.aten.convolution_backward(
                    g if g.dtype == dtype else g.to(dtype), a, saved[k], w.shape[:1] if has_bias else None,
                    stride, padding, dilation, False, (0, 0), groups, mask)
                if gi is not None:
                    grad_a = gi if grad_a is None else grad_a.add_(gi)
                # in the compute dtype: autograd's engine casts a gradient to its input's dtype (in C++, the same
                # cast without a Python call each)
                if gw is not None:
                    in_grads[sw] = gw
                if gb is not None:
                    in_grads[sb] = gb
            del a
            if want_input and grad_a is not None:
                # dL/da sent down the tree by hand (lazy.Node.backward): each leaf's gradient is written
                # into one buffer, channel slice by slice, by the fused BN backward (dz=, accumulate=);
                # a leaf read by several lazy convs has its dL/dy stashed for its producer instead
                acc = Grads(leaves, need_leaf, call.index)
                tree.backward(grad_a, ev, acc)
                leaf_grads = acc.result()
                for j, i in enumerate(call.grad_leaves):
                    in_grads[j] = leaf_grads[i]
        finally:
            if amp:
                set_autocast(call.device_type, True)
            if record:
                torch.set_grad_enabled(True)
        return (None, *in_grads)


_apply = direct_apply(LazyConvFunction)


def _shared_backward(sh, z, g):
    """(z's gradient with the BN backward of sh's stashed dL/dy added (g: what autograd brought, or None), dγ,
    dβ); (g, None, None) when no reader stashed."""
    dy = sh.take()
    if dy is None:
        return g, None, None
    mean, invstd, act = sh.stats
    dz, dw, db = ops.backward(ops.BN(z, mean, invstd, sh.weight, sh.bias), dy, act=act)
    del dy
    return (dz if g is None else dz.add_(g.to(dz.dtype))), dw, db


def lazy_conv(x, convs, bns=None):
    """Run nn.Conv2d modules `convs` on the lazy value x; returns a list of their outputs (B, Co, H', W')
    in the compute dtype (the autocast dtype when autocast is on for the weights' device, else the weights'),
    differentiable w.r.t. x's leaves and the conv parameters.
    bns: the nn.BatchNorm2d each output is activated with (or None each): with grad enabled each such
    output gets a SharedGrad (lazy/grads.py), and its γ, β become inputs of the Function.
    Parameters are read from the modules' _parameters (nn.Module.__getattr__ costs a Python call per read)."""
    call = _Call()
    call.x = x
    w0 = convs[0]._parameters["weight"]
    call.device_type = w0.device.type
    amp = autocast_dtype(call.device_type)
    call.dtype, call.autocast = amp or w0.dtype, amp is not None
    call.fmt, call.device = memory_format_of(x.first), x.first.device
    grad = torch.is_grad_enabled()
    call.convs, call.params, call.outs = geoms, params, outs = [], [], []
    for k, c in enumerate(convs):
        p = c._parameters
        geoms.append((c.stride, c.padding, c.dilation, c.groups))  # (nn.Conv2d keeps the first three as tuples)
        bn = bns[k] if (grad and bns is not None) else None
        if bn is None:
            outs.append(None)
            params.append((p["weight"], p["bias"], None, None))
        else:
            sh = SharedGrad(bn._parameters["weight"], bn._parameters["bias"])
            outs.append(sh)
            params.append((p["weight"], p["bias"], sh.weight, sh.bias))
    if not grad:  # nothing records (a recomputed segment's forward): the same convs without an autograd.Function
        return _run_convs(call)[0]
    ts = x.tensors()
    distinct = dict(zip(map(id, ts), ts))  # x's distinct tensors, in the order first met
    leaves = tuple(distinct.values())
    grad_leaves = [i for i, t in enumerate(leaves) if t.requires_grad]
    for t in leaves:
        # only a conv output z (4-D) carries a SharedGrad; a missing attribute costs an exception
        sh = getattr(t, "yv_shared", None) if t.ndim == 4 else None
        if sh is not None:
            sh.readers += 1
    inputs = [leaves[i] for i in grad_leaves]
    inputs += [p for ps in params for p in ps if p is not None]
    slots, pos = [[None] * 4 for _ in params], len(grad_leaves)
    for ps, slot in zip(params, slots):
        for j in range(4):
            if ps[j] is not None:
                slot[j], pos = pos, pos + 1
    call.leaves, call.index, call.grad_leaves = leaves, dict(zip(distinct, range(len(leaves)))), grad_leaves
    call.slots = slots
    zs = list(_apply(call, *inputs))
    for z, sh in zip(zs, outs):
        if sh is not None:
            z.yv_shared = sh
    return zs
