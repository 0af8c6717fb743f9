"""Fused training-mode BatchNorm + SiLU: statistics, normalise-and-activate, and the full BN backward.

The c backend hands a conv output on as its pre-BN z plus batch statistics and BN parameters: one operand
`BN(z, mean, invstd, weight, bias)` (one argument of csrc/bn_silu.c). Public: BN, stats, forward, backward,
reference. Forms:
    forward(bn) -> act(u);  forward(bn, residual=r) -> r + act(u);  forward(bn, bn2) -> act(u1 + u2) (RepConvN)
    backward(bn, dy[, bn2]) -> (dz, dγ, dβ) [+ (dz2, dγ2, dβ2)]; dz written (=) or added to (+=)
Shapes: z, residual, out, grad_out, dz (B, C, H, W), any strides, float32/float16/bfloat16 storage, float32
arithmetic; mean, invstd, weight, bias (C,) float32, invstd = 1/sqrt(biased_var + eps); act "silu"/"identity".
Maths (x̂ = (z − mean)·invstd, u = x̂·γ + β, g = dy·act'(u), n = B·H·W): dβ = Σg, dγ = Σg·x̂,
dz = γ·invstd·(g − Σg/n − x̂·Σ(g·x̂)/n) (batch_stats=True) or γ·invstd·g (False); mean/invstd get no gradient;
autograd saves only the operands.
Dispatch (every call): YOLOV9C_FUSED=0 -> reference; CPU -> csrc/bn_silu_ref.c (bfloat16 and empty tensors:
reference); CUDA -> kernels/bn_silu_*.cu on the current stream. Checks: csrc/bn_silu.c or the reference's own.
Test: python -m pytest -q tests/ops/test_bn_silu.py
"""

from typing import NamedTuple

import torch

from yolov9c.ops import extension

__all__ = ["BN", "stats", "forward", "backward", "reference"]

_ACTS = ("silu", "identity")
_STORAGE = (torch.float32, torch.float16, torch.bfloat16)


class BN(NamedTuple):
    """One BatchNorm operand: the pre-BN tensor z (B, C, H, W) and its float32 (C,) mean, invstd, weight γ and
    bias β. It crosses to C as this 5-tuple."""
    z: torch.Tensor
    mean: torch.Tensor
    invstd: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor


# ---------------------------------------------------------------------------------------------------------
# argument checks of the torch reference. The fused path checks nothing here: csrc/bn_silu.c checks every
# argument once (errors name the op and the argument); Python only asks what it must read before C does.

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


def _check_bn(op, bn, suffix=""):
    _check_operand(op, bn, suffix)
    zname = "z" + suffix
    _check_z(op, zname, bn[0])
    for name, t in zip(("mean", "invstd", "weight", "bias"), bn[1:]):
        _check_vec(op, name + suffix, t, bn[0], zname)


def _check_operand(op, bn, suffix=""):
    """bn is a BN or a 5-tuple. The hot paths test `type(bn) is not BN` before calling (no call for a BN)."""
    if type(bn) is not BN and (not isinstance(bn, tuple) or len(bn) != 5):
        raise TypeError(f"{op}: bn{suffix} must be a BN (z, mean, invstd, weight, bias), got {type(bn).__name__}")


def _check_operands(op, bn, bn2):
    """bn (and bn2, of z1's shape and device); returns the name of the first z."""
    if bn2 is None:
        _check_bn(op, bn)
        return "z"
    _check_bn(op, bn, "1")
    _check_bn(op, bn2, "2")
    z1, z2 = bn[0], bn2[0]
    if z2.shape != z1.shape:
        raise ValueError(f"{op}: z2 must have the shape of z1 {tuple(z1.shape)}, got {tuple(z2.shape)}")
    if z2.device != z1.device:
        raise ValueError(f"{op}: z2 is on {z2.device} but z1 is on {z1.device}")
    return "z1"


def _check_act(op, act):
    if act not in _ACTS:
        raise ValueError(f"{op}: act must be 'silu' or 'identity', got {act!r}")


def _check_forward(op, bn, bn2, residual, act, out):
    zname = _check_operands(op, bn, bn2)
    if residual is not None:
        _check_like(op, "residual", residual, bn[0], zname)
    _check_act(op, act)
    if out is not None:
        _check_like(op, "out", out, bn[0], zname)


