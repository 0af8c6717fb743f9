"""Seeded model builds, made once per test process: `torch.manual_seed(seed); build_model(cfg, nc=nc)` costs
~0.3 s of CPU for yolov9-t and ~1.5 s for yolov9-c (layers, initialisation, the stride probe), and many tests
build the same model from the same seed. A copy of the first build is what a new build would give (the same
parameters, buffers and modules, in train mode), and the global RNGs are left where that seeding and build left
them (CPU and CUDA), so the inputs a test draws next are the same too.

    model = seeded_model("yolov9-t")       # as: torch.manual_seed(0); model = build_model("yolov9-t", nc=3)
    x = torch.rand(2, 3, 64, 64)           # the same x as after that build
"""

import copy
import functools

import torch

from yolov9c.api import build_model


@functools.lru_cache(maxsize=None)
def _built(cfg, nc, seed):
    torch.manual_seed(seed)
    model = build_model(cfg, nc=nc)
    return model, torch.get_rng_state()


def shared_seeded_model(cfg, nc=3, seed=0):
    """The one build itself, not a copy: only for callers that read it or copy it before changing it (train/eval,
    apply, .to, hooks, a backward all change it). Sets the global RNG as `seeded_model` does."""
    model, rng = _built(cfg, nc, seed)
    torch.manual_seed(seed)  # every device's generator as the seeding left it (the build draws on the CPU only)
    torch.set_rng_state(rng)  # the CPU generator where the build left it
    return model


def seeded_model(cfg, nc=3, seed=0):
    """A fresh copy of `torch.manual_seed(seed); build_model(cfg, nc=nc)`, with the global RNG state that build
    leaves (cfg: a config name)."""
    return copy.deepcopy(shared_seeded_model(cfg, nc, seed))
