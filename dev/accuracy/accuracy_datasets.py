"""Public real detection datasets for dev/accuracy/bench_accuracy.py, converted to the published YOLO layout.

    python dev/accuracy/accuracy_datasets.py --preset raccoon --src SRC --out /work/data_accuracy/raccoon

SRC is an export of the dataset's public repository; PRESETS names each one's images, annotations and class order
(raccoon, kangaroo, bccd, fruit). Other sets: --images, --annotations (VOC XML folder or CSV
filename,width,height,class,xmin,ymin,xmax,ymax) and --names. Output: OUT/images/{train,val}/,
OUT/labels/{train,val}/*.txt (class x y w h normalized), OUT/{train,val}.txt and OUT/data.yaml.
Split (per file): val when int(sha1(stem)[:8], 16) % 5 == 0, else train (~20 % val); a preset whose set ships its
own split (fruit: train_zip/train and test_zip/test) names one folder per split instead, and every file of a
folder goes to that folder's split (the hash rule is not used for it). Boxes are clipped to the
image; zero-size and <difficult> objects are dropped and counted; an inverted box, one more than 1 px outside,
an unknown class, a missing image or an unreadable annotation stops with one `error:` line before anything is
written. Images are copied byte for byte, except JPEGs not ending in FF D9, re-encoded at quality 100 so that
the published loader (which re-saves such files in place) and ours read the same pixels. Returns the counts.
Test: python -m pytest -q dev/tests/test_accuracy_datasets.py
"""

import argparse
import csv
import hashlib
import json
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import cv2
import numpy as np
import yaml

# the Kaggle set "Fruit Images for Object Detection": its own 240 train / 60 test photos, images and VOC XML together
FRUIT_SPLIT = {"train": "train_zip/train", "val": "test_zip/test"}
PRESETS = {  # name: (images folder, annotations: VOC XML folder, class names in id order); a set that ships its own
    # split gives {"train": folder, "val": folder} for both (its files keep that split; no hash rule)
    "raccoon": ("images", "annotations", ["raccoon"]),
    "kangaroo": ("images", "annots", ["kangaroo"]),
    "bccd": ("BCCD/JPEGImages", "BCCD/Annotations", ["RBC", "WBC", "Platelets"]),
    "fruit": (FRUIT_SPLIT, FRUIT_SPLIT, ["apple", "banana", "orange"]),
}
CSV_LABELS = {"raccoon": "data/raccoon_labels.csv"}  # --labels csv: the repository's own CSV export
VAL_MODULUS = 5          # val when the hash of the stem is 0 modulo this: ~20 %
OUTSIDE_TOL = 1.0        # px a corner may lie outside the image before it is an error
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


class AnnotationError(ValueError):
    """A bad annotation: the message names the file and what to fix."""


def split_of(stem):
    """'val' or 'train' for an image's file stem, by the fixed hash rule (no other file involved)."""
    return "val" if int(hashlib.sha1(stem.encode()).hexdigest()[:8], 16) % VAL_MODULUS == 0 else "train"


