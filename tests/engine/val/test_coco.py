"""COCO-JSON evaluation (--save-json, yolov9c/engine/val/coco.py) on a tiny dataset written in COCO's layout:
coco/images/val2017/<12-digit id>.jpg, coco/labels/val2017/*.txt, coco/val2017.txt and
coco/annotations/instances_val2017.json (the published code evaluates json with COCO's ids only for such data).

An oracle model returns the ground-truth boxes: pycocotools then gives mAP 1.0 and our own mAP@0.5:0.95 agrees
within TOL (ours integrates a 101-point interpolated curve with the published end points, which gives 0.995 for
a perfect detector); boxes shifted to IoU 0.72 are right at 5 of the 10 IoU thresholds, so both evaluators give
mAP@0.5:0.95 = 0.5 (ours within TOL). Also: the rows (image_id from the file name, 80→91 category id, top-left
xywh bbox in original pixels rounded to 3 decimals, score to 5), a missing annotations file (message, no crash),
val_dual.py --data .../coco.yaml end to end, and training on it writing the final _predictions.json. Needs pycocotools (the [test] extra); skips without it.

Run: python -m pytest -q tests/engine/val/test_coco.py
"""

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml
from torch import nn

from inprocess import run_script
from yolov9c.data.dataset import DatasetConfig
from yolov9c.data.dataset_yaml import load_data_config
from yolov9c.data.loader import LoaderConfig, create_dataloader
from yolov9c.engine.val.coco import coco80_to_coco91, coco_layout, image_id, is_coco_val, json_rows
from yolov9c.engine.val.validator import ValConfig, validate

pytest.importorskip("pycocotools")
REPO = Path(__file__).resolve().parents[3]
TOL = 0.01  # ours vs pycocotools on mAP@0.5:0.95 (the end-point convention costs 0.005 on a perfect curve)
IMGSZ = 64

