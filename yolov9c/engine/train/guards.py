"""Guards around the training step (not inside the maths): non-finite steps, divergence and CUDA out-of-memory.

    result = state.guard.step(state, imgs, targets, ni)   # StepGuard; calls state.step
    skipped = state.guard.end_epoch()                     # skipped optimizer steps of the epoch (results.csv)
    res = validate_with_backoff(state, run, make_loader)  # OOM in validation -> half the batch, down to 1
- Non-finite steps: the step skips an optimizer step whose loss or grad norm is non-finite (no optimizer, EMA or
  BN-statistics change) and reports StepResult.finite (bool or 0-dim device bool read without a sync). After
  --max-nonfinite N skips in a row (0: never) -> NonFiniteError. AMP skips while the GradScaler scale is above
  AMP_CALIBRATED count in skipped_steps but not toward N (the scaler's calibration, not divergence).
- Divergence: stop_if_diverged at each epoch end, before anything is written: non-finite weights/EMA/BN
  statistics or training losses inf/NaN or > DIVERGED_LOSS -> NonFiniteError (a validation loss alone, or
  --no-divergence-stop: a warning); files keep the last finite epoch; DDP ranks learn it by broadcast.
- OOM in a step: the window's gradients and BN statistics are restored, the micro-batch halved (nominal batch
  unchanged) and the batch re-run; at one image, OutOfMemory. last.pt stores the micro-batch.
Test: python -m pytest -q tests/engine/train/test_guards.py
"""

from __future__ import annotations

from collections import deque

import torch

from yolov9c.engine.train.errors import TrainError
from yolov9c.engine.train.step import end_window
from yolov9c.models.finite import describe, nonfinite_names

DEFAULT_MAX_NONFINITE = 10
AMP_CALIBRATED = 1.0  # a GradScaler skip at a loss scale above this is scale calibration, not a stuck run


class NonFiniteError(TrainError):
    """--max-nonfinite optimizer steps in a row had a non-finite loss or gradient (or the weights are not
    finite at a checkpoint)."""


class OutOfMemory(TrainError):
    """CUDA out of memory at a micro-batch (or validation batch) of one image."""


def nonfinite_causes(state):
    lr0 = state.hyp.get("lr0")
    return (f"likely causes: a learning rate too high (hyp lr0={lr0}: try a smaller lr0 in --hyp), bad data "
            f"(e.g. all-black images or degenerate boxes: run python -m yolov9c check-data --data "
            f"{state.cfg.data})" + (", or fp16 overflow under AMP (try --no-amp)" if state.amp else ""))


