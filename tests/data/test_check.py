"""check-data (yolov9c/data/check.py, yolov9c/cli/check_data.py): output lines and exit codes; images without
a label file ("missing") and label files without an image ("orphan") reported by check-data and by the
training dataset's scan alike, apart from empty label files.

Run: python -m pytest -q tests/data/test_check.py
"""

import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from yolov9c.cli.check_data import main
from yolov9c.cli.main import main as package_main
from yolov9c.data.check import check_data
from yolov9c.data.dataset import DatasetConfig, YoloDataset

REPO = Path(__file__).resolve().parents[2]


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


def test_a_test_split_not_on_disk_is_one_line_not_an_unusable_yaml(tmp_path):
    # training and val_dual.py --task val run without it (as published), so check-data says so and goes on
    y = _ds(tmp_path)
    cfg = yaml.safe_load(y.read_text())
    cfg["test"] = "test-dev2017.txt"
    y.write_text(yaml.safe_dump(cfg))
    out = []
    assert check_data(str(y), log=out.append, err=out.append) == 0
    missing = [ln for ln in out if "test-dev2017.txt" in ln]
    assert missing == [f"test: {tmp_path / 'test-dev2017.txt'} does not exist: not checked (training does not "
                       f"read it; val_dual.py --task test does)"], out
    assert "train: 2 images, 0 backgrounds, 1 corrupt" in out and out[-1] == "data usable"


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


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_paths_that_are_no_regular_file_are_reported_not_read(tmp_path):
    """A FIFO, a link to /dev/zero, a dangling link and a folder named `*.jpg` among the images of a folder, a FIFO
    and a /dev/zero link among the label files, a FIFO in a `.txt` list: each one `path: reason (skipped)` line,
    never read (before: check-data hung on the FIFO, a /dev/zero label filled the memory, the dangling link and
    the folder were dropped silently). A subprocess, capped at 4 GiB of address space should a read start."""
    import resource

    y = _ds(tmp_path)
    im, lb = tmp_path / "images" / "train", tmp_path / "labels" / "train"
    cv2.imwrite(str(im / "3.jpg"), np.full((40, 50, 3), 80, np.uint8))
    (lb / "0.txt").unlink()
    os.mkfifo(lb / "0.txt")
    (lb / "3.txt").symlink_to("/dev/zero")
    os.mkfifo(im / "fifo.jpg")
    (im / "zero.jpg").symlink_to("/dev/zero")
    (im / "gone.jpg").symlink_to("moved.jpg")
    (im / "folder.jpg").mkdir()
    val = tmp_path / "images" / "val"
    os.mkfifo(val / "pipe.png")
    (tmp_path / "val.txt").write_text("".join(f"./images/val/{n}\n" for n in ("0.jpg", "1.jpg", "2.jpg", "pipe.png")))
    y.write_text(yaml.safe_dump({"path": ".", "train": "images/train", "val": "val.txt", "names": ["a", "b"]}))

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run([sys.executable, "-m", "yolov9c", "check-data", "--data", str(y), "--no-label-cache"],
                       capture_output=True, text=True, env=env, timeout=300, preexec_fn=cap)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    expect = [f"train: {lb / '0.txt'}: not a regular file: a FIFO (named pipe) (image {im / '0.jpg'} skipped)",
              f"train: {lb / '3.txt'}: not a regular file: a character device (a link to /dev/zero) (image "
              f"{im / '3.jpg'} skipped)",
              f"train: {im / 'fifo.jpg'}: not a regular file: a FIFO (named pipe) (skipped)",
              f"train: {im / 'folder.jpg'}: not a regular file: a folder (skipped)",
              f"train: {im / 'gone.jpg'}: a dangling symbolic link (to moved.jpg) (skipped)",
              f"train: {im / 'zero.jpg'}: not a regular file: a character device (a link to /dev/zero) (skipped)",
              "train: 1 images, 0 backgrounds, 7 corrupt",
              f"val: {val / 'pipe.png'}: not a regular file: a FIFO (named pipe) (skipped)",
              "val: 3 images, 0 backgrounds, 1 corrupt"]
    assert [ln for ln in lines if ln.startswith(("train: /", "val: /")) or " corrupt" in ln] == [
        *expect[:1], f"train: {lb / '1.txt'}: line 1: class 5 >= nc (2) in '5 0.5 0.5 0.2 0.2' (image {im / '1.jpg'} "
                     f"skipped)", *expect[1:]], lines