def read_voc(path):
    """([(class name, xmin, ymin, xmax, ymax)], number of difficult objects left out) of a VOC XML file, pixel
    floats; AnnotationError if unreadable."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        raise AnnotationError(f"{path}: not readable VOC XML ({e}): fix or remove the file")
    boxes, difficult = [], 0
    for i, obj in enumerate(root.iter("object")):
        if (obj.findtext("difficult") or "0").strip() == "1":
            difficult += 1
            continue
        name = obj.findtext("name")
        vals = [obj.findtext(f"bndbox/{k}") for k in ("xmin", "ymin", "xmax", "ymax")]
        try:
            boxes.append((name.strip(),) + tuple(float(v) for v in vals))
        except (TypeError, ValueError, AttributeError):
            raise AnnotationError(f"{path}: object {i}: needs <name> and numeric bndbox xmin/ymin/xmax/ymax "
                                  f"(got name {name!r}, {vals}): fix the object")
    return boxes, difficult


def read_csv(path):
    """{image file name: [(class, xmin, ymin, xmax, ymax)]} of a CSV with a header naming filename, class,
    xmin, ymin, xmax, ymax (other columns ignored); AnnotationError on a missing column or a bad number."""
    out = {}
    with open(path, newline="") as f:
        rows = csv.DictReader(f)
        need = ("filename", "class", "xmin", "ymin", "xmax", "ymax")
        missing = [k for k in need if k not in (rows.fieldnames or [])]
        if missing:
            raise AnnotationError(f"{path}: header lacks {', '.join(missing)}: the columns must be {', '.join(need)}")
        for n, r in enumerate(rows, 2):
            try:
                box = (r["class"].strip(),) + tuple(float(r[k]) for k in need[2:])
            except (TypeError, ValueError, AttributeError):
                raise AnnotationError(f"{path}: line {n}: non-numeric box {[r[k] for k in need[2:]]}: fix the line")
            out.setdefault(r["filename"], []).append(box)
    return out


def yolo_rows(boxes, names, w, h, where):
    """(rows (N, 5) float64 class, x, y, w, h normalized; dropped zero-size count) of pixel-corner boxes on a
    w × h image. AnnotationError for an unknown class, an inverted box or one beyond OUTSIDE_TOL."""
    ids = {n: i for i, n in enumerate(names)}
    rows, dropped = [], 0
    for i, (name, x1, y1, x2, y2) in enumerate(boxes):
        if name not in ids:
            raise AnnotationError(f"{where}: box {i}: unknown class {name!r} (known: {', '.join(names)}): "
                                  f"give --names with it or fix the label")
        if x2 < x1 or y2 < y1:
            raise AnnotationError(f"{where}: box {i}: inverted corners ({x1:g}, {y1:g}, {x2:g}, {y2:g}): "
                                  f"xmax/ymax must not be below xmin/ymin")
        if min(x1, y1) < -OUTSIDE_TOL or x2 > w + OUTSIDE_TOL or y2 > h + OUTSIDE_TOL:
            raise AnnotationError(f"{where}: box {i}: ({x1:g}, {y1:g}, {x2:g}, {y2:g}) lies outside the "
                                  f"{w} x {h} image: fix the box or the image")
        x1, x2 = np.clip([x1, x2], 0, w)
        y1, y2 = np.clip([y1, y2], 0, h)
        if x2 - x1 <= 0 or y2 - y1 <= 0:
            dropped += 1
            continue
        rows.append([ids[name], (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h])
    return np.array(rows, dtype=np.float64).reshape(-1, 5), dropped


def ends_cleanly(path):
    """A JPEG ends with the EOI marker FF D9 (the published loader re-saves any that does not); other formats:
    True."""
    if path.suffix.lower() not in (".jpg", ".jpeg"):
        return True
    with open(path, "rb") as f:
        f.seek(-2, 2)
        return f.read() == b"\xff\xd9"


def collect(images, annotations, names):
    """[(image path, YOLO rows)] for every image, checked before writing, and {"dropped_zero_size": n,
    "skipped_difficult": n}.
    annotations: a folder of VOC XML files named as the images, or a CSV file; images without an annotation
    are backgrounds, an annotation without its image is an error."""
    files = sorted(p for p in images.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise AnnotationError(f"{images}: no images (.jpg/.jpeg/.png/.bmp) there: give the image folder")
    by_name = {p.name: p for p in files}
    skipped = 0
    if annotations.is_dir():
        labels = {}
        for x in sorted(annotations.glob("*.xml")):
            im = next((by_name[x.stem + s] for s in IMAGE_SUFFIXES if x.stem + s in by_name), None)
            if im is None:
                raise AnnotationError(f"{x}: no image {x.stem}.jpg in {images}: add it or remove the annotation")
            boxes, difficult = read_voc(x)
            labels[im.name] = (x, boxes)
            skipped += difficult
    else:
        labels = {}
        for fname, boxes in read_csv(annotations).items():
            if fname not in by_name:
                raise AnnotationError(f"{annotations}: image {fname} not in {images}: add it or remove its rows")
            labels[fname] = (annotations, boxes)
    out, dropped = [], 0
    for im in files:
        pixels = cv2.imread(str(im))
        if pixels is None:
            raise AnnotationError(f"{im}: not a readable image: remove or replace it")
        where, boxes = labels.get(im.name, (im, []))
        rows, d = yolo_rows(boxes, names, pixels.shape[1], pixels.shape[0], f"{where} ({im.name})")
        out.append((im, rows))
        dropped += d
    return out, {"dropped_zero_size": dropped, "skipped_difficult": skipped}


def split_items(images, annotations, names):
    """[(split, image path, YOLO rows)] and the left-out counts of collect(). images/annotations: one folder (and
    a VOC folder or CSV file) split per file by split_of, or {"train": ..., "val": ...} of a set that ships its
    own split: each folder's files keep its split; a file name in both is an AnnotationError."""
    if not isinstance(images, dict):
        items, left_out = collect(Path(images), Path(annotations), names)
        return [(split_of(im.stem), im, rows) for im, rows in items], left_out
    out, left_out, seen = [], {"dropped_zero_size": 0, "skipped_difficult": 0}, {}
    for split in ("train", "val"):
        items, counts = collect(Path(images[split]), Path(annotations[split]), names)
        for im, rows in items:
            if im.name in seen:
                raise AnnotationError(f"{im}: {im.name} is also in {seen[im.name]}: a file name may be in one split "
                                      f"only (rename or remove one)")
            seen[im.name] = im.parent
            out.append((split, im, rows))
        left_out = {k: left_out[k] + counts[k] for k in left_out}
    return out, left_out


