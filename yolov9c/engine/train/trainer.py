"""The training loop of train_dual.py (spec §1.3-1.9), readable top to bottom in train().

    from yolov9c.cli.train import parse_opt
    from yolov9c.engine.train.trainer import train
    train(parse_opt(["--cfg", "gelan-t.yaml", "--img", "160", "--epochs", "3"]))

One iteration: uint8 batch → float/255 on the device (→ multi-scale resize) → forward and loss under autocast
(CUDA + --amp) → loss × WORLD_SIZE (DDP) × 4 (--quad) → scaled backward → every `accumulate` micro-batches:
unscale, clip the gradient norm to 10, optimizer step, EMA update. Warm-up (first max(3 epochs, 100)
iterations) ramps the learning rates, SGD momentum and the accumulation count; the LR schedule steps once per
epoch. Each epoch: validation of the EMA (every --val-period epochs and always the last), fitness
0.1·mAP50 + 0.9·mAP50-95, results.csv row, last.pt / best.pt / epochN.pt. At the end: last.pt and best.pt
stripped (EMA → model, fp16) and best.pt validated with plots.

Backend (--backend, default c on a CUDA GPU, torch on the CPU): yolov9c.backends.apply rewrites the training
model's execution after it is built, placed (device, channels-last with c on CUDA) and copied into the EMA, and
before DDP; parameters and state_dict stay the same, so the EMA, validation and every checkpoint are plain
torch and move freely between backends. --ckpt (per-layer torch.utils.checkpoint) applies to the torch backend
only and is ignored with a warning under c, which already stores one tensor per conv layer.

Checkpoints are written in float32 with the optimizer, GradScaler, RNG states and loop counters, so that
--resume continues exactly where the run stopped (an interrupted then resumed CPU run ends with the same
weights as an uninterrupted one).

Test: python -m pytest -q tests/test_train_e2e.py tests/test_train_resume.py
"""

from __future__ import annotations

import math
import os
import random
import time
import types
from argparse import Namespace
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn

from yolov9c.engine.train import results as R
from yolov9c.engine.train.ema import ModelEMA
from yolov9c.engine.train.optim import build_optimizer
from yolov9c.engine.run_dir import increment_path, latest_last_pt
from yolov9c.engine.train.schedule import lr_lambda, warmup, warmup_accumulate, warmup_iterations

NBS = 64  # nominal batch size: gradients of ~64 images per optimizer step
GIB = 2 ** 30
# options that --resume takes from the command line instead of the stored opt.yaml (memory knobs and placement)
RESUME_OVERRIDES = ("batch_size", "accumulate", "workers", "cache", "device", "pin_memory", "amp", "ckpt",
                    "val_period", "noplots", "backend", "channels_last")


class TrainError(RuntimeError):
    """A user-facing problem (bad data, missing file, bad combination of options): one `error:` line."""


def fitness(mp, mr, map50, map5095):
    """Model fitness for best.pt and early stopping: 0.1 · mAP@0.5 + 0.9 · mAP@0.5:0.95 (published)."""
    return 0.1 * map50 + 0.9 * map5095


# ---------------------------------------------------------------------------------------------------------
# Set-up helpers
# ---------------------------------------------------------------------------------------------------------

def _resolve_resume(opt):
    """opt with --resume applied: the stored options of the run plus the command line's memory knobs."""
    last = latest_last_pt(opt.project if Path(opt.project).exists() else ".") if opt.resume is True \
        else Path(opt.resume)
    if last is None or not Path(last).is_file():
        raise TrainError(f"--resume: no last.pt found ({'under ' + opt.project if opt.resume is True else last})")
    last = Path(last)
    opt_yaml = last.parent.parent / "opt.yaml"
    if not opt_yaml.is_file():
        raise TrainError(f"--resume: {opt_yaml} not found (the run folder of {last})")
    stored = yaml.safe_load(opt_yaml.read_text())
    new = Namespace(**stored)
    for k in RESUME_OVERRIDES:
        if k in getattr(opt, "given", ()):
            setattr(new, k, getattr(opt, k))
    new.given = list(getattr(opt, "given", ()))
    new.resume, new.weights, new.cfg = str(last), str(last), ""
    return new


