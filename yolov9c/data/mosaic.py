"""4-image mosaic (hyp key mosaic) followed by copy-paste and random perspective: one training sample.

Published semantics (load_mosaic): a 2s x 2s canvas of grey 114; centre (xc, yc) each int(U(s/2, 3s/2));
the requested image plus 3 drawn with replacement, shuffled, placed top-left/top-right/bottom-left/bottom-right
with a corner at the centre (overflow cut); labels and polygons shifted and clipped to [0, 2s]; then
`copy_paste` (p = hyp copy_paste, polygons only) and `random_perspective` with border -s/2 (back to s x s).
Deliberate differences (visible only with polygons or degrees/shear/perspective > 0):
- objects entirely off the canvas are dropped after clipping (the published zero-width edge boxes can warp
  into boxes with area that label nothing in the image);
- polygons are clipped as polygons (Sutherland-Hodgman), not by clamping points, so the box later taken from a
  polygon does not overshoot the visible part.
Polygons stay aligned with label rows: box-only rows of a mosaic that has polygons get empty polygons.
Test: python -m pytest -q tests/data/test_data_augment.py -k mosaic
"""

import cv2
import numpy as np

from yolov9c.data.copy_paste import copy_paste
from yolov9c.data.perspective import polygon_boxes, random_perspective
from yolov9c.geometry import xywhn_to_xyxy
from yolov9c.resources import WARP_KEYS

HYP_KEYS = (*WARP_KEYS, "copy_paste")  # what load_mosaic reads
_EMPTY_POLYGON = np.zeros((0, 2), np.float32)


def _place(tile, dst):
    """Copy a BGR tile (h, w, 3) into a view dst (h, w, 4) of the BGRA canvas."""
    out = cv2.cvtColor(tile, cv2.COLOR_BGR2BGRA, dst=dst)
    if not np.shares_memory(out, dst):  # OpenCV could not write into the view: copy the slow way
        dst[..., :3] = tile


def _placement(i, xc, yc, w, h, s):
    """Canvas rectangle (x1a, y1a, x2a, y2a) and image rectangle (x1b, y1b, x2b, y2b) of tile i (0 top-left,
    1 top-right, 2 bottom-left, 3 bottom-right) for an image of w x h with its corner at the centre."""
    if i == 0:
        x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
        x1b, y1b, x2b, y2b = w - (x2a - x1a), h - (y2a - y1a), w, h
    elif i == 1:
        x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, 2 * s), yc
        x1b, y1b, x2b, y2b = 0, h - (y2a - y1a), min(w, x2a - x1a), h
    elif i == 2:
        x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(2 * s, yc + h)
        x1b, y1b, x2b, y2b = w - (x2a - x1a), 0, w, min(y2a - y1a, h)
    else:
        x1a, y1a, x2a, y2a = xc, yc, min(xc + w, 2 * s), min(2 * s, yc + h)
        x1b, y1b, x2b, y2b = 0, 0, min(w, x2a - x1a), min(y2a - y1a, h)
    return (x1a, y1a, x2a, y2a), (x1b, y1b, x2b, y2b)


