"""non_max_suppression (yolov9c/engine/postprocess.py): conf filter, multi-label, agnostic, classes filter,
max_det, ordering, box conversion, published input forms, time limit, hybrid labels.

Run: python -m pytest -q tests/engine/test_val_postprocess.py
"""

import pytest
import torch

from yolov9c.engine.postprocess import non_max_suppression, published_time_limit


def make_pred(rows, nc):
    """rows: list of (xc, yc, w, h, {cls: score}) → (1, 4+nc, A) tensor."""
    p = torch.zeros(1, 4 + nc, len(rows))
    for a, (xc, yc, w, h, scores) in enumerate(rows):
        p[0, :4, a] = torch.tensor([xc, yc, w, h])
        for c, s in scores.items():
            p[0, 4 + c, a] = s
    return p


def test_conf_filter_and_xyxy():
    pred = make_pred([(50, 50, 20, 10, {0: 0.9}), (150, 150, 20, 20, {1: 0.2})], nc=2)
    out = non_max_suppression(pred, conf_thres=0.25)
    assert len(out) == 1 and out[0].shape == (1, 6)
    assert out[0][0].tolist() == pytest.approx([40, 45, 60, 55, 0.9, 0])


def test_multi_label_gives_one_row_per_class_above_conf():
    pred = make_pred([(50, 50, 20, 20, {0: 0.6, 1: 0.5, 2: 0.1})], nc=3)
    single = non_max_suppression(pred, conf_thres=0.25)[0]
    multi = non_max_suppression(pred, conf_thres=0.25, multi_label=True)[0]
    assert single.shape[0] == 1 and single[0, 5] == 0
    assert multi.shape[0] == 2 and multi[:, 5].tolist() == [0, 1]
    assert multi[:, 4].tolist() == pytest.approx([0.6, 0.5])
    # agnostic: the two class rows of the same box suppress each other
    agn = non_max_suppression(pred, conf_thres=0.25, multi_label=True, agnostic=True)[0]
    assert agn.shape[0] == 1 and agn[0, 4] == pytest.approx(0.6)


def test_class_aware_vs_agnostic_and_iou():
    rows = [(50, 50, 20, 20, {0: 0.9}), (51, 50, 20, 20, {0: 0.8}), (50, 51, 20, 20, {1: 0.7}),
            (200, 200, 20, 20, {0: 0.6})]
    pred = make_pred(rows, nc=2)
    aware = non_max_suppression(pred, conf_thres=0.25, iou_thres=0.45)[0]
    assert aware[:, 4].tolist() == pytest.approx([0.9, 0.7, 0.6])  # same-class overlap removed only
    agn = non_max_suppression(pred, conf_thres=0.25, iou_thres=0.45, agnostic=True)[0]
    assert agn[:, 4].tolist() == pytest.approx([0.9, 0.6])
    loose = non_max_suppression(pred, conf_thres=0.25, iou_thres=0.99)[0]
    assert loose.shape[0] == 4  # nothing overlaps that much


def test_classes_filter_and_max_det():
    rows = [(20 + 40 * i, 50, 10, 10, {i % 3: 0.9 - 0.05 * i}) for i in range(9)]
    pred = make_pred(rows, nc=3)
    out = non_max_suppression(pred, conf_thres=0.25, classes=[1, 2])[0]
    assert set(out[:, 5].tolist()) == {1.0, 2.0} and out.shape[0] == 6
    top = non_max_suppression(pred, conf_thres=0.25, max_det=4)[0]
    assert top.shape[0] == 4
    assert top[:, 4].tolist() == pytest.approx([0.9, 0.85, 0.8, 0.75])  # sorted, best kept


def test_batch_and_published_forms():
    p = make_pred([(50, 50, 20, 20, {0: 0.9})], nc=2)
    pred = torch.cat((p, torch.zeros_like(p)), 0)  # image 1 has nothing
    out = non_max_suppression(pred)
    assert [o.shape[0] for o in out] == [1, 0]
    maps = [torch.zeros(2, 66, 4, 4)]
    aux = torch.zeros_like(pred)
    for form in ((pred, maps), ([aux, pred], [maps, maps]), [aux, pred]):
        got = non_max_suppression(form)
        assert [o.shape[0] for o in got] == [1, 0]  # the main head (not the empty aux one) is used
    with pytest.raises(ValueError):
        non_max_suppression(torch.zeros(1, 3, 5))
    with pytest.raises(ValueError):
        non_max_suppression(pred, conf_thres=1.5)


def test_time_limit_stops_with_warning():
    p = make_pred([(50, 50, 20, 20, {0: 0.9})], nc=2)
    pred = p.repeat(3, 1, 1)
    with pytest.warns(UserWarning, match="time limit"):
        out = non_max_suppression(pred, time_limit=0.0)
    assert [o.shape[0] for o in out] == [1, 0, 0]
    assert [o.shape[0] for o in non_max_suppression(pred)] == [1, 1, 1]  # default: no limit
    assert published_time_limit(32) == pytest.approx(2.5 + 1.6)


def test_hybrid_labels_are_candidates():
    pred = torch.zeros(1, 6, 3)
    labels = [torch.tensor([[1.0, 100.0, 100.0, 20.0, 20.0]])]
    out = non_max_suppression(pred, labels=labels)[0]
    assert out.shape == (1, 6) and out[0].tolist() == pytest.approx([90, 90, 110, 110, 1.0, 1.0])
