"""Drawing detections on images and cutting crops (detect_dual.py outputs), with OpenCV.

`class_color(c)`: a fixed colour per class id (a 20-colour palette, cycled). `draw_detection(img, xyxy,
label, color, line_width)`: a box and, when `label` is not empty, a filled label tag above the box (inside it
when the box touches the top edge). `crop_box(img, xyxy, gain, pad)`: the box enlarged by `gain` and `pad`
pixels, clipped to the image (the published --save-crop uses gain 1.02, pad 10). `detection_label(name,
conf, hide_labels, hide_conf)`: the tag text ('person 0.87', 'person', or '').

Test: python -m pytest -q tests/engine/detect/test_detect_annotate.py
"""

import cv2
import numpy as np

# 20 distinct BGR colours (hand-picked, saturated enough to read on photos)
_PALETTE = (
    (56, 56, 255), (151, 157, 255), (31, 112, 255), (29, 178, 255), (49, 210, 207), (10, 249, 72),
    (23, 204, 146), (134, 219, 61), (52, 147, 26), (187, 212, 0), (168, 153, 44), (255, 194, 0),
    (147, 69, 52), (255, 115, 100), (236, 24, 0), (255, 56, 132), (133, 0, 82), (255, 56, 203),
    (200, 149, 255), (199, 55, 255),
)


def class_color(c):
    """BGR colour tuple for class id `c` (int)."""
    return _PALETTE[int(c) % len(_PALETTE)]


def detection_label(name, conf, hide_labels=False, hide_conf=False):
    """Text drawn above a box: '' with hide_labels, the class name with hide_conf, else 'name 0.87'."""
    if hide_labels:
        return ""
    return str(name) if hide_conf else f"{name} {float(conf):.2f}"


def draw_detection(img, xyxy, label="", color=(56, 56, 255), line_width=3):
    """Draw one box (and its label tag) on `img` in place.

    img: (H, W, 3) uint8 BGR, contiguous. xyxy: 4 numbers, pixels of img. label: text ('' = box only).
    line_width: box line thickness in pixels (>= 1); the label font scales with it."""
    lw = max(int(line_width), 1)
    p1 = (round(float(xyxy[0])), round(float(xyxy[1])))
    p2 = (round(float(xyxy[2])), round(float(xyxy[3])))
    cv2.rectangle(img, p1, p2, color, thickness=lw, lineType=cv2.LINE_AA)
    if not label:
        return img
    font_thickness = max(lw - 1, 1)
    scale = lw / 3
    (tw, th), _ = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, scale, font_thickness)
    outside = p1[1] - th - 3 >= 0  # room for the tag above the box?
    tag_end = (p1[0] + tw, p1[1] - th - 3 if outside else p1[1] + th + 3)
    cv2.rectangle(img, p1, tag_end, color, -1, cv2.LINE_AA)
    # black text on light colours, white on dark ones, so the tag stays readable
    text_color = (0, 0, 0) if sum(color) > 450 else (255, 255, 255)
    baseline_y = p1[1] - 2 if outside else p1[1] + th + 2
    cv2.putText(img, label, (p1[0], baseline_y), cv2.FONT_HERSHEY_SIMPLEX, scale, text_color,
                thickness=font_thickness, lineType=cv2.LINE_AA)
    return img


def crop_box(img, xyxy, gain=1.02, pad=10, square=False):
    """The pixels of `img` under box `xyxy`, enlarged: width/height × gain + pad (square: the longer side
    for both), clipped to the image. Returns a (h, w, 3) uint8 copy (at least 1×1)."""
    x1, y1, x2, y2 = (float(v) for v in xyxy)
    cx, cy, w, h = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1
    if square:
        w = h = max(w, h)
    w, h = w * gain + pad, h * gain + pad
    H, W = img.shape[:2]
    a = int(np.clip(cx - w / 2, 0, W - 1))
    b = int(np.clip(cy - h / 2, 0, H - 1))
    c = int(np.clip(cx + w / 2, a + 1, W))
    d = int(np.clip(cy + h / 2, b + 1, H))
    return img[b:d, a:c].copy()
