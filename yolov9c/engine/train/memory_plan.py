"""Memory planner: the peak GPU memory of a training step, and the micro-batch that fits a memory budget.

    cost = mp.cost_for("yolov9-s", "c", switches)           # COSTS, else estimate(); c switches counted in
    mp.predict(cost, batch=64, img=640)                     # predicted peak reserved GiB of a step
    p = mp.plan(cost, mp.parse_size("7.5G"), nominal=64, img=640)   # Plan(batch=32, accumulate=2, img=640, ...)

Model: peak reserved = fixed + per_image · batch · (img / 640)²; fixed does not grow with the batch (weights,
grads, optimizer, EMA, allocator slack), per_image does. Both come from two profiled steps. COSTS holds H200 fits
of the trainer's AMP step under the default c switches; a model without an entry gets `estimate` (the nearest
size's Cost scaled by parameter and activation counts); other switches add what switch_cost.py counts.
plan() keeps the nominal batch (the LR and weight-decay rules read it): the largest micro-batch that divides it
and fits, accumulated nominal / micro-batch times; dynamic_img instead shrinks the image (stride multiples,
>= min_img; opt-in: it changes the data). A budget is what the process may reserve (CARDS: card less context).
Shared with `python -m yolov9c memory`, so it plans what training runs: train_img_size, MIN_IMG, dynamic_img_error.
Test: python -m pytest -q tests/engine/train/test_memory_plan.py   (measure: the cuda case)
"""

from __future__ import annotations

import functools
import gc
import math
import re
from dataclasses import dataclass

GIB = 2 ** 30  # yolov9c.units.GIB spelled out: this file runs in the published code's interpreter too
REF_IMG = 640
# the CUDA context, cuDNN/cuBLAS handles, loaded kernels and graph executables: outside PyTorch's reserved memory
# (the card's memory.used less the reserved peak: 0.83-0.84 GiB, three capped runs, benchmarks/RESULTS.md §1)
CONTEXT_GIB = 0.83
# common cards: nominal GB (10⁹ bytes, as sold) -> usable GiB for the process (less the context)
CARDS = {f"{gb} GB": gb * 1e9 / GIB - CONTEXT_GIB for gb in (8, 12, 16, 24, 40, 80)}


@dataclass(frozen=True)
class Cost:
    """Peak reserved memory of one step = fixed_gib + per_image_gib · batch · (img / 640)²."""

    model: str
    backend: str
    fixed_gib: float
    per_image_gib: float
    source: str = "measured"


MIN_IMG = 320  # --dynamic-img's smallest image size unless --min-img says (training and the memory CLI)
GRID = 32  # training's grid: the model's max stride, at least 32 (32 for every bundled model)


def train_img_size(img, gs=GRID, log=None):
    """An image size as training uses it (--img, --min-img): rounded up to a multiple of the grid `gs` and at
    least 2 * gs (--img 100 trains at 128); a change is logged through `log` when given (--img's warning)."""
    size = max(math.ceil(img / gs) * gs, gs * 2)
    if log is not None and size != img:
        why = (f"must be a multiple of max stride {gs}" if img % gs else
               f"is below the smallest training size, 2 x max stride {gs}")  # --img 32: a multiple already
        log(f"WARNING: --img-size {img} {why}, updating to {size}")
    return size


def dynamic_img_error(dynamic_img, budget, min_img_given, budget_flag="--mem-budget"):
    """The rule of --dynamic-img and --min-img, the same in train_dual.py and `python -m yolov9c memory`
    (budget_flag: --budget there): the message for a combination that cannot apply, else None."""
    if dynamic_img and (budget is None or budget == "auto"):
        return (f"--dynamic-img needs {budget_flag} SIZE (it picks the image size that fits the budget; auto keeps "
                f"the images and splits the batch)")
    if min_img_given and not dynamic_img:
        return "--min-img is the smallest image size of --dynamic-img: add --dynamic-img, or drop --min-img"
    return None


