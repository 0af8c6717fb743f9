"""RunConfig: every option of one training run, typed, built once by the CLI (the trainer never sees argparse).

    cfg = parse_opt(["--cfg", "gelan-t.yaml", "--epochs", "3"])    # yolov9c.cli.train: argv → RunConfig
    cfg = RunConfig.from_args(namespace, given=("epochs",))         # what parse_opt does with argparse's result
    cfg = read_opt_yaml("runs/train/exp/opt.yaml")                  # a run's stored options
    cfg = switch_overrides(cfg, log=print)                          # set-up: YOLOV9C_* variables, logged

Fields: the published train_dual.py flags (argparse destinations, same defaults), yolov9c's memory knobs (the c
backend's switches among them; their YOLOV9C_* variables, SWITCH_ENV, win at set-up unless the option is typed),
then what the trainer resolves (save_dir, world_size, global_rank, mem_plan). `given` names the fields typed on
the command line: --resume takes those in RESUME_OVERRIDES from the command line instead of opt.yaml. opt.yaml is
`opt_dict(cfg, hyp)` (the published format: every option, the hyp dict, save_dir); reading one back checks each
value by the command line's rule (options.py), ignores unknown keys (with a warning) and defaults missing ones.
Invariant: frozen; set-up resolves a copy once (state.resolve_config, memory_auto.apply) and nothing rewrites it.
Test: python -m pytest -q tests/cli/test_train_cli.py -k config
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from yolov9c.backends.c.switches import DEFAULT as SWITCH_DEFAULTS
from yolov9c.backends.c.switches import Switches, parse_switch
from yolov9c.engine.train.options import OptionError, checked, combination_error
from yolov9c.engine.train.memory_plan import MIN_IMG

# options that --resume takes from the command line instead of the stored opt.yaml (memory knobs and placement)
RESUME_OVERRIDES = ("batch_size", "accumulate", "workers", "cache", "device", "pin_memory", "amp", "ckpt",
                    "gpu_augment", "val_period", "noplots", "backend", "channels_last", "max_nonfinite", "cuda_graph",
                    "graph_shapes", "cudnn_benchmark", "divergence_stop",
                    "mem_budget", "mem_cap", "val_chunks", "aux_recompute", "main_recompute", "keep_inputs",
                    "plain_stride")
# the c backend's switches (backends/c/switches.py) and the environment variables that override them
SWITCH_ENV = {"aux_recompute": "YOLOV9C_AUX_RECOMPUTE", "main_recompute": "YOLOV9C_MAIN_RECOMPUTE",
              "keep_inputs": "YOLOV9C_KEEP_INPUTS", "plain_stride": "YOLOV9C_PLAIN_STRIDE"}


class ConfigError(ValueError):
    """A stored opt.yaml that cannot become a RunConfig (not a mapping, unreadable)."""


@dataclass(frozen=True)
class RunConfig:
    # --- the published flags, in the published order (train_dual.py parse_opt) ---
    weights: str = ""  # initial weights (.pt, ours or published); '' = from scratch
    cfg: str = "yolov9-t.yaml"  # model yaml (bare name: configs/models/detect/); '' with weights: the checkpoint's
    data: str = "synthetic"  # dataset yaml, or synthetic[:SEED]
    hyp: str | dict = "hyp.scratch-high.yaml"  # hyp yaml (bare name: configs/hyps/), or the dict itself (evolve)
    epochs: int = 100
    batch_size: int = 16  # images per iteration over all ranks; -1 = AutoBatch
    imgsz: int = 640  # train and val image size (rounded up to a multiple of the max stride)
    rect: bool = False  # rectangular training batches
    resume: bool | str = False  # True: the newest last*.pt under project; a str: that last.pt
    nosave: bool = False  # only the final checkpoint
    noval: bool = False  # only validate the final epoch
    noautoanchor: bool = False  # inert, as published (anchor-free heads)
    noplots: bool = False
    evolve: int | None = None  # generations of hyperparameter evolution (engine/train/evolve.py)
    bucket: str = ""  # gsutil bucket of evolve (unused)
    cache: str | None = None  # ram, disk or val (val: only the validation images, in RAM)
    image_weights: bool = False  # draw training images by class weights
    device: str = ""  # '' (first GPU, else CPU), 0, 0,1,2,3 or cpu
    multi_scale: bool = False  # random image size in [0.5, 1.5] x imgsz per batch
    single_cls: bool = False
    optimizer: str = "SGD"  # SGD, Adam, AdamW or LION
    sync_bn: bool = False  # SyncBatchNorm under DDP on CUDA
    workers: int = 8  # dataloader workers per rank
    project: str = "runs/train"
    name: str = "exp"  # 'cfg': the model yaml's stem
    exist_ok: bool = False  # reuse project/name instead of project/name2, 3, ...
    quad: bool = False  # loss x 4 (as published)
    cos_lr: bool = False  # LR schedule: at most one of cos_lr, flat_cos_lr, fixed_lr (else linear)
    flat_cos_lr: bool = False
    fixed_lr: bool = False
    label_smoothing: float = 0.0
    patience: int = 100  # epochs without improvement before an early stop; 0 = never
    freeze: list = field(default_factory=lambda: [0])  # [N]: layers 0..N-1; several values: those layers
    save_period: int = -1  # also write epochN.pt every N epochs (< 1: never)
    seed: int = 0
    local_rank: int = -1  # set by the DDP launcher (the trainer reads LOCAL_RANK)
    min_items: int = 0  # drop training images with fewer labels
    close_mosaic: int = 0  # mosaic off for the last N epochs
    entity: str | None = None  # W&B options: accepted, unused
    upload_dataset: bool | str = False
    bbox_interval: int = -1
    artifact_alias: str = "latest"
    # --- yolov9c additions ---
    backend: str | None = None  # torch or c; None: c on a CUDA GPU, torch on the CPU (resolved by the trainer)
    channels_last: bool | None = None  # None: on with c on CUDA (resolved by the trainer)
    accumulate: int | None = None  # micro-batches per optimizer step; None: round(64 / batch) after warm-up ramp
    amp: bool = True  # fp16 autocast + GradScaler on CUDA
    ckpt: bool = False  # per-layer activation checkpointing (torch backend)
    aux_recompute: bool = SWITCH_DEFAULTS.aux_recompute  # c backend: the PGI auxiliary branch re-run in backward
    main_recompute: int = SWITCH_DEFAULTS.main_recompute  # c backend: main blocks at this stride or finer re-run
    keep_inputs: bool = SWITCH_DEFAULTS.keep_inputs  # c backend: a re-run segment keeps its conv inputs
    plain_stride: int = SWITCH_DEFAULTS.plain_stride  # c backend: main layers this coarse run torch's forward
    val_period: int = 1  # validate every N epochs (and always the last)
    pin_memory: bool | None = None  # None: the PIN_MEMORY environment variable (default true)
    gpu_augment: bool = False  # workers only decode; the augment op makes the batch's pixels on the training device
    mosaic: float | None = None  # mosaic probability (overrides the hyp file)
    mixup: float | None = None  # mixup probability (overrides the hyp file)
    deterministic: bool = False  # torch.use_deterministic_algorithms
    max_nonfinite: int = 10  # stop after N skipped (non-finite) optimizer steps in a row; 0 = never (guards.py)
    divergence_stop: bool = True  # stop at an epoch's end when the weights or training losses diverged (guards.py)
    cuda_graph: bool = True  # whole-step CUDA graphs where they work (CUDA, no DDP): graph_step.py
    graph_shapes: bool = True  # with cuda_graph: a graph per micro-batch shape and box bucket (graph_shapes.py)
    cudnn_benchmark: bool = True  # cuDNN times its algorithms for the graphed shape (graph_step.py; not with
    #                               --deterministic, never for validation or eager batches of other shapes)
    mem_budget: float | str | None = None  # GiB (or a size text, '7.5G') a step may reserve: memory_plan picks
    #                                      the micro-batch (state.apply_memory_plan); 'auto': the card's free memory
    #                                      plans the whole run (memory_auto.py); None: memory_auto.DEFAULT_MEM_BUDGET
    mem_cap: float | None = None  # GiB this process may reserve on the GPU (a smaller card rehearsed: memory_cap.py);
    #                               None: --mem-budget's value when given, else no cap
    val_chunks: str = "auto"  # auto: training-time validation's forward in chunks that fit beside the CUDA-graph
    #                          pool (val_chunks.py), the graphs kept; off: one forward per validation batch
    dynamic_img: bool = False  # with mem_budget: shrink the image size instead of splitting the batch
    min_img: int = MIN_IMG  # dynamic_img's smallest image size (rounded up to the grid; memory_plan.MIN_IMG)
    # --- resolved and recorded by the trainer (opt.yaml keys of the published code) ---
    save_dir: str = ""
    world_size: int = 1
    global_rank: int = -1
    mem_plan: dict | None = None  # --mem-budget auto: what the card gave and the plan chose (memory_auto.record)
    # --- not stored: the fields the user typed on the command line (resume overrides) ---
    given: tuple = ()

    @classmethod
    def from_args(cls, ns, given=()) -> RunConfig:
        """A RunConfig from a parsed argparse Namespace (its attributes are the field names); `given`: the
        destinations typed on the command line."""
        names = {f.name for f in dataclasses.fields(cls)} - {"given"}
        return cls(**{k: v for k, v in vars(ns).items() if k in names}, given=tuple(sorted(given)))

    @classmethod
    def from_dict(cls, stored, log=print, source="opt.yaml") -> RunConfig:
        """A RunConfig from a stored mapping (opt.yaml, a checkpoint's 'opt'): each known value through its
        check (options.CHECKS, the command line's rules) and the options together through combination_error;
        OptionError "<source>: <key>: <what is wrong, what is allowed>" for the first refused. Unknown keys are
        ignored with a warning naming them, missing keys keep their defaults."""
        if not isinstance(stored, dict):
            raise ConfigError(f"{source} does not hold a mapping of options (got {type(stored).__name__})")
        names = {f.name for f in dataclasses.fields(cls)} - {"given"}
        unknown = sorted(set(stored) - names - {"given"}, key=str)  # 'given': in older checkpoints' options
        if unknown:
            log(f"WARNING: {source}: unknown options ignored: {', '.join(map(str, unknown))}")
        cfg = cls(**checked({k: v for k, v in stored.items() if k in names}, source))
        why = combination_error(cfg)
        if why:
            raise OptionError(source, None, why)
        return cfg


def read_opt_yaml(path, log=print) -> RunConfig:
    """The RunConfig stored in a run's opt.yaml (see RunConfig.from_dict for unknown and missing keys).
    Raises FileNotFoundError, ConfigError (empty, not yaml, not a mapping), OptionError (a refused value)."""
    path = Path(path)
    try:
        stored = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid yaml ({str(e).splitlines()[0]})") from None
    if stored is None:
        raise ConfigError(f"{path} is empty")
    return RunConfig.from_dict(stored, log=log, source=str(path))


def opt_dict(cfg: RunConfig, hyp=None) -> dict:
    """opt.yaml's content (and a checkpoint's 'opt'): every field but `given`, in field order, plain types
    (Paths as str); `hyp`, when given, replaces the 'hyp' option (a file name) by the hyperparameter dict."""
    d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "given"}
    d = {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}
    if hyp is not None:
        d["hyp"] = hyp
    return d


def switches(cfg: RunConfig) -> Switches:
    """The c backend's Switches of the run's options (what the trainer and the memory planner pass down)."""
    return Switches(**{name: getattr(cfg, name) for name in SWITCH_ENV})


def switch_overrides(cfg: RunConfig, env=None, log=print) -> RunConfig:
    """cfg with every c backend switch whose variable (SWITCH_ENV) is set in `env` (default os.environ) taken
    from it: a variable wins over the option's default and over a value stored in opt.yaml, never over an option
    typed on this command line (cfg.given): that one is kept and the variable's value is logged as unused. Each
    variable set is logged with the option's value it replaces; the result is what the run uses and opt.yaml
    records. ConfigError for a value the option would refuse (parse_switch), typed option or not."""
    env = os.environ if env is None else env
    changed = {}
    for name, var in SWITCH_ENV.items():
        text = env.get(var)
        if text is None or not text.strip():
            continue
        try:
            value = parse_switch(name, text)
        except ValueError as e:
            raise ConfigError(f"{var}={text!r}: {e} (or unset it; the option is --{name.replace('_', '-')})") \
                from None
        old, flag = getattr(cfg, name), "--" + name.replace("_", "-")
        if name in cfg.given:
            if value != old:
                log(f"{var}={text.strip()} is set, but {flag} {_text(old)} was typed: the typed value is used")
            continue
        if value != old:
            log(f"{var}={text.strip()} overrides {flag} {_text(old)}: the run uses (and opt.yaml records) "
                f"{flag} {_text(value)}")
        else:
            log(f"{var}={text.strip()} is set: the same as {flag} {_text(old)}")
        changed[name] = value
    return dataclasses.replace(cfg, **changed) if changed else cfg


def _text(value):
    """A switch value as its option writes it (booleans 0/1)."""
    return str(int(value)) if isinstance(value, bool) else str(value)
