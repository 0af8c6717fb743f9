"""CUDA graphs keyed by shape (--graph-shapes, the default): graph_step.GraphStep with a micro-step
graph per (image batch layout, box bucket), so the planner's or the out-of-memory guard's micro-batch, --rect
batches, --multi-scale sizes and an epoch's last partial batch replay graphs instead of running eagerly.

    state.step = select_step(state)         # set-up, once: ShapeGraphStep, GraphStep or step.EagerStep
    key, why = step.plan(imgs, targets)     # ((layout, bucket), None): replay (captured first when new); (None, why)

Contract: GraphStep's (a micro-batch's gradients = the eager step's, within rounding), per shape. A loader batch is
split into state.progress.micro_batch images (step.split_batch). The run's first WARMUP micro-batches run eagerly;
after them, with --cudnn-benchmark, so does the first micro-batch of each new layout (cuDNN times its convolutions;
a capture cannot), its graph captured at the next one; without it a new key is captured at first use. Every graph
shares one pool (they never run at once) and reads a view of one input buffer (the largest batch seen); at most
MAX_GRAPHS, eager beyond (logged once); with --rect and more shapes than that, slots kept for the most frequent
(frequent_sizes). A new micro-batch size gives every graph and the pool back.
Test: python -m pytest -q tests/engine/train/test_graph_shapes.py (keys on the CPU; graphed = eager per shape, CUDA)
"""

from __future__ import annotations

import collections

import torch

from yolov9c.engine.train.graph_step import (BUCKETS, WARMUP, CaptureFailed, GraphStep, bucket_for, cudnn_benchmark,
                                             layout_of, max_boxes, unsupported)
from yolov9c.engine.train.guards import free_cuda
from yolov9c.engine.train.memory_plan import MAX_GRAPHS  # the cap (the planner counts it: memory_plan.graphs_held)
from yolov9c.engine.train.step import EagerStep, StepResult, begin_window, forward_backward, split_batch, step_due, train_step


def span(imgs):
    """Elements a flat buffer needs to hold `imgs`' layout as a view from offset 0: its largest offset + 1 (the
    element count for the dense batches prepare_batch and split_batch make)."""
    if imgs.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(imgs.shape, imgs.stride()))


def frequent_sizes(state, cap):
    """The (h, w) image sizes whose micro-batches keep graph slots: with --rect (not --multi-scale) and more
    distinct batch shapes than `cap`, the cap - 2 shapes most batches have (two slots left for the rest: a
    second box bucket, a rarer shape); else empty (first come, first captured). --rect batches come in aspect
    order, the rarest, most elongated shapes first: first come would spend the slots on them and run the common
    shapes eagerly (dev/probes/rect_shapes.py counts both). Test: tests/engine/train/test_graph_shapes.py -k rect."""
    data, cfg = getattr(state, "dataset", None), state.cfg
    shapes = getattr(data, "batch_shapes", None)
    if shapes is None or not getattr(data, "rect", False) or getattr(cfg, "multi_scale", False):
        return frozenset()
    counts = collections.Counter(tuple(int(v) for v in hw) for hw in shapes)
    if len(counts) <= cap:
        return frozenset()
    return frozenset(hw for hw, _ in counts.most_common(max(cap - 2, 1)))


