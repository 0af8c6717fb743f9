"""Set-up of a training run: RunConfig → RunState (the built run) + Progress (what a checkpoint carries).

    state = setup(cfg, log=print)      # yolov9c/engine/train/trainer.py's train() starts here

setup() order: resume (read_resume) → placement (device, DDP, backend, channels-last) → the YOLOV9C_* switch
variables (config.switch_overrides) → run folder claimed → config resolved once (resolve_config: a frozen
RunConfig) → folder contents, hyp, seeds → model → memory plan (plan_memory: --mem-budget; auto resolves its
choices into the config) → optimization (batching.plan_batching once; optimizer, schedule, EMA, scaler) →
loaders → execution (loss, backend, --ckpt, DDP, the Step) → restore (resume.py) → the run folder begun
(begin_run: its files written only now). A --resume whose training ended stops after the model
(setup_finish_only). A failed start releases the folder, removes one it created and leaves another as it was.
Invariant: RunState is written by set-up only, then sealed (assignment raises, except REPLACEABLE fields);
what changes while training lives in `progress` (Progress: exactly what a checkpoint saves and resume
restores) and `window` (step.Window: the open accumulation window, never saved).
Test: python -m pytest -q tests/engine/train/test_train_e2e.py tests/engine/train/test_resume.py
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import random
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from yolov9c.backends import accepts_uint8
from yolov9c.backends import apply as apply_backend
from yolov9c.data.dataset import DataError, DatasetConfig
from yolov9c.data.dataset_yaml import DataConfigError, load_data_config
from yolov9c.data.hyp import augment_hyp
from yolov9c.data.image_cache import total_ram
from yolov9c.data.image_weights import class_weights
from yolov9c.data.loader import LoaderConfig, create_dataloader
from yolov9c.engine.run_dir import increment_path
from yolov9c.engine.train import memory_auto, memory_plan
from yolov9c.engine.train import results as R
from yolov9c.engine.train.autobatch import autobatch
from yolov9c.engine.train.batching import NBS, Batching, batch_error, plan_batching
from yolov9c.engine.train.config import SWITCH_ENV, ConfigError, RunConfig, opt_dict, switch_overrides, switches
from yolov9c.engine.train.ema import ModelEMA
from yolov9c.engine.train.errors import TrainError
from yolov9c.engine.train.graph_shapes import select_step
from yolov9c.engine.train.guards import StepGuard
from yolov9c.engine.train.layer_ckpt import bn_buffers, checkpointed_forward
from yolov9c.engine.train.memory_cap import PhasePeaks, apply_cap, release_cap
from yolov9c.engine.train.optim import build_optimizer
from yolov9c.engine.train.resume import Resumed, read_resume, restore
from yolov9c.engine.train.run_folder import STATE_NAME as RUN_STATE_NAME
from yolov9c.engine.train.run_folder import RunFolder, check_writable
from yolov9c.engine.train.schedule import lr_lambda, warmup_iterations
from yolov9c.engine.train.step import EagerStep, Step, Window
from yolov9c.engine.train.val_chunks import ValChunks
from yolov9c.loss.detection import make_loss
from yolov9c.models.checkpoint import CheckpointError, read_checkpoint, to_plain
from yolov9c.models.finite import nonfinite_names, nonfinite_text
from yolov9c.models.published import weights_file_error
from yolov9c.models.weights import transfer_weights
from yolov9c.models.info import model_summary
from yolov9c.models.model import DetectionModel
from yolov9c.ops import extension
from yolov9c.resources import TRAIN_KEYS, resolve_hyp
from yolov9c.units import GIB

__all__ = ["NBS", "Progress", "RunState", "cpu_threads", "make_val_loader", "setup"]


@dataclass
class Progress:
    """The run's progress: everything a checkpoint stores besides the built objects' state_dicts (and the
    epoch, passed on its own), and what --resume restores (resume.restore; the micro-batch by
    resume.restore_micro_batch, which keeps it only when it still splits the loader batch)."""
    start_epoch: int = 0  # the first epoch this process trains (a resumed run's: the checkpoint's epoch + 1)
    best_fitness: float = 0.0
    best_epoch: int = 0
    last_opt_step: int = -1  # iteration ni of the last optimizer step
    metrics: list = field(default_factory=lambda: [0.0] * 7)  # P, R, mAP50, mAP50-95, val box, cls, dfl
    maps: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per-class mAP50-95
    micro_batch: int | None = None  # images per forward/backward on this rank (None: the loader batch);
    #                                 --mem-budget sets it, the out-of-memory back-off halves it (guards.py)

    def checkpoint_fields(self) -> dict:
        """The checkpoint's counters (best_fitness goes to make_checkpoint itself)."""
        return dict(last_opt_step=self.last_opt_step, best_epoch=self.best_epoch, metrics=self.metrics,
                    maps=self.maps.tolist(), micro_batch=self.micro_batch)

    def load_checkpoint(self, ck):
        """The counters of checkpoint `ck` (read_checkpoint's dict); the micro-batch is left to the caller."""
        self.start_epoch = int(ck["epoch"]) + 1
        self.best_fitness = float(ck.get("best_fitness") or 0.0)
        self.best_epoch = int(ck.get("best_epoch", 0))
        self.last_opt_step = int(ck.get("last_opt_step", -1))
        self.metrics = list(ck.get("metrics") or self.metrics)
        if ck.get("maps") is not None:
            self.maps = np.asarray(ck["maps"], np.float64)


REPLACEABLE = ("val_loader", "tb",  # the validation OOM retry's smaller loader; TensorBoard, made as the loop starts
               "folder", "made_dir")  # released by abandon_run_folder (a failed start, Ctrl-C before epoch 0 saved)


