"""Datasets that dev/accuracy/bench_accuracy.py derives from a small YOLO dataset (coco128) before training.

- `class_subset`: a copy keeping only some classes, renumbered (bench_accuracy.py --classes).
- `crop_dataset`: crops around the large objects of a few classes, so the objects fill much of each image
  (bench_accuracy.py --derive crops); see its docstring for how it is built and bench_accuracy.py's for counts.

Both read `train:` and `val:` image folders (labels beside them in labels/), write a new dataset under OUT and
return its data.yaml (absolute `path`, so the published code resolves it too). Tested by
dev/tests/test_bench_accuracy.py.
"""

import csv
import os
import shutil
from pathlib import Path

import cv2
import numpy as np
import yaml

SPLITS = ("train", "val")
FILL = (0.3, 0.8)        # the anchor object's longer side over the crop's side, drawn uniformly
MIN_SIDE = (96, 32)      # an anchor's longer / shorter side in source pixels at least
CROPS_PER_ANCHOR = {"train": 3, "val": 1}  # the training default; bench_accuracy.py --crops-per-anchor
MIN_VISIBLE = 0.4        # a box cut by the crop is kept when this share of its area is inside
MIN_CLIPPED_PX = 4       # ... and both its clipped sides are this many pixels at least
N_CLASSES = 3            # classes chosen when none are given
JPEG_QUALITY = 95


