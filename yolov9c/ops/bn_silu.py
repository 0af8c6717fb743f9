"""Fused training-mode BatchNorm + SiLU: statistics, normalise-and-activate, and the full BN backward.

The c backend hands a conv output on as its pre-BN tensor z plus per-channel batch statistics and the BN
parameters; consumers compute a = act(BN(z)) on the fly and, in backward, add their share of dz.

Shapes and dtypes (every function):
    z, residual, out, grad_out, dz   (B, C, H, W), any strides (NCHW, channels-last, channel-slice views of a
                                     bigger buffer); storage float32 / float16 / bfloat16, arithmetic float32
    mean, invstd, weight, bias       (C,) float32; invstd = 1 / sqrt(biased_var + eps)
    act                              "silu" or "identity"
Maths (x̂ = (z - mean)·invstd, u = x̂·γ + β, y = act(u), g = dy·act'(u), n = B·H·W):
    forward   y = act(u)                         (bn_silu_add: y = residual + act(u);
                                                  bn2_silu: y = silu(u1 + u2))
    backward  dβ = Σ g,  dγ = Σ g·x̂,
              dz = γ·invstd·(g − Σg/n − x̂·Σ(g·x̂)/n)    batch_stats=True: mean/invstd are z's own batch
                                                        statistics, so their dependence on z is included
              dz = γ·invstd·g                            batch_stats=False (eval-mode running statistics)
    mean and invstd never receive a gradient; the autograd Functions save only z, mean, invstd, γ, β.

Dispatch (read at every call): YOLOV9C_FUSED=0 -> the *_reference functions (stock torch ops); CPU tensors ->
csrc/bn_silu_ref.c through NumPy (bfloat16 is upcast to float32 and cast back); CUDA tensors ->
kernels/bn_silu.cu on the current stream.
Test: python -m pytest -q tests/test_bn_silu.py
"""

import torch

from yolov9c.ops import extension