@dataclass(frozen=True)
class Plan:
    """What the trainer runs: `batch` images per forward, `accumulate` forwards per optimizer step, at `img`."""

    batch: int
    accumulate: int
    img: int
    predicted_gib: float
    budget_gib: float
    fits: bool
    note: str = ""


# Measured on one NVIDIA H200 (benchmarks/RESULTS.md "Memory planner"; benchmarks/bench_plan.py, steps at
# batch 16 and 64, 640², 40 boxes/img): (fixed GiB, GiB per image at 640²). The c entries are under the default
# switches (backends/c/switches.py: auxiliary branch and stride-4/8 backbone blocks recomputed, no kept inputs).
COSTS = {
    ("yolov9-s", "c"): (0.120, 0.0736),   # 16: 1.297, 64: 4.828 GiB reserved
    ("yolov9-c", "c"): (0.391, 0.1588),   # 16: 2.932, 64: 10.555
    ("yolov9-e", "c"): (0.739, 0.2462),   # 16: 4.678, 64: 16.494
    ("yolov9-s", "torch"): (0.161, 0.3671),  # 16: 6.035, 64: 23.656
}


def _stem(cfg):
    name = str(cfg).replace("\\", "/").rsplit("/", 1)[-1]
    return name[:-5] if name.endswith(".yaml") else name[:-4] if name.endswith(".yml") else name


def lookup(cfg, backend):
    """The measured Cost of model `cfg` (a name or yaml path: its stem is looked up) under `backend`, or
    None when it was not measured."""
    got = COSTS.get((_stem(cfg), backend))
    return None if got is None else Cost(_stem(cfg), backend, *got, source="table")


# The measured model an estimate is scaled from, by the size letter of the name (t and s from s, m and c from
# c, e from e; another name from yolov9-s); a backend measured for yolov9-s only scales from that.
_SIZE_REF = {"t": "yolov9-s", "s": "yolov9-s", "m": "yolov9-c", "c": "yolov9-c", "e": "yolov9-e"}
COUNT_IMG = 128  # counts() runs its forward at this size and scales to 640² by the pixel count


@functools.lru_cache(maxsize=2)
def counting_model(cfg):
    """Model `cfg` built with nc=80 on the CPU, shared by counts and memory_phases.eval_counts so that a memory
    plan builds each model once (the most recent two kept). Its users run no-grad forwards and set the mode they
    need; the BatchNorm statistics a training-mode forward moves are never read."""
    from yolov9c.models.model import DetectionModel

    return DetectionModel(cfg, nc=80)


@functools.lru_cache(maxsize=None)
def counts(cfg):
    """(parameters, activation elements per image at 640²) of model `cfg` built with nc=80: the outputs of every
    leaf module in one training-mode forward of one COUNT_IMG² image, times (640 / COUNT_IMG)². These are what
    the fixed and the per-image memory of a step grow with (weights, gradients, optimizer state; stored
    activations)."""
    import torch

    model = counting_model(cfg).train()
    total = [0]

    def hook(module, inputs, out):
        for t in (out if isinstance(out, (list, tuple)) else [out]):
            if isinstance(t, torch.Tensor):
                total[0] += t.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, COUNT_IMG, COUNT_IMG))
    finally:
        for h in handles:
            h.remove()
    return sum(p.numel() for p in model.parameters()), total[0] * (REF_IMG / COUNT_IMG) ** 2