class NonFiniteCounter:
    """Counts skipped optimizer steps from StepResult.finite values (bools now, device bools when landed)."""

    def __init__(self, limit, log, loss_scale=None):
        self.limit, self.log = int(limit), log
        self.loss_scale = loss_scale  # () → the GradScaler's current scale under AMP, else None
        self.pending = deque()  # (pinned host bool, CUDA event, epoch, ni), oldest first
        self.epoch_skipped = 0
        self.epoch_calibration = 0  # of those, skips while the AMP loss scale was still coming down
        self.total_skipped = 0
        self.in_a_row = 0
        self.last = None  # (epoch, ni) of the latest skipped step
        self.warned = self.calibration_logged = False  # each WARNING once per run

    def observe(self, finite, epoch, ni, causes):
        if finite is None:
            return
        if isinstance(finite, torch.Tensor) and finite.device.type == "cuda":
            host = torch.empty((), dtype=torch.bool, pin_memory=True)
            host.copy_(finite, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            self.pending.append((host, ev, epoch, ni))
        else:
            self.pending.append((finite, None, epoch, ni))
        self.drain(causes, wait=False)

    def drain(self, causes, wait):
        """Count every landed flag in order (wait: all of them, synchronising on their events)."""
        while self.pending:
            host, ev, epoch, ni = self.pending[0]
            if ev is not None and not wait and not ev.query():
                return
            if ev is not None:
                ev.synchronize()
            self.pending.popleft()
            self._count(bool(host), epoch, ni, causes)

    def _count(self, finite, epoch, ni, causes):
        if finite:
            self.in_a_row = 0
            return
        self.epoch_skipped += 1
        self.total_skipped += 1
        self.last = (epoch, ni)
        scale = self.loss_scale() if self.loss_scale is not None else None
        if scale is not None and scale > AMP_CALIBRATED:
            self.epoch_calibration += 1
            if not self.calibration_logged:
                self.calibration_logged = True
                self.log(f"\nAMP: fp16 gradient overflow at epoch {epoch}, iteration {ni}: optimizer step skipped and "
                         f"the loss scale lowered to {scale:g} (the GradScaler's calibration, usual in the first "
                         f"steps; counted in skipped_steps)")
            return
        self.in_a_row += 1
        if not self.warned:
            self.warned = True
            self.log(f"\nWARNING: non-finite loss or gradients at epoch {epoch}, iteration {ni}: optimizer step "
                     f"skipped (weights, EMA and BatchNorm statistics unchanged); training stops after "
                     f"{self.limit or 'no limit of'} skipped steps in a row (--max-nonfinite)")
        if self.limit and self.in_a_row >= self.limit:
            self.pending.clear()
            raise NonFiniteError(f"{self.in_a_row} optimizer steps in a row had a non-finite loss or gradients "
                                 f"(the last at epoch {epoch}, iteration {ni}); training stopped and no checkpoint "
                                 f"of these steps was written; {causes()}. --max-nonfinite 0 never stops")


class StepGuard:
    """The loop's step: state.step under the out-of-memory back-off and the non-finite count."""

    def __init__(self, state):
        scale = (lambda: float(state.scaler.get_scale())) if state.amp else None
        self.nonfinite = NonFiniteCounter(state.cfg.max_nonfinite, state.log, loss_scale=scale)
        self.causes = lambda: nonfinite_causes(state)
        self.epoch = 0

    def begin_epoch(self, epoch):
        self.epoch = epoch
        self.nonfinite.epoch_skipped = self.nonfinite.epoch_calibration = 0

    def step(self, state, imgs, targets, ni):
        while True:
            try:
                result = state.step(state, imgs, targets, ni)
                break
            except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
                if not is_oom(e):
                    raise
            back_off(state, imgs.shape[0], ni)  # here the exception, the step's frames and tensors are released
        self.nonfinite.observe(result.finite, self.epoch, ni, self.causes)
        return result

    def end_epoch(self):
        """Count every outstanding flag; returns the epoch's skipped optimizer steps."""
        self.nonfinite.drain(self.causes, wait=True)
        return self.nonfinite.epoch_skipped

    def summary(self, epoch):
        """The epoch's line about skipped steps (after end_epoch; None when none was skipped)."""
        n, cal = self.nonfinite.epoch_skipped, self.nonfinite.epoch_calibration
        if not n:
            return None
        if n == cal:
            return f"epoch {epoch}: {n} optimizer steps skipped while the AMP loss scale was calibrated"
        return (f"WARNING: epoch {epoch}: {n} optimizer steps skipped (non-finite loss or gradients"
                + (f"; {cal} of them while the AMP loss scale was calibrated)" if cal else ")"))


def is_oom(e):
    """torch.cuda.OutOfMemoryError (the caching allocator), or a library's failed workspace allocation."""
    text = str(e)
    return isinstance(e, torch.cuda.OutOfMemoryError) or "CUDA out of memory" in text or "ALLOC_FAILED" in text


def free_cuda(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def back_off(state, batch, ni):
    """After an OOM in the step at iteration ni on a loader batch of `batch` images: drop the window, halve the
    micro-batch (OutOfMemory at one image)."""
    progress = state.progress
    current = min(progress.micro_batch or batch, batch)
    state.optimizer.zero_grad(set_to_none=True)
    if state.window.ok is not None:
        end_window(state, apply=False)
    dropped = ni - progress.last_opt_step - 1  # earlier batches of the window whose gradients are lost
    progress.last_opt_step = ni - 1  # a new window starts at this batch
    free_cuda(state.device)
    if current <= 1:
        raise OutOfMemory("CUDA out of memory in a training step at a micro-batch of 1 image; try a smaller --img, "
                          "--backend c (about a third of the activation memory), or --ckpt with --backend torch")
    progress.micro_batch = current // 2
    chunks = -(-batch // progress.micro_batch)
    state.log(f"\nWARNING: CUDA out of memory at iteration {ni} with a micro-batch of {current} images: retrying "
              f"the same batch as {chunks} micro-batches of {progress.micro_batch} (accumulation x{chunks}; nominal "
              f"batch {state.batching.nominal} images per optimizer step unchanged; BatchNorm now normalises over "
              f"{progress.micro_batch} images, not {batch}, which can change accuracy)"
              + (f"; the gradients of the {dropped} earlier batches of this accumulation window were dropped"
                 if dropped > 0 else ""))


def validate_with_backoff(state, run, make_loader, shrink=None):
    """run(loader) → a validation result; on a CUDA OOM the pass is repeated: smaller chunks first when
    shrink() says it made them (val_chunks.ValChunks.shrink; same loader), else with half the batch (a new
    validation loader from make_loader(batch), kept for later epochs), down to one image (then OutOfMemory).
    One log line says which batch did not fit and which one validated."""
    tried = state.val_loader.batch_size
    while True:
        try:
            res = run(state.val_loader)
            break
        except RuntimeError as e:
            if not is_oom(e):
                raise
        free_cuda(state.device)
        if shrink is not None and shrink():
            continue
        batch = state.val_loader.batch_size
        if batch <= 1:
            raise OutOfMemory("CUDA out of memory in validation at a batch of 1 image; try a smaller --img, "
                              "--backend c, or --noval (only the final epoch is validated)")
        state.val_loader = make_loader(batch // 2)
    if state.val_loader.batch_size != tried:
        state.log(f"\nWARNING: validation at a batch of {tried} images ran out of GPU memory: validated with "
                  f"{state.val_loader.batch_size} (kept for the rest of the run; same results, more passes)")
    return res


def checkpoint_is_finite(state):
    """(ok, what): whether the model's and the EMA's floating-point state (weights and BatchNorm statistics) is
    all finite; `what` names the first tensor that is not. One host read."""
    for what, m in (("model", state.model), ("EMA", state.ema.ema if state.ema is not None else None)):
        if m is None:
            continue
        bad = nonfinite_names(m.state_dict())
        if bad:
            return False, f"{what} {describe(bad)}"
    return True, ""


# A mean training loss term beyond this, or inf/NaN, means the run diverged (a converging detector's are below
# ~20); a validation loss beyond it only warns (the EMA's BatchNorm statistics can lag: docs/train.md FAQ).
DIVERGED_LOSS = 1e6
LOSSES = ("box_loss", "cls_loss", "dfl_loss")


def _beyond(losses):
    return [f"{k} {float(v):.3g}" for k, v in losses.items() if not abs(float(v)) <= DIVERGED_LOSS]


def divergence(train_losses, bad_weights="", val=None):
    """(stop, warning) at an epoch's end, each one line or None. stop says what diverged: the weights (model or
    EMA, BatchNorm statistics included; `bad_weights` names the first non-finite tensor, "" when all are
    finite) or the training losses (`train_losses`: {name: the epoch's mean over its batches with a finite
    loss}, None when no batch had one) non-finite or beyond DIVERGED_LOSS. warning: only when nothing diverged,
    validation losses (`val`, a validate() result, None when not validated) non-finite or beyond DIVERGED_LOSS
    and why that alone does not stop the run."""
    if bad_weights:
        return f"the weights are not finite ({bad_weights})", None
    if train_losses is None:
        return "no training batch of the epoch had a finite loss", None
    bad = _beyond(train_losses)
    if bad:
        return f"training losses not finite or beyond {DIVERGED_LOSS:g} ({', '.join(bad)})", None
    bad = _beyond({k: val[k] for k in LOSSES if k in val}) if val is not None else []
    if not bad:
        return None, None
    normal = ", ".join(f"{k} {float(v):.3g}" for k, v in train_losses.items())
    return None, (f"validation losses not finite or beyond {DIVERGED_LOSS:g} ({', '.join(bad)}) with finite "
                  f"weights and training losses ({normal}): not a divergence, training goes on; validation runs "
                  f"the EMA model on BatchNorm running statistics, which lag fast-moving weights (docs/train.md, "
                  f"FAQ: val/cls_loss far above train/cls_loss)")


DIVERGED = 2  # end_epoch's stop flag value broadcast by rank 0 when the run diverged


def stop_if_diverged(state, epoch, train_losses, val=None):
    """Main process, end of `epoch`, before anything of it is written: divergence() of the epoch's training
    losses (see there), the model's and EMA's weights and `val`. A warning, or a divergence under
    --no-divergence-stop, is one logged line; a divergence raises NonFiniteError (one `error:` line: the epoch,
    what diverged, the likely causes), and last.pt, best.pt and results.csv keep the previous epoch. Under DDP
    rank 0 first sends DIVERGED and the message to the other ranks, which wait in end_epoch's stop broadcast
    and raise the same error (raise_diverged)."""
    if state.folder is None:  # an --evolve generation: no checkpoints to protect; its fitness judges it
        return
    ok, where = checkpoint_is_finite(state)
    why, warning = divergence(train_losses, "" if ok else where, val)
    if warning is not None:
        state.log(f"WARNING: epoch {epoch}: {warning}; if it persists while mAP stays near 0, try a smaller lr0 "
                  f"(hyp lr0={state.hyp.get('lr0')})")
    if why is None:
        return
    if not state.cfg.divergence_stop:
        state.log(f"WARNING: epoch {epoch}: training diverged: {why}; training goes on (--no-divergence-stop)")
        return
    kept = ("last.pt, best.pt and results.csv were not written and keep the last finite epoch"
            if (state.wdir / "last.pt").exists() else "last.pt and best.pt were not written")
    msg = f"epoch {epoch}: training diverged: {why}; stopped before saving epoch {epoch}: {kept}; " \
          f"{nonfinite_causes(state)}; --no-divergence-stop trains on regardless"
    if state.world > 1:
        import torch.distributed as dist
        dist.broadcast(torch.tensor([DIVERGED], device=state.device), 0)
        dist.broadcast_object_list([msg], 0)
    raise NonFiniteError(msg)


def raise_diverged(state, flag):
    """Other ranks, after end_epoch's stop broadcast: rank 0 found the run diverged (flag DIVERGED): raise its
    error. Returns whether to stop otherwise."""
    if int(flag) == DIVERGED:
        import torch.distributed as dist
        msg = [None]
        dist.broadcast_object_list(msg, 0)
        raise NonFiniteError(msg[0])
    return bool(flag)


# What gloo / NCCL / the rendezvous store say when another process of the run is gone.
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted",
              "remote process exited", "collective operation timeout", "Socket Timeout")


def raise_if_peer_lost(state, e):
    """Under DDP, a collective that failed because another process of the run died (a node lost, a rank killed):
    raise TrainError, one `error:` line naming this rank, the cause and how to go on. Other errors return (the
    caller re-raises them). A peer that hangs instead of dying is waited for up to the process group's timeout."""
    import torch.distributed as dist
    if state.world <= 1:
        return
    text = str(e)
    network = tuple(getattr(dist, n) for n in ("DistNetworkError", "DistStoreError") if hasattr(dist, n))
    if not (isinstance(e, network) or any(s in text for s in _PEER_LOST)):
        return
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)
    first = first.split(". ")[0].split("] ", 1)[-1]  # gloo: "[…/pair.cc:553] Connection closed by peer [ip]:port. …"
    last = state.wdir / "last.pt" if state.wdir is not None else None
    go_on = (f"restart every node's command with --resume {last}" if state.main and last is not None and
             last.is_file() else "restart every node's command (with --resume RUN/weights/last.pt when rank 0 "
                                 "saved an epoch)")
    raise TrainError(f"rank {state.rank}: another process of this DDP run stopped ({first[:160]}); this process "
                     f"stopped too; {go_on}") from None