def _select_device(spec, local_rank):
    spec = str(spec).strip().lower().replace("cuda:", "")
    if spec == "cpu" or not torch.cuda.is_available():
        if spec not in ("", "cpu"):
            raise TrainError(f"--device {spec}: CUDA is not available on this machine; use --device cpu")
        return torch.device("cpu")
    if local_rank >= 0:
        return torch.device("cuda", local_rank)
    if spec == "":
        return torch.device("cuda", 0)
    ids = [int(s) for s in spec.split(",") if s.strip()]
    return torch.device("cuda", ids[0])


def _init_seeds(seed, deterministic):
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def _rng_state():
    py = random.getstate()
    npst = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": [py[0], list(py[1]), py[2]],
            "numpy": [npst[0], npst[1].tolist(), int(npst[2]), int(npst[3]), float(npst[4])],
            "cuda": [s for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else []}


def _set_rng_state(st):
    torch.set_rng_state(st["torch"])
    random.setstate((st["python"][0], tuple(st["python"][1]), st["python"][2]))
    n = st["numpy"]
    np.random.set_state((n[0], np.array(n[1], np.uint32), n[2], n[3], n[4]))
    if torch.cuda.is_available() and st.get("cuda") and len(st["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(st["cuda"])


def _freeze(model, freeze):
    """--freeze N → layers 0..N-1; several values → exactly those layer indices."""
    idx = range(freeze[0]) if len(freeze) == 1 else freeze
    prefixes = [f"model.{x}." for x in idx]
    frozen = 0
    for k, v in model.named_parameters():
        v.requires_grad = True  # train all layers (as published; the DFL conv has no gradient anyway)
        if any(k.startswith(p) for p in prefixes):
            v.requires_grad = False
            frozen += 1
    return frozen


def _checkpointed_forward(self, x):
    """DetectionModel.forward with each layer wrapped in torch.utils.checkpoint (--ckpt): a layer's inner
    activations are recomputed in backward instead of stored."""
    from torch.utils.checkpoint import checkpoint

    y = []
    for m in self.model:
        if m.f != -1:
            x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
        if self.training and torch.is_grad_enabled() and m is not self.model[-1]:
            x = checkpoint(m, x, use_reentrant=False)
        else:
            x = m(x)
        y.append(x if m.i in self.save else None)
    return x


def _resolve_backend(opt, device, world, log):
    """The backend to train with: --backend as given, else c on a CUDA GPU and torch on the CPU. c needs the
    built extension (unless YOLOV9C_FUSED=0 routes every op to its torch reference) and computes BatchNorm
    statistics per process, so --sync-bn under DDP keeps the torch backend (an error when c was asked for)."""
    auto = opt.backend is None
    backend = ("c" if device.type == "cuda" else "torch") if auto else opt.backend
    if backend == "c" and world > 1 and opt.sync_bn:
        if not auto:
            raise TrainError("--backend c does not synchronise BatchNorm statistics across processes (--sync-bn); "
                             "use --backend torch with --sync-bn")
        log("WARNING: --sync-bn: the c backend does not synchronise BatchNorm statistics; using --backend torch")
        backend = "torch"
    if backend == "c":
        from yolov9c.ops.extension import fused_enabled, load
        if fused_enabled():
            try:
                load()
            except ImportError as e:
                raise TrainError(f"--backend c: {e}") from None
    return backend


def _apply_backend(model, backend):
    """yolov9c.backends.apply(model, backend): the same module, parameters and state_dict, other execution.
    The optimizer already holds the parameters, so a backend that replaced them would train nothing: checked."""
    try:
        from yolov9c.backends import apply
    except ImportError as e:
        raise TrainError(f"--backend {backend}: yolov9c.backends is not available in this installation ({e})") \
            from None
    before = [id(p) for p in model.parameters()]
    out = apply(model, backend)
    model = model if out is None else out
    if [id(p) for p in model.parameters()] != before:
        raise RuntimeError(f"yolov9c.backends.apply(model, {backend!r}) replaced the model's parameters")
    return model


def _bn_buffers(model):
    return [b for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
            for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]


# ---------------------------------------------------------------------------------------------------------
# train()
# ---------------------------------------------------------------------------------------------------------

def train(opt, *, stop_after_epoch=None, log=print):
    """Run a training as train_dual.py does. opt: the Namespace of yolov9c.cli.train.parse_opt.
    stop_after_epoch: stop (as if interrupted) after saving that epoch's last.pt (tests of --resume).
    Returns a dict: save_dir (Path), epochs_done, best_fitness, and the last validation's metrics."""
    from yolov9c.cli.train import resolve_hyp_path
    from yolov9c.data.dataset import DataError
    from yolov9c.data.dataset_yaml import DataConfigError, load_data_config
    from yolov9c.data.hyp import augment_hyp
    from yolov9c.data.loader import create_dataloader
    from yolov9c.loss.detection import make_loss
    from yolov9c.models.checkpoint import (CheckpointError, atomic_torch_save, make_checkpoint, read_checkpoint,
                                           strip_checkpoint, to_plain, transfer_weights)
    from yolov9c.models.model import DetectionModel

    # --- distributed set-up (torchrun sets these) ---
    local_rank = int(os.getenv("LOCAL_RANK", -1))
    rank = int(os.getenv("RANK", -1))
    world = int(os.getenv("WORLD_SIZE", 1))
    main_proc = rank in (-1, 0)
    if not main_proc:
        log = _silent

    ckpt = None
    if opt.resume:
        opt = _resolve_resume(opt)
        try:
            ckpt = read_checkpoint(opt.resume)
        except (FileNotFoundError, CheckpointError) as e:
            raise TrainError(str(e)) from None
        if ckpt.get("optimizer") is None or ckpt.get("epoch", -1) < 0:
            raise TrainError(f"--resume {opt.resume}: this checkpoint is stripped (training finished); nothing "
                             f"to resume")
    device = _select_device(opt.device, local_rank)
    if world > 1:
        import torch.distributed as dist
        if opt.image_weights:
            raise TrainError("--image-weights is not compatible with DDP (as published)")
        if opt.batch_size % world:
            raise TrainError(f"--batch-size {opt.batch_size} must be a multiple of WORLD_SIZE {world}")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    cuda = device.type == "cuda"
    amp = cuda and bool(opt.amp)
    # resolved values go to opt.yaml (and so to --resume)
    opt.backend = _resolve_backend(opt, device, world, log)
    if getattr(opt, "channels_last", None) is None:
        opt.channels_last = cuda and opt.backend == "c"
    memory_format = torch.channels_last if opt.channels_last else torch.contiguous_format
    # a generation of --evolve (yolov9c/engine/train/evolve.py): no hyp.yaml/opt.yaml, checkpoints or plots
    evolving = getattr(opt, "evolve", None) is not None

    # --- run folder, hyp ---
    if ckpt is not None:
        save_dir = Path(opt.resume).parent.parent
    else:
        name = Path(opt.cfg).stem if opt.name == "cfg" else opt.name
        save_dir = increment_path(Path(opt.project) / name, exist_ok=opt.exist_ok)
    wdir = save_dir / "weights"
    try:
        hyp_file = resolve_hyp_path(opt.hyp) if isinstance(opt.hyp, str) else None
        hyp = augment_hyp(hyp_file if hyp_file else opt.hyp, mosaic=opt.mosaic, mixup=opt.mixup)
    except (FileNotFoundError, KeyError, ValueError) as e:
        raise TrainError(f"--hyp: {e}") from None
    if ckpt is not None and isinstance(ckpt.get("hyp"), dict):
        hyp = dict(ckpt["hyp"])  # the run's own (already weight-decay-scaled) values
    hyp["anchor_t"] = 5.0  # forced as published (anchor-free heads do not read it)
    opt.save_dir = str(save_dir)
    opt.world_size, opt.global_rank = world, rank  # as published (opt.yaml records them)
    if main_proc:
        (save_dir if evolving else wdir).mkdir(parents=True, exist_ok=True)
        if ckpt is None and not evolving:
            (save_dir / "hyp.yaml").write_text(yaml.safe_dump(to_plain(hyp), sort_keys=False))
            stored = {k: v for k, v in vars(opt).items() if k != "given"}
            stored["hyp"] = hyp
            (save_dir / "opt.yaml").write_text(yaml.safe_dump(to_plain(stored), sort_keys=False))
        log("train_dual: " + ", ".join(f"{k}={v}" for k, v in vars(opt).items() if k != "given"))
        log("hyperparameters: " + ", ".join(f"{k}={v}" for k, v in hyp.items()))
    hyp["label_smoothing"] = float(opt.label_smoothing)
    _init_seeds(opt.seed + 1 + rank, opt.deterministic)

    # --- data config, model ---
    try:
        data = load_data_config(opt.data)
    except (DataConfigError, FileNotFoundError) as e:
        raise TrainError(str(e)) from None
    nc = 1 if opt.single_cls else int(data["nc"])
    names = ["item"] if opt.single_cls and len(data["names"]) != 1 else list(data["names"])
    pretrained = str(opt.weights).endswith(".pt")
    if pretrained:
        try:
            wck = ckpt if ckpt is not None else read_checkpoint(opt.weights)
        except (FileNotFoundError, CheckpointError) as e:
            raise TrainError(f"--weights: {e}") from None
        spec = opt.cfg or wck.get("yaml")
        if not spec:
            raise TrainError(f"--weights {opt.weights} stores no model yaml: give --cfg")
        model = _build(DetectionModel, spec, nc)
        if ckpt is not None:
            model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ckpt["model"].items()})
        else:
            sd = wck.get("ema") or wck.get("model")
            transfer_weights(model, {k: v.float() for k, v in sd.items()},
                             exclude=("anchor",) if opt.cfg else (), source=str(opt.weights))
    else:
        model = _build(DetectionModel, opt.cfg, nc)
    model = model.to(device, memory_format=memory_format)
    n_frozen = _freeze(model, opt.freeze)
    if n_frozen:
        log(f"freezing {n_frozen} parameter tensors of layers {opt.freeze}")
    gs = max(int(model.stride.max()), 32)
    imgsz = max(math.ceil(opt.imgsz / gs) * gs, gs * 2)
    if imgsz != opt.imgsz:
        log(f"WARNING: --img-size {opt.imgsz} must be a multiple of max stride {gs}, updating to {imgsz}")

    # --- batch, accumulation, optimizer, schedule ---
    if opt.batch_size == -1:  # AutoBatch (yolov9c/engine/train/autobatch.py): before the loaders and the weight decay
        if world > 1:
            raise TrainError("--batch-size -1 (AutoBatch) is single-GPU only (as published): give a batch size")
        from yolov9c.engine.train.autobatch import autobatch
        opt.batch_size = autobatch(model, imgsz, hyp, device, backend=opt.backend, amp=amp, log=log)
    batch_size = opt.batch_size
    if ckpt is not None and "accumulate" not in opt.given and ckpt.get("nominal_batch"):
        nominal = ckpt["nominal_batch"]  # resume with another --batch-size keeps the run's nominal batch
        fixed_accumulate = max(round(nominal / batch_size), 1) if opt.accumulate else None
        if fixed_accumulate:
            opt.accumulate = fixed_accumulate
    else:
        fixed_accumulate = opt.accumulate  # --accumulate N: N micro-batches per step from the first iteration
        nominal = batch_size * opt.accumulate if opt.accumulate else NBS
    accumulate = fixed_accumulate or max(round(nominal / batch_size), 1)
    if ckpt is not None:
        old_nominal = ckpt.get("nominal_batch") or nominal
        old_batch = int((ckpt.get("opt") or {}).get("batch_size") or batch_size)
        log(f"Resuming with --batch-size {batch_size} (was {old_batch}) x accumulate "
            f"{fixed_accumulate or 'warm-up ramp to ' + str(accumulate)} = nominal batch {nominal}")
        if nominal != old_nominal:
            log(f"WARNING: the nominal batch changes from {old_nominal} to {nominal} images per optimizer step "
                f"(--batch-size x --accumulate); weight decay stays scaled for {old_nominal}. Keep "
                f"--batch-size x --accumulate = {old_nominal} to continue the run unchanged")
        if main_proc:  # as published, opt.yaml is rewritten on resume: it now shows the new memory knobs
            stored = {k: v for k, v in vars(opt).items() if k != "given"}
            old = yaml.safe_load((save_dir / "opt.yaml").read_text()) or {}
            stored["hyp"] = old.get("hyp", hyp)
            (save_dir / "opt.yaml").write_text(yaml.safe_dump(to_plain(stored), sort_keys=False))
    if ckpt is None:
        hyp["weight_decay"] *= batch_size * accumulate / NBS
    optimizer = build_optimizer(model, opt.optimizer, hyp["lr0"], hyp["momentum"], hyp["weight_decay"], log=log)
    kind = "cos" if opt.cos_lr else "flat-cos" if opt.flat_cos_lr else "fixed" if opt.fixed_lr else "linear"
    lf = lr_lambda(kind, opt.epochs, hyp["lrf"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)
    ema = ModelEMA(model) if main_proc else None
    scaler = torch.amp.GradScaler("cuda", enabled=amp)

    start_epoch, best_fitness, best_epoch, last_opt_step = 0, 0.0, 0, -1
    metrics = [0.0] * 7  # P, R, mAP50, mAP50-95, val box, cls, dfl (carried over epochs without validation)
    maps = np.zeros(nc)
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        if ema is not None and ckpt.get("ema"):
            ema.ema.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ckpt["ema"].items()})
            ema.updates = int(ckpt.get("updates") or 0)
        if ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        start_epoch = int(ckpt["epoch"]) + 1
        best_fitness = float(ckpt.get("best_fitness") or 0.0)
        best_epoch = int(ckpt.get("best_epoch", 0))
        last_opt_step = int(ckpt.get("last_opt_step", -1))
        metrics = list(ckpt.get("metrics") or metrics)
        if ckpt.get("maps") is not None:
            maps = np.asarray(ckpt["maps"], np.float64)
        if start_epoch >= opt.epochs:
            raise TrainError(f"--resume: {opt.resume} already trained {start_epoch} of {opt.epochs} epochs")
        log(f"Resuming training from {opt.resume} from epoch {start_epoch} to {opt.epochs} total epochs")
    scheduler.last_epoch = start_epoch - 1

    if world > 1 and opt.sync_bn and cuda:  # as published: CUDA only (torch's SyncBatchNorm refuses CPU input)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        log("Using SyncBatchNorm()")
    elif opt.sync_bn:
        log("WARNING: --sync-bn only applies under DDP (torchrun) on CUDA devices; ignored")

    # --- data loaders ---
    per_rank = batch_size // world
    try:
        train_loader, dataset = create_dataloader(
            data["train"], imgsz, per_rank, gs, single_cls=opt.single_cls, hyp=hyp, augment=True,
            cache=None if opt.cache == "val" else opt.cache, rect=opt.rect, rank=local_rank if world > 1 else -1,
            world_size=world, workers=opt.workers, image_weights=opt.image_weights, min_items=opt.min_items,
            prefix="train: ", shuffle=True, seed=opt.seed, pin_memory=opt.pin_memory, nc=int(data["nc"]), log=log)
        val_loader = None
        if main_proc:
            val_loader, _ = create_dataloader(
                data["val"], imgsz, per_rank, gs, single_cls=opt.single_cls, hyp=hyp, augment=False,
                cache=None if opt.noval else ("ram" if opt.cache == "val" else opt.cache), rect=True, pad=0.5,
                workers=opt.workers * 2, prefix="val: ", seed=opt.seed, pin_memory=opt.pin_memory, nc=int(data["nc"]),
                log=log)
    except (DataError, ValueError) as e:
        raise TrainError(str(e)) from None
    nb = len(train_loader)
    if ckpt is not None and old_batch != batch_size:
        # iteration numbers ni count batches of the new size now; gradients are zeroed at every epoch start, so
        # the first step of the resumed epoch comes after `accumulate` micro-batches
        last_opt_step = nb * start_epoch - 1
    plots = main_proc and not opt.noplots and not evolving
    if plots and ckpt is None:
        log(f"Plotting labels to {save_dir / 'labels.jpg'}... ")
        R.plot_labels(dataset.labels, names, save_dir / "labels.jpg")
    if ckpt is None:
        model.half().float()  # as published, not on resume: weights rounded to fp16 values (the EMA copy is not)

    # --- model attributes, loss ---
    model.nc, model.names, model.hyp = nc, names, hyp
    from yolov9c.data.image_weights import class_weights
    model.class_weights = torch.from_numpy(class_weights(dataset.labels, nc)).float().to(device) * nc
    compute_loss = make_loss(model, hyp, backend=opt.backend)  # reads the plain head: before the backend rewrites execution
    # the backend goes on last, after EMA (a plain copy), half().float() and the loss, before DDP
    log(f"backend: {opt.backend}{', channels-last' if opt.channels_last else ''}")
    if opt.backend != "torch":
        model = _apply_backend(model, opt.backend)
    ckpt_layers = opt.ckpt and opt.backend == "torch"
    if opt.ckpt and not ckpt_layers:
        log(f"WARNING: --ckpt is torch-backend checkpointing; --backend {opt.backend} already stores one tensor "
            f"per layer and recomputes the rest: --ckpt ignored")
    if ckpt_layers:
        model.forward = types.MethodType(_checkpointed_forward, model)
    bn_buffers = _bn_buffers(model) if ckpt_layers else []
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[local_rank] if cuda else None, static_graph=True)

    # --- training ---
    nw = warmup_iterations(hyp["warmup_epochs"], nb)
    stopper_patience = opt.patience or float("inf")
    epochs = opt.epochs
    log(f"Image sizes {imgsz} train, {imgsz} val\nUsing {train_loader.num_workers} dataloader workers\n"
        f"Logging results to {save_dir}\nStarting training for {epochs} epochs...")
    tb = _tensorboard(save_dir, log) if main_proc and not evolving else None
    t_start = time.time()
    epoch = start_epoch - 1
    stop = False
    for epoch in range(start_epoch, epochs):
        model.train()
        dataset.mosaic = dataset.augment and not dataset.rect and not (opt.close_mosaic and
                                                                         epoch >= epochs - opt.close_mosaic)
        if opt.image_weights:
            cw = class_weights(dataset.labels, nc) * nc * (1 - maps) ** 2 / nc
            from yolov9c.data.image_weights import image_weights
            train_loader.sampler.weights = image_weights(dataset.labels, nc, cw)
        train_loader.sampler.set_epoch(epoch)
        ms_rng = np.random.default_rng([opt.seed & 0xFFFFFFFF, epoch, 0x5CA1E])
        mloss = torch.zeros(3, device=device)
        optimizer.zero_grad()
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        header = ("%11s" * 8) % ("Epoch", "GPU_mem", "box_loss", "cls_loss", "dfl_loss", "Instances", "Size",
                                 "peak_mem")
        log(header)
        pbar = enumerate(train_loader)
        if main_proc:
            from tqdm import tqdm
            pbar = tqdm(pbar, total=nb, bar_format="{l_bar}{bar:10}| {n_fmt}/{total_fmt} {elapsed}")
        t_epoch, n_images = time.time(), 0
        for i, (imgs, targets, _paths, _shapes) in pbar:
            ni = i + nb * epoch
            if plots and ni < 3:
                R.plot_train_batch(imgs, targets, save_dir / f"train_batch{ni}.jpg", names)
            imgs = imgs.to(device, non_blocking=True).contiguous(memory_format=memory_format).float() / 255
            n_images += imgs.shape[0]
            if ni <= nw:  # warm-up
                if not fixed_accumulate:
                    accumulate = warmup_accumulate(ni, nw, nominal, batch_size)
                warmup(optimizer, ni, nw, epoch, lf, hyp)
            if opt.multi_scale:
                from yolov9c.data.multi_scale import multi_scale
                imgs = multi_scale(imgs, imgsz, gs, ms_rng)

            with torch.autocast(device.type, enabled=amp):
                pred = model(imgs)
                loss, loss_items = compute_loss(pred, targets)  # host targets: the loss copies them (c: one pinned copy, no sync)
                if world > 1:
                    loss = loss * world  # DDP averages gradients over ranks; the loss is a per-rank sum
                if opt.quad:
                    loss = loss * 4.0
            saved = [b.clone() for b in bn_buffers]
            scaler.scale(loss.sum()).backward()
            for b, s in zip(bn_buffers, saved):  # --ckpt re-ran the forward: undo its second BN update
                b.copy_(s)

            if ni - last_opt_step >= accumulate:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                if ema is not None:
                    ema.update(model)
                last_opt_step = ni

            if main_proc:
                mloss = (mloss * i + loss_items.detach().to(device)) / (i + 1)
                mem = torch.cuda.memory_reserved(device) / 1e9 if cuda else 0.0
                peak = torch.cuda.max_memory_allocated(device) / 1e9 if cuda else 0.0
                pbar.set_description(("%11s" * 2 + "%11.4g" * 5 + "%11s") % (
                    f"{epoch}/{epochs - 1}", f"{mem:.3g}G", *mloss.tolist(), targets.shape[0], imgs.shape[-1],
                    f"{peak:.3g}G"))
        train_s = time.time() - t_epoch
        lr = [g["lr"] for g in optimizer.param_groups]
        scheduler.step()

        if main_proc:
            final_epoch = epoch + 1 == epochs
            ema.update_attr(model)
            if (not opt.noval and (epoch + 1) % opt.val_period == 0) or final_epoch:
                res = _validate(ema.ema, val_loader, nc, names, amp, opt.single_cls, compute_loss, save_dir, log)
                metrics = [res["mp"], res["mr"], res["map50"], res["map"], res["box_loss"], res["cls_loss"],
                           res["dfl_loss"]]
                maps = np.asarray(res["maps"], np.float64)
            fi = fitness(*metrics[:4])
            if fi >= best_fitness:
                best_epoch = epoch
            stop = epoch - best_epoch >= stopper_patience
            if fi > best_fitness:
                best_fitness = fi
            peak = torch.cuda.max_memory_allocated(device) / GIB if cuda else 0.0
            reserved = torch.cuda.memory_reserved(device) / GIB if cuda else 0.0
            row = [epoch, *mloss.tolist(), *metrics, *lr, peak, reserved, train_s,
                   n_images * world / max(train_s, 1e-9)]
            R.append_row(save_dir / "results.csv", row)
            if tb is not None:
                for k, v in zip(R.COLUMNS[1:], row[1:]):
                    tb.add_scalar(k, v, epoch)
            if ((not opt.nosave) or final_epoch) and not evolving:
                ck = make_checkpoint(model, ema=ema, optimizer=optimizer, epoch=epoch, opt=_plain_opt(opt), hyp=hyp,
                                     best_fitness=best_fitness, half=False)
                ck.update(scaler=scaler.state_dict(), rng=_rng_state(), last_opt_step=last_opt_step,
                          best_epoch=best_epoch, metrics=metrics, maps=maps.tolist(),
                          nominal_batch=nominal)
                atomic_torch_save(ck, wdir / "last.pt")
                if best_fitness == fi:
                    atomic_torch_save(ck, wdir / "best.pt")
                if opt.save_period > 0 and epoch % opt.save_period == 0:
                    atomic_torch_save(ck, wdir / f"epoch{epoch}.pt")
                del ck
            if stop:
                log(f"Stopping training early as no improvement observed in last {opt.patience} epochs. "
                    f"Best results observed at epoch {best_epoch}, best model saved as best.pt.")
        if world > 1:  # every rank stops together
            import torch.distributed as dist
            flag = torch.tensor([int(stop)], device=device)
            dist.broadcast(flag, 0)
            stop = bool(flag.item())
        if stop or (stop_after_epoch is not None and epoch >= stop_after_epoch):
            break

    out = {"save_dir": save_dir, "epochs_done": epoch + 1, "best_fitness": best_fitness,
           "metrics": dict(zip(("mp", "mr", "map50", "map", "box_loss", "cls_loss", "dfl_loss"), metrics))}
    if stop_after_epoch is not None and epoch + 1 < epochs and not stop:
        return out  # simulated interruption: no strip, no final validation
    if main_proc:
        log(f"\n{epoch - start_epoch + 1} epochs completed in {(time.time() - t_start) / 3600:.3f} hours.")
        for f in (wdir / "last.pt", wdir / "best.pt"):
            if f.exists():
                strip_checkpoint(f)
                log(f"Optimizer stripped from {f}, {f.stat().st_size / 1e6:.1f}MB")
        best = wdir / "best.pt"
        if best.exists() and not opt.noval:
            from yolov9c.models.checkpoint import load_model
            log(f"\nValidating {best}...")
            from yolov9c.engine.val.coco import coco_layout
            is_coco, anno, class_map, ids = coco_layout(data, data["val"], val_loader.dataset.im_files)
            coco = dict(save_json=True, anno_json=anno, class_map=class_map, image_ids=ids,
                        json_name="_predictions.json") if is_coco else {}  # COCO data only, as published
            res = _validate(load_model(best).to(device), val_loader, nc, names, amp, opt.single_cls, compute_loss,
                            save_dir, log, plots=plots, verbose=True, **coco)
            out["final"] = res
        if plots and (save_dir / "results.csv").exists():
            R.plot_results(save_dir / "results.csv")
        log(f"Results saved to {save_dir}")
        if tb is not None:
            tb.close()
    if world > 1:
        import torch.distributed as dist
        dist.destroy_process_group()
    return out


def _build(cls, spec, nc):
    try:
        return cls(spec, nc=nc)
    except FileNotFoundError as e:
        raise TrainError(f"--cfg: {e}") from None
    except (ValueError, TypeError, KeyError) as e:
        raise TrainError(f"--cfg {spec if isinstance(spec, str) else '(stored yaml)'}: {e}") from None


def _plain_opt(opt):
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opt).items()}


def _validate(model, loader, nc, names, amp, single_cls, compute_loss, save_dir, log, plots=False, verbose=False,
              **coco):
    from yolov9c.engine.val.validator import validate

    return validate(model, loader, nc=nc, names=names, half=amp, single_cls=single_cls, compute_loss=compute_loss,
                    save_dir=save_dir, plots=plots, verbose=verbose, log=log, training=True, **coco)


def _tensorboard(save_dir, log):
    """A SummaryWriter on the run folder when TensorBoard is installed (as published), else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    log(f"TensorBoard: Start with 'tensorboard --logdir {save_dir.parent}', view at http://localhost:6006/")
    return SummaryWriter(str(save_dir))


def _silent(*args, **kwargs):
    pass
