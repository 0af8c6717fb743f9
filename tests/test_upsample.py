"""Tests of the nearest 2× upsampling (yolov9c/ops/pool.py upsample_nearest2x, csrc/pool*.c, kernels/pool.cu)
and of its use by the c backend (the heads' nn.Upsample(None, 2, 'nearest'), CBFuse's resize where it is
exactly 2×).

Ground truth: F.interpolate(x, scale_factor=2, mode='nearest') and torch's autograd backward of it
(aten.upsample_nearest2d_backward), in the op's dtype.
Tolerances:
  * forward: equal to torch's bit for bit in every dtype (a copy).
  * backward: equal to torch's CPU gradient bit for bit in float32, float16 and bfloat16 (torch sums each 2×2
    block in float32, row-major, and rounds once, as the op does); against the float64 truth within 1 ulp of
    the dtype in 16 bits (one rounding of a float32 sum of four 16-bit values, exact in float32 unless their
    exponents span more than 13 binades) and 2e-7·max|g| in float32 (three rounded adds).
  * CUDA equals the C CPU implementation bit for bit (and so torch's CPU result).
  * c backend: a whole yolov9-t / yolov9-c training step gives the parameter gradients bit for bit those of
    the path before the op (torch's upsampling, aten.upsample_nearest2d_backward for the gradient).
CPU cases always run; CUDA cases are marked `cuda` and skip without a GPU.
Run: python -m pytest -q tests/test_upsample.py   (GPU: python -m pytest -q -m cuda tests/test_upsample.py)
"""

import functools

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from pool_common import CUDA_CASES as POOL_CUDA_CASES, LAYOUTS, OpCalls, assert_slice_read_in_place, make_x, ulps
from seeded_models import seeded_model, shared_seeded_model
from yolov9c.api import make_loss
from yolov9c.backends import apply
from yolov9c.backends.c import layers
from yolov9c.backends.c.lazy import Plain, Spatial, materialise_any
from yolov9c.models.common import CBFuse
from yolov9c.ops import extension, pool

C_EXT = extension.load()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SHAPES = [(2, 16, 8, 8), (1, 13, 7, 9), (3, 8, 1, 1), (2, 24, 5, 12), (1, 3, 1, 6)]
TARGETS = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 2, 0.3, 0.6, 0.2, 0.25]])


def torch_up(x):
    return F.interpolate(x, scale_factor=2.0, mode="nearest")


def torch_backward(x, g):
    """torch's autograd input gradient of the upsampling at x for output gradient g (x's dtype and device)."""
    xr = x.detach().clone().requires_grad_()
    (gi,) = torch.autograd.grad(torch_up(xr), xr, g)
    return gi


def expected_format(x):
    return torch.channels_last if x.stride(1) == 1 and x.shape[1] > 1 else torch.contiguous_format


def check_op(x, seed=1):
    """Forward, raw backward and autograd backward of the op on x against torch (the module docstring)."""
    dtype = x.dtype
    y = pool.upsample_nearest2x(x)
    B, C, H, W = x.shape
    assert y.shape == (B, C, 2 * H, 2 * W) and y.dtype == dtype and y.device == x.device
    assert y.is_contiguous(memory_format=expected_format(x))
    assert torch.equal(y, torch_up(x)), "forward differs from torch's"

    g = (torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)) * 2).to(dtype).to(x.device)
    g = in_layout_like(g, x)
    gi = pool.upsample_nearest2x_backward(g)
    assert gi.shape == x.shape and gi.dtype == dtype
    assert gi.is_contiguous(memory_format=expected_format(g))
    want = torch_backward(x.cpu(), g.cpu())
    assert torch.equal(gi.cpu(), want), f"backward: {ulps(gi, want, dtype):.1f} ulps from torch's CPU result"
    truth = torch_backward(x.cpu().double(), g.cpu().double())
    if dtype == torch.float32:
        diff, allowed = (gi.cpu().double() - truth).abs().max().item(), 2e-7 * g.abs().max().item()
        assert diff <= allowed, f"backward vs float64: {diff:.3g} is {100 * diff / allowed:.0f}% of the allowed"
    else:
        u = ulps(gi, truth.to(dtype), dtype)
        assert u <= 1, f"backward vs float64: {u:.1f} ulps is {100 * u:.0f}% of the allowed 1"

    xg = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    (ga,) = torch.autograd.grad(pool.upsample_nearest2x(xg), xg, g)
    assert torch.equal(ga, gi), "autograd backward differs from upsample_nearest2x_backward"
    return y, gi, g


