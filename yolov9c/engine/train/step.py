"""One training iteration and the Step protocol: state.step(state, imgs, targets, ni) → StepResult.

    imgs = prepare_batch(state, imgs_uint8, rng)          # → device, memory format, float / 255, multi-scale
    result = state.step(state, imgs, targets, ni)         # EagerStep here, or graph_step.GraphStep (CUDA graphs)

A Step (chosen once at set-up: graph_shapes.select_step) has __call__ (one loader batch), end_epoch(state) (host
copies of device-side counters, before checkpoints), suspend(state) (its device memory back until the next batch:
validation on a tight card) and release() (its device resources, at the run's end).
EagerStep splits the batch into micro-batches of state.progress.micro_batch images and runs forward_backward on
each (autocast; loss × WORLD_SIZE under DDP, × 4 with --quad; scaled backward; --ckpt's second BN update undone).
When step_due(state, ni) (the one optimizer-step rule: batching.Batching.step_due), optimizer_step: unscale,
clip to 10, then — only when the window's losses and the gradient norm are finite — optimizer step and EMA
update; a skipped window puts the BN statistics back. Either way: scaler update, zero_grad, last_opt_step = ni.
Host reads: forward_backward reads none (tests/ops/test_c_syncs.py); optimizer_step reads state.window.ok once.
Test: python -m pytest -q tests/engine/train/test_train_parts.py -k step tests/engine/train/test_guards.py
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from yolov9c.data.multi_scale import multi_scale
from yolov9c.engine.train.layer_ckpt import bn_update_once

MAX_GRAD_NORM = 10.0  # gradient norm clip before every optimizer step (published)


@dataclass
class StepResult:
    loss_items: torch.Tensor  # (3,) box, cls, dfl loss of this batch (detached; image-weighted over micro-batches)
    images: int  # images in this batch (this rank)
    stepped: bool  # this batch closed an accumulation window (an optimizer step was due)
    finite: Any = None  # when stepped: the window was finite and applied (bool, or a 0-dim device bool); else None


@dataclass
class Window:
    """The open accumulation window (not checkpointed: an epoch starts with none open)."""
    ok: Any = None  # 0-dim device bool: every loss of the window was finite (None: no window open)
    bn: list | None = None  # the BatchNorm statistics at the window's start (a skipped window puts them back)


class Step(Protocol):
    """What the trainer calls; EagerStep or graph_step.GraphStep, chosen once at set-up."""
    name: str  # "eager" or "cuda-graph" (logs, tests)

    def __call__(self, state, imgs, targets, ni) -> StepResult: ...

    def end_epoch(self, state) -> None: ...

    def suspend(self, state) -> bool: ...  # give device memory back until the next batch (True: some was held)

    def release(self) -> None: ...


def step_due(state, ni) -> bool:
    """The optimizer-step rule of both steps: `accumulate` loader batches since the last optimizer step."""
    return state.batching.step_due(ni, state.progress.last_opt_step, state.nw)


def prepare_batch(state, imgs, rng):
    """A loader batch (uint8 B×3×H×W, host) → the device in the run's memory format; float/255 unless the model
    reads the uint8 batch itself (state.uint8_input, decided at set-up: the c backend without --multi-scale,
    so the float image is never stored); --multi-scale resizes the float batch to a random multiple of the grid
    drawn from `rng` (a numpy Generator seeded per epoch)."""
    imgs = imgs.to(state.device, non_blocking=True).contiguous(memory_format=state.memory_format)
    if not state.uint8_input:
        imgs = imgs.float() / 255
    if state.cfg.multi_scale:
        imgs = multi_scale(imgs, state.imgsz, state.gs, rng)
    return imgs


def split_batch(imgs, targets, micro):
    """(imgs (B,3,H,W), targets (N,6) host [image, cls, x, y, w, h]) → micro-batches of at most `micro` images
    (None or ≥ B: the batch itself), each with its targets re-indexed from 0. No device read: the targets are
    host tensors."""
    b = imgs.shape[0]
    if micro is None or micro >= b:
        return [(imgs, targets)]
    out = []
    for lo in range(0, b, micro):
        hi = min(lo + micro, b)
        sel = (targets[:, 0] >= lo) & (targets[:, 0] < hi)
        t = targets[sel].clone()
        t[:, 0] -= lo
        out.append((imgs[lo:hi], t))
    return out


def forward_backward(state, imgs, targets):
    """Forward, loss and scaled backward of one micro-batch (gradients accumulate). Returns (loss_items (3,)
    detached, finite: 0-dim bool tensor on the device, the loss is finite)."""
    with torch.autocast(state.device.type, enabled=state.amp):
        pred = state.model(imgs)
        loss, loss_items = state.loss(pred, targets)  # host targets: the loss copies them (c: pinned, no sync)
        if state.world > 1:
            loss = loss * state.world  # DDP averages gradients over ranks; the loss is a per-rank sum
        if state.cfg.quad:
            loss = loss * 4.0
    loss = loss.sum()
    with bn_update_once(state.bn_buffers):  # --ckpt re-runs the forward in backward: its BN update undone
        state.scaler.scale(loss).backward()
    return loss_items.detach(), torch.isfinite(loss.detach())


def begin_window(state):
    """The first micro-batch after an optimizer step: keep the BatchNorm statistics (a skipped window puts them
    back) and start the window's finiteness flag."""
    w = state.window
    if w.bn is None:
        w.bn = [b.clone() for b in state.bn_stats]
    elif state.bn_stats:  # torch._foreach_copy_ refuses empty lists (a model without BatchNorm)
        torch._foreach_copy_(w.bn, state.bn_stats)
    w.ok = torch.ones((), dtype=torch.bool, device=state.device)