def _check_backward(op, bn, grad_out, bn2, act, dz, dz2):
    zname = _check_operands(op, bn, bn2)
    _check_like(op, "grad_out", grad_out, bn[0], zname)
    _check_act(op, act)
    for name, d, z, zn in (("dz" if bn2 is None else "dz1", dz, bn[0], zname),
                           ("dz2", dz2, None if bn2 is None else bn2[0], "z2")):
        if d is not None and z is not None:
            _check_like(op, name, d, z, zn, dtypes=(z.dtype, torch.float32))


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

def _stats_reference(z, running_mean, running_var, momentum, eps):
    op = "bn_stats"
    _check_stats_args(op, z, running_mean, running_var, momentum, eps)
    var, mean = torch.var_mean(z.detach().float(), dim=(0, 2, 3), unbiased=False)
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


def _bn_reference(bn, batch_stats):
    z, mean, invstd, weight, bias = bn
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


def _forward_name(bn2, residual):
    return "bn2_silu" if bn2 is not None else "bn_silu_add" if residual is not None else "bn_silu"


def reference(bn, bn2=None, residual=None, act="silu", out=None, batch_stats=True):
    """forward() from stock torch ops, differentiable through autograd (with batch_stats, the full training BN
    backward). Returns out (when given) or a new tensor of z's dtype and memory format."""
    _check_forward(_forward_name(bn2, residual), bn, bn2, residual, act, out)
    u = _bn_reference(bn, batch_stats)
    if bn2 is not None:
        u = u + _bn_reference(bn2, batch_stats)
    y = _act(u, act)
    if residual is not None:
        y = residual.float() + y
    return _finish(y, bn[0], out)


def _act_grad(u, gy, act):
    if act == "identity":
        return gy
    s = torch.sigmoid(u)
    return gy * (s * (1.0 + u * (1.0 - s)))


def _u(bn):
    z, mean, invstd, weight, bias = bn
    return (z.float() - _view_c(mean)) * _view_c(invstd * weight) + _view_c(bias)


def _bn_backward_from_g(bn, g, batch_stats):
    """(dz value float32, dγ, dβ) of one BN given g = dL/du (float32)."""
    z, mean, invstd, weight, _ = bn
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


def _backward_reference(bn, grad_out, bn2, act, dz, dz2, accumulate, batch_stats):
    """backward() from torch ops."""
    op = "bn_silu_backward" if bn2 is None else "bn2_silu_backward"
    _check_backward(op, bn, grad_out, bn2, act, dz, dz2)
    with torch.no_grad():
        u = _u(bn) if bn2 is None else _u(bn) + _u(bn2)
        g = _act_grad(u, grad_out.float(), act)
        v1, dw1, db1 = _bn_backward_from_g(bn, g, batch_stats)
        first = (_store_grad(v1, bn[0], dz, accumulate), dw1, db1)
        if bn2 is None:
            return first
        v2, dw2, db2 = _bn_backward_from_g(bn2, g, batch_stats)
        return first + (_store_grad(v2, bn2[0], dz2, accumulate), dw2, db2)


# ---------------------------------------------------------------------------------------------------------
# helpers of the fused paths. The public functions below call yolov9c._C themselves (no autograd recorded; the
# autograd.Function calls them with grad off), handing it the tensors: a BN operand crosses as one tuple (z, mean,
# invstd, weight, bias), its gradients as (dz, dweight, dbias); csrc/bn_silu.c names each field in its errors.

def _use_reference(op, z, *ts):
    """The torch reference serves empty tensors, and bfloat16 on the CPU (csrc/bn_silu.c takes float32 and
    float16 there). z is read here before C sees it, so it is the one tensor checked in Python."""
    try:
        if 0 in z.shape:
            return True
        if not z.is_cpu:
            return False
    except AttributeError:
        raise TypeError(f"{op}: z must be a torch.Tensor, got {type(z).__name__}") from None
    try:
        for t in (z, *ts):
            if t is not None and t.dtype is torch.bfloat16:
                return True
    except AttributeError:  # a non-tensor argument: the C side refuses it, naming it
        pass
    return False