@dataclass
class RunState:
    cfg: RunConfig  # the resolved options (frozen: resolve_config; the caller's RunConfig stays as given)
    log: Callable = print
    resumed: Resumed | None = None  # the checkpoint resumed from (None for a fresh run); dropped after restore
    # --- placement ---
    device: torch.device = torch.device("cpu")
    world: int = 1  # DDP processes (WORLD_SIZE)
    rank: int = -1  # global rank (-1 without DDP)
    local_rank: int = -1
    main: bool = True  # rank -1 or 0: the process that validates, logs and writes files
    amp: bool = False  # fp16 autocast + GradScaler (CUDA and --amp)
    memory_format: torch.memory_format = torch.contiguous_format
    uint8_input: bool = False  # the model reads the uint8 batch itself (c backend, no --multi-scale): no float copy
    # --- run folder ---
    save_dir: Path = Path()
    wdir: Path = Path()  # save_dir / weights
    folder: RunFolder | None = None  # run_folder.py: the held run folder (main process, not --evolve)
    made_dir: bool = False  # this start created save_dir (a failed start removes it again)
    finish_only: bool = False  # --resume of a run whose training ended: only strip, validate and plot
    evolving: bool = False  # a generation of --evolve: no hyp.yaml/opt.yaml, checkpoints or plots
    plots: bool = False
    # --- data and model ---
    hyp: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)  # the data config (train, val, nc, names)
    nc: int = 0
    names: list = field(default_factory=list)
    gs: int = 32  # grid size: max stride, at least 32
    imgsz: int = 640
    model: nn.Module | None = None  # the training model (backend applied, maybe DDP-wrapped)
    ema: ModelEMA | None = None  # main process only
    loss: Callable | None = None  # loss(preds, targets) → (loss (3,) × batch, items (3,)); make_loss
    bn_buffers: list = field(default_factory=list)  # --ckpt: BN statistics restored after the recomputed forward
    bn_stats: list = field(default_factory=list)  # every BN statistic: a skipped (non-finite) step puts them back
    params: list | None = None  # the model's parameters in model.parameters() order, listed once (the eager step
    #                             clips their gradients every step; None: read from the model each time)
    # --- optimization ---
    batching: Batching | None = None  # batching.py: batch size, nominal batch, accumulation rule (None: finish-only)
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None  # LambdaLR over lf, stepped once per epoch
    lf: Callable | None = None  # epoch → LR factor
    scaler: torch.amp.GradScaler | None = None
    plan: Any = None  # --mem-budget (numeric or auto): the memory_plan.Plan applied (None without)
    peaks: PhasePeaks | None = None  # memory_cap.py: peak GPU memory per phase of the run (set-up on)
    val_chunks: ValChunks | None = None  # --val-chunks auto: validation's chunk per pass (val_chunks.py)
    # --- loaders ---
    train_loader: Any = None
    val_loader: Any = None  # main process only (the validation OOM retry replaces it with a smaller batch)
    dataset: Any = None  # the training dataset
    nb: int = 0  # batches per epoch
    nw: int = 0  # warm-up iterations
    # --- the loop's parts ---
    step: Step = field(default_factory=EagerStep)  # step.py's Step protocol, chosen once (graph_shapes.select_step)
    guard: StepGuard | None = None  # guards.py: the loop calls guard.step (OOM back-off, non-finite count)
    tb: Any = None  # TensorBoard SummaryWriter or None (made when the loop starts)
    # --- what changes while training ---
    progress: Progress = field(default_factory=Progress)  # checkpointed
    window: Window = field(default_factory=Window)  # the open accumulation window (step.py), never saved

    def __setattr__(self, name, value):
        if self.__dict__.get("_sealed") and name not in REPLACEABLE:
            raise AttributeError(f"RunState.{name} is built once by set-up (state.py); what changes while training "
                                 f"is in state.progress and state.window (tests and benchmarks: swap_part)")
        object.__setattr__(self, name, value)

    def seal(self):
        """The end of set-up: from here on only REPLACEABLE fields may be assigned."""
        object.__setattr__(self, "_sealed", True)

    def swap_part(self, name, value):
        """Test and benchmark hook: replace a built part of a set-up run (a GradScaler with another scale, a
        GraphStep with other settings). Training code never calls it."""
        if name not in {f.name for f in dataclasses.fields(self)}:
            raise AttributeError(f"RunState has no field {name!r}")
        object.__setattr__(self, name, value)

    def recorded_opt(self, hyp=None) -> dict:
        """The options a checkpoint and a resumed opt.yaml record: cfg with the batch set-up chose (AutoBatch's
        batch size, a resume's re-derived --accumulate)."""
        cfg = self.cfg
        if self.batching is not None:
            cfg = dataclasses.replace(cfg, batch_size=self.batching.batch_size,
                                      accumulate=self.batching.fixed_accumulate)
        return opt_dict(cfg, hyp)


