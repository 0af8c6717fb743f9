"""Class-frequency image weights (`--image-weights`): images holding rare classes are drawn more often.

class weights = 1 / (count of each class) normalised to sum 1 (a class never seen counts as 1), as published;
the trainer may scale them (published: · (1 − mAP per class)² / nc) and hand new image weights to the loader
each epoch (loader.py: `loader.sampler.weights = ...`). An image's weight is the sum of its labels' class
weights; a background image gets 0 and is never drawn (published behaviour).

Test: python -m pytest -q tests/data/test_loader.py -k weights
"""

import numpy as np


def class_weights(labels, nc):
    """labels: list of (k, 5) arrays (column 0 = class) → float64 (nc,) weights summing to 1."""
    classes = np.concatenate([np.asarray(lb)[:, 0] for lb in labels]) if labels else np.zeros(0)
    counts = np.bincount(classes.astype(np.int64), minlength=nc).astype(np.float64)
    counts[counts == 0] = 1
    w = 1 / counts
    return w / w.sum()


def image_weights(labels, nc, cw=None):
    """Per-image weights (n,) float64 = sum of the class weights `cw` (default class_weights) of its labels."""
    cw = class_weights(labels, nc) if cw is None else np.asarray(cw, np.float64)
    return np.array([cw[np.asarray(lb)[:, 0].astype(np.int64)].sum() for lb in labels], np.float64)
