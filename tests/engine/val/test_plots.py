"""Validation batch mosaics (yolov9c/engine/val/plots.py): val_batch*_pred.jpg draws only predictions above
confidence 0.25, as the published plots do; label mosaics draw every box.

Run: python -m pytest -q tests/engine/val/test_plots.py
"""

import cv2
import numpy as np
import torch

from yolov9c.engine.val.plots import PRED_CONF_THRES, boxes_to_draw, plot_images


def _box_pixels(mosaic, xc, yc, w, h):
    """Largest channel value on the outline of the box (xc, yc, w, h), in pixels of a 2x2 mosaic's tile 0
    (the top edge, away from the label text above it)."""
    x1, x2, y = int(xc - w / 2), int(xc + w / 2), int(yc + h / 2)
    return int(mosaic[y, x1 + 2:x2 - 1].max())


def test_boxes_to_draw_keeps_labels_and_confident_predictions():
    labels = np.array([[0, 1, 10, 10, 4, 4], [1, 0, 20, 20, 4, 4]], np.float32)
    assert boxes_to_draw(labels).shape == (2, 6)
    preds = np.array([[0, 1, 10, 10, 4, 4, 0.9], [0, 1, 20, 20, 4, 4, 0.1],
                      [0, 1, 30, 30, 4, 4, PRED_CONF_THRES], [1, 0, 5, 5, 2, 2, 0.26]], np.float32)
    kept = boxes_to_draw(preds)
    assert PRED_CONF_THRES == 0.25
    assert kept[:, 6].tolist() == [np.float32(0.9), np.float32(0.26)]  # strictly above 0.25, as published
    assert boxes_to_draw(preds, conf_thres=0.0).shape == (4, 7)
    assert boxes_to_draw(np.zeros((0, 7), np.float32)).shape == (0, 7)


def test_pred_mosaic_draws_only_boxes_above_025(tmp_path):
    imgs = torch.zeros(2, 3, 64, 64)  # black tiles: any drawn outline shows up
    confident, faint = (20.0, 24.0, 16.0, 16.0), (44.0, 48.0, 16.0, 16.0)
    preds = torch.tensor([[0, 0, *confident, 0.9], [0, 1, *faint, 0.1]])
    out = tmp_path / "val_batch0_pred.png"  # lossless, so pixel checks are exact
    plot_images(imgs, preds, ["a.jpg", "b.jpg"], out, ["x", "y"])
    mosaic = cv2.imread(str(out))
    assert mosaic.shape == (128, 128, 3)
    assert _box_pixels(mosaic, *confident) > 0
    assert _box_pixels(mosaic, *faint) == 0
    # labels carry no confidence: both boxes are drawn
    out_labels = tmp_path / "val_batch0_labels.png"
    plot_images(imgs, preds[:, :6], ["a.jpg", "b.jpg"], out_labels, ["x", "y"])
    labels = cv2.imread(str(out_labels))
    assert _box_pixels(labels, *confident) > 0 and _box_pixels(labels, *faint) > 0