def estimate(cfg, backend, ref=None):
    """A Cost for a model without measured costs under `backend`: a measured model's Cost (same backend, the
    nearest size: _SIZE_REF) scaled by the ratio of parameter counts (fixed) and of activation counts (per image)
    of the two built models (counts); `ref` forces the measured model. source says "estimate" and names the
    model it was scaled from. None when nothing is measured for `backend`. ValueError when `cfg` cannot be
    built. Test: tests/engine/train/test_memory_plan.py::test_estimate_scales_a_measured_model."""
    refs = sorted(m for (m, b) in COSTS if b == backend)
    if not refs:
        return None
    stem = _stem(cfg)
    letter = stem.rsplit("-", 1)[-1][:1] if "-" in stem else ""
    ref = ref or _SIZE_REF.get(letter, "yolov9-s")
    ref = ref if ref in refs else ("yolov9-s" if "yolov9-s" in refs else refs[0])
    try:
        params, acts = counts(cfg)
    except (FileNotFoundError, KeyError, TypeError) as e:
        raise ValueError(f"{cfg}: cannot build the model to estimate its memory ({e})") from None
    ref_params, ref_acts = counts(ref)
    fixed, per_image = COSTS[(ref, backend)]
    return Cost(stem, backend, fixed * params / ref_params, per_image * acts / ref_acts,
                source=f"estimate (scaled from measured {ref} by parameter and activation counts)")


def cost_for(cfg, backend, switches=None):
    """The measured Cost (lookup) of `cfg` under `backend`, else its estimate, else None; with the c backend's
    `switches` (None: the defaults) counted in (switch_cost.adjust)."""
    from yolov9c.engine.train import switch_cost

    cost = lookup(cfg, backend) or estimate(cfg, backend)
    return None if cost is None else switch_cost.adjust(cost, cfg, switches)


def is_estimate(cost):
    return cost.source.startswith("estimate")


# graph_shapes.ShapeGraphStep holds at most this many micro-step graphs (+ the optimizer graph), one per key (batch
# layout, box bucket); micro-batches of other keys run eagerly. Here, in the planner that imports no torch (the
# memory CLI), so that both count the same cap.
MAX_GRAPHS = 12


def graphs_held(batch, micro=None, varying=False):
    """Micro-step graphs a run keyed by shape (--graph-shapes) can hold, as the planner counts them (graphs_gib).
    `varying` (--rect, --multi-scale: a shape per batch): MAX_GRAPHS. Else one per micro-batch size of a fixed-shape
    run: the loader `batch` split into `micro` images (None: whole) gives micro and batch % micro, and the epoch's
    last partial batch (its size unknown at set-up) at most one more, its remainder; micro-batches of one image have
    one size. A key's box buckets count once: their activations are the same sizes, served from the blocks the
    layout's first capture freed (as the fixed-shape GraphStep's bucket graphs always were)."""
    if varying:
        return MAX_GRAPHS
    m = batch if micro is None or micro >= batch else micro
    if m <= 1:
        return 1
    return min(2 + (batch % m != 0), MAX_GRAPHS)


# --graph-shapes (graph_shapes.py; on by default): the micro-step graphs share one capture pool. It holds the
# largest graph's step (the per-image term, as one graph's pool does), and every further graph keeps GRAPH_SHARE of
# that step's per-image memory there: the allocator serves a capture of the same or a smaller step from the blocks
# the earlier captures freed (splitting them), so what a graph adds is fragmentation and its outputs. Measured on an
# H100 (2026-12-07, tree 021b3a8, benchmarks/RESULTS.md §2; yolov9-s, c, batch 64): --multi-scale with three graphs
# (320², 640², 960²) reserved 1.33 GiB above its eager step, one graph at 640² 0.65 GiB above its own; taking the
# first graph's 0.65 as the same at 960², the two further graphs added 0.68 GiB: 3.2 % each of the 960² step's
# per-image memory (64 · 0.0736 · 2.25 = 10.6 GiB; 12 % of their own smaller steps'). One run: a fit, not a law.
# The plan counts each graph at its micro-batch and image size, and graphs_held of them (MAX_GRAPHS with --rect or
# --multi-scale, else the micro-batch sizes a fixed-shape run makes). Not counted: a new shape's eager
# warm-up batch beside the pool and --multi-scale sizes above --img.
GRAPH_SHARE = 0.03