def setup(cfg: RunConfig, log=print, prog="train_dual.py") -> RunState:
    """Build every object of the run from `cfg` (see the module docstring for the order). A start that fails
    after the run folder was claimed releases it (and removes a folder it created and only filled with its own
    start-up files), then re-raises. prog: the script, whose stem prefixes the options line (`train: ...`)."""
    resumed = read_resume(cfg, log) if cfg.resume else None
    given = resumed.cfg if resumed else cfg
    place = placement(given, log)
    try:
        given = switch_overrides(given, log=place["log"])  # a variable wins over an untyped option, logged
    except ConfigError as e:
        raise TrainError(str(e)) from None
    save_dir, made_dir = claim_run_dir(given, resumed, place["main"])
    resolved = resolve_config(given, place.pop("backend"), place.pop("channels_last"), save_dir, place)
    state = RunState(cfg=resolved, resumed=resumed, save_dir=save_dir, wdir=save_dir / "weights",
                     made_dir=made_dir, evolving=given.evolve is not None, **place)
    state.memory_format = torch.channels_last if state.cfg.channels_last else torch.contiguous_format
    apply_cap(state.cfg, state.device, state.log)  # --mem-cap / --mem-budget: before anything reaches the GPU
    state.peaks = PhasePeaks(state.device)
    early = cpu_threads(0, cuda=True) if state.device.type == "cuda" else None
    if early:  # already for the model build (CUDA_MAIN_THREADS); setup_loaders logs the final count
        torch.set_num_threads(early)
    try:
        setup_run_folder(state, prog)
        setup_model(state)
        if state.finish_only:
            setup_finish_only(state)
            state.val_chunks = ValChunks.for_run(state)
            begin_run(state)
            state.seal()
            return state
        plan_memory(state)
        setup_optimization(state)
        setup_loaders(state)
        setup_execution(state)
        state.val_chunks = ValChunks.for_run(state)
        if resumed is not None:
            restore(state, resumed)
        begin_run(state)
        state.resumed = None
    except BaseException:
        abandon_run_folder(state)
        release_cap(state.device)
        raise
    state.seal()
    return state


# ---------------------------------------------------------------------------------------------------------
# Placement: device, DDP, backend; the resolved configuration
# ---------------------------------------------------------------------------------------------------------

def placement(cfg, log):
    """Device and DDP process group (torchrun's LOCAL_RANK, RANK, WORLD_SIZE) and the backend: RunState's
    placement fields (device, world, rank, local_rank, main, amp, log) and the resolved backend and
    channels_last (for resolve_config)."""
    local_rank = int(os.getenv("LOCAL_RANK", -1))
    rank = int(os.getenv("RANK", -1))
    world = int(os.getenv("WORLD_SIZE", 1))
    main = rank in (-1, 0)
    device = select_device(cfg.device, local_rank)
    why = batch_error(cfg.batch_size, world, cfg.mem_budget, cuda=device.type == "cuda")  # the CLI asks it first
    if why:
        raise TrainError(why)
    if not main:
        log = _silent
    if world > 1:
        if cfg.image_weights:
            raise TrainError("--image-weights is not compatible with DDP (as published)")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    cuda = device.type == "cuda"
    backend = resolve_backend(cfg, device, world, log)
    channels_last = cuda and backend == "c" if cfg.channels_last is None else cfg.channels_last
    return dict(device=device, world=world, rank=rank, local_rank=local_rank, main=main, log=log,
                amp=cuda and bool(cfg.amp), backend=backend, channels_last=channels_last)


def resolve_config(cfg, backend, channels_last, save_dir, place) -> RunConfig:
    """The run's RunConfig, resolved once before anything is built: the backend and channels-last chosen for
    the device, the run folder, and the DDP world (opt.yaml records these, as published). Frozen."""
    return dataclasses.replace(cfg, backend=backend, channels_last=channels_last, save_dir=str(save_dir),
                               world_size=place["world"], global_rank=place["rank"])


def claim_run_dir(cfg, resumed, main):
    """(save_dir, made): runs/train/expN claimed with an atomic mkdir by the main process (or the resumed
    run's folder); made: this start created it (a failed start removes it again)."""
    if resumed is not None:
        return resumed.save_dir, False
    name = (Path(cfg.cfg).stem or Path(cfg.weights).stem) if cfg.name == "cfg" else cfg.name  # --cfg '': the weights
    target = Path(cfg.project) / name
    if not main:
        return increment_path(target, exist_ok=cfg.exist_ok), False
    check_writable(increment_path(target, exist_ok=cfg.exist_ok))  # before a folder is made or anything trained
    existed = target.exists()
    return increment_path(target, exist_ok=cfg.exist_ok, mkdir=True), not (cfg.exist_ok and existed)


def select_device(spec, local_rank):
    """--device ('' | cpu | 0 | 0,1 | cuda:0) → the torch.device of this process."""
    spec = str(spec).strip().lower().replace("cuda:", "")
    ids = [s for s in spec.replace(" ", "").split(",") if s]
    if spec not in ("", "cpu") and not (ids and all(s.isdigit() for s in ids)):  # `cuda`, `mps`, `0,cpu`
        raise TrainError(f"--device {spec}: expected cpu, a GPU index such as 0, or a list such as 0,1")
    if spec == "cpu" or not torch.cuda.is_available():
        if spec not in ("", "cpu"):
            raise TrainError(f"--device {spec}: CUDA is not available on this machine; use --device cpu")
        return torch.device("cpu")
    if local_rank >= 0:
        return torch.device("cuda", local_rank)
    if spec == "":
        return torch.device("cuda", 0)
    if int(ids[0]) >= torch.cuda.device_count():  # else CUDA's "invalid device ordinal" mid set-up
        raise TrainError(f"--device {spec}: GPU {ids[0]} does not exist ({torch.cuda.device_count()} visible)")
    return torch.device("cuda", int(ids[0]))


