"""Tests of yolov9c/ops/pool.py (csrc/pool*.c, kernels/pool.cu) and of the c backend's use of its three ops, one
section each: the 2×2 stride-1 average pool (ADown, AConv), the k×k max pool (ADown's F.max_pool2d(x, 3, 2, 1),
SPPELAN's nn.MaxPool2d(5, 1, 2)) and the nearest 2× upsampling (the heads' nn.Upsample(None, 2, 'nearest'),
CBFuse's resize where it is exactly 2×). Shared helpers (inputs in four layouts, ulps, a block through the c
backend against the same torch block, per-op call counts through extension.count_calls()) come first.

Tolerances (ground truth: torch's own op and autograd backward, and float64 from the same inputs):
  * avg_pool2x2, float32: forward and backward equal torch's CPU float32 results bit for bit (the same float32
    adds in the same order); against float64: |diff| <= 2e-7·max|input|. float16 / bfloat16: within 1 ulp of
    the float64 truth rounded to the dtype and of torch's forward; torch's CPU 16-bit backward rounds after every
    add, so against it the backward is held to 2 ulps of the largest value (share of the tolerance printed).
  * max_pool2d: forward equal to torch's bit for bit in every dtype (a max is exact; NaN positions equal);
    backward float32 equal to torch's CPU gradient bit for bit (its scatter order), float16 / bfloat16 within
    1 ulp of the float64 truth. A wrong argmax (tie or NaN rule) moves a whole grad_out value: the inputs are
    small integers, many ties.
  * upsample_nearest2x: forward equal to torch's bit for bit (a copy); backward equal to torch's CPU gradient
    bit for bit in float32, float16 and bfloat16 (2×2 block sums in float32, row-major, one rounding).
  * CUDA equals the C CPU implementation bit for bit (avg: torch's CUDA float32 within 4e-7·max|x|).
  * c backend blocks (ADown, AConv, SPPELAN, channels-last): 1e-5 norm-relative to the torch block, as
    tests/backends/test_backend_c.py; whole yolov9-t / yolov9-c training steps: parameter gradients bit for bit those of
    the path that re-runs torch's op under autograd, and the op's forward not re-run in backward.
CPU cases always run; CUDA cases are marked `cuda` and skip without a GPU. Every test name starts with its op:
-k test_avg_ / -k test_max_ / -k test_upsample_ selects one op's tests.
Run: python -m pytest -q tests/ops/test_pool.py   (GPU: python -m pytest -q -m cuda tests/ops/test_pool.py)
"""

import copy
import functools

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from seeded_models import seeded_model, shared_seeded_model
from yolov9c.api import make_loss
from yolov9c.backends import apply
from yolov9c.backends.c import layers
from yolov9c.backends.c.lazy import Plain, Spatial, materialise_any
from yolov9c.models.common import ADown, AConv, CBFuse, SPPELAN
from yolov9c.ops import extension, pool

C_EXT = extension.load()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TARGETS = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 2, 0.3, 0.6, 0.2, 0.25]])


BLOCK_TOL = 1e-5
LAYOUTS = ("nchw", "cl", "cl_slice", "nchw_slice")
POOL_CUDA_CASES = [  # (shape, layout) of the CUDA tests: each kernel path
    ((2, 64, 40, 40), "cl"),          # vectorised: 8 halves / 4 floats per load
    ((2, 16, 9, 7), "cl"),
    ((1, 13, 7, 9), "cl"),            # C % 8 != 0: scalar channels-last
    ((2, 16, 11, 10), "cl_slice"),    # pixel stride 21, offset 3: scalar
    ((3, 8, 6, 5), "nchw"),
    ((2, 13, 5, 12), "nchw_slice"),
]


def in_layout(base, C, layout, device="cpu"):
    """Channels of base (B, C + 5, H, W) as a test input: 'nchw' / 'cl' (channels-last) hold channels 0..C-1;
    'cl_slice' / 'nchw_slice' are channels 3..3+C of the whole buffer (pixel stride C + 5 in the channels-last
    one)."""
    if layout == "nchw":
        return base[:, :C].contiguous().to(device)
    if layout == "cl":
        return base[:, :C].contiguous(memory_format=torch.channels_last).to(device)
    if layout == "cl_slice":
        return base.contiguous(memory_format=torch.channels_last).to(device)[:, 3:3 + C]
    if layout == "nchw_slice":
        return base.to(device)[:, 3:3 + C]
    raise AssertionError(layout)


def ulps(a, b, dtype):
    """max |a - b| in ulps of dtype at the larger magnitude of each pair."""
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    m = torch.maximum(a.abs(), b.abs()).to(dtype)
    up = torch.nextafter(m, torch.full_like(m, float("inf"))).double() - m.double()
    return ((a - b).abs() / up).max().item() if a.numel() else 0.0


