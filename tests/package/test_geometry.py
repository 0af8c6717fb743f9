"""Box geometry (yolov9c/geometry.py) on hand-computed cases: format conversions and their round trips (torch
and numpy), IoU / CIoU values and the CIoU gradient, the anchor grid, DFL decode and distances, the letterbox
rescale (both forms: the loader's ratio_pad and the one recomputed from the shapes).

Run: python -m pytest -q tests/package/test_geometry.py
"""

import ast
import math
from pathlib import Path

import numpy as np
import torch

from yolov9c import geometry
from yolov9c.geometry import (
    anchors_in_boxes,
    bbox2dist,
    bbox_ciou,
    box_iou,
    dfl_decode,
    dist2bbox,
    level_anchor_counts,
    make_anchors,
    scale_boxes,
    xywh_to_xyxy,
    xywhn_to_xyxy,
    xyxy_to_xywh,
    xyxy_to_xywhn,
)


def test_geometry_is_the_bottom_layer():
    """It imports only torch, numpy and math: nothing of yolov9c, so every layer may use it."""
    tree = ast.parse(Path(geometry.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names == {"math", "numpy", "torch"}


# -- formats --------------------------------------------------------------------------------------------------


def test_xywh_xyxy_hand_case_and_round_trips():
    assert xywh_to_xyxy(torch.tensor([10.0, 20.0, 4.0, 6.0])).tolist() == [8.0, 17.0, 12.0, 23.0]
    assert xyxy_to_xywh(torch.tensor([8.0, 17.0, 12.0, 23.0])).tolist() == [10.0, 20.0, 4.0, 6.0]
    got = xywh_to_xyxy(np.array([[10.0, 20.0, 4.0, 6.0]], np.float32))
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.tolist() == [[8.0, 17.0, 12.0, 23.0]]
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 7, 4, generator=g, dtype=torch.float64) * 100
    assert xywh_to_xyxy(x).shape == (3, 7, 4) and xywh_to_xyxy(x).dtype == torch.float64
    assert torch.allclose(xyxy_to_xywh(xywh_to_xyxy(x)), x, rtol=0, atol=1e-12)
    xn = x.numpy()
    assert np.allclose(xywh_to_xyxy(xyxy_to_xywh(xn)), xn, rtol=0, atol=1e-12)
    assert np.array_equal(xywh_to_xyxy(xn), xywh_to_xyxy(x).numpy())  # the same numbers from both libraries


def test_normalised_boxes_with_padding():
    # a 100×50 image placed at (10, 5): centre (0.5, 0.5) → (60, 30), size 0.2×0.4 → 20×20
    got = xywhn_to_xyxy([[0.5, 0.5, 0.2, 0.4]], 100, 50, padw=10, padh=5)
    assert got.dtype == np.float32 and got.tolist() == [[50.0, 20.0, 70.0, 40.0]]
    back = xyxy_to_xywhn(xywhn_to_xyxy([[0.25, 0.75, 0.5, 0.25]], 64, 32), 64, 32)
    assert np.allclose(back, [[0.25, 0.75, 0.5, 0.25]], atol=1e-7)
    # boxes are first clipped to [0, w − 1e-3] × [0, h − 1e-3]
    clipped = xyxy_to_xywhn([[-5.0, -5.0, 120.0, 60.0]], 100, 50)
    assert np.allclose(clipped, [[99.999 / 200, 49.999 / 100, 99.999 / 100, 49.999 / 50]], atol=1e-6)


def test_ciou_hand_values():
    b = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    # concentric, same aspect ratio: CIoU = IoU = 4 / 16
    assert abs(bbox_ciou(b(0, 0, 2, 2), b(-1, -1, 3, 3)).item() - 0.25) < 1e-6
    # disjoint, same shape, centres 3 apart: IoU 0, ρ² = 9, enclosing 5×2 -> c² = 29
    assert abs(bbox_ciou(b(0, 0, 2, 2), b(3, 0, 5, 2)).item() - (-9 / 29)) < 1e-6
    # different aspect ratios: (0,0,2,2) vs (0,0,2,1): IoU 1/2, ρ² = 0.25, c² = 8
    v = 4 / math.pi**2 * (math.atan(2 / 1) - math.atan(2 / 2)) ** 2
    alpha = v / (v - 0.5 + 1)
    want = 0.5 - (0.25 / 8 + alpha * v)
    assert abs(bbox_ciou(b(0, 0, 2, 2), b(0, 0, 2, 1)).item() - want) < 1e-6
    # broadcasting (M, 1, 4) × (1, A, 4) -> (M, A), symmetric in its arguments
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 1, 4, generator=g, dtype=torch.float64) + torch.tensor([0, 0, 1, 1], dtype=torch.float64)
    y = torch.rand(1, 5, 4, generator=g, dtype=torch.float64) + torch.tensor([0, 0, 1, 1], dtype=torch.float64)
    assert bbox_ciou(x, y).shape == (3, 5)
    assert torch.allclose(bbox_ciou(x, y), bbox_ciou(y, x), rtol=1e-12)
    assert (bbox_ciou(x, y) <= 1).all() and (bbox_ciou(x, y) > -1.5).all()


