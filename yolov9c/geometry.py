"""Box geometry, the bottom layer that models, loss, ops, data and engine share (imports only torch/numpy/math).

Conventions (as published): boxes in the last dimension; xyxy = (x1, y1, x2, y2), xywh = (centre-x, centre-y, w, h);
an "n" suffix means normalised by the image size. Anchor points are cell centres (+0.5) in grid units of their
level; distances are (left, top, right, bottom) from an anchor point to the box sides, in grid units.
Letterboxed images are the original scaled by one gain and padded (pad_w, pad_h) on the left/top.
    formats     xywh_to_xyxy, xyxy_to_xywh (torch or numpy); xywhn_to_xyxy, xyxy_to_xywhn (numpy, labels)
    overlap     box_iou (pairwise N×M), bbox_ciou (elementwise, broadcasting: the loss and the assigner)
    anchors     make_anchors, level_anchor_counts, anchors_in_boxes
    DFL         dfl_decode (bin logits -> xyxy), dist2bbox, bbox2dist
    letterbox   scale_boxes (letterboxed pixels -> original pixels), clip_boxes
Numerics are those of the published code (the goldens in tests/models/test_goldens*.py depend on them bit for bit).
Test: python -m pytest -q tests/package/test_geometry.py
"""

import math

import numpy as np
import torch

CIOU_EPS = 1e-7  # added to heights, union and enclosing diagonal (published metrics.bbox_iou default)


# ------------------------------------------------------------------------------------------------ formats

def _cat(parts, like):
    return torch.cat(parts, dim=-1) if torch.is_tensor(like) else np.concatenate(parts, axis=-1)


def xywh_to_xyxy(boxes):
    """(…, 4) centre-x, centre-y, width, height -> (…, 4) x1, y1, x2, y2; a torch tensor or a numpy array
    (new, same dtype)."""
    xy, wh = boxes[..., :2], boxes[..., 2:4]
    half = wh / 2  # exact in binary floating point, so x ± w/2 is what every implementation computes
    return _cat((xy - half, xy + half), boxes)


def xyxy_to_xywh(boxes):
    """(…, 4) x1, y1, x2, y2 -> (…, 4) centre-x, centre-y, width, height; torch or numpy (new, same dtype)."""
    x1y1, x2y2 = boxes[..., :2], boxes[..., 2:4]
    return _cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), boxes)


def xywhn_to_xyxy(x, w, h, padw=0.0, padh=0.0):
    """(n, 4) normalised [xc, yc, w, h] -> (n, 4) float32 pixel [x1, y1, x2, y2] for an image of w × h
    placed at (padw, padh) (a letterbox or a mosaic tile)."""
    y = xywh_to_xyxy(np.asarray(x, np.float32).reshape(-1, 4))
    y[:, 0::2] = w * y[:, 0::2] + padw
    y[:, 1::2] = h * y[:, 1::2] + padh
    return y


def xyxy_to_xywhn(x, w, h, eps=1e-3):
    """(n, 4) pixel [x1, y1, x2, y2] -> (n, 4) float32 normalised [xc, yc, w, h], boxes first clipped to
    [0, w − eps] × [0, h − eps] (published)."""
    x = np.asarray(x, np.float32).reshape(-1, 4).copy()
    np.clip(x[:, 0::2], 0, w - eps, out=x[:, 0::2])
    np.clip(x[:, 1::2], 0, h - eps, out=x[:, 1::2])
    y = xyxy_to_xywh(x)
    y[:, 0::2] /= w
    y[:, 1::2] /= h
    return y


# ------------------------------------------------------------------------------------------------ overlap

def box_iou(a, b, eps=1e-7):
    """IoU of every box in a (N, 4) with every box in b (M, 4), xyxy tensors -> (N, M)."""
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(2)
    area_a = (a[:, 2:] - a[:, :2]).prod(1)
    area_b = (b[:, 2:] - b[:, :2]).prod(1)
    return inter / (area_a[:, None] + area_b[None, :] - inter + eps)


