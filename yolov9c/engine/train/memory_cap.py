"""The whole-process CUDA memory cap: a card's budget applied to the run, to rehearse a smaller card on a bigger one.

    cap = apply_cap(cfg, device, log)      # set-up, before the model reaches the device: --mem-cap, else --mem-budget
    release_cap(device)                    # the run's end (trainer.train's finally)
    limit = limit_bytes(device)            # the cap in bytes, else the card's total memory
    tight(device)                          # reserved memory above half the limit: give the graphs' pool back to
                                           # validation (trainer._validate, GraphStep.suspend)
    phases = PhasePeaks(device)            # peak allocated / reserved per phase of the run (start-up, epoch, ...)

The cap is torch.cuda.set_per_process_memory_fraction(cap / total): PyTorch's caching allocator refuses to reserve
beyond it (torch.cuda.OutOfMemoryError), exactly as the smaller card would; memory outside the allocator (the
CUDA context, cuDNN and cuBLAS handles) is not counted, so a card of N GB leaves about N − 1 GiB to cap with.
A cap of the card's size or more caps nothing (one log line). On the CPU it is recorded and does nothing: --mem-cap
says so in one warning line (--mem-budget's own warning comes from the memory plan, state.apply_memory_plan).
Test: python -m pytest -q tests/engine/train/test_memory_cap.py
"""

from __future__ import annotations

import torch

from yolov9c.units import GIB


def cap_gib(cfg) -> float | None:
    """The run's cap in GiB: --mem-cap, else a numeric --mem-budget (a budget is a card: the whole process stays
    in it); --mem-budget auto caps nothing (it reads the card, which is its own limit)."""
    cap = cfg.mem_cap if cfg.mem_cap is not None else cfg.mem_budget
    return None if cap is None or cap == "auto" else float(cap)


_CAPS: dict = {}  # device index → the cap in bytes applied to this process (limit_bytes reads it)


def apply_cap(cfg, device, log=print) -> float | None:
    """Cap this process's CUDA allocator on `device` at cap_gib(cfg) GiB. Returns the cap applied in GiB (None:
    no cap: none asked, a CPU run, or a card no larger than the cap)."""
    gib = cap_gib(cfg)
    if gib is None:
        return None
    if device.type != "cuda":
        if cfg.mem_cap is not None:  # as --mem-budget's warning: the option does nothing here, say so
            log(f"memory cap: WARNING: --mem-cap caps GPU memory; this run is on the {device.type}, where it caps "
                f"nothing")
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    cap = int(gib * GIB)
    if cap >= total:
        log(f"memory cap: {gib:.2f} GiB is not below this card's {total / GIB:.2f} GiB: nothing to cap")
        return None
    torch.cuda.set_per_process_memory_fraction(cap / total, index)
    _CAPS[index] = cap
    log(f"memory cap: this process may reserve at most {gib:.2f} GiB of the card's {total / GIB:.2f} GiB "
        f"(a smaller card rehearsed; set_per_process_memory_fraction)")
    return gib


def release_cap(device):
    """The end of a run: the cap apply_cap set on `device` is lifted (a later run in this process, or the API
    user's own work, is not capped by this one)."""
    if device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _CAPS.pop(index, None) is not None:
        torch.cuda.set_per_process_memory_fraction(1.0, index)


def limit_bytes(device) -> int:
    """The bytes this process may reserve on `device`: its cap, else the card's total memory (0 on the CPU)."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _CAPS.get(index) or torch.cuda.get_device_properties(index).total_memory


def tight(device) -> bool:
    """Whether the memory reserved now is above half of what this process may reserve (CUDA only): then the
    CUDA-graph pool is given back before validation, which would otherwise need as much again."""
    if device.type != "cuda":
        return False
    return 2 * torch.cuda.memory_reserved(device) > limit_bytes(device)


class PhasePeaks:
    """Peak allocated and reserved GiB of each phase of the run on `device` (CUDA; empty elsewhere):
    mark(name) closes the phase running since the last mark under `name` (a repeated name keeps its maximum)
    and starts the next one; peaks[name] = (allocated GiB, reserved GiB)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.peaks: dict = {}  # the first phase runs from the process start (nothing to reset before CUDA starts)

    def mark(self, name):
        if not self.cuda:
            return
        a = torch.cuda.max_memory_allocated(self.device) / GIB
        r = torch.cuda.max_memory_reserved(self.device) / GIB
        old = self.peaks.get(name, (0.0, 0.0))
        self.peaks[name] = (max(a, old[0]), max(r, old[1]))
        torch.cuda.reset_peak_memory_stats(self.device)

    def line(self) -> str:
        """'memory peaks (GiB allocated/reserved): start-up 0.31/0.40, train 4.10/5.02, ...' ('' without CUDA)."""
        if not self.peaks:
            return ""
        return "memory peaks (GiB allocated/reserved): " + ", ".join(
            f"{k} {a:.2f}/{r:.2f}" for k, (a, r) in self.peaks.items())