ACTS = ("silu", "identity")
_STORAGE = (torch.float32, torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------------------------------------
# argument checks of the torch references. The fused path checks nothing here: csrc/bn_silu.c checks every
# argument once (errors name the op and the argument); Python only asks whether z is a tensor at all.

def _check_z(op, name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != 4:
        raise ValueError(f"{op}: {name} must have 4 dimensions (B, C, H, W), got shape {tuple(t.shape)}")
    if t.dtype not in _STORAGE:
        raise TypeError(f"{op}: {name} must be float32, float16 or bfloat16, got {t.dtype}")


def _check_like(op, name, t, z, zname="z", dtypes=_STORAGE):
    """t: a 4-D tensor of z's shape and device (dtype among `dtypes`)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.shape != z.shape:
        raise ValueError(f"{op}: {name} must have the shape of {zname} {tuple(z.shape)}, got {tuple(t.shape)}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{op}: {name} must be {names}, got {t.dtype}")
    if t.device != z.device:
        raise ValueError(f"{op}: {name} is on {t.device} but {zname} is on {z.device}")


def _check_vec(op, name, t, z, zname="z"):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    C = z.shape[1]
    if t.ndim != 1 or t.shape[0] != C:
        raise ValueError(f"{op}: {name} must have shape ({C},) (the channels of {zname}), got {tuple(t.shape)}")
    if t.dtype != torch.float32:
        raise TypeError(f"{op}: {name} must be float32, got {t.dtype}")
    if t.device != z.device:
        raise ValueError(f"{op}: {name} is on {t.device} but {zname} is on {z.device}")


def _check_act(op, act):
    if act not in ACTS:
        raise ValueError(f"{op}: act must be 'silu' or 'identity', got {act!r}")


def _check_bn(op, z, mean, invstd, weight, bias, suffix=""):
    zname = "z" + suffix
    _check_z(op, zname, z)
    for name, t in (("mean", mean), ("invstd", invstd), ("weight", weight), ("bias", bias)):
        _check_vec(op, name + suffix, t, z, zname)


def _check_out(op, name, out, z):
    if out is not None:
        _check_like(op, name, out, z)


def _check_dz(op, name, dz, z, zname="z"):
    if dz is not None:
        _check_like(op, name, dz, z, zname, dtypes=(z.dtype, torch.float32))


def _format_of(z):
    """z's memory format for new tensors: channels-last when z's channel stride is 1 (also for a channel slice
    of a channels-last buffer), else NCHW contiguous."""
    if z.ndim == 4 and z.stride(1) == 1 and z.shape[1] > 1:
        return torch.channels_last
    return torch.contiguous_format


def _empty_like(z, dtype=None):
    return torch.empty(z.shape, dtype=dtype or z.dtype, device=z.device, memory_format=_format_of(z))


def _view_c(v):
    return v.view(1, -1, 1, 1)


# ---------------------------------------------------------------------------------------------------------
# references from stock torch ops (float32 arithmetic)

def bn_stats_reference(z, running_mean=None, running_var=None, momentum=0.03, eps=1e-3):
    """Per-channel batch mean and invstd = 1/sqrt(biased_var + eps) of z (B, C, H, W), float32 (C,) each;
    updates running_mean/running_var (float32 (C,)) in place like nn.BatchNorm2d in training mode."""
    op = "bn_stats"
    _check_stats_args(op, z, running_mean, running_var, momentum, eps)
    zf = z.detach().float()
    var, mean = torch.var_mean(zf, dim=(0, 2, 3), unbiased=False)
    invstd = torch.rsqrt(var + eps)
    _update_running(z, mean, var, running_mean, running_var, momentum)
    return mean, invstd


def _update_running(z, mean, var, running_mean, running_var, momentum):
    n = z.shape[0] * z.shape[2] * z.shape[3]
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1.0 - momentum).add_(mean, alpha=momentum)
        if running_var is not None:
            running_var.mul_(1.0 - momentum).add_(var * (n / (n - 1)), alpha=momentum)


def _check_stats_args(op, z, running_mean, running_var, momentum, eps):
    _check_z(op, "z", z)
    if running_mean is not None:
        _check_vec(op, "running_mean", running_mean, z)
    if running_var is not None:
        _check_vec(op, "running_var", running_var, z)
    for name, v in (("momentum", momentum), ("eps", eps)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{op}: {name} must be a float, got {type(v).__name__}")
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"{op}: momentum must be in [0, 1], got {momentum}")
    if not eps > 0.0:
        raise ValueError(f"{op}: eps must be > 0, got {eps}")
    n = z.shape[0] * z.shape[2] * z.shape[3]
    if n <= 1:
        raise ValueError(f"{op}: expected more than 1 value per channel when training, got input size "
                         f"{tuple(z.shape)}")


def _stats_with_grad(zf, mean, invstd):
    """mean and invstd with their given values but the derivatives of z's batch statistics:
    d mean/dz = 1/n, d invstd/d var = -invstd³/2 (whatever eps was). x - x.detach() is exactly 0."""
    m = zf.mean(dim=(0, 2, 3))
    mean_g = mean.detach() + (m - m.detach())
    v = (zf - _view_c(mean_g)).square().mean(dim=(0, 2, 3))
    inv = invstd.detach()
    invstd_g = inv + (-0.5 * inv * inv * inv) * (v - v.detach())
    return mean_g, invstd_g


def _bn_reference(z, mean, invstd, weight, bias, batch_stats):
    zf = z.float()
    if batch_stats and torch.is_grad_enabled() and z.requires_grad:
        mean, invstd = _stats_with_grad(zf, mean, invstd)
    else:
        mean, invstd = mean.detach(), invstd.detach()
    return (zf - _view_c(mean)) * _view_c(invstd) * _view_c(weight) + _view_c(bias)


def _act(u, act):
    return torch.nn.functional.silu(u) if act == "silu" else u


def _finish(y, z, out):
    """Store y (float32) into out (any view, via differentiable copy_) or into a new tensor like z."""
    if out is not None:
        return out.copy_(y)
    return y.to(dtype=z.dtype, memory_format=_format_of(z))


def bn_silu_reference(z, mean, invstd, weight, bias, act="silu", out=None, batch_stats=True):
    """y = act((z - mean)·invstd·weight + bias) from torch ops; differentiable with the full training BN
    backward (batch_stats=True) through autograd. Returns out (when given) or a new tensor like z."""
    op = "bn_silu"
    _check_bn(op, z, mean, invstd, weight, bias)
    _check_act(op, act)
    _check_out(op, "out", out, z)
    return _finish(_act(_bn_reference(z, mean, invstd, weight, bias, batch_stats), act), z, out)


def bn_silu_add_reference(z, mean, invstd, weight, bias, residual, act="silu", out=None, batch_stats=True):
    """y = residual + act(BN(z)) from torch ops (differentiable)."""
    op = "bn_silu_add"
    _check_bn(op, z, mean, invstd, weight, bias)
    _check_like(op, "residual", residual, z)
    _check_act(op, act)
    _check_out(op, "out", out, z)
    y = residual.float() + _act(_bn_reference(z, mean, invstd, weight, bias, batch_stats), act)
    return _finish(y, z, out)


def bn2_silu_reference(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, out=None,
                       batch_stats=True):
    """y = silu(BN1(z1) + BN2(z2)) from torch ops (differentiable); RepConvN's training form."""
    op = "bn2_silu"
    _check_bn2(op, z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2)
    _check_out(op, "out", out, z1)
    u = (_bn_reference(z1, mean1, invstd1, weight1, bias1, batch_stats)
         + _bn_reference(z2, mean2, invstd2, weight2, bias2, batch_stats))
    return _finish(torch.nn.functional.silu(u), z1, out)


def _check_bn2(op, z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2):
    _check_bn(op, z1, mean1, invstd1, weight1, bias1, "1")
    _check_bn(op, z2, mean2, invstd2, weight2, bias2, "2")
    if z2.shape != z1.shape:
        raise ValueError(f"{op}: z2 must have the shape of z1 {tuple(z1.shape)}, got {tuple(z2.shape)}")
    if z2.device != z1.device:
        raise ValueError(f"{op}: z2 is on {z2.device} but z1 is on {z1.device}")


def _act_grad(u, gy, act):
    if act == "identity":
        return gy
    s = torch.sigmoid(u)
    return gy * (s * (1.0 + u * (1.0 - s)))


def _bn_backward_from_g(z, mean, invstd, weight, g, batch_stats):
    """(dz value float32, dγ, dβ) of one BN given g = dL/du (float32)."""
    xhat = (z.detach().float() - _view_c(mean)) * _view_c(invstd)
    dbias = g.sum(dim=(0, 2, 3))
    dweight = (g * xhat).sum(dim=(0, 2, 3))
    scale = _view_c(weight * invstd)
    if batch_stats:
        n = z.shape[0] * z.shape[2] * z.shape[3]
        dz = scale * (g - _view_c(dbias / n) - xhat * _view_c(dweight / n))
    else:
        dz = scale * g
    return dz, dweight, dbias


def _store_grad(val, z, dz, accumulate):
    if dz is None:
        return val.to(dtype=z.dtype, memory_format=_format_of(z))
    if accumulate:
        return dz.add_(val.to(dz.dtype))
    return dz.copy_(val)


def bn_silu_backward_reference(z, mean, invstd, weight, bias, grad_out, act="silu", dz=None, accumulate=False,
                               batch_stats=True):
    """The raw backward from torch ops: (dz, dweight, dbias). dz is written (=) or added to (+=,
    accumulate=True) when given (z's dtype or float32, any view), else a new tensor like z."""
    op = "bn_silu_backward"
    _check_backward_args(op, z, mean, invstd, weight, bias, grad_out, act, dz)
    with torch.no_grad():
        u = (z.float() - _view_c(mean)) * _view_c(invstd * weight) + _view_c(bias)
        g = _act_grad(u, grad_out.float(), act)
        val, dw, db = _bn_backward_from_g(z, mean, invstd, weight, g, batch_stats)
        return _store_grad(val, z, dz, accumulate), dw, db


def _check_backward_args(op, z, mean, invstd, weight, bias, grad_out, act, dz):
    _check_bn(op, z, mean, invstd, weight, bias)
    _check_like(op, "grad_out", grad_out, z)
    _check_act(op, act)
    _check_dz(op, "dz", dz, z)


def bn2_silu_backward_reference(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, grad_out,
                                dz1=None, dz2=None, accumulate=False, batch_stats=True):
    """Raw backward of bn2_silu from torch ops: (dz1, dw1, db1, dz2, dw2, db2)."""
    op = "bn2_silu_backward"
    _check_bn2_backward_args(op, z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2,
                             grad_out, dz1, dz2)
    with torch.no_grad():
        u = ((z1.float() - _view_c(mean1)) * _view_c(invstd1 * weight1) + _view_c(bias1)
             + (z2.float() - _view_c(mean2)) * _view_c(invstd2 * weight2) + _view_c(bias2))
        g = _act_grad(u, grad_out.float(), "silu")
        v1, dw1, db1 = _bn_backward_from_g(z1, mean1, invstd1, weight1, g, batch_stats)
        v2, dw2, db2 = _bn_backward_from_g(z2, mean2, invstd2, weight2, g, batch_stats)
        return (_store_grad(v1, z1, dz1, accumulate), dw1, db1, _store_grad(v2, z2, dz2, accumulate), dw2, db2)


def _check_bn2_backward_args(op, z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, grad_out,
                             dz1, dz2):
    _check_bn2(op, z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2)
    _check_like(op, "grad_out", grad_out, z1, "z1")
    _check_dz(op, "dz1", dz1, z1, "z1")
    _check_dz(op, "dz2", dz2, z2, "z2")


# ---------------------------------------------------------------------------------------------------------
# raw implementations behind the public functions (no autograd recorded): C/CUDA through yolov9c._C.
# A BN operand crosses as one tuple (z, mean, invstd, weight, bias), its gradients as (dz, dweight, dbias).

_FIELDS = {"": ("z", "mean", "invstd", "weight", "bias"), "1": ("z1", "mean1", "invstd1", "weight1", "bias1"),
           "2": ("z2", "mean2", "invstd2", "weight2", "bias2")}
_GRAD_FIELDS = {"": ("dz", "dweight", "dbias"), "1": ("dz1", "dweight1", "dbias1"), "2": ("dz2", "dweight2", "dbias2")}


def _tensor(op, name, t):
    """The one check made in Python: the dispatch below reads z before C sees anything."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")


def _use_reference(op, *ts):
    """The torch reference serves empty tensors and bfloat16 on the CPU (NumPy has no bfloat16)."""
    z = ts[0]
    _tensor(op, "z", z)
    if z.numel() == 0:
        return True
    return z.is_cpu and any(getattr(t, "dtype", None) == torch.bfloat16 for t in ts)


def _bn(op, z, mean, invstd, weight, bias, suffix=""):
    a, n = extension.arg, _FIELDS[suffix]
    return (a(z, op, n[0]), a(mean, op, n[1]), a(invstd, op, n[2]), a(weight, op, n[3]), a(bias, op, n[4]))


def _grads(op, dz, dw, db, suffix=""):
    a, n = extension.arg, _GRAD_FIELDS[suffix]
    return (a(dz, op, n[0]), a(dw, op, n[1]), a(db, op, n[2]))


def _channels(z):
    return z.shape[1] if z.ndim > 1 else 1


def _vec(z):
    return torch.empty(_channels(z), dtype=torch.float32, device=z.device)


def _workspace(C, z):
    """The CUDA kernels' workspace (None on the CPU, and for a z that C will refuse anyway)."""
    if not z.is_cuda or z.ndim != 4:
        return None
    return torch.empty(C.bn_workspace_size(z.shape, True), dtype=torch.uint8, device=z.device)


def _stats_impl(z, running_mean, running_var, momentum, eps):
    op = "bn_stats_forward"
    if _use_reference(op, z):
        return bn_stats_reference(z, running_mean, running_var, momentum, eps)
    C = extension.load()
    mean, invstd = _vec(z), _vec(z)
    a = extension.arg
    C.bn_stats_forward(a(z, op, "z"), a(running_mean, op, "running_mean"), a(running_var, op, "running_var"),
                       momentum, eps, a(mean), a(invstd), a(_workspace(C, z)), extension.stream_of(z.device))
    return mean, invstd


def _forward_impl(z, mean, invstd, weight, bias, act, out, residual, batch_stats):
    op = "bn_silu_forward"
    if _use_reference(op, z, out, residual):
        with torch.no_grad():
            if residual is None:
                return bn_silu_reference(z, mean, invstd, weight, bias, act, out, batch_stats)
            return bn_silu_add_reference(z, mean, invstd, weight, bias, residual, act, out, batch_stats)
    C = extension.load()
    y = out if out is not None else _empty_like(z)
    C.bn_silu_forward(_bn(op, z, mean, invstd, weight, bias), None, extension.arg(residual, op, "residual"), act,
                      extension.arg(y, op, "out"), extension.stream_of(z.device))
    return y


def _forward2_impl(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, out, batch_stats):
    op = "bn_silu_forward"
    if _use_reference(op, z1, z2, out):
        with torch.no_grad():
            return bn2_silu_reference(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, out,
                                      batch_stats)
    C = extension.load()
    y = out if out is not None else _empty_like(z1)
    bn1, bn2 = _bn(op, z1, mean1, invstd1, weight1, bias1, "1"), _bn(op, z2, mean2, invstd2, weight2, bias2, "2")
    C.bn_silu_forward(bn1, bn2, None, "silu", extension.arg(y, op, "out"), extension.stream_of(z1.device))
    return y


def _backward_impl(z, mean, invstd, weight, bias, grad_out, act, dz, accumulate, batch_stats):
    op = "bn_silu_backward"
    if _use_reference(op, z, grad_out, dz):
        return bn_silu_backward_reference(z, mean, invstd, weight, bias, grad_out, act, dz, accumulate,
                                          batch_stats)
    C = extension.load()
    accumulate = accumulate and dz is not None
    dz = dz if dz is not None else _empty_like(z)
    dw, db = _vec(z), _vec(z)
    C.bn_silu_backward(_bn(op, z, mean, invstd, weight, bias), None, extension.arg(grad_out, op, "grad_out"), act,
                       batch_stats, _grads(op, dz, dw, db), None, accumulate, extension.arg(_workspace(C, z)),
                       extension.stream_of(z.device))
    return dz, dw, db


def _backward2_impl(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, grad_out, dz1, dz2,
                    accumulate, batch_stats):
    op = "bn_silu_backward"
    if _use_reference(op, z1, z2, grad_out, dz1, dz2):
        return bn2_silu_backward_reference(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2,
                                           grad_out, dz1, dz2, accumulate, batch_stats)
    _tensor(op, "z2", z2)
    C = extension.load()
    # A freshly allocated dz is written, never accumulated into.
    acc1, acc2 = accumulate and dz1 is not None, accumulate and dz2 is not None
    if acc1 != acc2:
        dz1 = dz1 if dz1 is not None else torch.zeros_like(z1, memory_format=_format_of(z1))
        dz2 = dz2 if dz2 is not None else torch.zeros_like(z2, memory_format=_format_of(z2))
        acc1 = acc2 = True
    dz1 = dz1 if dz1 is not None else _empty_like(z1)
    dz2 = dz2 if dz2 is not None else _empty_like(z2)
    dw1, db1, dw2, db2 = _vec(z1), _vec(z1), _vec(z1), _vec(z1)
    bn1, bn2 = _bn(op, z1, mean1, invstd1, weight1, bias1, "1"), _bn(op, z2, mean2, invstd2, weight2, bias2, "2")
    C.bn_silu_backward(bn1, bn2, extension.arg(grad_out, op, "grad_out"), "silu", batch_stats,
                       _grads(op, dz1, dw1, db1, "1"), _grads(op, dz2, dw2, db2, "2"), acc1,
                       extension.arg(_workspace(C, z1)), extension.stream_of(z1.device))
    return dz1, dw1, db1, dz2, dw2, db2


# ---------------------------------------------------------------------------------------------------------
# autograd Functions. `out` comes first so that autograd's in-place-on-a-view handling (CopySlices) treats
# it as the tensor being modified: a buffer written through channel slices then carries every slice's graph.
# The overwritten old contents of `out` get a zero gradient, returned as an expanded zero (no memory): with
# None, CopySlices drops the gradient of the whole buffer (the other slices' graphs too).


def _out_grad(out_given, grad_out):
    return grad_out.new_zeros(()).expand_as(grad_out) if out_given else None


def _save_forward(ctx, out, z, mean, invstd, weight, bias, residual, act, batch_stats):
    """The forward of BNSiLUFunction / BNSiLUAddFunction: compute, save only z, the statistics and γ/β."""
    y = _forward_impl(z, mean, invstd, weight, bias, act, out, residual, batch_stats)
    ctx.save_for_backward(z, mean, invstd, weight, bias)
    ctx.act, ctx.batch_stats = act, batch_stats
    ctx.out_given = out is not None
    if out is not None:
        ctx.mark_dirty(out)
    return y


class BNSiLUFunction(torch.autograd.Function):
    """y = act(BN(z)) with the full training BN backward; saves z, mean, invstd, weight, bias only."""

    @staticmethod
    def forward(ctx, out, z, mean, invstd, weight, bias, act, batch_stats):
        return _save_forward(ctx, out, z, mean, invstd, weight, bias, None, act, batch_stats)

    @staticmethod
    def backward(ctx, grad_out):
        z, mean, invstd, weight, bias = ctx.saved_tensors
        dz, dw, db = _backward_impl(z, mean, invstd, weight, bias, grad_out, ctx.act, None, False, ctx.batch_stats)
        need = ctx.needs_input_grad
        return (_out_grad(ctx.out_given, grad_out), dz if need[1] else None, None, None, dw if need[4] else None,
                db if need[5] else None, None, None)


class BNSiLUAddFunction(torch.autograd.Function):
    """y = residual + act(BN(z)); residual's gradient is dy unchanged."""

    @staticmethod
    def forward(ctx, out, z, mean, invstd, weight, bias, residual, act, batch_stats):
        return _save_forward(ctx, out, z, mean, invstd, weight, bias, residual, act, batch_stats)

    @staticmethod
    def backward(ctx, grad_out):
        z, mean, invstd, weight, bias = ctx.saved_tensors
        need = ctx.needs_input_grad
        dz = dw = db = None
        if need[1] or need[4] or need[5]:
            dz, dw, db = _backward_impl(z, mean, invstd, weight, bias, grad_out, ctx.act, None, False,
                                        ctx.batch_stats)
        return (_out_grad(ctx.out_given, grad_out), dz if need[1] else None, None, None, dw if need[4] else None,
                db if need[5] else None, grad_out if need[6] else None, None, None)


class BN2SiLUFunction(torch.autograd.Function):
    """y = silu(BN1(z1) + BN2(z2)) with the full training BN backward for both branches."""

    @staticmethod
    def forward(ctx, out, z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, batch_stats):
        y = _forward2_impl(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, out,
                           batch_stats)
        ctx.save_for_backward(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2)
        ctx.batch_stats = batch_stats
        ctx.out_given = out is not None
        if out is not None:
            ctx.mark_dirty(out)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2 = ctx.saved_tensors
        dz1, dw1, db1, dz2, dw2, db2 = _backward2_impl(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2,
                                                       weight2, bias2, grad_out, None, None, False,
                                                       ctx.batch_stats)
        need = ctx.needs_input_grad
        return (_out_grad(ctx.out_given, grad_out), dz1 if need[1] else None, None, None, dw1 if need[4] else None,
                db1 if need[5] else None, dz2 if need[6] else None, None, None, dw2 if need[9] else None,
                db2 if need[10] else None, None)


# ---------------------------------------------------------------------------------------------------------
# public API. With the fused path on, arguments go to C unchecked here (csrc/bn_silu.c checks them once).

def bn_stats(z, running_mean=None, running_var=None, momentum=0.03, eps=1e-3):
    """(mean, invstd): float32 (C,) batch statistics of z (B, C, H, W); invstd = 1/sqrt(biased_var + eps).
    running_mean / running_var (float32 (C,), optional) are updated in place as nn.BatchNorm2d does in
    training mode (running_var with the unbiased variance). No autograd. ValueError when B·H·W == 1."""
    if not extension.fused_enabled():
        return bn_stats_reference(z, running_mean, running_var, momentum, eps)
    return _stats_impl(z, running_mean, running_var, momentum, eps)  # no autograd: the raw paths never record


def bn_silu(z, mean, invstd, weight, bias, act="silu", out=None, batch_stats=True):
    """y = act((z - mean)·invstd·weight + bias), (B, C, H, W). Written into `out` when given (any view, any of
    the storage dtypes) and returned, else a new tensor of z's dtype and memory format. Differentiable
    (BNSiLUFunction): z, weight, bias get gradients; mean/invstd none."""
    if not extension.fused_enabled():
        return bn_silu_reference(z, mean, invstd, weight, bias, act, out, batch_stats)
    return BNSiLUFunction.apply(out, z, mean, invstd, weight, bias, act, bool(batch_stats))


def bn_silu_backward(z, mean, invstd, weight, bias, grad_out, act="silu", dz=None, accumulate=False,
                     batch_stats=True):
    """(dz, dweight, dbias) of y = act(BN(z)) for grad_out = dL/dy. dz: written (=) or, with accumulate=True,
    added to (+=) when given (z's dtype or float32, any view); else a new tensor like z. dweight, dbias:
    float32 (C,)."""
    if not extension.fused_enabled():
        return bn_silu_backward_reference(z, mean, invstd, weight, bias, grad_out, act, dz, accumulate,
                                          batch_stats)
    # no .detach() needed: the C paths read data pointers / detached NumPy views and the reference runs under
    # no_grad (a detach per argument was ~6 µs of host time per call)
    return _backward_impl(z, mean, invstd, weight, bias, grad_out, act, dz, bool(accumulate), bool(batch_stats))


def bn2_silu(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, out=None, batch_stats=True):
    """y = silu(BN1(z1) + BN2(z2)) (RepConvN in training), (B, C, H, W); out as in bn_silu. Differentiable
    (BN2SiLUFunction)."""
    if not extension.fused_enabled():
        return bn2_silu_reference(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, out,
                                  batch_stats)
    return BN2SiLUFunction.apply(out, z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2,
                                 bool(batch_stats))


def bn2_silu_backward(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, grad_out,
                      dz1=None, dz2=None, accumulate=False, batch_stats=True):
    """(dz1, dw1, db1, dz2, dw2, db2) of bn2_silu; dz1/dz2 as dz in bn_silu_backward."""
    if not extension.fused_enabled():
        return bn2_silu_backward_reference(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2,
                                           bias2, grad_out, dz1, dz2, accumulate, batch_stats)
    return _backward2_impl(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, grad_out, dz1, dz2,
                           bool(accumulate), bool(batch_stats))


def bn_silu_add(z, mean, invstd, weight, bias, residual, act="silu", out=None, batch_stats=True):
    """y = residual + act(BN(z)) (RepNBottleneck's shortcut), (B, C, H, W); residual: z's shape, any storage
    dtype; out as in bn_silu (a new tensor gets z's dtype). Differentiable; residual gets dy unchanged."""
    if not extension.fused_enabled():
        return bn_silu_add_reference(z, mean, invstd, weight, bias, residual, act, out, batch_stats)
    if residual is None:
        raise TypeError("bn_silu_add: residual must be a torch.Tensor, got NoneType")
    return BNSiLUAddFunction.apply(out, z, mean, invstd, weight, bias, residual, act, bool(batch_stats))


def bn_silu_nograd(z, mean, invstd, weight, bias, act="silu", out=None, residual=None):
    """bn_silu (residual None) or bn_silu_add without autograd, for callers that run with grad disabled (the c
    backend's evaluator, which calls it ~1000 times a step): the same dispatch and result, without the
    autograd.Function's per-call cost (context object, saved tensors, dirty marking)."""
    with torch.no_grad():
        if not extension.fused_enabled():
            if residual is None:
                return bn_silu_reference(z, mean, invstd, weight, bias, act, out)
            return bn_silu_add_reference(z, mean, invstd, weight, bias, residual, act, out)
        return _forward_impl(z, mean, invstd, weight, bias, act, out, residual, True)


def bn2_silu_nograd(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, out=None):
    """bn2_silu without autograd (see bn_silu_nograd)."""
    with torch.no_grad():
        if not extension.fused_enabled():
            return bn2_silu_reference(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, out)
        return _forward2_impl(z1, mean1, invstd1, weight1, bias1, z2, mean2, invstd2, weight2, bias2, out, True)
