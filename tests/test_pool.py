"""Tests of the 2×2 stride-1 average pool (yolov9c/ops/pool.py, csrc/pool*.c, kernels/pool.cu) and of its use
by the c backend (ADown, AConv).

Ground truth: F.avg_pool2d(x, 2, 1, 0, False, True) and its autograd backward, in float64 from the same inputs
(and torch's own result in the op's dtype).
Tolerances:
  * float32: the forward and the backward equal torch's CPU float32 results bit for bit (the same float32
    additions in the same order); CUDA equals the C CPU implementation bit for bit in every dtype (and
    torch's CUDA float32 result within 4e-7·max|x|: its order of the adds is not ours to fix).
    Against the float64 truth: |diff| <= 2e-7·max|input| (three rounded adds).
  * float16 / bfloat16: within 1 ulp of the float64 truth rounded to the dtype (one rounding of the float32
    sum), and within 1 ulp of torch's forward. torch's CPU 16-bit backward rounds after every add, so
    against it the backward is held to 2 ulps of the largest value (share of the tolerance printed).
  * c backend blocks (ADown, AConv, channels-last): 1e-5 norm-relative to the torch block, as
    tests/test_backend_c.py (whose block and model tests run ADown/AConv in NCHW through the same op).
CPU cases always run; CUDA cases are marked `cuda` and skip without a GPU.
Run: python -m pytest -q tests/test_pool.py   (GPU: python -m pytest -q -m cuda tests/test_pool.py)
"""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pool_common import (CUDA_CASES as POOL_CUDA_CASES, LAYOUTS, OpCalls, assert_c_block_matches_torch,
                         assert_slice_read_in_place, make_x, ulps)
from seeded_models import seeded_model
from yolov9c.backends.c import layers
from yolov9c.backends.c.lazy import materialise_any
from yolov9c.models.common import ADown, AConv
from yolov9c.ops import extension, pool

C_EXT = extension.load()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SHAPES = [(2, 16, 8, 8), (1, 13, 7, 9), (3, 8, 2, 2), (2, 24, 5, 12)]


def torch_pool(x):
    return F.avg_pool2d(x, 2, 1, 0, False, True)


def torch_backward(x, g):
    """torch's autograd input gradient of avg_pool2d at x for output gradient g (x's dtype and device)."""
    xr = x.detach().clone().requires_grad_()
    (gi,) = torch.autograd.grad(torch_pool(xr), xr, g)
    return gi


def close_ulps(actual, truth, dtype, n, what):
    assert actual.shape == truth.shape and actual.dtype == dtype, f"{what}: {actual.shape} {actual.dtype}"
    u = ulps(actual, truth.to(dtype), dtype)
    assert u <= n, f"{what}: {u:.1f} ulps is {100 * u / n:.0f}% of the allowed {n}"


def close_scaled(actual, truth, dtype, n, what):
    """|actual - truth| <= n ulps of dtype at max|truth| (for torch's own 16-bit backward, rounded per add)."""
    a, t = actual.detach().cpu().double(), truth.detach().cpu().double()
    m = t.abs().max().to(dtype)
    ulp = (torch.nextafter(m, torch.tensor(float("inf"), dtype=dtype)).double() - m.double()).item()
    diff, allowed = (a - t).abs().max().item(), n * ulp
    assert diff <= allowed, f"{what}: max |diff| {diff:.3g} is {100 * diff / allowed:.0f}% of the allowed {allowed:.3g}"


def close_truth(actual, truth, inp, what):
    """16-bit: within 1 ulp of the float64 truth rounded to the dtype (one rounding of the float32 sum).
    float32: three rounded adds of partial sums up to 4·max|input|, so |diff| <= 2e-7·max|input|."""
    if actual.dtype != torch.float32:
        close_ulps(actual, truth, actual.dtype, 1, what)
        return
    diff = (actual.detach().cpu().double() - truth).abs().max().item()
    allowed = 2e-7 * inp.detach().abs().max().item()
    assert diff <= allowed, f"{what}: max |diff| {diff:.3g} is {100 * diff / allowed:.0f}% of the allowed {allowed:.3g}"