def convert(images, annotations, names, out):
    """Write the YOLO dataset (see the module docstring) to `out` (replaced) and return its counts:
    {"train"/"val": {"images", "boxes": {name: n}}, "dropped_zero_size", "skipped_difficult", "reencoded"}.
    images/annotations: as split_items() takes them."""
    items, left_out = split_items(images, annotations, list(names))
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    counts = {s: {"images": 0, "boxes": {n: 0 for n in names}} for s in ("train", "val")}
    lists, reencoded = {"train": [], "val": []}, []
    for split, im, rows in items:
        for d in ("images", "labels"):
            (out / d / split).mkdir(parents=True, exist_ok=True)
        dst = out / "images" / split / im.name
        if ends_cleanly(im):
            shutil.copyfile(im, dst)
        else:
            cv2.imwrite(str(dst), cv2.imread(str(im)), [cv2.IMWRITE_JPEG_QUALITY, 100])
            reencoded.append(im.name)
        (out / "labels" / split / f"{im.stem}.txt").write_text(
            "".join(f"{int(r[0])} {r[1]:.6f} {r[2]:.6f} {r[3]:.6f} {r[4]:.6f}\n" for r in rows))
        lists[split].append(im.name)
        counts[split]["images"] += 1
        for k in rows[:, 0]:
            counts[split]["boxes"][names[int(k)]] += 1
    for split, files in lists.items():
        (out / f"{split}.txt").write_text("".join(f + "\n" for f in files))
    (out / "data.yaml").write_text("# converted by dev/accuracy/accuracy_datasets.py; path . = this folder\n" +
                                   yaml.safe_dump({"path": ".", "train": "images/train", "val": "images/val",
                                                   "nc": len(names), "names": dict(enumerate(names))},
                                                  sort_keys=False))
    return {**counts, **left_out, "reencoded": reencoded}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), help="a known public dataset's layout and class order")
    p.add_argument("--src", required=True, help="the dataset repository's files (git archive export)")
    p.add_argument("--out", required=True, help="the YOLO dataset folder to write (replaced)")
    p.add_argument("--labels", choices=("xml", "csv"), default="xml", help="raccoon: its VOC XML or its CSV")
    p.add_argument("--images", help="image folder under --src (instead of a preset)")
    p.add_argument("--annotations", help="VOC XML folder or CSV file under --src (instead of a preset)")
    p.add_argument("--names", help="comma-separated class names in id order (instead of a preset)")
    a = p.parse_args(argv)
    src = Path(a.src)
    images, annotations, names = PRESETS[a.preset] if a.preset else (None, None, None)
    if a.labels == "csv":
        if a.preset not in CSV_LABELS:
            print(f"error: --labels csv: only for {', '.join(CSV_LABELS)}; give --annotations FILE.csv",
                  file=sys.stderr)
            return 2
        annotations = CSV_LABELS[a.preset]
    images, annotations = a.images or images, a.annotations or annotations
    names = a.names.split(",") if a.names else names
    if not (images and annotations and names):
        print("error: give --preset, or --images, --annotations and --names", file=sys.stderr)
        return 2
    if isinstance(images, dict) != isinstance(annotations, dict):   # a preset's own split: both or neither
        print(f"error: --preset {a.preset} ships its own split (folders {', '.join(PRESETS[a.preset][0].values())}): "
              f"give both --images and --annotations, or neither", file=sys.stderr)
        return 2
    images, annotations = (({k: src / v for k, v in x.items()} if isinstance(x, dict) else src / x)
                           for x in (images, annotations))
    for what, x in (("images", images), ("annotations", annotations)):
        for path in x.values() if isinstance(x, dict) else [x]:
            if not path.exists():
                print(f"error: {what}: {path} not found: --src must be the dataset repository's files",
                      file=sys.stderr)
                return 2
    try:
        counts = convert(images, annotations, names, a.out)
    except AnnotationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"dataset": a.preset or str(src), "out": str(Path(a.out).resolve()), **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