def test_ciou_gradient_treats_alpha_as_constant():
    """d CIoU / d box equals the numerical derivative of IoU − ρ²/c² − α₀·v with α frozen at its value."""
    b1 = torch.tensor([1.0, 2.0, 4.0, 3.5], dtype=torch.float64, requires_grad=True)
    b2 = torch.tensor([1.5, 1.0, 5.0, 5.0], dtype=torch.float64)
    bbox_ciou(b1, b2).backward()
    eps = 1e-7

    def parts(x):
        w1, h1 = x[2] - x[0], x[3] - x[1] + eps
        w2, h2 = b2[2] - b2[0], b2[3] - b2[1] + eps
        inter = (min(x[2], b2[2]) - max(x[0], b2[0])).clamp(0) * (min(x[3], b2[3]) - max(x[1], b2[1])).clamp(0)
        iou = inter / (w1 * h1 + w2 * h2 - inter + eps)
        c2 = (max(x[2], b2[2]) - min(x[0], b2[0])) ** 2 + (max(x[3], b2[3]) - min(x[1], b2[1])) ** 2 + eps
        rho2 = ((b2[0] + b2[2] - x[0] - x[2]) ** 2 + (b2[1] + b2[3] - x[1] - x[3]) ** 2) / 4
        v = 4 / math.pi**2 * (torch.atan(w2 / h2) - torch.atan(w1 / h1)) ** 2
        return iou, rho2 / c2, v

    x0 = b1.detach()
    iou0, _, v0 = parts(x0)
    alpha0 = v0 / (v0 - iou0 + 1 + eps)
    f = lambda x: (lambda i, d, v: i - d - alpha0 * v)(*parts(x))  # noqa: E731
    num = torch.stack([(f(x0 + h) - f(x0 - h)) / 2e-6 for h in torch.eye(4, dtype=torch.float64) * 1e-6])
    assert torch.allclose(b1.grad, num, atol=1e-7), (b1.grad, num)
    # and it differs from the full derivative (α depending on the box), so the freeze is what is tested
    g = lambda x: (lambda i, d, v: i - d - v * v / (v - i + 1 + eps))(*parts(x))  # noqa: E731
    full = torch.stack([(g(x0 + h) - g(x0 - h)) / 2e-6 for h in torch.eye(4, dtype=torch.float64) * 1e-6])
    assert (full - num).abs().max() > 1e-4


def test_anchor_grid_and_distances():
    feats = [torch.zeros(1, 1, 4, 6), torch.zeros(1, 1, 2, 3)]
    pts, st = make_anchors(feats, [8, 16])
    assert pts.shape == (24 + 6, 2) and st.shape == (30, 1)
    assert pts[0].tolist() == [0.5, 0.5] and pts[5].tolist() == [5.5, 0.5] and pts[6].tolist() == [0.5, 1.5]
    assert pts[24].tolist() == [0.5, 0.5] and pts[-1].tolist() == [2.5, 1.5]
    assert st[:24].eq(8).all() and st[24:].eq(16).all()
    # dist2bbox and bbox2dist invert each other inside the clamp range, which is [0, 14.99]
    d = torch.rand(2, 30, 4, dtype=torch.float64) * 14
    boxes = dist2bbox(d, pts.double(), xywh=False)
    assert torch.allclose(bbox2dist(pts.double(), boxes, 14.99), d, atol=1e-12)
    far = torch.tensor([[-30.0, 0.0, 40.0, 1.0]], dtype=torch.float64)
    assert bbox2dist(torch.tensor([[0.5, 0.5]], dtype=torch.float64), far, 14.99).tolist() == [[14.99, 0.5, 14.99, 0.5]]
    assert xywh_to_xyxy(torch.tensor([10.0, 20.0, 4.0, 6.0])).tolist() == [8.0, 17.0, 12.0, 23.0]



