"""Random vertical and horizontal flips (hyp keys flipud, fliplr), on normalised xywh labels.

Published semantics (LoadImagesAndLabels.__getitem__): after the labels are turned into normalised
[cls, xc, yc, w, h], flip up-down with probability flipud (yc -> 1 - yc), then left-right with probability
fliplr (xc -> 1 - xc). Two uniforms are always drawn, in that order, even when a probability is 0.

Test: python -m pytest -q tests/data/test_data_augment.py -k flip
"""

import numpy as np


def random_flip(img, labels, rng, flipud=0.0, fliplr=0.5):
    """Flip an image and its labels at random.

    img: (H, W, 3) uint8. labels: (n, 5) float32 [cls, xc, yc, w, h] normalised, modified in place.
    rng: numpy.random.Generator.
    Returns (img, labels). A flipped img is a negatively strided view of the input (no copy: the caller's
    HWC BGR -> CHW RGB conversion copies anyway); use np.ascontiguousarray before handing it to OpenCV.
    """
    labels = np.asarray(labels)
    if rng.random() < flipud:
        img = img[::-1]
        if len(labels):
            labels[:, 2] = 1 - labels[:, 2]
    if rng.random() < fliplr:
        img = img[:, ::-1]
        if len(labels):
            labels[:, 1] = 1 - labels[:, 1]
    return img, labels
