"""HWC BGR uint8 image → CHW RGB uint8 array, the layout the loader hands to the model.

Same bytes as the published `np.ascontiguousarray(img.transpose(2, 0, 1)[::-1])`, made by splitting the planes
with OpenCV into a preallocated array (a flipped view is first materialised with cv2.flip); timings in
benchmarks/RESULTS.md §10.
Test: python -m pytest -q tests/data/test_loader.py -k chw
"""

import cv2
import numpy as np


def to_chw_rgb(img):
    """img: (H, W, 3) uint8 BGR, possibly a flipped (negatively strided) view → (3, H, W) uint8 RGB, new array."""
    if not img.flags.c_contiguous:
        sy, sx = img.strides[0] < 0, img.strides[1] < 0
        base = img[::-1 if sy else 1, ::-1 if sx else 1]
        if (sy or sx) and base.flags.c_contiguous:
            img = cv2.flip(base, -1 if (sy and sx) else (0 if sy else 1))
        else:
            img = np.ascontiguousarray(img)
    h, w = img.shape[:2]
    out = np.empty((3, h, w), np.uint8)
    cv2.split(img, [out[2], out[1], out[0]])
    return out