def resolve_backend(cfg, device, world, log):
    """The backend to train with: --backend as given, else c on a CUDA GPU and torch on the CPU. c needs the
    built extension (unless YOLOV9C_FUSED=0 routes every op to its torch reference) and computes BatchNorm
    statistics per process, so --sync-bn under DDP keeps the torch backend (an error when c was asked for).
    Validation's NMS needs the extension too, so an unbuilt one is refused here for either backend (not at the
    first validation, after an epoch of training)."""
    auto = cfg.backend is None
    backend = ("c" if device.type == "cuda" else "torch") if auto else cfg.backend
    if backend == "c" and world > 1 and cfg.sync_bn:
        if not auto:
            raise TrainError("--backend c does not synchronise BatchNorm statistics across processes (--sync-bn); "
                             "use --backend torch with --sync-bn")
        log("WARNING: --sync-bn: the c backend does not synchronise BatchNorm statistics; using --backend torch")
        backend = "torch"
    if extension.fused_enabled():
        try:
            extension.load()
        except ImportError as e:
            raise TrainError(f"{'--backend c' if backend == 'c' else 'validation (its NMS)'}: {e}") from None
    return backend


# ---------------------------------------------------------------------------------------------------------
# Run folder, hyp, seeds
# ---------------------------------------------------------------------------------------------------------

def setup_run_folder(state, prog="train_dual.py"):
    """The claimed run folder (claim_run_dir) held through a RunFolder by the main process (not by --evolve
    generations, which write only results.csv rows), the hyperparameters, hyp.yaml and opt.yaml of a fresh run
    (atomic), and the seeds. A resume whose training ended (resume_action "finish") sets state.finish_only."""
    cfg, log, resumed = state.cfg, state.log, state.resumed
    if state.main and not state.evolving:  # held; changed only by begin_run, once set-up has succeeded
        state.folder = RunFolder.open(state.save_dir, resume=resumed.ckpt if resumed else None, log=log,
                                      begin=False)
    if resumed is not None:
        action = state.folder.resume_action if state.folder is not None else resumed.action
        if action == "done":
            raise TrainError(f"--resume {resumed.last}: nothing to resume: this run finished (final validation "
                             f"done)")
        state.finish_only = action == "finish"
    if resumed is not None and resumed.hyp is not None:
        hyp = resumed.hyp  # the run's own values; opt.yaml's hyp (a file of another machine, maybe) is not read
    else:
        try:
            hyp_file = resolve_hyp(cfg.hyp) if isinstance(cfg.hyp, str) else None
            hyp = augment_hyp(hyp_file if hyp_file else cfg.hyp, mosaic=cfg.mosaic, mixup=cfg.mixup, log=log)
            missing = [k for k in TRAIN_KEYS if k not in hyp]  # the optimizer's, LR's, warm-up's (data/hyp.py: rest)
            if missing:
                raise KeyError(f"hyp lacks training keys: {', '.join(missing)}")
        except (FileNotFoundError, ValueError) as e:  # the message names the file (and line)
            raise TrainError(f"--hyp: {e}") from None
        except KeyError as e:
            raise TrainError(f"--hyp {hyp_file or '(dict)'}: {e.args[0]}") from None
    hyp["anchor_t"] = 5.0  # forced as published (anchor-free heads do not read it)
    if state.main:
        if state.evolving:
            state.save_dir.mkdir(parents=True, exist_ok=True)
        elif resumed is None:  # written by begin_run
            state.folder.write_yaml("hyp.yaml", hyp)
            state.folder.write_yaml("opt.yaml", opt_dict(cfg, hyp))
        log(f"{Path(prog).stem}: " + ", ".join(f"{k}={v}" for k, v in opt_dict(cfg).items()))
        log("hyperparameters: " + ", ".join(f"{k}={v}" for k, v in hyp.items()))
    hyp["label_smoothing"] = float(cfg.label_smoothing)
    state.hyp = hyp
    init_seeds(cfg.seed + 1 + state.rank, cfg.deterministic)


def begin_run(state):
    """The end of a set-up that succeeded: the run folder made this run's (RunFolder.begin: temps removed, an
    earlier run's results.csv and weights/ moved aside or a resume's rows prepared, run_state.yaml, hyp.yaml and
    opt.yaml), and labels.jpg of a fresh run. Nothing of it is written before, so a start that fails (a bad
    --weights, data or option found while building) leaves an existing --exist-ok or --resume folder as it was."""
    if state.folder is None:
        return
    state.folder.begin()
    if state.plots and state.resumed is None and state.dataset is not None:
        state.log(f"Plotting labels to {state.save_dir / 'labels.jpg'}... ")
        R.plot_labels(state.dataset.labels, state.names, state.save_dir / "labels.jpg")


START_FILES = ("hyp.yaml", "opt.yaml", RUN_STATE_NAME, "labels.jpg",  # what a start writes before epoch 0
               "labels_correlogram.jpg")
# what the first epoch writes before its checkpoint: a run interrupted then leaves no folder (abandon_run_folder)
FIRST_EPOCH_FILES = ("train_batch*.jpg", "events.out.tfevents.*", "results.csv")


def abandon_run_folder(state, also=()) -> bool:
    """A start failed (or, with `also`, a run was interrupted before its first checkpoint): release the run
    folder; if this start created it and it holds only START_FILES, files matching a glob of `also` and an
    empty weights/, remove it (so the same command gets the same name, not NAME2). Anything else in it is
    kept. Returns whether the folder was removed. Test: tests/engine/train/test_run_folder.py."""
    folder, state.folder = state.folder, None
    if folder is not None:
        folder.close()
    if not (state.main and state.made_dir and state.resumed is None and not state.evolving):
        return False
    d = state.save_dir
    ours = [p for p in d.iterdir()] if d.is_dir() else []
    try:
        if any(p.name != "weights" and p.name not in START_FILES and not any(fnmatch.fnmatch(p.name, g) for g in also)
               for p in ours) or (state.wdir.is_dir() and any(state.wdir.iterdir())):
            return False
        for p in ours:
            if p.name != "weights":
                p.unlink(missing_ok=True)
        if state.wdir.is_dir():
            state.wdir.rmdir()
        d.rmdir()
    except OSError:
        return False  # something else appeared or it cannot be removed: keep it
    state.made_dir = False
    return True


