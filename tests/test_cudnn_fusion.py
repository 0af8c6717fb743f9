"""Tests of yolov9c._C.cudnn_fusion_probe and cudnn_fusion_time (csrc/cudnn_fusion.c): which fused GELAN
convolution graphs cuDNN 9 can plan, and running them on torch tensors. CPU: build_info's cudnn entry, the
argument checks of both bindings (they run before anything touches cuDNN or a GPU: the CUDA tensors here are
descriptor tuples with made-up addresses that are never dereferenced), and the clear RuntimeError of a build
without cuDNN. CUDA (a GPU and a build with cuDNN headers): the probe's result for every pattern, the plain
convolution planned; a timed conv_fprop equals F.conv2d and conv_genstats' sums equal those of its output.

Tolerances (fp16 storage, fp32 accumulation in cuDNN and in the fp32 torch reference of the same fp16 inputs):
y within atol 2e-2 + rtol 1e-2 (one fp16 rounding of |y| ~ 1 plus summation order); the per-channel sums of y and
y^2 over N·H·W within 2e-3 of the sum of |y| (resp. y^2) plus 1e-3 (fp32 sums of the unrounded accumulators).

Run: python -m pytest -q tests/test_cudnn_fusion.py
"""

import re

import numpy as np
import pytest
import torch

from yolov9c.ops import extension
from yolov9c.ops.cudnn_fusion import time_pattern

C = extension.load()
PATTERNS = {"conv_fprop", "conv_genstats", "conv_reduction", "ssr_conv", "ssa_conv", "ssa_sigmoid_conv",
            "ssa_conv_genstats", "ssr_conv_genstats_io", "ssa_conv_io", "ssa_conv_genstats_io", "wgrad",
            "ssa_wgrad", "ssr_wgrad_io",
            "dgrad", "dgrad_dswish", "dgrad_dswish_stats"}
SMALL = (2, 16, 8, 8, 16, 3, 3, 1)   # (N, C, H, W, K, R, S, stride)
ADDR = 1 << 20                       # a made-up, 16-byte aligned device address (never dereferenced)


def built_with_cudnn():
    return C.build_info()["cudnn"] != "absent"


def test_build_info_says_whether_cudnn_is_compiled_in():
    info = C.build_info()
    assert info["cudnn"] == "absent" or re.fullmatch(r"headers 9\.\d+\.\d+", info["cudnn"]), info["cudnn"]
    if not info["cuda"]:
        assert info["cudnn"] == "absent"   # the cuDNN part needs the CUDA build


@pytest.mark.parametrize("conv, dtype, device, error, match", [
    ((2, 16, 8, 8, 16, 3, 3), C.DTYPE_FLOAT16, 0, TypeError, r"conv must be a tuple of 8"),
    ([2, 16, 8, 8, 16, 3, 3, 1.0], C.DTYPE_FLOAT16, 0, TypeError, r"conv's stride must be an int, got float"),
    ((2, 0, 8, 8, 16, 3, 3, 1), C.DTYPE_FLOAT16, 0, ValueError, r"conv's C must be in \[1, 2\^31\], got 0"),
    ((2, 16, 8, 8, 16, 3, 3, True), C.DTYPE_FLOAT16, 0, TypeError, r"conv's stride must be an int, got bool"),
    (SMALL, C.DTYPE_FLOAT32, 0, ValueError, r"dtype_code must be DTYPE_FLOAT16 or DTYPE_BFLOAT16"),
    (SMALL, C.DTYPE_FLOAT16, -1, ValueError, r"device must be a CUDA device index"),
    (SMALL, C.DTYPE_FLOAT16, "0", ValueError, r"device must be a CUDA device index"),
])
def test_bad_arguments_are_named(conv, dtype, device, error, match):
    with pytest.raises(error, match=r"^cudnn_fusion_probe: " + match):
        C.cudnn_fusion_probe(conv, dtype, device)


