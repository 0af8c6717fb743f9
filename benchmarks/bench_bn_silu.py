"""Benchmark of the fused BatchNorm/SiLU CUDA kernels (kernels/bn_silu.cu through yolov9c/ops/bn_silu.py)
against torch's BatchNorm2d (training mode) + SiLU on the same tensors.

Prints one JSON line per (shape, layout, pass):
    impl        "c" (yolov9c ops: bn_stats, bn_silu, bn_silu_backward) or "torch" (BatchNorm2d + F.silu)
    pass        c: "stats" | "forward" | "backward"; torch: "forward" (stats + normalise + SiLU) | "backward"
    ms          median GPU time per call (CUDA events, after warm-up)
    gbps        bytes moved / time, counting each pass's minimal traffic over z-sized tensors:
                stats 1 read; forward 1 read + 1 write; backward 2 reads (reduction) + 2 reads + 1 write
                (elementwise); torch forward counted as c stats + forward, torch backward as c backward
Layouts: "cl" channels-last, "nchw" contiguous, "cl_slice" channels [C, 2C) of a channels-last (B, 2C, H, W)
buffer (a concat slice, row stride 2C). The H200 reads/writes ~4 TB/s.
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
LAYOUTS = ["cl", "nchw", "cl_slice"]


def make(shape, layout, dtype, seed):
    B, C, H, W = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    if layout == "cl_slice":
        buf = torch.randn(B, 2 * C, H, W, device="cuda", dtype=dtype, generator=g)
        return buf.contiguous(memory_format=torch.channels_last)[:, C:]
    t = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    return t.contiguous(memory_format=torch.channels_last) if layout == "cl" else t


def timed(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def report(shape, layout, dtype, impl, name, ms, passes, elem_bytes):
    nbytes = passes * shape[0] * shape[1] * shape[2] * shape[3] * elem_bytes
    print(json.dumps({"shape": list(shape), "layout": layout, "dtype": str(dtype).replace("torch.", ""),
                      "impl": impl, "pass": name, "ms": round(ms, 4), "gbps": round(nbytes / ms / 1e6, 1)}),
          flush=True)


def bench_case(shape, layout, dtype, reps, warmup):
    C = shape[1]
    z = make(shape, layout, dtype, 0)
    gy = make(shape, layout, dtype, 1)
    w = torch.rand(C, device="cuda") + 0.5
    b = torch.rand(C, device="cuda") - 0.5
    rm, rv = torch.zeros(C, device="cuda"), torch.ones(C, device="cuda")
    eb = z.element_size()

    mean, invstd = ops.bn_stats(z, rm, rv)
    report(shape, layout, dtype, "c", "stats", timed(lambda: ops.bn_stats(z, rm, rv), reps, warmup), 1, eb)
    out = torch.empty_like(z)
    report(shape, layout, dtype, "c", "forward",
           timed(lambda: ops.bn_silu(z, mean, invstd, w, b, out=out), reps, warmup), 2, eb)
    dz = torch.empty_like(z)
    report(shape, layout, dtype, "c", "backward",
           timed(lambda: ops.bn_silu_backward(z, mean, invstd, w, b, gy, dz=dz), reps, warmup), 5, eb)

    bn = torch.nn.BatchNorm2d(C, momentum=0.03, eps=1e-3).cuda().train()
    zt = z.detach().clone(memory_format=torch.preserve_format).requires_grad_()

    def fwd():
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            return F.silu(bn(zt))

    report(shape, layout, dtype, "torch", "forward", timed(fwd, reps, warmup), 3, eb)
    y = fwd()
    report(shape, layout, dtype, "torch", "backward",
           timed(lambda: torch.autograd.grad(y, (zt, bn.weight, bn.bias), gy, retain_graph=True), reps, warmup),
           5, eb)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=None, help="B,C,H,W (default: the yolov9-s batch-64 sizes)")
    ap.add_argument("--layouts", nargs="*", default=LAYOUTS, choices=LAYOUTS)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_bn_silu: needs a CUDA GPU")
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] if args.shapes else SHAPES
    dtype = getattr(torch, args.dtype)
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    for shape in shapes:
        for layout in args.layouts:
            bench_case(shape, layout, dtype, args.reps, args.warmup)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