def init_seeds(seed, deterministic):
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


# ---------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------

def setup_model(state):
    """The data config, the DetectionModel (--cfg, --weights transfer, or the resumed weights exactly) on the
    device, frozen layers, and the image size rounded to the grid."""
    cfg, log = state.cfg, state.log
    try:
        state.data = load_data_config(cfg.data, splits=("train", "val"), log=log)  # test is never read in training
    except (DataConfigError, FileNotFoundError) as e:
        raise TrainError(str(e)) from None
    state.nc = 1 if cfg.single_cls else int(state.data["nc"])
    names = list(state.data["names"])
    state.names = ["item"] if cfg.single_cls and len(names) != 1 else names
    state.progress.maps = np.zeros(state.nc)
    if state.resumed is not None:
        model = _build(state.resumed.ckpt.get("yaml"), state.nc)
        model.load_state_dict(state.resumed.model_state)
    elif cfg.weights:
        why = weights_file_error(cfg.weights)  # a folder or a .pth: an error, never a silent start from scratch
        if why:
            raise TrainError(why)
        try:
            wck = read_checkpoint(cfg.weights, warn=False)  # non-finite weights: refused below
        except (FileNotFoundError, CheckpointError) as e:
            raise TrainError(f"--weights: {e}") from None
        spec = cfg.cfg or wck.get("yaml")
        if not spec:
            raise TrainError(f"--weights {cfg.weights} stores no model yaml: give --cfg")
        if not cfg.cfg:
            log(f"model: the one {cfg.weights} stores (--cfg builds another)")
        sd = wck.get("model") or wck.get("ema")  # the raw weights of an unstripped file, as published
        bad = nonfinite_names(sd)
        if bad:  # else the first steps are skipped and the run stops blaming lr0 and the data
            raise TrainError(f"--weights {nonfinite_text(cfg.weights, bad)}: weights of a diverged run cannot be "
                             f"trained from; use an earlier checkpoint of that run (weights/epochN.pt) or other "
                             f"weights")
        model = _build(spec, state.nc)
        transfer_weights(model, {k: v.float() for k, v in sd.items()}, exclude=("anchor",) if cfg.cfg else (),
                         source=str(cfg.weights))
    elif not cfg.cfg:  # published: "either --cfg or --weights must be specified"
        raise TrainError("either --cfg or --weights must be given (--cfg '' builds the model a --weights "
                         "checkpoint stores)")
    else:
        model = _build(cfg.cfg, state.nc)
    if model.yaml_nc != model.nc:  # the published line users read to see the data's class count won
        log(f"Overriding model.yaml nc={model.yaml_nc} with nc={model.nc}")
    log(model_summary(model))  # as published at model build: GFLOPs at 640, before --freeze
    model = model.to(state.device, memory_format=state.memory_format)
    n_frozen = freeze(model, cfg.freeze)
    if n_frozen:
        log(f"freezing {n_frozen} parameter tensors of {frozen_layers_text(cfg.freeze)}")
    state.gs = max(int(model.stride.max()), 32)
    state.imgsz = memory_plan.train_img_size(cfg.imgsz, state.gs, log=log)
    state.model = model


def _build(spec, nc):
    if not spec:
        raise TrainError("the checkpoint stores no model yaml: give --cfg")
    try:
        return DetectionModel(spec, nc=nc)
    except FileNotFoundError as e:
        raise TrainError(f"--cfg: {e}") from None
    except (ValueError, TypeError, KeyError) as e:
        raise TrainError(f"--cfg {spec if isinstance(spec, str) else '(stored yaml)'}: {e}") from None


def frozen_layers_text(layers) -> str:
    """What --freeze LAYERS freezes, in words: [10] → 'layers 0-9', [0, 3] → 'layers 0, 3', [1] → 'layer 0'."""
    idx = list(range(layers[0])) if len(layers) == 1 else sorted(set(layers))
    if len(idx) == 1:
        return f"layer {idx[0]}"
    contiguous = len(layers) == 1 or idx == list(range(idx[0], idx[-1] + 1))
    return f"layers {idx[0]}-{idx[-1]}" if contiguous and len(idx) > 2 else f"layers {', '.join(map(str, idx))}"


def freeze(model, layers):
    """--freeze N → layers 0..N-1; several values → exactly those layer indices. Returns the frozen count.
    Every other parameter keeps the requires_grad it was built with: the DFL convolutions' fixed weights stay
    frozen (as published: its `v.requires_grad = True` line is commented out, train_dual.py L122-128).
    Raises TrainError for a layer the model does not have and for a choice that leaves no parameter to train
    (set-up then removes the run folder it made, as for any failed start)."""
    n = len(model.model)
    given = " ".join(map(str, layers))
    layer_text = f"the model has {n} layers (0-{n - 1})"
    if len(layers) == 1 and layers[0] >= n:
        raise TrainError(f"--freeze {given}: {layer_text}; --freeze N freezes layers 0 to N-1, so N can be at most "
                         f"{n - 1} (the detection head, layer {n - 1}, must train)")
    missing = sorted({x for x in layers if x >= n}) if len(layers) > 1 else []
    if missing:
        raise TrainError(f"--freeze {given}: {layer_text}: no layer {', '.join(map(str, missing))}")
    idx = range(layers[0]) if len(layers) == 1 else layers
    prefixes = [f"model.{x}." for x in idx]
    frozen = 0
    for k, v in model.named_parameters():
        if any(k.startswith(p) for p in prefixes):
            v.requires_grad = False
            frozen += 1
    if not any(v.requires_grad for v in model.parameters()):
        raise TrainError(f"--freeze {given}: nothing left to train ({layer_text}; the detection head, layer "
                         f"{n - 1}, must train)")
    return frozen


