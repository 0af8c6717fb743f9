"""Tests of the k×k max pool (yolov9c/ops/pool.py max_pool2d, csrc/pool*.c, kernels/pool.cu) and of its use by
the c backend (ADown's F.max_pool2d(x, 3, 2, 1), SPPELAN's nn.MaxPool2d(5, 1, 2)).

Ground truth: F.max_pool2d and its autograd backward (torch's index-based scatter), in the op's dtype and in
float64 from the same inputs (the widening is exact, so ties and NaNs stay where they are).
Tolerances:
  * forward: equal to torch's bit for bit in every dtype (a max is exact; NaN positions equal).
  * backward, float32: equal to torch's CPU float32 gradient bit for bit (the same float32 sums in torch's
    scatter order: row-major over the outputs). float16 / bfloat16: within 1 ulp of the float64 truth
    rounded to the dtype (one rounding of the float32 sum). A wrong argmax (the tie or NaN rule) moves a whole
    grad_out value, far beyond either tolerance; the inputs below are small integers: many ties.
  * CUDA equals the C CPU implementation bit for bit.
  * c backend: ADown / SPPELAN channels-last within 1e-5 norm-relative of the torch block (tests/test_pool.py);
    whole-model gradients (yolov9-t, yolov9-c at 64 px) bit for bit those of the autograd path (torch's
    F.max_pool2d re-run in backward).
Run: python -m pytest -q tests/test_maxpool.py   (GPU: python -m pytest -q -m cuda tests/test_maxpool.py)
"""

import collections
import functools

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from pool_common import CUDA_CASES, LAYOUTS, assert_c_block_matches_torch, in_layout, ulps
from seeded_models import seeded_model
from yolov9c.api import make_loss
from yolov9c.backends import apply
from yolov9c.backends.c import layers
from yolov9c.backends.c.lazy import Spatial, materialise_any
from yolov9c.models.common import ADown, SPPELAN
from yolov9c.ops import extension, pool

C_EXT = extension.load()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
GEOMS = [(3, 2, 1), (5, 1, 2), (2, 2, 0), (3, 1, 1), (4, 3, 2)]
SHAPES = [(2, 16, 8, 8), (1, 13, 7, 9), (3, 5, 5, 4), (2, 9, 11, 6)]
TARGETS = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 2, 0.3, 0.6, 0.2, 0.25]])


def make_x(shape, layout, dtype, device="cpu", seed=0, ties=True):
    """x of `shape`: small integers (many ties) or normal values, in a layout of pool_common.in_layout."""
    g = torch.Generator().manual_seed(seed)
    B, C, H, W = shape
    base = torch.randint(-2, 3, (B, C + 5, H, W), generator=g).float() if ties else torch.randn(
        B, C + 5, H, W, generator=g) * 3
    base = base.to(dtype)
    return in_layout(base, C, layout, device)


def torch_backward(x, g, k, s, p):
    xr = x.detach().clone().requires_grad_()
    (gi,) = torch.autograd.grad(F.max_pool2d(xr, k, s, p), xr, g)
    return gi


def same_values(a, b):
    """Equal bit for bit up to NaN payloads: NaNs at the same places, every other element equal."""
    return (a.shape == b.shape and torch.equal(a.isnan(), b.isnan())
            and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))


def check_op(x, k, s, p, seed=1):
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
        assert torch.equal(gi, torch_backward(x, g, k, s, p)), "backward differs from torch's float32 gradient"
    truth = torch_backward(x.detach().cpu().double(), g.cpu().double(), k, s, p)
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
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("geom", GEOMS[:2])
def test_cpu_matches_torch(geom, shape, layout, dtype):
    check_op(make_x(shape, layout, dtype), *geom)


@pytest.mark.parametrize("geom", GEOMS)
@pytest.mark.parametrize("ties", (True, False))
def test_cpu_geometries(geom, ties):
    check_op(make_x((2, 7, 9, 10), "cl", torch.float32, ties=ties), *geom)
    check_op(make_x((1, 3, 6, 5), "nchw", torch.float16, ties=ties), *geom)


