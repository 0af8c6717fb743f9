"""Copy-paste of polygon-labelled objects (hyp key copy_paste), done on the mosaic canvas.

Published semantics (copy_paste, in the mosaic): every object's horizontal mirror image (box x1, x2 -> W - x2, W - x1)
is a candidate when its intersection with every existing box covers less than 30 % of that box's area
(IoA < 0.3); round(p * #candidates) of them, drawn without replacement, are pasted: the pixels inside the
object's polygon are copied from the left-right flipped image to their mirrored place, and the mirrored box
and polygon are appended to the labels. Needs polygons; without them nothing happens and nothing is drawn.
The draws and labels (`paste_draws`) and the source polygons (`paste_sources`) are shared with --gpu-augment's
plan (augment_plan.py), whose op pastes the same pixels (tests/data/test_augment_plan.py).

Test: python -m pytest -q tests/data/test_data_augment.py -k copy_paste
"""

import cv2
import numpy as np


def box_ioa(boxes1, boxes2, eps=1e-7):
    """Intersection of each box1 with each box2 over the area of box2.
    boxes1: (n, 4), boxes2: (m, 4) x1 y1 x2 y2. Returns (n, m) float."""
    b1 = boxes1[:, None, :]
    b2 = boxes2[None, :, :]
    iw = (np.minimum(b1[..., 2], b2[..., 2]) - np.maximum(b1[..., 0], b2[..., 0])).clip(0)
    ih = (np.minimum(b1[..., 3], b2[..., 3]) - np.maximum(b1[..., 1], b2[..., 1])).clip(0)
    area2 = (b2[..., 2] - b2[..., 0]) * (b2[..., 3] - b2[..., 1])
    return iw * ih / (area2 + eps)


def paste_draws(labels, segments, w, rng, p):
    """copy_paste's draws and labels, without pixels (the augment op's plan uses it too: augment_plan.py).
    labels (n, 5), segments (n polygons or []), rng and p as copy_paste's; w: the image width.
    Returns (chosen: (k,) int64 row indices of the pasted objects, in draw order; labels (n + k, 5) float32;
    segments (n + k)). With nothing pasted, chosen is empty and labels/segments are the inputs themselves.
    Draws from rng: one choice without replacement, only when some object is a candidate (round(p * #) > 0)."""
    n = len(segments)
    none = np.zeros(0, np.int64)
    if not p or not n:
        return none, labels, segments
    if n != len(labels):
        raise ValueError(f"copy_paste: {n} segments for {len(labels)} label rows")
    boxes = labels[:, 1:5]
    mirrored = np.stack((w - boxes[:, 2], boxes[:, 1], w - boxes[:, 0], boxes[:, 3]), 1)
    has_polygon = np.array([len(q) > 0 for q in segments])
    candidates = np.nonzero((box_ioa(mirrored, boxes) < 0.30).all(1) & has_polygon)[0]
    k = int(round(p * len(candidates)))
    if k == 0:
        return none, labels, segments
    chosen = rng.choice(candidates, size=k, replace=False)
    new_labels = np.concatenate((labels[chosen, :1], mirrored[chosen]), 1).astype(np.float32)
    labels = np.concatenate((labels, new_labels), 0)
    segments = list(segments) + [np.stack((w - segments[j][:, 0], segments[j][:, 1]), 1) for j in chosen]
    return np.asarray(chosen, np.int64), labels, segments


def paste_sources(segments, chosen, w, h):
    """The source pixels of each pasted object: list of (polygon (k, 2) int32, rectangle (x0, y0, x1, y1) end
    exclusive) for segments[j], j in chosen, on a w x h image. The polygon is truncated to int32 as the
    published drawContours call does; the rectangle is its bounding rectangle cut to the image (objects with
    an empty one are left out). Pixel column c of the filled polygon lands on column w - 1 - c."""
    out = []
    for j in chosen:
        poly = segments[j].astype(np.int32)
        x, y, bw, bh = cv2.boundingRect(poly)
        x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + bw, w), min(y + bh, h)
        if x1 > x0 and y1 > y0:
            out.append((poly, (x0, y0, x1, y1)))
    return out


def copy_paste(img, labels, segments, rng, p=0.5):
    """Paste mirrored copies of some objects.

    img: (H, W, C) uint8 (BGR, or the mosaic's BGRA canvas), modified in place.
    labels: (n, 5) float32 [cls, x1, y1, x2, y2] pixels.
    segments: list of n (k, 2) float32 pixel polygons aligned with labels, or [] (then a no-op); rows with
    an empty polygon (box-only labels) are never pasted.
    rng: numpy.random.Generator. p: the fraction of the candidates pasted.
    Returns (img, labels (n + k, 5) float32, segments (n + k polygons; the input list is not modified)).
    """
    h, w = img.shape[:2]
    chosen, new_labels, new_segments = paste_draws(labels, segments, w, rng, p)
    # Work object by object inside each polygon's bounding rectangle (cheap, however spread out the objects
    # are); read every source before writing any destination so that all pastes come from the image as it
    # was, like one flip of the whole image would.
    pieces = []
    for poly, (x0, y0, x1, y1) in paste_sources(segments, chosen, w, h):
        mask = np.zeros((y1 - y0, x1 - x0), np.uint8)
        cv2.drawContours(mask, [poly], -1, 1, cv2.FILLED, offset=(-x0, -y0))
        pieces.append((x0, y0, x1, y1, cv2.flip(mask, 1), cv2.flip(img[y0:y1, x0:x1], 1)))
    for x0, y0, x1, y1, mask, src in pieces:
        cv2.copyTo(src, mask, img[y0:y1, w - x1:w - x0])  # writes into the view
    return img, new_labels, new_segments