# image id → ((h, w), [(class, x1, y1, x2, y2) in pixels]); boxes of one class do not overlap
IMAGES = {
    139: ((80, 100), [(0, 10, 12, 40, 50), (11, 55, 20, 90, 70), (0, 60, 5, 85, 18)]),
    285: ((96, 64), [(79, 8, 10, 50, 80)]),
    632: ((120, 120), [(2, 20, 30, 70, 90), (45, 75, 15, 110, 60), (2, 80, 70, 112, 110)]),
}
NAMES = [f"class{i}" for i in range(80)]


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    root = tmp_path_factory.mktemp("cocoval") / "coco"
    (root / "images" / "val2017").mkdir(parents=True)
    (root / "labels" / "val2017").mkdir(parents=True)
    (root / "annotations").mkdir()
    rng = np.random.default_rng(0)
    cmap = coco80_to_coco91()
    images, annotations, lines = [], [], []
    for iid, ((h, w), boxes) in IMAGES.items():
        name = f"{iid:012d}.jpg"
        cv2.imwrite(str(root / "images" / "val2017" / name), rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        lines.append(f"./images/val2017/{name}")
        rows = []
        for c, x1, y1, x2, y2 in boxes:
            rows.append(f"{c} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}")
            annotations.append({"id": len(annotations) + 1, "image_id": iid, "category_id": cmap[c],
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})
        (root / "labels" / "val2017" / f"{iid:012d}.txt").write_text("\n".join(rows) + "\n")
        images.append({"id": iid, "file_name": name, "height": h, "width": w})
    (root / "val2017.txt").write_text("\n".join(lines) + "\n")
    anno = {"images": images, "annotations": annotations,
            "categories": [{"id": cmap[i], "name": NAMES[i], "supercategory": "x"} for i in range(80)]}
    (root / "annotations" / "instances_val2017.json").write_text(json.dumps(anno))
    data = root.parent / "coco.yaml"
    data.write_text(yaml.safe_dump({"path": str(root), "train": "val2017.txt", "val": "val2017.txt", "names": NAMES}))
    return data


class Oracle(nn.Module):
    """Returns, batch after batch, (B, 4+80, A) predictions built from the loader's own targets: each label's
    xywh box (letterboxed pixels, x shifted by `shift` × its width) with score 0.9 - 0.01·k for its class."""

    def __init__(self, loader, shift=0.0):
        super().__init__()
        self.outputs = []
        for imgs, targets, _, _ in loader:
            b, _, hh, ww = imgs.shape
            a = max(int(np.bincount(targets[:, 0].long().numpy(), minlength=b).max()), 1)
            out = torch.zeros(b, 4 + 80, a)
            for i in range(b):
                t = targets[targets[:, 0] == i]
                for k, (c, xc, yc, bw, bh) in enumerate(t[:, 1:].tolist()):
                    out[i, :4, k] = torch.tensor([(xc + shift * bw) * ww, yc * hh, bw * ww, bh * hh])
                    out[i, 4 + int(c), k] = 0.9 - 0.01 * k
            self.outputs.append(out)
        self.calls = 0

    def forward(self, x):
        out = self.outputs[self.calls]
        self.calls += 1
        return out


def _loader(data):
    cfg = load_data_config(str(data))
    data = DatasetConfig(augment=False, rect=True, stride=32, pad=0.5, nc=80)
    loader, dataset = create_dataloader(cfg["val"], IMGSZ, 2, LoaderConfig(data, workers=0), log=lambda *a: None)
    return cfg, loader, dataset


def _validate(model, loader, save_dir, **kw):
    lines = []
    res = validate(model, loader, nc=80, names=NAMES, cfg=ValConfig(save_dir=save_dir, **kw),
                   log=lambda *a: lines.append(" ".join(map(str, a))))
    return res, "\n".join(lines)


def _coco_kw(cfg, dataset):
    is_coco, anno, class_map, ids = coco_layout(cfg, cfg["val"], dataset.im_files)
    assert is_coco and anno.is_file() and sorted(ids) == sorted(IMAGES)
    return dict(save_json=True, anno_json=anno, class_map=class_map, image_ids=ids)


def _iou_shift(iou):
    """x shift (× box width) that leaves IoU `iou` between a box and its shifted copy."""
    return (1 - iou) / (1 + iou)


@pytest.mark.parametrize("shift, coco_map, coco_map50", [(0.0, 1.0, 1.0), (_iou_shift(0.72), 0.5, 1.0)])
def test_oracle_coco_map_matches_ours(coco, tmp_path, shift, coco_map, coco_map50):
    cfg, loader, dataset = _loader(coco)
    ours, _ = _validate(Oracle(loader, shift), loader, tmp_path / "ours")
    assert ours["coco_stats"] is None
    res, log = _validate(Oracle(loader, shift), loader, tmp_path / "coco", **_coco_kw(cfg, dataset))
    assert res["coco_stats"] is not None, log
    assert "Average Precision" in log
    assert res["coco_stats"][0] == pytest.approx(coco_map, abs=1e-6)
    assert res["coco_stats"][1] == pytest.approx(coco_map50, abs=1e-6)
    assert (res["map"], res["map50"]) == (res["coco_stats"][0], res["coco_stats"][1])  # COCO's replace ours
    assert ours["map"] == pytest.approx(res["coco_stats"][0], abs=TOL)
    assert ours["map50"] == pytest.approx(res["coco_stats"][1], abs=TOL)


def test_prediction_rows_as_published(coco, tmp_path):
    cfg, loader, dataset = _loader(coco)
    _validate(Oracle(loader), loader, tmp_path, **_coco_kw(cfg, dataset), json_name="best_predictions.json")
    rows = json.loads((tmp_path / "best_predictions.json").read_text())
    cmap = coco80_to_coco91()
    # letterbox to 64 px and back: each side is resized to int(side · r) pixels (truncated, as published) and
    # boxes are mapped back with the gain r on both axes, so x shrinks by int(w·r) / (w·r), y by int(h·r) / (h·r)
    # (image 285, 96 × 64: its 42.67 px wide image is 42 px, x · 0.984)
    def shrink(hw):
        r = 64 / max(hw)
        return int(hw[1] * r) / (hw[1] * r), int(hw[0] * r) / (hw[0] * r)

    want = sorted((iid, cmap[c], x1 * fx, y1 * fy, (x2 - x1) * fx, (y2 - y1) * fy)
                  for iid, (hw, boxes) in IMAGES.items() for fx, fy in [shrink(hw)] for c, x1, y1, x2, y2 in boxes)
    got = sorted((r["image_id"], r["category_id"], *r["bbox"]) for r in rows)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[:2] == w[:2]
        assert g[2:] == pytest.approx(w[2:], rel=0.01, abs=0.02)
    for r in rows:
        assert set(r) == {"image_id", "category_id", "bbox", "score"} and isinstance(r["image_id"], int)
        assert all(round(v, 3) == v for v in r["bbox"]) and round(r["score"], 5) == r["score"]
        assert 0 < r["score"] <= 0.9


def test_json_rows_rounding_and_ids():
    predn = torch.tensor([[10.12345, 20.5, 30.98765, 41.0, 0.1234567, 3.0]])
    (row,) = json_rows(predn, "/x/images/000000000042.jpg", coco80_to_coco91())
    assert row == {"image_id": 42, "category_id": 4, "bbox": [10.123, 20.5, 20.864, 20.5], "score": 0.12346}
    (row,) = json_rows(predn, "/x/images/cat_1.png")
    assert row["image_id"] == "cat_1" and row["category_id"] == 3
    assert image_id("a/000123.jpg") == 123
    assert len(set(coco80_to_coco91())) == 80 and coco80_to_coco91()[-1] == 90 and 12 not in coco80_to_coco91()
    assert not is_coco_val(["/d/coco/images/val2017"]) and not is_coco_val(["/a/coco/val2017.txt"] * 2)


@pytest.mark.parametrize("val, coco", [
    ("/d/coco/val2017.txt", True), ("/data/coco2017/val2017.txt", True), ("/d/my_val2017.txt", True),
    ("/d/coco/val2017", False), ("/d/coco/val.txt", False), ("/d/coco/val2017.txt.bak", False),
])
def test_coco_is_any_val_list_ending_in_val2017_txt(val, coco):
    # published val_dual.py / train_dual.py: data['val'].endswith('val2017.txt'), whatever the folder is called
    assert is_coco_val([val]) is coco


def test_missing_annotations_message_not_crash(coco, tmp_path):
    cfg, loader, dataset = _loader(coco)
    kw = _coco_kw(cfg, dataset)
    kw["anno_json"] = tmp_path / "annotations" / "instances_val2017.json"
    res, log = _validate(Oracle(loader), loader, tmp_path, **kw)
    assert res["coco_stats"] is None and "annotations not found" in log and str(kw["anno_json"]) in log
    assert res["map"] == pytest.approx(1.0, abs=TOL)  # our own numbers stay
    assert len(json.loads((tmp_path / "predictions.json").read_text())) == 7


def test_val_dual_save_json_on_coco_layout(coco, gelan_mini, tmp_path, monkeypatch):
    import yolov9c
    from yolov9c.models.checkpoint import save_checkpoint

    model = yolov9c.build_model(gelan_mini, nc=80)  # the script's json, not the model: tests/conftest.py
    with torch.no_grad():  # class scores of 0.5 everywhere: an untrained head would stay under conf 0.001
        for branch in model.model[-1].cv3:
            branch[-1].bias.zero_()
    weights = tmp_path / "tiny.pt"
    save_checkpoint(weights, model)
    monkeypatch.chdir(tmp_path)  # val_dual.py run in this process (tests/inprocess.py; test_val_cli starts it)
    r = run_script(REPO / "val_dual.py", "--weights", weights, "--data", coco, "--img", IMGSZ, "--batch", "4",
                   "--device", "cpu", "--workers", "0", "--max-det", "20")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads((tmp_path / "runs" / "val" / "exp" / "tiny_predictions.json").read_text())
    assert rows and {r_["image_id"] for r_ in rows} <= set(IMAGES)
    assert {r_["category_id"] for r_ in rows} <= set(coco80_to_coco91())
    assert "Average Precision" in r.stdout + r.stderr


def test_training_on_coco_writes_the_final_json(coco, gelan_mini, tmp_path):
    """As published, the final validation of best.pt on COCO data writes _predictions.json (COCO ids)."""
    from yolov9c.cli.train import parse_opt
    from yolov9c.engine.train.trainer import train

    lines = []
    out = train(parse_opt(["--data", str(coco), "--cfg", gelan_mini, "--img", str(IMGSZ), "--batch", "3",
                           "--epochs", "1", "--workers", "0", "--noplots", "--project", str(tmp_path)]),
                log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    rows = json.loads((out["save_dir"] / "_predictions.json").read_text())
    assert {r["category_id"] for r in rows} <= set(coco80_to_coco91())
    text = "\n".join(lines)
    assert f"Saving {out['save_dir'] / '_predictions.json'}" in text
    # 1 epoch from scratch may leave every score under conf 0.001; with predictions COCO must have run
    assert ("Average Precision" in text) if rows else ("no predictions above the confidence threshold" in text)