def _vecs(z, n):
    """n float32 (C,) vectors on z's device, rows of one (n, C) allocation (C = 1 for a z that C will refuse)."""
    return torch.empty((n, z.shape[1] if z.ndim > 1 else 1), dtype=torch.float32, device=z.device).unbind(0)


_WORKSPACES = {}  # lean_host: (device, stream handle) -> the workspace its kernels share (they run in stream order)
_RETIRED = []  # outgrown workspaces, kept: a CUDA graph captured with one reads it at every replay


def _workspace(C, z, stream):
    """The CUDA kernels' workspace for z (None on the CPU, or for a z that C will refuse): a new allocation, or
    with extension.lean_host() one buffer per (device, stream) reused by every call and grown as needed."""
    if not z.is_cuda or z.ndim != 4:
        return None
    need = C.bn_workspace_size(z.shape, True)
    if not extension.lean_host():
        return torch.empty(need, dtype=torch.uint8, device=z.device)
    key = (z.device, stream)
    ws = _WORKSPACES.get(key)
    if ws is None or ws.numel() < need:
        if ws is not None:
            _RETIRED.append(ws)
        ws = _WORKSPACES[key] = torch.empty(need, dtype=torch.uint8, device=z.device)
    return ws


# ---------------------------------------------------------------------------------------------------------
# autograd. `out` comes first so that autograd's in-place-on-a-view handling (CopySlices) treats it as the
# tensor being modified: a buffer written through channel slices then carries every slice's graph. The
# overwritten old contents of `out` get a zero gradient, returned as an expanded zero (no memory): with
# None, CopySlices drops the gradient of the whole buffer (the other slices' graphs too).

_GRAD_SLOTS = (0, 3, 4, 5, 8, 9)   # z, weight, bias of each operand among the flattened fields


