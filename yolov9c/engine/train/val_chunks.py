"""--val-chunks auto: training-time validation runs its forward in chunks sized to the memory left beside the
CUDA-graph pool, so the graphs are kept; the batch of record stays the loader's (ValConfig.chunk).

    chunks = ValChunks.for_run(state)        # set-up: None unless --val-chunks auto, CUDA, main process
    chunk = chunks.before_pass(state, 128)   # each validation pass: images per forward (None: the whole batch)
    chunks.shrink()                          # the pass ran out of memory: the next one at half the chunk

Before each pass the cached blocks are given back and the memory left is read (the cap or the card, less what
is reserved, at most the card's free memory); the chunk is the largest that fits (memory_phases.beside_pool:
the planner's rule). When fewer than MIN_CHUNK images fit, the graphs' memory is given back
(GraphStep.suspend: the next batch captures them again, with no eager warm-up) and the chunk is sized to what
is left then. One log line when the chunk changes; none while the whole batch fits.
Test: python -m pytest -q tests/engine/train/test_val_chunks_run.py
"""

from __future__ import annotations

import torch

from yolov9c.engine.train import memory_phases as mph
from yolov9c.engine.train.guards import free_cuda
from yolov9c.engine.train.memory_cap import limit_bytes

from yolov9c.units import GIB


def left_gib(device) -> float:
    """GiB this process may still reserve on CUDA `device`: its limit (memory_cap) less what it reserves, at
    most what the card has free (other processes take their share)."""
    free, _ = torch.cuda.mem_get_info(device)
    return min(limit_bytes(device) - torch.cuda.memory_reserved(device), free) / GIB


class ValChunks:
    """The chunk of each training-time validation pass for model cost `vc` (memory_phases.ValCost) at image
    size `img`, fp16 when `half`; `left(device)` → GiB left (left_gib; tests give their own). `cap`: the
    chunk after an out-of-memory pass is at most this; `chunk`: the last one chosen."""

    def __init__(self, vc, img, half, left=left_gib):
        self.vc, self.img, self.half, self.left = vc, img, half, left
        self.cap = None
        self.chunk = None

    @classmethod
    def for_run(cls, state):
        """The run's ValChunks, or None (--val-chunks off, not CUDA, not the main process, or a model whose
        validation cost can be neither looked up nor estimated: logged)."""
        cfg = state.cfg
        if cfg.val_chunks != "auto" or state.device.type != "cuda" or not state.main:
            return None
        resumed = str(state.resumed.ckpt.get("yaml_file") or "") if state.resumed is not None else ""
        name = cfg.cfg or getattr(state.model, "yaml_file", "") or resumed  # a resume builds from the stored dict
        try:
            vc = mph.val_cost_for(name) if name else None
        except ValueError as e:
            state.log(f"--val-chunks auto: {e}; validation runs as with --val-chunks off")
            return None
        if vc is None:
            state.log("--val-chunks auto: the model has no yaml file to estimate its validation memory from; "
                      "validation runs as with --val-chunks off")
            return None
        return cls(vc, state.imgsz, state.amp)

    def before_pass(self, state, batch, model_gib=0.0):
        """Images per forward for the next pass over batches of `batch` (None: the whole batch); `model_gib`:
        a model the pass loads besides the run's (best.pt). Gives the graphs' memory back when it must."""
        free_cuda(state.device)
        left = self.left(state.device)
        k = mph.beside_pool(left, self.vc, batch, self.img, self.half, model_gib)
        where = "beside the CUDA-graph pool" if state.step.name == "cuda-graph" else "on the card"
        if k is None and state.step.suspend(state):
            before, left = left, self.left(state.device)
            if getattr(state.step, "suspends", 1) == 1:  # said once; the trainer's off path says it likewise
                state.log(f"validation: fewer than {min(mph.MIN_CHUNK, batch)} images a forward fit beside the "
                          f"CUDA-graph pool ({before:.2f} GiB left): its memory is given back ({left:.2f} GiB "
                          f"left); the next training batch captures the graphs again")
            where = "on the card"
        if k is None:
            k = mph.chunk_for(left, self.vc, batch, self.img, self.half, model_gib)
        k = min(k, self.cap or k)
        if k < batch and k != self.chunk:
            oom = f"; chunks of {self.chunk} ran out of memory" if self.cap is not None and self.chunk else ""
            state.log(f"validation: the forward in chunks of {k} images per batch of {batch} ({left:.2f} GiB left "
                      f"{where}{oom}; --val-chunks auto)")
        self.chunk = k
        return k if k < batch else None

    def shrink(self) -> bool:
        """After an out-of-memory pass: the next at half the last chunk (True), or False at one image (then the
        validation batch itself is halved: guards.validate_with_backoff)."""
        if self.chunk is None or self.chunk <= 1:
            return False
        self.cap = self.chunk // 2
        return True
