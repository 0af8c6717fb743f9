"""Benchmark of the pool and upsampling kernels (kernels/pool.cu via yolov9c/ops/pool.py) against torch's ops and
their autograd backwards on the same tensors, with a copy of the same tensor as the ceiling.

Ops: the 2×2 stride-1 average pool, the k×k max pool (ADown 3×3/2, SPPELAN 5×5/1) and (--ops upsample) the
nearest 2× upsampling, at the shapes the c backend calls per training step at batch 64, 640 (found by hooking
a forward of each model). One JSON line per (shape, layout, impl, pass): impl "copy" | "c" | "torch"; ms = GPU
time per call (--calls calls in one CUDA graph, median of --reps replays); gbps; pct_copy = % of the copy's
gbps. Then a table and, per model, one training step's pool time against torch's ops on the same calls.
Layouts: "cl", "nchw", "cl_slice". Without CUDA it prints a message and exits 0.

Run (GPU): python benchmarks/bench_pool.py
           python benchmarks/bench_pool.py --ops max --layouts cl
           python benchmarks/bench_pool.py --ops upsample --layouts cl nchw --dtype float16
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # runs from a checkout without installing
from gpu_timing import add_args, copy_row, emit, gpu_ms, make_input  # noqa: E402
from yolov9c.ops import pool

# (model, pool input shape, calls per training step) at batch 64, 640
CALLS = [
    ("yolov9-c", (64, 128, 160, 160), 4), ("yolov9-c", (64, 256, 80, 80), 4), ("yolov9-c", (64, 128, 80, 80), 2),
    ("yolov9-c", (64, 256, 40, 40), 6),
    ("yolov9-s", (64, 64, 160, 160), 1), ("yolov9-s", (64, 128, 80, 80), 2), ("yolov9-s", (64, 192, 40, 40), 2),
]
LAYOUTS = ["cl", "nchw", "cl_slice"]
# (model, max pool input shape, (k, s, p), calls per forward, backward calls per pool) at batch 64, 640
MAX_CALLS = [
    ("yolov9-c", (64, 128, 159, 159), (3, 2, 1), 2, 1), ("yolov9-c", (64, 256, 79, 79), (3, 2, 1), 2, 1),
    ("yolov9-c", (64, 128, 79, 79), (3, 2, 1), 1, 1), ("yolov9-c", (64, 256, 39, 39), (3, 2, 1), 3, 1),
    ("yolov9-c", (64, 256, 20, 20), (5, 1, 2), 3, 2),
    ("yolov9-s", (64, 128, 20, 20), (5, 1, 2), 6, 2),
]

# (model, upsampling input shape, calls per forward) at batch 64, 640
UP_CALLS = [
    ("yolov9-c", (64, 512, 20, 20), 2), ("yolov9-c", (64, 512, 40, 40), 1), ("yolov9-c", (64, 256, 40, 40), 1),
    ("yolov9-s", (64, 256, 20, 20), 2), ("yolov9-s", (64, 192, 40, 40), 2),
]


def timed(fn, args):
    return gpu_ms(fn, args.calls, args.reps, args.warmup)


def report(shape, layout, dtype, impl, name, timing, elements, elem_bytes, copy_gbps):
    return emit(shape, layout, dtype, impl, name, timing, elements * elem_bytes, copy_gbps)


def bench_copy(shape, dtype, args):
    return copy_row(shape, dtype, args.calls, args.reps, args.warmup)


def bench_case(shape, layout, dtype, args, cg):
    B, C, H, W = shape
    n_in, n_out = B * C * H * W, B * C * (H - 1) * (W - 1)
    x = make_input(shape, layout, dtype, 0)
    g = make_input((B, C, H - 1, W - 1), layout, dtype, 1)
    eb = x.element_size()
    rows = [report(shape, layout, dtype, "c", "forward", timed(lambda: pool.avg_pool2x2(x), args), n_in + n_out,
                   eb, cg),
            report(shape, layout, dtype, "c", "backward", timed(lambda: pool.avg_pool2x2_backward(g), args),
                   n_in + n_out, eb, cg)]
    if not args.no_torch:
        rows.append(report(shape, layout, dtype, "torch", "forward",
                           timed(lambda: F.avg_pool2d(x, 2, 1, 0, False, True), args), n_in + n_out, eb, cg))
        rows.append(report(shape, layout, dtype, "torch", "backward",
                           timed(lambda: torch.ops.aten.avg_pool2d_backward(g, x, [2, 2], [1, 1], [0, 0], False,
                                                                            True, None), args),
                           n_in + n_out, eb, cg))
    return rows


def bench_max_case(shape, geom, layout, dtype, args, cg):
    k, s, p = geom
    B, C, H, W = shape
    x = make_input(shape, layout, dtype, 0)
    out, idx = F.max_pool2d(x, k, s, p, return_indices=True)
    g = make_input(tuple(out.shape), layout, dtype, 1)
    n_in, n_out, eb, tag = x.numel(), out.numel(), x.element_size(), f"max{k}s{s}"
    rows = [report(shape, layout, dtype, "c", f"{tag}_forward", timed(lambda: pool.max_pool2d(x, k, s, p), args),
                   n_in + n_out, eb, cg),
            report(shape, layout, dtype, "c", f"{tag}_backward",
                   timed(lambda: pool.max_pool2d_backward(x, g, k, s, p), args), 2 * n_in + n_out, eb, cg)]
    if not args.no_torch:
        rows.append(report(shape, layout, dtype, "torch", f"{tag}_forward",
                           timed(lambda: F.max_pool2d(x, k, s, p), args), n_in + n_out, eb, cg))
        rows.append(report(shape, layout, dtype, "torch", f"{tag}_backward",
                           timed(lambda: torch.ops.aten.max_pool2d_with_indices_backward(
                               g, x, [k, k], [s, s], [p, p], [1, 1], False, idx), args), 2 * n_in + n_out, eb, cg))
    return rows


def bench_up_case(shape, layout, dtype, args, cg):
    B, C, H, W = shape
    x = make_input(shape, layout, dtype, 0)
    g = make_input((B, C, 2 * H, 2 * W), layout, dtype, 1)
    n, eb = 5 * x.numel(), x.element_size()
    rows = [report(shape, layout, dtype, "c", "up2_forward", timed(lambda: pool.upsample_nearest2x(x), args), n,
                   eb, cg),
            report(shape, layout, dtype, "c", "up2_backward", timed(lambda: pool.upsample_nearest2x_backward(g),
                                                                    args), n, eb, cg)]
    if not args.no_torch:
        rows.append(report(shape, layout, dtype, "torch", "up2_forward",
                           timed(lambda: F.interpolate(x, scale_factor=2.0, mode="nearest"), args), n, eb, cg))
        rows.append(report(shape, layout, dtype, "torch", "up2_backward",
                           timed(lambda: torch.ops.aten.upsample_nearest2d_backward(
                               g, [2 * H, 2 * W], list(shape), 2.0, 2.0), args), n, eb, cg))
    return rows


def max_step_estimate(rows, calls):
    """Max-pool GPU time of one training step per model (channels-last rows), c vs the former torch path."""
    t = {(tuple(r["shape"]), r["impl"], r["pass"]): r["ms"] for r in rows if r["layout"] == "cl"}
    for model in sorted({m for m, *_ in calls}):
        c = old = 0.0
        for m, shape, (k, s, _), n, b in calls:
            f, bw = f"max{k}s{s}_forward", f"max{k}s{s}_backward"
            if m != model or (shape, "c", f) not in t:
                continue
            c += n * (2 * t[shape, "c", f] + b * t[shape, "c", bw])
            if (shape, "torch", f) in t:
                old += n * ((2 + b) * t[shape, "torch", f] + b * t[shape, "torch", bw])
        row = {"model": model, "step_max_pool_ms_c": round(c, 3), "step_max_pool_ms_torch_path": round(old, 3) or None}
        print(json.dumps(row), flush=True)


def summary(rows):
    print(f"{'shape':22} {'layout':9} {'impl':6} {'pass':15} {'ms':>9} {'GB/s':>7} {'% copy':>7}")
    for r in rows:
        print(f"{str(tuple(r['shape'])):22} {r['layout']:9} {r['impl']:6} {r['pass']:15} {r['ms']:9.4f} "
              f"{r['gbps']:7.0f} {r.get('pct_copy', 100.0):7.1f}")


def step_estimate(rows, calls):
    """Pool GPU time of one training step per model (channels-last rows), c vs the former torch path."""
    t = {(tuple(r["shape"]), r["impl"], r["pass"]): r["ms"] for r in rows if r["layout"] == "cl"}
    for model in sorted({m for m, _, _ in calls}):
        c = old = 0.0
        for m, shape, n in calls:
            if m != model or (shape, "c", "forward") not in t:
                continue
            c += n * (2 * t[shape, "c", "forward"] + t[shape, "c", "backward"])
            if (shape, "torch", "forward") in t:
                old += n * (3 * t[shape, "torch", "forward"] + t[shape, "torch", "backward"])
        row = {"model": model, "step_pool_ms_c": round(c, 3), "step_pool_ms_torch_path": round(old, 3) or None}
        print(json.dumps(row), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(ap, LAYOUTS, "the yolov9-s/c batch-64 calls", "torch's rows")
    ap.add_argument("--ops", nargs="*", default=["avg", "max"], choices=["avg", "max", "upsample"],
                    help="which pools (--shapes: each shape through the avg pool and both max-pool geometries); "
                         "upsample: the nearest 2x upsampling (--shapes: its input shapes)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_pool: no CUDA GPU here; nothing measured (run it on a GPU machine)")
        return 0
    calls = CALLS if not args.shapes else []
    shapes = ([tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes
              else list(dict.fromkeys(s for _, s, _ in CALLS)))
    dtype = getattr(torch, args.dtype)
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    rows = []
    if "avg" in args.ops:
        for shape in shapes:
            copy = bench_copy(shape, dtype, args)
            rows.append(copy)
            for layout in args.layouts:
                rows += bench_case(shape, layout, dtype, args, copy["gbps"])
                torch.cuda.empty_cache()
    max_calls = MAX_CALLS if not args.shapes else []
    max_cases = ([(shape, geom) for _, shape, geom, _, _ in MAX_CALLS] if not args.shapes
                 else [(shape, geom) for shape in shapes for geom in ((3, 2, 1), (5, 1, 2))])
    if "max" in args.ops:
        for shape, geom in max_cases:
            copy = bench_copy(shape, dtype, args)
            rows.append(copy)
            for layout in args.layouts:
                rows += bench_max_case(shape, geom, layout, dtype, args, copy["gbps"])
                torch.cuda.empty_cache()
    if "upsample" in args.ops:
        up_shapes = shapes if args.shapes else list(dict.fromkeys(s for _, s, _ in UP_CALLS))
        for B, C, H, W in up_shapes:
            copy = bench_copy((B, C, 2 * H, 2 * W), dtype, args)
            rows.append(copy)
            for layout in args.layouts:
                rows += bench_up_case((B, C, H, W), layout, dtype, args, copy["gbps"])
                torch.cuda.empty_cache()
    summary(rows)
    if "avg" in args.ops:
        step_estimate(rows, calls)
    max_step_estimate(rows, max_calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
