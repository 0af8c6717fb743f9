"""Rectangular batches (`--rect`, and every val loader): images sorted by aspect ratio, one padded shape per
batch (as published).

Each batch of consecutive sorted images gets the shape (h, w) = ceil(ratio · imgsz / stride + pad) · stride,
where ratio is [max aspect h/w, 1] when every image of the batch is wider than tall, [1, 1 / min aspect]
when every one is taller than wide, else [1, 1]. Train pad = 0, val pad = 0.5 (640 → 672).

Test: python -m pytest -q tests/data/test_dataset.py -k rect
"""

import numpy as np


def rect_order(shapes):
    """Order (n,) int64 that sorts images of `shapes` (n, 2) (h, w) by aspect h/w (stable)."""
    shapes = np.asarray(shapes, np.float64).reshape(-1, 2)
    return np.argsort(shapes[:, 0] / shapes[:, 1], kind="stable")


def rect_batch_shapes(shapes, batch_size, img_size, stride=32, pad=0.0):
    """For `shapes` (n, 2) (h, w) already sorted by aspect: (batch_index (n,) int64, batch_shapes (nb, 2)
    int64 (h, w), multiples of stride)."""
    shapes = np.asarray(shapes, np.float64).reshape(-1, 2)
    n = len(shapes)
    bi = np.arange(n) // batch_size
    nb = int(bi[-1]) + 1 if n else 0
    ar = shapes[:, 0] / shapes[:, 1]
    ratios = np.ones((nb, 2))
    for i in range(nb):
        a = ar[bi == i]
        lo, hi = a.min(), a.max()
        if hi < 1:
            ratios[i] = [hi, 1]
        elif lo > 1:
            ratios[i] = [1, 1 / lo]
    batch_shapes = (np.ceil(ratios * img_size / stride + pad) * stride).astype(np.int64)
    return bi.astype(np.int64), batch_shapes