def end_window(state, apply):
    """Close the accumulation window: undo its BatchNorm updates when it is not applied; drop the gradients."""
    if not apply and state.bn_stats:
        torch._foreach_copy_(state.bn_stats, state.window.bn)
    state.window.ok = None
    state.optimizer.zero_grad()


def optimizer_step(state) -> bool:
    """Unscale, clip; when the window's losses and the gradient norm are finite: optimizer step and EMA update;
    scaler update, zero the gradients. Returns whether the step was applied (the one host read of the step)."""
    state.scaler.unscale_(state.optimizer)
    params = state.params if state.params is not None else state.model.parameters()
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm=MAX_GRAD_NORM)
    ok = bool(torch.isfinite(norm) & state.window.ok)  # finite ⇒ the scaler's found-inf is 0: no step of its own
    if ok:
        state.optimizer.step()
    state.scaler.update()  # under AMP: non-finite gradients lower the scale (unscale_ recorded them)
    end_window(state, ok)
    if ok and state.ema is not None:
        state.ema.update(state.model)
    return ok


def train_step(state, imgs, targets, ni) -> StepResult:
    """One loader batch at iteration `ni` (batches since the run started): forward_backward over its
    micro-batches, then an optimizer step when step_due."""
    if state.window.ok is None:
        begin_window(state)
    n = imgs.shape[0]
    loss_items = None
    for mi, mt in split_batch(imgs, targets, state.progress.micro_batch):
        items, finite = forward_backward(state, mi, mt)
        state.window.ok &= finite
        items = items * (mi.shape[0] / n)
        loss_items = items if loss_items is None else loss_items + items
    stepped = step_due(state, ni)
    finite = None
    if stepped:
        finite = optimizer_step(state)
        state.progress.last_opt_step = ni
    return StepResult(loss_items=loss_items, images=n, stepped=stepped, finite=finite)


class EagerStep:
    """The Step of train_step: nothing kept on the device between batches, nothing to release."""
    name = "eager"
    suspends = 0

    def __call__(self, state, imgs, targets, ni) -> StepResult:
        return train_step(state, imgs, targets, ni)

    def end_epoch(self, state) -> None:
        pass

    def suspend(self, state) -> bool:
        return False

    def release(self) -> None:
        pass