def bbox_ciou(box1, box2, eps=CIOU_EPS):
    """Complete IoU of xyxy boxes, elementwise, broadcasting over the leading dimensions.

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


# ------------------------------------------------------------------------------------------------ anchors

def make_anchors(feats, strides, grid_cell_offset=0.5):
    """Anchor points at cell centres, in grid units of each level, and the stride of every anchor.

    feats: list of (B, C, H_i, W_i) maps; strides: per-level strides. Returns anchor_points (A, 2) as
    (x, y) in row-major order per level, and stride_tensor (A, 1), both in feats[0]'s dtype and device.
    """
    dtype, device = feats[0].dtype, feats[0].device
    points, stride_list = [], []
    for feat, stride in zip(feats, strides):
        h, w = feat.shape[2:]
        sx = torch.arange(w, device=device, dtype=dtype) + grid_cell_offset
        sy = torch.arange(h, device=device, dtype=dtype) + grid_cell_offset
        gy, gx = torch.meshgrid(sy, sx, indexing="ij")
        points.append(torch.stack((gx, gy), -1).view(-1, 2))
        stride_list.append(torch.full((h * w, 1), float(stride), dtype=dtype, device=device))
    return torch.cat(points), torch.cat(stride_list)


def level_anchor_counts(h, w, strides):
    """Anchors per head level for an (h, w) input: ceil(h/s)·ceil(w/s) for each stride, in head order."""
    return [math.ceil(h / float(s)) * math.ceil(w / float(s)) for s in strides]


def anchors_in_boxes(points, gt_boxes, eps=1e-9):
    """Which anchor centres lie strictly inside which boxes.

    points: (A, 2) pixels; gt_boxes: (B, M, 4) xyxy pixels. Returns bool (B, M, A): min(l, t, r, b) > eps,
    where l = x − x1, t = y − y1, r = x2 − x, b = y2 − y. A running minimum, never a (B, M, A, 4) tensor.
    """
    x, y = points[:, 0], points[:, 1]
    x1, y1, x2, y2 = (gt_boxes[..., i : i + 1] for i in range(4))  # each (B, M, 1)
    d = torch.minimum(x - x1, y - y1)
    d = torch.minimum(d, x2 - x)
    d = torch.minimum(d, y2 - y)
    return d > eps


# ------------------------------------------------------------------------------------------------ DFL

def dist2bbox(distance, anchor_points, xywh=True, dim=-1):
    """(left, top, right, bottom) distances from anchor points -> boxes, xywh or xyxy along `dim`."""
    lt, rb = distance.chunk(2, dim)
    x1y1 = anchor_points - lt
    x2y2 = anchor_points + rb
    if xywh:
        return torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), dim)
    return torch.cat((x1y1, x2y2), dim)


def bbox2dist(points, boxes, max_dist):
    """(A, 2) or (…, 2) anchor points + (…, 4) xyxy boxes -> (…, 4) ltrb distances clamped to [0, max_dist].

    The DFL uses max_dist = reg_max − 1 − 0.01 = 14.99 so that the right bin ⌊t⌋+1 of every target stays
    inside the 16 bins.
    """
    x1y1, x2y2 = boxes.split(2, dim=-1)
    return torch.cat((points - x1y1, x2y2 - points), dim=-1).clamp(0, max_dist)


def dfl_decode(pred_dist, points, reg_max=16):
    """DFL expectation as boxes: (B, A, 4·reg_max) bin logits -> (B, A, 4) xyxy around `points` (A, 2),
    grid units, in pred_dist's dtype: softmax over each side's bins · [0, 1, …, reg_max − 1] gives the ltrb
    distances (the published loss's decode; the heads do the same with a fixed 1×1 conv, models/head.DFL)."""
    B, A = pred_dist.shape[:2]
    proj = torch.arange(reg_max, device=pred_dist.device, dtype=pred_dist.dtype)
    ltrb = pred_dist.view(B, A, 4, reg_max).softmax(-1).matmul(proj)
    return dist2bbox(ltrb, points, xywh=False)


# ------------------------------------------------------------------------------------------------ letterbox

def clip_boxes(boxes, shape):
    """Clip xyxy boxes (n, ≥4) in place to an image of shape (h, w); returns boxes."""
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clamp(0, shape[1])
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clamp(0, shape[0])
    return boxes


def scale_boxes(boxes, from_shape, to_shape, ratio_pad=None):
    """Map xyxy boxes (n, ≥4) tensor from a letterboxed image back to the original, in place, and clip them.

    from_shape: (h, w) of the letterboxed image; to_shape: (h0, w0) of the original. ratio_pad: the
    loader's ((gain_h, gain_w), (pad_w, pad_h)) (the published code uses the first gain for both axes), or
    None to recompute the letterbox from the two shapes (one gain, even padding), as detect does.
    """
    if ratio_pad is None:
        gain = min(from_shape[0] / to_shape[0], from_shape[1] / to_shape[1])
        pad = ((from_shape[1] - to_shape[1] * gain) / 2, (from_shape[0] - to_shape[0] * gain) / 2)
    else:
        gain, pad = ratio_pad[0][0], ratio_pad[1]
    boxes[:, [0, 2]] -= pad[0]
    boxes[:, [1, 3]] -= pad[1]
    boxes[:, :4] /= gain
    return clip_boxes(boxes, to_shape)