def expected_format(x):
    return torch.channels_last if x.stride(1) == 1 and x.shape[1] > 1 else torch.contiguous_format


def check_op(x, seed=1):
    """Forward, raw backward and autograd backward of the op on x against torch (see the module docstring)."""
    dtype = x.dtype
    y = pool.avg_pool2x2(x)
    ref = torch_pool(x)
    truth = torch_pool(x.detach().cpu().double())
    assert y.shape == ref.shape and y.dtype == dtype and y.device == x.device
    assert y.is_contiguous(memory_format=expected_format(x))
    if dtype == torch.float32 and x.is_cpu:
        assert torch.equal(y, ref), f"forward: {(y - ref).abs().max().item():.3g} from torch's float32 result"
    elif dtype == torch.float32:  # torch's CUDA kernel may add in another order: both within 2e-7·max|x|
        diff, allowed = (y - ref).abs().max().item(), 4e-7 * x.abs().max().item()
        assert diff <= allowed, f"forward vs torch: {diff:.3g} is {100 * diff / allowed:.0f}% of the allowed"
    else:
        close_ulps(y, ref, dtype, 1, "forward vs torch")
    close_truth(y, truth, x, "forward vs float64")

    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(x.device)
    gi = pool.avg_pool2x2_backward(g)
    gt = torch_backward(x.detach().cpu().double(), g.cpu().double())
    assert gi.shape == x.shape and gi.dtype == dtype
    assert gi.is_contiguous(memory_format=expected_format(g))
    if dtype == torch.float32 and x.is_cpu:
        assert torch.equal(gi, torch_backward(x, g)), "backward differs from torch's float32 result"
    elif dtype != torch.float32:
        close_scaled(gi, torch_backward(x, g), dtype, 2, "backward vs torch")
    close_truth(gi, gt, g, "backward vs float64")

    xg = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    (ga,) = torch.autograd.grad(pool.avg_pool2x2(xg), xg, g)
    assert torch.equal(ga, gi), "autograd backward differs from avg_pool2x2_backward"
    return y, gi, g


# ------------------------------------------------------------------------------------------------ CPU


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_cpu_matches_torch(shape, layout, dtype):
    check_op(make_x(shape, layout, dtype))


def test_window_sum_order_is_torchs():
    """Windows whose float32 sum depends on the order of the adds: torch adds the window row by row (upper row
    left to right, then the lower row), and so does the op."""
    x = torch.tensor([[[2.0 ** 24, 0.0], [1.0, 1.0]], [[2.0 ** 24, 1.0], [-2.0 ** 24, 1.0]]]).view(1, 2, 2, 2)
    y = pool.avg_pool2x2(x)
    assert torch.equal(y, torch_pool(x))
    # channel 0: ((2^24 + 0) + 1) + 1 = 2^24 (each +1 rounds away), not (2^24 + 0) + (1 + 1) = 2^24 + 2;
    # channel 1: ((2^24 + 1) - 2^24) + 1 = 1, not ((2^24 - 2^24) + 1) + 1 = 2 (column by column)
    assert y[0, 0].item() == 2.0 ** 22 and y[0, 1].item() == 0.25


def test_c_reference_layouts_agree_bit_for_bit():
    x = make_x((2, 16, 9, 7), "nchw", torch.float16)
    outs = [pool.avg_pool2x2(x.contiguous(memory_format=f)) for f in (torch.contiguous_format, torch.channels_last)]
    assert torch.equal(outs[0], outs[1])


def test_channel_slice_is_read_in_place(monkeypatch):
    """A channel slice of a channels-last buffer reaches C as a view of the buffer (no copy)."""
    assert_slice_read_in_place(monkeypatch, pool.avg_pool2x2)