class _BNSiLUFunction(torch.autograd.Function):
    """forward() with the full training BN backward. Inputs: out, residual, act, batch_stats, then the fields
    of bn (and bn2) flattened, 5 or 10 tensors; saves those fields only. residual's gradient is dy."""

    @staticmethod
    def forward(ctx, out, residual, act, batch_stats, *fields):
        bn2 = BN(*fields[5:]) if len(fields) > 5 else None
        y = forward(BN(*fields[:5]), bn2, residual, act, out, batch_stats)  # (grad is off in here: no recording)
        ctx.save_for_backward(*fields)
        ctx.act, ctx.batch_stats, ctx.out_given = act, batch_stats, out is not None
        if out is not None:
            ctx.mark_dirty(out)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        fields = ctx.saved_tensors
        need = ctx.needs_input_grad[4:]
        grads = [None] * len(fields)
        slots = _GRAD_SLOTS[:3 * (len(fields) // 5)]
        if any(need[k] for k in slots):
            bn2 = BN(*fields[5:]) if len(fields) > 5 else None
            found = backward(BN(*fields[:5]), grad_out, bn2, ctx.act, batch_stats=ctx.batch_stats)
            for k, g in zip(slots, found):
                grads[k] = g if need[k] else None
        out_grad = grad_out.new_zeros(()).expand_as(grad_out) if ctx.out_given else None
        return (out_grad, grad_out if ctx.needs_input_grad[1] else None, None, None, *grads)


# ---------------------------------------------------------------------------------------------------------
# public API

def stats(z, running_mean=None, running_var=None, momentum=0.03, eps=1e-3, out=None):
    """(mean, invstd): float32 (C,) batch statistics of z (B, C, H, W); invstd = 1/sqrt(biased_var + eps) (on
    the fused path, the rows of one (2, C) tensor, or written into out = (mean, invstd) when given).
    running_mean / running_var (float32 (C,), optional) are updated in place as nn.BatchNorm2d does in training
    mode (running_var with the unbiased variance). No autograd. ValueError when B·H·W == 1."""
    op = "bn_stats_forward"
    got = None if _use_reference(op, z) else extension.enter(op, z)
    if got is None:
        return _stats_reference(z, running_mean, running_var, momentum, eps)
    C, stream = got
    mean, invstd = out if out is not None else _vecs(z, 2)
    C.bn_stats_forward(z, running_mean, running_var, momentum, eps, mean, invstd, _workspace(C, z, stream), stream)
    return mean, invstd


def forward(bn, bn2=None, residual=None, act="silu", out=None, batch_stats=True):
    """y = act(u) [+ residual], u = BN(bn) [+ BN(bn2)] (the forms in the module docstring). Written into `out`
    when given (any view, any storage dtype) and returned, else a new tensor of z's dtype and memory format.
    Differentiable when autograd records (z, weight, bias, residual get gradients; mean/invstd none); without
    it, no autograd.Function is built and the implementation is called right here (the c backend's evaluator
    calls this ~1000 times a step)."""
    op = "bn_silu_forward"
    if type(bn) is not BN:
        _check_operand(op, bn)
    if torch.is_grad_enabled():
        if not extension.fused_enabled():
            return reference(bn, bn2, residual, act, out, batch_stats)
        fields = tuple(bn) if bn2 is None else (*bn, *bn2)
        if _records(fields, residual, out):
            return _BNSiLUFunction.apply(out, residual, act, bool(batch_stats), *fields)
    z, z2 = bn[0], None if bn2 is None else _z2(op, bn2)
    got = None if _use_reference(op, z, z2, out, residual) else extension.enter(op, z, z2)
    if got is None:
        with torch.no_grad():
            return reference(bn, bn2, residual, act, out, batch_stats)
    C, stream = got
    y = out if out is not None else _empty_like(z)
    C.bn_silu_forward(bn, bn2, residual, act, y, stream)
    return y


def _z2(op, bn2):
    """bn2's z, bn2 (not None) checked as forward's and backward's second operand."""
    if type(bn2) is not BN:
        _check_operand(op, bn2, "2")
    return bn2[0]


def _records(fields, residual, out):
    """Whether autograd has a gradient to record: a tensor among the arguments requires one."""
    for t in (*fields, residual, out):
        if t is not None:
            try:
                if t.requires_grad:
                    return True
            except AttributeError:  # not a tensor: forward's C call refuses it, naming it
                pass
    return False


def backward(bn, grad_out, bn2=None, act="silu", dz=None, dz2=None, accumulate=False, batch_stats=True):
    """(dz, dweight, dbias) of forward(bn) for grad_out = dL/dy, or (dz1, dw1, db1, dz2, dw2, db2) with bn2.
    dz (dz2): written (=) or, with accumulate=True, added to (+=) when given (z's dtype or float32, any view);
    else a new tensor like z. dweight, dbias: float32 (C,) (fused path: rows of one new tensor, disjoint).
    No autograd."""
    op = "bn_silu_backward"
    if type(bn) is not BN:
        _check_operand(op, bn)
    z, z2 = bn[0], None if bn2 is None else _z2(op, bn2)
    got = None if _use_reference(op, z, z2, grad_out, dz, dz2) else extension.enter(op, z, z2)
    if got is None:
        return _backward_reference(bn, grad_out, bn2, act, dz, dz2, accumulate, batch_stats)
    C, stream = got
    accumulate, batch_stats = bool(accumulate), bool(batch_stats)
    if bn2 is None:
        accumulate = accumulate and dz is not None
        dz = dz if dz is not None else _empty_like(z)
        dw, db = _vecs(z, 2)
        C.bn_silu_backward(bn, None, grad_out, act, batch_stats, (dz, dw, db), None, accumulate,
                           _workspace(C, z, stream), stream)
        return dz, dw, db
    if not isinstance(z2, torch.Tensor):
        raise TypeError(f"{op}: z2 must be a torch.Tensor, got {type(z2).__name__}")
    # A freshly allocated dz is written, never accumulated into.
    acc1, acc2 = accumulate and dz is not None, accumulate and dz2 is not None
    if acc1 != acc2:
        dz = dz if dz is not None else torch.zeros_like(z, memory_format=_format_of(z))
        dz2 = dz2 if dz2 is not None else torch.zeros_like(z2, memory_format=_format_of(z2))
        acc1 = True
    dz = dz if dz is not None else _empty_like(z)
    dz2 = dz2 if dz2 is not None else _empty_like(z2)
    dw1, db1, dw2, db2 = _vecs(z, 4)
    C.bn_silu_backward(bn, bn2, grad_out, act, batch_stats, (dz, dw1, db1), (dz2, dw2, db2), acc1,
                       _workspace(C, z, stream), stream)
    return dz, dw1, db1, dz2, dw2, db2
