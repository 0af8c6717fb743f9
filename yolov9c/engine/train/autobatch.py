"""AutoBatch (`train_dual.py --batch-size -1`): pick the largest batch that fits 80 % of the free GPU memory.

    batch = autobatch(model, imgsz, hyp, device, backend="c", amp=True)   # on the CPU: 16, with a message
    batch = select_batch([(1, 1.2), (2, 1.9), (4, 3.3), (8, None)], free_gib=20.0)   # the fit alone

As published: single GPU only (refused under DDP); a step is profiled at batch 1, 2, 4, 8, 16, a line
fitted to reserved memory against batch, and the batch predicted at 80 % of the free memory chosen, clamped to
[1, 1024]; without CUDA or when the fit fails, 16 with a warning.
Difference: the published profile runs forward + backward of the bare model; here each profiled step also runs
the loss with the task-aligned assigner (memory grows with batch × labels × anchors), with the chosen backend
and AMP, on a model copy, so the assigner's memory is in the fit (the published choice can run out of it).
Each profiled image carries `labels_per_image` random boxes (default 32; the 20 % margin absorbs more). An
out-of-memory batch size ends the profile; the choice stays below it.
Test: python -m pytest -q tests/engine/train/test_autobatch.py
"""

import copy
import math

import numpy as np
import torch

from yolov9c.backends import apply as apply_backend
from yolov9c.loss.detection import make_loss
from yolov9c.units import GIB

PREFIX = "AutoBatch: "
BATCH_SIZES = (1, 2, 4, 8, 16)
DEFAULT_BATCH = 16
FRACTION = 0.8
LIMITS = (1, 1024)


def select_batch(samples, free_gib, fraction=FRACTION, default=DEFAULT_BATCH, limits=LIMITS, log=print):
    """The batch for `fraction` of `free_gib` from profiled `samples` [(batch, reserved GiB or None = OOM)].

    Fits reserved = slope · batch + intercept (least squares) over the samples that worked, before the first
    failure; batch = int((free · fraction − intercept) / slope), kept below the first failing batch size and
    clamped to `limits`. Fewer than two working sizes, a non-positive slope or a non-finite result: `default`
    with a warning."""
    ok, failed = [], None
    for b, mem in samples:
        if mem is None:
            failed = b
            break
        ok.append((b, float(mem)))
    if len(ok) < 2:
        log(f"{PREFIX}WARNING ⚠️ fewer than two batch sizes could be profiled, using default batch-size {default}")
        return default
    xs = np.array([b for b, _ in ok], np.float64)
    ys = np.array([m for _, m in ok], np.float64)
    slope, intercept = np.polyfit(xs, ys, 1)
    if not (math.isfinite(slope) and math.isfinite(intercept)) or slope <= 0:
        log(f"{PREFIX}WARNING ⚠️ memory does not grow with the batch (fit slope {slope:.4g} GiB/image), "
            f"using default batch-size {default}")
        return default
    b = (free_gib * fraction - intercept) / slope
    if not math.isfinite(b):
        log(f"{PREFIX}WARNING ⚠️ the fit gives no batch size, using default batch-size {default}")
        return default
    b = int(b)
    if failed is not None and b >= failed:
        b = ok[-1][0]  # the largest size that ran
    lo, hi = limits
    if not lo <= b <= hi:
        log(f"{PREFIX}WARNING ⚠️ batch-size {b} outside [{lo}, {hi}]: clamped")
        b = min(max(b, lo), hi)
    return b


def _random_targets(batch, nc, n, generator):
    """(batch·n, 6) host targets [image, class, xc, yc, w, h] normalised, boxes 5–40 % of the image."""
    img = torch.arange(batch).repeat_interleave(n).float()
    cls = torch.randint(0, nc, (batch * n,), generator=generator).float()
    wh = torch.rand(batch * n, 2, generator=generator) * 0.35 + 0.05
    xy = wh / 2 + torch.rand(batch * n, 2, generator=generator) * (1 - wh)
    return torch.cat((img[:, None], cls[:, None], xy, wh), 1)


def profile_step(model, compute_loss, batch, imgsz, nc, device, amp, labels_per_image, generator):
    """One forward + loss + backward at `batch`; returns the peak reserved memory in GiB, None when out of
    memory."""
    try:
        torch.cuda.reset_peak_memory_stats(device)
        imgs = torch.rand(batch, 3, imgsz, imgsz, generator=generator).to(device)
        targets = _random_targets(batch, nc, labels_per_image, generator)
        with torch.autocast(device.type, enabled=amp):
            loss, _ = compute_loss(model(imgs), targets)
        loss.sum().backward()
        torch.cuda.synchronize(device)
        mem = torch.cuda.max_memory_reserved(device) / GIB
    except torch.cuda.OutOfMemoryError:
        mem = None
    finally:
        model.zero_grad(set_to_none=True)
        imgs = targets = loss = None
        torch.cuda.empty_cache()
    return mem


def autobatch(model, imgsz, hyp, device, backend="torch", amp=True, fraction=FRACTION, batch_sizes=BATCH_SIZES,
              labels_per_image=32, log=print, switches=None):
    """The AutoBatch choice for training `model` (a DetectionModel on `device`, not yet rewritten by a backend)
    at `imgsz` with `hyp`. Profiles a deep copy (train mode, the backend applied with the c backend's
    `switches`, the loss of make_loss) so the caller's weights and BatchNorm statistics stay untouched. Without
    CUDA: logs the published message and returns 16."""
    device = torch.device(device)
    if device.type != "cuda":
        log(f"{PREFIX}CUDA not detected, using default CPU batch-size {DEFAULT_BATCH}")
        return DEFAULT_BATCH
    log(f"{PREFIX}Computing optimal batch size for --imgsz {imgsz} (forward + loss + backward, backend "
        f"{backend}, {'AMP' if amp else 'FP32'})")
    total = torch.cuda.get_device_properties(device).total_memory / GIB
    reserved = torch.cuda.memory_reserved(device) / GIB
    allocated = torch.cuda.memory_allocated(device) / GIB
    free = total - (reserved + allocated)
    log(f"{PREFIX}{torch.cuda.get_device_name(device)} {total:.2f}G total, {reserved:.2f}G reserved, "
        f"{allocated:.2f}G allocated, {free:.2f}G free")
    prof = copy.deepcopy(model).train()
    nc = int(prof.model[-1].nc)
    compute_loss = make_loss(prof, hyp, backend=backend)
    if backend != "torch":
        prof = apply_backend(prof, backend, switches)
    gen = torch.Generator().manual_seed(0)
    samples = []
    for b in batch_sizes:
        mem = profile_step(prof, compute_loss, b, imgsz, nc, device, amp, labels_per_image, gen)
        log(f"{PREFIX}batch {b:>4}: " + (f"{mem:.3f}G reserved" if mem is not None else "out of memory"))
        samples.append((b, mem))
        if mem is None:
            break
    del prof, compute_loss
    torch.cuda.empty_cache()
    b = select_batch(samples, free, fraction, log=log)
    log(f"{PREFIX}Using batch-size {b} for {torch.cuda.get_device_name(device)} "
        f"(target {fraction * 100:.0f}% of {free:.2f}G free)")
    return b
