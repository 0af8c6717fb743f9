"""Box geometry used by the YOLOv9 loss: xywh -> xyxy, Complete-IoU, box -> DFL distances.

Conventions (spec/yolov9-reference.md §4): boxes are xyxy (x1, y1, x2, y2) in the last dimension; anchor
points are cell centres (+0.5) in grid units of their level; "distances" are (left, top, right, bottom) from
an anchor point to the box sides, in grid units. The anchor grid (make_anchors) and distance -> box
(dist2bbox) are shared with the heads and live in yolov9c/models/head.py.

Test: python -m pytest -q tests/test_loss.py -k "ciou or anchor or dist"
"""

import math

import torch

CIOU_EPS = 1e-7  # added to heights, union and enclosing diagonal (published metrics.bbox_iou default)


def xywh2xyxy(boxes):
    """(…, 4) centre-x, centre-y, width, height -> (…, 4) x1, y1, x2, y2 (new tensor, same dtype)."""
    xy, wh = boxes[..., :2], boxes[..., 2:4]
    half = wh / 2  # exact in binary floating point, so x ± w/2 is what every implementation computes
    return torch.cat((xy - half, xy + half), dim=-1)


def bbox_ciou(box1, box2, eps=CIOU_EPS):
    """Complete IoU of xyxy boxes, broadcasting over the leading dimensions.

    box1, box2: (…, 4) float tensors (broadcastable). Returns (…) with
        CIoU = IoU − (ρ²/c² + α·v),
        v = 4/π² · (atan(w2/h2) − atan(w1/h1))²,  α = v / (v − IoU + 1 + eps),
    where heights carry +eps, union = w1·h1 + w2·h2 − inter + eps, c² = enclosing-box diagonal² + eps and
    ρ² = squared distance of the centres. α is a constant for autograd (computed under no_grad), as in the
    published loss. Values lie in (−1.5, 1]; the gradient flows into both boxes.
    """
    b1x1, b1y1, b1x2, b1y2 = box1.unbind(-1)
    b2x1, b2y1, b2x2, b2y2 = box2.unbind(-1)
    w1, h1 = b1x2 - b1x1, b1y2 - b1y1 + eps
    w2, h2 = b2x2 - b2x1, b2y2 - b2y1 + eps

    inter = (torch.minimum(b1x2, b2x2) - torch.maximum(b1x1, b2x1)).clamp(0) * (
        torch.minimum(b1y2, b2y2) - torch.maximum(b1y1, b2y1)
    ).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union

    # smallest enclosing box: its squared diagonal normalises the centre distance
    cw = torch.maximum(b1x2, b2x2) - torch.minimum(b1x1, b2x1)
    ch = torch.maximum(b1y2, b2y2) - torch.minimum(b1y1, b2y1)
    c2 = cw**2 + ch**2 + eps
    # (2·Δcentre)² / 4 avoids halving each coordinate first
    rho2 = ((b2x1 + b2x2 - b1x1 - b1x2) ** 2 + (b2y1 + b2y2 - b1y1 - b1y2) ** 2) / 4

    v = (4 / math.pi**2) * torch.pow(torch.atan(w2 / h2) - torch.atan(w1 / h1), 2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


def bbox2dist(points, boxes, max_dist):
    """(A, 2) or (…, 2) anchor points + (…, 4) xyxy boxes -> (…, 4) ltrb distances clamped to [0, max_dist].

    The DFL uses max_dist = reg_max − 1 − 0.01 = 14.99 so that the right bin ⌊t⌋+1 of every target stays
    inside the 16 bins.
    """
    x1y1, x2y2 = boxes.split(2, dim=-1)
    return torch.cat((points - x1y1, x2y2 - points), dim=-1).clamp(0, max_dist)
