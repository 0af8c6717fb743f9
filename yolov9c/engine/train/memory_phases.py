"""The whole run's GPU memory by phase (a model, calibrated on measured runs), and the validation chunk that fits.

    vc = val_cost_for("yolov9-s")                       # ValCost: forward GiB per 640² image, parameters
    k = chunk_for(1.7, vc, batch=128)                   # images per validation forward in 1.7 GiB, in [1, 128]
    run = phases(cost, vc, batch=64, val_batch=128, limit_gib=7.0, chunks="auto")   # RunMemory
    run.peaks["validation"]                             # (allocated GiB, reserved GiB); run.whole_gib: their max

Phases: train (the step; under CUDA graphs its memory is the capture pool), validation (at the batch of record,
its forward whole or in chunks, beside the pool or with the pool given back), saving and the final validation
of best.pt. The model and its assumptions: phases(); its calibration: VAL_CALIBRATION and the constants below,
checked against the measured phase peaks in tests/engine/train/test_memory_phases.py. The trainer sizes its
validation chunks with chunk_for and fits (trainer._validate), so plan and run follow one rule. No torch import
for a model in the tables (python -m yolov9c memory answers from them).
Test: python -m pytest -q tests/engine/train/test_memory_phases.py
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from yolov9c.engine.train import memory_plan as mp

from yolov9c.units import GIB
REF_IMG = mp.REF_IMG
# What a run holds on the device between steps, besides the step's own memory: float32 weights, gradients, the
# optimizer's momentum and the EMA copy (16 bytes a parameter), the graphs' static uint8 image batch, and one
# cuBLAS workspace for each of the two streams (32 MiB each on Hopper). Checked against the saving phase of the
# measured yolov9-s run (0.29 GiB allocated; this gives 0.28).
HELD_BYTES_PER_PARAM = 16
WORKSPACE_GIB = 2 * 32 / 1024
# Reserved / allocated of the training epoch (measured 1.07-1.11 for yolov9-s/c/e): the allocator's rounding and
# cached blocks. Applied to every phase's own allocations, and to the chunk's headroom.
RESERVED_SLACK = 1.09
# What validation keeps for its whole batch of record whatever the chunk, per 640² image: the uint8 images, the
# main head's predictions (4 + nc) · A and both heads' raw maps 2 · (4 · 16 + nc) · A in fp16, A = 8400 anchors,
# nc = 80 (fewer classes or one head keep less: an upper bound).
VAL_OUT_GIB = (3 * REF_IMG ** 2 + 2 * 8400 * ((4 + 80) + 2 * (4 * 16 + 80))) / GIB
# A chunk is sized to this share of the memory left, beyond RESERVED_SLACK: an estimate that falls short costs a
# whole validation pass again (the out-of-memory retry), a chunk a few images smaller costs next to nothing.
HEADROOM = 0.9
# Below this many images a forward, the graphs' pool is given back instead (assumed: smaller forwards use the
# GPU poorly, while a capture costs one batch's time); a batch of record smaller than this is not chunked.
MIN_CHUNK = 8
# Measured validation passes (fp16, 640², one forward over the batch of record, H100 runs of the c backend at
# batch 64): model -> (parameters of the training model, validation batch, peak allocated GiB of the phase).
# The forward's GiB per image is what remains of that peak after the held memory, the fp16 copy the validator
# makes and VAL_OUT_GIB per image (ValCost.from_calibration).
VAL_CALIBRATION = {
    "yolov9-s": (9_804_512, 128, 4.07),
    "yolov9-c": (51_182_208, 128, 13.78),
    "yolov9-e": (69_529_664, 128, 36.7),
}


@dataclass(frozen=True)
class ValCost:
    """A model's validation forward: fwd_gib per 640² image in fp16 (the activations alive at the forward's
    peak; proportional to the images of one forward), and its training model's parameter count."""

    model: str
    fwd_gib: float
    params: int
    source: str = "table"

    @classmethod
    def from_calibration(cls, model, params, val_batch, alloc_gib):
        """The ValCost that makes phases() give `alloc_gib` for one forward over `val_batch` 640² images."""
        rest = alloc_gib - held_gib(params) - copy_gib(params)
        return cls(model, rest / val_batch - VAL_OUT_GIB, params)