def test_empty_batch_and_meta():
    x = torch.randn(0, 4, 5, 5)
    assert pool.avg_pool2x2(x).shape == (0, 4, 4, 4)
    assert pool.avg_pool2x2_backward(torch.randn(0, 4, 4, 4)).shape == (0, 4, 5, 5)
    m = pool.avg_pool2x2(torch.empty(2, 3, 6, 5, device="meta"))  # the c backend's shape probe
    assert m.shape == (2, 3, 5, 4) and m.device.type == "meta"


def test_fused_zero_uses_reference(monkeypatch):
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    calls = []
    monkeypatch.setattr(C_EXT, "avg_pool2x2_forward", lambda *a: calls.append(a))
    x = make_x((2, 8, 5, 5), "cl", torch.float32)
    assert torch.equal(pool.avg_pool2x2(x), torch_pool(x)) and not calls
    g = torch.randn(2, 8, 4, 4)
    assert torch.equal(pool.avg_pool2x2_backward(g), torch_backward(x, g))


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="avg_pool2x2_forward: x must have H >= 2 and W >= 2"):
        pool.avg_pool2x2(torch.randn(2, 3, 1, 5))
    with pytest.raises(ValueError, match="avg_pool2x2_forward: x must have 4 dimensions"):
        pool.avg_pool2x2(torch.randn(3, 5, 5))
    with pytest.raises(TypeError, match="avg_pool2x2_forward: x must be float32, float16, got int64"):
        pool.avg_pool2x2(torch.ones(1, 2, 3, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="avg_pool2x2_forward: expected a torch.Tensor, got list"):
        pool.avg_pool2x2([[1.0]])
    with pytest.raises(ValueError, match="avg_pool2x2_backward: grad_in must have H >= 2"):
        pool.avg_pool2x2_backward(torch.randn(1, 2, 0, 3))


def test_raw_binding_checks():
    x = np.zeros((2, 3, 5, 6), np.float32)
    f = C_EXT.avg_pool2x2_forward
    with pytest.raises(ValueError, match=r"avg_pool2x2_forward: out must have shape \(2, 3, 4, 5\)"):
        f(x, np.zeros((2, 3, 5, 5), np.float32), 0)
    with pytest.raises(TypeError, match="avg_pool2x2_forward: out must have the dtype of x"):
        f(x, np.zeros((2, 3, 4, 5), np.float16), 0)
    with pytest.raises(ValueError, match="avg_pool2x2_forward: out overlaps x"):
        f(x, x[:, :, :4, :5], 0)
    with pytest.raises(ValueError, match="out is an output and has stride 0"):
        f(x, np.lib.stride_tricks.as_strided(np.zeros((3, 4, 5), np.float32), (2, 3, 4, 5), (0, 80, 20, 4)), 0)
    with pytest.raises(ValueError, match="avg_pool2x2_forward: stream must be 0 for CPU tensors"):
        f(x, np.zeros((2, 3, 4, 5), np.float32), 5)
    with pytest.raises(ValueError, match=r"avg_pool2x2_backward: grad_out must have shape \(2, 3, 4, 5\)"):
        C_EXT.avg_pool2x2_backward(np.zeros((2, 3, 4, 4), np.float32), x, 0)
    with pytest.raises(ValueError, match="avg_pool2x2_backward: grad_in is an output and must be writeable"):
        ro = np.zeros((2, 3, 5, 6), np.float32)
        ro.flags.writeable = False
        C_EXT.avg_pool2x2_backward(np.zeros((2, 3, 4, 5), np.float32), ro, 0)


# ------------------------------------------------------------------------------------------------ c backend


def _block_pair(cls, c_in, c_out, seed):
    torch.manual_seed(seed)
    b1 = cls(c_in, c_out).train().to(memory_format=torch.channels_last)
    return b1, copy.deepcopy(b1)


@pytest.mark.parametrize("cls, c_in, c_out", [(ADown, 16, 24), (ADown, 18, 10), (AConv, 13, 16)])
def test_c_block_channels_last_matches_torch(cls, c_in, c_out):
    """ADown / AConv in channels-last through the c backend (the training layout): output, input gradient,
    parameter gradients and BN buffers as the torch block's."""
    b1, _ = _block_pair(cls, c_in, c_out, 3)
    assert_c_block_matches_torch(b1, torch.randn(2, c_in, 10, 9) * 2 + 0.5)


def test_adown_pool_forward_not_rerun_in_backward(monkeypatch):
    """An ADown reads its pooled input in two halves (cv1; max-pool → cv2): forward pools each half once; backward
    re-pools each half once (the lazy conv rebuilds its input for the weight gradient) and takes the input
    gradient from the pool's backward alone: no third forward through autograd."""
    counts = OpCalls(monkeypatch, pool, "_forward_impl", "_backward_impl")
    _, b = _block_pair(ADown, 16, 24, 4)
    x = torch.randn(2, 16, 10, 10).contiguous(memory_format=torch.channels_last).requires_grad_()
    y = materialise_any(layers.run(b, x))
    assert counts.fwd["forward"] == 2 and counts.bwd["forward"] == 0
    counts.phase = "backward"
    y.square().sum().backward()
    assert counts.fwd["backward"] == 2, counts.fwd
    assert counts.bwd["backward"] == 2, counts.bwd
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_model_pool_forward_not_rerun_in_backward(monkeypatch):
    """A whole yolov9-t training step on the c backend: the pools run in backward no more often than in
    forward (only the lazy convs' recomputes), and each has one backward."""
    from yolov9c.api import make_loss
    from yolov9c.backends import apply

    model = apply(seeded_model("yolov9-t"), "c")
    counts = OpCalls(monkeypatch, pool, "_forward_impl", "_backward_impl")
    x = torch.rand(2, 3, 64, 64)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 2, 0.3, 0.6, 0.2, 0.25]])
    loss, _ = make_loss(model)(model(x), targets)
    n = counts.fwd["forward"]
    assert n > 0 and counts.bwd["forward"] == 0
    counts.phase = "backward"
    loss.backward()
    assert counts.fwd["backward"] == n, counts.fwd
    assert counts.bwd["backward"] == n, counts.bwd