@pytest.mark.skipif(built_with_cudnn(), reason="this build has the cuDNN part")
def test_without_cudnn_the_probe_says_how_to_get_it():
    with pytest.raises(RuntimeError, match=r"^cudnn_fusion_probe: yolov9c._C was built without cuDNN .*"
                                           r"CUDNN_INCLUDE_DIR"):
        C.cudnn_fusion_probe(SMALL, C.DTYPE_FLOAT16, 0)


@pytest.mark.cuda
@pytest.mark.skipif(not built_with_cudnn(), reason="yolov9c._C built without cuDNN headers")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_probe_reports_every_pattern(dtype):
    device = torch.cuda.current_device()
    torch.zeros(1, device=device)
    out = C.cudnn_fusion_probe(SMALL, extension.dtype_code(dtype), device)
    assert set(out) == PATTERNS
    for name, r in out.items():
        assert set(r) == {"supported", "status", "engines", "tried", "mode", "workspace", "seconds"}, name
        assert isinstance(r["supported"], bool) and isinstance(r["status"], str) and r["status"], name
        assert isinstance(r["engines"], int) and r["engines"] >= 0 and r["tried"] >= 0, name
        if r["supported"]:
            assert r["status"] == "ok" and r["mode"] in ("A", "FALLBACK") and r["workspace"] >= 0, (name, r)
            assert 1 <= r["tried"] <= r["engines"], (name, r)
        else:
            assert r["status"] != "ok" and r["mode"] is None, (name, r)
            assert "CUDNN_STATUS" in r["status"] or "no engine config" in r["status"], (name, r)
        assert r["seconds"] >= 0.0
    # the plain convolution is the probe's own control: if it cannot be planned, the graph code is wrong
    assert out["conv_fprop"]["supported"], out["conv_fprop"]["status"]
    assert torch.cuda.current_device() == device


# ---------------------------------------------------------------- cudnn_fusion_time: argument checks (CPU)

def nhwc(shape, dtype=C.DTYPE_FLOAT16, addr=ADDR, device=0):
    """A CUDA descriptor tuple of a dense channels-last (N, C, H, W) tensor."""
    n, c, h, w = shape
    return (addr, dtype, shape, (c * h * w, 1, w * c, c), device)


def vec(n, dtype=C.DTYPE_FLOAT32, addr=ADDR, device=0):
    return (addr, dtype, (n,), (1,), device)


def fprop_tensors(**change):
    """(x, w, y) of conv_fprop at SMALL, with some replaced."""
    t = dict(x=nhwc((2, 16, 8, 8)), w=nhwc((16, 16, 3, 3)), y=nhwc((2, 16, 8, 8)))
    t.update(change)
    return (t["x"], t["w"], t["y"])


WS = (ADDR, C.DTYPE_UINT8, (1024,), (1,), 0)


