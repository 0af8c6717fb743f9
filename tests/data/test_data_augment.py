"""Tests of the training augmentations (yolov9c/data/{letterbox,perspective,hsv,mosaic,mixup,copy_paste,flip}.py).

The main check: labels stay consistent with pixels. Source images are a grey texture with filled shapes
(rectangles, or diamonds with polygons) in distinct saturated colours, one colour per class; after each
augmentation, and after the training chain mosaic -> copy-paste -> perspective -> HSV -> flips, every label box
must hold pixels of its class colour, tightly (each side of the colour's bounding box within a few pixels of
the label's side) when nothing overlaps it, and every pixel of a class colour must lie inside a box of that
class unless it belongs to a remnant the published filter drops (cut by the image border, or under 5 px).
(So an object that fell off the mosaic canvas must leave no label: the published code would keep a phantom box
for it under rotation, see yolov9c/data/mosaic.py.) Plus: letterbox shapes and padding, determinism, the
mosaic's draws, mixup ratio and labels, copy-paste only where IoA < 0.3, HSV identity at zero gains and hue
wrap-around, rotation sign, the published box filter, polygon clipping, and the hyp keys (zero range -> no
change).

Run: python -m pytest -q tests/data/test_data_augment.py   (CPU only, about 10 s)
"""

import copy
import math

import cv2
import numpy as np
import pytest

from yolov9c.data.copy_paste import box_ioa, copy_paste
from yolov9c.data.flip import random_flip
from yolov9c.data.hsv import augment_hsv
from yolov9c.data.letterbox import letterbox
from yolov9c.data.mixup import mixup
from yolov9c.data.mosaic import load_mosaic
from yolov9c.data.perspective import box_candidates, clip_polygon, random_perspective, warp_image

