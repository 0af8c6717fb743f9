"""Copy-paste of polygon-labelled objects (hyp key copy_paste), done on the mosaic canvas.

Published semantics (spec §5, mosaic step): every object's horizontal mirror image (box x1, x2 -> W - x2, W - x1)
is a candidate when its intersection with every existing box covers less than 30 % of that box's area
(IoA < 0.3); round(p * #candidates) of them, drawn without replacement, are pasted: the pixels inside the
object's polygon are copied from the left-right flipped image to their mirrored place, and the mirrored box
and polygon are appended to the labels. Needs polygons; without them nothing happens and nothing is drawn.

Test: python -m pytest -q tests/test_data_augment.py -k copy_paste
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


def copy_paste(img, labels, segments, rng, p=0.5):
    """Paste mirrored copies of some objects.

    img: (H, W, C) uint8 (BGR, or the mosaic's BGRA canvas), modified in place.
    labels: (n, 5) float32 [cls, x1, y1, x2, y2] pixels.
    segments: list of n (k, 2) float32 pixel polygons aligned with labels, or [] (then a no-op); rows with
    an empty polygon (box-only labels) are never pasted.
    rng: numpy.random.Generator. p: the fraction of the candidates pasted.
    Returns (img, labels (n + k, 5) float32, segments (n + k polygons; the input list is not modified)).
    """
    n = len(segments)
    if not p or not n:
        return img, labels, segments
    if n != len(labels):
        raise ValueError(f"copy_paste: {n} segments for {len(labels)} label rows")
    h, w = img.shape[:2]
    boxes = labels[:, 1:5]
    mirrored = np.stack((w - boxes[:, 2], boxes[:, 1], w - boxes[:, 0], boxes[:, 3]), 1)
    has_polygon = np.array([len(q) > 0 for q in segments])
    candidates = np.nonzero((box_ioa(mirrored, boxes) < 0.30).all(1) & has_polygon)[0]
    k = int(round(p * len(candidates)))
    if k == 0:
        return img, labels, segments
    chosen = rng.choice(candidates, size=k, replace=False)

    # Pixel column c lands on w - 1 - c. Work object by object inside each polygon's bounding rectangle
    # (cheap, however spread out the objects are); read every source before writing any destination so
    # that all pastes come from the image as it was, like one flip of the whole image would.
    pieces = []
    for j in chosen:
        poly = segments[j].astype(np.int32)  # truncation, as the published drawContours call does
        x, y, bw, bh = cv2.boundingRect(poly)
        x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + bw, w), min(y + bh, h)
        if x1 <= x0 or y1 <= y0:
            continue
        mask = np.zeros((y1 - y0, x1 - x0), np.uint8)
        cv2.drawContours(mask, [poly], -1, 1, cv2.FILLED, offset=(-x0, -y0))
        pieces.append((x0, y0, x1, y1, cv2.flip(mask, 1), cv2.flip(img[y0:y1, x0:x1], 1)))
    for x0, y0, x1, y1, mask, src in pieces:
        cv2.copyTo(src, mask, img[y0:y1, w - x1:w - x0])  # writes into the view

    new_labels = np.concatenate((labels[chosen, :1], mirrored[chosen]), 1).astype(np.float32)
    labels = np.concatenate((labels, new_labels), 0)
    segments = list(segments) + [np.stack((w - segments[j][:, 0], segments[j][:, 1]), 1) for j in chosen]
    return img, labels, segments