def dataset_split_dirs(data):
    """(cfg, {split: (images dir, labels dir)}) of a data.yaml whose train: and val: are image folders."""
    data = Path(data)
    cfg = yaml.safe_load(data.read_text())
    root = Path(cfg.get("path") or ".")
    root = root if root.is_absolute() else (data.parent / root).resolve()
    dirs = {}
    for split in SPLITS:
        images = root / cfg[split]
        if not images.is_dir():
            raise SystemExit(f"error: {data}: {split}: must be an image folder to derive a dataset ({images} is not)")
        dirs[split] = (images, Path(str(images).replace(f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}")))
    return cfg, dirs


def class_names(cfg):
    return cfg["names"] if isinstance(cfg["names"], dict) else dict(enumerate(cfg["names"]))


def read_labels(path):
    """(N, 5) float64 rows (class, x, y, w, h normalized) of a label file; empty when it is missing."""
    rows = [r.split()[:5] for r in (path.read_text().splitlines() if path.is_file() else []) if r.split()]
    return np.array(rows, dtype=np.float64).reshape(-1, 5)


def write_yaml(dst, names):
    f = dst / "data.yaml"
    f.write_text(yaml.safe_dump({"path": str(dst), "train": "images/train", "val": "images/val",
                                 "nc": len(names), "names": dict(enumerate(names))}, sort_keys=False))
    return f


def class_subset(data, classes, out):
    """A copy of the dataset (images copied, not linked: the loaders find labels by the image's path) whose
    labels keep only `classes` (list of ids), renumbered 0..n-1 in that order; images left without a box stay
    as backgrounds. Both codes then train and validate on the same files. Returns the new yaml."""
    cfg, dirs = dataset_split_dirs(data)
    new = {c: i for i, c in enumerate(classes)}
    dst = Path(out) / "data-classes"
    for split, (images, labels) in dirs.items():
        (dst / "images" / split).mkdir(parents=True, exist_ok=True)
        (dst / "labels" / split).mkdir(parents=True, exist_ok=True)
        for im in sorted(images.iterdir()):
            shutil.copyfile(im, dst / "images" / split / im.name)
            src = labels / f"{im.stem}.txt"
            rows = src.read_text().splitlines() if src.is_file() else []
            rows = [" ".join([str(new[int(r.split()[0])])] + r.split()[1:]) for r in rows
                    if r.split() and int(r.split()[0]) in new]
            (dst / "labels" / split / f"{im.stem}.txt").write_text("".join(r + "\n" for r in rows))
    return write_yaml(dst, [class_names(cfg)[c] for c in classes])


def pixel_boxes(rows, w, h):
    """(N, 5) class, x1, y1, x2, y2 in pixels of normalized xywh label rows."""
    c, x, y, bw, bh = rows.T
    return np.stack([c, (x - bw / 2) * w, (y - bh / 2) * h, (x + bw / 2) * w, (y + bh / 2) * h], 1)


def is_anchor(boxes):
    """Boxes large enough to crop around: longer side >= MIN_SIDE[0] px, shorter >= MIN_SIDE[1]."""
    bw, bh = boxes[:, 3] - boxes[:, 1], boxes[:, 4] - boxes[:, 2]
    return (np.maximum(bw, bh) >= MIN_SIDE[0]) & (np.minimum(bw, bh) >= MIN_SIDE[1])


def image_size(path):
    im = cv2.imread(str(path))
    if im is None:
        raise SystemExit(f"error: cannot read image {path}")
    return im.shape[1], im.shape[0]


def choose_classes(dirs, n=N_CLASSES):
    """The n classes with the most anchor-sized boxes in the split that has fewer of them (so that both the
    training and the held-out split hold many), ties by class id."""
    counts = {}
    for split, (images, labels) in dirs.items():
        c = {}
        for im in sorted(images.iterdir()):
            rows = read_labels(labels / f"{im.stem}.txt")
            if len(rows):
                boxes = pixel_boxes(rows, *image_size(im))
                for k in boxes[is_anchor(boxes), 0]:
                    c[int(k)] = c.get(int(k), 0) + 1
        counts[split] = c
    ids = set(counts["train"]) & set(counts["val"])
    return sorted(ids, key=lambda k: (-min(counts["train"][k], counts["val"][k]), k))[:n]


def crop_window(box, w, h, rng):
    """(x0, y0, cw, ch) integer crop of a w × h image holding `box` (x1, y1, x2, y2) whole: its longer side
    fills a fraction drawn from FILL of the crop's side (a square, cut to the image when larger), placed at a
    random offset."""
    x1, y1, x2, y2 = box
    side = max(x2 - x1, y2 - y1) / rng.uniform(*FILL)
    cw, ch = int(min(np.ceil(side), w)), int(min(np.ceil(side), h))
    # the crop's left edge: anywhere that keeps [x1, x2] inside it and the crop inside the image
    lo_x, hi_x = max(0, int(np.ceil(x2)) - cw), min(int(np.floor(x1)), w - cw)
    lo_y, hi_y = max(0, int(np.ceil(y2)) - ch), min(int(np.floor(y1)), h - ch)
    x0 = int(rng.integers(lo_x, max(lo_x, hi_x) + 1))
    y0 = int(rng.integers(lo_y, max(lo_y, hi_y) + 1))
    return x0, y0, cw, ch


def crop_labels(boxes, x0, y0, cw, ch):
    """Label rows (class, x, y, w, h normalized to the crop) of the boxes visible in the crop: clipped to it,
    kept when MIN_VISIBLE of the area is inside and both clipped sides are MIN_CLIPPED_PX or more."""
    c = boxes[:, 0]
    x1, x2 = np.clip(boxes[:, 1] - x0, 0, cw), np.clip(boxes[:, 3] - x0, 0, cw)
    y1, y2 = np.clip(boxes[:, 2] - y0, 0, ch), np.clip(boxes[:, 4] - y0, 0, ch)
    area = (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 4] - boxes[:, 2])
    vw, vh = x2 - x1, y2 - y1
    keep = (vw >= MIN_CLIPPED_PX) & (vh >= MIN_CLIPPED_PX) & (vw * vh >= MIN_VISIBLE * np.maximum(area, 1e-9))
    return np.stack([c, (x1 + x2) / 2 / cw, (y1 + y2) / 2 / ch, vw / cw, vh / ch], 1)[keep]


def crop_split(images, labels, dst, split, keep, seed, per_anchor):
    """Write `per_anchor` crops per anchor of one split; returns the manifest rows (name, source, anchor class,
    x0, y0, w, h)."""
    new = {c: i for i, c in enumerate(keep)}
    (dst / "images" / split).mkdir(parents=True, exist_ok=True)
    (dst / "labels" / split).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    manifest = []
    for im_path in sorted(images.iterdir()):
        rows = read_labels(labels / f"{im_path.stem}.txt")
        rows = rows[np.isin(rows[:, 0], keep)]
        if not len(rows):
            continue
        im = cv2.imread(str(im_path))
        h, w = im.shape[:2]
        boxes = pixel_boxes(rows, w, h)
        boxes[:, 0] = [new[int(k)] for k in boxes[:, 0]]
        for i in np.flatnonzero(is_anchor(boxes)):
            for k in range(per_anchor):
                x0, y0, cw, ch = crop_window(boxes[i, 1:], w, h, rng)
                name = f"{im_path.stem}_{i:02d}_{k:02d}"
                cv2.imwrite(str(dst / "images" / split / f"{name}.jpg"), im[y0:y0 + ch, x0:x0 + cw],
                            [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
                lab = crop_labels(boxes, x0, y0, cw, ch)
                (dst / "labels" / split / f"{name}.txt").write_text(
                    "".join(f"{int(r[0])} {r[1]:.6f} {r[2]:.6f} {r[3]:.6f} {r[4]:.6f}\n" for r in lab))
                manifest.append([name, im_path.name, int(boxes[i, 0]), x0, y0, cw, ch])
    return manifest


def crop_dataset(data, out, classes=None, seed=0, train_per_anchor=CROPS_PER_ANCHOR["train"]):
    """A new YOLO dataset OUT/data-crops of crops around the large objects of a few classes.

    Anchors: every box of a kept class whose longer side is >= 96 px and shorter >= 32 px in the source
    image. Classes: `classes` (list of ids), else the 3 with the most anchors in the split holding fewer of
    them. Each anchor gives `train_per_anchor` training crops (train; 3 unless given) or 1 (val), each a square whose side is the anchor's
    longer side over a fill drawn from U(0.3, 0.8), cut to the image, at a random offset that keeps the anchor
    whole. Labels: every kept-class box of the source clipped to the crop, kept when >= 40 % of its area is
    inside and both clipped sides are >= 4 px (other boxes cut by the crop are left unlabelled). Train crops
    come only from train: images, val crops only from val: images; names are SOURCE-STEM_BOX_K.jpg, and
    OUT/data-crops/sources.csv lists every crop's split, source image, anchor class and window. JPEG quality
    95; seeded by `seed` (one generator per split): the same seed writes the same files. Returns its yaml."""
    cfg, dirs = dataset_split_dirs(data)
    keep = list(classes) if classes else choose_classes(dirs)
    dst = Path(out) / "data-crops"
    if dst.exists():
        shutil.rmtree(dst)  # the crops of another seed or class list must not stay behind
    manifest = []
    for split, (images, labels) in dirs.items():
        n = train_per_anchor if split == "train" else CROPS_PER_ANCHOR["val"]
        manifest += [[split] + r for r in crop_split(images, labels, dst, split, keep, seed, n)]
    with open(dst / "sources.csv", "w", newline="") as f:
        csv.writer(f).writerows([["split", "name", "source", "anchor_class", "x0", "y0", "w", "h"]] + manifest)
    return write_yaml(dst, [class_names(cfg)[c] for c in keep])


def dataset_counts(data_yaml):
    """{split: {"images": n, "boxes": {class name: n}}} of a derived dataset (for the docs and the test)."""
    cfg, dirs = dataset_split_dirs(data_yaml)
    names = class_names(cfg)
    out = {}
    for split, (images, labels) in dirs.items():
        files = sorted(images.iterdir())
        boxes = {names[c]: 0 for c in names}
        for im in files:
            for k in read_labels(labels / f"{im.stem}.txt")[:, 0]:
                boxes[names[int(k)]] += 1
        out[split] = {"images": len(files), "boxes": boxes}
    return out
