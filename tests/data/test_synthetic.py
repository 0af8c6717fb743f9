"""The built-in synthetic dataset (yolov9c/data/synthetic.py): deterministic from the seed,
classes visually distinct, boxes tight around the drawn shapes, loadable through `--data synthetic`.

Run: python -m pytest -q tests/data/test_synthetic.py
"""

import hashlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from yolov9c.data.dataset_yaml import DataConfigError, load_data_config
from yolov9c.data.image_list import collect_image_files
from yolov9c.data.labels import label_path_for, parse_label_file
from yolov9c.data.scan import scan_split
from yolov9c.data.synthetic import CLASSES, NAMES, make_image, synthetic_dataset


def _digest(folder):
    h = hashlib.sha256()
    for f in sorted(Path(folder).rglob("*")):
        if f.is_file() and f.suffix in (".jpg", ".txt", ".yaml"):
            h.update(f.relative_to(folder).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def default_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("syn")
    return synthetic_dataset(seed=0, root=root)


def test_default_layout(default_set):
    y = default_set
    assert y.name == "data.yaml" and y.parent.name == "synthetic-v1-s0"
    cfg = load_data_config(y)
    assert cfg["nc"] == 8 and cfg["names"] == NAMES
    lines = []
    for split, n in (("train", 128), ("val", 32)):
        res = scan_split(collect_image_files(cfg[split]), cfg["nc"], sources=cfg[split], log=lines.append)
        assert (res.n_images, res.n_backgrounds, res.n_corrupt) == (n, 0, 0)
        assert all((res.shapes == 320).all(1))
        counts = np.bincount(np.concatenate([lb[:, 0] for lb in res.labels]).astype(int), minlength=8)
        assert (counts > 0).all()  # every class present in every split
    assert not [ln for ln in lines if ": " in ln]  # no warnings or bad files


def test_deterministic_from_seed(default_set, tmp_path):
    y = default_set
    again = synthetic_dataset(seed=0, root=tmp_path / "a")
    assert _digest(again.parent) == _digest(y.parent)
    other = synthetic_dataset(seed=1, root=tmp_path / "a", n_train=4, n_val=2)
    other0 = synthetic_dataset(seed=0, root=tmp_path / "a", n_train=4, n_val=2)
    assert other.parent != other0.parent and _digest(other.parent) != _digest(other0.parent)
    # the cached folder is reused, not regenerated
    mtime = (again.parent / "images/train/000000.jpg").stat().st_mtime_ns
    assert synthetic_dataset(seed=0, root=tmp_path / "a") == again
    assert (again.parent / "images/train/000000.jpg").stat().st_mtime_ns == mtime


def _saturated(img):
    # chroma (max - min channel): <= ~50 on the backgrounds, >= ~100 on every shape colour
    img = img.astype(np.int16)
    return (img.max(2) - img.min(2)) > 80


@pytest.mark.parametrize("seed", range(6))
def test_boxes_are_tight_around_the_shapes(seed):
    # before JPEG: exact. Every saturated pixel lies in a box, every box edge touches its shape.
    img, rows = make_image(np.random.default_rng([seed, 0, 7]), 320)
    labels = np.array([[float(v) for v in r.split()] for r in rows], np.float32)
    sat = _saturated(img)
    covered = np.zeros_like(sat)
    for c, xc, yc, w, h in labels:
        x1, y1 = round((xc - w / 2) * 320), round((yc - h / 2) * 320)
        x2, y2 = round((xc + w / 2) * 320), round((yc + h / 2) * 320)
        inside = sat[y1:y2, x1:x2]
        assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
        covered[y1:y2, x1:x2] = True
        # the shape's colour is its class's colour
        mean = img[y1:y2, x1:x2][inside].mean(0)
        assert np.abs(mean - np.array(CLASSES[int(c)][1])).max() < 45
    assert not (sat & ~covered).any()


def test_classes_distinct_by_hue():
    hues = [cv2.cvtColor(np.uint8([[c]]), cv2.COLOR_BGR2HSV)[0, 0] for _, c in CLASSES]
    h = np.array([x[0] for x in hues], int)
    d = np.abs(h[:, None] - h[None, :])
    d = np.minimum(d, 180 - d) + np.eye(len(h), dtype=int) * 180
    assert d.min() >= 10  # OpenCV hue units (0..179); training jitter is at most ±3
    assert min(x[1] for x in hues) > 150  # saturated, unlike the grey-ish backgrounds


def test_jpeg_labels_match_pixels(default_set):
    y = default_set
    files = sorted((y.parent / "images" / "val").glob("*.jpg"))[:8]
    for f in files:
        img = cv2.imread(str(f))
        labels, _, _ = parse_label_file(label_path_for(f), nc=8)
        sat = _saturated(img)
        covered = np.zeros_like(sat)
        for _, xc, yc, w, h in labels:
            x1, y1 = int((xc - w / 2) * 320) - 2, int((yc - h / 2) * 320) - 2
            covered[max(y1, 0):round((yc + h / 2) * 320) + 2, max(x1, 0):round((xc + w / 2) * 320) + 2] = True
        assert (sat & ~covered).sum() < 5  # JPEG chroma blur only


def test_polygons_and_bench_options(tmp_path):
    y = synthetic_dataset(seed=3, root=tmp_path, n_train=6, n_val=0, imgsz=640, boxes=(20, 40),
                          size=(0.04, 0.15), polygons=True, name="bench")
    assert "-poly" in y.parent.name and y.parent.name.endswith("-bench")
    cfg = load_data_config(y)
    res = scan_split(collect_image_files(cfg["train"]), 8, sources=cfg["train"], log=lambda s: None)
    assert res.n_images == 6 and all((res.shapes == 640).all(1))
    assert all(20 <= len(lb) <= 40 for lb in res.labels)  # placement may skip a few of up to 40 draws
    assert all(len(s) == len(lb) and all(len(p) >= 3 for p in s) for s, lb in zip(res.segments, res.labels))


def test_data_synthetic_resolves_into_cache_root(default_set, tmp_path, monkeypatch):
    y = default_set
    monkeypatch.setenv("YOLOV9C_CACHE", str(y.parent.parent))
    assert load_data_config(None)["path"] == str(y.parent.resolve())  # no --data: the default
    assert load_data_config("synthetic")["path"] == str(y.parent.resolve())
    monkeypatch.setenv("YOLOV9C_CACHE", str(tmp_path / "cache"))
    cfg = load_data_config("synthetic:5")
    assert Path(cfg["path"]).parent == (tmp_path / "cache").resolve()
    assert Path(cfg["path"]).name == "synthetic-v1-s5"
    with pytest.raises(DataConfigError, match="seed"):
        load_data_config("synthetic:x")


def test_a_killed_generation_leaves_no_folder_behind(tmp_path):
    # a generation killed before its rename left .<tag>.tmp<pid>: the next generation removes it (its process is
    # gone) and keeps one of a live process (a concurrent generation)
    import os
    import subprocess
    import sys

    from yolov9c.data.synthetic import synthetic_dataset

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    tag = "synthetic-v1-s5-2-1-64-b1_8-z0.08_0.35"
    stale, live = tmp_path / f".{tag}.tmp{p.pid}", tmp_path / f".{tag}.tmp{os.getppid()}"
    for d in (stale, live):
        (d / "images" / "train").mkdir(parents=True)
    yaml_file = synthetic_dataset(seed=5, root=tmp_path, n_train=2, n_val=1, imgsz=64)
    assert yaml_file.parent.name == tag and yaml_file.is_file()
    assert not stale.exists() and live.exists()
