"""The pools and upsampling of ADown/AConv/SPPELAN/CBFuse: avg_pool2x2 = F.avg_pool2d(x, 2, 1, 0, False, True),
max_pool2d = F.max_pool2d(x, k, s, p) (dilation 1, floor mode), upsample_nearest2x = nn.Upsample(2, 'nearest').

Shapes: x (B, C, H, W), any strides (channels-last slices read in place), float32/float16/bfloat16; outputs
take x's dtype and memory format. avg: out (B, C, H-1, W-1); max: (B, C, (H+2p-k)//s+1, (W+2p-k)//s+1);
upsample: (B, C, 2H, 2W), out[y, x] = x[y//2, x//2].
Invariants: sums in float32 in torch's order, rounded once, so avg forward and upsample backward equal torch's
CPU bits; max forward is exact and its backward follows torch's argmax rule (first maximum row-major, a NaN
window its last NaN). Saved for backward: nothing for avg and upsample; x only for max (autograd keeps it
anyway) — the backward recomputes the argmaxes into a transient uint8 scratch (k*k <= 255), no index tensor.
Maths: kernels/pool.cu, csrc/pool_ref.c; argument checks in csrc/pool.c.
Dispatch (read at every call): YOLOV9C_FUSED=0 or a non-CPU/CUDA device (meta shape probe) -> *_reference;
CPU -> csrc/pool_ref.c (bfloat16 via float32, same bits); CUDA -> kernels/pool.cu on the current stream.
Test: python -m pytest -q tests/ops/test_pool.py; speed: python benchmarks/bench_pool.py
"""

import torch
import torch.nn.functional as F

from yolov9c.ops import extension

__all__ = ["avg_pool2x2", "avg_pool2x2_backward", "avg_pool2x2_reference", "avg_pool2x2_backward_reference",
           "upsample_nearest2x", "upsample_nearest2x_backward", "upsample_nearest2x_reference",
           "upsample_nearest2x_backward_reference", "max_pool2d", "max_pool2d_backward", "max_pool2d_reference",
           "max_pool2d_backward_reference"]


def avg_pool2x2_reference(x):
    """F.avg_pool2d(x, 2, 1, 0, False, True) (differentiable through autograd)."""
    return F.avg_pool2d(x, 2, 1, 0, False, True)


def avg_pool2x2_backward_reference(grad_out):
    """torch's own avg_pool2d backward for grad_out (B, C, H-1, W-1): the input gradient (B, C, H, W)."""
    B, C, h, w = grad_out.shape
    like = torch.empty((B, C, h + 1, w + 1), dtype=grad_out.dtype, device=grad_out.device,
                       memory_format=_format_of(grad_out))
    return torch.ops.aten.avg_pool2d_backward(grad_out, like, [2, 2], [1, 1], [0, 0], False, True, None)


def _format_of(t):
    """t's memory format for new tensors: channels-last when its channel stride is 1 (a channel slice of a
    channels-last buffer too), else NCHW contiguous."""
    if t.ndim == 4 and t.stride(1) == 1 and t.shape[1] > 1:
        return torch.channels_last
    return torch.contiguous_format


