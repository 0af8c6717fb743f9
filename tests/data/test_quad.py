"""--quad's batches (yolov9c/data/quad.py): the published collate_fn4's 2x2 tile and 2x upsample, labels moved
with their pixels, images beyond the last group of 4 dropped, a batch under 4 images kept as one.

Run: python -m pytest -q tests/data/test_quad.py
"""

import numpy as np
import torch
import torch.nn.functional as F

from yolov9c.data.quad import quad


class _Coin:
    """A numpy-Generator stand-in whose random() returns the given values in turn."""

    def __init__(self, *values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


def _batch(b, h=8, w=12):
    imgs = torch.stack([torch.full((3, h, w), 10 * (k + 1), dtype=torch.uint8) for k in range(b)])
    # one box per image, centred at (0.25, 0.75) with size (0.5, 0.25); class = image index
    targets = torch.tensor([[k, k, 0.25, 0.75, 0.5, 0.25] for k in range(b)], dtype=torch.float32)
    return imgs, targets


def test_tile_puts_each_image_and_its_box_in_its_quarter():
    imgs, targets = _batch(4)
    out, t = quad(imgs, targets, _Coin(0.9))
    assert out.shape == (1, 3, 16, 24) and out.dtype == torch.uint8
    # image 0 top-left, 1 bottom-left, 2 top-right, 3 bottom-right
    assert [int(out[0, 0, y, x]) for y, x in ((0, 0), (8, 0), (0, 12), (8, 12))] == [10, 20, 30, 40]
    assert t[:, 0].tolist() == [0, 0, 0, 0] and t[:, 1].tolist() == [0, 1, 2, 3]
    expected = [[0.125, 0.375], [0.125, 0.875], [0.625, 0.375], [0.625, 0.875]]
    assert torch.allclose(t[:, 2:4], torch.tensor(expected))
    assert torch.allclose(t[:, 4:6], torch.tensor([[0.25, 0.125]] * 4))
    for (cx, cy), cls in zip(expected, t[:, 1].tolist()):  # each box centre lies on its own image's pixels
        assert int(out[0, 0, int(cy * 16), int(cx * 24)]) == 10 * (int(cls) + 1)


def test_upsample_keeps_the_first_image_and_its_labels():
    imgs, targets = _batch(8)
    imgs[0, :, 0, 0] = 250
    out, t = quad(imgs, targets, _Coin(0.1, 0.9))
    assert out.shape == (2, 3, 16, 24)
    ref = F.interpolate(imgs[:1].float(), scale_factor=2.0, mode="bilinear", align_corners=False).to(torch.uint8)
    assert torch.equal(out[0], ref[0])
    first = t[t[:, 0] == 0]
    assert first[:, 1].tolist() == [0] and torch.equal(first[0, 2:], targets[0, 2:])
    assert t[t[:, 0] == 1][:, 1].tolist() == [4, 5, 6, 7]


def test_the_remainder_is_dropped_and_a_short_batch_gives_one_image():
    imgs, targets = _batch(6)
    out, t = quad(imgs, targets, np.random.default_rng(0))
    assert out.shape[0] == 1 and set(t[:, 1].tolist()) <= {0, 1, 2, 3}
    imgs, targets = _batch(3)
    out, t = quad(imgs, targets, _Coin())  # no draw: a short batch is always upsampled
    assert out.shape == (1, 3, 16, 24) and t[:, 1].tolist() == [0]
