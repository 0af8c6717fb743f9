"""Quad batches (`--quad`): every 4 images of a training batch become one image of twice the side.

Published (utils/dataloaders.py collate_fn4, used by train_dual.py --quad): for each group of 4 consecutive images,
with probability 0.5 the group's first image is upsampled 2x (bilinear, align_corners False, cast back to uint8 by
truncation) with its labels unchanged, else the 4 images are tiled 2x2 (first top-left, second below it, third to
its right, fourth bottom-right) with their normalised labels moved into their quarter. The training loss is then
multiplied by 4 (engine/train/step.py). Images beyond the last whole group are dropped, as published; a batch of
fewer than 4 images (an epoch's last partial batch), which the published collate cannot make, gives one image: its
first, upsampled. The trainer calls it on each loader batch, before plotting and prepare_batch.

Test: python -m pytest -q tests/data/test_quad.py
"""

import torch
import torch.nn.functional as F

# per quarter of the tile: (x offset, y offset) in units of one source image
_QUARTERS = ((0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0))


def quad(imgs, targets, rng):
    """imgs uint8 (B, 3, H, W) (any device), targets float32 (N, 6) [image, cls, xc, yc, w, h] normalised (host)
    → (uint8 (max(B // 4, 1), 3, 2H, 2W), float32 (N', 6) with the new image index in column 0). `rng`: a numpy
    Generator, one draw per output image (< 0.5: upsample)."""
    b = imgs.shape[0]
    out_imgs, out_targets = [], []
    for g in range(max(b // 4, 1)):
        i = 4 * g
        if b < 4 or rng.random() < 0.5:
            big = F.interpolate(imgs[i:i + 1].float(), scale_factor=2.0, mode="bilinear", align_corners=False)
            out_imgs.append(big[0].to(imgs.dtype))
            t = targets[targets[:, 0] == i].clone()
        else:
            left = torch.cat((imgs[i], imgs[i + 1]), 1)  # stacked along H
            right = torch.cat((imgs[i + 2], imgs[i + 3]), 1)
            out_imgs.append(torch.cat((left, right), 2))
            parts = []
            for k, (ox, oy) in enumerate(_QUARTERS):
                t = targets[targets[:, 0] == i + k].clone()
                t[:, 2] = (t[:, 2] + ox) * 0.5
                t[:, 3] = (t[:, 3] + oy) * 0.5
                t[:, 4:6] *= 0.5
                parts.append(t)
            t = torch.cat(parts, 0)
        t[:, 0] = g
        out_targets.append(t)
    return torch.stack(out_imgs, 0), torch.cat(out_targets, 0)