def lookup(cfg):
    """The calibrated ValCost of model `cfg` (a name or yaml path), else None."""
    got = VAL_CALIBRATION.get(mp._stem(cfg))
    return None if got is None else ValCost.from_calibration(mp._stem(cfg), *got)


def val_cost_for(cfg, ref=None):
    """lookup(cfg), else an estimate: a calibrated model's forward (`ref`, default the nearest size:
    mp._SIZE_REF) scaled by the two models' eval_counts (imports torch and builds them; with `ref` given, also
    for a calibrated `cfg`). ValueError when `cfg` cannot be built."""
    got = lookup(cfg) if ref is None else None
    if got is not None:
        return got
    stem = mp._stem(cfg)
    letter = stem.rsplit("-", 1)[-1][:1] if "-" in stem else ""
    ref = ref or mp._SIZE_REF.get(letter, "yolov9-s")
    try:
        params, live = eval_counts(cfg)
    except (FileNotFoundError, KeyError, TypeError) as e:
        raise ValueError(f"{cfg}: cannot build the model to estimate its memory ({e})") from None
    return ValCost(stem, lookup(ref).fwd_gib * live / eval_counts(ref)[1], params,
                   source=f"estimate (scaled from calibrated {ref} by the eval forward's live tensors)")


def held_gib(params, batch=64, img=REF_IMG):
    """GiB a run holds between steps (HELD_BYTES_PER_PARAM, the static image batch, WORKSPACE_GIB)."""
    return (HELD_BYTES_PER_PARAM * params + 3 * batch * img * img) / GIB + WORKSPACE_GIB


def copy_gib(params, half=True):
    """The fp16 copy of the float32 model the validator runs (none in fp32)."""
    return 2 * params / GIB if half else 0.0


def val_need_gib(vc, val_batch, chunk, img=REF_IMG, half=True, model_gib=0.0):
    """GiB a validation pass allocates beyond what the run holds: `model_gib` (a model it loads), the fp16
    copy, VAL_OUT_GIB for each image of the batch of record and vc.fwd_gib for each image of one forward of
    `chunk`; per image ∝ the pixels, doubled in fp32."""
    per = (img / REF_IMG) ** 2 * (1 if half else 2)
    return model_gib + copy_gib(vc.params, half) + per * (VAL_OUT_GIB * val_batch + vc.fwd_gib * chunk)


def fits(left_gib, vc, val_batch, chunk, img=REF_IMG, half=True, model_gib=0.0):
    """Whether the pass with `chunk` images a forward, times RESERVED_SLACK, fits HEADROOM of `left_gib`."""
    return RESERVED_SLACK * val_need_gib(vc, val_batch, chunk, img, half, model_gib) <= HEADROOM * left_gib


def chunk_for(left_gib, vc, batch, img=REF_IMG, half=True, model_gib=0.0):
    """Images per validation forward for a batch of record of `batch` in `left_gib` GiB: the largest chunk
    that fits (fits), at most `batch`; 1 when none fits (fits() says whether it does). Non-decreasing in
    left_gib."""
    per = (img / REF_IMG) ** 2 * (1 if half else 2) * vc.fwd_gib
    fixed = val_need_gib(vc, batch, 0, img, half, model_gib)
    room = (HEADROOM * left_gib / RESERVED_SLACK - fixed) / per if per > 0 else math.inf
    k = batch if room >= batch else math.floor(room)  # no limit (inf): the whole batch
    k = min(max(k, 1), batch)
    while k > 1 and not fits(left_gib, vc, batch, k, img, half, model_gib):  # floating-point edge of the floor
        k -= 1
    return k