class ShapeGraphStep(GraphStep):
    """GraphStep keyed by shape (the module docstring). Static images: one flat buffer of the largest micro-batch
    seen, each graph reading a view laid out as its batch. Per-graph buffers would hold every layout at once: twelve
    --multi-scale sizes (320² to 960²) of 64 float32 images take 3.8 GiB on average, the largest alone 0.66 GiB. A
    batch larger than the buffer makes a new one and drops the micro-step graphs that read the old one (captured
    again at their next use, into the same pool, with no eager micro-batch); the buffer only grows, so this ends
    after the first few large batches."""

    def __init__(self, state, warmup=WARMUP, buckets=BUCKETS, cap=MAX_GRAPHS):
        super().__init__(state, warmup, buckets)
        self.cap = int(cap)
        self.warm = set()  # layouts an eager micro-batch has run (cuDNN timed their convolutions when benchmarking)
        self.inputs = None  # the flat static image buffer every graph's batch is a view of
        self.micro_batch = state.progress.micro_batch  # the split the held graphs were captured for
        self.capped = False  # the cap's log line is written
        self.frequent = frequent_sizes(state, self.cap)  # sizes whose slots are kept (--rect, many shapes)

    # -- the decision per micro-batch --------------------------------------------------------------------------

    def plan(self, imgs, targets):
        """((layout, bucket), None) to replay (captured first when it is new), or (None, why) to run the
        micro-batch eagerly: "boxes" (more than the largest bucket), "cap" (MAX_GRAPHS graphs held, none of this
        key), "rare" (a size outside self.frequent while the free slots are only enough for the frequent sizes not
        yet held), "warm-up" (the run's first WARMUP micro-batches; with --cudnn-benchmark, a new layout's first)."""
        bucket = bucket_for(max_boxes(targets, imgs.shape[0]), self.buckets)
        if bucket is None:
            return None, "boxes"
        layout = layout_of(imgs)
        key = (layout, bucket)
        if key in self.micro:
            return key, None
        if len(self.micro) >= self.cap:
            return None, "cap"
        if self.frequent and layout[0][-2:] not in self.frequent:
            held = {k[0][0][-2:] for k in self.micro}
            if self.cap - len(self.micro) <= len(self.frequent - held):
                return None, "rare"
        if self.warmup_left > 0 or (self.benchmark and layout not in self.warm):
            return None, "warm-up"
        return key, None

    def __call__(self, state, imgs, targets, ni) -> StepResult:
        if self.eager:
            return train_step(state, imgs, targets, ni)
        micro = state.progress.micro_batch
        if micro != self.micro_batch:  # the guard halved it: the held graphs are of a size that never comes again
            self.micro_batch = micro
            self.release()
        if state.window.ok is None:
            begin_window(state)
        stepped = step_due(state, ni)
        n, loss_items = imgs.shape[0], None
        for mi, mt in split_batch(imgs, targets, micro):  # as step.train_step: image-weighted loss items
            items, finite = self.micro_step(state, mi, mt)
            state.window.ok &= finite
            items = items * (mi.shape[0] / n)
            loss_items = items if loss_items is None else loss_items + items
        ok = None
        if stepped:
            ok = self.optimizer_step(state)
            state.progress.last_opt_step = ni
        return StepResult(loss_items=loss_items, images=n, stepped=stepped, finite=ok)

    def micro_step(self, state, imgs, targets):
        """One micro-batch's forward and scaled backward into the static gradients, replayed or eager (plan):
        (loss items (3,), finite: 0-dim device bool)."""
        if self.eager:  # a capture failed earlier in this batch
            return forward_backward(state, imgs, targets)
        key, why = self.plan(imgs, targets)
        if why == "cap" and not self.capped:
            self.capped = True
            state.log(f"step: {self.cap} CUDA graphs held (the --graph-shapes cap): micro-batches of another shape "
                      f"or box bucket run eagerly from here on")
        try:
            if why is None:
                return self.replay_micro(state, imgs, targets, key)
            return self.eager_micro(state, imgs, targets, why)
        except CaptureFailed as e:  # the failed capture ran nothing: this micro-batch and the rest eagerly
            self._give_up(state, e)
            return forward_backward(state, imgs, targets)

    # -- eager micro-batches and static buffers ------------------------------------------------------------------

    def eager_micro(self, state, imgs, targets, why):
        """GraphStep.eager_micro; a new layout's warm-up after the run's (cuDNN times its convolutions for the graph
        captured next) runs under cudnn.benchmark beside the pool, whose cached blocks are given back after it."""
        if why != "warm-up":
            return super().eager_micro(state, imgs, targets, why)
        self.warm.add(layout_of(imgs))
        if self.warmup_left > 0:  # the run's warm-up (its last micro-batch on the capture stream)
            return super().eager_micro(state, imgs, targets, why)
        if self.grads is not None:
            self.bind_grads()
        with cudnn_benchmark(self.benchmark):  # plan asks for this warm-up only when benchmarking
            out = forward_backward(state, imgs, targets)
        if self.pool is not None:
            free_cuda(self.device)
        return out

    def bucket_of(self, key):
        return key[1]

    def static_images(self, imgs):
        """A view of the input buffer laid out as `imgs` (a new, larger buffer when it holds less: the micro-step
        graphs on the old one are dropped, and with them the old buffer)."""
        need, old = span(imgs), self.inputs
        if old is None or old.numel() < need or old.dtype != imgs.dtype or old.device != imgs.device:
            self.micro.clear()
            self.inputs = old = None  # the old buffer is freed before the new one is made
            self.inputs = torch.empty(need, dtype=imgs.dtype, device=imgs.device)
        return self.inputs.as_strided(imgs.shape, imgs.stride())

    def disable(self, state):
        super().disable(state)
        self.inputs = None


def select_step(state):
    """The step the loop calls (state.step), chosen once: ShapeGraphStep with --graph-shapes (the default), else
    GraphStep where it works (graph_step.unsupported), else step.EagerStep; logs which. Here, above both graph
    steps, so that graph_step imports nothing of this module."""
    why = unsupported(state)
    if why is not None:
        state.log(f"step: eager ({why})")
        return EagerStep()
    if getattr(state.cfg, "graph_shapes", True):
        step = ShapeGraphStep(state)
        state.log(f"step: CUDA graphs keyed by shape (--graph-shapes): one graph per micro-batch shape and box "
                  f"bucket ({'/'.join(map(str, BUCKETS))} per image), captured on first use after {WARMUP} "
                  f"eager micro-batches" + (" and one eager micro-batch of each new shape (cuDNN timing)"
                                            if step.benchmark else "")
                  + f", at most {step.cap} in one memory pool; micro-batches beyond run eagerly")
        if step.frequent:
            shapes = len({tuple(int(v) for v in hw) for hw in state.dataset.batch_shapes})
            state.log(f"step: --rect makes {shapes} batch shapes: graph slots kept for the {len(step.frequent)} "
                      f"most frequent; batches of the others run eagerly")
        return step
    state.log(f"step: CUDA graphs of one shape (--no-graph-shapes; captured after {WARMUP} eager batches; targets "
              f"padded to {'/'.join(map(str, BUCKETS))} boxes per image; batches of another shape or more boxes run "
              f"eagerly)")
    return GraphStep(state)
