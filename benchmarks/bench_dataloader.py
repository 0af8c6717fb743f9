"""Benchmark of the training data loader: images/s of 640×640 mosaic training batches (published hyp:
mosaic 1.0, mixup 0.15, scale 0.9, HSV, flips) at a given worker count, through create_dataloader exactly as
training uses it (persistent workers, collate to uint8 CHW RGB + labels).

Data: a synthetic set (yolov9c/data/synthetic.py) of --images JPEGs of 640×640 with 10–40 shapes each,
generated once into the cache root ($YOLOV9C_CACHE or ~/.cache/yolov9c, or --cache-dir), with --polygons as
polygon labels (copy-paste then runs at the hyp's copy_paste, 0.3 published); or --data D.yaml to time another
dataset's train split. Timing: --warmup batches first (worker start-up, page cache), then the wall
time of --batches batches, epochs chained. Prints one JSON line: img_per_s, s_per_batch, main_cpu_ms_per_img
(CPU time of the main process per image: the whole cost with --workers 0, meaningful on a busy machine) and
the configuration.

--augment op-cuda / op-cpu times --gpu-augment's path (workers decode and draw, the augment op makes the pixels
in the main process); plan-only the workers' share of it alone.

Run: python benchmarks/bench_dataloader.py --workers 8 --batch 64 --imgsz 640 --batches 20
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a checkout without installing
import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from yolov9c.data.dataset import DatasetConfig  # noqa: E402
from yolov9c.data.dataset_yaml import load_data_config  # noqa: E402
from yolov9c.data.hyp import augment_hyp  # noqa: E402
from yolov9c.data.loader import LoaderConfig, create_dataloader  # noqa: E402
from yolov9c.data.synthetic import synthetic_dataset  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batches", type=int, default=20, help="timed batches")
    ap.add_argument("--warmup", type=int, default=3, help="untimed batches first")
    ap.add_argument("--images", type=int, default=512, help="size of the synthetic bench set")
    ap.add_argument("--cache", default=None, help="image cache: ram / disk (default none, as published)")
    ap.add_argument("--mosaic", type=float, default=None, help="override hyp mosaic")
    ap.add_argument("--mixup", type=float, default=None, help="override hyp mixup")
    ap.add_argument("--data", default=None, help="dataset yaml instead of the synthetic bench set")
    ap.add_argument("--polygons", action="store_true",
                    help="polygon labels in the synthetic bench set (copy-paste runs, hyp copy_paste 0.3)")
    ap.add_argument("--cache-dir", default=None, help="where the bench set is generated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--augment", default="cpu-pipeline", choices=("cpu-pipeline", "op-cpu", "op-cuda", "plan-only"),
                    help="who makes the pixels: the workers' OpenCV pipeline (default, as training without "
                         "--gpu-augment); the augment op in the main process on the CPU (C reference) or CUDA "
                         "(--gpu-augment); plan-only: the workers' share under --gpu-augment alone (decode + draws)")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    if args.data:
        cfg = load_data_config(args.data)
        source, nc, what = cfg["train"], cfg["nc"], args.data
    else:
        y = synthetic_dataset(seed=0, root=args.cache_dir, n_train=args.images, n_val=0, imgsz=640,
                              boxes=(10, 40), size=(0.03, 0.15), polygons=args.polygons, name="bench")
        cfg = load_data_config(y)
        kind = "polygons" if args.polygons else "boxes"
        source, nc, what = cfg["train"], cfg["nc"], f"synthetic bench set ({args.images} x 640x640, 10-40 {kind})"
    t_data = time.perf_counter() - t0

    hyp = augment_hyp(None, mosaic=args.mosaic, mixup=args.mixup)
    data = DatasetConfig(augment=True, hyp=hyp, cache=args.cache, stride=32, nc=nc, seed=args.seed)
    device = {"cpu-pipeline": None, "op-cpu": "cpu", "op-cuda": "cuda", "plan-only": "cpu"}[args.augment]
    opts = LoaderConfig(data, workers=args.workers, shuffle=True, augment_device=device)
    loader, ds = create_dataloader(source, args.imgsz, args.batch, opts, log=lambda s: None)
    if args.augment == "plan-only":
        loader.assemble = None  # the PlannedBatch as the workers hand it over

    def batches():
        while True:
            yield from loader

    it = batches()
    n_boxes = 0
    for _ in range(args.warmup):
        next(it)
    t = time.perf_counter()
    c = time.process_time()
    n_img = 0
    for _ in range(args.batches):
        batch = next(it)
        labels = batch.labels if args.augment == "plan-only" else batch[1]
        n_boxes += len(labels)
        n_img += len(batch) if args.augment == "plan-only" else batch[0].shape[0]
    if args.augment == "op-cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    cpu = time.process_time() - c
    print(json.dumps({
        "bench": "dataloader", "workers": loader.num_workers, "batch": args.batch, "imgsz": args.imgsz,
        "batches": args.batches, "img_per_s": round(n_img / dt, 1), "s_per_batch": round(dt / args.batches, 4),
        "boxes_per_img": round(n_boxes / n_img, 1),
        "main_cpu_ms_per_img": round(cpu / n_img * 1000, 2), "augment": args.augment, "cache": args.cache,
        "mosaic": hyp["mosaic"],
        "mixup": hyp["mixup"], "copy_paste": hyp["copy_paste"], "data": what, "dataset_images": len(ds), "setup_s": round(t_data, 1),
        "cpus": os.cpu_count(), "torch": torch.__version__, "opencv": cv2.__version__, "numpy": np.__version__,
        "python": platform.python_version(),
    }))


if __name__ == "__main__":
    main()
