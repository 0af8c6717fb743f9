"""The fidelity harness's box-edge measure (dev/fidelity/stats.py edge_offsets) and its synthetic
rectangles dataset (compare_published.py --rects): edges found where the pixels put them, to a small fraction
of a pixel, and a shifted label measured as shifted."""

import sys
from pathlib import Path

import cv2
import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "dev" / "fidelity"))
import compare_published  # noqa: E402
import stats  # noqa: E402


def _image(w=320, h=240, box=(50, 40, 150, 120)):
    gray = np.full((h, w), 50, np.uint8)
    x0, y0, x1, y1 = box
    gray[y0:y1, x0:x1] = 220
    return gray


def _label(box, w=320, h=240, shift=0.0):
    x0, y0, x1, y1 = box
    return np.array([[0, 0, ((x0 + x1) / 2 + shift) / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h]])


def test_edges_of_an_exact_label_are_at_zero():
    box = (50, 40, 150, 120)
    got = stats.edge_offsets(_image(box=box), _label(box))
    for k in ("edge_x1", "edge_x2", "edge_y1", "edge_y2"):
        assert got[k].shape == (1,) and abs(float(got[k][0])) < 0.01, (k, got[k])


def test_a_shifted_label_is_measured_shifted():
    box = (50, 40, 150, 120)
    got = stats.edge_offsets(_image(box=box), _label(box, shift=2.5))  # the label 2.5 px right of the pixels
    assert abs(float(got["edge_x1"][0]) + 2.5) < 0.01 and abs(float(got["edge_x2"][0]) + 2.5) < 0.01
    assert abs(float(got["edge_y1"][0])) < 0.01


def test_a_resized_rectangle_keeps_its_edges_within_a_fraction_of_a_pixel():
    box = (50, 40, 150, 120)
    small = cv2.resize(_image(box=box), (200, 150), interpolation=cv2.INTER_LINEAR)  # scale 0.625
    got = stats.edge_offsets(small, _label(box), min_side=8)  # normalised labels stay valid after a resize
    assert all(abs(float(got[k][0])) < 0.35 for k in got), got


def test_boxes_at_the_border_or_without_contrast_are_skipped():
    gray = _image(box=(0, 40, 100, 120))
    assert len(stats.edge_offsets(gray, _label((0, 40, 100, 120)))["edge_x1"]) == 0
    flat = np.full((240, 320), 50, np.uint8)
    assert len(stats.edge_offsets(flat, _label((50, 40, 150, 120)))["edge_x1"]) == 0


def test_rects_dataset_draws_its_labels(tmp_path):
    data = compare_published.write_rects(tmp_path / "r", 3, seed=1)
    cfg = yaml.safe_load(data.read_text())
    images = sorted((Path(cfg["path"]) / cfg["train"]).glob("*.png"))
    assert len(images) == 3 and cfg["nc"] == 1
    for p in images:
        gray = cv2.imread(str(p), cv2.IMREAD_GRAYSCALE)
        rows = np.loadtxt(p.parents[2] / "labels" / "train" / f"{p.stem}.txt", ndmin=2)
        labels = np.concatenate([np.zeros((len(rows), 1)), rows], 1)
        got = stats.edge_offsets(gray, labels)
        assert len(got["edge_x1"]) >= 1
        assert all(float(np.abs(got[k]).max()) < 0.01 for k in got), got


def _init_record(std=0.05, bias=1.0, eps=1e-3):
    return {"params": {"model.0.conv.weight": [[0.0, std, 432]] * 3, "model.9.cv2.0.2.bias": [[bias, 0.0, 64]] * 3},
            "bn": {"model.0.bn": [eps, 0.03]}}


def test_init_comparison_flags_what_differs():
    same = compare_published.compare_init(_init_record(), _init_record())
    assert same == ({"tensors_compared": 2, "bn_layers": 1}, [])
    _, flags = compare_published.compare_init(_init_record(std=0.06), _init_record())
    assert len(flags) == 1 and "model.0.conv.weight: std" in flags[0]
    _, flags = compare_published.compare_init(_init_record(bias=-4.6), _init_record())
    assert len(flags) == 1 and "constant" in flags[0]
    _, flags = compare_published.compare_init(_init_record(eps=1e-5), _init_record())
    assert flags == ["BatchNorm eps / momentum differ"]