def _pairing_ds(root):
    """train: 2 labelled, 1 empty label file, 2 images without a label file, 1 orphan label; val: clean."""
    for split in ("train", "val"):
        im, lb = root / "images" / split, root / "labels" / split
        im.mkdir(parents=True)
        lb.mkdir(parents=True)
        for i in range(2):
            cv2.imwrite(str(im / f"{i}.jpg"), np.full((40, 50, 3), 80, np.uint8))
            (lb / f"{i}.txt").write_text("1 0.5 0.5 0.2 0.2\n")
    tr_im, tr_lb = root / "images" / "train", root / "labels" / "train"
    for name in ("nolabel_a", "nolabel_b", "empty"):
        cv2.imwrite(str(tr_im / f"{name}.png"), np.full((40, 50, 3), 90, np.uint8))
    (tr_lb / "empty.txt").write_bytes(b"\xef\xbb\xbf\r\n")  # BOM + CRLF, nothing else: a background
    (tr_lb / "renamed_away.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    y = root / "d.yaml"
    y.write_text(yaml.safe_dump({"path": ".", "train": "images/train", "val": "images/val", "names": ["a", "b"]}))
    return y, tr_im, tr_lb


def test_check_data_cli_reports_missing_and_orphan_apart_from_empty(tmp_path, capsys):
    y, im, lb = _pairing_ds(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run([sys.executable, "-m", "yolov9c", "check-data", "--data", str(y)], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr  # missing labels are backgrounds, orphans unused: still usable
    lines = r.stdout.splitlines()
    assert "train: 5 images, 3 backgrounds, 0 corrupt, 2 missing, 1 orphan" in lines
    assert "val: 2 images, 0 backgrounds, 0 corrupt" in lines
    assert (f"train: 2 images without a label file (missing, used as backgrounds), e.g. {im / 'nolabel_a.png'} "
            f"(no {lb / 'nolabel_a.txt'}), {im / 'nolabel_b.png'}") in lines
    assert f"train: 1 label file without an image (orphan, not used), e.g. {lb / 'renamed_away.txt'}" in lines
    assert "train: 2 boxes in 2 labelled images" in lines and lines[-1] == "data usable"
    assert not any(ln.startswith("val: ") and ("missing" in ln or "orphan" in ln) for ln in lines)
    # second run from the label cache: the same counts (the same command in this process: no second start)
    assert package_main(["check-data", "--data", str(y)]) == 0
    assert "train: 5 images, 3 backgrounds, 0 corrupt, 2 missing, 1 orphan (label cache" in capsys.readouterr().out


def test_training_dataset_scan_prints_the_same_lines(tmp_path):
    y, im, lb = _pairing_ds(tmp_path)
    checked = []
    check_data(str(y), label_cache=False, log=checked.append, err=checked.append)
    lines = []
    ds = YoloDataset(str(im), DatasetConfig(img_size=64, augment=True, prefix="train: ", nc=2, label_cache=False),
                     log=lines.append)
    assert len(ds) == 5 and lines[-1] == "train: 5 images, 3 backgrounds, 0 corrupt, 2 missing, 1 orphan"
    assert [ln for ln in lines if "without" in ln] == [ln for ln in checked if ln.startswith("train: ") and
                                                       "without" in ln] != []
    assert ds.scan.missing == [str(im / "nolabel_a.png"), str(im / "nolabel_b.png")]
    assert ds.scan.orphans == [str(lb / "renamed_away.txt")]


def test_train_split_whose_labels_are_all_missing_says_so(tmp_path):
    y, im, lb = _pairing_ds(tmp_path)
    for f in lb.glob("*.txt"):
        f.rename(tmp_path / f.name)  # labels moved out of labels/train
    out = []
    assert check_data(str(y), label_cache=False, log=out.append, err=out.append) == 1
    assert "train: 5 images, 5 backgrounds, 0 corrupt, 5 missing" in out
    assert "train: no labels at all: cannot train on this split (no image has a label file: see the missing " \
           "line above)" in out
