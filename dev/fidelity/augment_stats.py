"""Distribution check of --gpu-augment: the same training batches built by the CPU pipeline (workers run mosaic,
warp, mixup, HSV, flips with OpenCV) and by the augment op (workers only decode and draw; here the op's C
reference on the CPU), measured with the fidelity harness's statistics (stats.py: boxes per image, box side and
aspect, class histogram, pixel mean/std, grey share, sharpness) plus the mosaic rate (the mixup draws are the
same by construction: the labels of mixed items, both halves, come out identical).

    python dev/fidelity/augment_stats.py                          # tests/assets/coco24 and synthetic, 320 px
    python dev/fidelity/augment_stats.py --data ../shared/data/coco128/images/train --imgsz 640 --batches 8

`compare(source, imgsz, batches)` gives the rows; dev/tests/test_augment_stats.py asserts them (boxes identical,
every pixel statistic |z| < 0.5). Not a speed measure (benchmarks/bench_train.py is).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import stats  # noqa: E402

from yolov9c.data.dataset import DatasetConfig  # noqa: E402
from yolov9c.data.hyp import augment_hyp  # noqa: E402
from yolov9c.data.loader import LoaderConfig, create_dataloader  # noqa: E402

# scratch-high with mixup and rotation, shear, perspective on, so that every path of the op is measured
HYP_OVERRIDES = {"mixup": 0.5, "degrees": 10.0, "shear": 2.0, "perspective": 0.0005, "mosaic": 0.8}


def _summary(loader, batches):
    items, mosaic, n = [], 0, 0
    for k, (imgs, labels, _, shapes) in zip(range(batches), loader):
        items += stats.batch_items(imgs.numpy(), labels.numpy())
        mosaic += sum(s is None for s in shapes)
        n += len(shapes)
    out = stats.summarize(items)
    out["mosaic_rate"] = [mosaic / max(n, 1), float("nan")]
    return out


def compare(source, imgsz=320, batches=4, batch_size=16, seed=0, workers=0):
    """Rows (metric, augment op, cpu pipeline, z or distance, kind) for `batches` batches of `source`."""
    hyp = augment_hyp()
    hyp.update(HYP_OVERRIDES)
    summaries = []
    for device in (None, "cpu"):
        data = DatasetConfig(augment=True, hyp=hyp, seed=seed, label_cache=False)
        cfg = LoaderConfig(data, workers=workers, shuffle=True, pin_memory=False, augment_device=device)
        loader, _ = create_dataloader(source, imgsz, batch_size, cfg, log=lambda *a: None)
        summaries.append(_summary(loader, batches))
        loader.close()
    cpu, op = summaries
    return stats.compare_summaries(op, cpu)  # mosaic_rate among the rows: a [mean, nan] pair


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", nargs="*", default=["coco24", "synthetic"])
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args(argv)
    for name in args.data:
        if name == "coco24":
            sys.path.insert(0, str(REPO / "tests"))
            from repo_assets import COCO24

            source = str(COCO24 / "images" / "train")
        elif name == "synthetic":
            from yolov9c.data.synthetic import synthetic_dataset

            source = str(synthetic_dataset(0).parent / "images" / "train")
        else:
            source = name
        rows = compare(source, args.imgsz, args.batches, args.batch_size)
        print(f"\n{name}: {args.batches} x {args.batch_size} images at {args.imgsz}, seed 0 "
              f"(hyp scratch-high + {HYP_OVERRIDES})")
        print(f"{'metric':22s} {'augment op':>12s} {'CPU pipeline':>12s} {'z / distance':>12s}")
        for metric, a, b, z, kind in rows:
            if kind == "tv":
                print(f"{metric:22s} {'':>12s} {'':>12s} {z:12.4f}  (total variation; flagged above {b:.3f})")
            else:
                print(f"{metric:22s} {a:12.4f} {b:12.4f} {z:12.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
