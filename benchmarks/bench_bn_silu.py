"""Benchmark of the fused BatchNorm/SiLU CUDA kernels (kernels/bn_silu.cu through yolov9c/ops/bn_silu.py)
against torch's BatchNorm2d (training mode) + SiLU on the same tensors, with the copy bandwidth of the same
GPU measured in the same run as the ceiling.

Prints one JSON line per (shape, layout, pass), after one line for the copy:
    impl        "copy" (dst.copy_(src) of the largest tensor: bytes read + written), "c" (yolov9c ops: bn_stats,
                bn_silu, bn_silu_backward) or "torch" (BatchNorm2d + F.silu under autocast)
    pass        c: "stats" | "forward" | "backward"; torch: "forward" (stats + normalise + SiLU) | "backward"
    ms          GPU time per call: `--calls` calls captured in one CUDA graph, replayed, median over `--reps`
                replays (timing "graph"); "loop": the calls back to back between events (torch's rows, and a
                failed capture)
    gbps        bytes moved / time, counting each pass's minimal traffic over z-sized tensors:
                stats 1 read; forward 1 read + 1 write; backward 2 reads (reduction) + 2 reads + 1 write
                (elementwise); torch forward counted as c stats + forward, torch backward as c backward
    pct_copy    gbps as % of the copy's
Layouts: "cl" channels-last, "nchw" contiguous, "cl_slice" channels [C, 2C) of a channels-last (B, 2C, H, W)
buffer (a concat slice, row stride 2C), "nchw_slice" the same of an NCHW buffer.
Run (GPU): python benchmarks/bench_bn_silu.py
           python benchmarks/bench_bn_silu.py --shapes 64,32,320,320 --layouts cl --reps 10
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # runs from a checkout without installing
from yolov9c.ops import bn_silu as ops

SHAPES = [(64, 32, 320, 320), (64, 128, 160, 160), (64, 256, 80, 80), (64, 512, 40, 40)]
LAYOUTS = ["cl", "nchw", "cl_slice", "nchw_slice"]


def make(shape, layout, dtype, seed):
    B, C, H, W = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    if layout in ("cl_slice", "nchw_slice"):
        buf = torch.randn(B, 2 * C, H, W, device="cuda", dtype=dtype, generator=g)
        if layout == "cl_slice":
            buf = buf.contiguous(memory_format=torch.channels_last)
        return buf[:, C:]
    t = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    return t.contiguous(memory_format=torch.channels_last) if layout == "cl" else t


def _events(fn, count):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def timed(fn, calls, reps, warmup, graph=True):
    """(ms per call, "graph" | "loop"): GPU time without the host's launch gaps (graph), or of `calls` calls
    back to back (loop: torch's rows, whose autograd backward cannot be captured)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if not graph:
        return statistics.median(_events(fn, calls) / calls for _ in range(reps)), "loop"
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        return statistics.median(_events(graph.replay, 1) / calls for _ in range(reps)), "graph"
    except Exception as e:   # a capture can fail (an op that syncs); time the calls back to back instead
        print(json.dumps({"note": f"graph capture failed ({type(e).__name__}: {e}); loop timing"}), flush=True)
        torch.cuda.synchronize()
        return statistics.median(_events(fn, calls) / calls for _ in range(reps)), "loop"


def report(shape, layout, dtype, impl, name, timing, passes, elem_bytes, copy_gbps):
    ms, how = timing
    nbytes = passes * shape[0] * shape[1] * shape[2] * shape[3] * elem_bytes
    gbps = nbytes / ms / 1e6
    row = {"shape": list(shape), "layout": layout, "dtype": str(dtype).replace("torch.", ""), "impl": impl,
           "pass": name, "ms": round(ms, 4), "gbps": round(gbps, 1), "timing": how}
    if copy_gbps:
        row["pct_copy"] = round(100 * gbps / copy_gbps, 1)
    print(json.dumps(row), flush=True)
    return row


def bench_copy(shape, dtype, args):
    src = torch.randn(shape, device="cuda", dtype=dtype)
    dst = torch.empty_like(src)
    row = report(shape, "contiguous", dtype, "copy", "copy", timed(lambda: dst.copy_(src), args.calls, args.reps,
                                                                  args.warmup), 2, src.element_size(), None)
    return row["gbps"]


def bench_case(shape, layout, dtype, args, copy_gbps):
    C = shape[1]
    z = make(shape, layout, dtype, 0)
    gy = make(shape, layout, dtype, 1)
    w = torch.rand(C, device="cuda") + 0.5
    b = torch.rand(C, device="cuda") - 0.5
    rm, rv = torch.zeros(C, device="cuda"), torch.ones(C, device="cuda")
    eb = z.element_size()
    t = (args.calls, args.reps, args.warmup)
    rows = []

    mean, invstd = ops.bn_stats(z, rm, rv)
    rows.append(report(shape, layout, dtype, "c", "stats", timed(lambda: ops.bn_stats(z, rm, rv), *t), 1, eb,
                       copy_gbps))
    out = torch.empty_like(z)
    rows.append(report(shape, layout, dtype, "c", "forward",
                       timed(lambda: ops.bn_silu(z, mean, invstd, w, b, out=out), *t), 2, eb, copy_gbps))
    dz = torch.empty_like(z)
    rows.append(report(shape, layout, dtype, "c", "backward",
                       timed(lambda: ops.bn_silu_backward(z, mean, invstd, w, b, gy, dz=dz), *t), 5, eb, copy_gbps))
    if args.no_torch:
        return rows

    bn = torch.nn.BatchNorm2d(C, momentum=0.03, eps=1e-3).cuda().train()
    zt = z.detach().clone(memory_format=torch.preserve_format).requires_grad_()

    def fwd():
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            return F.silu(bn(zt))

    rows.append(report(shape, layout, dtype, "torch", "forward", timed(fwd, *t, graph=False), 3, eb, copy_gbps))
    y = fwd()
    rows.append(report(shape, layout, dtype, "torch", "backward",
                       timed(lambda: torch.autograd.grad(y, (zt, bn.weight, bn.bias), gy, retain_graph=True), *t,
                             graph=False), 5, eb, copy_gbps))
    return rows


def summary(rows, copy_gbps):
    print(f"copy {copy_gbps:.0f} GB/s; c passes, GB/s (% of copy):")
    for r in rows:
        if r["impl"] == "c":
            print(f"  {tuple(r['shape'])!s:22} {r['layout']:10} {r['pass']:8} {r['ms']:8.4f} ms "
                  f"{r['gbps']:7.0f} GB/s ({r.get('pct_copy', 0):5.1f} %)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=None, help="B,C,H,W (default: the yolov9-s batch-64 sizes)")
    ap.add_argument("--layouts", nargs="*", default=LAYOUTS, choices=LAYOUTS)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--calls", type=int, default=10, help="calls per captured graph")
    ap.add_argument("--reps", type=int, default=10, help="timed replays (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true", help="skip the BatchNorm2d + SiLU rows")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_bn_silu: needs a CUDA GPU")
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] if args.shapes else SHAPES
    dtype = getattr(torch, args.dtype)
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    copy_gbps = bench_copy(max(shapes, key=lambda s: s[0] * s[1] * s[2] * s[3]), dtype, args)
    rows = []
    for shape in shapes:
        for layout in args.layouts:
            rows += bench_case(shape, layout, dtype, args, copy_gbps)
            torch.cuda.empty_cache()
    summary(rows, copy_gbps)


if __name__ == "__main__":
    main()
