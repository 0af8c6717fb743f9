"""The augment op (yolov9c/ops/augment.py; C reference csrc/augment_ref.c, kernel kernels/augment.cu): random
plans with every feature (4-tile mosaic canvases, rotation/shear/scale/perspective with grey border, mixup,
HSV gain, flips) against the same plans through OpenCV (augment_reference), the kernel against the C
reference, and bad arguments.

Tolerances (OpenCV 5.1 as the reference; the maths and its rounding: kernels/augment_pixel.h):
    warp / mixup / flips only      >= 99.98 % of values equal, none off by more than 1 grey level
    with HSV gain                  >= 99.9 % equal and >= 99.9 % within 1 level (HSV turns a 1-level
                                   bilinear rounding difference of a grey pixel into a hue change)
    CUDA kernel vs C reference     every byte equal
Widths are multiples of 64: OpenCV's HSV->BGR rounds the columns its SIMD loop leaves over (a row's last
width % 64 pixels) differently from the rest; training images (640, 320...) have none.
Run: python -m pytest -q tests/test_augment.py
"""

import cv2
import numpy as np
import pytest
import torch

from yolov9c.data.hsv import hsv_luts
from yolov9c.ops import extension
from yolov9c.ops.augment import augment, augment_reference

C = extension.load()
CUDA = torch.cuda.is_available() and bool(C.build_info()["cuda"])


def _plan(rng, B=4, H=128, W=128, hsv=True, mixup=True, flips=True, perspective=True):
    """Random plan + sources for a (B, 3, H, W) batch: 2 layers of 4 mosaic tiles per image around a random
    centre of a 2H x 2W canvas, each layer warped by a random rotation/scale/shear/translation (+ perspective)."""
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
    return [torch.from_numpy(x) for x in (src, tiles, warp, mix, flags, luts)]


def _run(args, H=128, W=128):
    out = torch.full((len(args[1]), 3, H, W), 7, dtype=torch.uint8)
    return augment(out, *args)


def _shares(a, b):
    d = (a.int() - b.int()).abs()
    return (d == 0).float().mean().item(), (d <= 1).float().mean().item(), d.max().item()


@pytest.mark.parametrize("seed", [0, 1])
def test_warp_mixup_flips_match_opencv(seed):
    args = _plan(np.random.default_rng(seed), hsv=False)
    equal, within1, worst = _shares(_run(args), augment_reference(*args, 128, 128))
    assert equal >= 0.9998 and worst <= 1, f"equal {equal:.6f}, largest difference {worst}"


@pytest.mark.parametrize("seed", [2, 3])
def test_with_hsv_matches_opencv(seed):
    args = _plan(np.random.default_rng(seed))
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
                                          np.array([[1, 0, 0, 1]] * 2, np.int64), luts)]
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
                                          np.array([[1, 0, 0, 0]], np.int64), np.zeros((1, 3, 256), np.uint8))]
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
        _run(args[:5] + [args[5][:1]])
    with pytest.raises(ValueError, match=r"augment_forward: out is 1 x 262145 pixels, at most 2\^18 a side"):
        _run([a[:1] for a in args], 1, (1 << 18) + 1)
    with pytest.raises(TypeError, match=r"augment_forward\(\) takes exactly 8"):
        C.augment_forward(None)


def test_fused_off_runs_the_opencv_reference(monkeypatch):
    args = _plan(np.random.default_rng(9), B=2, hsv=False)
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    assert torch.equal(_run(args), augment_reference(*args, 128, 128))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of yolov9c._C")
@pytest.mark.parametrize("shape", [(4, 128, 128), (3, 96, 160), (1, 33, 65)])
def test_cuda_kernel_equals_c_reference(shape):
    B, H, W = shape
    args = _plan(np.random.default_rng(10), B=B, H=H, W=W)
    ref = _run(args, H, W)
    out = torch.full((B, 3, H, W), 7, dtype=torch.uint8, device="cuda")
    augment(out, *[a.cuda() for a in args])
    assert torch.equal(out.cpu(), ref)