# ------------------------------------------------------------------------------------------------ CUDA


CUDA_CASES = POOL_CUDA_CASES + [
    ((4, 1024, 130, 3), "nchw"),      # (b, c, strip) > 65535: grid-stride in y
    ((8200, 8, 65, 2), "cl"),         # (b, strip) > 65535
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, layout", CUDA_CASES)
def test_cuda_matches_torch_and_cpu(shape, layout, dtype):
    x = make_x(shape, layout, dtype, device="cuda")
    y, gi, g = check_op(x)
    xc = make_x(shape, layout, dtype)
    assert torch.equal(y.cpu(), pool.avg_pool2x2(xc)), "CUDA forward differs from the C CPU implementation"
    gc = g.cpu().contiguous(memory_format=expected_format(g))
    assert torch.equal(gi.cpu(), pool.avg_pool2x2_backward(gc)), "CUDA backward differs from the C CPU one"


@pytest.mark.cuda
def test_cuda_aligned_slice_vectorised():
    """Channels 8..40 of a 48-channel channels-last buffer: 16-byte aligned, pixel stride 48 > C."""
    base = torch.randn(2, 48, 12, 12, device="cuda").half().contiguous(memory_format=torch.channels_last)
    x = base[:, 8:40]
    check_op(x)


@pytest.mark.cuda
def test_cuda_side_stream():
    x = make_x((2, 32, 20, 20), "cl", torch.float16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = pool.avg_pool2x2(x)
        gi = pool.avg_pool2x2_backward(y[:, :, 1:, 1:].contiguous(memory_format=torch.channels_last))
    s.synchronize()
    assert torch.equal(y, pool.avg_pool2x2(x))
    assert gi.shape == (2, 32, 19, 19)