def test_ties_go_to_the_first_maximum():
    """All-equal inputs: every window's argmax is its first element in row-major order (torch's rule), so the
    gradient lands only on those elements; with -inf everywhere the padding still never wins."""
    for fill in (1.0, float("-inf")):
        x = torch.full((1, 2, 6, 7), fill)
        for geom in ((3, 2, 1), (5, 1, 2)):
            g = torch.rand(F.max_pool2d(x, *geom).shape) + 1
            gi = pool.max_pool2d_backward(x, g, *geom)
            assert torch.equal(gi, torch_backward(x, g, *geom))
            assert same_values(pool.max_pool2d(x, *geom), F.max_pool2d(x, *geom))
    x = torch.ones(1, 1, 4, 4)
    gi = pool.max_pool2d_backward(x, torch.ones(1, 1, 2, 2), 3, 2, 1)
    # windows start at (-1, -1), (-1, 1), (1, -1), (1, 1): first real elements (0, 0), (0, 1), (1, 0), (1, 1)
    assert gi[0, 0, :2, :2].tolist() == [[1.0, 1.0], [1.0, 1.0]] and gi.sum().item() == 4


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_rule_is_torchs(dtype):
    """torch picks a window's last NaN (v > best or v is NaN, scanned row-major): output NaN, gradient to it."""
    x = make_x((2, 6, 7, 8), "cl", dtype, ties=True)
    x[0, 0, 1, 1] = x[0, 0, 2, 3] = x[1, 2, 0, :] = x[1, 5, 4, 4] = float("nan")
    x[0, 3, 6, 7] = float("inf")
    for geom in ((3, 2, 1), (5, 1, 2), (3, 1, 1)):
        check_op(x, *geom)
    x = torch.tensor([[[[1.0, float("nan"), 3.0], [float("nan"), 2.0, 0.0], [5.0, 5.0, 5.0]]]])
    gi = pool.max_pool2d_backward(x, torch.ones(1, 1, 1, 1), 3, 1, 0)
    assert gi[0, 0, 1, 0].item() == 1 and gi.sum().item() == 1


def test_signed_zero_kept():
    x = torch.tensor([[[[-0.0, 0.0], [0.0, -0.0]]]])
    y = pool.max_pool2d(x, 2, 2, 0)
    assert torch.equal(torch.signbit(y), torch.signbit(F.max_pool2d(x, 2, 2, 0)))


def test_empty_batch_meta_and_fused_zero(monkeypatch):
    x = torch.randn(0, 4, 5, 5)
    assert pool.max_pool2d(x, 3, 2, 1).shape == (0, 4, 3, 3)
    assert pool.max_pool2d_backward(x, torch.randn(0, 4, 3, 3), 3, 2, 1).shape == (0, 4, 5, 5)
    m = pool.max_pool2d(torch.empty(2, 3, 6, 5, device="meta"), 5, 1, 2)
    assert m.shape == (2, 3, 6, 5) and m.device.type == "meta"
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    monkeypatch.setattr(C_EXT, "max_pool2d_forward", lambda *a: pytest.fail("C called with YOLOV9C_FUSED=0"))
    x = make_x((2, 8, 5, 5), "cl", torch.float32)
    assert torch.equal(pool.max_pool2d(x, 3, 2, 1), F.max_pool2d(x, 3, 2, 1))


def test_bad_inputs_raise():
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


def test_raw_binding_checks():
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


