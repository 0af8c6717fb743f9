"""Tests of yolov9c._C.cudnn_fusion_probe (csrc/cudnn_fusion.c): which fused GELAN convolution graphs cuDNN 9 can
plan. CPU: build_info's cudnn entry, the argument checks (they run before anything touches cuDNN), and the clear
RuntimeError of a build without cuDNN. CUDA (a GPU and a build with cuDNN headers): the result's structure for
every pattern, and that the plain convolution (the probe's own control) is planned.

Run: python -m pytest -q tests/test_cudnn_fusion.py
"""

import re

import pytest
import torch

from yolov9c.ops import extension

C = extension.load()
PATTERNS = {"conv_fprop", "conv_genstats", "conv_reduction", "ssr_conv", "ssa_conv", "ssa_sigmoid_conv",
            "ssa_conv_genstats", "wgrad", "ssa_wgrad", "dgrad", "dgrad_dswish", "dgrad_dswish_stats"}
SMALL = (2, 16, 8, 8, 16, 3, 3, 1)   # (N, C, H, W, K, R, S, stride)


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
