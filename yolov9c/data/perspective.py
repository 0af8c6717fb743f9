"""Random perspective: rotation, scale, shear, perspective and translation of an image and its labels
(hyp keys degrees, translate, scale, shear, perspective).

Published semantics (random_perspective): M = T @ S @ R @ P @ C (C centres the input, P perspective
U(-p, p), R rotation U(±degrees) and scale U(1 ± scale), S shear U(±shear) degrees, T translation to
U(0.5 ± translate) · output size). Output (H + 2·border[0], W + 2·border[1]) (the mosaic passes -s/2), grey 114
outside the input. All eight draws are always taken from `rng` in the published order.
Boxes: the bounds of the 4 warped corners or, when every label has a polygon, of the warped polygon clipped to
the output (Sutherland-Hodgman: the exact bound of the visible part, where the published code bounds 1000
resampled points); then clipped and filtered by `box_candidates` (area ratio 0.01 with polygons).
Assumes perspective small enough that no input point maps behind the camera (published range 0-0.001 at 640).
Test: python -m pytest -q tests/data/test_data_augment.py -k "perspective or polygon or warp or candidates"
"""

import math

import cv2
import numpy as np

GREY = (114, 114, 114, 114)


def box_candidates(box1, box2, wh_thr=2, ar_thr=100, area_thr=0.1, eps=1e-16):
    """Which warped boxes to keep.

    box1: (4, n) boxes before the warp, x1 y1 x2 y2, already multiplied by the random scale;
    box2: (4, n) the same boxes after the warp and clipping.
    Returns (n,) bool: width and height > wh_thr pixels, area kept > area_thr of the scaled original,
    aspect ratio < ar_thr.
    """
    w1, h1 = box1[2] - box1[0], box1[3] - box1[1]
    w2, h2 = box2[2] - box2[0], box2[3] - box2[1]
    ar = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < ar_thr)


def _clip_half_plane(poly, axis, bound, keep_above):
    """One Sutherland-Hodgman pass: the part of polygon poly (k, 2) with poly[:, axis] >= bound
    (keep_above) or <= bound. Returns (k', 2), k' = 0 when nothing is left."""
    v = poly[:, axis]
    inside = v >= bound if keep_above else v <= bound
    if inside.all() or not inside.any():
        return poly if inside.all() else poly[:0]
    nxt = np.roll(poly, -1, 0)
    in_next = np.roll(inside, -1)
    crossing = inside != in_next
    t = np.zeros(len(poly), poly.dtype)
    t[crossing] = (bound - v[crossing]) / (nxt[crossing, axis] - v[crossing])  # one end strictly outside: != 0
    cut = poly + t[:, None] * (nxt - poly)
    cut[:, axis] = bound
    # For each edge i -> i+1 emit [the crossing point if it crosses] then [the next vertex if it is inside].
    out = np.empty((2 * len(poly), 2), poly.dtype)
    out[0::2], out[1::2] = cut, nxt
    keep = np.empty(2 * len(poly), bool)
    keep[0::2], keep[1::2] = crossing, in_next
    return out[keep]


def clip_polygon(poly, width, height):
    """Clip polygon poly (k, 2) to the rectangle [0, width] x [0, height] (Sutherland-Hodgman).
    Returns poly itself when it lies inside, else a new (k', 2) array (k' = 0 when nothing is left)."""
    if len(poly) == 0 or ((poly >= 0).all() and (poly[:, 0] <= width).all() and (poly[:, 1] <= height).all()):
        return poly
    for axis, bound, keep_above in ((0, 0, True), (0, width, False), (1, 0, True), (1, height, False)):
        poly = _clip_half_plane(poly, axis, bound, keep_above)
        if len(poly) == 0:
            break
    return poly


def polygon_boxes(polys, width, height):
    """Boxes of the parts of polygons inside [0, width] x [0, height].

    polys: list of m (k_i, 2) float polygons, every k_i >= 1. Returns (boxes (m, 4) float64 x1 y1 x2 y2,
    zeros where nothing is left; the list of clipped polygons, where an uncut polygon is the input object
    itself and a polygon with nothing left is (0, 2))."""
    ks = np.array([len(q) for q in polys])
    starts = np.concatenate(([0], np.cumsum(ks)[:-1]))
    pts = np.concatenate(polys, 0).astype(np.float64, copy=False)
    boxes = np.stack((np.minimum.reduceat(pts[:, 0], starts), np.minimum.reduceat(pts[:, 1], starts),
                      np.maximum.reduceat(pts[:, 0], starts), np.maximum.reduceat(pts[:, 1], starts)), 1)
    inside = (boxes[:, 0] >= 0) & (boxes[:, 1] >= 0) & (boxes[:, 2] <= width) & (boxes[:, 3] <= height)
    outside = (boxes[:, 2] < 0) | (boxes[:, 3] < 0) | (boxes[:, 0] > width) | (boxes[:, 1] > height)
    polys = list(polys)
    for i in np.nonzero(outside)[0]:
        polys[i] = polys[i][:0]
    boxes[outside] = 0.0
    for i in np.nonzero(~inside & ~outside)[0]:  # only the polygons the border cuts
        q = clip_polygon(polys[i], width, height)
        polys[i] = q
        boxes[i] = (q[:, 0].min(), q[:, 1].min(), q[:, 0].max(), q[:, 1].max()) if len(q) else 0.0
    return boxes, polys


def _warp_points(xy, M, perspective):
    """Apply the 3x3 matrix M to points xy (..., 2) float64."""
    out = xy @ M[:2, :2].T + M[:2, 2]
    if perspective:
        w = xy @ M[2, :2] + M[2, 2]
        out /= w[..., None]
    return out