def test_backward_refuses_windows_over_255():
    """The backward stores each window's argmax as one uint8: k = 15 (225 indices) runs, k = 16 is refused
    with a clear error (the forward has no such limit; the c backend keeps torch's pool for k > 15)."""
    x = make_x((1, 3, 17, 16), "cl", torch.float32, ties=False)
    for k in (15, 16):
        g = torch.randn(F.max_pool2d(x, k, 1, 0).shape)
        if k == 15:
            assert torch.equal(pool.max_pool2d_backward(x, g, k, 1, 0), torch_backward(x, g, k, 1, 0))
            continue
        assert same_values(pool.max_pool2d(x, k, 1, 0), F.max_pool2d(x, k, 1, 0))
        with pytest.raises(ValueError, match=r"max_pool2d_backward: k\*k must be <= 255 .*got k = 16"):
            pool.max_pool2d_backward(x, g, k, 1, 0)
    assert layers._max_geometry(nn.MaxPool2d(15, 1, 7)) == (15, 1, 7)
    assert layers._max_geometry(nn.MaxPool2d(16, 1, 0)) is None


@pytest.mark.parametrize("geom", GEOMS)
@pytest.mark.parametrize("layout", ("nchw", "cl"))
def test_index_holds_torchs_argmax(geom, layout):
    """The backward's scratch after a call: index[oy,ox] = dy*k + dx of torch's argmax (return_indices, a flat
    h*W + w of the input plane) in every window, ties and a NaN included; in an NCHW or a channels-last index."""
    k, s, p = geom
    x = make_x((2, 9, 9, 11), "nchw", torch.float32)
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
    assert torch.equal(gi, torch_backward(x, g, k, s, p))


# ------------------------------------------------------------------------------------------------ c backend


@pytest.mark.parametrize("cls, args, c_in", [(ADown, (16, 24), 16), (ADown, (18, 10), 18),
                                             (SPPELAN, (16, 12, 8), 16), (SPPELAN, (13, 10, 6), 13)])
def test_c_block_channels_last_matches_torch(cls, args, c_in):
    torch.manual_seed(3)
    assert_c_block_matches_torch(cls(*args).train(), torch.randn(2, c_in, 11, 9) * 2 + 0.5)


def test_only_supported_maxpools_use_the_op():
    child = layers.Plain(torch.zeros(1, 2, 8, 8))
    assert layers._max_geometry(nn.MaxPool2d(5, 1, 2)) == (5, 1, 2)
    assert layers._max_geometry(nn.MaxPool2d(3)) == (3, 3, 0)
    for m in (nn.MaxPool2d(3, 2, 1, ceil_mode=True), nn.MaxPool2d(3, 1, 1, dilation=2), nn.MaxPool2d((3, 5), 1),
              nn.MaxPool2d(3, (1, 2))):
        assert layers._max_geometry(m) is None
        node = layers.spatial(m, child)
        assert isinstance(node, Spatial) and node.grad is None  # torch's pool, re-run under autograd in backward
    node = layers.spatial(nn.MaxPool2d(5, 1, 2), child)
    assert node.grad_reads_x and node.fn.func is pool.max_pool2d


class _Counts:
    """Forward and backward calls of the max-pool op on real data, by phase (meta shape probes not counted)."""

    def __init__(self, monkeypatch):
        self.fwd, self.bwd, self.phase = collections.Counter(), collections.Counter(), "forward"
        real_f, real_b = pool._max_forward_impl, pool._max_backward_impl

        def f(x, *geom):
            self.fwd[self.phase] += x.device.type != "meta"
            return real_f(x, *geom)

        def b(x, g, *geom):
            self.bwd[self.phase] += 1
            return real_b(x, g, *geom)

        monkeypatch.setattr(pool, "_max_forward_impl", f)
        monkeypatch.setattr(pool, "_max_backward_impl", b)


def _old_max_pool(child, k, s, p):
    """The path before this op: torch's F.max_pool2d, re-run under autograd in Spatial.backward."""
    return Spatial(lambda t: F.max_pool2d(t, k, s, p), child)