def mosaic_tiles(index, n_images, load_image, labels, segments, img_size, rng):
    """The random layout of one mosaic and its labels, without the pixels (load_mosaic's first half; the
    augment op's plan, yolov9c/data/augment_plan.py, uses it too). Arguments as load_mosaic's.
    Returns (images: the 4 source images in tile order, each (h, w, 3) uint8 as load_image gave it;
    places: 4 pairs (canvas rectangle (x1a, y1a, x2a, y2a), image rectangle (x1b, y1b, x2b, y2b)), an empty
    canvas rectangle for a tile that falls off; labels (m, 5) float32 [cls, x1, y1, x2, y2] canvas pixels of
    the visible objects; segments: m canvas pixel polygons; any_polygons: whether some image had polygons).
    Draws from rng: the centre (2 uniforms), 3 indices, one shuffle."""
    s = int(img_size)
    half = s // 2
    yc = int(rng.uniform(half, 2 * s - half))
    xc = int(rng.uniform(half, 2 * s - half))
    indices = np.concatenate(([index], rng.integers(0, n_images, 3)))
    rng.shuffle(indices)

    images, places, labels4, segments4, any_polygons = [], [], [], [], False
    for i, k in enumerate(indices):
        img, _, _ = load_image(int(k))
        h, w = img.shape[:2]
        (x1a, y1a, x2a, y2a), (x1b, y1b, x2b, y2b) = _placement(i, xc, yc, w, h, s)
        images.append(img)
        places.append(((x1a, y1a, x2a, y2a), (x1b, y1b, x2b, y2b)))
        padw, padh = x1a - x1b, y1a - y1b

        lab = np.asarray(labels[k], np.float32).reshape(-1, 5)
        px = np.empty_like(lab)
        px[:, 0] = lab[:, 0]
        px[:, 1:] = xywhn_to_xyxy(lab[:, 1:], w, h, padw, padh)
        labels4.append(px)
        segs = segments[k] if segments is not None else []
        if len(segs):
            if len(segs) != len(lab):
                raise ValueError(f"load_mosaic: image {k} has {len(segs)} polygons for {len(lab)} labels")
            any_polygons = True
            segments4.append([np.asarray(p, np.float32) * (w, h) + (padw, padh) for p in segs])
        else:
            segments4.append([_EMPTY_POLYGON] * len(lab))

    labels4 = np.concatenate(labels4, 0)
    np.clip(labels4[:, 1:], 0, 2 * s, out=labels4[:, 1:])
    # Objects that fell off the canvas are now zero-width or zero-height boxes on its edge: drop them (the
    # published code keeps them and makes phantom boxes under rotation; see the module docstring).
    visible = (labels4[:, 3] > labels4[:, 1]) & (labels4[:, 4] > labels4[:, 2])
    if any_polygons:
        polygons = [p for tile in segments4 for p in tile]
        rows = [j for j in np.nonzero(visible)[0] if len(polygons[j])]
        if rows:
            boxes, clipped = polygon_boxes([polygons[j] for j in rows], 2 * s, 2 * s)
            for j, box, q in zip(rows, boxes, clipped):
                if q is not polygons[j]:  # it was cut (the box stays the clipped label, as published)
                    polygons[j] = q.astype(np.float32)
                    visible[j] = len(q) >= 3 and box[2] > box[0] and box[3] > box[1]
        segments4 = [p for p, v in zip(polygons, visible) if v]
    else:
        segments4 = []
    return images, places, labels4[visible], segments4, any_polygons


def load_mosaic(index, n_images, load_image, labels, segments, img_size, rng, hyp):
    """Build one mosaic training sample.

    index: the requested image; n_images: how many images the 3 extra ones are drawn from (0..n_images-1).
    load_image(i) -> (img (h, w, 3) uint8 BGR resized so its long side is img_size, (h0, w0), (h, w)).
    labels[i]: (n, 5) float32 [cls, xc, yc, w, h] normalised to image i. segments[i]: list of normalised
    (k, 2) polygons aligned with labels[i], or [] for none.
    rng: numpy.random.Generator. hyp: dict with the keys in HYP_KEYS (the published hyp file).
    Returns (img (s', s', 3) uint8 with s' = 2 * (s - s // 2), i.e. s for even s; labels (m, 5) float32
    [cls, x1, y1, x2, y2] pixels; segments: [] or m (k, 2) float32 pixel polygons, the visible parts).
    """
    missing = [k for k in HYP_KEYS if k not in hyp]
    if missing:
        raise KeyError(f"load_mosaic: hyp lacks {', '.join(missing)}")
    s = int(img_size)
    half = s // 2
    images, places, labels4, segments4, any_polygons = mosaic_tiles(index, n_images, load_image, labels, segments,
                                                                    s, rng)
    # A BGRA canvas: OpenCV's bilinear warp is fast for 4 channels only (see perspective.warp_image); the
    # tiles are converted while they are placed, which costs no more than copying them.
    canvas = np.full((2 * s, 2 * s, 4), 114, np.uint8)
    for img, ((x1a, y1a, x2a, y2a), (x1b, y1b, x2b, y2b)) in zip(images, places):
        if x2a > x1a and y2a > y1a:
            _place(img[y1b:y2b, x1b:x2b], canvas[y1a:y2a, x1a:x2a])
    if any_polygons:
        img, labels4, segments4 = copy_paste(canvas, labels4, segments4, rng, p=hyp["copy_paste"])

    img, labels4, segments4 = random_perspective(
        canvas, labels4, segments4, rng,
        degrees=hyp["degrees"], translate=hyp["translate"], scale=hyp["scale"], shear=hyp["shear"],
        perspective=hyp["perspective"], border=(-half, -half),
    )
    return cv2.cvtColor(img, cv2.COLOR_BGRA2BGR), labels4, segments4
