"""MixUp (hyp key mixup): blend a training sample with a second one and keep the labels of both.
Published semantics (utils/augmentations.py mixup): ratio r ~ Beta(32, 32) (concentrated around 0.5),
image = r * img + (1 - r) * img2, labels concatenated (img's rows first). The caller decides whether to mix
(probability hyp mixup) and builds img2 (a second mosaic).
Difference: the blend is rounded to the nearest integer by cv2.addWeighted (much faster than float NumPy;
benchmarks/RESULTS.md §10), where the published code truncates; pixels differ by at most 1.
Test: python -m pytest -q tests/data/test_data_augment.py -k mixup
"""

import cv2
import numpy as np

MIXUP_ALPHA = 32.0  # Beta(alpha, alpha)


def mixup(img, labels, img2, labels2, rng):
    """Blend two samples of the same shape.

    img, img2: (H, W, 3) uint8 BGR. labels, labels2: (n, 5), (m, 5) float32 label rows (any box format,
    both the same). rng: numpy.random.Generator (one beta draw).
    Returns (img (H, W, 3) uint8 new array, labels (n + m, 5) float32).
    """
    if img.shape != img2.shape:
        raise ValueError(f"mixup: image shapes differ: {img.shape} vs {img2.shape}")
    r = rng.beta(MIXUP_ALPHA, MIXUP_ALPHA)
    out = cv2.addWeighted(img, r, img2, 1.0 - r, 0.0)
    labels = np.concatenate((np.asarray(labels, np.float32).reshape(-1, 5),
                             np.asarray(labels2, np.float32).reshape(-1, 5)), 0)
    return out, labels