# BGR, class k has colour PALETTE[k]. Saturated primaries/secondaries: far from the grey background, from the
# grey fill (114) and from each other, also after the strongest HSV jitter of hyp.scratch-high.
PALETTE = np.array([(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (255, 0, 255), (0, 255, 255)], np.int16)
HYP = dict(degrees=0.0, translate=0.1, scale=0.9, shear=0.0, perspective=0.0, copy_paste=0.3,
           hsv_h=0.015, hsv_s=0.7, hsv_v=0.4, flipud=0.0, fliplr=0.5)
STILL = dict(degrees=0.0, translate=0.0, scale=0.0, shear=0.0, perspective=0.0, copy_paste=0.0)


# ----------------------------------------------------------------------------------------------- test data
def make_source(seed, h, w, n_obj=4, shape="rect"):
    """A textured grey image with n_obj non-overlapping filled shapes of distinct palette colours.

    shape 'rect': axis-aligned rectangles; 'diamond': rhombi (their polygon is the label's segment).
    Pixel (i, j) is coloured when its centre (j + .5, i + .5) lies inside the shape, so the label box
    (edge coordinates, x2 = last column + 1) is exactly the shape's extent.
    Returns (img (h, w, 3) uint8, labels (n, 5) float32 [cls, xc, yc, w, h] normalised,
    polygons: list of n (4, 2) float32 normalised)."""
    rng = np.random.default_rng(seed)
    tex = rng.integers(35, 80, (h // 6 + 1, w // 6 + 1)).astype(np.uint8)
    tex = cv2.resize(tex, (w, h), interpolation=cv2.INTER_NEAREST)
    tex = tex + rng.integers(0, 6, (h, w)).astype(np.uint8)
    img = np.repeat(tex[..., None], 3, 2)
    classes = rng.permutation(len(PALETTE))[:n_obj]
    boxes, labels, polys = [], [], []
    gap = max(8, min(h, w) // 40)
    for k in classes:
        for _ in range(200):
            bw = int(rng.uniform(0.12, 0.3) * w)
            bh = int(rng.uniform(0.12, 0.3) * h)
            if shape == "diamond":  # no sharp tips: a tip thinner than a pixel has no pure-colour pixels
                bh = min(int(bw * rng.uniform(0.7, 1.4)), int(0.4 * h))
            x1 = int(rng.integers(gap, w - gap - bw))
            y1 = int(rng.integers(gap, h - gap - bh))
            b = (x1, y1, x1 + bw, y1 + bh)
            if all(b[0] >= o[2] + gap or o[0] >= b[2] + gap or b[1] >= o[3] + gap or o[1] >= b[3] + gap
                   for o in boxes):
                break
        else:
            raise RuntimeError("could not place a shape")
        boxes.append(b)
        x1, y1, x2, y2 = b
        cx, cy, a, bb = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
        if shape == "rect":
            img[y1:y2, x1:x2] = PALETTE[k]
            poly = [(x1, y1), (x2, y1), (x2, y2), (x1, y2)]
        else:
            ys, xs = np.mgrid[y1:y2, x1:x2]
            inside = np.abs(xs + 0.5 - cx) / a + np.abs(ys + 0.5 - cy) / bb <= 1
            img[y1:y2, x1:x2][inside] = PALETTE[k]
            poly = [(cx, y1), (x2, cy), (cx, y2), (x1, cy)]
        labels.append((k, cx / w, cy / h, (x2 - x1) / w, (y2 - y1) / h))
        polys.append(np.array(poly, np.float32) / (w, h))
    return img, np.array(labels, np.float32), [p.astype(np.float32) for p in polys]


def make_sources(n, s, shape="rect", n_obj=4, seed=0):
    """n source images with long side s (mixed portrait/landscape/square) for the mosaic."""
    shapes = [(s, s), (int(0.75 * s), s), (s, int(0.6 * s)), (int(0.5 * s), s)]
    out = [make_source(seed * 100 + i, *shapes[i % 4], n_obj=n_obj, shape=shape) for i in range(n)]
    imgs, labels, polys = zip(*out)
    return list(imgs), list(labels), list(polys)


def xywhn_to_xyxy(labels, w, h):
    out = labels.astype(np.float32).copy()
    out[:, 1] = (labels[:, 1] - labels[:, 3] / 2) * w
    out[:, 2] = (labels[:, 2] - labels[:, 4] / 2) * h
    out[:, 3] = (labels[:, 1] + labels[:, 3] / 2) * w
    out[:, 4] = (labels[:, 2] + labels[:, 4] / 2) * h
    return out


def xyxy_to_xywhn(labels, w, h):
    out = labels.astype(np.float32).copy()
    out[:, 1] = (labels[:, 1] + labels[:, 3]) / 2 / w
    out[:, 2] = (labels[:, 2] + labels[:, 4]) / 2 / h
    out[:, 3] = (labels[:, 3] - labels[:, 1]) / w
    out[:, 4] = (labels[:, 4] - labels[:, 2]) / h
    return out


# ---------------------------------------------------------------------------------------------- the checker
def box_pixel_problems(img, labels, palette=PALETTE, tol=40, margin=2, tight=True, min_size=6, rotated=False):
    """Check labels (n, 5) [cls, x1, y1, x2, y2] pixels against the colours in img. Returns a list of
    problems (empty = consistent).

    - every box of at least min_size px that overlaps no other box (a pasted object may hide part of one)
      holds pixels of its colour; when tight, each side of the bounding box of those inside it is within
      `margin` px of the box's side (the edge blur of the bilinear warp grows with the zoom) -- except,
      when `rotated`, for boxes cut by the image border: the published box of a rotated shape is its
      corners' bounds clipped to the image, which is loose on the cut shape;
    - every pixel of a palette colour lies in a box of its class (grown by margin), unless its connected
      component touches the image border or is under 5 px on a side (a remnant the published filter drops).
    A pixel 'has colour k' when each channel is within tol of palette[k]."""
    H, W = img.shape[:2]
    problems = []
    im = img.astype(np.int16)
    boxes_all = labels[:, 1:5]
    for k, colour in enumerate(palette):
        mask = (np.abs(im - colour).max(2) <= tol).astype(np.uint8)
        covered = np.zeros((H, W), bool)
        for j in np.nonzero(labels[:, 0] == k)[0]:
            b = boxes_all[j]
            x0, y0 = max(math.floor(b[0]) - margin, 0), max(math.floor(b[1]) - margin, 0)
            x1, y1 = min(math.ceil(b[2]) + margin, W), min(math.ceil(b[3]) + margin, H)
            covered[y0:y1, x0:x1] = True
            others = np.delete(boxes_all, j, 0)
            overlapped = len(others) and (
                (np.minimum(others[:, 2], b[2]) > np.maximum(others[:, 0], b[0]) - margin)
                & (np.minimum(others[:, 3], b[3]) > np.maximum(others[:, 1], b[1]) - margin)).any()
            if overlapped or b[2] - b[0] < min_size or b[3] - b[1] < min_size:
                continue  # may be hidden (copy-paste pastes over up to 30 % of a box), or too small to see
            # Only pixels inside the box: a neighbour's pixels may lie within the margin around it, and
            # pixels beyond the box's sides are the containment check's business.
            bx0, by0 = max(math.floor(b[0]), 0), max(math.floor(b[1]), 0)
            ys, xs = np.nonzero(mask[by0:math.ceil(b[3]), bx0:math.ceil(b[2])])
            if len(xs) == 0:
                problems.append(f"class {k} box {np.round(b, 1)} holds no pixel of its colour")
                continue
            cut = b[0] <= 0.5 or b[1] <= 0.5 or b[2] >= W - 0.5 or b[3] >= H - 0.5
            if tight and not (rotated and cut):
                px = np.array((xs.min() + bx0, ys.min() + by0, xs.max() + bx0 + 1, ys.max() + by0 + 1))
                err = np.abs(px - b)
                if (err > margin).any():
                    problems.append(f"class {k} box {np.round(b, 1)} vs its pixels {px}: off by {err.max():.1f}")
        outside = mask.astype(bool) & ~covered
        if outside.any():
            _, comp, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
            for c in np.unique(comp[outside]):
                x, y, w, h, _ = stats[c]
                touches = x <= 1 or y <= 1 or x + w >= W - 1 or y + h >= H - 1
                if not (touches or min(w, h) < 5):
                    problems.append(f"class {k}: unlabelled {w}x{h} px blob at ({x}, {y})")
    return problems


def warp_margin(hyp):
    """Checker margin for a hyp: 2 px for axis-aligned warps; rotated edges and corners blur over more
    pixels, the more so the larger the zoom (up to 1 + scale)."""
    if not (hyp["degrees"] or hyp["shear"] or hyp["perspective"]):
        return 2
    return 3 if hyp["scale"] <= 0.5 else 4


def test_checker_catches_wrong_boxes():
    """The checker itself: exact labels pass; shifted, missing and wrong-class labels fail."""
    img, lab, _ = make_source(1, 240, 320)
    px = xywhn_to_xyxy(lab, 320, 240)
    assert box_pixel_problems(img, px) == []
    shifted = px.copy()
    shifted[0, [1, 3]] += 4
    assert box_pixel_problems(img, shifted)
    assert box_pixel_problems(img, px[1:])
    wrong = px.copy()
    wrong[0, 0] = (wrong[0, 0] + 1) % len(PALETTE)
    assert box_pixel_problems(img, wrong)


# ------------------------------------------------------------------------------------------------ letterbox
@pytest.mark.parametrize("hw, new, kw, out_hw, pads", [
    ((480, 640), 640, {}, (640, 640), (0, 0, 80, 80)),          # (left, right, top, bottom)
    ((101, 200), 640, {}, (640, 640), (0, 0, 158, 159)),        # odd padding: extra pixel at the bottom
    ((200, 101), (640, 320), {}, (640, 320), (0, 0, 3, 3)),     # rect shape (h, w): 101 -> 320, 200 -> 634
    ((500, 640), 640, dict(auto=True), (512, 640), (0, 0, 6, 6)),
    ((100, 200), 640, dict(scaleup=False), (640, 640), (220, 220, 270, 270)),
])
def test_letterbox_shapes_and_padding(hw, new, kw, out_hw, pads):
    img = make_source(2, *hw, n_obj=2)[0]
    out, (rx, ry), (dw, dh) = letterbox(img, new, **kw)
    assert out.shape == (*out_hw, 3) and out.dtype == np.uint8
    left, right, top, bottom = pads
    assert (round(dw - 0.1), round(dh - 0.1)) == (left, top)
    inner = out[top:out.shape[0] - bottom, left:out.shape[1] - right]
    assert inner.shape[:2] == (round(hw[0] * ry), round(hw[1] * rx))
    assert (inner != 114).any(axis=2).all(axis=1).any()  # the image, not padding, fills the inside
    for band in (out[:top], out[out.shape[0] - bottom:], out[:, :left], out[:, out.shape[1] - right:]):
        assert (band == 114).all()
    if kw.get("scaleup") is False:
        assert rx == ry == 1.0


def test_letterbox_scale_fill_and_boxes():
    img, lab, _ = make_source(3, 300, 500)
    out, (rx, ry), (dw, dh) = letterbox(img, (320, 640), scale_fill=True)
    assert out.shape == (320, 640, 3) and (dw, dh) == (0, 0)
    assert (rx, ry) == (640 / 500, 320 / 300)
    for shape, kw in (((320, 640), dict(scale_fill=True)), (640, {}), ((352, 640), {}), (416, dict(auto=True))):
        out, (rx, ry), (dw, dh) = letterbox(img, shape, **kw)
        px = xywhn_to_xyxy(lab, 500 * rx, 300 * ry)
        px[:, [1, 3]] += dw
        px[:, [2, 4]] += dh
        assert box_pixel_problems(out, px) == [], (shape, kw)


def test_letterbox_never_returns_its_input():
    img = make_source(4, 320, 320)[0]
    out, ratio, pad = letterbox(img, 320)
    assert ratio == (1.0, 1.0) and pad == (0.0, 0.0) and np.array_equal(out, img)
    assert not np.shares_memory(out, img)  # in-place HSV on the result must not touch a cached image


# ---------------------------------------------------------------------------------------------- perspective
def test_perspective_identity_and_zero_ranges():
    img, lab, _ = make_source(5, 256, 320)
    px = xywhn_to_xyxy(lab, 320, 256)
    out, lab2, seg2 = random_perspective(img, px, [], np.random.default_rng(0), **{
        k: 0.0 for k in ("degrees", "translate", "scale", "shear", "perspective")})
    assert np.array_equal(out, img) and np.array_equal(lab2, px) and seg2 == []


def test_perspective_translate_only_shifts():
    img, lab, _ = make_source(6, 256, 320)
    px = xywhn_to_xyxy(lab, 320, 256)
    for seed in range(4):
        out, lab2, _ = random_perspective(img, px, [], np.random.default_rng(seed), translate=0.1, scale=0.0)
        assert out.shape == img.shape
        assert box_pixel_problems(out, lab2) == []
        inside = (lab2[:, 1] > 0) & (lab2[:, 3] < 320) & (lab2[:, 2] > 0) & (lab2[:, 4] < 256)
        matched = px[np.isin(px[:, 0], lab2[inside, 0])]
        d = lab2[inside, 1:3] - matched[:, 1:3]
        assert np.allclose(d, d[0], atol=1e-3)  # one shift for every box: no scaling
        assert np.allclose(lab2[inside, 3:5] - lab2[inside, 1:3], matched[:, 3:5] - matched[:, 1:3], atol=1e-3)
        assert abs(d[0, 0]) <= 0.1 * 320 + 1e-3 and abs(d[0, 1]) <= 0.1 * 256 + 1e-3


def test_perspective_scale_range():
    img, lab, _ = make_source(7, 256, 256)
    px = xywhn_to_xyxy(lab, 256, 256)
    ratios = []
    for seed in range(8):
        out, lab2, _ = random_perspective(img, px, [], np.random.default_rng(seed), translate=0.0, scale=0.5)
        assert box_pixel_problems(out, lab2) == []
        inside = (lab2[:, 1] > 0) & (lab2[:, 3] < 256) & (lab2[:, 2] > 0) & (lab2[:, 4] < 256)
        if inside.any():
            src = px[np.isin(px[:, 0], lab2[inside, 0])]
            r = (lab2[inside, 3] - lab2[inside, 1]) / (src[:, 3] - src[:, 1])
            assert np.allclose(r, r[0], rtol=1e-4)  # the same scale for every box
            ratios.append(r[0])
    assert ratios and min(ratios) >= 0.5 - 1e-4 and max(ratios) <= 1.5 + 1e-4
    assert max(ratios) - min(ratios) > 0.2  # it does vary


@pytest.mark.parametrize("params", [
    dict(degrees=30.0, scale=0.3),
    dict(shear=10.0, scale=0.2),
    dict(perspective=0.0008, scale=0.2),
    dict(degrees=180.0, shear=5.0, perspective=0.0004, scale=0.5, translate=0.2),
])
def test_perspective_boxes_follow_pixels(params):
    img, lab, _ = make_source(8, 320, 320, n_obj=5)
    px = xywhn_to_xyxy(lab, 320, 320)
    for seed in range(3):
        out, lab2, _ = random_perspective(img, px, [], np.random.default_rng(seed), **params)
        assert out.shape == img.shape
        assert len(lab2), "every box dropped: the test would prove nothing"
        assert box_pixel_problems(out, lab2, margin=3, rotated=True) == [], (params, seed)


def test_perspective_rotation_is_a_rotation():
    """degrees only: pixel area is kept, and an object right of the centre moves up for a > 0 (counter-
    clockwise on screen, like cv2.getRotationMatrix2D), to centre + d (cos a, -sin a)."""
    W = H = 320
    img = np.full((H, W, 3), 50, np.uint8)
    img[150:170, 210:250] = PALETTE[2]  # centroid (230, 160): d = 70 right of the centre (160, 160)
    lab = np.array([[2, 210, 150, 250, 170]], np.float32)
    for seed in range(6):
        rng = np.random.default_rng(seed)
        a = math.radians(copy.deepcopy(rng).uniform(-1, 1, 3)[2] * 60.0)  # draws: 2 perspective, then angle
        out, lab2, _ = random_perspective(img, lab, [], rng, degrees=60.0, translate=0.0, scale=0.0)
        mask = (np.abs(out.astype(int) - PALETTE[2]).max(2) < 128)
        ys, xs = np.nonzero(mask)
        assert abs(mask.sum() / 800 - 1) < 0.03
        assert np.allclose((xs.mean() + 0.5, ys.mean() + 0.5), (160 + 70 * math.cos(a), 160 - 70 * math.sin(a)),
                           atol=1.0)
        assert box_pixel_problems(out, lab2, margin=3) == []


def test_perspective_drops_boxes_below_published_area_ratio():
    """border = (0, -60) with every range 0 is a pure 60 px shift to the left (output 200 px wide): it cuts
    objects at known places. Kept when more than 10 % of the box stays (1 % with polygons) and it is over
    2 px wide."""
    img = np.full((200, 320, 3), 50, np.uint8)
    # visible after the cut at x = 60: 20 of 40 px (50 %), 4 of 64 (6 %), 2 of 62 (too thin), 6 of 40 (15 %)
    rects = {0: (40, 10, 80, 50), 1: (0, 60, 64, 100), 2: (0, 110, 62, 150), 3: (26, 160, 66, 195)}
    labels = np.array([(k, *b) for k, b in rects.items()], np.float32)
    for k, (x1, y1, x2, y2) in rects.items():
        img[y1:y2, x1:x2] = PALETTE[k]
    still = dict(degrees=0.0, translate=0.0, scale=0.0, shear=0.0, perspective=0.0, border=(0, -60))
    out, kept, _ = random_perspective(img, labels, [], np.random.default_rng(0), **still)
    assert out.shape == (200, 200, 3) and np.array_equal(out, img[:, 60:260])
    assert kept[:, 0].tolist() == [0, 3]
    assert np.allclose(kept[:, 1:], [[0, 10, 20, 50], [0, 160, 6, 195]])
    segs = [np.array([(x1, y1), (x2, y1), (x2, y2), (x1, y2)], np.float32) for x1, y1, x2, y2 in rects.values()]
    _, kept_s, segs_s = random_perspective(img, labels, segs, np.random.default_rng(0), **still)
    assert kept_s[:, 0].tolist() == [0, 1, 3] and len(segs_s) == 3
    assert np.allclose(kept_s[:, 1:], [[0, 10, 20, 50], [0, 60, 4, 100], [0, 160, 6, 195]], atol=0.2)


def test_perspective_polygons_give_tight_boxes():
    """Diamonds: under rotation the polygon gives the tight box; the 4 box corners give a loose one."""
    img, lab, polys = make_source(9, 320, 320, n_obj=4, shape="diamond")
    px = xywhn_to_xyxy(lab, 320, 320)
    segs = [p * 320 for p in polys]
    for seed in range(3):
        kw = dict(degrees=40.0, scale=0.2, translate=0.05)
        out, lab_s, seg_s = random_perspective(img, px, segs, np.random.default_rng(seed), **kw)
        out2, lab_c, seg_c = random_perspective(img, px, [], np.random.default_rng(seed), **kw)
        assert np.array_equal(out, out2) and seg_c == []
        assert len(seg_s) == len(lab_s)
        assert box_pixel_problems(out, lab_s, margin=3) == []
        loose = box_pixel_problems(out, lab_c, margin=3)
        assert loose and all("off by" in p for p in loose)  # corner boxes contain but do not fit diamonds
        # each kept polygon is the visible part of the warped diamond, and the box bounds it exactly
        for p, b in zip(seg_s, lab_s):
            assert (p >= -1e-4).all() and (p[:, 0] <= 320 + 1e-4).all() and (p[:, 1] <= 320 + 1e-4).all()
            assert np.allclose((p[:, 0].min(), p[:, 1].min(), p[:, 0].max(), p[:, 1].max()), b[1:], atol=1e-3)
            assert len(p) == 4 or (p.min() < 1e-3 or p.max() > 320 - 1e-3)  # 4 corners unless cut


def test_warp_through_bgra_is_bit_identical():
    """warp_image sends 3-channel images through BGRA (OpenCV's fast path): same pixels as a direct warp."""
    img = make_source(14, 200, 240)[0]
    M = np.array([[0.9, 0.2, 10.5], [-0.15, 1.1, -7.25], [0.0, 0.0, 1.0]])
    grey = (114, 114, 114)
    assert np.array_equal(warp_image(img, M, (220, 180), 0), cv2.warpAffine(img, M[:2], (220, 180), borderValue=grey))
    M[2, :2] = (2e-4, -3e-4)
    assert np.array_equal(warp_image(img, M, (220, 180), 1e-4),
                          cv2.warpPerspective(img, M, (220, 180), borderValue=grey))


def test_box_candidates():
    before = np.array([[0, 0, 10, 10]] * 4, float).T
    after = np.array([[0, 0, 10, 10], [0, 0, 2, 10], [0, 0, 3, 3], [0, 0, 10, 0.09]], float).T
    assert box_candidates(before, after).tolist() == [True, False, False, False]
    assert box_candidates(before, after, area_thr=0.01).tolist() == [True, False, True, False]


def test_clip_polygon():
    inside = np.array([[1, 1], [9, 1], [5, 9]], np.float32)
    assert clip_polygon(inside, 10, 10) is inside
    # a diamond centred 10 px left of the edge: the part at x >= 0 is the triangle (0,35) (30,50) (0,65);
    # clamping its points instead would keep the full height 30..70
    diamond = np.array([[-10, 30], [30, 50], [-10, 70], [-50, 50]], np.float32)
    q = clip_polygon(diamond, 100, 100)
    assert len(q) == 3 and abs(cv2.contourArea(q) - 450) < 1e-3
    assert np.allclose((q[:, 0].min(), q[:, 1].min(), q[:, 0].max(), q[:, 1].max()), (0, 35, 30, 65))
    assert len(clip_polygon(diamond - (60, 0), 100, 100)) == 0  # entirely off
    corner = np.array([[80, 40], [130, 40], [130, 90], [80, 90]], np.float32)
    assert abs(cv2.contourArea(clip_polygon(corner, 100, 60)) - 400) < 1e-3  # 20 x 20 left in a 100 x 60 frame
    big = np.array([[-5, -5], [105, -5], [105, 105], [-5, 105]], np.float32)
    assert abs(cv2.contourArea(clip_polygon(big, 100, 50)) - 5000) < 1e-3


# ------------------------------------------------------------------------------------------------------ HSV
def test_hsv_zero_gains_is_identity_and_draws_nothing():
    img = make_source(10, 64, 64, n_obj=2)[0]
    ref = img.copy()
    rng = np.random.default_rng(0)
    state = copy.deepcopy(rng.bit_generator.state)
    augment_hsv(img, rng, 0.0, 0.0, 0.0)
    assert np.array_equal(img, ref) and rng.bit_generator.state == state


def test_hsv_value_gain_scales_brightness():
    grey = np.full((8, 8, 3), 100, np.uint8)
    gains = []
    for seed in range(20):
        img = grey.copy()
        augment_hsv(img, np.random.default_rng(seed), 0.0, 0.0, 0.4)
        assert (img == img[0, 0, 0]).all()  # grey stays grey
        gains.append(img[0, 0, 0] / 100)
    assert min(gains) >= 0.6 - 0.011 and max(gains) <= 1.4 + 0.011 and np.std(gains) > 0.1


def test_hsv_in_place_matches_lookup_and_keeps_hue_mod_180():
    img = make_source(11, 64, 96)[0]
    view = img[:, ::-1]  # a non-contiguous view must be written in place too
    rng = np.random.default_rng(3)
    r = copy.deepcopy(rng).uniform(-1, 1, 3) * (0.9, 0.7, 0.4) + 1
    hsv = cv2.cvtColor(np.ascontiguousarray(view), cv2.COLOR_BGR2HSV).astype(np.float64)
    exp = np.stack((np.mod(np.floor(hsv[..., 0]) * r[0], 180), np.clip(hsv[..., 1] * r[1], 0, 255),
                    np.clip(hsv[..., 2] * r[2], 0, 255)), 2).astype(np.uint8)
    assert exp[..., 0].max() < 180
    expected = cv2.cvtColor(exp, cv2.COLOR_HSV2BGR)
    augment_hsv(view, rng, 0.9, 0.7, 0.4)
    assert np.array_equal(view, expected)


def test_hsv_hue_gain_wraps_mod_180():
    """All 180 hues at full saturation and value; hue gain only: out hue = in hue * r_h mod 180, S and V kept."""
    hsv = np.stack((np.arange(180), np.full(180, 255), np.full(180, 255)), 1).astype(np.uint8)[None]
    strip = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)
    wrapped = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        r_h = 1 + copy.deepcopy(rng).uniform(-1, 1, 3)[0] * 0.5
        img = strip.copy()
        augment_hsv(img, rng, 0.5, 0.0, 0.0)
        out = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)[0].astype(int)
        expected = np.floor(np.arange(180) * r_h).astype(int) % 180
        d = np.abs(out[:, 0] - expected)
        assert (np.minimum(d, 180 - d) <= 2).all(), seed  # hue is circular; BGR round trip costs ~1
        assert (out[:, 1] >= 250).all() and (out[:, 2] == 255).all()
        wrapped += int((np.arange(180) * r_h >= 180).any())
    assert wrapped >= 3


# ------------------------------------------------------------------------------------------------ copy-paste
def test_copy_paste_only_where_ioa_below_0_3():
    """A: centred (its mirror is itself, IoA 1); B, C: each one's mirror covers 60 % of the other (IoA 0.6);
    D: free mirror; E, F: each one's mirror covers 20 % of the other (IoA 0.2). With p = 1 exactly D, E and
    F are pasted, their pixels mirrored; nothing else changes."""
    w, h = 400, 200
    img = np.full((h, w, 3), 50, np.uint8)
    rects = {0: (180, 20, 220, 60), 1: (20, 100, 60, 140), 2: (356, 100, 396, 140), 3: (100, 20, 150, 80),
             4: (260, 150, 300, 190), 5: (132, 150, 172, 190)}
    for k, (x1, y1, x2, y2) in rects.items():
        img[y1:y2, x1:x2] = PALETTE[k]
    labels = np.array([(k, *b) for k, b in rects.items()], np.float32)
    segs = [np.array([(x1, y1), (x2, y1), (x2, y2), (x1, y2)], np.float32) for x1, y1, x2, y2 in rects.values()]
    mirror = lambda b: np.array([w - b[2], b[1], w - b[0], b[3]], float)  # noqa: E731
    ioa = box_ioa(np.stack([mirror(b) for b in labels[:, 1:5]]), labels[:, 1:5].astype(float))
    ioa[np.arange(6), np.arange(6)] = np.where(np.arange(6) == 0, ioa.diagonal(), 0)  # only A overlaps itself
    assert np.allclose(ioa.max(1), [1.0, 0.6, 0.6, 0.0, 0.2, 0.2], atol=1e-6)
    ref = img.copy()
    out, lab2, seg2 = copy_paste(img, labels, segs, np.random.default_rng(0), p=1.0)
    assert len(lab2) == 9 and len(seg2) == 9 and len(segs) == 6
    assert sorted(lab2[6:, 0].tolist()) == [3, 4, 5]
    for row, poly in zip(lab2[6:], seg2[6:]):
        k = int(row[0])
        x1, y1, x2, y2 = rects[k]
        assert np.array_equal(row[1:], mirror(rects[k]))
        assert np.allclose(poly, np.stack((w - segs[k][:, 0], segs[k][:, 1]), 1))
        assert np.array_equal(out[y1:y2, w - x2:w - x1], ref[y1:y2, x1:x2][:, ::-1])
    changed = (out != ref).any(2)
    allowed = np.zeros_like(changed)
    for k in (3, 4, 5):  # the pasted area, plus the one-pixel rim drawContours adds to a polygon
        x1, y1, x2, y2 = rects[k]
        allowed[y1:y2 + 1, w - x2 - 1:w - x1] = True
    assert changed.any() and not (changed & ~allowed).any()
    assert box_pixel_problems(out, lab2) == []


def test_copy_paste_fraction_and_no_polygons():
    img, lab, polys = make_source(12, 200, 800, n_obj=3, shape="diamond")
    # squeeze the objects into the left half so that every mirror is free
    lab = lab.copy()
    lab[:, 1] *= 0.5
    lab[:, 3] *= 0.5
    px = xywhn_to_xyxy(lab, 800, 200)
    segs = [np.stack((p[:, 0] * 400, p[:, 1] * 200), 1) for p in polys]
    canvas = np.full((200, 800, 3), 50, np.uint8)
    canvas[:, :400] = cv2.resize(img, (400, 200), interpolation=cv2.INTER_NEAREST)
    for p, n_new in ((1.0, 3), (0.5, 2), (0.3, 1), (0.0, 0)):  # round(p * 3)
        out, lab2, seg2 = copy_paste(canvas.copy(), px, segs, np.random.default_rng(1), p=p)
        assert len(lab2) == 3 + n_new and len(seg2) == len(lab2)
        assert len(set(lab2[3:, 0].tolist())) == n_new  # distinct objects: drawn without replacement
    rng = np.random.default_rng(0)
    state = copy.deepcopy(rng.bit_generator.state)
    out, lab2, seg2 = copy_paste(canvas.copy(), px, [], rng, p=1.0)
    assert np.array_equal(out, canvas) and np.array_equal(lab2, px) and seg2 == []
    assert rng.bit_generator.state == state


# ----------------------------------------------------------------------------------------------- flip, mixup
def test_flips_move_boxes_with_pixels():
    img, lab, _ = make_source(13, 200, 300)
    for ud, lr in ((1.0, 0.0), (0.0, 1.0), (1.0, 1.0), (0.0, 0.0)):
        out, lab2 = random_flip(img, lab.copy(), np.random.default_rng(0), flipud=ud, fliplr=lr)
        expected = img[::-1] if ud else img
        expected = expected[:, ::-1] if lr else expected
        assert np.array_equal(out, expected)
        assert box_pixel_problems(out, xywhn_to_xyxy(lab2, 300, 200)) == []
        assert np.allclose(lab2[:, 3:], lab[:, 3:])
    hits = sum(random_flip(img, lab.copy(), np.random.default_rng(s), 0.0, 0.5)[1][0, 1] != lab[0, 1]
               for s in range(200))
    assert 70 < hits < 130  # fliplr = 0.5


def test_mixup_ratio_and_labels():
    a, b = np.full((16, 16, 3), 255, np.uint8), np.zeros((16, 16, 3), np.uint8)
    la = np.array([[1, 1, 2, 3, 4]], np.float32)
    lb = np.array([[2, 5, 6, 7, 8], [3, 9, 10, 11, 12]], np.float32)
    ratios = []
    for seed in range(300):
        rng = np.random.default_rng(seed)
        r = copy.deepcopy(rng).beta(32, 32)
        out, lab = mixup(a, la, b, lb, rng)
        assert np.array_equal(lab, np.concatenate((la, lb)))
        assert (out == out[0, 0, 0]).all() and abs(int(out[0, 0, 0]) - 255 * r) <= 1
        ratios.append(out[0, 0, 0] / 255)
    assert abs(np.mean(ratios) - 0.5) < 0.015
    assert 0.045 < np.std(ratios) < 0.08  # Beta(32, 32): std = 1 / sqrt(4 * 65) = 0.062
    with pytest.raises(ValueError):
        mixup(a, la, b[:8], lb, np.random.default_rng(0))


# ------------------------------------------------------------------------------------------------------ mosaic
def mosaic(seed, srcs, s, hyp, index=0, polygons=False):
    imgs, labels, polys = srcs
    shapes = [im.shape[:2] for im in imgs]
    return load_mosaic(index, len(imgs), lambda i: (imgs[i], shapes[i], shapes[i]), labels,
                       polys if polygons else [[] for _ in imgs], s, np.random.default_rng(seed), hyp)


def test_mosaic_still_hyp_is_centre_crop_with_unscaled_boxes():
    """scale = translate = degrees = shear = perspective = 0: the output is the canvas centre, every box keeps its
    size, and boxes of objects away from the cut keep their exact source size."""
    s = 256
    srcs = make_sources(4, s)
    widths = {(int(r[0]), round(r[3] * im.shape[1]), round(r[4] * im.shape[0]))
              for im, lab in zip(srcs[0], srcs[1]) for r in lab}
    for seed in range(6):
        img, lab, segs = mosaic(seed, srcs, s, STILL)
        assert img.shape == (s, s, 3) and segs == []
        assert box_pixel_problems(img, lab) == []
        assert np.allclose(lab[:, 1:], np.round(lab[:, 1:]), atol=1e-4)  # integer shifts only
        inner = (lab[:, 1] > 0) & (lab[:, 2] > 0) & (lab[:, 3] < s) & (lab[:, 4] < s)
        for r in lab[inner]:
            assert (int(r[0]), round(r[3] - r[1]), round(r[4] - r[2])) in widths


@pytest.mark.parametrize("s, hyp", [
    (320, HYP),
    (256, dict(HYP, degrees=15.0, shear=5.0, scale=0.5)),
    (256, dict(HYP, perspective=0.0005, scale=0.3, translate=0.2)),
    (640, HYP),
])
def test_mosaic_boxes_follow_pixels(s, hyp):
    srcs = make_sources(5, s, n_obj=4, seed=s)
    rotated = bool(hyp["degrees"] or hyp["shear"] or hyp["perspective"])
    n_boxes = 0
    for seed in range(4):
        img, lab, segs = mosaic(seed, srcs, s, hyp, index=seed % 5)
        assert img.shape == (s, s, 3) and lab.dtype == np.float32 and lab.shape[1] == 5
        assert (lab[:, 1:] >= 0).all() and (lab[:, [1, 3]] <= s).all() and (lab[:, [2, 4]] <= s).all()
        assert box_pixel_problems(img, lab, margin=warp_margin(hyp), rotated=rotated) == [], seed
        n_boxes += len(lab)
    assert n_boxes >= 4


def test_mosaic_with_polygons_copy_paste_and_perspective():
    s = 320
    srcs = make_sources(4, s, shape="diamond", n_obj=3, seed=7)
    pasted = 0
    for seed in range(5):
        hyp = dict(HYP, degrees=20.0, copy_paste=1.0, scale=0.3)
        img, lab, segs = mosaic(seed, srcs, s, hyp, polygons=True)
        assert len(segs) == len(lab) and all(p.ndim == 2 and p.shape[1] == 2 for p in segs)
        assert box_pixel_problems(img, lab, margin=warp_margin(hyp), rotated=True) == [], seed
        img0, lab0, _ = mosaic(seed, srcs, s, dict(STILL, copy_paste=0.0), polygons=True)
        img1, lab1, seg1 = mosaic(seed, srcs, s, dict(STILL, copy_paste=1.0), polygons=True)
        # with a still warp both runs see the same canvas; copy-paste only adds (mirrored) objects
        assert len(lab1) >= len(lab0)
        pasted += len(lab1) - len(lab0)
        assert box_pixel_problems(img1, lab1) == [], seed
    assert pasted > 0


def test_mosaic_draws_three_extra_images_with_replacement_in_shuffled_order():
    s = 64
    imgs = [np.full((s, s, 3), 60, np.uint8)]
    labels = [np.zeros((0, 5), np.float32)]
    for n_images, index in ((1000, 999), (4, 0)):
        calls = []

        def load_image(i):
            calls.append(i)
            return imgs[0], (s, s), (s, s)

        positions, repeats = np.zeros(4, int), 0
        for seed in range(200):
            calls.clear()
            img, lab, _ = load_mosaic(index, n_images, load_image, labels * n_images, [[]] * n_images, s,
                                      np.random.default_rng(seed), STILL)
            assert len(calls) == 4 and calls.count(index) >= 1 and all(0 <= c < n_images for c in calls)
            positions[calls.index(index)] += 1
            repeats += len(set(calls)) < 4
            assert img.shape == (s, s, 3) and len(lab) == 0
        if n_images == 1000:
            assert (positions > 25).all(), positions  # the requested image lands in every quadrant
        else:
            assert repeats > 150  # with replacement: 4 distinct images only 6 times in 64


def test_mosaic_mixed_polygon_and_box_images():
    """Two images with polygons, two without: polygons stay aligned with label rows (box-only rows get empty
    polygons, are warped by their corners and never pasted)."""
    s = 256
    imgs, labels, polys = make_sources(4, s, seed=5)
    polys = [polys[0], polys[1], [], []]
    for seed in range(6):
        for hyp in (dict(STILL, copy_paste=1.0), dict(HYP, copy_paste=1.0, degrees=10.0, scale=0.3)):
            img, lab, segs = mosaic(seed, (imgs, labels, polys), s, hyp, polygons=True)
            assert len(segs) == len(lab)
            rotated = bool(hyp["degrees"])
            assert box_pixel_problems(img, lab, margin=warp_margin(hyp), rotated=rotated) == [], (seed, hyp)


def test_mosaic_determinism_and_hyp_keys():
    s = 256
    srcs = make_sources(4, s)
    a = mosaic(11, srcs, s, HYP)
    b = mosaic(11, srcs, s, HYP)
    c = mosaic(12, srcs, s, HYP)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])
    with pytest.raises(KeyError, match="scale"):
        mosaic(0, srcs, s, {k: v for k, v in HYP.items() if k != "scale"})
    one = ([srcs[0][0]], [srcs[1][0]], [srcs[2][0]])  # a one-image dataset: the 3 extra draws repeat it
    img, lab, _ = mosaic(0, one, s, HYP)
    assert img.shape == (s, s, 3) and box_pixel_problems(img, lab) == []


