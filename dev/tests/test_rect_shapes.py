"""dev/probes/rect_shapes.py: its shares are what the trainer's keyed step does with the same batches."""

import sys
import types
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "dev" / "probes"))
import rect_shapes  # noqa: E402

from yolov9c.data.rect import rect_batch_shapes, rect_order  # noqa: E402
from yolov9c.engine.train import graph_shapes as GS  # noqa: E402
from yolov9c.engine.train.config import RunConfig  # noqa: E402


def _plan_share(sizes, batch, img, cap):
    """The share of batches ShapeGraphStep.plan replays (each new key held at once, as a capture would)."""
    sizes = np.asarray(sizes, np.float64)
    _, shapes = rect_batch_shapes(sizes[rect_order(sizes)], batch, img)
    state = types.SimpleNamespace(cfg=RunConfig(), dataset=types.SimpleNamespace(rect=True, batch_shapes=shapes))
    step = GS.ShapeGraphStep.__new__(GS.ShapeGraphStep)  # plan's fields only: no device, optimizer or pool
    step.micro, step.cap, step.buckets, step.warmup_left, step.benchmark, step.warm = {}, cap, (32,), 0, False, set()
    step.frequent = GS.frequent_sizes(state, cap)
    graphed = 0
    for h, w in shapes.tolist():
        imgs = torch.zeros(2, 3, h, w)
        key, why = step.plan(imgs, torch.zeros(0, 6))
        if why is None:
            step.micro[key] = object()
            graphed += 1
    return graphed / len(shapes)


def test_the_probe_counts_what_the_keyed_step_graphs():
    rng = np.random.default_rng(1)
    aspect = np.concatenate([rng.uniform(0.3, 0.7, 40), np.full(300, 0.75), rng.uniform(0.8, 1.6, 160)])
    sizes = np.stack([640 * np.minimum(aspect, 1), 640 / np.maximum(aspect, 1)], 1)
    got = rect_shapes.graphed_shares(sizes, 16, 640, cap=6)
    assert got["shapes"] > 6 and got["kept"] > got["first_come"]
    assert got["kept"] == _plan_share(sizes, 16, 640, 6)
