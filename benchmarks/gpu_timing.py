"""What the kernel micro-benchmarks share (bench_bn_silu.py, bench_pool.py; bench_step.py's profile): input tensors
in the layouts they compare, GPU time per call without the host's launch gaps, the time per kernel under
torch.profiler, and the JSON row with GB/s and % of a copy.

Layouts: "cl" channels-last, "nchw" contiguous, "cl_slice" / "nchw_slice" channels [C, 2C) of a (B, 2C, H, W)
buffer in that layout (a concat slice: pixel stride 2C, or plane offset C·H·W).
"""

import json
import statistics

import torch


def add_args(ap, layouts, shapes_help, torch_help):
    """The options both micro-benchmarks take."""
    ap.add_argument("--shapes", nargs="*", default=None, help=f"B,C,H,W (default: {shapes_help})")
    ap.add_argument("--layouts", nargs="*", default=layouts, choices=layouts)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--calls", type=int, default=10, help="calls per captured graph")
    ap.add_argument("--reps", type=int, default=10, help="timed replays (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true", help=f"skip {torch_help}")


def make_input(shape, layout, dtype, seed, device="cuda"):
    """A seeded normal tensor of `shape` in `layout`."""
    B, C, H, W = shape
    g = torch.Generator(device=device).manual_seed(seed)
    if layout in ("cl_slice", "nchw_slice"):
        buf = torch.randn(B, 2 * C, H, W, device=device, dtype=dtype, generator=g)
        if layout == "cl_slice":
            buf = buf.contiguous(memory_format=torch.channels_last)
        return buf[:, C:]
    t = torch.randn(shape, device=device, dtype=dtype, generator=g)
    return t.contiguous(memory_format=torch.channels_last) if layout == "cl" else t


def events_ms(fn, count):
    """ms of `count` calls of fn back to back on the current stream, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def gpu_ms(fn, calls, reps, warmup, graph=True):
    """(ms per call, "graph" | "loop"): `calls` calls captured in one CUDA graph and replayed, median of `reps`
    replays (no host launch gaps); "loop": the calls back to back between events (graph=False, e.g. an
    autograd backward that cannot be captured, or a failed capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if graph:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(calls):
                    fn()
            g.replay()
            torch.cuda.synchronize()
            return statistics.median(events_ms(g.replay, 1) / calls for _ in range(reps)), "graph"
        except Exception as e:   # a capture can fail (an op that syncs); time the calls back to back instead
            print(json.dumps({"note": f"graph capture failed ({type(e).__name__}: {e}); loop timing"}), flush=True)
            torch.cuda.synchronize()
    return statistics.median(events_ms(fn, calls) / calls for _ in range(reps)), "loop"


def kernel_times(fn, calls, cuda=True, counts=False):
    """[(name, ms per call)], longest first, of what `calls` calls of fn run under torch.profiler: the CUDA
    kernels (the GPU spans of user annotations such as `Optimizer.step#SGD.step` left out: they would count
    their kernels twice), or with cuda=False the CPU ops' self time (the CPU test's case). counts=True: (name,
    ms per call, runs per call) — for kernels, the launches a call makes (each costs the host a launch)."""
    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(calls):
            fn()
        sync()
    ka = prof.key_averages()
    if cuda:
        attr = "self_device_time_total" if hasattr(ka[0], "self_device_time_total") else "self_cuda_time_total"
        rows = [(e.key, getattr(e, attr), e.count) for e in ka
                if e.device_type == torch.autograd.DeviceType.CUDA and "#" not in e.key]
    else:
        rows = [(e.key, e.self_cpu_time_total, e.count) for e in ka
                if e.device_type == torch.autograd.DeviceType.CPU]
    out = sorted(((k, us / 1000 / calls, n / calls) for k, us, n in rows if us > 0), key=lambda r: -r[1])
    return out if counts else [(k, ms) for k, ms, _ in out]


def emit(shape, layout, dtype, impl, name, timing, nbytes, copy_gbps):
    """Print and return one JSON row: timing = (ms, how); gbps = nbytes / time; pct_copy against copy_gbps."""
    ms, how = timing
    gbps = nbytes / ms / 1e6
    row = {"shape": list(shape), "layout": layout, "dtype": str(dtype).replace("torch.", ""), "impl": impl,
           "pass": name, "ms": round(ms, 4), "gbps": round(gbps, 1), "timing": how}
    if copy_gbps:
        row["pct_copy"] = round(100 * gbps / copy_gbps, 1)
    print(json.dumps(row), flush=True)
    return row


def copy_row(shape, dtype, calls, reps, warmup):
    """The ceiling: dst.copy_(src) of a contiguous `shape` tensor (bytes read + written)."""
    src = torch.randn(shape, device="cuda", dtype=dtype)
    dst = torch.empty_like(src)
    return emit(shape, "contiguous", dtype, "copy", "copy", gpu_ms(lambda: dst.copy_(src), calls, reps, warmup),
                2 * src.numel() * src.element_size(), None)