def in_layout_like(g, x):
    """g in x's memory format (channels-last when x's channel stride is 1)."""
    return g.contiguous(memory_format=expected_format(x))


# ------------------------------------------------------------------------------------------------ CPU


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_cpu_matches_torch(shape, layout, dtype):
    check_op(make_x(shape, layout, dtype))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_strided_grad(layout):
    """grad_out itself in every layout (a channel slice of a channels-last buffer included), float16."""
    g = make_x((2, 11, 6, 10), layout, torch.float16, seed=3)
    want = torch.ops.aten.upsample_nearest2d_backward(g, [6, 10], [2, 11, 3, 5], 2.0, 2.0)
    assert torch.equal(pool.upsample_nearest2x_backward(g), want)


def test_block_sum_order_is_torchs():
    """Blocks whose float32 sum depends on the order of the adds: torch adds each 2×2 block row by row (upper
    row left to right, then the lower row), and so does the op."""
    g = torch.tensor([[[2.0 ** 24, 1.0], [1.0, 0.0]], [[2.0 ** 24, 1.0], [-2.0 ** 24, 1.0]]]).view(1, 2, 2, 2)
    gi = pool.upsample_nearest2x_backward(g)
    assert torch.equal(gi, torch.ops.aten.upsample_nearest2d_backward(g, [2, 2], [1, 2, 1, 1], 2.0, 2.0))
    # channel 0: ((2^24 + 1) + 1) + 0 = 2^24 (each +1 rounds away), not 2^24 + (1 + 1) = 2^24 + 2;
    # channel 1: ((2^24 + 1) - 2^24) + 1 = 1, not ((2^24 - 2^24) + 1) + 1 = 2 (column by column)
    assert gi[0, 0, 0, 0].item() == 2.0 ** 24 and gi[0, 1, 0, 0].item() == 1.0


def test_forward_copies_bits():
    """NaN, infinities and -0.0 come through as torch's do (a copy, no arithmetic)."""
    x = torch.tensor([float("nan"), float("inf"), -0.0, -float("inf"), 1e-40, 3.0]).view(1, 6, 1, 1).half()
    y = pool.upsample_nearest2x(x)
    assert torch.equal(y.view(torch.int16), torch_up(x).view(torch.int16))


def test_channel_slice_is_read_in_place(monkeypatch):
    """A channel slice of a channels-last buffer reaches C as a view of the buffer (no copy)."""
    assert_slice_read_in_place(monkeypatch, pool.upsample_nearest2x)


def test_empty_and_meta():
    assert pool.upsample_nearest2x(torch.randn(0, 4, 5, 5)).shape == (0, 4, 10, 10)
    assert pool.upsample_nearest2x(torch.randn(2, 4, 0, 3)).shape == (2, 4, 0, 6)
    assert pool.upsample_nearest2x_backward(torch.randn(0, 4, 4, 6)).shape == (0, 4, 2, 3)
    m = pool.upsample_nearest2x(torch.empty(2, 3, 6, 5, device="meta"))  # the c backend's shape probe
    assert m.shape == (2, 3, 12, 10) and m.device.type == "meta"


