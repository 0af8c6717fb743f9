"""The batch arithmetic of a run, in one place: --batch-size, --accumulate, --mem-budget and WORLD_SIZE.

    error = batch_error(batch_size, world, mem_budget)     # the CLI (before DDP starts) and set-up both ask this
    b = plan_batching(batch_size, accumulate, world)       # set-up, once: a frozen Batching
    b.accumulate_at(ni, nw)                                # micro-batches per optimizer step at iteration ni
    b.step_due(ni, last_opt_step, nw)                      # THE optimizer-step rule (both step implementations)

batch_size: images per iteration over all ranks (AutoBatch already resolved); per_rank = batch_size / world.
nominal: images per optimizer step (NBS = 64 unless --accumulate N fixes batch_size × N; a resume keeps the
run's nominal batch). Without --accumulate the count ramps from 1 to round(nominal / batch_size) over the
warm-up iterations (schedule.warmup_accumulate), as published. The micro-batch (images per forward/backward,
--mem-budget or the out-of-memory back-off) splits a loader batch and never changes these numbers.
Test: python -m pytest -q tests/engine/train/test_train_parts.py -k batching tests/engine/train/test_train_wiring.py
"""

from __future__ import annotations

from dataclasses import dataclass

from yolov9c.engine.train.schedule import warmup_accumulate

NBS = 64  # nominal batch size: gradients of ~64 images per optimizer step


def batch_error(batch_size, world=1, mem_budget=None, cuda=False) -> str | None:
    """Why --batch-size cannot run with `world` processes and --mem-budget (None when it can). cuda: the
    processes train on GPUs (one each), else on the CPU: the message counts GPUs or processes."""
    if batch_size == -1 and mem_budget is not None:
        return "--mem-budget and --batch-size -1 (AutoBatch) both choose the batch: give one of them"
    if batch_size == -1 and world > 1:
        return (f"--batch-size -1 (AutoBatch) runs in one process only (as published), not in {world} DDP "
                f"processes: give a batch size")
    if batch_size > 0 and batch_size % world:
        return (f"--batch-size {batch_size} must be a multiple of WORLD_SIZE {world} (the number of "
                f"{'GPUs' if cuda else 'processes'}): each one trains on batch-size / {world} images")
    return None


@dataclass(frozen=True)
class Batching:
    batch_size: int  # images per iteration over all ranks
    world: int  # DDP processes
    nominal: int  # images per optimizer step
    fixed_accumulate: int | None  # --accumulate N (or the resumed run's), else None: the warm-up ramp

    @property
    def per_rank(self) -> int:
        return self.batch_size // self.world

    @property
    def accumulate(self) -> int:
        """Micro-batches per optimizer step after the warm-up."""
        return self.fixed_accumulate or max(round(self.nominal / self.batch_size), 1)

    def accumulate_at(self, ni, nw) -> int:
        """Micro-batches per optimizer step at iteration ni (nw: warm-up iterations)."""
        if self.fixed_accumulate or ni > nw:
            return self.accumulate
        return warmup_accumulate(ni, nw, self.nominal, self.batch_size)

    def step_due(self, ni, last_opt_step, nw) -> bool:
        """Whether iteration ni closes the accumulation window opened after the step at last_opt_step."""
        return ni - last_opt_step >= self.accumulate_at(ni, nw)


def plan_batching(batch_size, accumulate, world=1, resumed_nominal=None, keep_nominal=False) -> Batching:
    """The run's Batching. keep_nominal (a resume without --accumulate that stored its nominal batch): the
    run's nominal batch stays, and a fixed accumulation (when the run had one) is re-derived for the new
    batch size; else --accumulate N fixes N (nominal batch_size × N), or None ramps to NBS."""
    if keep_nominal and resumed_nominal:
        nominal = int(resumed_nominal)
        fixed = max(round(nominal / batch_size), 1) if accumulate else None
    else:
        fixed = accumulate
        nominal = batch_size * accumulate if accumulate else NBS
    return Batching(batch_size=batch_size, world=world, nominal=nominal, fixed_accumulate=fixed)