def time_call(pattern="conv_fprop", tensors=None, workspace=WS, stream=0, iters=1, dtype=C.DTYPE_FLOAT16):
    return C.cudnn_fusion_time(SMALL, dtype, pattern, fprop_tensors() if tensors is None else tensors, workspace,
                               stream, iters)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(pattern="conv_silu"), ValueError,
     r"unknown pattern 'conv_silu'; the patterns are conv_fprop, .*dgrad_dswish"),
    (dict(pattern=3), TypeError, r"pattern must be a str \(one of conv_fprop, .*\), got int"),
    (dict(tensors=fprop_tensors()[:2]), TypeError, r"tensors must be a tuple of 3 \(x, w, y\), got 2 items"),
    (dict(pattern="conv_genstats"), TypeError, r"tensors must be a tuple of 5 \(x, w, y, sum, sqsum\), got 3"),
    (dict(tensors=fprop_tensors(x=nhwc((2, 16, 8, 8), C.DTYPE_FLOAT32))), TypeError,
     r"x must be float16, got float32"),
    (dict(tensors=fprop_tensors(w=nhwc((16, 16, 3, 3), C.DTYPE_BFLOAT16))), TypeError,
     r"w must be float16, got bfloat16"),
    (dict(dtype=C.DTYPE_FLOAT32), ValueError, r"dtype_code must be DTYPE_FLOAT16 or DTYPE_BFLOAT16"),
    (dict(tensors=fprop_tensors(y=np.zeros((2, 16, 8, 8), np.float16))), ValueError,
     r"y must be a CUDA tensor, got a CPU array"),
    (dict(tensors=fprop_tensors(y=nhwc((2, 16, 8, 8), device=1))), ValueError,
     r"y is on cuda:1 but the first tensor is on cuda:0"),
    (dict(tensors=fprop_tensors(y=nhwc((2, 8, 8, 8)))), ValueError, r"y must have size 16 in dimension 1"),
    (dict(tensors=fprop_tensors(x=(ADDR, C.DTYPE_FLOAT16, (2, 16, 8, 8), (1024, 64, 8, 1), 0))), ValueError,
     r"x must be dense channels-last .*channels_last"),
    (dict(tensors=fprop_tensors(x=nhwc((2, 16, 8, 8), addr=ADDR + 2))), ValueError,
     r"x data pointer is not aligned to 16 bytes"),
    (dict(tensors="xwy"), TypeError, r"tensors must be a tuple"),
    (dict(workspace=(ADDR, C.DTYPE_FLOAT32, (16,), (1,), 0)), TypeError, r"workspace must be uint8, got float32"),
    (dict(workspace=np.zeros(16, np.uint8)), ValueError, r"workspace must be a CUDA tensor, got a CPU array"),
    (dict(stream=-1), ValueError, r"stream must be a non-negative handle"),
    (dict(iters=0), ValueError, r"iters must be an int in \[1, 100000\]"),
    (dict(iters=True), ValueError, r"iters must be an int in \[1, 100000\]"),
])
def test_time_bad_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=r"^cudnn_fusion_time: " + match):
        time_call(**kwargs)


def test_time_checks_the_per_channel_tensors_of_a_pattern():
    x, w, y = fprop_tensors()
    good = (x, w, y, vec(16), vec(16))
    with pytest.raises(TypeError, match=r"^cudnn_fusion_time: sqsum must be float32, got float16"):
        time_call("conv_genstats", good[:4] + (vec(16, C.DTYPE_FLOAT16),))
    with pytest.raises(ValueError, match=r"^cudnn_fusion_time: sum must have size 16 in dimension 0"):
        time_call("conv_genstats", (x, w, y, vec(8), vec(16)))
    # the dgrad patterns take the statistics of the input channels, and z in the storage dtype
    z = nhwc((2, 16, 8, 8))
    with pytest.raises(TypeError, match=r"^cudnn_fusion_time: tensors must be a tuple of 8 \(dy, w, z, scale, "
                                        r"bias, dv, dv_sum, dvz_sum\)"):
        time_call("dgrad_dswish_stats", (y, w, z, vec(16), vec(16), z))
    # scale/bias are fp32, except in the ConvBNfprop/ConvBNwgrad controls ssr_*_io (the storage dtype)
    fp32_affine = (x, vec(16), vec(16), w, y, vec(16), vec(16))
    with pytest.raises(TypeError, match=r"^cudnn_fusion_time: scale must be float16, got float32"):
        time_call("ssr_conv_genstats_io", fp32_affine)
    with pytest.raises(TypeError, match=r"^cudnn_fusion_time: bias must be float32, got float16"):
        time_call("ssa_conv_io", (x, vec(16), vec(16, C.DTYPE_FLOAT16), w, y))


def test_time_arity():
    with pytest.raises(TypeError, match=r"cudnn_fusion_time\(\) takes exactly 7 positional arguments \(6 given\)"):
        C.cudnn_fusion_time(SMALL, C.DTYPE_FLOAT16, "conv_fprop", fprop_tensors(), WS, 0)


