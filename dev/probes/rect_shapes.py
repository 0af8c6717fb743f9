"""--rect batch shapes against the graph cap: the share of an epoch's batches that replay a CUDA graph when the
first shapes to come take the slots, and when slots are kept for the most frequent (graph_shapes.frequent_sizes).

    python dev/probes/rect_shapes.py                                   # coco128's photos resampled to 118k images
    python dev/probes/rect_shapes.py --images path/to/train --resample 0 --batch 64

The images' sizes are read (cv2), scaled to --img on their long side as the loader does, optionally resampled
with replacement to --resample images (each size jittered ±3 %, seeded), sorted by aspect and cut into batches as
the training loader does with --rect (yolov9c.data.rect). One JSON line: batches, distinct shapes, and the share
graphed first come and with kept slots, counting one key per shape (one box bucket). Test: dev/tests/test_rect_shapes.py.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from yolov9c.data.rect import rect_batch_shapes, rect_order  # noqa: E402
from yolov9c.engine.train.memory_plan import MAX_GRAPHS  # noqa: E402


def graphed_shares(sizes, batch, img, cap=MAX_GRAPHS):
    """sizes (n, 2) (h, w) as loaded → dict: batches, shapes, first_come and kept (share of batches graphed)."""
    sizes = np.asarray(sizes, np.float64)
    sizes = sizes[rect_order(sizes)]
    _, shapes = rect_batch_shapes(sizes, batch, img)
    order = [tuple(s) for s in shapes.tolist()]
    counts = collections.Counter(order)
    first = list(dict.fromkeys(order))[:cap]
    kept = [hw for hw, _ in counts.most_common(cap - 2)] if len(counts) > cap else list(counts)
    rest = [hw for hw in first if hw not in kept][:cap - len(kept)]  # rare shapes captured while slots were free
    n = len(order)
    return {"batches": n, "shapes": len(counts), "first_come": sum(counts[s] for s in first) / n,
            "kept": sum(counts[s] for s in set(kept) | set(rest)) / n}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", default=str(Path("/work/shared/data/coco128/images")))
    p.add_argument("--resample", type=int, default=118000, help="images drawn with replacement (0: as they are)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--img", type=int, default=640)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import cv2

    files = sorted(f for f in Path(args.images).rglob("*") if f.suffix.lower() in (".jpg", ".jpeg", ".png"))
    if not files:
        p.error(f"--images {args.images}: no images")
    sizes = np.array([cv2.imread(str(f)).shape[:2] for f in files], np.float64)
    sizes = np.round(sizes * (args.img / sizes.max(1, keepdims=True)))
    if args.resample:
        rng = np.random.default_rng(args.seed)
        sizes = sizes[rng.integers(0, len(sizes), args.resample)] * rng.uniform(0.97, 1.03, (args.resample, 1))
    print(json.dumps({"images": len(sizes), "batch": args.batch, **graphed_shares(sizes, args.batch, args.img)}))


if __name__ == "__main__":
    main()
