"""Validation metrics on hand-computed cases: IoU, 101-point AP, P/R at best F1, greedy matching, confusion
matrix, fitness. Expected numbers are derived in the comments (trapezoids over the 101 recall points).

Run: python -m pytest -q tests/engine/val/test_metrics.py
"""

import numpy as np
import pytest
import torch

from yolov9c.engine.val.metrics import (
    ConfusionMatrix,
    ap_per_class,
    compute_ap,
    fitness,
    match_predictions,
    smooth,
)


def test_ap_perfect_curve_is_0995():
    # precision 1 up to recall 1; the sentinel (recall 1, precision 0) makes the last 0.01 step a
    # trapezoid (1 + 0) / 2 · 0.01, so AP = 0.99 + 0.005 (the published figure for perfect boxes)
    ap, _, _ = compute_ap(np.array([0.5, 1.0]), np.array([1.0, 1.0]))
    assert ap == pytest.approx(0.995, abs=1e-9)


def test_ap_known_curve_linear_interpolation():
    # recall [0.5, 1], precision [1, 0.5]: envelope 1 on [0, 0.5], then linear 1 → 0.5 on [0.5, 1] except the
    # last point (sentinel precision 0 at recall 1): 0.5 + (1 + 0.51) / 2 · 0.49 + (0.51 + 0) / 2 · 0.01
    ap, _, _ = compute_ap(np.array([0.5, 1.0]), np.array([1.0, 0.5]))
    assert ap == pytest.approx(0.5 + 1.51 / 2 * 0.49 + 0.51 / 2 * 0.01, abs=1e-9)


def test_ap_missed_label_halves_recall():
    # one TP out of two labels: recall 0.5 at precision 1, then linear down to the sentinel (1, 0):
    # 0.5 · 1 + triangle 0.5 · 0.5 · 1 = 0.75
    ap, _, _ = compute_ap(np.array([0.5]), np.array([1.0]))
    assert ap == pytest.approx(0.75, abs=1e-9)


def test_ap_per_class_perfect_two_classes():
    tp = np.ones((4, 10), bool)
    conf = np.array([0.9, 0.8, 0.7, 0.6])
    pred_cls = np.array([0, 1, 0, 1])
    res = ap_per_class(tp, conf, pred_cls, np.array([0, 0, 1, 1]))
    assert res["classes"].tolist() == [0, 1]
    assert np.allclose(res["ap"], 0.995)
    assert np.allclose(res["p"], 1.0) and np.allclose(res["r"], 1.0)
    assert res["tp_count"].tolist() == [2, 2] and res["fp_count"].tolist() == [0, 0]


def test_ap_per_class_false_positive_order_matters():
    target = np.array([0])
    tp = np.array([[True] * 10, [False] * 10])
    # FP ranked after the TP: recall already 1 at precision 1 → same as perfect
    late = ap_per_class(tp, np.array([0.9, 0.8]), np.array([0, 0]), target)
    assert late["ap"][0, 0] == pytest.approx(0.995, abs=1e-9)
    # FP ranked first: precision 0.5 at recall 1 → the envelope is 0.5 almost everywhere (≈ 0.5)
    early = ap_per_class(tp, np.array([0.8, 0.9]), np.array([0, 0]), target)
    assert early["ap"][0, 0] == pytest.approx(0.5, abs=3e-3)
    assert early["ap"][0, 0] < late["ap"][0, 0] - 0.4


def test_ap_per_class_excludes_classes_without_labels():
    tp = np.array([[True] * 10, [False] * 10])
    res = ap_per_class(tp, np.array([0.9, 0.8]), np.array([0, 5]), np.array([0]))
    assert res["classes"].tolist() == [0]  # class 5 has only a false positive and no label: not averaged
    assert res["ap"].shape == (1, 10)
    assert res["ap"][0, 0] == pytest.approx(0.995, abs=1e-9)


def test_ap_per_class_partial_iou():
    # one detection with IoU 0.72: TP at 0.50 … 0.70 (5 thresholds), FP above → mAP50-95 = 0.995 · 5 / 10
    tp = np.array([[True] * 5 + [False] * 5])
    res = ap_per_class(tp, np.array([0.9]), np.array([0]), np.array([0]))
    assert res["ap"][0].mean() == pytest.approx(0.995 * 0.5, abs=1e-9)


def test_match_greedy_uniqueness_published_order():
    labels = torch.tensor([[0.0, 0.0, 0.0, 10.0, 10.0]])
    det = torch.tensor([[0.0, 0.0, 10.0, 9.0, 0.9, 0.0],   # IoU 0.9, most confident
                        [0.0, 0.0, 10.0, 10.0, 0.8, 0.0],  # IoU 1.0
                        [0.0, 0.0, 10.0, 10.0, 0.7, 1.0]])  # wrong class: never a TP
    correct = match_predictions(det, labels)
    assert correct.shape == (3, 10) and correct.dtype == torch.bool
    thr = np.linspace(0.5, 0.95, 10)
    # one TP per threshold: the lowest-index (most confident) qualifying detection takes the label
    assert correct.sum(0).tolist() == [1] * 10
    assert correct[0].tolist() == (thr <= 0.9 + 1e-9).tolist()
    assert correct[1].tolist() == (thr > 0.9 + 1e-9).tolist()
    assert not correct[2].any()


def test_match_one_detection_two_labels():
    labels = torch.tensor([[0.0, 0.0, 0.0, 10.0, 10.0], [0.0, 1.0, 0.0, 11.0, 10.0]])
    det = torch.tensor([[0.0, 0.0, 10.0, 10.0, 0.9, 0.0]])
    correct = match_predictions(det, labels)
    assert correct.shape == (1, 10) and correct.all()  # matched once (to the IoU-1 label), at every threshold
    assert match_predictions(det[:0], labels).shape == (0, 10)
    assert not match_predictions(det, labels[:0]).any()


def test_confusion_matrix_counts():
    cm = ConfusionMatrix(nc=2)
    labels = torch.tensor([[0.0, 0.0, 0.0, 10.0, 10.0], [1.0, 50.0, 50.0, 60.0, 60.0]])
    det = torch.tensor([[0.0, 0.0, 10.0, 10.0, 0.9, 1.0],      # matches label 0 but says class 1
                        [100.0, 100.0, 110.0, 110.0, 0.8, 0.0],  # spurious
                        [50.0, 50.0, 60.0, 60.0, 0.1, 1.0]])    # below conf 0.25: ignored → label 1 missed
    cm.process_batch(det, labels)
    m = cm.matrix  # [predicted, true]; index 2 = background
    assert m[1, 0] == 1 and m[2, 1] == 1 and m[0, 2] == 1
    assert m.sum() == 3
    cm.process_batch(None, torch.tensor([0.0, 0.0]))
    assert m[2, 0] == 2


def test_fitness_and_smooth():
    assert fitness(0.3, 0.4, 0.5, 0.2) == pytest.approx(0.1 * 0.5 + 0.9 * 0.2)
    y = np.zeros(1000)
    y[500] = 1.0
    s = smooth(y, 0.1)  # box filter of 101 samples
    assert s.shape == (1000,)
    assert np.count_nonzero(s > 1e-12) == 101 and s.max() == pytest.approx(1 / 101)
    assert np.allclose(smooth(np.full(1000, 0.3), 0.1), 0.3)