def graphs_gib(cost, batch, img=REF_IMG, graphs=1):
    """GiB that `graphs` CUDA graphs keyed by shape add to a step of `batch` images of img² (the first adds nothing:
    its pool is the step): (graphs − 1) · GRAPH_SHARE · per_image_gib · batch · (img / 640)². The trainer counts
    graphs_held(batch, micro, varying): MAX_GRAPHS with --rect or --multi-scale, else one graph per micro-batch
    size of a fixed-shape run (the batch or its micro-batch, a remainder when the micro-batch does not divide it,
    the last partial batch's: 2 for a divisor) and a key's box buckets once; 1 with --no-graph-shapes."""
    return max(int(graphs) - 1, 0) * GRAPH_SHARE * cost.per_image_gib * batch * (img / REF_IMG) ** 2


def predict(cost, batch, img=REF_IMG, graphs=1):
    """Predicted peak reserved GiB of one step at `batch` images of img × img, with `graphs` CUDA graphs keyed by
    shape held (graphs_gib; 1: one shape, the step itself)."""
    if batch < 1 or img < 1:
        raise ValueError(f"predict: batch and img must be positive, got {batch}, {img}")
    return cost.fixed_gib + cost.per_image_gib * batch * (img / REF_IMG) ** 2 + graphs_gib(cost, batch, img, graphs)


def fits_cards(cost, batch, img=REF_IMG, cards=None):
    """{card name: True/False} whether the predicted step fits each card (CARDS by default)."""
    need = predict(cost, batch, img)
    return {name: need <= gib for name, gib in (cards or CARDS).items()}


def _divisors_desc(n):
    return [d for d in range(n, 0, -1) if n % d == 0]


