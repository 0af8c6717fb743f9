"""The augment op (yolov9c/ops/augment.py; C reference csrc/augment_ref.c, kernel kernels/augment.cu): random
plans with every feature (4-tile mosaic canvases, copy-paste polygons, rotation/shear/scale/perspective with grey
border, mixup, HSV gain, flips) against the same plans through OpenCV (augment_reference), the kernel against
the C reference, and bad arguments.

Tolerances (OpenCV 5.1 as the reference; the maths and its rounding: kernels/augment_pixel.h):
    warp / mixup / flips only      >= 99.98 % of values equal, none off by more than 1 grey level
    with HSV gain                  >= 99.9 % equal and >= 99.9 % within 1 level (HSV turns a 1-level
                                   bilinear rounding difference of a grey pixel into a hue change)
    copy-paste                     the same bounds: the op's polygon test is cv2.drawContours' fill pixel
                                   for pixel (even-odd rule + OpenCV's Bresenham edges), but for edges that
                                   leave the canvas (OpenCV clips them): <= 0.5 % of the pasted pixels differ
    CUDA kernel vs C reference     every byte equal (with and without pastes)
Widths are multiples of 64: OpenCV's HSV->BGR rounds the columns its SIMD loop leaves over (a row's last
width % 64 pixels) differently from the rest; training images (640, 320...) have none.
Run: python -m pytest -q tests/ops/test_augment.py
"""

import cv2
import numpy as np
import pytest
import torch

from yolov9c.data.copy_paste import copy_paste
from yolov9c.data.hsv import hsv_luts
from yolov9c.ops import extension
from yolov9c.ops.augment import augment, augment_reference, paste_polygons

C = extension.load()
CUDA = torch.cuda.is_available() and bool(C.build_info()["cuda"])


def _polygon(rng, w, h):
    """A random pixel polygon on a w x h canvas (a star around a centre, or every third one self-crossing) and
    its bounding rectangle cut to the canvas, as copy_paste.paste_sources gives them."""
    n = int(rng.integers(3, 30))
    if rng.random() < 1 / 3:
        q = rng.uniform((0, 0), (w, h), (n, 2))
    else:
        c, r = rng.uniform((0, 0), (w, h)), rng.uniform(3, min(w, h) / 4)
        a = np.sort(rng.uniform(0, 2 * np.pi, n))
        q = c + r * rng.uniform(0.3, 1, (n, 1)) * np.stack((np.cos(a), np.sin(a)), 1)
    q = np.clip(q, 0, (w, h)).astype(np.int32)
    x0, y0 = q.min(0)
    x1, y1 = np.minimum(q.max(0) + 1, (w, h))
    return q, (int(x0), int(y0), int(x1), int(y1))


def _paste_rows(lists):
    """[[(m, [(polygon, rectangle)]) per layer] per image] -> paste (B, 2, L) int32 (yolov9c/ops/augment.py)."""
    rows = [[[len(polys), m] + [v for q, r in polys for v in (len(q), *r, *q.ravel().tolist())] for m, polys in img]
            for img in lists]
    out = np.zeros((len(rows), 2, max(2, max(len(r) for img in rows for r in img))), np.int32)
    for b, img in enumerate(rows):
        for layer, r in enumerate(img):
            out[b, layer, :len(r)] = r
    return out