@dataclass
class RunMemory:
    """phases()'s answer: peaks[phase] = (allocated GiB, reserved GiB), each phase's own, for "train",
    "validation", "saving", "final validation"; logged: the same as the run's phase-peak line shows them (a
    phase's reserved peak starts from what the phase before left reserved); pool_gib: the capture pool
    (reserved beside the held memory); how validation runs (val_batch after any out-of-memory halving, chunk,
    graphs_kept; final_val_batch: the final validation's batch after any halving); whole_gib: the largest
    reserved figure; card_gib: with the CUDA context."""

    peaks: dict = field(default_factory=dict)
    logged: dict = field(default_factory=dict)
    pool_gib: float = 0.0
    val_batch: int = 0
    chunk: int = 0
    graphs_kept: bool = True
    final_val_batch: int = 0
    whole_gib: float = 0.0
    card_gib: float = 0.0


def fits_whole_run(cost, vc, batch, val_batch, img=REF_IMG, chunks="off", graphs=True, cards=None, graph_count=1):
    """{card name: True/False} whether the whole run (phases under the card as its limit, with `graph_count` graphs
    keyed by shape; memory_plan.CARDS by default: the card less its CUDA context) stays within the card with
    validation at its batch of record, the final validation included (a halved validation batch or a step above the
    card: False)."""
    out = {}
    for name, gib in (cards or mp.CARDS).items():
        run = phases(cost, vc, batch, val_batch, img=img, limit_gib=gib, chunks=chunks, graphs=graphs,
                     graph_count=graph_count)
        out[name] = run.whole_gib <= gib and run.val_batch == val_batch and run.final_val_batch == val_batch
    return out


def phases(cost, vc, batch, val_batch, img=REF_IMG, limit_gib=None, chunks="off", half=True, graphs=True,
           graph_count=1):
    """The run's phases under `limit_gib` (a cap or card; None: none) as the trainer runs them. train: the step
    (cost: memory_plan.Cost; allocated = predict with `graph_count` graphs keyed by shape, reserved ×
    RESERVED_SLACK); with `graphs` (the CUDA-graph step; a micro-batch that splits the batch only with
    --graph-shapes) the pool is what it reserves beyond the held memory, else
    the eager step's blocks stay cached for validation to reuse. Validation, chunks "off": one forward per
    batch, the pool given back when over half the limit is reserved (memory_cap.tight); "auto": the largest
    chunk beside the pool (its cache given back after), the pool given back only when fewer than MIN_CHUNK
    images fit; an int: that chunk beside the pool. A pass that does not fit halves the batch (the
    out-of-memory retry), its failed try filling the limit. Saving: the held memory (checkpoints are copied
    to the host). Final validation: as validation, with best.pt (4 B a parameter) loaded."""
    limit = math.inf if limit_gib is None else float(limit_gib)
    held = held_gib(vc.params, batch, img)
    # a tiny step's fitted line can fall below what is held
    train_a = max(mp.predict(cost, batch, img, graph_count), held)
    train_r = train_a * RESERVED_SLACK
    run = RunMemory(pool_gib=max(train_r - held, 0.0) if graphs else 0.0)
    run.peaks["train"] = (train_a, train_r)
    start = held + run.pool_gib
    cached = 0.0 if graphs else train_r  # the eager step's cached blocks: reused, not added
    run.peaks["validation"] = _validation(run, vc, val_batch, img, limit, chunks, half, held, start, 0.0, cached)
    base = held + run.pool_gib if run.graphs_kept else held  # what validation leaves reserved, cache given back
    run.peaks["saving"] = (held, base)
    final = RunMemory()
    run.peaks["final validation"] = _validation(final, vc, run.val_batch, img, limit, chunks, half, held, base,
                                                4 * vc.params / GIB)
    run.final_val_batch = final.val_batch
    run.whole_gib = max(r for _, r in run.peaks.values())
    run.card_gib = run.whole_gib + mp.CONTEXT_GIB
    left = base if chunks == "auto" else run.peaks["validation"][1]  # "off" keeps validation's cache
    for name, (a, r) in run.peaks.items():
        run.logged[name] = (a, max(r, {"train": r, "validation": train_r}.get(name, left)))
    return run