def _step(name, monkeypatch, direct, counts=None):
    if not direct:
        monkeypatch.setattr(layers, "_max_pool", _old_max_pool)
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
def test_model_gradients_unchanged(name, monkeypatch):
    """A whole c-backend training step: every parameter gradient bit for bit as with torch's max pool re-run
    under autograd (float32: the same maxima and the same sums in the same order)."""
    direct = _step(name, monkeypatch, True)
    base = _step(name, monkeypatch, False)
    assert direct.keys() == base.keys() and len(direct) > 0
    for n in direct:
        assert torch.equal(direct[n], base[n]), n


def _rerun_max_pool(child, k, s, p):
    """The op without Spatial's direct gradient: Spatial.backward re-runs its forward under autograd."""
    return Spatial(functools.partial(pool.max_pool2d, k=k, s=s, p=p), child)


def _counted(monkeypatch, direct, run):
    counts = _Counts(monkeypatch)
    if not direct:
        monkeypatch.setattr(layers, "_max_pool", _rerun_max_pool)
    run(counts)
    monkeypatch.undo()
    return counts


def _model_step(counts):
    _step("yolov9-t", None, True, counts)


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
@pytest.mark.parametrize("shape, layout", CUDA_CASES)
@pytest.mark.parametrize("geom", GEOMS)
def test_cuda_matches_torch_and_cpu(geom, shape, layout, dtype):
    x = make_x(shape, layout, dtype, device="cuda")
    x[0, 0, 1, 1] = float("nan")
    y, gi, g = check_op(x, *geom)
    xc = make_x(shape, layout, dtype)
    xc[0, 0, 1, 1] = float("nan")
    assert same_values(y.cpu(), pool.max_pool2d(xc, *geom)), "CUDA forward differs from the C CPU implementation"
    assert torch.equal(gi.cpu(), pool.max_pool2d_backward(xc, g.cpu(), *geom)), "CUDA backward differs from CPU"


@pytest.mark.cuda
def test_cuda_aligned_slice_and_side_stream():
    base = torch.randn(2, 48, 12, 12, device="cuda").half().contiguous(memory_format=torch.channels_last)
    check_op(base[:, 8:40], 5, 1, 2)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = pool.max_pool2d(base, 3, 2, 1)
        gi = pool.max_pool2d_backward(base, torch.ones_like(y), 3, 2, 1)
    s.synchronize()
    assert torch.equal(y, F.max_pool2d(base, 3, 2, 1)) and gi.shape == base.shape


@pytest.mark.cuda
@pytest.mark.parametrize("geom", GEOMS)
def test_cuda_index_matches_cpu(geom):
    """The raw binding on both devices (channels-last float16: the vector kernels, the compile-time ones for
    3×3/2 and 5×5/1): the same window argmaxes in index and the same gradient bits."""
    k, s, p = geom
    x = make_x((2, 16, 9, 11), "cl", torch.float16)
    x[1, 2, 3, 4] = float("nan")
    g = torch.randn(F.max_pool2d(x, k, s, p).shape).half().contiguous(memory_format=torch.channels_last)
    got = []
    for dev in ("cpu", "cuda"):
        xd, gd = x.to(dev), g.to(dev)
        ix = torch.full(g.shape, 255, dtype=torch.uint8, device=dev).contiguous(memory_format=torch.channels_last)
        gi = torch.empty_like(xd)
        C_EXT.max_pool2d_backward(extension.arg(xd), extension.arg(gd), extension.arg(ix), extension.arg(gi), k, s,
                                  p, extension.stream_of(xd.device))
        got.append((ix.cpu(), gi.cpu()))
    assert torch.equal(got[0][0], got[1][0]), "index differs between CUDA and CPU"
    assert torch.equal(got[0][1], got[1][1]), "grad_in differs between CUDA and CPU"


@pytest.mark.cuda
def test_cuda_backward_in_graph():
    """The backward (index scratch from torch's allocator, two kernels) captured in a CUDA graph: a replay
    recomputes it from the current grad_out."""
    x = make_x((2, 64, 20, 20), "cl", torch.float16, device="cuda", ties=False)
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
        assert ulps(got, torch_backward(x.double(), g.double(), *geom).half(), torch.float16) <= 1
