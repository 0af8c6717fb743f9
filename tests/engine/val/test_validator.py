"""validate() end to end on a small synthetic val split (8 images, letterboxed with rect pad 0.5):
- a "perfect predictor" (outputs the ground-truth boxes in the head's eval format) gives P = R = 1 and the
  published perfect mAP 0.995, and its --save-txt rows equal the original label files (boxes mapped back
  through the loader's ratio and padding);
- a predictor with one class wrong scores lower; an empty one scores 0;
- a random gelan-t / yolov9-t runs, computes a real val loss (equal to the loss on the same batch) and
  writes the plots.

Run: python -m pytest -q tests/engine/val/test_validator.py
"""

from pathlib import Path

import numpy as np
import pytest
import torch

import yolov9c
from yolov9c.engine.val.validator import ValConfig, validate


@pytest.fixture(scope="module")
def val_data(val_split):
    return val_split(seed=3, imgsz=160, batch=4)


class PerfectPredictor(torch.nn.Module):
    """Replays the loader's targets as DDetect eval output (y (B, 4+nc, A), maps). `wrong`: class ids
    replaced by (c + 1) % nc for every `wrong`-th box."""

    def __init__(self, loader, nc, wrong=0):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))  # gives the validator a device
        self.batches = [t.clone() for _, t, _, _ in loader]
        self.nc, self.wrong, self.calls = nc, wrong, 0

    def forward(self, imgs):
        t = self.batches[self.calls % len(self.batches)]
        self.calls += 1
        b, _, h, w = imgs.shape
        a = max(int(torch.bincount(t[:, 0].long(), minlength=b).max()), 1)
        y = torch.zeros(b, 4 + self.nc, a)
        slot = [0] * b
        for k, (i, c, xc, yc, bw, bh) in enumerate(t.tolist()):
            i, c = int(i), int(c)
            if self.wrong and k % self.wrong == 0:
                c = (c + 1) % self.nc
            y[i, :4, slot[i]] = torch.tensor([xc * w, yc * h, bw * w, bh * h])
            y[i, 4 + c, slot[i]] = 0.9 - 0.001 * slot[i]
            slot[i] += 1
        return y, []


def test_perfect_predictor_scores_perfect(val_data, tmp_path):
    cfg, loader = val_data
    lines = []
    r = validate(PerfectPredictor(loader, cfg["nc"]), loader, nc=cfg["nc"], names=cfg["names"],
                 cfg=ValConfig(save_dir=tmp_path, save_txt=True), log=lines.append)
    assert r["mp"] == pytest.approx(1.0) and r["mr"] == pytest.approx(1.0)
    assert r["map50"] == pytest.approx(0.995, abs=1e-6) and r["map"] == pytest.approx(0.995, abs=1e-6)
    assert r["seen"] == 8 and r["box_loss"] == 0 and len(r["speed"]) == 3
    assert r["maps"].shape == (cfg["nc"],)
    assert any(line.split()[:1] == ["Class"] and "mAP50-95" in line for line in lines)
    assert any(line.split()[:3] == ["all", "8", str(int(r["nt"].sum()))] for line in lines)
    # boxes mapped back to the original 160×160 images equal the label files (to the pixel)
    for txt in sorted((tmp_path / "labels").glob("*.txt")):
        got = np.loadtxt(txt, ndmin=2)
        img = next(p for p in loader.dataset.im_files if Path(p).stem == txt.stem)
        ref = np.loadtxt(img.replace("/images/", "/labels/").rsplit(".", 1)[0] + ".txt", ndmin=2)
        key = lambda m: m[np.lexsort(m.T[::-1])]
        assert got.shape == ref.shape
        assert np.abs(key(got) - key(ref)).max() < 1.5 / 160
    assert len(list((tmp_path / "labels").glob("*.txt"))) == 8


def test_wrong_classes_and_empty_predictions_score_lower(val_data):
    cfg, loader = val_data
    quiet = {"nc": cfg["nc"], "names": cfg["names"], "log": lambda *_: None}
    r = validate(PerfectPredictor(loader, cfg["nc"], wrong=3), loader, **quiet)
    assert 0.2 < r["map50"] < 0.9 and r["mr"] < 1
    empty = PerfectPredictor(loader, cfg["nc"])
    empty.batches = [t[:0] for t in empty.batches]
    r0 = validate(empty, loader, **quiet)
    assert r0["map50"] == 0 and r0["map"] == 0 and r0["nt"].sum() > 0
    # single_cls: wrong classes no longer matter
    r1 = validate(PerfectPredictor(loader, cfg["nc"], wrong=3), loader, cfg=ValConfig(single_cls=True), **quiet)
    assert r1["map50"] == pytest.approx(0.995, abs=1e-6)


@pytest.mark.parametrize("cfg_name", ["gelan-t", "yolov9-t"])
def test_random_model_val_loss_and_plots(val_data, tmp_path, cfg_name):
    cfg, loader = val_data
    torch.manual_seed(0)
    model = yolov9c.build_model(cfg_name, nc=cfg["nc"])
    loss_fn = yolov9c.make_loss(model)
    r = validate(model.train(), loader, nc=cfg["nc"], names=cfg["names"], compute_loss=loss_fn,
                 cfg=ValConfig(save_dir=tmp_path, plots=cfg_name == "gelan-t"), log=lambda *_: None)
    assert model.training  # mode restored
    assert 0 <= r["map"] <= r["map50"] <= 1
    # the val loss is the mean over batches of the loss items on the raw eval maps
    model.eval()
    items = []
    with torch.no_grad():
        for imgs, targets, _, _ in loader:
            items.append(loss_fn(model(imgs.float() / 255)[1], targets)[1])
    ref = torch.stack(items).mean(0)
    got = torch.tensor([r["box_loss"], r["cls_loss"], r["dfl_loss"]])
    assert torch.all(got > 0) and torch.allclose(got, ref.float(), rtol=1e-4)
    if cfg_name == "gelan-t":
        for f in ("confusion_matrix.png", "val_batch0_labels.jpg", "val_batch0_pred.jpg", "val_batch1_pred.jpg"):
            assert (tmp_path / f).stat().st_size > 1000, f


def test_curves_written_when_there_are_true_positives(val_data, tmp_path):
    cfg, loader = val_data
    validate(PerfectPredictor(loader, cfg["nc"], wrong=4), loader, nc=cfg["nc"], names=cfg["names"],
             cfg=ValConfig(save_dir=tmp_path, plots=True), log=lambda *_: None)
    for f in ("PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png", "confusion_matrix.png"):
        assert (tmp_path / f).stat().st_size > 1000, f


def test_caller_weights_untouched(val_data):
    cfg, loader = val_data
    model = PerfectPredictor(loader, cfg["nc"]).double().train()
    r = validate(model, loader, nc=cfg["nc"], names=cfg["names"], log=lambda *_: None)
    assert r["map50"] == pytest.approx(0.995, abs=1e-6)
    assert model.w.dtype == torch.float64 and model.training  # ran on a float32 copy, mode restored