def plan(cost, budget_gib, nominal=64, img=REF_IMG, dynamic_img=False, min_img=None, stride=32, graphs=1):
    """The micro-batch / accumulation (and with dynamic_img the image size) that fit budget_gib with `graphs` CUDA
    graphs keyed by shape (predict); see the module docstring. When nothing fits (batch 1 at img, or at min_img),
    returns batch 1 with fits=False."""
    if nominal < 1:
        raise ValueError(f"plan: nominal batch must be positive, got {nominal}")
    if budget_gib <= 0:
        raise ValueError(f"plan: the budget must be positive, got {budget_gib} GiB")
    if dynamic_img:
        floor = min_img if min_img is not None else max(stride * 2, img // 2)
        size = img
        while size >= floor:
            need = predict(cost, nominal, size, graphs)
            if need <= budget_gib:
                note = "" if size == img else f"images shrunk from {img} to {size} (--dynamic-img)"
                return Plan(nominal, 1, size, need, budget_gib, True, note)
            size -= stride
    for b in _divisors_desc(nominal):
        need = predict(cost, b, img, graphs)
        if need <= budget_gib:
            acc = nominal // b
            note = "" if acc == 1 else f"{acc} micro-batches of {b} per optimizer step (nominal batch {nominal})"
            return Plan(b, acc, img, need, budget_gib, True, note)
    one = predict(cost, 1, img, graphs)
    return Plan(1, nominal, img, one, budget_gib, False, f"even one image of {img}² is predicted to need {one:.2f} GiB")


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text):
    """A memory size as GiB: '7.5G', '7.5GiB', '7680M', '0.5T' are binary (G = 2³⁰ bytes, as torch reports
    memory); '8GB' is decimal (10⁹ bytes, as cards are sold); a bare number is GiB. ValueError otherwise."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"cannot read the memory size {text!r}: give a number with a unit, e.g. 7.5G or 8GB")
    value, unit, suffix = float(m.group(1)), m.group(2).lower(), m.group(3).lower()
    if value <= 0:
        raise ValueError(f"the memory size must be positive, got {text!r}")
    power = {"": 3, "k": 1, "m": 2, "g": 3, "t": 4}[unit]
    if suffix == "b" and unit:  # KB/MB/GB/TB: decimal
        return value * 1000 ** power / GIB
    return value * 1024 ** power / GIB


def plan_for_training(cfg, backend, budget, nominal=64, img=REF_IMG, dynamic_img=False, min_img=None,
                      device=None, log=print, switches=None, graphs=1):
    """The Plan for `train_dual.py --mem-budget BUDGET [--dynamic-img]`: budget is GiB or a size text
    ('7.5G'); the cost of (cfg, backend) comes from COSTS, else it is measured on `device` (CUDA) when
    given, else estimated (estimate; logged as such). `switches`: the c backend's (None: the defaults), counted
    into a table or estimated cost (switch_cost.adjust; logged when they change it), measured as they are.
    `graphs`: CUDA graphs keyed by shape counted (--graph-shapes; logged). ValueError (a message for the user)
    when it can be neither looked up, measured nor estimated."""
    from yolov9c.engine.train import switch_cost

    budget_gib = parse_size(budget) if isinstance(budget, str) else float(budget)
    cost = lookup(cfg, backend)
    if cost is None:
        if device is None or str(device) == "cpu":
            cost = estimate(cfg, backend)
            if cost is None:
                raise ValueError(f"--mem-budget: no measured memory costs for {_stem(cfg)} with --backend "
                                 f"{backend} and no GPU to measure them on")
            log(f"memory plan: {_stem(cfg)} ({backend}) has no measured costs: {cost.source}")
        else:
            log(f"memory plan: measuring {_stem(cfg)} ({backend}) at two batch sizes ...")
            cost = measure(cfg, backend, img=img, device=device, switches=switches)
            switches = None  # measured under them
    adjusted = switch_cost.adjust(cost, cfg, switches)
    if adjusted is not cost:
        log(f"memory plan: the c backend's switches change the step by "
            f"{adjusted.per_image_gib - cost.per_image_gib:+.4f} GiB per 640² image (counted from the model graph)")
    cost = adjusted
    p = plan(cost, budget_gib, nominal=nominal, img=img, dynamic_img=dynamic_img, min_img=min_img, graphs=graphs)
    if graphs > 1:
        log(f"memory plan: --graph-shapes: {graphs} CUDA graphs counted, each beyond the first "
            f"{GRAPH_SHARE:.0%} of its step's per-image memory ({graphs_gib(cost, p.batch, p.img, graphs):.2f} GiB "
            f"at the plan's micro-batch)")
    if not p.fits:
        raise ValueError(f"--mem-budget {budget_gib:.2f} GiB: {p.note} with --backend {backend}; give a larger "
                         f"budget, a smaller --img, or --backend c")
    return p


def fit(model, backend, samples):
    """A Cost from measured [(batch, peak reserved GiB), ...] at 640² (two or more; least squares)."""
    if len(samples) < 2 or len({b for b, _ in samples}) < 2:
        raise ValueError("fit: need peaks at two different batch sizes")
    n = len(samples)
    mb = sum(b for b, _ in samples) / n
    mm = sum(m for _, m in samples) / n
    slope = sum((b - mb) * (m - mm) for b, m in samples) / sum((b - mb) ** 2 for b, _ in samples)
    return Cost(model, backend, mm - slope * mb, slope)


# ---------------------------------------------------------------------------------------------------------
# On-GPU measurement
# ---------------------------------------------------------------------------------------------------------

def random_targets(batch, boxes, nc, gen):
    """(batch·boxes, 6) float host targets [image, class, x, y, w, h] of the measured steps (here and in
    benchmarks/): `boxes` per image, classes uniform in [0, nc), sides 5-50 % of the image, normalised and
    inside it; drawn from the torch.Generator `gen`."""
    import torch

    n = batch * boxes
    wh = torch.rand(n, 2, generator=gen) * 0.45 + 0.05
    xy = wh / 2 + torch.rand(n, 2, generator=gen) * (1 - wh)
    idx = torch.arange(batch).repeat_interleave(boxes).float()
    cls = torch.randint(0, nc, (n,), generator=gen).float()
    return torch.cat([idx[:, None], cls[:, None], xy, wh], 1)


class MeasuredStep:
    """The trainer's step (module docstring) on a fresh model of `cfg` under `backend`, as step_peak measures
    it and dev/probes/mem_timeline.py instruments it: an EMA copy, SGD (Nesterov, momentum 0.937), a
    GradScaler and fp16 autocast on CUDA, a random uint8 batch (batch, 3, img, img) on `device` in memory
    format `fmt`, passed as is when `uint8` and the model accepts it (else float/255), and `boxes` random host
    targets per image; `switches`: the c backend's (backends/c/switches.py; None: the defaults). run() is one
    step. The fields are the parts (model, ema, loss_fn, opt, scaler, images, targets, uint8, device, amp)."""

    def __init__(self, cfg, backend, batch, img, device, fmt, boxes=40, nc=80, uint8=True, switches=None):
        import torch

        from yolov9c.backends import accepts_uint8, apply
        from yolov9c.engine.train.ema import ModelEMA
        from yolov9c.loss.detection import make_loss
        from yolov9c.models.model import DetectionModel

        self.device = torch.device(device)
        self.amp = self.device.type == "cuda"
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        self.model = DetectionModel(cfg, nc=nc).to(self.device, memory_format=fmt).train()
        self.ema = ModelEMA(self.model)  # the trainer's float32 copy (part of what is held between steps)
        self.loss_fn = make_loss(self.model, backend=backend)  # built before the backend, as the trainer does
        if backend != "torch":
            apply(self.model, backend, switches)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp)
        images = torch.randint(0, 256, (batch, 3, img, img), dtype=torch.uint8, generator=gen)
        self.images = images.to(self.device).contiguous(memory_format=fmt)
        self.targets = random_targets(batch, boxes, nc, gen)
        self.uint8 = uint8 and accepts_uint8(self.model)

    def run(self):
        import torch

        imgs = self.images if self.uint8 else self.images.float() / 255
        with torch.autocast(self.device.type, enabled=self.amp):
            loss, _ = self.loss_fn(self.model(imgs), self.targets)
        self.scaler.scale(loss.sum()).backward()
        self.scaler.unscale_(self.opt)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=10.0)
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad()
        self.ema.update(self.model)


def step_peak(cfg, backend, batch, img, device, boxes=40, steps=2, nc=80, switches=None):
    """Peak reserved GiB (and peak allocated) of the trainer's step (MeasuredStep) for a fresh model at
    `batch` × img² on a CUDA `device` (c backend: under `switches`), after one warm-up step. Unreachable objects
    of earlier work (a trainer's CUDA graphs and their pool in a reference cycle) are collected first, so that
    only this step is counted; frees everything (empty_cache) before returning."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    fmt = torch.channels_last if backend == "c" else torch.contiguous_format
    step = MeasuredStep(cfg, backend, batch, img, device, fmt, boxes=boxes, nc=nc, switches=switches)
    device = step.device
    try:
        for k in range(steps):
            if k == 1:  # the measured step: cached blocks of the warm-up (first-call workspaces) released
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            step.run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_reserved(device) / GIB, torch.cuda.max_memory_allocated(device) / GIB
    finally:
        del step
        torch.cuda.empty_cache()


def measure(cfg, backend, img=REF_IMG, batches=(8, 16), device="cuda", boxes=40, switches=None):
    """A Cost for `cfg` under `backend` (and the c backend's `switches`) from two measured steps at `batches`
    (images of img², converted to the 640² reference by the pixel count)."""
    samples = []
    for b in batches:
        reserved, _ = step_peak(cfg, backend, b, img, device, boxes=boxes, switches=switches)
        samples.append((b * (img / REF_IMG) ** 2, reserved))
    return fit(_stem(cfg), backend, samples)
