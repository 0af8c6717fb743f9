"""Learning-rate lambdas (stepped once per epoch) and the per-iteration warm-up of train_dual.py.

    lf = lr_lambda("linear", epochs=100, lrf=0.01)   # factor of lr0 at an epoch
    warmup(optimizer, ni, nw, epoch, lf, hyp)        # during the first nw iterations

Test: python -m pytest -q tests/engine/train/test_train_parts.py -k schedule
"""

import math

import numpy as np

SCHEDULES = ("linear", "cos", "flat-cos", "fixed")


def lr_lambda(kind, epochs, lrf):
    """The LR factor as a function of the epoch: linear 1 → lrf; cos ((1 − cos(e·π/E))/2)·(lrf − 1) + 1;
    flat-cos 1 for the first E//2 epochs, then cosine 1 → lrf over the next E//2; fixed 1."""
    if kind == "linear":
        return lambda e: (1 - e / epochs) * (1.0 - lrf) + lrf
    if kind == "cos":
        return lambda e: ((1 - math.cos(e * math.pi / epochs)) / 2) * (lrf - 1) + 1
    if kind == "flat-cos":
        half = epochs // 2

        def flat_cos(e):
            # as published: the cosine runs over epochs // 2 epochs starting at epochs // 2
            x = e - half if e > half else 0
            return ((1 - math.cos(x * math.pi / max(half, 1))) / 2) * (lrf - 1) + 1
        return flat_cos
    if kind == "fixed":
        return lambda e: 1.0
    raise ValueError(f"unknown LR schedule {kind!r}; one of {', '.join(SCHEDULES)}")


def warmup_iterations(warmup_epochs, nb):
    """Warm-up length in iterations: max(round(warmup_epochs · batches per epoch), 100), as published."""
    return max(round(warmup_epochs * nb), 100)


def warmup(optimizer, ni, nw, epoch, lf, hyp):
    """Set each group's lr (and SGD momentum) for iteration ni ≤ nw: group 0 (biases) from
    hyp['warmup_bias_lr'] down to initial_lr·lf(epoch), the others from 0 up to it; momentum from
    hyp['warmup_momentum'] up to hyp['momentum']."""
    xi = [0, nw]
    for j, g in enumerate(optimizer.param_groups):
        g["lr"] = float(np.interp(ni, xi, [hyp["warmup_bias_lr"] if j == 0 else 0.0, g["initial_lr"] * lf(epoch)]))
        if "momentum" in g:
            g["momentum"] = float(np.interp(ni, xi, [hyp["warmup_momentum"], hyp["momentum"]]))


def warmup_accumulate(ni, nw, nbs, batch_size):
    """Micro-batches per optimizer step during warm-up: round(interp(ni, [0, nw], [1, nbs / batch])), ≥ 1."""
    return max(1, int(np.interp(ni, [0, nw], [1, nbs / batch_size]).round()))