def _use_reference(op, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: expected a torch.Tensor, got {type(t).__name__}")
    return not (extension.fused_enabled() and (t.is_cuda or t.is_cpu))


def _recorded(function, impl, *args):
    """function.apply(*args) while autograd records; impl(*args), the same forward, without it (the c backend's
    evaluator: no per-call autograd bookkeeping)."""
    return function.apply(*args) if torch.is_grad_enabled() else impl(*args)


def _run(op, name, src, dst_shape, out_name):
    """dst = op(src) through yolov9c._C: a new tensor of dst_shape in src's dtype and memory format."""
    C = extension.load()
    fn = getattr(C, op)
    wide = src.is_cpu and src.dtype == torch.bfloat16  # csrc/pool.c takes no CPU bfloat16: float32, same bits
    s = src.float() if wide else src
    fmt = _format_of(src) if len(dst_shape) == 4 else torch.contiguous_format
    dst = torch.empty(dst_shape, dtype=s.dtype, device=src.device, memory_format=fmt)
    fn(s, dst, extension.stream_of(src.device))
    return dst.to(torch.bfloat16) if wide else dst


def _shape(t, dh):
    """t's shape with H and W changed by dh (4-D), or unchanged (let C name the bad dimensions)."""
    s = tuple(t.shape)
    return (s[0], s[1], s[2] + dh, s[3] + dh) if len(s) == 4 else s


def _forward_impl(x):
    op = "avg_pool2x2_forward"
    extension.note_call(op, x)
    if _use_reference(op, x):
        with torch.no_grad():
            return avg_pool2x2_reference(x)
    return _run(op, "x", x, _shape(x, -1), "out")


def _backward_impl(grad_out):
    op = "avg_pool2x2_backward"
    extension.note_call(op, grad_out)
    if _use_reference(op, grad_out):
        with torch.no_grad():
            return avg_pool2x2_backward_reference(grad_out)
    return _run(op, "grad_out", grad_out, _shape(grad_out, 1), "grad_in")


class _AvgPool2x2Function(torch.autograd.Function):
    """out = avg_pool2x2(x); backward from grad_out alone (nothing saved)."""

    @staticmethod
    def forward(ctx, x):
        return _forward_impl(x)

    @staticmethod
    def backward(ctx, grad_out):
        return _backward_impl(grad_out)


def avg_pool2x2(x):
    """F.avg_pool2d(x, 2, 1, 0, False, True) for x (B, C, H, W): a new (B, C, H-1, W-1) tensor of x's dtype and
    memory format. Differentiable (_AvgPool2x2Function)."""
    if not extension.fused_enabled():
        return avg_pool2x2_reference(x)
    return _recorded(_AvgPool2x2Function, _forward_impl, x)


def avg_pool2x2_backward(grad_out):
    """The input gradient (B, C, H, W) of avg_pool2x2 for grad_out (B, C, H-1, W-1), computed from grad_out
    alone (no autograd recorded): a new tensor of grad_out's dtype and memory format."""
    return _backward_impl(grad_out)


def upsample_nearest2x_reference(x):
    """F.interpolate(x, scale_factor=2, mode='nearest') (nn.Upsample(None, 2, 'nearest'); differentiable)."""
    return F.interpolate(x, scale_factor=2.0, mode="nearest")


def upsample_nearest2x_backward_reference(grad_out):
    """torch's own nearest-upsampling backward for grad_out (B, C, 2H, 2W): the input gradient (B, C, H, W)."""
    B, C, h, w = grad_out.shape
    return torch.ops.aten.upsample_nearest2d_backward(grad_out, [h, w], [B, C, h // 2, w // 2], 2.0, 2.0)


def _up_shape(t, backward):
    """The upsampling's other shape: H and W doubled (forward) or halved (backward: an odd H or W is refused in
    C, with the shape it needs), or t's own when not 4-D (C names the bad dimensions)."""
    s = tuple(t.shape)
    if len(s) != 4:
        return s
    return (s[0], s[1], s[2] // 2, s[3] // 2) if backward else (s[0], s[1], 2 * s[2], 2 * s[3])


def _up_forward_impl(x):
    op = "upsample_nearest2x_forward"
    extension.note_call(op, x)
    if _use_reference(op, x):
        with torch.no_grad():
            return upsample_nearest2x_reference(x)
    return _run(op, "x", x, _up_shape(x, False), "out")


def _up_backward_impl(grad_out):
    op = "upsample_nearest2x_backward"
    extension.note_call(op, grad_out)
    if _use_reference(op, grad_out):
        with torch.no_grad():
            return upsample_nearest2x_backward_reference(grad_out)
    return _run(op, "grad_out", grad_out, _up_shape(grad_out, True), "grad_in")


class _UpsampleNearest2xFunction(torch.autograd.Function):
    """out = upsample_nearest2x(x); backward from grad_out alone (nothing saved)."""

    @staticmethod
    def forward(ctx, x):
        return _up_forward_impl(x)

    @staticmethod
    def backward(ctx, grad_out):
        return _up_backward_impl(grad_out)


def upsample_nearest2x(x):
    """nn.Upsample(scale_factor=2, mode='nearest') for x (B, C, H, W): a new (B, C, 2H, 2W) tensor of x's dtype
    and memory format. Differentiable (_UpsampleNearest2xFunction)."""
    if not extension.fused_enabled():
        return upsample_nearest2x_reference(x)
    return _recorded(_UpsampleNearest2xFunction, _up_forward_impl, x)


def upsample_nearest2x_backward(grad_out):
    """The input gradient (B, C, H, W) of upsample_nearest2x for grad_out (B, C, 2H, 2W), from grad_out alone
    (no autograd recorded): a new tensor of grad_out's dtype and memory format."""
    return _up_backward_impl(grad_out)


def max_pool2d_reference(x, k, s, p):
    """F.max_pool2d(x, k, s, p) (differentiable through autograd)."""
    return F.max_pool2d(x, k, s, p)


def max_pool2d_backward_reference(x, grad_out, k, s, p):
    """torch's autograd input gradient of F.max_pool2d(x, k, s, p) for grad_out."""
    with torch.enable_grad():
        xr = x.detach().requires_grad_()
        (gi,) = torch.autograd.grad(F.max_pool2d(xr, k, s, p), xr, grad_out)
    return gi


def _max_shape(t, k, s, p):
    """The output shape of max_pool2d(t, k, s, p); any shape when the arguments are bad (C names them)."""
    sh = tuple(t.shape)
    if len(sh) != 4 or not all(type(v) is int for v in (k, s, p)) or s < 1:
        return sh
    return (sh[0], sh[1], max((sh[2] + 2 * p - k) // s + 1, 0), max((sh[3] + 2 * p - k) // s + 1, 0))


def _max_forward_impl(x, k, s, p):
    op = "max_pool2d_forward"
    extension.note_call(op, x)
    if _use_reference(op, x):
        with torch.no_grad():
            return max_pool2d_reference(x, k, s, p)
    C = extension.load()
    wide = x.is_cpu and x.dtype == torch.bfloat16  # csrc/pool.c takes no CPU bfloat16: float32, same values
    xs = x.float() if wide else x
    out = torch.empty(_max_shape(x, k, s, p), dtype=xs.dtype, device=x.device, memory_format=_format_of(x))
    C.max_pool2d_forward(xs, out, k, s, p, extension.stream_of(x.device))
    return out.to(torch.bfloat16) if wide else out


def _max_backward_impl(x, grad_out, k, s, p):
    op = "max_pool2d_backward"
    extension.note_call(op, grad_out)
    if _use_reference(op, x) or _use_reference(op, grad_out):
        return max_pool2d_backward_reference(x, grad_out, k, s, p)
    C = extension.load()
    wide = x.is_cpu and x.dtype == torch.bfloat16
    xs, gs = (x.float(), grad_out.float()) if wide else (x, grad_out)
    fmt = _format_of(grad_out) if x.ndim == 4 else torch.contiguous_format
    gi = torch.empty(x.shape, dtype=xs.dtype, device=x.device, memory_format=fmt)
    # the window argmaxes, one byte per output element: scratch of the two-phase backward (kernels/pool.cu)
    index = torch.empty(_max_shape(x, k, s, p), dtype=torch.uint8, device=x.device, memory_format=fmt)
    C.max_pool2d_backward(xs, gs, index, gi, k, s, p, extension.stream_of(x.device))
    return gi.to(torch.bfloat16) if wide else gi


class _MaxPool2dFunction(torch.autograd.Function):
    """out = max_pool2d(x, k, s, p); backward from x and grad_out (x saved, no indices)."""

    @staticmethod
    def forward(ctx, x, k, s, p):
        ctx.save_for_backward(x)
        ctx.geom = (k, s, p)
        return _max_forward_impl(x, k, s, p)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return _max_backward_impl(x, grad_out, *ctx.geom), None, None, None


def max_pool2d(x, k, s, p):
    """F.max_pool2d(x, k, s, p) (dilation 1, floor mode) for x (B, C, H, W): a new tensor of x's dtype and
    memory format. Differentiable (_MaxPool2dFunction)."""
    if not extension.fused_enabled():
        return max_pool2d_reference(x, k, s, p)
    return _recorded(_MaxPool2dFunction, _max_forward_impl, x, k, s, p)


def max_pool2d_backward(x, grad_out, k, s, p):
    """The input gradient (B, C, H, W) of max_pool2d(x, k, s, p) for grad_out, from x and grad_out alone (no
    autograd recorded): a new tensor of grad_out's dtype and memory format."""
    return _max_backward_impl(x, grad_out, k, s, p)