def random_matrix(rng, in_hw, out_hw, degrees=0.0, translate=0.1, scale=0.5, shear=0.0, perspective=0.0):
    """Draw the published random warp. in_hw, out_hw: (h, w) of the input and the output.
    Returns (M (3, 3) float64, s the drawn scale)."""
    C = np.eye(3)
    C[0, 2] = -in_hw[1] / 2
    C[1, 2] = -in_hw[0] / 2

    P = np.eye(3)
    P[2, 0] = rng.uniform(-perspective, perspective)
    P[2, 1] = rng.uniform(-perspective, perspective)

    a = math.radians(rng.uniform(-degrees, degrees))
    s = rng.uniform(1 - scale, 1 + scale)
    R = np.eye(3)  # counter-clockwise on screen for a > 0, like cv2.getRotationMatrix2D
    R[0, 0] = R[1, 1] = s * math.cos(a)
    R[0, 1] = s * math.sin(a)
    R[1, 0] = -R[0, 1]

    S = np.eye(3)
    S[0, 1] = math.tan(math.radians(rng.uniform(-shear, shear)))
    S[1, 0] = math.tan(math.radians(rng.uniform(-shear, shear)))

    T = np.eye(3)
    T[0, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * out_hw[1]
    T[1, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * out_hw[0]
    return T @ S @ R @ P @ C, s


def warp_image(img, M, size, perspective):
    """Warp img with the 3x3 matrix M (bilinear, grey 114 outside) to size (w, h); same channel count.

    A 3-channel image goes through BGRA and back (bit-identical): OpenCV's bilinear warps have a fast SIMD path
    for 4 channels only (benchmarks/RESULTS.md §10).
    """
    three = img.ndim == 3 and img.shape[2] == 3
    src = cv2.cvtColor(img, cv2.COLOR_BGR2BGRA) if three else img
    if perspective:
        out = cv2.warpPerspective(src, M, size, borderValue=GREY)
    else:  # affine: cheaper than warpPerspective for the same result
        out = cv2.warpAffine(src, M[:2], size, borderValue=GREY)
    return cv2.cvtColor(out, cv2.COLOR_BGRA2BGR) if three else out


def random_perspective(img, labels, segments, rng, degrees=0.0, translate=0.1, scale=0.5, shear=0.0,
                       perspective=0.0, border=(0, 0)):
    """Warp an image and its labels with one random transform.

    img: (H, W, 3) uint8 BGR, or (H, W, 4) BGRA (the mosaic's canvas), not modified.
    labels: (n, 5) float32 [cls, x1, y1, x2, y2] pixels of img.
    segments: [] or a list of n (k, 2) float32 pixel polygons aligned with the label rows (an empty
    polygon row falls back to that box's corners). rng: numpy.random.Generator. border: (by, bx) pixels
    added to each side of the output (negative crops).
    Returns (img (H + 2by, W + 2bx, C) uint8 -- `img` itself only when the warp is the identity,
    labels (n', 5) float32 of the kept boxes, segments: [] without polygons, else a list of n' (k, 2)
    float32 warped polygons clipped to the output: the visible parts that the boxes bound).
    """
    h_in, w_in = img.shape[:2]
    height, width = h_in + 2 * int(border[0]), w_in + 2 * int(border[1])
    M, s = random_matrix(rng, (h_in, w_in), (height, width), degrees, translate, scale, shear, perspective)

    if border[0] or border[1] or (M != np.eye(3)).any():
        img = warp_image(img, M, (width, height), perspective)

    labels, segments = warp_labels(labels, segments, M, s, (height, width), perspective)
    return img, labels, segments


def warp_labels(labels, segments, M, s, out_hw, perspective):
    """The labels of random_perspective for a drawn warp: M (3, 3) and s from random_matrix, out_hw the
    output (height, width). labels (n, 5) float32 [cls, x1, y1, x2, y2], segments [] or n polygons, as
    random_perspective takes them. Returns (labels (n', 5) float32 of the kept boxes, segments [] or n'
    warped, clipped polygons)."""
    height, width = out_hw
    labels = np.asarray(labels, np.float32).reshape(-1, 5)
    n = len(labels)
    if len(segments) not in (0, n):
        raise ValueError(f"random_perspective: {len(segments)} segments for {n} label rows")
    if n == 0:
        return labels, []

    use_segments = len(segments) == n and any(len(p) for p in segments)
    if use_segments:
        polys = [p if len(p) else labels[i, [1, 2, 3, 2, 3, 4, 1, 4]].reshape(4, 2) for i, p in enumerate(segments)]
        ks = [len(p) for p in polys]
        warped = _warp_points(np.concatenate(polys, 0).astype(np.float64), M, perspective)
        new, visible = polygon_boxes(np.split(warped, np.cumsum(ks)[:-1]), width, height)
    else:
        corners = labels[:, [1, 2, 3, 4, 1, 4, 3, 2]].astype(np.float64).reshape(n, 4, 2)
        xy = _warp_points(corners, M, perspective)
        new = np.concatenate((xy.min(1), xy.max(1)), 1)
        np.clip(new[:, 0::2], 0, width, out=new[:, 0::2])
        np.clip(new[:, 1::2], 0, height, out=new[:, 1::2])

    keep = box_candidates(labels[:, 1:5].T * s, new.T, area_thr=0.01 if use_segments else 0.10)
    labels = labels[keep]
    labels[:, 1:5] = new[keep]
    segments = [visible[i].astype(np.float32) for i in np.nonzero(keep)[0]] if use_segments else []
    return labels, segments
