"""Benchmark of the fused BatchNorm/SiLU kernels (kernels/bn_silu_*.cu via yolov9c/ops/bn_silu.py) against torch's
BatchNorm2d (training mode) + SiLU on the same tensors, with a copy of the same bytes as the ceiling.

One JSON line per (shape, layout, impl, pass), after one for the copy: impl "copy" | "c" (stats, forward,
backward) | "torch"; pass c "stats" | "forward" | "backward", torch "forward" | "backward"; ms = GPU time
per call (`--calls` calls in one CUDA graph, median of `--reps` replays; timing "loop" for torch's rows and a
failed capture); gbps = minimal traffic / time (stats 1 read, forward 1 read + 1 write, backward 2 + 2 reads +
1 write; torch forward counted as c stats + forward); pct_copy = gbps as % of the copy's. `--kernels` adds a
{"kind": "kernels"} line per c pass with its kernels' µs per call under torch.profiler (eager calls).
Layouts: "cl", "nchw", and "cl_slice" / "nchw_slice" (channels [C, 2C) of a (B, 2C, H, W) buffer).

Run (GPU): python benchmarks/bench_bn_silu.py
           python benchmarks/bench_bn_silu.py --shapes 64,512,40,40 --no-torch --kernels
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # runs from a checkout without installing
from gpu_timing import add_args, copy_row, emit, gpu_ms, kernel_times, make_input  # noqa: E402
from yolov9c.ops import bn_silu as ops

SHAPES = [(64, 32, 320, 320), (64, 128, 160, 160), (64, 256, 80, 80), (64, 512, 40, 40)]
LAYOUTS = ["cl", "nchw", "cl_slice", "nchw_slice"]


def timed(fn, calls, reps, warmup, graph=True):
    return gpu_ms(fn, calls, reps, warmup, graph)


def report(shape, layout, dtype, impl, name, timing, passes, elem_bytes, copy_gbps):
    """A row whose bytes are `passes` z-sized tensors."""
    nbytes = passes * shape[0] * shape[1] * shape[2] * shape[3] * elem_bytes
    return emit(shape, layout, dtype, impl, name, timing, nbytes, copy_gbps)


def bench_copy(shape, dtype, args):
    return copy_row(shape, dtype, args.calls, args.reps, args.warmup)["gbps"]


def bench_case(shape, layout, dtype, args, copy_gbps):
    C = shape[1]
    z = make_input(shape, layout, dtype, 0)
    gy = make_input(shape, layout, dtype, 1)
    w = torch.rand(C, device="cuda") + 0.5
    b = torch.rand(C, device="cuda") - 0.5
    rm, rv = torch.zeros(C, device="cuda"), torch.ones(C, device="cuda")
    eb = z.element_size()
    t = (args.calls, args.reps, args.warmup)
    rows = []

    mean, invstd = ops.stats(z, rm, rv)
    out, dz = torch.empty_like(z), torch.empty_like(z)
    passes = [("stats", lambda: ops.stats(z, rm, rv), 1),
              ("forward", lambda: ops.forward(ops.BN(z, mean, invstd, w, b), out=out), 2),
              ("backward", lambda: ops.backward(ops.BN(z, mean, invstd, w, b), gy, dz=dz), 5)]
    for name, fn, n in passes:
        rows.append(report(shape, layout, dtype, "c", name, timed(fn, *t), n, eb, copy_gbps))
        if args.kernels:
            kernels_row(shape, layout, name, fn, args.calls)
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


def kernels_row(shape, layout, name, fn, calls):
    """--kernels: the pass's kernels one by one (µs per call under torch.profiler, eager calls), e.g. a
    reduction's partial-sum kernel and its finish kernel."""
    ks = kernel_times(fn, calls)
    row = {"kind": "kernels", "shape": list(shape), "layout": layout, "pass": name,
           "kernels": [[k[:80], round(1000 * ms, 2)] for k, ms in ks], "sum_us": round(1000 * sum(ms for _, ms in ks), 2)}
    print(json.dumps(row), flush=True)


def summary(rows, copy_gbps):
    print(f"copy {copy_gbps:.0f} GB/s; c passes, GB/s (% of copy):")
    for r in rows:
        if r["impl"] == "c":
            print(f"  {tuple(r['shape'])!s:22} {r['layout']:10} {r['pass']:8} {r['ms']:8.4f} ms "
                  f"{r['gbps']:7.0f} GB/s ({r.get('pct_copy', 0):5.1f} %)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(ap, LAYOUTS, "the yolov9-s batch-64 sizes", "the BatchNorm2d + SiLU rows")
    ap.add_argument("--kernels", action="store_true",
                    help="also each c pass's kernels one by one (µs per call under torch.profiler)")
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
