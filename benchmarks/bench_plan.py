"""Measured points of the memory planner's table (yolov9c/engine/train/memory_plan.py COSTS).

    python benchmarks/bench_plan.py --models yolov9-s yolov9-c --backends c torch --batches 16 64

For each model and backend: the trainer's step (memory_plan.step_peak: uint8 input where accepted, AMP,
GradScaler, clip, SGD, EMA; 40 random boxes per image) at each batch, one JSON line per point (peak reserved
and allocated GiB), then one line with the fitted cost (fixed GiB, GiB per image at 640²) — the COSTS entry.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None):
    import os

    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["yolov9-s", "yolov9-c", "yolov9-e"])
    p.add_argument("--backends", nargs="+", default=["c", "torch"])
    p.add_argument("--batches", nargs="+", type=int, default=[16, 64])
    p.add_argument("--img", type=int, default=640)
    args = p.parse_args(argv)
    import torch

    from yolov9c.engine.train import memory_plan as mp

    torch.backends.cudnn.benchmark = True
    for model in args.models:
        for backend in args.backends:
            samples = []
            for b in args.batches:
                try:
                    reserved, alloc = mp.step_peak(model, backend, b, args.img, "cuda")
                except torch.cuda.OutOfMemoryError:
                    print(json.dumps({"model": model, "backend": backend, "batch": b, "status": "oom"}), flush=True)
                    continue
                samples.append((b * (args.img / mp.REF_IMG) ** 2, reserved))
                print(json.dumps({"model": model, "backend": backend, "batch": b, "img": args.img,
                                  "peak_reserved_gib": round(reserved, 3), "peak_alloc_gib": round(alloc, 3)}),
                      flush=True)
            if len(samples) >= 2:
                c = mp.fit(model, backend, samples)
                print(json.dumps({"model": model, "backend": backend, "fixed_gib": round(c.fixed_gib, 3),
                                  "per_image_gib": round(c.per_image_gib, 4)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