def test_box_iou_hand_cases():
    a = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    b = torch.tensor([[0.0, 0.0, 10.0, 10.0], [5.0, 0.0, 15.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    iou = box_iou(a, b)
    assert iou.shape == (1, 3)
    # identical → 1; half overlap: 50 / (100 + 100 - 50) = 1/3; disjoint → 0
    assert torch.allclose(iou, torch.tensor([[1.0, 1 / 3, 0.0]]), atol=1e-6)


    # pairwise: (N, 4) × (M, 4) → (N, M), symmetric
    g = torch.Generator().manual_seed(1)
    x = torch.rand(4, 4, generator=g, dtype=torch.float64) + torch.tensor([0, 0, 1, 1], dtype=torch.float64)
    y = torch.rand(6, 4, generator=g, dtype=torch.float64) + torch.tensor([0, 0, 1, 1], dtype=torch.float64)
    assert box_iou(x, y).shape == (4, 6) and torch.allclose(box_iou(x, y), box_iou(y, x).T, rtol=1e-12)


def test_ciou_equals_iou_for_concentric_boxes_of_one_shape():
    # same centre and aspect ratio: ρ² = 0 and v = 0, so CIoU is the plain IoU (36 / 100 here)
    a = torch.tensor([[2.0, 2.0, 8.0, 8.0]], dtype=torch.float64)
    b = torch.tensor([[0.0, 0.0, 10.0, 10.0]], dtype=torch.float64)
    assert abs(bbox_ciou(a[0], b[0]).item() - 0.36) < 1e-6
    assert abs(box_iou(a, b).item() - 0.36) < 1e-6


# -- anchors and DFL --------------------------------------------------------------------------------------------


def test_anchor_counts_match_the_grid_for_odd_inputs():
    h, w, strides = 100, 70, (8, 16, 32)
    counts = level_anchor_counts(h, w, strides)
    assert counts == [13 * 9, 7 * 5, 4 * 3]
    feats = [torch.zeros(2, 3, math.ceil(h / s), math.ceil(w / s), dtype=torch.float64) for s in strides]
    pts, st = make_anchors(feats, strides)
    assert pts.shape == (sum(counts), 2) and pts.dtype == torch.float64 and st.dtype == torch.float64
    assert st.view(-1).tolist() == [8.0] * counts[0] + [16.0] * counts[1] + [32.0] * counts[2]
    assert pts[counts[0] - 1].tolist() == [8.5, 12.5]  # the last cell of the first level: (x, y) = (W−½, H−½)


def test_anchors_strictly_inside_boxes():
    points = torch.tensor([[1.0, 1.0], [3.0, 1.0], [2.0, 2.0], [0.5, 1.5]])
    boxes = torch.tensor([[[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0]]])  # (B=1, M=2): a box and a padding row
    got = anchors_in_boxes(points, boxes)
    assert got.shape == (1, 2, 4)
    # (2, 2) sits on the corner: not strictly inside; the zero padding box holds nothing
    assert got.tolist() == [[[True, False, False, True], [False, False, False, False]]]


def test_dfl_decode_hand_case():
    # one-hot bin logits: the expectation is the bin index; uniform logits give the mean bin (15 / 2)
    logits = torch.full((1, 2, 4, 16), -1e4, dtype=torch.float64)
    for side, bin_ in enumerate((1, 2, 3, 4)):
        logits[0, 0, side, bin_] = 0.0
    logits[0, 1] = 0.0
    points = torch.tensor([[5.5, 5.5], [10.0, 10.0]], dtype=torch.float64)
    boxes = dfl_decode(logits.view(1, 2, 64), points, 16)
    assert boxes.shape == (1, 2, 4) and boxes.dtype == torch.float64
    assert torch.allclose(boxes[0, 0], torch.tensor([4.5, 3.5, 8.5, 9.5], dtype=torch.float64))
    assert torch.allclose(boxes[0, 1], torch.tensor([2.5, 2.5, 17.5, 17.5], dtype=torch.float64))
    # and bbox2dist takes the box back to the distances (inside the clamp)
    assert torch.allclose(bbox2dist(points, boxes[0], 14.99)[0], torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64))
    d = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert dist2bbox(d, torch.tensor([[10.0, 20.0]])).tolist() == [[11.0, 21.0, 4.0, 6.0]]  # xywh


# -- letterbox --------------------------------------------------------------------------------------------------


def test_scale_boxes_undoes_a_letterbox_by_hand():
    # a 300×400 (h×w) image letterboxed into 320×320: gain min(320/300, 320/400) = 0.8 → 240×320, padded 40 px
    # on top and bottom. The original box (100, 50, 200, 150) sits at (80, 80, 160, 160) in the letterbox.
    lb = torch.tensor([[80.0, 80.0, 160.0, 160.0, 0.5, 1.0]])
    out = scale_boxes(lb, (320, 320), (300, 400))
    assert out is lb and out.tolist() == [[100.0, 50.0, 200.0, 150.0, 0.5, 1.0]]  # in place; extra columns kept
    # the loader's form ((gain_h, gain_w), (pad_w, pad_h)) gives the same
    lb = torch.tensor([[80.0, 80.0, 160.0, 160.0]])
    assert scale_boxes(lb, (320, 320), (300, 400), ((0.8, 0.8), (0.0, 40.0))).tolist() == [[100.0, 50.0, 200.0, 150.0]]
    # outside the image: clipped to [0, w0] × [0, h0]
    far = torch.tensor([[-10.0, 30.0, 330.0, 300.0]])
    assert scale_boxes(far, (320, 320), (300, 400)).tolist() == [[0.0, 0.0, 400.0, 300.0]]
