"""Benchmark of the YOLOv9 training loss (assigner + loss, forward + backward): the torch reference
(make_loss backend "torch") against the c path (backend "c": det_loss_decode + tal_assign + det_loss).

Inputs: the outputs of a dual (yolov9-*) head, two branches of three maps (B, 64 + nc, H, W) at strides
8/16/32, random logits in --dtype (float16 = what AMP gives the loss), requires_grad; N boxes per image with
uniform centres and sides in [0.01, 0.3] of the image. One JSON line per (batch, image size, nc, boxes,
backend): ms_median (one forward + backward, synchronised, over --reps after --warmup), peak_extra_gib (peak
allocated beyond the head outputs and targets, the maps' gradients included), peak_extra_no_grads_gib (the
same less those gradients, which any loss produces), peak_reserved_gib, items ([box, cls, dfl] of the first
step: the backends should agree).

Run: python benchmarks/bench_loss.py --markdown                     (GPU: batch 64, 640, nc 80, 20/160/1000 boxes)
     python benchmarks/bench_loss.py --device cpu --batch 2 --imgsz 128 --boxes 5 20 --reps 2 --warmup 1
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # runs from a checkout without installing
from yolov9c.loss.detection import DetectionLoss

from yolov9c.units import GIB  # noqa: E402


def head_outputs(batch, imgsz, nc, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(imgsz // s, imgsz // s) for s in (8, 16, 32)]
    return [[(torch.randn(batch, 64 + nc, h, w, generator=g) * 2).to(device=device, dtype=dtype).requires_grad_(True)
             for h, w in shapes] for _ in range(2)]


def random_targets(batch, n, nc, device, seed=0):
    g = torch.Generator().manual_seed(seed + 1)
    img = torch.arange(batch).repeat_interleave(n).float()[:, None]
    cls = torch.randint(0, nc, (batch * n, 1), generator=g).float()
    wh = torch.rand(batch * n, 2, generator=g) * 0.29 + 0.01
    xy = wh / 2 + torch.rand(batch * n, 2, generator=g) * (1 - wh)
    return torch.cat([img, cls, xy, wh], 1).to(device)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_one(backend, batch, imgsz, nc, n, dtype, device, reps, warmup):
    preds = head_outputs(batch, imgsz, nc, dtype, device)
    targets = random_targets(batch, n, nc, device)
    maps = [m for b in preds for m in b]
    grad_bytes = sum(m.numel() * m.element_size() for m in maps)
    loss_fn = DetectionLoss(nc, 16, [8, 16, 32], backend=backend, dual=True)
    row = {"device": str(device), "backend": backend, "batch": batch, "imgsz": imgsz, "nc": nc, "boxes_per_img": n,
           "dtype": str(dtype).replace("torch.", "")}

    def step():
        for m in maps:
            m.grad = None
        total, items = loss_fn(preds, targets)
        total.backward()
        return items

    try:
        for _ in range(warmup):
            step()
        for m in maps:
            m.grad = None
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        times, items = [], None
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            it = step()
            sync(device)
            times.append((time.perf_counter() - t0) * 1000)
            items = items if items is not None else it.tolist()
        row.update(ms_median=round(statistics.median(times), 3), items=[round(x, 6) for x in items])
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device) - base
            row.update(peak_extra_gib=round(peak / GIB, 4), peak_extra_no_grads_gib=round((peak - grad_bytes) / GIB, 4),
                       peak_reserved_gib=round(torch.cuda.max_memory_reserved(device) / GIB, 3),
                       head_outputs_gib=round(grad_bytes / GIB, 4))
    except torch.cuda.OutOfMemoryError:
        row.update(error="out of memory")
    return row


def markdown(rows):
    out = [("| boxes/img | backend | ms (median) | extra GiB (peak − head outputs) | extra w/o map grads | "
            "reserved GiB | loss items |"), "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['boxes_per_img']} | {r['backend']} | {r['error']} | | | | |")
            continue
        out.append(f"| {r['boxes_per_img']} | {r['backend']} | {r['ms_median']:.1f} | {r.get('peak_extra_gib', '-')} | "
                   f"{r.get('peak_extra_no_grads_gib', '-')} | {r.get('peak_reserved_gib', '-')} | "
                   f"{', '.join(f'{x:.4f}' for x in r['items'])} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--nc", type=int, default=80)
    ap.add_argument("--boxes", type=int, nargs="+", default=[20, 160, 1000])
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--backends", nargs="+", default=["torch", "c"], choices=["torch", "c"])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--markdown", action="store_true", help="also print a markdown table at the end")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    rows = []
    for n in args.boxes:
        for backend in args.backends:
            row = bench_one(backend, args.batch, args.imgsz, args.nc, n, dtype, device, args.reps, args.warmup)
            if device.type == "cuda":
                torch.cuda.empty_cache()   # the next row starts from the same empty cache
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.markdown:
        print(f"\nbatch {args.batch}, {args.imgsz}x{args.imgsz}, nc {args.nc}, {args.dtype} dual-head outputs, "
              f"{device}\n")
        print(markdown(rows))


if __name__ == "__main__":
    main()