def test_fused_zero_uses_reference(monkeypatch):
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    calls = []
    monkeypatch.setattr(C_EXT, "upsample_nearest2x_forward", lambda *a: calls.append(a))
    monkeypatch.setattr(C_EXT, "upsample_nearest2x_backward", lambda *a: calls.append(a))
    x = make_x((2, 8, 5, 5), "cl", torch.float32)
    assert torch.equal(pool.upsample_nearest2x(x), torch_up(x))
    g = torch.randn(2, 8, 10, 10)
    assert torch.equal(pool.upsample_nearest2x_backward(g), torch_backward(x, g)) and not calls


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="upsample_nearest2x_forward: x must have 4 dimensions"):
        pool.upsample_nearest2x(torch.randn(3, 5, 5))
    with pytest.raises(TypeError, match="upsample_nearest2x_forward: x must be float32, float16, got int64"):
        pool.upsample_nearest2x(torch.ones(1, 2, 3, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="upsample_nearest2x_forward: expected a torch.Tensor, got list"):
        pool.upsample_nearest2x([[1.0]])
    with pytest.raises(ValueError, match=r"upsample_nearest2x_backward: grad_out must have shape \(1, 2, 4, 6\) "
                                         r"\(grad_in's shape with H and W doubled\), got \(1, 2, 5, 6\)"):
        pool.upsample_nearest2x_backward(torch.randn(1, 2, 5, 6))


def test_raw_binding_checks():
    x = np.zeros((2, 3, 4, 5), np.float32)
    f, b = C_EXT.upsample_nearest2x_forward, C_EXT.upsample_nearest2x_backward
    assert f.__text_signature__ == "($module, x, out, stream, /)"
    assert b.__text_signature__ == "($module, grad_out, grad_in, stream, /)"
    with pytest.raises(ValueError, match=r"upsample_nearest2x_forward: out must have shape \(2, 3, 8, 10\)"):
        f(x, np.zeros((2, 3, 8, 9), np.float32), 0)
    with pytest.raises(TypeError, match="upsample_nearest2x_forward: out must have the dtype of x"):
        f(x, np.zeros((2, 3, 8, 10), np.float16), 0)
    big = np.zeros((2, 3, 8, 10), np.float32)
    with pytest.raises(ValueError, match="upsample_nearest2x_forward: out overlaps x"):
        f(big[:, :, :4, :5], big, 0)
    with pytest.raises(ValueError, match="out is an output and has stride 0"):
        f(x, np.lib.stride_tricks.as_strided(np.zeros((3, 8, 10), np.float32), (2, 3, 8, 10), (0, 320, 40, 4)), 0)
    with pytest.raises(ValueError, match="upsample_nearest2x_forward: stream must be 0 for CPU tensors"):
        f(x, np.zeros((2, 3, 8, 10), np.float32), 5)
    with pytest.raises(ValueError, match=r"upsample_nearest2x_backward: grad_out must have shape \(2, 3, 8, 10\)"):
        b(np.zeros((2, 3, 8, 8), np.float32), x, 0)
    with pytest.raises(ValueError, match="upsample_nearest2x_backward: grad_in is an output and must be writeable"):
        ro = np.zeros((2, 3, 4, 5), np.float32)
        ro.flags.writeable = False
        b(big, ro, 0)


# ------------------------------------------------------------------------------------------------ c backend


def test_spatial_uses_the_op_only_for_nearest_2x():
    child = Plain(torch.randn(1, 4, 3, 5))
    for m in (nn.Upsample(None, 2, "nearest"), nn.Upsample(scale_factor=2.0), nn.Upsample(scale_factor=(2, 2))):
        node = layers.spatial(m, child)
        assert node.fn is pool.upsample_nearest2x and node.grad is pool.upsample_nearest2x_backward, m
    for m in (nn.Upsample(scale_factor=3.0), nn.Upsample(scale_factor=2.0, mode="bilinear"),
              nn.Upsample(size=(6, 10)), nn.Upsample(scale_factor=(2, 3)),
              nn.Upsample(scale_factor=2.0, recompute_scale_factor=True)):
        assert layers.spatial(m, child).fn is not pool.upsample_nearest2x, m


def test_cbfuse_uses_the_op_only_for_2x():
    """CBFuse onto a 8×8 map: the 4×4 input (2×) through the op, the 2×2 one (4×) and the 8×8 one (1×) on
    torch's F.interpolate; the sum equals the torch module's."""
    fuse = CBFuse([0, 0, 0])
    xs = [[torch.randn(1, 3, 4, 4)], [torch.randn(1, 3, 2, 2)], [torch.randn(1, 3, 8, 8)], torch.randn(1, 3, 8, 8)]
    node = layers.cbfuse(fuse, xs)
    fns = [t.fn for t in node.children[:-1]]
    assert fns[0] is pool.upsample_nearest2x and all(f is not pool.upsample_nearest2x for f in fns[1:])
    assert torch.equal(materialise_any(node), fuse(xs))


def _torch_up2(child):
    """The path before the op: torch's nearest upsampling, the gradient from aten.upsample_nearest2d_backward."""
    return Spatial(functools.partial(F.interpolate, scale_factor=2.0, mode="nearest"), child,
                   grad=layers._nearest_backward(child, (2.0, 2.0)))


def _op_rerun(child):
    """The op without Spatial's direct gradient: Spatial.backward re-runs its forward under autograd."""
    return Spatial(pool.upsample_nearest2x, child)


def _step(name, monkeypatch, up2, channels_last, counts=None):
    """One c-backend training step with layers._up2 replaced by up2 (None: the op as wired): the parameter
    gradients."""
    if up2 is not None:
        monkeypatch.setattr(layers, "_up2", up2)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = apply(seeded_model(name).to(memory_format=fmt).train(), "c")
    x = torch.rand(2, 3, 64, 64).contiguous(memory_format=fmt)
    loss, _ = make_loss(model)(model(x), TARGETS)
    if counts is not None:
        counts.phase = "backward"
    loss.backward()
    monkeypatch.undo()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name, channels_last", [("yolov9-t", False), ("yolov9-t", True), ("yolov9-c", True)])
def test_model_gradients_equal_path_before(name, channels_last, monkeypatch):
    """A whole c training step: every parameter gradient bit for bit as before the op (float32: the same copy
    forward and the same block sums in the same order)."""
    with_op = _step(name, monkeypatch, None, channels_last)
    before = _step(name, monkeypatch, _torch_up2, channels_last)
    assert with_op.keys() == before.keys() and len(with_op) > 0
    for n in with_op:
        assert torch.equal(with_op[n], before[n]), n


def test_model_forward_not_rerun_in_backward(monkeypatch):
    """yolov9-t's neck upsamplings: each runs once in forward (its consumer conv materialises it); in backward
    the op's forward runs only for the lazy convs' recomputes — one call per upsampling fewer than when
    Spatial re-runs it under autograd for the gradient — and each upsampling has one backward."""
    n_up = sum(type(m) is nn.Upsample for m in shared_seeded_model("yolov9-t").modules())
    rerun = OpCalls(monkeypatch, pool, "_up_forward_impl", "_up_backward_impl")
    _step("yolov9-t", monkeypatch, _op_rerun, True, rerun)
    counts = OpCalls(monkeypatch, pool, "_up_forward_impl", "_up_backward_impl")
    _step("yolov9-t", monkeypatch, None, True, counts)
    assert n_up > 0 and counts.fwd["forward"] == rerun.fwd["forward"] == n_up and counts.bwd["forward"] == 0
    assert counts.fwd["backward"] == rerun.fwd["backward"] - n_up, (counts.fwd, rerun.fwd)
    assert counts.bwd["backward"] == rerun.bwd["backward"] == n_up, (counts.bwd, rerun.bwd)  # autograd: the same


# ------------------------------------------------------------------------------------------------ CUDA


CUDA_CASES = POOL_CUDA_CASES + [
    ((2, 33000, 1, 2), "nchw"),       # (b, c) > 65535: grid-stride in z
    ((66000, 8, 1, 1), "cl"),         # b > 65535: grid-stride in z
    ((1, 8, 65600, 1), "cl"),         # H > 65535: grid-stride in y
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, layout", CUDA_CASES)
def test_cuda_matches_torch_and_cpu(shape, layout, dtype):
    x = make_x(shape, layout, dtype, device="cuda")
    y, gi, g = check_op(x)
    xc = make_x(shape, layout, dtype)
    assert torch.equal(y.cpu(), pool.upsample_nearest2x(xc)), "CUDA forward differs from the C CPU one"
    gc = g.cpu().contiguous(memory_format=expected_format(g))
    assert torch.equal(gi.cpu(), pool.upsample_nearest2x_backward(gc)), "CUDA backward differs from the C CPU one"


@pytest.mark.cuda
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cuda_backward_strided_grad(layout):
    g = make_x((2, 16, 6, 10), layout, torch.bfloat16, device="cuda", seed=3)
    assert torch.equal(pool.upsample_nearest2x_backward(g).cpu(), pool.upsample_nearest2x_backward(g.cpu()))


@pytest.mark.cuda
def test_cuda_aligned_slice_vectorised():
    """Channels 8..40 of a 48-channel channels-last buffer: 16-byte aligned, pixel stride 48 > C."""
    base = torch.randn(2, 48, 12, 12, device="cuda").half().contiguous(memory_format=torch.channels_last)
    check_op(base[:, 8:40])


@pytest.mark.cuda
def test_cuda_side_stream():
    x = make_x((2, 32, 20, 20), "cl", torch.float16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = pool.upsample_nearest2x(x)
        gi = pool.upsample_nearest2x_backward(y)
    s.synchronize()
    assert torch.equal(y, pool.upsample_nearest2x(x))
    assert torch.equal(gi, pool.upsample_nearest2x_backward(y))
