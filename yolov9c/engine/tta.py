"""Test-time augmentation (`--augment` of val_dual.py and detect_dual.py), the published recipe (_forward_augment).

    y = augmented_inference(model, imgs)              # (B, 4 + nc, A1 + A2 + A3), main head, xywh pixels
    y, maps = augmented_inference(model, imgs, return_maps=True)   # maps: the plain pass's raw maps (loss)

Three passes: scale 1, scale 0.83 flipped left-right, scale 0.67; a scaled input is resized bilinearly to
(int(h·s), int(w·s)) and padded right/bottom to a multiple of the largest stride with 0.447 (scale_img). Only the
main head's decoded output is used. Boxes are divided by the scale; the flipped pass un-flips x (x = W − x).
Clipping (published _clip_augmented): the scale-1 pass drops its coarsest level's anchors, the 0.67 pass its
finest level's; 0.83 is kept whole. Anchor counts come from each pass's input size and the strides
(ceil(h/s)·ceil(w/s)): the published Σ 4^k for stride-aligned inputs, and right for any level layout.
The three sets are concatenated along the anchor dimension (the published code uses dim 1, the channel
dimension of (B, 4 + nc, A), and fails).
Test: python -m pytest -q tests/engine/test_tta.py
"""

import math

import torch
import torch.nn.functional as F

from yolov9c.geometry import level_anchor_counts

SCALES = (1.0, 0.83, 0.67)
FLIPS = (False, True, False)  # left-right flip per pass
PAD_VALUE = 0.447


def scale_img(img, ratio, gs=32):
    """(B, C, H, W) float batch → resized by `ratio` (bilinear, align_corners False) to (int(H·r), int(W·r)),
    padded right/bottom with 0.447 to multiples of `gs`. ratio 1 returns `img` itself."""
    if ratio == 1.0:
        return img
    h, w = img.shape[-2:]
    sh, sw = int(h * ratio), int(w * ratio)
    out = F.interpolate(img, size=(sh, sw), mode="bilinear", align_corners=False)
    ph, pw = math.ceil(h * ratio / gs) * gs, math.ceil(w * ratio / gs) * gs
    return F.pad(out, [0, pw - sw, 0, ph - sh], value=PAD_VALUE)


def _main_and_maps(out):
    """Eval output → (main-head decoded predictions (B, 4+nc, A), raw maps or None)."""
    if isinstance(out, torch.Tensor):
        return out, None
    y, maps = (out[0], out[1]) if isinstance(out, tuple) and len(out) == 2 else (out, None)
    if isinstance(y, (list, tuple)):
        y = y[-1]  # DualDDetect [aux, main]: the main branch
    return y, maps


def _descale(y, scale, flip, width):
    """De-augment one pass's predictions (B, 4+nc, A) into a new tensor: divide the xywh box by the scale,
    then (flipped pass) x = width − x in input pixels."""
    y = y.clone()
    y[:, :4] /= scale
    if flip:
        y[:, 0] = width - y[:, 0]
    return y


def augmented_inference(model, imgs, return_maps=False):
    """Run `model` (eval mode; `stride` attribute) on `imgs` (B, C, H, W, float in [0, 1]) with the published
    TTA; returns the concatenated main-head predictions (B, 4 + nc, A_1 + A_2 + A_3) in input pixels, and
    with `return_maps` also the plain (scale 1) pass's raw maps for a validation loss."""
    strides = [float(s) for s in torch.as_tensor(model.stride).flatten()]
    gs = max(int(max(strides)), 32)
    h, w = imgs.shape[-2:]
    ys, maps = [], None
    for k, (s, flip) in enumerate(zip(SCALES, FLIPS)):
        x = scale_img(imgs.flip(-1) if flip else imgs, s, gs)
        y, m = _main_and_maps(model(x))
        if k == 0:
            maps = m
        counts = level_anchor_counts(x.shape[-2], x.shape[-1], strides)
        if sum(counts) != y.shape[-1]:
            raise ValueError(f"augmented_inference: the head gave {y.shape[-1]} anchors for a "
                             f"{tuple(x.shape[-2:])} input, expected {sum(counts)} from strides {strides}")
        y = _descale(y, s, flip, w)
        if k == 0:
            y = y[..., :y.shape[-1] - counts[-1]]  # large scale: drop the coarsest level
        elif k == len(SCALES) - 1:
            y = y[..., counts[0]:]  # small scale: drop the finest level
        ys.append(y)
    out = torch.cat(ys, -1)
    return (out, maps) if return_maps else out
