"""Writes the suite's committed test data, tests/assets/ (tests/assets/README.md), from the developers' shared folder:
the published code's golden tensors packed losslessly (tests/repo_assets.py's format), and 24 coco128 images with
their labels and licence rows. Only images whose Flickr licence allows redistribution and changes (CC BY, CC BY-SA,
no known copyright restrictions) are taken; the files are copied byte for byte.

    python dev/make_test_assets.py --shared ../shared        # rewrites tests/assets/goldens and tests/assets/coco24

Each packed file is read back and compared bit for bit with the recording before the script exits 0; a second run
writes the same bytes (git status shows no change). The hand-written README.md and LICENSE.md are not touched.
"""

import argparse
import csv
import shutil
import sys
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import repo_assets  # noqa: E402

CONFIGS = ["yolov9-t", "yolov9-s", "yolov9-m", "yolov9-c", "yolov9-e",
           "gelan-t", "gelan-s", "gelan-m", "gelan-c", "gelan-e"]
# The smallest files of the allowed licences, plus what the tests need: a background image (508), classes with
# large boxes in both splits (person 0, cup 41, dining table 60: 450 and 2592 / 1993), images of other aspect
# ratios (491: 500 x 313, 360: 500 x 375).
IMAGES = {
    "train": ["000000000030", "000000000089", "000000000092", "000000000294", "000000000308", "000000000360",
              "000000000370", "000000000436", "000000000450", "000000000471", "000000000491", "000000000508",
              "000000000520"],
    "val": ["000000000785", "000000000885", "000000001993", "000000002149", "000000002473", "000000002592",
            "000000006818", "000000007511", "000000008762", "000000008844", "000000009483"],
}
LICENCES = {"Attribution License", "Attribution-ShareAlike License", "No known copyright restrictions"}


def pack_goldens(src, dst):
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "summary.json", dst / "summary.json")
    for cfg in CONFIGS:
        z = np.load(src / f"{cfg}.npz")
        arrays = {k: z[k] for k in z.files}
        keys, names = (src / f"{cfg}.keys.txt").read_text(), (src / f"{cfg}.grad_names.txt").read_text()
        repo_assets.pack_golden(dst / f"{cfg}.tar.xz", arrays, keys, names)
        members = repo_assets.read_archive(dst / f"{cfg}.tar.xz")
        back = repo_assets.arrays_of(members)
        if set(back) != set(arrays) or any(back[k].dtype != a.dtype or back[k].tobytes() != a.tobytes()
                                           for k, a in arrays.items()):
            raise SystemExit(f"error: {cfg}: the packed tensors differ from {src / cfg}.npz")
        if members["keys.txt"].decode() != keys or members["grad_names.txt"].decode() != names:
            raise SystemExit(f"error: {cfg}: the packed text files differ from the recording")
        print(f"{cfg}: {(dst / f'{cfg}.tar.xz').stat().st_size} bytes")


def copy_coco(src, dst):
    rows = {(r["split"], r["file"]): r for r in csv.DictReader(open(src / "image_licenses.csv", newline=""))}
    kept = []
    for split, stems in IMAGES.items():
        for sub in ("images", "labels"):
            d = dst / sub / split
            if d.exists():
                shutil.rmtree(d)  # an image dropped from IMAGES must not stay behind
            d.mkdir(parents=True)
        for stem in stems:
            row = rows.get((split, f"{stem}.jpg"))
            if row is None or row["license_name"] not in LICENCES:
                raise SystemExit(f"error: {split}/{stem}.jpg: licence {row and row['license_name']!r} not allowed")
            for sub, ext in (("images", ".jpg"), ("labels", ".txt")):
                shutil.copyfile(src / sub / split / f"{stem}{ext}", dst / sub / split / f"{stem}{ext}")
            kept.append(row)
    with open(dst / "image_licenses.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(kept[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(kept)
    names = yaml.safe_load((src / "data.yaml").read_text())["names"]
    n = {s: len(v) for s, v in IMAGES.items()}
    with open(dst / "data.yaml", "w") as f:
        f.write(f"# {sum(n.values())} COCO 2017 images in YOLO format (LICENSE.md): {n['train']} of train2017, "
                f"{n['val']} of val2017\n"
                "path: .  # dataset root = the folder holding this file\n"
                "train: images/train\nval: images/val\nnc: 80\n")
        f.write(yaml.safe_dump({"names": names}, sort_keys=False, allow_unicode=True))
    print(f"coco24: {sum(n.values())} images, {sum(p.stat().st_size for p in dst.rglob('*.jpg'))} bytes")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, required=True, help="the folder holding spec/goldens and data/coco128")
    p.add_argument("--out", type=Path, default=REPO / "tests" / "assets")
    a = p.parse_args(argv)
    pack_goldens(a.shared / "spec" / "goldens", a.out / "goldens")
    copy_coco(a.shared / "data" / "coco128", a.out / "coco24")
    total = sum(f.stat().st_size for f in a.out.rglob("*") if f.is_file())
    print(f"tests/assets: {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
