"""The Step of CUDA graphs: step.py's eager step (forward, loss, scaled backward; unscale, inf check, clip,
optimizer step, scaler update, EMA update) captured once and replayed, two graph launches per optimizer step.

    state.step = GraphStep(state)       # set-up, once, by graph_shapes.select_step (else step.EagerStep)
    result = state.step(state, imgs, targets, ni)   # StepResult; finite: a 0-dim device bool once graphed

Contract: the eager step's results on the same parameter, optimizer, GradScaler and EMA objects (updated in
place), so checkpoints, resume and a switch to eager see one run. The first WARMUP batches run eagerly; then one
micro-step graph per box-count bucket (targets in a static (B, M, 5) buffer, M in BUCKETS) and one optimizer
graph that applies a window only when its losses and gradient norm are finite. Other shapes or more boxes than
the largest bucket run eagerly into the same gradients. A failed capture or an out-of-memory split switches to
eager for good; end_epoch() copies the EMA count to the host; release() drops graphs and pool; suspend() until the
next batch recaptures. --ckpt is captured whole (recompute and BN undo inside) keyed by shape (the default). Eager
(logged): CPU, DDP, --rect/--multi-scale/--ckpt with --no-graph-shapes, --ckpt with dropout, LION, --no-cuda-graph.
Test: python -m pytest -q tests/engine/train/test_graph_step.py (graphed = eager, CUDA)
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from yolov9c.engine.train.fused_optim import FusedOptimizer, kind
from yolov9c.engine.train.guards import free_cuda
from yolov9c.engine.train.layer_ckpt import bn_update_once, draws_random
from yolov9c.engine.train.step import (MAX_GRAD_NORM, StepResult, begin_window, forward_backward,
                                       optimizer_step, step_due, train_step)
from yolov9c.loss.detection import pack_targets_host

WARMUP = 3  # eager batches of the fixed shape before the first capture
BUCKETS = (32, 64, 128, 256)  # padded boxes per image of the micro-step graphs


@dataclass
class _Micro:
    graph: torch.cuda.CUDAGraph
    imgs: torch.Tensor  # the static image batch the graph reads
    gt: torch.Tensor  # static (B, bucket, 5) packed targets
    items: torch.Tensor  # the graph's loss items (3,)
    finite: torch.Tensor  # the graph's 0-dim finiteness of the loss items


def unsupported(state) -> str | None:
    """Why the graph step cannot run for this run (None when it can): the eager step runs instead."""
    cfg = state.cfg
    shapes = getattr(cfg, "graph_shapes", True)  # graph_shapes.py: a graph per shape (the default)
    if not getattr(cfg, "cuda_graph", True):
        return "--no-cuda-graph"
    if state.device.type != "cuda":
        return "not on a CUDA device"
    if state.world > 1:
        return "DDP: NCCL collectives inside a captured graph are not supported here"
    if cfg.rect and not shapes:
        return "--rect with --no-graph-shapes: every batch has its own shape"
    if cfg.multi_scale and not shapes:
        return "--multi-scale with --no-graph-shapes: every batch has its own shape"
    if state.bn_buffers and not shapes:  # --ckpt (torch backend): captured by the keyed step only
        return "--ckpt with --no-graph-shapes: its recompute is graphed only by the step keyed by shape"
    if state.bn_buffers and draws_random(state.model):  # --ckpt with a dropout layer
        return ("--ckpt with a layer that draws random numbers (nn.Dropout p > 0): torch.utils.checkpoint saves and "
                "restores the CUDA generator state around its recompute, which a capture refuses")
    if kind(state.optimizer) is None:
        return f"--optimizer {cfg.optimizer}: no capturable update (SGD, Adam and AdamW have one)"
    if state.ema is None:
        return "no EMA on this process"
    return None


@contextmanager
def cudnn_benchmark(on, force=False):
    """torch.backends.cudnn.benchmark = True inside when `on` (`force`: = `on` either way), the previous value
    restored after."""
    before = torch.backends.cudnn.benchmark
    if on or force:
        torch.backends.cudnn.benchmark = bool(on)
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


class CaptureFailed(RuntimeError):
    """A CUDA graph capture raised: GraphStep goes on with the eager step."""


@contextmanager
def capturing(what):
    """CaptureFailed for a RuntimeError (torch.AcceleratorError is one) raised while capturing `what`. Python's
    automatic garbage collection is paused meanwhile: a collection inside the capture that destroys an
    unreachable CUDA graph (an earlier run's or test's, in a reference cycle) is refused by CUDA and
    invalidates this capture, and torch.cuda.graph does not collect before capturing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CaptureFailed(f"{what}: {first}") from e
    finally:
        if enabled:
            gc.enable()


