"""Random perspective: rotation, scale, shear, perspective and translation of an image and its labels
(hyp keys degrees, translate, scale, shear, perspective).

Published semantics (spec §5 "random_perspective"): M = T @ S @ R @ P @ C, where C moves the input's centre to
the origin, P adds perspective (U(-p, p) on both bottom-row terms), R rotates by U(-degrees, degrees) and scales
by U(1 - scale, 1 + scale), S shears by U(-shear, shear) degrees on both axes, and T moves the origin to
U(0.5 - translate, 0.5 + translate) * output size. The output is (H + 2*border[0], W + 2*border[1]); the
mosaic passes border = (-s/2, -s/2) to cut its 2s x 2s canvas back to s x s. Grey (114) fills what comes from
outside the input. Boxes are the bounds of their 4 warped corners or, when every label has a polygon, the
bounds of the polygon resampled to 1000 points and warped (tighter under rotation); then clipped to the output
and filtered by `box_candidates`. Random draws are taken from `rng` in the published order, always all eight,
so the stream does not depend on which parameters are zero.

Test: python -m pytest -q tests/test_data_augment.py -k perspective
"""

import math

import cv2
import numpy as np

GREY = (114, 114, 114)
SEGMENT_POINTS = 1000  # points per resampled polygon, as published


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


def resample_polygons(segments, n=SEGMENT_POINTS):
    """Resample closed polygons to n points each, evenly spaced along the vertex index (as published:
    interpolation over the vertex sequence with the first vertex appended, not over arc length).

    segments: list of m (k_i, 2) arrays, every k_i >= 1. Returns (m, n, 2) float64.
    """
    ks = np.array([len(s) for s in segments], np.int64)
    closed = np.concatenate([np.concatenate((s, s[:1]), 0) for s in segments], 0).astype(np.float64)
    starts = np.concatenate(([0], np.cumsum(ks + 1)[:-1]))
    t = np.linspace(0.0, 1.0, n)[None, :] * ks[:, None]  # (m, n) position along the vertex index
    i0 = np.minimum(t.astype(np.int64), ks[:, None] - 1)
    f = (t - i0)[..., None]
    g = starts[:, None] + i0
    return closed[g] * (1.0 - f) + closed[g + 1] * f


def _polygon_boxes(xy, width, height):
    """Bounds of the polygon points that fall inside the output image; zeros when none does.
    xy: (m, n, 2). Returns (m, 4) float64 x1 y1 x2 y2."""
    x, y = xy[..., 0], xy[..., 1]
    inside = (x >= 0) & (y >= 0) & (x <= width) & (y <= height)
    boxes = np.stack(
        (
            np.where(inside, x, np.inf).min(1),
            np.where(inside, y, np.inf).min(1),
            np.where(inside, x, -np.inf).max(1),
            np.where(inside, y, -np.inf).max(1),
        ),
        1,
    )
    boxes[~inside.any(1)] = 0.0
    return boxes


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


def random_perspective(img, labels, segments, rng, degrees=0.0, translate=0.1, scale=0.5, shear=0.0,
                       perspective=0.0, border=(0, 0)):
    """Warp an image and its labels with one random transform.

    img: (H, W, 3) uint8 BGR (not modified). labels: (n, 5) float32 [cls, x1, y1, x2, y2] pixels of img.
    segments: [] or a list of n (k, 2) float32 pixel polygons aligned with the label rows (an empty
    polygon row falls back to that box's corners). rng: numpy.random.Generator. border: (by, bx) pixels
    added to each side of the output (negative crops).
    Returns (img (H + 2by, W + 2bx, 3) uint8 -- `img` itself only when the warp is the identity,
    labels (n', 5) float32 of the kept boxes, segments: [] without polygons, else a list of n' (1000, 2)
    float32 warped, resampled polygons, not clipped).
    """
    h_in, w_in = img.shape[:2]
    height, width = h_in + 2 * int(border[0]), w_in + 2 * int(border[1])
    M, s = random_matrix(rng, (h_in, w_in), (height, width), degrees, translate, scale, shear, perspective)

    if border[0] or border[1] or (M != np.eye(3)).any():
        if perspective:
            img = cv2.warpPerspective(img, M, (width, height), borderValue=GREY)
        else:  # affine: cheaper than warpPerspective for the same result
            img = cv2.warpAffine(img, M[:2], (width, height), borderValue=GREY)

    labels = np.asarray(labels, np.float32).reshape(-1, 5)
    n = len(labels)
    if len(segments) not in (0, n):
        raise ValueError(f"random_perspective: {len(segments)} segments for {n} label rows")
    if n == 0:
        return img, labels, []

    use_segments = len(segments) == n and any(len(p) for p in segments)
    if use_segments:
        polys = [p if len(p) else labels[i, [1, 2, 3, 2, 3, 4, 1, 4]].reshape(4, 2) for i, p in enumerate(segments)]
        xy = _warp_points(resample_polygons(polys), M, perspective)  # (n, 1000, 2)
        new = _polygon_boxes(xy, width, height)
    else:
        corners = labels[:, [1, 2, 3, 4, 1, 4, 3, 2]].astype(np.float64).reshape(n, 4, 2)
        xy = _warp_points(corners, M, perspective)
        new = np.concatenate((xy.min(1), xy.max(1)), 1)
        np.clip(new[:, 0::2], 0, width, out=new[:, 0::2])
        np.clip(new[:, 1::2], 0, height, out=new[:, 1::2])

    keep = box_candidates(labels[:, 1:5].T * s, new.T, area_thr=0.01 if use_segments else 0.10)
    labels = labels[keep]
    labels[:, 1:5] = new[keep]
    segments = list(xy[keep].astype(np.float32)) if use_segments else []
    return img, labels, segments
