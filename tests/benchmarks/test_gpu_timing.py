"""benchmarks/gpu_timing.py (shared by bench_bn_silu.py and bench_pool.py): the layouts of its inputs, checked
on the CPU; the timing itself needs a GPU (tested by running the benchmarks there)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_timing  # noqa: E402


@pytest.mark.parametrize("layout", ["cl", "nchw", "cl_slice", "nchw_slice"])
def test_make_input_layouts(layout):
    t = gpu_timing.make_input((2, 3, 4, 5), layout, torch.float32, 0, device="cpu")
    assert t.shape == (2, 3, 4, 5)
    if layout == "cl":
        assert t.is_contiguous(memory_format=torch.channels_last) and t.stride(1) == 1
    elif layout == "nchw":
        assert t.is_contiguous()
    elif layout == "cl_slice":   # channels [3, 6) of a channels-last (2, 6, 4, 5) buffer: pixel stride 6
        assert t.stride() == (120, 1, 30, 6) and t.storage_offset() == 3
    else:                        # channels [3, 6) of an NCHW (2, 6, 4, 5) buffer
        assert t.stride() == (120, 20, 5, 1) and t.storage_offset() == 60
    again = gpu_timing.make_input((2, 3, 4, 5), layout, torch.float32, 0, device="cpu")
    assert torch.equal(t, again)   # seeded


@pytest.mark.parametrize("script", ["bench_bn_silu.py", "bench_pool.py"])
def test_benchmarks_take_the_shared_options(script):
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for opt in ("--shapes", "--layouts", "--dtype", "--calls", "--reps", "--warmup", "--no-torch"):
        assert opt in r.stdout


def test_kernel_times_per_call_longest_first():
    """kernel_times (bench_step's profile, bench_bn_silu --kernels): the profiled ops of `calls` calls, time per
    call, longest first; on the CPU (cuda=False) the ops' self time, so a call doing one big matmul and one
    tiny add lists both, the matmul first, and the times do not grow with the number of calls."""
    torch.set_num_threads(1)
    a, b, c = torch.randn(256, 256), torch.randn(256, 256), torch.randn(4)

    def fn():
        torch.mm(a, b)
        c.add(1.0)

    rows = gpu_timing.kernel_times(fn, 6, cuda=False)
    names = [n for n, _ in rows]
    assert "aten::mm" in names and "aten::add" in names
    assert [ms for _, ms in rows] == sorted((ms for _, ms in rows), reverse=True)
    assert names.index("aten::mm") < names.index("aten::add")
    # per call, not summed over the calls (summed, 24 calls would read 4x 6 calls); the fastest of three
    # profiles of each, as a busy shared CPU stretches single ones (one read 1.41 ms against 0.42)
    mm = min(dict(gpu_timing.kernel_times(fn, 6, cuda=False))["aten::mm"] for _ in range(3))
    mm_more = min(dict(gpu_timing.kernel_times(fn, 24, cuda=False))["aten::mm"] for _ in range(3))
    assert 0 < mm < 50 and mm_more < 3 * mm