def beside_pool(left_gib, vc, val_batch, img=REF_IMG, half=True, model_gib=0.0):
    """The chunk for validating beside the graphs' pool in `left_gib`: chunk_for's, when it fits and holds at
    least min(MIN_CHUNK, val_batch) images; else None (the pool is to be given back)."""
    k = chunk_for(left_gib, vc, val_batch, img, half, model_gib)
    ok = fits(left_gib, vc, val_batch, k, img, half, model_gib) and k >= min(MIN_CHUNK, val_batch)
    return k if ok else None


def _validation(run, vc, val_batch, img, limit, chunks, half, held, base, model_gib, cached=0.0):
    """One validation phase's (allocated, reserved) from `base` GiB reserved before it (`cached` GiB more of
    reusable blocks); sets run's val_batch, chunk and graphs_kept."""
    pooled = base > held
    if chunks == "auto":
        k = beside_pool(limit - base, vc, val_batch, img, half, model_gib) if pooled else None
        kept = k is not None
    else:
        kept = pooled and (isinstance(chunks, int) or 2 * base <= limit)  # "off": memory_cap.tight's rule
    floor = base if kept else held

    def chunk(v):
        if chunks == "auto":
            return chunk_for(limit - floor, vc, v, img, half, model_gib)
        return min(chunks, v) if isinstance(chunks, int) else v

    k = chunk(val_batch) if not (chunks == "auto" and kept) else k
    failed = False
    while floor + val_need_gib(vc, val_batch, k, img, half, model_gib) > limit and val_batch > 1:
        val_batch, failed = val_batch // 2, True  # the out-of-memory retry (guards.validate_with_backoff)
        k = min(k, chunk(val_batch))
    need = val_need_gib(vc, val_batch, k, img, half, model_gib)
    run.val_batch, run.chunk, run.graphs_kept = val_batch, k, kept
    reserved = limit if failed else min(limit, max(cached, floor + RESERVED_SLACK * need))
    return held + need, reserved


@functools.lru_cache(maxsize=None)
def eval_counts(cfg, img=mp.COUNT_IMG):
    """(parameters, peak bytes of the tensors alive at once during one eval-mode, no-grad forward over one img²
    image) of model `cfg` built with nc=80, float32, the weights and the input not counted: what a validation
    forward holds per image. Each operator's outputs are followed by storage (views share theirs) until the
    last tensor on it is freed. Imports torch (builds the model on the CPU)."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    model = mp.counting_model(cfg).eval()
    x = torch.zeros(1, 3, img, img)
    known = {t.untyped_storage().data_ptr() for t in [x, *model.parameters(), *model.buffers()]}
    refs, size, live, peak = {}, {}, [0], [0]

    def drop(ptr):
        refs[ptr] -= 1
        if not refs[ptr]:
            live[0] -= size.pop(ptr)
            del refs[ptr]

    class Follow(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (list, tuple)) else [out]:
                if not isinstance(t, torch.Tensor) or t.untyped_storage().data_ptr() in known:
                    continue
                ptr = t.untyped_storage().data_ptr()
                if ptr not in refs:
                    refs[ptr], size[ptr] = 0, t.untyped_storage().nbytes()
                    live[0] += size[ptr]
                    peak[0] = max(peak[0], live[0])
                refs[ptr] += 1
                weakref.finalize(t, drop, ptr)
            return out

    with torch.no_grad(), Follow():
        model(x)
    return sum(p.numel() for p in model.parameters()), peak[0]
