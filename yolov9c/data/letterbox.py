"""Letterbox: resize an image to fit a target shape, keeping its aspect ratio, and pad the rest with grey.

Published semantics (letterbox): one scale r = min(new_h / h, new_w / w) (optionally never above 1),
the padding split evenly between the two sides (the odd pixel goes to bottom/right), `auto` pads only up to a
stride multiple (inference), `scale_fill` stretches to the exact shape without padding.

Test: python -m pytest -q tests/data/test_data_augment.py -k letterbox
"""

import cv2
import numpy as np


def letterbox(img, new_shape, color=(114, 114, 114), auto=False, scale_fill=False, scaleup=True, stride=32):
    """Resize and pad `img` to `new_shape`.

    img: (H, W, 3) uint8 BGR. new_shape: int (square) or (new_h, new_w).
    Returns (out, (rx, ry), (dw, dh)): out (h', w', 3) uint8 (a new array; `img` is never modified),
    the x and y resize ratios, and the padding added on the left and on the top *before* rounding
    (floats: a label x maps to x * rx + dw, as in the published code).
    """
    h, w = img.shape[:2]
    (new_w, new_h), (rx, ry), (dw, dh), (top, bottom, left, right) = letterbox_geometry(
        h, w, new_shape, auto=auto, scale_fill=scale_fill, scaleup=scaleup, stride=stride)
    fresh = False
    if (w, h) != (new_w, new_h):
        img = cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
        fresh = True
    if top or bottom or left or right:
        img = cv2.copyMakeBorder(img, top, bottom, left, right, cv2.BORDER_CONSTANT, value=color)
    elif not fresh:
        # Nothing to do, but the caller may augment the result in place (HSV) and `img` may be a
        # RAM-cached image: hand back a copy, never the input itself.
        img = img.copy()
    return img, (rx, ry), (dw, dh)


def letterbox_geometry(h, w, new_shape, auto=False, scale_fill=False, scaleup=True, stride=32):
    """letterbox's arithmetic for an h x w image (also the augment op's plan, data/augment_plan.py).
    Returns ((new_w, new_h) the resized size, (rx, ry), (dw, dh) the float paddings, (top, bottom, left,
    right) the integer borders)."""
    if isinstance(new_shape, (int, np.integer)):
        new_shape = (int(new_shape), int(new_shape))
    r = min(new_shape[0] / h, new_shape[1] / w)
    if not scaleup:  # validation: only shrink, never blow up small images (better mAP)
        r = min(r, 1.0)

    rx = ry = r
    new_w, new_h = int(round(w * r)), int(round(h * r))
    dw, dh = new_shape[1] - new_w, new_shape[0] - new_h
    if auto:  # minimum rectangle: pad only to the next stride multiple
        dw, dh = dw % stride, dh % stride
    elif scale_fill:  # stretch, no padding
        dw, dh = 0, 0
        new_w, new_h = new_shape[1], new_shape[0]
        rx, ry = new_shape[1] / w, new_shape[0] / h
    dw, dh = dw / 2, dh / 2

    # The +-0.1 sends the odd pixel of an odd padding to the bottom/right side.
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))
    return (new_w, new_h), (rx, ry), (dw, dh), (top, bottom, left, right)
