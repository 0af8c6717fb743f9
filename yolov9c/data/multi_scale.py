"""Multi-scale training (`--multi-scale`): each batch resized to a random size in [0.5, 1.5]·imgsz.

Published (train_dual.py): size = randrange(0.5·imgsz, 1.5·imgsz + gs) // gs · gs; factor = size / the
batch's long side; when the factor is not 1 both sides become ceil(side · factor / gs) · gs and the batch is
resized bilinearly (align_corners False). Labels are normalised, so they need no change.
The trainer calls it on the float image batch after moving it to the device.

Test: python -m pytest -q tests/data/test_loader.py -k multi_scale
"""

import math

import torch.nn.functional as F


def multi_scale_size(imgsz, stride, rng):
    """The random target long side: a multiple of `stride` in [0.5·imgsz, 1.5·imgsz] (numpy Generator rng)."""
    lo, hi = int(imgsz * 0.5), int(imgsz * 1.5 + stride)
    return int(rng.integers(lo, hi)) // stride * stride


def multi_scale(imgs, imgsz, stride, rng):
    """imgs: float tensor (B, C, H, W) → the batch resized as above (or imgs itself when the factor is 1)."""
    sz = multi_scale_size(imgsz, stride, rng)
    sf = sz / max(imgs.shape[2:])
    if sf == 1:
        return imgs
    ns = [math.ceil(x * sf / stride) * stride for x in imgs.shape[2:]]
    return F.interpolate(imgs, size=ns, mode="bilinear", align_corners=False)