def bucket_for(m, buckets=BUCKETS):
    """The smallest bucket ≥ m boxes per image, or None when m exceeds the largest."""
    return next((b for b in buckets if m <= b), None)


def max_boxes(targets, batch):
    """The most target rows of one image among `batch` images (targets (N, 6) on the host; 0 when N = 0).
    Out-of-range image indices are clamped here; the packing refuses them with its own error."""
    if targets.shape[0] == 0:
        return 0
    img = targets[:, 0].detach().to("cpu").long().clamp(0, batch - 1)
    return int(torch.bincount(img, minlength=batch).max())


def layout_of(t):
    """(shape, strides, dtype, device) of an image batch: what a graph's static batch must match."""
    return tuple(t.shape), t.stride(), t.dtype, t.device


class GraphStep:
    """The Step of CUDA graphs (see the module docstring); after disable() it runs step.train_step."""

    def __init__(self, state, warmup=WARMUP, buckets=BUCKETS):
        self.eager = False  # disabled: every batch runs step.train_step
        self.warmup_left = int(warmup)
        self.buckets = tuple(buckets)
        self.layout = None  # (shape, stride, dtype, device) of the graphed image batch: the first batch's
        self.imgs = None  # the static image batch of that layout (made at the first capture)
        self.device = state.device
        self._stream = None  # the capture stream (the last warm-up batch runs on it too); made on first use
        self.pool = None
        self.micro = {}  # bucket → _Micro
        self.captures = 0  # micro-step graphs captured (again after a release: counted again)
        self.opt = None  # the optimizer graph
        self.grads = None  # static gradient views (model.parameters() order) of self.flat
        self.suspends = 0  # times suspend() gave the graphs' memory back (validation on a tight card)
        cfg = state.cfg
        self.benchmark = bool(getattr(cfg, "cudnn_benchmark", True)) and not getattr(cfg, "deterministic", False)

    # -- the decision per batch -------------------------------------------------------------------------------

    def plan(self, imgs, targets):
        """(bucket, None) to replay, or (None, reason) to run this batch eagerly."""
        if self.layout is None:
            self.layout = layout_of(imgs)
        if layout_of(imgs) != self.layout:
            return None, "shape"
        bucket = bucket_for(max_boxes(targets, imgs.shape[0]), self.buckets)
        if bucket is None:
            return None, "boxes"
        if self.warmup_left > 0:
            return None, "warm-up"
        return bucket, None

    @property
    def name(self):
        return "eager" if self.eager else "cuda-graph"

    def __call__(self, state, imgs, targets, ni) -> StepResult:
        if self.eager:
            return train_step(state, imgs, targets, ni)
        micro = state.progress.micro_batch
        if micro is not None and micro < imgs.shape[0]:
            self.disable(state)  # the out-of-memory guard split the batch: eager from here on, pool freed
            return train_step(state, imgs, targets, ni)
        if state.window.ok is None:
            begin_window(state)  # step.py: BN statistics kept for a skipped window, window.ok = True
        stepped = step_due(state, ni)
        bucket, why = self.plan(imgs, targets)
        try:
            if why is None:
                items, finite = self.replay_micro(state, imgs, targets, bucket)
            else:
                items, finite = self.eager_micro(state, imgs, targets, why)
        except CaptureFailed as e:  # nothing of the failed capture ran: this batch, and the rest, eagerly
            self._give_up(state, e)
            return train_step(state, imgs, targets, ni)
        state.window.ok &= finite
        ok = None
        if stepped:
            ok = self.optimizer_step(state)
            state.progress.last_opt_step = ni
        return StepResult(loss_items=items, images=imgs.shape[0], stepped=stepped, finite=ok)

    def optimizer_step(self, state):
        """The window's optimizer step: the optimizer graph once the static gradients exist, else (before the
        first capture, after disable) step.optimizer_step (zero_grad, EMA included)."""
        if self.eager or self.grads is None:
            return optimizer_step(state)
        try:
            return self._replay_opt(state)
        except CaptureFailed as e:  # the window's gradients are in place: the eager optimizer step
            self._give_up(state, e)
            return optimizer_step(state)

    def _give_up(self, state, err):
        """A capture failed (a CUDA error recorded nothing that ran): the eager step for the rest of the run,
        said in one log line, instead of losing the run."""
        state.log(f"step: CUDA graph capture failed ({err}); the eager step runs from here on (--no-cuda-graph "
                  f"skips the graphs)")
        err.__cause__ = err.__context__ = None  # its traceback holds the failed graph (and so its memory pool)
        err.__traceback__ = None
        self.disable(state)

    def end_epoch(self, state):
        """ema.updates ← the device's count of applied optimizer steps (one host read; nothing before the
        first capture or after disable: the eager steps counted on the host)."""
        if self.grads is not None and not self.eager:
            state.ema.updates = int(self.ema_u.item())

    def disable(self, state):
        """Back to the eager step for the rest of the run (train_step); frees the graphs. The gradients
        accumulated so far stay in place (the eager step accumulates into them)."""
        self.end_epoch(state)
        self.eager = True
        self.release()

    def release(self):
        """Drop the graphs and give their memory pool back to the device now (the end of a run, a failed
        capture, an out-of-memory split; also after an error), rather than whenever a reference cycle holding
        this step is collected."""
        held = bool(self.micro) or self.opt is not None or self.pool is not None
        self.micro.clear()
        self.opt = None
        self.pool = None
        if held and torch.cuda.is_initialized():
            gc.collect()  # a failed capture's graph may sit in a reference cycle
            free_cuda(self.device)

    def suspend(self, state):
        """Give the graphs' memory back until the next batch, which captures them again (validation runs in
        that memory on a card that cannot hold both: trainer._validate). The static buffers (images, gradients,
        optimizer and EMA views) stay, so the run goes on as one. The capture again runs no eager warm-up batch
        (warmup_left stays spent): what the warm-up prepares outlives the pool (cuDNN's timed algorithms in its
        cache, the capture stream's lazily made handles and workspaces, the AMP scale), and eager batches
        before it would only reserve their own blocks again beside the new pool."""
        if self.eager or not (self.micro or self.opt is not None):
            return False
        self.end_epoch(state)
        self.release()
        self.suspends += 1
        return True

    # -- eager batches ---------------------------------------------------------------------------------------

    def eager_micro(self, state, imgs, targets, why):
        """forward_backward of step.py (into the graphs' gradients once they exist); the last warm-up batch
        runs on the capture stream so that its lazy per-stream state is made before the capture."""
        if self.grads is not None:
            self.bind_grads()
        if why == "warm-up":
            self.warmup_left -= 1
            with cudnn_benchmark(self.benchmark):
                if self.warmup_left == 0:  # the allocator caches per stream: give the main stream's blocks back
                    free_cuda(self.device)  # first (else both are reserved: 12.7 GB for yolov9-s at batch 64)
                    return self._on_stream(lambda: forward_backward(state, imgs, targets))
                return forward_backward(state, imgs, targets)
        out = forward_backward(state, imgs, targets)
        if self.micro:  # beside the graph pool: its blocks are given back (one synchronisation per such batch)
            free_cuda(self.device)
        return out

    @property
    def stream(self):
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        return self._stream

    def _on_stream(self, fn):
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            out = fn()
        main.wait_stream(self.stream)
        return out

    # -- static buffers ----------------------------------------------------------------------------------------

    def _build(self, state, imgs):
        """Static images, the flat gradient buffer and its views, the fused optimizer, the EMA pairs."""
        model = state.model
        self.params = [p for p in model.parameters() if p.requires_grad]
        numel = sum(p.numel() for p in self.params)
        self.flat = torch.zeros(numel, dtype=torch.float32, device=imgs.device)
        self.grads, o = [], 0
        for p in self.params:
            if p.dtype != torch.float32:
                raise TypeError(f"graph step: float32 parameters expected, got {p.dtype}")
            self.grads.append(self.flat[o:o + p.numel()].as_strided(p.shape, p.stride()))
            o += p.numel()
        self.fused = FusedOptimizer(state.optimizer, self.params)
        self.found_inf = torch.zeros((), dtype=torch.float32, device=imgs.device)
        self.ema_v, self.ema_m = state.ema.pairs(model)
        self.ema_u = torch.full((), float(state.ema.updates), dtype=torch.float64, device=imgs.device)
        self.window_ok = torch.ones((), dtype=torch.bool, device=imgs.device)  # state.window.ok copied in
        if state.amp and state.scaler._scale is None:
            state.scaler._lazy_init_scale_growth_tracker(imgs.device)

    def static_images(self, imgs):
        """The static batch a new micro-step graph of `imgs`' layout reads: here the one batch of this step's one
        layout (graph_shapes.ShapeGraphStep: views of one buffer for every layout)."""
        if self.imgs is None:
            self.imgs = torch.empty_like(imgs)
        return self.imgs

    def bind_grads(self):
        """Make every parameter's .grad its static view, carrying over what an eager backward left there
        (None after an eager zero_grad: zero)."""
        loose = [(p, g) for p, g in zip(self.params, self.grads) if p.grad is not g]
        if not loose:
            return
        if len(loose) == len(self.params) and all(p.grad is None for p, _ in loose):
            self.flat.zero_()  # one launch for the common case (every gradient dropped by zero_grad)
        else:
            for p, g in loose:
                if p.grad is None:
                    g.zero_()
                else:
                    g.copy_(p.grad)
        for p, g in loose:
            p.grad = g

    # -- the micro-step graph ----------------------------------------------------------------------------------

    def bucket_of(self, key):
        """The box bucket of a key of self.micro (here the key is the bucket)."""
        return key

    def replay_micro(self, state, imgs, targets, key):
        """Replay the micro-step graph of `key` (plan's; captured first when new) on this micro-batch: its images
        and padded targets copied into the graph's static buffers. Returns (loss items, finite) of the graph."""
        if self.grads is None:
            self._build(state, imgs)
        self.bind_grads()
        m = self.micro.get(key) or self._capture_micro(state, key, self.bucket_of(key), self.static_images(imgs))
        m.imgs.copy_(imgs)
        h, w = imgs.shape[-2:]
        pack_targets_host(targets, imgs.shape[0], (w, h), torch.float32, imgs.device, nc=state.loss.nc, out=m.gt)
        m.graph.replay()
        return m.items.clone(), m.finite.clone()

    def capture(self, what, body):
        """(graph, body()'s outputs): body captured into a CUDA graph in the step's one pool (every graph of this
        step shares it: they never run at once), on the capture stream, without a timed cuDNN search (a cache
        miss takes the heuristic choice; a search synchronises). Nothing runs until graph.replay(). The torch.cuda
        boundary of the step (CPU tests of graph_shapes.py replace it)."""
        if self.pool is None:  # made anew after suspend / release
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with capturing(what), cudnn_benchmark(False, force=True), \
                torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            out = body()
        return graph, out

    def _capture_micro(self, state, key, bucket, imgs):
        """Capture the micro-step graph that reads the static batch `imgs` and targets padded to `bucket` boxes
        per image; kept as self.micro[key]."""
        if not self.micro:  # the first capture: give the last warm-up batch's cached blocks back before the
            free_cuda(self.device)  # graph pool takes its own (after bind_grads' copies on the main stream)
        gt = torch.zeros((imgs.shape[0], bucket, 5), dtype=torch.float32, device=imgs.device)
        # cache hits inside: the warm-up's timed algorithms
        graph, (items, finite) = self.capture("the micro-step", lambda: self.micro_body(state, imgs, gt))
        self.micro[key] = m = _Micro(graph, imgs, gt, items, finite)
        self.captures += 1
        return m

    def micro_body(self, state, imgs, gt):
        with torch.autocast("cuda", enabled=state.amp):
            pred = state.model(imgs)
            loss, items = state.loss.padded(pred, gt)
            if state.cfg.quad:
                loss = loss * 4.0
        loss = loss.sum()
        with bn_update_once(state.bn_buffers):  # --ckpt: the recompute's BN update undone inside the graph
            state.scaler.scale(loss).backward()
        return items.detach(), torch.isfinite(loss.detach())

    # -- the optimizer graph -----------------------------------------------------------------------------------

    def _replay_opt(self, state):
        self.bind_grads()
        if self.opt is None:
            self._capture_opt(state)
        self.fused.set_hyper()
        self.window_ok.copy_(state.window.ok)
        self.opt.replay()
        state.window.ok = None  # the window is closed (its gradients zeroed in the graph)
        return self.opt_ok.clone()

    def _capture_opt(self, state):
        self.opt, self.opt_ok = self.capture("the optimizer step", lambda: self.opt_body(state))

    @torch.no_grad()
    def opt_body(self, state):
        """optimizer_step of step.py on the device: the window is applied only when its losses and the clipped
        gradient norm are finite (else no optimizer, EMA or BN-statistics change); scaler update either way."""
        scaler, found = state.scaler, self.found_inf
        found.zero_()
        if state.amp:
            inv_scale = scaler._scale.double().reciprocal().float()
            torch._amp_foreach_non_finite_check_and_unscale_([self.flat], found, inv_scale)
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm=MAX_GRAD_NORM)
        ok = torch.isfinite(norm) & self.window_ok
        skip = (~ok).float()
        self.flat.masked_fill_(~ok, 0.0)  # a skipped window: the update sees zero gradients and keeps every bit
        self.fused.step(skip)
        if state.amp:
            torch._amp_update_scale_(scaler._scale, scaler._growth_tracker, found, scaler._growth_factor,
                                     scaler._backoff_factor, scaler._growth_interval)
        for b, w in zip(state.bn_stats, state.window.bn or []):  # a skipped window's BN updates put back
            b.copy_(torch.where(ok, b, w))
        self.flat.zero_()
        # ModelEMA.update on the device, only for an applied step (its update count too)
        self.ema_u.add_(ok.double())
        d = (state.ema.decay_max * (1.0 - torch.exp(-self.ema_u / state.ema.tau))).float()
        d = torch.where(ok, d, 1.0)
        torch._foreach_mul_(self.ema_v, d)
        torch._foreach_add_(self.ema_v, torch._foreach_mul(self.ema_m, 1.0 - d))
        return ok