# ---------------------------------------------------------------------------------------------------------
# Batch, accumulation, optimizer, schedule, EMA, scaler
# ---------------------------------------------------------------------------------------------------------

def plan_memory(state):
    """--mem-budget (without it, for the c backend, memory_auto.DEFAULT_MEM_BUDGET, except for AutoBatch's
    --batch-size -1): a size plans the step's micro-batch (apply_memory_plan); 'auto' reads the card and resolves
    the c switches, micro-batch, graph shapes and validation chunks of the whole run into state.cfg
    (memory_auto.apply; as the default, only where the run as set does not train in the card); a resumed auto run
    planned otherwise now loses what its plan set (memory_auto.forget). After the model is built, before the
    optimizer, the loaders, the backend and the step read them."""
    budget = state.cfg.mem_budget
    default = budget is None and state.cfg.batch_size != -1 and state.cfg.backend == "c"
    if default:
        budget = memory_auto.DEFAULT_MEM_BUDGET
    if budget != "auto":  # a resumed auto run planned otherwise now: what its plan set goes back to the defaults
        state.cfg = memory_auto.forget(state.cfg)
    if budget == "auto":
        memory_auto.apply(state, default=default)
    elif budget is not None:
        apply_memory_plan(state)


def setup_optimization(state):
    """The batch (batching.plan_batching, once: AutoBatch for -1, --accumulate or the nominal-64 rule; a resume
    keeps the run's nominal batch unless --accumulate is given; plan_memory's micro-batch), weight decay
    scaled to the nominal batch (hyp not changed), optimizer, LR schedule, EMA and GradScaler."""
    cfg, log, resumed, hyp = state.cfg, state.log, state.resumed, state.hyp
    batch_size = cfg.batch_size
    if batch_size == -1:  # AutoBatch (single process: batch_error): before the loaders and the weight decay
        batch_size = autobatch(state.model, state.imgsz, hyp, state.device, backend=cfg.backend, amp=state.amp,
                               log=log, switches=switches(cfg) if cfg.backend == "c" else None)
    keep = resumed is not None and "accumulate" not in cfg.given
    b = state.batching = plan_batching(batch_size, cfg.accumulate, state.world,
                                       resumed_nominal=resumed.nominal_batch if resumed else None,
                                       keep_nominal=keep)
    if resumed is not None:
        old_nominal = resumed.nominal_batch or b.nominal
        log(f"Resuming with --batch-size {batch_size} (was {int(resumed.old_batch or batch_size)}) x accumulate "
            f"{b.fixed_accumulate or 'warm-up ramp to ' + str(b.accumulate)} = nominal batch {b.nominal}")
        if b.nominal != old_nominal:
            log(f"WARNING: the nominal batch changes from {old_nominal} to {b.nominal} images per optimizer step "
                f"(--batch-size x --accumulate); weight decay stays scaled for {old_nominal}. Keep "
                f"--batch-size x --accumulate = {old_nominal} to continue the run unchanged")
    # the hyp file's weight decay scaled to the nominal batch (hyp itself stays as read); a resume's optimizer
    # state brings back the run's own scaled value
    decay = hyp["weight_decay"] * batch_size * b.accumulate / NBS
    state.optimizer = build_optimizer(state.model, cfg.optimizer, hyp["lr0"], hyp["momentum"], decay, log=log)
    kind = "cos" if cfg.cos_lr else "flat-cos" if cfg.flat_cos_lr else "fixed" if cfg.fixed_lr else "linear"
    state.lf = lr_lambda(kind, cfg.epochs, hyp["lrf"])
    state.scheduler = torch.optim.lr_scheduler.LambdaLR(state.optimizer, lr_lambda=state.lf)
    state.scheduler.last_epoch = -1  # as published: start_epoch - 1 (restore sets a resumed run's)
    state.ema = ModelEMA(state.model) if state.main else None
    state.scaler = torch.amp.GradScaler("cuda", enabled=state.amp)