# ------------------------------------------------------------------------------------------------------ chain
def chain(seed, srcs, s, hyp, polygons=False):
    """mosaic (+ copy-paste + perspective) -> HSV -> normalised labels -> flips, as the training loader
    runs them. Returns (img, labels in pixels, the palette as the HSV step mapped it)."""
    imgs, labels, polys = srcs
    rng = np.random.default_rng(seed)
    shapes = [im.shape[:2] for im in imgs]
    img, lab, _ = load_mosaic(int(rng.integers(len(imgs))), len(imgs), lambda i: (imgs[i], shapes[i], shapes[i]),
                              labels, polys if polygons else [[] for _ in imgs], s, rng, hyp)
    probe = PALETTE.astype(np.uint8)[None].copy()
    augment_hsv(probe, copy.deepcopy(rng), hyp["hsv_h"], hyp["hsv_s"], hyp["hsv_v"])
    augment_hsv(img, rng, hyp["hsv_h"], hyp["hsv_s"], hyp["hsv_v"])
    img, lab_n = random_flip(img, xyxy_to_xywhn(lab, s, s), rng, hyp["flipud"], hyp["fliplr"])
    return img, xywhn_to_xyxy(lab_n, s, s), probe[0].astype(np.int16)


@pytest.mark.parametrize("hyp, polygons", [
    (HYP, False),
    (dict(HYP, degrees=10.0, shear=3.0, flipud=0.5), False),
    (dict(HYP, degrees=10.0, copy_paste=0.5), True),
])
def test_chain_boxes_follow_pixels(hyp, polygons):
    s = 320
    srcs = make_sources(5, s, shape="diamond" if polygons else "rect", seed=3)
    rotated = bool(hyp["degrees"] or hyp["shear"])
    for seed in range(5):
        img, lab, palette = chain(seed, srcs, s, hyp, polygons)
        d = np.abs(palette[:, None] - palette[None]).max(2) + 255 * np.eye(len(palette), dtype=np.int16)
        tol = min(40, int(d.min()) // 2 - 2)  # colours stay apart after HSV jitter
        assert tol >= 15
        # diamonds without polygons would be loose; with polygons they are tight
        problems = box_pixel_problems(img, lab, palette=palette, tol=tol, margin=warp_margin(hyp),
                                      rotated=rotated)
        assert problems == [], seed
    a = chain(1, srcs, s, hyp, polygons)
    b = chain(1, srcs, s, hyp, polygons)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
