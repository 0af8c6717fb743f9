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


def test_kernel_times_per_call_longest_first(monkeypatch):
    """kernel_times (bench_step's profile, bench_bn_silu --kernels): the profiled ops of `calls` calls, time per
    call, longest first; on the CPU (cuda=False) the ops' self time. The logic runs on a stand-in profiler with
    fixed totals (no time is asserted: a busy shared CPU stretches measured ones), then a real profile of a call
    doing a matmul and an add lists both."""
    import torch.profiler

    class Event:
        device_type = torch.autograd.DeviceType.CPU

        def __init__(self, key, self_cpu_time_total, count=6):
            self.key, self.self_cpu_time_total, self.count = key, self_cpu_time_total, count

    class FixedProfile:   # totals in microseconds over all the calls; an op of zero time is left out
        def __init__(self, activities):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def key_averages(self):
            return [Event("aten::add", 600.0, 12), Event("aten::mm", 6000.0), Event("aten::empty", 0.0),
                    Event("aten::copy_", 1200.0, 18)]

    with monkeypatch.context() as m:
        m.setattr(torch.profiler, "profile", FixedProfile)
        rows = gpu_timing.kernel_times(lambda: None, 6, cuda=False)
        assert [n for n, _ in rows] == ["aten::mm", "aten::copy_", "aten::add"]
        assert [ms for _, ms in rows] == pytest.approx([1.0, 0.2, 0.1])   # ms per call: total / 1000 / 6
        assert dict(gpu_timing.kernel_times(lambda: None, 24, cuda=False))["aten::mm"] == pytest.approx(0.25)
        counted = gpu_timing.kernel_times(lambda: None, 6, cuda=False, counts=True)
        assert [(n, c) for n, _, c in counted] == [("aten::mm", 1.0), ("aten::copy_", 3.0), ("aten::add", 2.0)]

    torch.set_num_threads(1)
    a, b, c = torch.randn(64, 64), torch.randn(64, 64), torch.randn(4)

    def fn():
        torch.mm(a, b)
        c.add(1.0)

    rows = gpu_timing.kernel_times(fn, 2, cuda=False)
    assert {"aten::mm", "aten::add"} <= {n for n, _ in rows} and all(ms > 0 for _, ms in rows)
    assert [ms for _, ms in rows] == sorted((ms for _, ms in rows), reverse=True)