@pytest.mark.skipif(built_with_cudnn(), reason="this build has the cuDNN part")
def test_without_cudnn_time_says_how_to_get_it():
    with pytest.raises(RuntimeError, match=r"^cudnn_fusion_time: yolov9c._C was built without cuDNN .*"
                                           r"CUDNN_INCLUDE_DIR"):
        time_call()


# ---------------------------------------------------------------- cudnn_fusion_time on a GPU

def channels_last(*shape, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).half().contiguous(memory_format=torch.channels_last)


def run_timed(pattern, tensors, conv=SMALL, iters=3):
    return time_pattern(conv, pattern, tensors, iters)


def reference_conv(x, w):
    return torch.nn.functional.conv2d(x.float(), w.float(), padding=w.shape[2] // 2)


@pytest.mark.cuda
@pytest.mark.skipif(not built_with_cudnn(), reason="yolov9c._C built without cuDNN headers")
def test_timed_conv_fprop_equals_conv2d():
    torch.manual_seed(0)
    x, w = channels_last(2, 16, 8, 8), channels_last(16, 16, 3, 3, scale=0.1)
    y = torch.full_like(x, float("nan"))
    out = run_timed("conv_fprop", (x, w, y))
    assert out["status"] == "ok", out
    assert set(out) == {"status", "ms", "plan", "workspace", "mode", "seconds"}
    assert out["plan"] == "ok" and out["mode"] in ("A", "FALLBACK") and out["ms"] > 0.0, out
    torch.cuda.synchronize()
    torch.testing.assert_close(y.float(), reference_conv(x, w), atol=2e-2, rtol=1e-2)


@pytest.mark.cuda
@pytest.mark.skipif(not built_with_cudnn(), reason="yolov9c._C built without cuDNN headers")
def test_conv_genstats_sums_are_those_of_its_output():
    torch.manual_seed(1)
    x, w = channels_last(2, 16, 8, 8), channels_last(16, 16, 3, 3, scale=0.1)
    y = torch.empty_like(x)
    s, sq = torch.full((16,), float("nan"), device="cuda"), torch.full((16,), float("nan"), device="cuda")
    out = run_timed("conv_genstats", (x, w, y, s, sq), iters=1)
    if out["plan"] != "ok":
        pytest.skip(f"conv_genstats does not plan on this GPU: {out['plan']}")
    assert out["status"] == "ok", out
    torch.cuda.synchronize()
    ref = reference_conv(x, w).double()
    torch.testing.assert_close(y.double(), ref, atol=2e-2, rtol=1e-2)
    want_s, want_sq = ref.sum((0, 2, 3)), (ref * ref).sum((0, 2, 3))
    tol_s, tol_sq = 2e-3 * ref.abs().sum((0, 2, 3)) + 1e-3, 2e-3 * want_sq + 1e-3
    err_s, err_sq = (s.double() - want_s).abs(), (sq.double() - want_sq).abs()
    assert bool((err_s <= tol_s).all()), f"sum: worst error {float((err_s / tol_s).max()):.2f}x the tolerance"
    assert bool((err_sq <= tol_sq).all()), f"sqsum: worst error {float((err_sq / tol_sq).max()):.2f}x the tolerance"


@pytest.mark.cuda
@pytest.mark.skipif(not built_with_cudnn(), reason="yolov9c._C built without cuDNN headers")
def test_too_small_workspace_is_a_status_not_a_crash():
    torch.manual_seed(2)
    x, w = channels_last(2, 16, 8, 8), channels_last(16, 16, 3, 3)
    y = torch.empty_like(x)
    ws = torch.empty(0, dtype=torch.uint8, device="cuda")
    out = C.cudnn_fusion_time(SMALL, C.DTYPE_FLOAT16, "conv_fprop", tuple(extension.arg(t) for t in (x, w, y)),
                              extension.arg(ws), extension.stream_of(x.device), 1)
    if out["workspace"] > 0:
        assert out["status"] == f"workspace: the plan needs {out['workspace']} bytes, got 0" and out["ms"] is None
    else:
        assert out["status"] == "ok" and out["ms"] > 0.0, out
