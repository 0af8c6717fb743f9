"""HSV colour jitter (hyp keys hsv_h, hsv_s, hsv_v), in place.
Published semantics (augment_hsv): three gains r = 1 + U(-1, 1) * (hgain, sgain, vgain) drawn once per image;
in OpenCV's 8-bit HSV space (hue 0..179) hue -> (hue * r_h) mod 180, saturation and value -> clip(x * r, 0, 255),
truncated to uint8; all three gains zero -> the image is left untouched and nothing is drawn from `rng`.
Between the two colour conversions: split, three in-place single-channel cv2.LUT calls, merge (timings:
benchmarks/RESULTS.md §10).
Test: python -m pytest -q tests/data/test_data_augment.py -k hsv
"""

import cv2
import numpy as np

_X = np.arange(256, dtype=np.float64)


def hsv_luts(r):
    """The three (256,) uint8 look-up tables for gains r = (r_h, r_s, r_v) on OpenCV's 8-bit HSV."""
    lut_h = np.mod(_X * r[0], 180).astype(np.uint8)  # float -> uint8 truncates, as the published astype does
    lut_s = np.clip(_X * r[1], 0, 255).astype(np.uint8)
    lut_v = np.clip(_X * r[2], 0, 255).astype(np.uint8)
    return lut_h, lut_s, lut_v


def augment_hsv(img, rng, hgain=0.5, sgain=0.5, vgain=0.5):
    """Jitter hue, saturation and value of `img` in place.

    img: (H, W, 3) uint8 BGR, modified in place (and returned for convenience).
    rng: numpy.random.Generator; draws 3 uniforms, only when some gain is non-zero.
    """
    if not (hgain or sgain or vgain):
        return img
    r = rng.uniform(-1, 1, 3) * (hgain, sgain, vgain) + 1
    hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
    planes = cv2.split(hsv)
    for plane, lut in zip(planes, hsv_luts(r)):
        cv2.LUT(plane, lut, dst=plane)
    cv2.merge(planes, dst=hsv)
    if img.flags.c_contiguous:
        cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR, dst=img)
    else:  # e.g. a flipped view: OpenCV cannot write into negative strides
        np.copyto(img, cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR))
    return img
