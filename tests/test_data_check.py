"""check-data (yolov9c/data/check.py, yolov9c/cli/check_data.py): output lines and exit codes.

Run: python -m pytest -q tests/test_data_check.py
"""

import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import yaml

from yolov9c.cli.check_data import main
from yolov9c.data.check import check_data

REPO = Path(__file__).resolve().parents[1]


def _ds(root, train_ok=True, val_ok=True):
    for split, ok in (("train", train_ok), ("val", val_ok)):
        im, lb = root / "images" / split, root / "labels" / split
        im.mkdir(parents=True)
        lb.mkdir(parents=True)
        for i in range(3):
            f = im / f"{i}.jpg"
            if ok:
                cv2.imwrite(str(f), np.full((40, 50, 3), 80, np.uint8))
            else:
                f.write_bytes(b"\xff\xd8\xff broken")
            (lb / f"{i}.txt").write_text(f"{i % 2} 0.5 0.5 0.2 0.2\n")
    (root / "labels" / "train" / "1.txt").write_text("5 0.5 0.5 0.2 0.2\n")  # class >= nc
    y = root / "d.yaml"
    y.write_text(yaml.safe_dump({"path": ".", "train": "images/train", "val": "images/val", "names": ["a", "b"]}))
    return y


def test_usable_data_prints_lines_and_summary(tmp_path):
    y = _ds(tmp_path)
    out = []
    assert check_data(str(y), log=out.append, err=out.append) == 0
    bad = [ln for ln in out if "1.txt: line 1: class 5 >= nc (2)" in ln]
    assert len(bad) == 1 and bad[0].startswith("train: " + str(tmp_path))
    assert "train: 2 images, 0 backgrounds, 1 corrupt" in out
    assert "val: 3 images, 0 backgrounds, 0 corrupt" in out
    assert out[-1] == "data usable"


def test_split_without_usable_image_exits_1(tmp_path, capsys):
    y = _ds(tmp_path, val_ok=False)
    assert main(["--data", str(y), "--no-label-cache"]) == 1
    text = capsys.readouterr().out
    assert "val: 0 images, 0 backgrounds, 3 corrupt" in text
    assert text.count("corrupt image (does not decode)") == 3
    assert "val: no usable image" in text and not (tmp_path / "labels" / "val.cache").exists()


def test_bad_yaml_exits_2_naming_the_key(tmp_path, capsys):
    y = _ds(tmp_path)
    cfg = yaml.safe_load(y.read_text())
    cfg["val"] = "images/missing"
    y.write_text(yaml.safe_dump(cfg))
    assert main(["--data", str(y)]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "'val'" in err and "images/missing" in err


def test_module_entry_and_synthetic_default(tmp_path):
    # the default (no --data) is the synthetic set, generated into $YOLOV9C_CACHE
    env = dict(os.environ, YOLOV9C_CACHE=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run([sys.executable, "-m", "yolov9c.cli.check_data"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "train: 128 images, 0 backgrounds, 0 corrupt" in r.stdout
    assert "val: 32 images, 0 backgrounds, 0 corrupt" in r.stdout
    assert (tmp_path / "synthetic-v1-s0" / "data.yaml").is_file()