def apply_memory_plan(state):
    """--mem-budget (--dynamic-img, --min-img): memory_plan.plan_for_training on this rank's loader batch. The
    plan's micro-batch becomes state.progress.micro_batch (each loader batch runs as plan.accumulate forward/backward
    passes before the usual accumulation), so the loader batch, the accumulation rule, the nominal batch and
    the weight decay are those of --batch-size; with --dynamic-img the plan's image size replaces --img. With
    --graph-shapes (one process, --cuda-graph) the plan counts the memory of the graphs the run can hold
    (memory_plan.graphs_held: the cap with --rect or --multi-scale, else 2 for a batch above 1; graphs_gib)."""
    cfg, gs = state.cfg, state.gs  # batch_error refused --batch-size -1 with --mem-budget
    per_rank = cfg.batch_size // state.world
    min_img = memory_plan.train_img_size(cfg.min_img, gs)
    resumed_file = str(state.resumed.ckpt.get("yaml_file") or "") if state.resumed is not None else ""
    name = cfg.cfg or getattr(state.model, "yaml_file", "") or resumed_file  # a resume builds from the stored dict
    keyed = cfg.graph_shapes and cfg.cuda_graph and state.world == 1
    graphs = memory_plan.graphs_held(per_rank, varying=cfg.rect or cfg.multi_scale) if keyed else 1
    try:
        plan = memory_plan.plan_for_training(name, cfg.backend, cfg.mem_budget, nominal=per_rank, img=state.imgsz,
                                             dynamic_img=cfg.dynamic_img, min_img=min_img, device=state.device,
                                             log=state.log, switches=switches(cfg) if cfg.backend == "c" else None,
                                             graphs=graphs)
    except (ValueError, OSError) as e:
        raise TrainError(str(e)) from None
    state.plan = plan
    state.progress.micro_batch = plan.batch if plan.batch < per_rank else None
    if cfg.dynamic_img:
        state.imgsz = max(plan.img // gs * gs, gs * 2)
    state.log(f"memory plan: --mem-budget {plan.budget_gib:.2f} GiB, --backend {cfg.backend}: {plan.accumulate} "
              f"micro-batch(es) of {plan.batch} per batch of {per_rank} images at {state.imgsz}, predicted peak "
              f"{plan.predicted_gib:.2f} GiB reserved" + (f" ({plan.note})" if plan.note else ""))
    if state.device.type != "cuda":  # the costs are a GPU step's (AMP, CUDA allocator): say what it means here
        state.log(f"memory plan: WARNING: --mem-budget plans GPU memory; this run is on the {state.device.type}, "
                  f"where the budget bounds nothing: the plan only sets the micro-batch above (as on a GPU)")


# ---------------------------------------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------------------------------------

def setup_loaders(state):
    """The training loader of this rank and the validation loader (main process: twice the per-rank training
    batch, as published: train_dual.py L213), labels.jpg of a fresh run; then torch's CPU threads."""
    cfg, data, hyp = state.cfg, state.data, state.hyp
    per_rank = state.batching.per_rank
    batch_bytes, ram = per_rank * 3 * state.imgsz ** 2, total_ram()
    if ram and batch_bytes > ram:  # the loader's uint8 batch alone: the run would be killed for memory at batch 0
        raise TrainError(f"--img {cfg.imgsz} with a batch of {per_rank}: one training batch alone takes "
                         f"{batch_bytes / GIB:.3g} GiB of host memory ({per_rank} x 3 x {state.imgsz} x "
                         f"{state.imgsz} bytes), more than this machine's {ram / GIB:.3g} GiB: use a smaller "
                         f"--img (or --batch-size)")
    train = DatasetConfig(augment=True, hyp=hyp, rect=cfg.rect, image_weights=cfg.image_weights,
                          cache=None if cfg.cache == "val" else cfg.cache, single_cls=cfg.single_cls, stride=state.gs,
                          min_items=cfg.min_items, prefix="train: ", nc=int(data["nc"]), seed=cfg.seed)
    train_cfg = LoaderConfig(train, rank=state.local_rank if state.world > 1 else -1, world_size=state.world,
                             workers=cfg.workers, shuffle=True, pin_memory=cfg.pin_memory,
                             augment_device=str(state.device) if cfg.gpu_augment else None)
    try:
        state.train_loader, state.dataset = create_dataloader(data["train"], state.imgsz, per_rank, train_cfg,
                                                              log=state.log)
        if state.main:
            state.val_loader = make_val_loader(state, per_rank * 2)
    except (DataError, ValueError) as e:
        raise TrainError(str(e)) from None
    set_cpu_threads(state.train_loader.num_workers, int(os.getenv("LOCAL_WORLD_SIZE", state.world)), state.log,
                    cuda=state.device.type == "cuda")
    state.nb = len(state.train_loader)
    state.nw = warmup_iterations(hyp["warmup_epochs"], state.nb)
    state.plots = state.main and not cfg.noplots and not state.evolving


# A CUDA run's main process does little CPU tensor work (a model build, checkpoint copies, metrics); more intra-op
# threads only spin at OpenMP barriers when other processes share the cores (six GPU runs of 14 threads each on 16
# busy cores sat for minutes in the final validation's model build, H200 2026-12-05).
CUDA_MAIN_THREADS = 2


def cpu_threads(workers, ranks=1, cores=None, env=None, cuda=False):
    """torch's intra-op thread count for a process that shares `cores` (default: the cores this process may run
    on, os.sched_getaffinity) with `ranks` training processes of this host and `workers` loader workers each:
    max(1, cores / ranks − workers), all of its share with workers = 0, at most CUDA_MAIN_THREADS when it trains
    on a GPU (`cuda`). None when the user chose (OMP_NUM_THREADS or MKL_NUM_THREADS in `env`, default
    os.environ): torch's setting is then left alone. Test: tests/engine/train/test_train_wiring.py."""
    env = os.environ if env is None else env
    if env.get("OMP_NUM_THREADS") or env.get("MKL_NUM_THREADS"):
        return None
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    share = max(1, cores // max(ranks, 1))
    n = max(1, share - workers) if workers > 0 else share
    return min(n, CUDA_MAIN_THREADS) if cuda else n


def set_cpu_threads(workers, ranks, log, cuda=False):
    """Set torch's intra-op threads to cpu_threads(...) (unless the user chose) and log it in one line."""
    n = cpu_threads(workers, ranks, cuda=cuda)
    if n is None:
        log(f"CPU threads: {torch.get_num_threads()} (OMP_NUM_THREADS/MKL_NUM_THREADS set: left as they are)")
        return
    torch.set_num_threads(n)
    log(f"CPU threads: {n} for torch ({workers} loader workers, {ranks} process(es) on this host's cores"
        f"{', training on the GPU' if cuda else ''})")


def make_val_loader(state, batch):
    """The validation loader (rect, pad 0.5, no augmentation) with `batch` images per batch (set-up, and the
    out-of-memory retry of validation with a smaller batch)."""
    cfg = state.cfg
    val = DatasetConfig(augment=False, hyp=state.hyp, rect=True,
                        cache=None if cfg.noval else ("ram" if cfg.cache == "val" else cfg.cache),
                        single_cls=cfg.single_cls, stride=state.gs, pad=0.5, prefix="val: ", nc=int(state.data["nc"]),
                        seed=cfg.seed)
    loader, _ = create_dataloader(state.data["val"], state.imgsz, batch,
                                  LoaderConfig(val, workers=cfg.workers * 2, pin_memory=cfg.pin_memory), log=state.log)
    return loader


def setup_finish_only(state):
    """A --resume whose training ended (killed after the last epoch or while finishing): no optimizer, training
    loader or loop, only what finish() reads: the validation loader (the run's batch size), the loss for the
    validation losses, and plots."""
    cfg = state.cfg
    stored = (state.resumed.ckpt.get("opt") or {}).get("batch_size")
    batch = cfg.batch_size if cfg.batch_size > 0 else int(stored) if stored and int(stored) > 0 else 16
    try:
        state.val_loader = make_val_loader(state, batch // state.world) if state.main else None
    except (DataError, ValueError) as e:
        raise TrainError(str(e)) from None
    state.model.nc, state.model.names, state.model.hyp = state.nc, state.names, state.hyp
    state.loss = make_loss(state.model, state.hyp, backend=cfg.backend)
    state.plots = state.main and not cfg.noplots
    state.progress.start_epoch = cfg.epochs
    ep = int(state.resumed.ckpt.get("epoch", -1))
    when = f"after epoch {ep}" if ep >= 0 else "and its weights were stripped"
    state.log(f"--resume {state.resumed.last}: training ended {when}; finishing the run: strip the weights, "
              f"validate best.pt, plot")


# ---------------------------------------------------------------------------------------------------------
# Execution: SyncBatchNorm, loss, backend, --ckpt, DDP
# ---------------------------------------------------------------------------------------------------------

def setup_execution(state):
    """SyncBatchNorm, model attributes and the loss (on the plain head), then the backend, --ckpt and DDP, and
    the step the loop calls (graph_shapes.select_step: whole-step CUDA graphs or the eager train_step)."""
    cfg, log, model = state.cfg, state.log, state.model
    cuda = state.device.type == "cuda"
    if state.world > 1 and cfg.sync_bn and cuda:  # as published: CUDA only (SyncBatchNorm refuses CPU input)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        log("Using SyncBatchNorm()")
    elif cfg.sync_bn:
        log("WARNING: --sync-bn only applies under DDP (torchrun) on CUDA devices; ignored")
    if state.resumed is None:
        model.half().float()  # as published, not on resume: weights rounded to fp16 values (the EMA copy is not)
    model.nc, model.names, model.hyp = state.nc, state.names, state.hyp
    model.class_weights = torch.from_numpy(class_weights(state.dataset.labels, state.nc)).float().to(
        state.device) * state.nc
    state.loss = make_loss(model, state.hyp, backend=cfg.backend)  # reads the plain head: before the backend
    sw = switches(cfg)
    log(f"backend: {cfg.backend}{', channels-last' if cfg.channels_last else ''}"
        + (f"; --aux-recompute {int(sw.aux_recompute)} --main-recompute {sw.main_recompute} --keep-inputs "
           f"{int(sw.keep_inputs)}" + (f" --plain-stride {sw.plain_stride}" if sw.plain_stride else "")
           if cfg.backend == "c" else ""))
    if cfg.backend != "torch":
        model = _apply_backend(model, cfg.backend, sw)
    elif sw != type(sw)():
        log(f"WARNING: {', '.join('--' + n.replace('_', '-') for n in SWITCH_ENV)} are the c backend's switches; "
            f"ignored with --backend torch")
    ckpt_layers = cfg.ckpt and cfg.backend == "torch"
    if cfg.ckpt and not ckpt_layers:
        log(f"WARNING: --ckpt is torch-backend checkpointing; --backend {cfg.backend} already stores one tensor "
            f"per layer and recomputes the rest: --ckpt ignored")
    if ckpt_layers:
        model.forward = types.MethodType(checkpointed_forward, model)
    state.uint8_input = accepts_uint8(model) and not cfg.multi_scale  # --multi-scale resizes float images
    state.bn_buffers = bn_buffers(model) if ckpt_layers else []
    state.bn_stats = bn_buffers(model)
    state.guard = StepGuard(state)
    if state.world > 1:
        model = DistributedDataParallel(model, device_ids=[state.local_rank] if cuda else None, static_graph=True)
    state.model = model
    state.params = list(model.parameters())
    state.step = select_step(state)  # once: CUDA graphs where they work (graph_step.py), else step.EagerStep


def _apply_backend(model, backend, sw):
    """yolov9c.backends.apply(model, backend, sw): the same module, parameters and state_dict, other execution.
    The optimizer already holds the parameters, so a backend that replaced them would train nothing: checked."""
    before = [id(p) for p in model.parameters()]
    out = apply_backend(model, backend, sw)
    model = model if out is None else out
    if [id(p) for p in model.parameters()] != before:
        raise RuntimeError(f"yolov9c.backends.apply(model, {backend!r}) replaced the model's parameters")
    return model


def _silent(*args, **kwargs):
    pass
