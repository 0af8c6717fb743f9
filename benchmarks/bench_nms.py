"""Benchmark of class-aware NMS: yolov9c.ops.nms.nms (C CPU / CUDA) against nms_reference (stock torch) and,
when installed, torchvision.ops.batched_nms (what the published YOLOv9 val/detect code calls).

Prints one JSON line per configuration (device, n boxes, classes, dtype):
    ms_fused / ms_reference / ms_torchvision   median wall-clock ms per call, host sync included (every
                                               NMS reads the kept count back), after warm-up
    kept, reference_agree, torchvision_agree   kept count; whether the kept indices equal (in order)
    peak_mib_fused / peak_mib_torchvision      CUDA peak memory allocated by the call beyond its inputs
Inputs: boxes in clusters of about 300 (heavy overlap, like raw detector output), uniform scores and classes.
Results go into benchmarks/RESULTS.md (machine, date, commit, command).

Run: python benchmarks/bench_nms.py                      (CUDA if available, and CPU)
     python benchmarks/bench_nms.py --devices cpu --n 1000 3000 --reps 5
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # runs from a checkout without installing
from yolov9c.ops.nms import nms, nms_reference  # noqa: E402
from yolov9c.units import MIB  # noqa: E402

try:
    from torchvision.ops import batched_nms as tv_batched_nms   # optional comparison, not a dependency
except Exception:   # noqa: BLE001 - any import problem just means "not available"
    tv_batched_nms = None


def clustered(n, n_classes, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = max(10, n // 300)   # about 300 candidates per object, as raw detector output
    centres = torch.rand(k, 2, generator=g) * 640
    sizes = 20 + torch.rand(k, 2, generator=g) * 100
    which = torch.randint(0, k, (n,), generator=g)
    xy = centres[which] + torch.randn(n, 2, generator=g) * sizes[which] * 0.15
    wh = sizes[which] * (1 + 0.25 * torch.randn(n, 2, generator=g)).clamp(min=0.2)
    boxes = torch.cat([xy - wh / 2, xy + wh / 2], 1).to(device, dtype)
    scores = torch.rand(n, generator=g).to(device, dtype)
    classes = torch.randint(0, n_classes, (n,), generator=g).to(device)
    return boxes, scores, classes


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, reps, warmup):
    for _ in range(warmup):
        out = fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return out, statistics.median(times)


def peak_mib(fn, device):
    if device.type != "cuda":
        return None
    sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return round((torch.cuda.max_memory_allocated(device) - base) / MIB, 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", nargs="+", default=["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"])
    ap.add_argument("--n", nargs="+", type=int, default=[1000, 5000, 30000])
    ap.add_argument("--classes", nargs="+", type=int, default=[1, 80])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float16"])
    ap.add_argument("--iou", type=float, default=0.7, help="IoU threshold (val_dual.py's default is 0.7)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--ref-max-n", type=int, default=30000, help="skip the torch reference above this n")
    ap.add_argument("--cpu-max-n", type=int, default=30000, help="skip CPU configurations above this n")
    args = ap.parse_args()

    for dev_name in args.devices:
        device = torch.device(dev_name)
        for n in args.n:
            if device.type == "cpu" and n > args.cpu_max_n:
                continue
            for ncls in args.classes:
                for dt_name in args.dtypes:
                    dtype = getattr(torch, dt_name)
                    boxes, scores, classes = clustered(n, ncls, dtype, device)
                    cls = classes if ncls > 1 else None

                    def fused():
                        return nms(boxes, scores, args.iou, cls)

                    kept, ms_fused = timed(fused, device, args.reps, warmup=3)
                    row = dict(op="nms", device=str(device), n=n, classes=ncls, dtype=dt_name, iou=args.iou,
                               kept=len(kept), ms_fused=round(ms_fused, 3), reps=args.reps,
                               peak_mib_fused=peak_mib(fused, device))
                    if n <= args.ref_max_n:
                        # The reference is one Python iteration per kept box: slow, so few repetitions.
                        ref_reps = 1 if n >= 5000 else min(args.reps, 3)
                        ref, ms_ref = timed(lambda: nms_reference(boxes, scores, args.iou, cls), device,
                                            ref_reps, warmup=0)
                        row.update(ms_reference=round(ms_ref, 3), reference_agree=torch.equal(ref, kept))
                    if tv_batched_nms is not None and not (device.type == "cpu" and dtype == torch.float16):
                        def tv():
                            return tv_batched_nms(boxes, scores, classes if ncls > 1 else torch.zeros_like(classes),
                                                  args.iou)

                        try:
                            tv_kept, ms_tv = timed(tv, device, args.reps, warmup=3)
                            row.update(ms_torchvision=round(ms_tv, 3), torchvision_agree=torch.equal(tv_kept, kept),
                                       peak_mib_torchvision=peak_mib(tv, device))
                        except RuntimeError as e:   # e.g. an op not built for this device
                            row.update(torchvision_error=str(e).splitlines()[0][:120])
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
