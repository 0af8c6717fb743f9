"""Drawing and cropping for detect outputs (yolov9c/engine/detect/annotate.py): the box lands where asked with the
asked thickness, the label tag appears only when there is text, label text follows --hide-labels/--hide-conf,
crops are the enlarged (gain 1.02, pad 10) box clipped to the image.

Run: python -m pytest -q tests/engine/detect/test_detect_annotate.py
"""

import numpy as np

from yolov9c.engine.detect.annotate import class_color, crop_box, detection_label, draw_detection


def _changed(a, b):
    return np.argwhere((a != b).any(2))


def test_box_outline_position_and_thickness():
    img = np.zeros((100, 120, 3), np.uint8)
    draw_detection(img, (20, 30, 80, 70), "", color=(0, 255, 0), line_width=1)
    ys, xs = np.nonzero(img[:, :, 1])
    # anti-aliased lines may touch one pixel on either side
    assert abs(ys.min() - 30) <= 1 and abs(ys.max() - 70) <= 1 and abs(xs.min() - 20) <= 1 and abs(xs.max() - 80) <= 1
    assert img[50, 50].sum() == 0  # outline only, inside untouched
    thick = np.zeros_like(img)
    draw_detection(thick, (20, 30, 80, 70), "", color=(0, 255, 0), line_width=5)
    assert np.count_nonzero(thick[:, :, 1]) > 2 * np.count_nonzero(img[:, :, 1])


def test_label_tag_is_drawn_above_the_box_only_with_text():
    plain = np.zeros((100, 120, 3), np.uint8)
    draw_detection(plain, (20, 40, 80, 90), "", line_width=2)
    tagged = np.zeros_like(plain)
    draw_detection(tagged, (20, 40, 80, 90), "star 0.91", line_width=2)
    rows = _changed(plain, tagged)[:, 0]
    assert len(rows) and rows.max() <= 41 and rows.min() < 30  # the tag sits above the top edge
    top = np.zeros_like(plain)  # box at the top edge: the tag goes inside it
    draw_detection(top, (20, 0, 80, 50), "star", line_width=2)
    assert top[5:12, 22:40].any()


def test_label_text_follows_hide_flags():
    assert detection_label("star", 0.914) == "star 0.91"
    assert detection_label("star", 0.914, hide_conf=True) == "star"
    assert detection_label("star", 0.914, hide_labels=True) == ""
    assert class_color(3) != class_color(4) and class_color(3) == class_color(23)


def test_crop_is_enlarged_and_clipped():
    img = np.arange(200 * 300 * 3, dtype=np.uint32).reshape(200, 300, 3).astype(np.uint8)
    c = crop_box(img, (100, 50, 180, 90))  # 80x40 → 91.6 x 50.8 around (140, 70)
    assert c.shape == (51, 91, 3)
    assert np.array_equal(c, img[44:95, 94:185])
    edge = crop_box(img, (0, 0, 30, 30))  # clipped at the top-left corner
    assert edge.shape[:2] == (int(15 + 40.6 / 2), int(15 + 40.6 / 2))
    assert crop_box(img, (290, 190, 300, 200), pad=0, gain=1.0).shape == (10, 10, 3)