def _plan(rng, B=4, H=128, W=128, hsv=True, mixup=True, flips=True, perspective=True, pastes=0):
    """Random plan + sources for a (B, 3, H, W) batch: 2 layers of 4 mosaic tiles per image around a random
    centre of a 2H x 2W canvas, up to `pastes` random polygons pasted per layer, each layer warped by a random
    rotation/scale/shear/translation (+ perspective)."""
    imgs = [cv2.GaussianBlur(rng.integers(0, 256, (int(rng.integers(50, 150)), int(rng.integers(50, 150)), 3),
                                          dtype=np.uint8), (5, 5), 0) for _ in range(8)]
    offs = np.cumsum([0] + [im.size for im in imgs])
    src = np.concatenate([im.ravel() for im in imgs])
    tiles = np.zeros((B, 2, 4, 9), np.int64)
    warp = np.zeros((B, 2, 9), np.float32)
    mix = np.zeros((B, 2), np.float32)
    flags = np.zeros((B, 4), np.int64)
    luts = np.zeros((B, 3, 256), np.uint8)
    for b in range(B):
        for layer in range(2):
            xc, yc = int(rng.integers(W // 2, 3 * W // 2)), int(rng.integers(H // 2, 3 * H // 2))
            for t in range(4):
                k = int(rng.integers(8))
                h, w = imgs[k].shape[:2]
                x1 = max(xc - w, 0) if t in (0, 2) else xc
                x2 = xc if t in (0, 2) else min(xc + w, 2 * W)
                y1 = max(yc - h, 0) if t in (0, 1) else yc
                y2 = yc if t in (0, 1) else min(yc + h, 2 * H)
                pw = xc - w if t in (0, 2) else xc
                ph = yc - h if t in (0, 1) else yc
                tiles[b, layer, t] = (offs[k], h, w, x1, y1, x2, y2, pw, ph)
            a, s = np.radians(rng.uniform(-20, 20)), rng.uniform(0.5, 1.5)
            sh = np.tan(np.radians(rng.uniform(-5, 5)))
            M = np.array([[s * np.cos(a), s * np.sin(a) + sh, rng.uniform(-W / 2, -W / 4)],
                          [-s * np.sin(a), s * np.cos(a), rng.uniform(-H / 2, -H / 4)],
                          [rng.uniform(-1e-3, 1e-3) * perspective, rng.uniform(-1e-3, 1e-3) * perspective, 1]])
            warp[b, layer] = np.linalg.inv(M).astype(np.float32).ravel()
        r = rng.beta(32, 32)
        mix[b] = (r, 1 - r)
        flags[b] = (2 if mixup and b % 2 else 1, flips and b % 4 == 1, flips and b % 4 >= 2, hsv)
        luts[b] = np.stack(hsv_luts(rng.uniform(-1, 1, 3) * (0.015, 0.7, 0.4) + 1))
    lists = [[(2 * W - 1, [_polygon(rng, 2 * W, 2 * H) for _ in range(int(rng.integers(0, pastes + 1)))])
              for _ in range(2)] for _ in range(B)] if pastes else [[(0, [])] * 2] * B
    return [torch.from_numpy(x) for x in (src, tiles, warp, mix, flags, luts, _paste_rows(lists))]


def _run(args, H=128, W=128):
    out = torch.full((len(args[1]), 3, H, W), 7, dtype=torch.uint8)
    return augment(out, *args)


def _shares(a, b):
    d = (a.int() - b.int()).abs()
    return (d == 0).float().mean().item(), (d <= 1).float().mean().item(), d.max().item()


@pytest.mark.parametrize("pastes", [0, 6])
@pytest.mark.parametrize("seed", [0, 1])
def test_warp_mixup_flips_match_opencv(seed, pastes):
    args = _plan(np.random.default_rng(seed), hsv=False, pastes=pastes)
    equal, within1, worst = _shares(_run(args), augment_reference(*args, 128, 128))
    assert equal >= 0.9998 and worst <= 1, f"equal {equal:.6f}, largest difference {worst}"


@pytest.mark.parametrize("pastes", [0, 6])
@pytest.mark.parametrize("seed", [2, 3])
def test_with_hsv_matches_opencv(seed, pastes):
    args = _plan(np.random.default_rng(seed), pastes=pastes)
    equal, within1, worst = _shares(_run(args), augment_reference(*args, 128, 128))
    assert equal >= 0.999 and within1 >= 0.999, f"equal {equal:.6f}, within 1 {within1:.6f}, largest {worst}"


def test_hsv_alone_is_exact():
    """Identity warp, one tile: OpenCV's BGR->HSV, LUT, HSV->BGR on every pixel, byte for byte."""
    rng = np.random.default_rng(4)
    H, W = 64, 128
    img = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    tiles = np.zeros((2, 2, 4, 9), np.int64)
    tiles[:, 0, 0] = (0, H, W, 0, 0, W, H, 0, 0)
    warp = np.tile(np.eye(3, dtype=np.float32).ravel(), (2, 2, 1))
    luts = np.stack([np.stack(hsv_luts(rng.uniform(-1, 1, 3) * (0.015, 0.7, 0.4) + 1)) for _ in range(2)])
    args = [torch.from_numpy(x) for x in (img.ravel(), tiles, warp, np.zeros((2, 2), np.float32),
                                          np.array([[1, 0, 0, 1]] * 2, np.int64), luts, np.zeros((2, 2, 2), np.int32))]
    out = _run(args, H, W)
    assert torch.equal(out, augment_reference(*args, H, W))
    assert not torch.equal(out[0], torch.from_numpy(img[..., ::-1].transpose(2, 0, 1).copy()))  # it did change


def test_identity_plan_copies_the_image():
    """One tile at the origin, identity map, no HSV, no flips: the output is the image (RGB planes)."""
    img = np.random.default_rng(5).integers(0, 256, (40, 24, 3), dtype=np.uint8)
    tiles = np.zeros((1, 2, 4, 9), np.int64)
    tiles[0, 0, 0] = (0, 40, 24, 0, 0, 24, 40, 0, 0)
    warp = np.tile(np.eye(3, dtype=np.float32).ravel(), (1, 2, 1))
    args = [torch.from_numpy(x) for x in (img.ravel(), tiles, warp, np.zeros((1, 2), np.float32),
                                          np.array([[1, 0, 0, 0]], np.int64), np.zeros((1, 3, 256), np.uint8),
                                          np.zeros((1, 2, 2), np.int32))]
    out = _run(args, 40, 24)
    assert torch.equal(out[0], torch.from_numpy(img[..., ::-1].transpose(2, 0, 1).copy()))
    args[4][0, 1:3] = 1  # both flips
    assert torch.equal(_run(args, 40, 24)[0], out[0].flip(1, 2))


def test_outside_every_tile_is_grey():
    args = _plan(np.random.default_rng(6), hsv=False, mixup=False)
    args[1][:, :, :, 5] = 0  # every tile empty
    assert (_run(args) == 114).all()


def test_bad_tiles_raise_not_crash():
    args = _plan(np.random.default_rng(7), B=2)
    bad = [a.clone() for a in args]
    bad[1][1, 0, 2, 0] = len(args[0])  # offset past the end of src
    with pytest.raises(ValueError, match="augment_forward: .*tile reads outside src"):
        _run(bad)
    bad = [a.clone() for a in args]
    bad[1][0, 0, 0, 7] += 1000  # padw: the rectangle leaves its image
    with pytest.raises(ValueError, match="augment_forward"):
        _run(bad)
    bad = [a.clone() for a in args]
    bad[4][0, 0] = 3  # three layers
    with pytest.raises(ValueError, match="augment_forward"):
        _run(bad)


def test_bad_arguments_name_the_argument():
    args = _plan(np.random.default_rng(8), B=2)
    with pytest.raises(ValueError, match="augment_forward: tiles"):
        _run([args[0], args[1][:, :, :3]] + args[2:])
    with pytest.raises(TypeError, match="augment_forward: warp must be float32"):
        _run([args[0], args[1], args[2].double()] + args[3:])
    with pytest.raises(ValueError, match="augment_forward: luts"):
        _run(args[:5] + [args[5][:1], args[6]])
    with pytest.raises(ValueError, match=r"augment_forward: out is 1 x 262145 pixels, at most 2\^18 a side"):
        _run([a[:1] for a in args], 1, (1 << 18) + 1)
    with pytest.raises(TypeError, match="augment_forward: paste must be int32"):
        _run(args[:6] + [args[6].long()])
    with pytest.raises(ValueError, match="augment_forward: paste rows hold 1 values, at least 2 needed"):
        _run(args[:6] + [args[6][:, :, :1].contiguous()])
    with pytest.raises(TypeError, match=r"augment_forward\(\) takes exactly 9"):
        C.augment_forward(None)


def test_fused_off_runs_the_opencv_reference(monkeypatch):
    args = _plan(np.random.default_rng(9), B=2, hsv=False)
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    assert torch.equal(_run(args), augment_reference(*args, 128, 128))


def _one_tile(img, B=1):
    """Plan arrays showing img (h, w, 3) as it is (identity warp, one tile, no HSV, no flips), B times."""
    h, w = img.shape[:2]
    tiles = np.zeros((B, 2, 4, 9), np.int64)
    tiles[:, 0, 0] = (0, h, w, 0, 0, w, h, 0, 0)
    return [torch.from_numpy(x) for x in (img.ravel(), tiles, np.tile(np.eye(3, dtype=np.float32).ravel(), (B, 2, 1)),
                                          np.zeros((B, 2), np.float32), np.array([[1, 0, 0, 0]] * B, np.int64),
                                          np.zeros((B, 3, 256), np.uint8))]


def test_paste_reads_the_mirrored_canvas():
    """An axis-aligned rectangle (no edge ambiguity): its mirrored place shows the mirrored pixels exactly,
    column c reading column m - c; nothing else changes; overlapping polygons paste once (as one flip)."""
    img = np.random.default_rng(11).integers(0, 256, (40, 64, 3), dtype=np.uint8)
    rect = np.array([(10, 5), (20, 5), (20, 15), (10, 15)], np.int32)
    tri = np.array([(12, 6), (19, 6), (19, 14)], np.int32)  # inside the rectangle: the same pixels again
    paste = _paste_rows([[(63, [(rect, (10, 5, 21, 16)), (tri, (12, 6, 20, 15))]), (0, [])]])
    out = _run(_one_tile(img) + [torch.from_numpy(paste)], 40, 64)[0].permute(1, 2, 0).numpy()[..., ::-1]
    want = img.copy()
    want[5:16, 63 - 20:63 - 9] = img[5:16, 10:21][:, ::-1]
    assert np.array_equal(out, want)
    assert np.array_equal(augment_reference(*_one_tile(img), paste, 40, 64)[0].permute(1, 2, 0).numpy()[..., ::-1],
                          want)


def test_paste_matches_copy_paste_pixels():
    """The op pastes what yolov9c/data/copy_paste.py pastes (one object per image, p = 1, the same polygon and
    rectangle from copy_paste.paste_sources): only edge pixels of the fill differ, <= 0.5 % of the pasted ones."""
    from yolov9c.data.copy_paste import paste_sources

    rng = np.random.default_rng(12)
    H, W = 96, 128
    img = cv2.GaussianBlur(rng.integers(0, 256, (H, W, 3), dtype=np.uint8), (5, 5), 0)
    want, lists, pasted = [], [], 0
    while len(want) < 24:
        q, _ = _polygon(rng, W, H)
        labels = np.array([[0, *q.min(0), *q.max(0)]], np.float32)
        chosen = np.arange(1) if (W - labels[0, 3] >= labels[0, 3] or W - labels[0, 1] <= labels[0, 1]) else None
        if chosen is None or cv2.contourArea(q) < 20:  # a mirror over its own box (IoA >= 0.3) is never pasted
            continue
        out, lab, _ = copy_paste(img.copy(), labels, [q.astype(np.float32)], np.random.default_rng(0), p=1.0)
        assert len(lab) == 2
        want.append(out)
        lists.append([(W - 1, paste_sources([q.astype(np.float32)], chosen, W, H)), (0, [])])
        pasted += (out != img).any(2).sum()
    got = _run(_one_tile(img, len(want)) + [torch.from_numpy(_paste_rows(lists))], H, W)
    got = got.permute(0, 2, 3, 1).numpy()[..., ::-1]
    differ = (got != np.stack(want)).any(3).sum()
    assert pasted > 5000 and differ <= 0.005 * pasted, f"{differ} of {pasted} pasted pixels differ"


def test_the_paste_tolerance_notices_a_missing_paste():
    """The random pastes of the tests above change far more than their tolerances allow."""
    args = _plan(np.random.default_rng(0), hsv=False, pastes=6)
    assert args[6][:, :, 0].sum() >= 8  # polygons pasted, stars and self-crossing ones
    want = augment_reference(*args, 128, 128)
    args[6].zero_()
    equal, within1, worst = _shares(_run(args), want)
    assert within1 < 0.99, f"within 1 {within1:.6f}"


def test_bad_paste_lists_raise_not_crash():
    args = _plan(np.random.default_rng(15), B=2, pastes=3)
    args[6][:, :, 0] = 0
    args[6][1, 0, :7] = torch.tensor([1, 255, 2, 0, 0, 5, 5], dtype=torch.int32)  # a polygon of 2 vertices
    with pytest.raises(ValueError, match="augment_forward: .*paste list does not fit its row"):
        _run(args)
    args[6][1, 0, :7] = torch.tensor([1, 255, (1 << 30), 0, 0, 5, 5], dtype=torch.int32)  # past the row's end
    with pytest.raises(ValueError, match="augment_forward: .*paste list does not fit its row"):
        _run(args)
    args[6][1, 0, :7] = torch.tensor([1, 255, 3, 4, 4, 4, 9], dtype=torch.int32)  # an empty rectangle
    with pytest.raises(ValueError, match="augment_forward: .*paste list does not fit its row"):
        _run(args)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of yolov9c._C")
@pytest.mark.parametrize("pastes", [0, 6])
@pytest.mark.parametrize("shape", [(4, 128, 128), (3, 96, 160), (1, 33, 65)])
def test_cuda_kernel_equals_c_reference(shape, pastes):
    B, H, W = shape
    args = _plan(np.random.default_rng(10), B=B, H=H, W=W, pastes=pastes)
    ref = _run(args, H, W)
    out = torch.full((B, 3, H, W), 7, dtype=torch.uint8, device="cuda")
    augment(out, *[a.cuda() for a in args])
    assert torch.equal(out.cpu(), ref)