def rel_err(a, ref):
    """max |a - ref| / max |ref| in float64."""
    a, ref = a.detach().double(), ref.detach().double()
    return ((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def assert_c_block_matches_torch(block, x, tol=BLOCK_TOL):
    """block (in train mode) on x as plain torch and through layers.run on a copy: output, input gradient,
    parameter gradients and floating-point buffers (BN running statistics) within tol (relative)."""
    b1 = block.to(memory_format=torch.channels_last)
    b2 = copy.deepcopy(b1)
    x1 = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    x2 = x1.detach().clone(memory_format=torch.channels_last).requires_grad_()
    y1 = b1(x1)
    y2 = materialise_any(layers.run(b2, x2))
    assert rel_err(y2, y1) < tol
    g = torch.randn_like(y1)
    (y1 * g).sum().backward()
    (y2 * g).sum().backward()
    assert rel_err(x2.grad, x1.grad) < tol, "input gradient"
    for (n, p1), p2 in zip(b1.named_parameters(), b2.parameters()):
        assert rel_err(p2.grad, p1.grad) < tol, n
    for (n, t1), t2 in zip(b1.named_buffers(), b2.buffers()):
        if t1.dtype.is_floating_point:
            assert rel_err(t2, t1) < tol, n


class OpCalls:
    """Calls of one op's forward and backward on real data through extension.count_calls() (the ops' documented
    test hook; the c backend's meta-tensor shape probe is not counted), split by phase: inside
    `with OpCalls("avg_pool2x2") as counts:` the calls so far are .fwd / .bwd["forward"]; after
    `counts.phase = "backward"` (before the loss backward) the later ones are .fwd / .bwd["backward"]."""

    def __init__(self, op):
        self.op, self.phase_at = op, None

    def __enter__(self):
        self._block = extension.count_calls()
        self.n = self._block.__enter__()
        return self

    def __exit__(self, *exc):
        return self._block.__exit__(*exc)

    def _now(self):
        return self.n.calls[self.op + "_forward"], self.n.calls[self.op + "_backward"]

    @property
    def phase(self):
        return "forward" if self.phase_at is None else "backward"

    @phase.setter
    def phase(self, value):
        assert value == "backward" and self.phase_at is None, value
        self.phase_at = self._now()

    def _split(self, i):
        now = self._now()[i]
        at = now if self.phase_at is None else self.phase_at[i]
        return {"forward": at, "backward": now - at}

    @property
    def fwd(self):
        return self._split(0)

    @property
    def bwd(self):
        return self._split(1)


def make_x(shape, layout, dtype, device="cpu", seed=0):
    """x of `shape` (B, C, H, W), normal values, in a layout of in_layout."""
    g = torch.Generator().manual_seed(seed)
    B, C, H, W = shape
    base = (torch.randn(B, C + 5, H, W, generator=g) * 3).to(dtype)
    return in_layout(base, C, layout, device)


def assert_slice_read_in_place(monkeypatch, op, binding):
    """op(x) on a channel slice of a channels-last buffer hands C (the binding's first argument) the slice
    itself (its data pointer and strides: a view of the buffer, no copy)."""
    x = make_x((2, 16, 6, 6), "cl_slice", torch.float32)
    seen = []
    real = getattr(C_EXT, binding)

    def spy(src, *rest):
        seen.append((src.data_ptr(), src.stride()))
        return real(src, *rest)

    monkeypatch.setattr(C_EXT, binding, spy)
    op(x)
    assert seen == [(x.data_ptr(), x.stride())] and x.stride(3) == 21


# =========================================================================================================
# avg_pool2x2: the 2×2 stride-1 average pool (ADown, AConv)
# =========================================================================================================

AVG_SHAPES = [(2, 16, 8, 8), (1, 13, 7, 9), (3, 8, 2, 2), (2, 24, 5, 12)]


def torch_pool(x):
    return F.avg_pool2d(x, 2, 1, 0, False, True)


def avg_torch_backward(x, g):
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


def avg_expected_format(x):
    return torch.channels_last if x.stride(1) == 1 and x.shape[1] > 1 else torch.contiguous_format


def avg_check_op(x, seed=1):
    """Forward, raw backward and autograd backward of the op on x against torch (see the module docstring)."""
    dtype = x.dtype
    y = pool.avg_pool2x2(x)
    ref = torch_pool(x)
    truth = torch_pool(x.detach().cpu().double())
    assert y.shape == ref.shape and y.dtype == dtype and y.device == x.device
    assert y.is_contiguous(memory_format=avg_expected_format(x))
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
    gt = avg_torch_backward(x.detach().cpu().double(), g.cpu().double())
    assert gi.shape == x.shape and gi.dtype == dtype
    assert gi.is_contiguous(memory_format=avg_expected_format(g))
    if dtype == torch.float32 and x.is_cpu:
        assert torch.equal(gi, avg_torch_backward(x, g)), "backward differs from torch's float32 result"
    elif dtype != torch.float32:
        close_scaled(gi, avg_torch_backward(x, g), dtype, 2, "backward vs torch")
    close_truth(gi, gt, g, "backward vs float64")

    xg = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    (ga,) = torch.autograd.grad(pool.avg_pool2x2(xg), xg, g)
    assert torch.equal(ga, gi), "autograd backward differs from avg_pool2x2_backward"
    return y, gi, g


# ------------------------------------------------------------------------------------------------ CPU


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", AVG_SHAPES)
def test_avg_cpu_matches_torch(shape, layout, dtype):
    avg_check_op(make_x(shape, layout, dtype))


def test_avg_window_sum_order_is_torchs():
    """Windows whose float32 sum depends on the order of the adds: torch adds the window row by row (upper row
    left to right, then the lower row), and so does the op."""
    x = torch.tensor([[[2.0 ** 24, 0.0], [1.0, 1.0]], [[2.0 ** 24, 1.0], [-2.0 ** 24, 1.0]]]).view(1, 2, 2, 2)
    y = pool.avg_pool2x2(x)
    assert torch.equal(y, torch_pool(x))
    # channel 0: ((2^24 + 0) + 1) + 1 = 2^24 (each +1 rounds away), not (2^24 + 0) + (1 + 1) = 2^24 + 2;
    # channel 1: ((2^24 + 1) - 2^24) + 1 = 1, not ((2^24 - 2^24) + 1) + 1 = 2 (column by column)
    assert y[0, 0].item() == 2.0 ** 22 and y[0, 1].item() == 0.25


def test_avg_c_reference_layouts_agree_bit_for_bit():
    x = make_x((2, 16, 9, 7), "nchw", torch.float16)
    outs = [pool.avg_pool2x2(x.contiguous(memory_format=f)) for f in (torch.contiguous_format, torch.channels_last)]
    assert torch.equal(outs[0], outs[1])


def test_avg_channel_slice_is_read_in_place(monkeypatch):
    """A channel slice of a channels-last buffer reaches C as a view of the buffer (no copy)."""
    assert_slice_read_in_place(monkeypatch, pool.avg_pool2x2, "avg_pool2x2_forward")


def test_avg_empty_batch_and_meta():
    x = torch.randn(0, 4, 5, 5)
    assert pool.avg_pool2x2(x).shape == (0, 4, 4, 4)
    assert pool.avg_pool2x2_backward(torch.randn(0, 4, 4, 4)).shape == (0, 4, 5, 5)
    m = pool.avg_pool2x2(torch.empty(2, 3, 6, 5, device="meta"))  # the c backend's shape probe
    assert m.shape == (2, 3, 5, 4) and m.device.type == "meta"


def test_avg_fused_zero_uses_reference(monkeypatch):
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    calls = []
    monkeypatch.setattr(C_EXT, "avg_pool2x2_forward", lambda *a: calls.append(a))
    x = make_x((2, 8, 5, 5), "cl", torch.float32)
    assert torch.equal(pool.avg_pool2x2(x), torch_pool(x)) and not calls
    g = torch.randn(2, 8, 4, 4)
    assert torch.equal(pool.avg_pool2x2_backward(g), avg_torch_backward(x, g))


def test_avg_bad_inputs_raise():
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


def test_avg_raw_binding_checks():
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
def test_avg_c_block_channels_last_matches_torch(cls, c_in, c_out):
    """ADown / AConv in channels-last through the c backend (the training layout): output, input gradient,
    parameter gradients and BN buffers as the torch block's."""
    b1, _ = _block_pair(cls, c_in, c_out, 3)
    assert_c_block_matches_torch(b1, torch.randn(2, c_in, 10, 9) * 2 + 0.5)


def test_avg_adown_pool_forward_not_rerun_in_backward():
    """An ADown reads its pooled input in two halves (cv1; max-pool → cv2): forward pools each half once; backward
    re-pools each half once (the lazy conv rebuilds its input for the weight gradient) and takes the input
    gradient from the pool's backward alone: no third forward through autograd."""
    _, b = _block_pair(ADown, 16, 24, 4)
    x = torch.randn(2, 16, 10, 10).contiguous(memory_format=torch.channels_last).requires_grad_()
    with OpCalls("avg_pool2x2") as counts:
        y = materialise_any(layers.run(b, x))
        assert counts.fwd["forward"] == 2 and counts.bwd["forward"] == 0
        counts.phase = "backward"
        y.square().sum().backward()
    assert counts.fwd["backward"] == 2, counts.fwd
    assert counts.bwd["backward"] == 2, counts.bwd
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_avg_model_pool_forward_not_rerun_in_backward():
    """A whole yolov9-t training step on the c backend: the pools run in backward no more often than in
    forward (only the lazy convs' recomputes), and each has one backward."""
    model = apply(seeded_model("yolov9-t"), "c")
    x = torch.rand(2, 3, 64, 64)
    with OpCalls("avg_pool2x2") as counts:
        loss, _ = make_loss(model)(model(x), TARGETS)
        n = counts.fwd["forward"]
        assert n > 0 and counts.bwd["forward"] == 0
        counts.phase = "backward"
        loss.backward()
    assert counts.fwd["backward"] == n, counts.fwd
    assert counts.bwd["backward"] == n, counts.bwd


# ------------------------------------------------------------------------------------------------ CUDA


AVG_CUDA_CASES = POOL_CUDA_CASES + [
    ((4, 1024, 130, 3), "nchw"),      # (b, c, strip) > 65535: grid-stride in y
    ((8200, 8, 65, 2), "cl"),         # (b, strip) > 65535
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, layout", AVG_CUDA_CASES)
def test_avg_cuda_matches_torch_and_cpu(shape, layout, dtype):
    x = make_x(shape, layout, dtype, device="cuda")
    y, gi, g = avg_check_op(x)
    xc = make_x(shape, layout, dtype)
    assert torch.equal(y.cpu(), pool.avg_pool2x2(xc)), "CUDA forward differs from the C CPU implementation"
    gc = g.cpu().contiguous(memory_format=avg_expected_format(g))
    assert torch.equal(gi.cpu(), pool.avg_pool2x2_backward(gc)), "CUDA backward differs from the C CPU one"


@pytest.mark.cuda
def test_avg_cuda_aligned_slice_vectorised():
    """Channels 8..40 of a 48-channel channels-last buffer: 16-byte aligned, pixel stride 48 > C."""
    base = torch.randn(2, 48, 12, 12, device="cuda").half().contiguous(memory_format=torch.channels_last)
    x = base[:, 8:40]
    avg_check_op(x)


@pytest.mark.cuda
def test_avg_cuda_side_stream():
    x = make_x((2, 32, 20, 20), "cl", torch.float16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = pool.avg_pool2x2(x)
        gi = pool.avg_pool2x2_backward(y[:, :, 1:, 1:].contiguous(memory_format=torch.channels_last))
    s.synchronize()
    assert torch.equal(y, pool.avg_pool2x2(x))
    assert gi.shape == (2, 32, 19, 19)


# =========================================================================================================
# max_pool2d: the k×k max pool (ADown, SPPELAN)
# =========================================================================================================

GEOMS = [(3, 2, 1), (5, 1, 2), (2, 2, 0), (3, 1, 1), (4, 3, 2)]
MAX_SHAPES = [(2, 16, 8, 8), (1, 13, 7, 9), (3, 5, 5, 4), (2, 9, 11, 6)]


def max_make_x(shape, layout, dtype, device="cpu", seed=0, ties=True):
    """x of `shape`: small integers (many ties) or normal values, in a layout of in_layout."""
    g = torch.Generator().manual_seed(seed)
    B, C, H, W = shape
    base = torch.randint(-2, 3, (B, C + 5, H, W), generator=g).float() if ties else torch.randn(
        B, C + 5, H, W, generator=g) * 3
    base = base.to(dtype)
    return in_layout(base, C, layout, device)


def max_torch_backward(x, g, k, s, p):
    xr = x.detach().clone().requires_grad_()
    (gi,) = torch.autograd.grad(F.max_pool2d(xr, k, s, p), xr, g)
    return gi


def same_values(a, b):
    """Equal bit for bit up to NaN payloads: NaNs at the same places, every other element equal."""
    return (a.shape == b.shape and torch.equal(a.isnan(), b.isnan())
            and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))


def op_geometry(m):
    """(k, s, p) with which the c backend runs nn.MaxPool2d m through pool.max_pool2d (the node layers.spatial
    builds), or None when it keeps torch's pool."""
    fn = layers.spatial(m, Plain(torch.zeros(1, 2, 32, 32))).fn
    if isinstance(fn, functools.partial) and fn.func is pool.max_pool2d:
        return fn.keywords["k"], fn.keywords["s"], fn.keywords["p"]
    return None


def max_check_op(x, k, s, p, seed=1):
    """Forward, raw backward and autograd backward on x against torch (module docstring's tolerances)."""
    dtype = x.dtype
    y = pool.max_pool2d(x, k, s, p)
    ref = F.max_pool2d(x, k, s, p)
    assert y.dtype == dtype and y.device == x.device
    assert same_values(y, ref), "forward differs from torch"
    fmt = torch.channels_last if x.stride(1) == 1 and x.shape[1] > 1 else torch.contiguous_format
    assert y.is_contiguous(memory_format=fmt)

    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(x.device)
    gi = pool.max_pool2d_backward(x, g, k, s, p)
    assert gi.shape == x.shape and gi.dtype == dtype
    if dtype == torch.float32 and x.is_cpu:
        assert torch.equal(gi, max_torch_backward(x, g, k, s, p)), "backward differs from torch's float32 gradient"
    truth = max_torch_backward(x.detach().cpu().double(), g.cpu().double(), k, s, p)
    if dtype == torch.float32:
        diff = (gi.cpu().double() - truth).abs().max().item()
        allowed = 1e-6 * max(truth.abs().max().item(), 1.0)
        assert diff <= allowed, f"backward vs float64: {diff:.3g} is {100 * diff / allowed:.0f}% of the allowed"
    else:
        u = ulps(gi, truth.to(dtype), dtype)
        assert u <= 1, f"backward vs float64: {u:.1f} ulps is {100 * u:.0f}% of the allowed 1"

    xg = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    (ga,) = torch.autograd.grad(pool.max_pool2d(xg, k, s, p), xg, g)
    assert torch.equal(ga, gi), "autograd backward differs from max_pool2d_backward"
    return y, gi, g


# ------------------------------------------------------------------------------------------------ CPU


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", MAX_SHAPES)
@pytest.mark.parametrize("geom", GEOMS[:2])
def test_max_cpu_matches_torch(geom, shape, layout, dtype):
    max_check_op(max_make_x(shape, layout, dtype), *geom)


@pytest.mark.parametrize("geom", GEOMS)
@pytest.mark.parametrize("ties", (True, False))
def test_max_cpu_geometries(geom, ties):
    max_check_op(max_make_x((2, 7, 9, 10), "cl", torch.float32, ties=ties), *geom)
    max_check_op(max_make_x((1, 3, 6, 5), "nchw", torch.float16, ties=ties), *geom)


def test_max_ties_go_to_the_first_maximum():
    """All-equal inputs: every window's argmax is its first element in row-major order (torch's rule), so the
    gradient lands only on those elements; with -inf everywhere the padding still never wins."""
    for fill in (1.0, float("-inf")):
        x = torch.full((1, 2, 6, 7), fill)
        for geom in ((3, 2, 1), (5, 1, 2)):
            g = torch.rand(F.max_pool2d(x, *geom).shape) + 1
            gi = pool.max_pool2d_backward(x, g, *geom)
            assert torch.equal(gi, max_torch_backward(x, g, *geom))
            assert same_values(pool.max_pool2d(x, *geom), F.max_pool2d(x, *geom))
    x = torch.ones(1, 1, 4, 4)
    gi = pool.max_pool2d_backward(x, torch.ones(1, 1, 2, 2), 3, 2, 1)
    # windows start at (-1, -1), (-1, 1), (1, -1), (1, 1): first real elements (0, 0), (0, 1), (1, 0), (1, 1)
    assert gi[0, 0, :2, :2].tolist() == [[1.0, 1.0], [1.0, 1.0]] and gi.sum().item() == 4


@pytest.mark.parametrize("dtype", DTYPES)
def test_max_nan_rule_is_torchs(dtype):
    """torch picks a window's last NaN (v > best or v is NaN, scanned row-major): output NaN, gradient to it."""
    x = max_make_x((2, 6, 7, 8), "cl", dtype, ties=True)
    x[0, 0, 1, 1] = x[0, 0, 2, 3] = x[1, 2, 0, :] = x[1, 5, 4, 4] = float("nan")
    x[0, 3, 6, 7] = float("inf")
    for geom in ((3, 2, 1), (5, 1, 2), (3, 1, 1)):
        max_check_op(x, *geom)
    x = torch.tensor([[[[1.0, float("nan"), 3.0], [float("nan"), 2.0, 0.0], [5.0, 5.0, 5.0]]]])
    gi = pool.max_pool2d_backward(x, torch.ones(1, 1, 1, 1), 3, 1, 0)
    assert gi[0, 0, 1, 0].item() == 1 and gi.sum().item() == 1


def test_max_signed_zero_kept():
    x = torch.tensor([[[[-0.0, 0.0], [0.0, -0.0]]]])
    y = pool.max_pool2d(x, 2, 2, 0)
    assert torch.equal(torch.signbit(y), torch.signbit(F.max_pool2d(x, 2, 2, 0)))


def test_max_empty_batch_meta_and_fused_zero(monkeypatch):
    x = torch.randn(0, 4, 5, 5)
    assert pool.max_pool2d(x, 3, 2, 1).shape == (0, 4, 3, 3)
    assert pool.max_pool2d_backward(x, torch.randn(0, 4, 3, 3), 3, 2, 1).shape == (0, 4, 5, 5)
    m = pool.max_pool2d(torch.empty(2, 3, 6, 5, device="meta"), 5, 1, 2)
    assert m.shape == (2, 3, 6, 5) and m.device.type == "meta"
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    monkeypatch.setattr(C_EXT, "max_pool2d_forward", lambda *a: pytest.fail("C called with YOLOV9C_FUSED=0"))
    x = max_make_x((2, 8, 5, 5), "cl", torch.float32)
    assert torch.equal(pool.max_pool2d(x, 3, 2, 1), F.max_pool2d(x, 3, 2, 1))


def test_max_bad_inputs_raise():
    with pytest.raises(ValueError, match="max_pool2d_forward: p must be in \\[0, 1\\], got 2"):
        pool.max_pool2d(torch.randn(1, 2, 5, 5), 3, 1, 2)
    with pytest.raises(ValueError, match="max_pool2d_forward: s must be in \\[1, 63\\], got 0"):
        pool.max_pool2d(torch.randn(1, 2, 5, 5), 3, 0, 1)
    with pytest.raises(ValueError, match="max_pool2d_forward: x is 2 x 5, smaller than one 5 x 5 window"):
        pool.max_pool2d(torch.randn(1, 2, 2, 5), 5, 1, 1)
    with pytest.raises(ValueError, match="max_pool2d_forward: x must have 4 dimensions"):
        pool.max_pool2d(torch.randn(2, 5, 5), 3, 2, 1)
    with pytest.raises(TypeError, match="max_pool2d_forward: x must be float32, float16, got int64"):
        pool.max_pool2d(torch.ones(1, 2, 3, 3, dtype=torch.int64), 3, 2, 1)
    with pytest.raises(TypeError, match="max_pool2d_forward: expected a torch.Tensor, got list"):
        pool.max_pool2d([[1.0]], 3, 2, 1)
    with pytest.raises(ValueError, match=r"max_pool2d_backward: grad_out must have shape \(1, 2, 3, 3\)"):
        pool.max_pool2d_backward(torch.randn(1, 2, 5, 5), torch.randn(1, 2, 5, 5), 3, 2, 1)


def test_max_raw_binding_checks():
    x = np.zeros((2, 3, 5, 6), np.float32)
    f, b = C_EXT.max_pool2d_forward, C_EXT.max_pool2d_backward
    with pytest.raises(TypeError, match=r"max_pool2d_forward\(\) takes exactly 6 positional arguments"):
        f(x, x, 3, 2, 0)
    with pytest.raises(TypeError, match="max_pool2d_forward: k must be an int, got float"):
        f(x, np.zeros((2, 3, 3, 3), np.float32), 3.0, 2, 1, 0)
    with pytest.raises(TypeError, match="max_pool2d_forward: out must have the dtype of x"):
        f(x, np.zeros((2, 3, 3, 3), np.float16), 3, 2, 1, 0)
    with pytest.raises(ValueError, match="max_pool2d_forward: out overlaps x"):
        f(x, x[:, :, :3, :3], 3, 2, 1, 0)
    with pytest.raises(ValueError, match="max_pool2d_forward: stream must be 0 for CPU tensors"):
        f(x, np.zeros((2, 3, 3, 3), np.float32), 3, 2, 1, 7)
    go, ix, gi = np.zeros((2, 3, 3, 3), np.float32), np.zeros((2, 3, 3, 3), np.uint8), np.zeros_like(x)
    with pytest.raises(TypeError, match=r"max_pool2d_backward\(\) takes exactly 8 positional arguments"):
        b(x, go, gi, 3, 2, 1, 0)
    with pytest.raises(ValueError, match=r"max_pool2d_backward: grad_in must have shape \(2, 3, 5, 6\)"):
        b(x, go, ix, np.zeros((2, 3, 5, 5), np.float32), 3, 2, 1, 0)
    with pytest.raises(ValueError, match="max_pool2d_backward: grad_in overlaps x"):
        b(x, go, ix, x, 3, 2, 1, 0)
    with pytest.raises(ValueError, match="grad_in is an output and has stride 0"):
        b(x, go, ix, np.lib.stride_tricks.as_strided(np.zeros((3, 5, 6), np.float32), (2, 3, 5, 6), (0, 120, 24, 4)),
          3, 2, 1, 0)
    with pytest.raises(TypeError, match="max_pool2d_backward: index must be uint8, got float32"):
        b(x, go, go.copy(), gi, 3, 2, 1, 0)
    with pytest.raises(ValueError, match=r"max_pool2d_backward: index must have shape \(2, 3, 3, 3\)"):
        b(x, go, np.zeros((2, 3, 3, 4), np.uint8), gi, 3, 2, 1, 0)
    with pytest.raises(ValueError, match="max_pool2d_backward: index overlaps x"):
        b(x, go, x.view(np.uint8)[:, :, :3, :3], gi, 3, 2, 1, 0)
    with pytest.raises(ValueError, match="max_pool2d_backward: grad_in overlaps index"):
        b(x, go, gi.view(np.uint8)[:, :, :3, :3], gi, 3, 2, 1, 0)
    with pytest.raises(ValueError, match="max_pool2d_backward: index is an output and has stride 0"):
        b(x, go, np.lib.stride_tricks.as_strided(ix, ix.shape, (0, 9, 3, 1)), gi, 3, 2, 1, 0)


def test_max_backward_refuses_windows_over_255():
    """The backward stores each window's argmax as one uint8: k = 15 (225 indices) runs, k = 16 is refused
    with a clear error (the forward has no such limit; the c backend keeps torch's pool for k > 15)."""
    x = max_make_x((1, 3, 17, 16), "cl", torch.float32, ties=False)
    for k in (15, 16):
        g = torch.randn(F.max_pool2d(x, k, 1, 0).shape)
        if k == 15:
            assert torch.equal(pool.max_pool2d_backward(x, g, k, 1, 0), max_torch_backward(x, g, k, 1, 0))
            continue
        assert same_values(pool.max_pool2d(x, k, 1, 0), F.max_pool2d(x, k, 1, 0))
        with pytest.raises(ValueError, match=r"max_pool2d_backward: k\*k must be <= 255 .*got k = 16"):
            pool.max_pool2d_backward(x, g, k, 1, 0)
    assert op_geometry(nn.MaxPool2d(15, 1, 7)) == (15, 1, 7)
    assert op_geometry(nn.MaxPool2d(16, 1, 0)) is None


@pytest.mark.parametrize("geom", GEOMS)
@pytest.mark.parametrize("layout", ("nchw", "cl"))
def test_max_index_holds_torchs_argmax(geom, layout):
    """The backward's scratch after a call: index[oy,ox] = dy*k + dx of torch's argmax (return_indices, a flat
    h*W + w of the input plane) in every window, ties and a NaN included; in an NCHW or a channels-last index."""
    k, s, p = geom
    x = max_make_x((2, 9, 9, 11), "nchw", torch.float32)
    x[1, 2, 3, 4] = float("nan")
    out, flat = F.max_pool2d(x, k, s, p, return_indices=True)
    oy = torch.arange(out.shape[2]).view(-1, 1)
    ox = torch.arange(out.shape[3]).view(1, -1)
    want = (flat // x.shape[3] - (oy * s - p)) * k + flat % x.shape[3] - (ox * s - p)
    ix = torch.full(out.shape, 255, dtype=torch.uint8)
    if layout == "cl":
        ix = ix.contiguous(memory_format=torch.channels_last)
    g = torch.randn(out.shape)
    gi = torch.empty_like(x)
    C_EXT.max_pool2d_backward(x.numpy(), g.numpy(), ix.numpy(), gi.numpy(), k, s, p, 0)
    assert torch.equal(ix.long(), want)
    assert torch.equal(gi, max_torch_backward(x, g, k, s, p))


# ------------------------------------------------------------------------------------------------ c backend


@pytest.mark.parametrize("cls, args, c_in", [(ADown, (16, 24), 16), (ADown, (18, 10), 18),
                                             (SPPELAN, (16, 12, 8), 16), (SPPELAN, (13, 10, 6), 13)])
def test_max_c_block_channels_last_matches_torch(cls, args, c_in):
    torch.manual_seed(3)
    assert_c_block_matches_torch(cls(*args).train(), torch.randn(2, c_in, 11, 9) * 2 + 0.5)


def test_max_only_supported_maxpools_use_the_op():
    child = layers.Plain(torch.zeros(1, 2, 8, 8))
    assert op_geometry(nn.MaxPool2d(5, 1, 2)) == (5, 1, 2)
    assert op_geometry(nn.MaxPool2d(3)) == (3, 3, 0)
    for m in (nn.MaxPool2d(3, 2, 1, ceil_mode=True), nn.MaxPool2d(3, 1, 1, dilation=2), nn.MaxPool2d((3, 5), 1),
              nn.MaxPool2d(3, (1, 2))):
        assert op_geometry(m) is None
        node = layers.spatial(m, child)
        assert isinstance(node, Spatial) and node.grad is None  # torch's pool, re-run under autograd in backward
    node = layers.spatial(nn.MaxPool2d(5, 1, 2), child)
    assert node.grad_reads_x and node.fn.func is pool.max_pool2d


def _old_max_pool(child, k, s, p):
    """The path before this op: torch's F.max_pool2d, re-run under autograd in Spatial.backward."""
    return Spatial(lambda t: F.max_pool2d(t, k, s, p), child)


def _max_step(name, monkeypatch, direct, counts=None):
    if not direct:
        monkeypatch.setattr(layers, "max_pool", _old_max_pool)
    model = apply(seeded_model(name).to(memory_format=torch.channels_last).train(), "c")
    x = torch.rand(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    loss, _ = make_loss(model)(model(x), TARGETS)
    if counts is not None:
        counts.phase = "backward"
    loss.backward()
    if monkeypatch is not None:
        monkeypatch.undo()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ("yolov9-t", "yolov9-c"))
def test_max_model_gradients_unchanged(name, monkeypatch):
    """A whole c-backend training step: every parameter gradient bit for bit as with torch's max pool re-run
    under autograd (float32: the same maxima and the same sums in the same order)."""
    direct = _max_step(name, monkeypatch, True)
    base = _max_step(name, monkeypatch, False)
    assert direct.keys() == base.keys() and len(direct) > 0
    for n in direct:
        assert torch.equal(direct[n], base[n]), n


def _rerun_max_pool(child, k, s, p):
    """The op without Spatial's direct gradient: Spatial.backward re-runs its forward under autograd."""
    return Spatial(functools.partial(pool.max_pool2d, k=k, s=s, p=p), child)


def _counted(monkeypatch, direct, run):
    if not direct:
        monkeypatch.setattr(layers, "max_pool", _rerun_max_pool)
    with OpCalls("max_pool2d") as counts:
        run(counts)
    monkeypatch.undo()
    return counts


def _model_step(counts):
    _max_step("yolov9-t", None, True, counts)


def _sppelan_step(counts):
    torch.manual_seed(4)
    b = SPPELAN(16, 12, 8).train().to(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 9, 9).contiguous(memory_format=torch.channels_last).requires_grad_()
    y = materialise_any(layers.run(b, x))
    counts.phase = "backward"
    y.square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.parametrize("run", (_model_step, _sppelan_step), ids=("yolov9-t", "sppelan"))
def test_max_pool_forward_not_rerun_in_backward(run, monkeypatch):
    """yolov9-t (ADown's 3×3/2 pools, SPPELAN's three chained 5×5/1 pools) and SPPELAN alone: with the direct
    gradient, backward runs the pool's forward only where a lazy conv recomputes its input; re-running it under
    autograd cost one more forward per pool backward (a chained pool is reached once per consumer path)."""
    new = _counted(monkeypatch, True, run)
    old = _counted(monkeypatch, False, run)
    n = new.fwd["forward"]
    assert n > 0 and old.fwd["forward"] == n and new.bwd["forward"] == 0
    assert new.bwd["backward"] == old.bwd["backward"] > 0
    assert new.fwd["backward"] == old.fwd["backward"] - new.bwd["backward"], (new.fwd, old.fwd, new.bwd)


# ------------------------------------------------------------------------------------------------ CUDA


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, layout", POOL_CUDA_CASES)
@pytest.mark.parametrize("geom", GEOMS)
def test_max_cuda_matches_torch_and_cpu(geom, shape, layout, dtype):
    x = max_make_x(shape, layout, dtype, device="cuda")
    x[0, 0, 1, 1] = float("nan")
    y, gi, g = max_check_op(x, *geom)
    xc = max_make_x(shape, layout, dtype)
    xc[0, 0, 1, 1] = float("nan")
    assert same_values(y.cpu(), pool.max_pool2d(xc, *geom)), "CUDA forward differs from the C CPU implementation"
    assert torch.equal(gi.cpu(), pool.max_pool2d_backward(xc, g.cpu(), *geom)), "CUDA backward differs from CPU"


@pytest.mark.cuda
def test_max_cuda_aligned_slice_and_side_stream():
    base = torch.randn(2, 48, 12, 12, device="cuda").half().contiguous(memory_format=torch.channels_last)
    max_check_op(base[:, 8:40], 5, 1, 2)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = pool.max_pool2d(base, 3, 2, 1)
        gi = pool.max_pool2d_backward(base, torch.ones_like(y), 3, 2, 1)
    s.synchronize()
    assert torch.equal(y, F.max_pool2d(base, 3, 2, 1)) and gi.shape == base.shape


@pytest.mark.cuda
@pytest.mark.parametrize("geom", GEOMS)
def test_max_cuda_index_matches_cpu(geom):
    """The raw binding on both devices (channels-last float16: the vector kernels, the compile-time ones for
    3×3/2 and 5×5/1): the same window argmaxes in index and the same gradient bits."""
    k, s, p = geom
    x = max_make_x((2, 16, 9, 11), "cl", torch.float16)
    x[1, 2, 3, 4] = float("nan")
    g = torch.randn(F.max_pool2d(x, k, s, p).shape).half().contiguous(memory_format=torch.channels_last)
    got = []
    for dev in ("cpu", "cuda"):
        xd, gd = x.to(dev), g.to(dev)
        ix = torch.full(g.shape, 255, dtype=torch.uint8, device=dev).contiguous(memory_format=torch.channels_last)
        gi = torch.empty_like(xd)
        C_EXT.max_pool2d_backward(xd, gd, ix, gi, k, s, p, extension.stream_of(xd.device))
        got.append((ix.cpu(), gi.cpu()))
    assert torch.equal(got[0][0], got[1][0]), "index differs between CUDA and CPU"
    assert torch.equal(got[0][1], got[1][1]), "grad_in differs between CUDA and CPU"


@pytest.mark.cuda
def test_max_cuda_backward_in_graph():
    """The backward (index scratch from torch's allocator, two kernels) captured in a CUDA graph: a replay
    recomputes it from the current grad_out."""
    x = max_make_x((2, 64, 20, 20), "cl", torch.float16, device="cuda", ties=False)
    for geom in ((5, 1, 2), (3, 2, 1)):
        g = torch.randn(F.max_pool2d(x, *geom).shape, device="cuda").half().contiguous(
            memory_format=torch.channels_last)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pool.max_pool2d_backward(x, g, *geom)   # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = pool.max_pool2d_backward(x, g, *geom)
        g.mul_(-2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got, pool.max_pool2d_backward(x, g, *geom))
        assert ulps(got, max_torch_backward(x.double(), g.double(), *geom).half(), torch.float16) <= 1


# =========================================================================================================
# upsample_nearest2x: the nearest 2× upsampling (the heads' nn.Upsample, CBFuse)
# =========================================================================================================

UP_SHAPES = [(2, 16, 8, 8), (1, 13, 7, 9), (3, 8, 1, 1), (2, 24, 5, 12), (1, 3, 1, 6)]


def torch_up(x):
    return F.interpolate(x, scale_factor=2.0, mode="nearest")


def upsample_torch_backward(x, g):
    """torch's autograd input gradient of the upsampling at x for output gradient g (x's dtype and device)."""
    xr = x.detach().clone().requires_grad_()
    (gi,) = torch.autograd.grad(torch_up(xr), xr, g)
    return gi


def upsample_expected_format(x):
    return torch.channels_last if x.stride(1) == 1 and x.shape[1] > 1 else torch.contiguous_format


def upsample_check_op(x, seed=1):
    """Forward, raw backward and autograd backward of the op on x against torch (the module docstring)."""
    dtype = x.dtype
    y = pool.upsample_nearest2x(x)
    B, C, H, W = x.shape
    assert y.shape == (B, C, 2 * H, 2 * W) and y.dtype == dtype and y.device == x.device
    assert y.is_contiguous(memory_format=upsample_expected_format(x))
    assert torch.equal(y, torch_up(x)), "forward differs from torch's"

    g = (torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)) * 2).to(dtype).to(x.device)
    g = in_layout_like(g, x)
    gi = pool.upsample_nearest2x_backward(g)
    assert gi.shape == x.shape and gi.dtype == dtype
    assert gi.is_contiguous(memory_format=upsample_expected_format(g))
    want = upsample_torch_backward(x.cpu(), g.cpu())
    assert torch.equal(gi.cpu(), want), f"backward: {ulps(gi, want, dtype):.1f} ulps from torch's CPU result"
    truth = upsample_torch_backward(x.cpu().double(), g.cpu().double())
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
    return g.contiguous(memory_format=upsample_expected_format(x))


# ------------------------------------------------------------------------------------------------ CPU


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", UP_SHAPES)
def test_upsample_cpu_matches_torch(shape, layout, dtype):
    upsample_check_op(make_x(shape, layout, dtype))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_upsample_backward_strided_grad(layout):
    """grad_out itself in every layout (a channel slice of a channels-last buffer included), float16."""
    g = make_x((2, 11, 6, 10), layout, torch.float16, seed=3)
    want = torch.ops.aten.upsample_nearest2d_backward(g, [6, 10], [2, 11, 3, 5], 2.0, 2.0)
    assert torch.equal(pool.upsample_nearest2x_backward(g), want)


def test_upsample_block_sum_order_is_torchs():
    """Blocks whose float32 sum depends on the order of the adds: torch adds each 2×2 block row by row (upper
    row left to right, then the lower row), and so does the op."""
    g = torch.tensor([[[2.0 ** 24, 1.0], [1.0, 0.0]], [[2.0 ** 24, 1.0], [-2.0 ** 24, 1.0]]]).view(1, 2, 2, 2)
    gi = pool.upsample_nearest2x_backward(g)
    assert torch.equal(gi, torch.ops.aten.upsample_nearest2d_backward(g, [2, 2], [1, 2, 1, 1], 2.0, 2.0))
    # channel 0: ((2^24 + 1) + 1) + 0 = 2^24 (each +1 rounds away), not 2^24 + (1 + 1) = 2^24 + 2;
    # channel 1: ((2^24 + 1) - 2^24) + 1 = 1, not ((2^24 - 2^24) + 1) + 1 = 2 (column by column)
    assert gi[0, 0, 0, 0].item() == 2.0 ** 24 and gi[0, 1, 0, 0].item() == 1.0


def test_upsample_forward_copies_bits():
    """NaN, infinities and -0.0 come through as torch's do (a copy, no arithmetic)."""
    x = torch.tensor([float("nan"), float("inf"), -0.0, -float("inf"), 1e-40, 3.0]).view(1, 6, 1, 1).half()
    y = pool.upsample_nearest2x(x)
    assert torch.equal(y.view(torch.int16), torch_up(x).view(torch.int16))


def test_upsample_channel_slice_is_read_in_place(monkeypatch):
    """A channel slice of a channels-last buffer reaches C as a view of the buffer (no copy)."""
    assert_slice_read_in_place(monkeypatch, pool.upsample_nearest2x, "upsample_nearest2x_forward")


def test_upsample_empty_and_meta():
    assert pool.upsample_nearest2x(torch.randn(0, 4, 5, 5)).shape == (0, 4, 10, 10)
    assert pool.upsample_nearest2x(torch.randn(2, 4, 0, 3)).shape == (2, 4, 0, 6)
    assert pool.upsample_nearest2x_backward(torch.randn(0, 4, 4, 6)).shape == (0, 4, 2, 3)
    m = pool.upsample_nearest2x(torch.empty(2, 3, 6, 5, device="meta"))  # the c backend's shape probe
    assert m.shape == (2, 3, 12, 10) and m.device.type == "meta"


def test_upsample_fused_zero_uses_reference(monkeypatch):
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    calls = []
    monkeypatch.setattr(C_EXT, "upsample_nearest2x_forward", lambda *a: calls.append(a))
    monkeypatch.setattr(C_EXT, "upsample_nearest2x_backward", lambda *a: calls.append(a))
    x = make_x((2, 8, 5, 5), "cl", torch.float32)
    assert torch.equal(pool.upsample_nearest2x(x), torch_up(x))
    g = torch.randn(2, 8, 10, 10)
    assert torch.equal(pool.upsample_nearest2x_backward(g), upsample_torch_backward(x, g)) and not calls


def test_upsample_bad_inputs_raise():
    with pytest.raises(ValueError, match="upsample_nearest2x_forward: x must have 4 dimensions"):
        pool.upsample_nearest2x(torch.randn(3, 5, 5))
    with pytest.raises(TypeError, match="upsample_nearest2x_forward: x must be float32, float16, got int64"):
        pool.upsample_nearest2x(torch.ones(1, 2, 3, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="upsample_nearest2x_forward: expected a torch.Tensor, got list"):
        pool.upsample_nearest2x([[1.0]])
    with pytest.raises(ValueError, match=r"upsample_nearest2x_backward: grad_out must have shape \(1, 2, 4, 6\) "
                                         r"\(grad_in's shape with H and W doubled\), got \(1, 2, 5, 6\)"):
        pool.upsample_nearest2x_backward(torch.randn(1, 2, 5, 6))


def test_upsample_raw_binding_checks():
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


def test_upsample_spatial_uses_the_op_only_for_nearest_2x():
    child = Plain(torch.randn(1, 4, 3, 5))
    for m in (nn.Upsample(None, 2, "nearest"), nn.Upsample(scale_factor=2.0), nn.Upsample(scale_factor=(2, 2))):
        node = layers.spatial(m, child)
        assert node.fn is pool.upsample_nearest2x and node.grad is pool.upsample_nearest2x_backward, m
    for m in (nn.Upsample(scale_factor=3.0), nn.Upsample(scale_factor=2.0, mode="bilinear"),
              nn.Upsample(size=(6, 10)), nn.Upsample(scale_factor=(2, 3)),
              nn.Upsample(scale_factor=2.0, recompute_scale_factor=True)):
        assert layers.spatial(m, child).fn is not pool.upsample_nearest2x, m


def test_upsample_cbfuse_uses_the_op_only_for_2x():
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
                   grad=layers.nearest_backward(child, (2.0, 2.0)))


def _op_rerun(child):
    """The op without Spatial's direct gradient: Spatial.backward re-runs its forward under autograd."""
    return Spatial(pool.upsample_nearest2x, child)


def _upsample_step(name, monkeypatch, up2, channels_last, counts=None):
    """One c-backend training step with layers.up2 replaced by up2 (None: the op as wired): the parameter
    gradients."""
    if up2 is not None:
        monkeypatch.setattr(layers, "up2", up2)
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
def test_upsample_model_gradients_equal_path_before(name, channels_last, monkeypatch):
    """A whole c training step: every parameter gradient bit for bit as before the op (float32: the same copy
    forward and the same block sums in the same order)."""
    with_op = _upsample_step(name, monkeypatch, None, channels_last)
    before = _upsample_step(name, monkeypatch, _torch_up2, channels_last)
    assert with_op.keys() == before.keys() and len(with_op) > 0
    for n in with_op:
        assert torch.equal(with_op[n], before[n]), n


def test_upsample_model_forward_not_rerun_in_backward(monkeypatch):
    """yolov9-t's neck upsamplings: each runs once in forward (its consumer conv materialises it); in backward
    the op's forward runs only for the lazy convs' recomputes — one call per upsampling fewer than when
    Spatial re-runs it under autograd for the gradient — and each upsampling has one backward."""
    n_up = sum(type(m) is nn.Upsample for m in shared_seeded_model("yolov9-t").modules())
    with OpCalls("upsample_nearest2x") as rerun:
        _upsample_step("yolov9-t", monkeypatch, _op_rerun, True, rerun)
    with OpCalls("upsample_nearest2x") as counts:
        _upsample_step("yolov9-t", monkeypatch, None, True, counts)
    assert n_up > 0 and counts.fwd["forward"] == rerun.fwd["forward"] == n_up and counts.bwd["forward"] == 0
    assert counts.fwd["backward"] == rerun.fwd["backward"] - n_up, (counts.fwd, rerun.fwd)
    assert counts.bwd["backward"] == rerun.bwd["backward"] == n_up, (counts.bwd, rerun.bwd)  # autograd: the same


# ------------------------------------------------------------------------------------------------ CUDA


UP_CUDA_CASES = POOL_CUDA_CASES + [
    ((2, 33000, 1, 2), "nchw"),       # (b, c) > 65535: grid-stride in z
    ((66000, 8, 1, 1), "cl"),         # b > 65535: grid-stride in z
    ((1, 8, 65600, 1), "cl"),         # H > 65535: grid-stride in y
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, layout", UP_CUDA_CASES)
def test_upsample_cuda_matches_torch_and_cpu(shape, layout, dtype):
    x = make_x(shape, layout, dtype, device="cuda")
    y, gi, g = upsample_check_op(x)
    xc = make_x(shape, layout, dtype)
    assert torch.equal(y.cpu(), pool.upsample_nearest2x(xc)), "CUDA forward differs from the C CPU one"
    gc = g.cpu().contiguous(memory_format=upsample_expected_format(g))
    assert torch.equal(gi.cpu(), pool.upsample_nearest2x_backward(gc)), "CUDA backward differs from the C CPU one"


@pytest.mark.cuda
@pytest.mark.parametrize("layout", LAYOUTS)
def test_upsample_cuda_backward_strided_grad(layout):
    g = make_x((2, 16, 6, 10), layout, torch.bfloat16, device="cuda", seed=3)
    assert torch.equal(pool.upsample_nearest2x_backward(g).cpu(), pool.upsample_nearest2x_backward(g.cpu()))


@pytest.mark.cuda
def test_upsample_cuda_aligned_slice_vectorised():
    """Channels 8..40 of a 48-channel channels-last buffer: 16-byte aligned, pixel stride 48 > C."""
    base = torch.randn(2, 48, 12, 12, device="cuda").half().contiguous(memory_format=torch.channels_last)
    upsample_check_op(base[:, 8:40])


@pytest.mark.cuda
def test_upsample_cuda_side_stream():
    x = make_x((2, 32, 20, 20), "cl", torch.float16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = pool.upsample_nearest2x(x)
        gi = pool.upsample_nearest2x_backward(y)
    s.synchronize()
    assert torch.equal(y, pool.upsample_nearest2x(x))
    assert torch.equal(gi, pool.upsample_nearest2x_backward(y))
