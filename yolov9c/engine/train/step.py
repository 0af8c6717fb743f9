"""One training iteration: the per-batch step of the epoch loop (trainer.py's train_one_epoch calls state.step).

    imgs = prepare_batch(state, imgs_uint8, rng)          # → device, float / 255, memory format, multi-scale
    result = train_step(state, imgs, targets, ni)         # → StepResult(loss_items, images, stepped)

train_step = forward_backward (forward and loss under autocast (CUDA + --amp); loss × WORLD_SIZE under DDP,
× 4 with --quad; GradScaler-scaled backward; --ckpt's second BatchNorm update undone) then, once `accumulate`
micro-batches have passed since the last optimizer step, optimizer_step (unscale, clip the gradient norm to 10,
optimizer step, scaler update, zero_grad, EMA update; state.last_opt_step = ni).

The seam for what comes next: every piece of state the step reads or changes lives in RunState (model, loss,
optimizer, scaler, EMA, accumulate, last_opt_step, bn_buffers), the step gets one batch and returns what the
loop logs, and the loop calls `state.step`, so
- a CUDA-graph step replaces state.step (or forward_backward inside it) with a replay on static buffers;
- a non-finite guard wraps forward_backward / optimizer_step (check the loss and the unscaled gradients, skip
  the optimizer and EMA update, count skips in the StepResult);
- an out-of-memory guard wraps state.step: free the step's tensors, halve state.batch_size, double
  state.accumulate (same nominal batch), and run forward_backward over the halves of the same batch.
Test: python -m pytest -q tests/test_train_parts.py -k step
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from yolov9c.data.multi_scale import multi_scale

MAX_GRAD_NORM = 10.0  # gradient norm clip before every optimizer step (published)


@dataclass
class StepResult:
    loss_items: torch.Tensor  # (3,) box, cls, dfl loss of this batch (detached)
    images: int  # images in this batch (this rank)
    stepped: bool  # an optimizer step (and EMA update) was taken


def prepare_batch(state, imgs, rng):
    """A loader batch (uint8 B×3×H×W, host) → float/255 on the device in the run's memory format; --multi-scale
    resizes it to a random multiple of the grid drawn from `rng` (a numpy Generator seeded per epoch)."""
    imgs = imgs.to(state.device, non_blocking=True).contiguous(memory_format=state.memory_format).float() / 255
    if state.cfg.multi_scale:
        imgs = multi_scale(imgs, state.imgsz, state.gs, rng)
    return imgs


def forward_backward(state, imgs, targets):
    """Forward, loss and scaled backward of one micro-batch (gradients accumulate); returns the loss items."""
    with torch.autocast(state.device.type, enabled=state.amp):
        pred = state.model(imgs)
        loss, loss_items = state.loss(pred, targets)  # host targets: the loss copies them (c: pinned, no sync)
        if state.world > 1:
            loss = loss * state.world  # DDP averages gradients over ranks; the loss is a per-rank sum
        if state.cfg.quad:
            loss = loss * 4.0
    saved = [b.clone() for b in state.bn_buffers]
    state.scaler.scale(loss.sum()).backward()
    for b, s in zip(state.bn_buffers, saved):  # --ckpt re-ran the forward: undo its second BN update
        b.copy_(s)
    return loss_items.detach()


def optimizer_step(state):
    """Unscale, clip, optimizer step, scaler update, zero the gradients, EMA update."""
    state.scaler.unscale_(state.optimizer)
    torch.nn.utils.clip_grad_norm_(state.model.parameters(), max_norm=MAX_GRAD_NORM)
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.optimizer.zero_grad()
    if state.ema is not None:
        state.ema.update(state.model)


def train_step(state, imgs, targets, ni) -> StepResult:
    """One micro-batch at iteration `ni` (batches since the run started): forward_backward, then an optimizer
    step when `accumulate` micro-batches have passed since the last one."""
    loss_items = forward_backward(state, imgs, targets)
    stepped = ni - state.last_opt_step >= state.accumulate
    if stepped:
        optimizer_step(state)
        state.last_opt_step = ni
    return StepResult(loss_items=loss_items, images=imgs.shape[0], stepped=stepped)
