"""The command line of train_dual.py: every published flag plus yolov9c's memory knobs.

    python train_dual.py --cfg gelan-t.yaml --img 160 --epochs 3 --batch 16      # built-in synthetic data
    python train_dual.py --data data.yaml --cfg yolov9-c.yaml --batch 16 --accumulate 4 --img 640

Published names, defaults, nargs and bare-flag values (`--resume` = True, `--cache` = 'ram', `--evolve` = 300),
the `--img`/`--img-size` and `--local_rank`/`--local-rank` aliases; prefix matching keeps `--batch`. Defaults
that differ (the published ones name files absent here): `--data` synthetic, `--cfg` yolov9-t.yaml, `--hyp` the
bundled hyp.scratch-high.yaml (bare names are looked up in configs/hyps/).
Added: --backend {torch,c} (c on a CUDA GPU, torch on the CPU), --channels-last, --accumulate, --amp, --ckpt,
--aux-recompute / --main-recompute / --keep-inputs (c's switches, cli/memory.py), --val-period, --pin-memory,
--gpu-augment, --mosaic, --mixup, --deterministic, --max-nonfinite, --divergence-stop, --cuda-graph, --graph-shapes,
--cudnn-benchmark, --mem-cap, --val-chunks, --mem-budget / --dynamic-img / --min-img (planner). parse_opt(argv,
prog=...) -> RunConfig (engine/train/config.py; value checks: options.py); the trainer never sees argparse.
Test: python -m pytest -q tests/cli/test_train_cli.py
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import torch

from yolov9c.cli.memory import add_switch_args, budget_or_auto_type, budget_type
from yolov9c.engine.train.config import RunConfig
from yolov9c.engine.train.evolve import evolve
from yolov9c.engine.train.options import BACKENDS, CACHE_CHOICES, CHECKS, OPTIMIZERS, VAL_CHUNKS, combination_error
from yolov9c.engine.train.memory_plan import MIN_IMG, dynamic_img_error
from yolov9c.engine.train.run_folder import USER_ERRORS
from yolov9c.engine.train.batching import batch_error
from yolov9c.engine.train.trainer import Interrupted, TrainError, train


def _checked(name):
    """The argparse type of option `name`: its check (engine/train/options.py, also --resume's), its ValueError
    as argparse's error."""
    check = CHECKS[name].text

    def parse(text):
        try:
            return check(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = name
    return parse


def build_parser(prog="train_dual.py") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog,
                                description="Train a YOLOv9 / GELAN detector (the published train_dual.py flags).")
    # --- the published flags, in the published order (train_dual.py:438-487) ---
    p.add_argument("--weights", type=str, default="", help="initial weights path (ours or a published .pt)")
    p.add_argument("--cfg", type=str, default="yolov9-t.yaml",
                   help="model yaml: a bare name (configs/models/detect/) or a path (default yolov9-t.yaml; "
                        "published default yolo.yaml does not exist); with --weights and no --cfg (or ''): the "
                        "checkpoint's model")
    p.add_argument("--data", type=str, default="synthetic",
                   help="dataset yaml, or synthetic[:SEED] for the built-in dataset (default)")
    p.add_argument("--hyp", type=str, default="hyp.scratch-high.yaml",
                   help="hyperparameter yaml; a bare file name is looked up in configs/hyps/")
    p.add_argument("--epochs", type=_checked("epochs"), default=100, help="total training epochs")
    p.add_argument("--batch-size", type=_checked("batch_size"), default=16,
                   help="total batch size for all GPUs, -1 for AutoBatch")
    p.add_argument("--imgsz", "--img", "--img-size", type=_checked("imgsz"), default=640,
                   help="train, val image size (pixels)")
    p.add_argument("--rect", action="store_true", help="rectangular training")
    p.add_argument("--resume", nargs="?", const=True, default=False,
                   help="resume most recent training (bare flag) or from the given last.pt")
    p.add_argument("--nosave", action="store_true", help="only save final checkpoint")
    p.add_argument("--noval", action="store_true", help="only validate final epoch")
    p.add_argument("--noautoanchor", action="store_true", help="disable AutoAnchor (inert, as published)")
    p.add_argument("--noplots", action="store_true", help="save no plot files")
    p.add_argument("--evolve", type=int, nargs="?", const=300,
                   help="evolve hyperparameters for x generations (runs/evolve/exp: evolve.csv, hyp_evolve.yaml)")
    p.add_argument("--bucket", type=str, default="", help="gsutil bucket (evolve only; unused)")
    p.add_argument("--cache", type=str, nargs="?", const="ram", choices=CACHE_CHOICES,
                   help="image --cache ram/disk/val (bare flag: ram)")
    p.add_argument("--image-weights", action="store_true", help="use weighted image selection for training")
    p.add_argument("--device", default="", help="cuda device, i.e. 0 or 0,1,2,3 or cpu")
    p.add_argument("--multi-scale", action="store_true", help="vary img-size +/- 50%%")
    p.add_argument("--single-cls", action="store_true", help="train multi-class data as single-class")
    p.add_argument("--optimizer", type=str, choices=OPTIMIZERS, default="SGD", help="optimizer")
    p.add_argument("--sync-bn", action="store_true", help="use SyncBatchNorm, only available in DDP mode")
    p.add_argument("--workers", type=_checked("workers"), default=8,
                   help="max dataloader workers (per RANK in DDP mode)")
    p.add_argument("--project", default="runs/train", help="save to project/name")
    p.add_argument("--name", default="exp", help="save to project/name ('cfg': the model yaml's stem)")
    p.add_argument("--exist-ok", action="store_true", help="existing project/name ok, do not increment")
    p.add_argument("--quad", action="store_true", help="quad batches: 4 images -> one of twice the side, loss x4")
    p.add_argument("--cos-lr", action="store_true", help="cosine LR scheduler")
    p.add_argument("--flat-cos-lr", action="store_true", help="flat cosine LR scheduler")
    p.add_argument("--fixed-lr", action="store_true", help="fixed LR scheduler")
    p.add_argument("--label-smoothing", type=_checked("label_smoothing"), default=0.0,
                   help="label smoothing epsilon")
    p.add_argument("--patience", type=_checked("patience"), default=100,
                   help="EarlyStopping patience (epochs without improvement; 0 = never stop)")
    p.add_argument("--freeze", nargs="+", type=_checked("freeze"), default=[0],
                   help="freeze layers: backbone=10, first3=0 1 2")
    p.add_argument("--save-period", type=int, default=-1, help="save checkpoint every x epochs (disabled if < 1)")
    p.add_argument("--seed", type=int, default=0, help="global training seed")
    p.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int, default=-1,
                   help="automatic DDP multi-GPU argument, do not modify")
    p.add_argument("--min-items", type=_checked("min_items"), default=0,
                   help="drop training images with fewer labels (experimental)")
    p.add_argument("--close-mosaic", type=_checked("close_mosaic"), default=0,
                   help="turn mosaic off for the last N epochs (experimental)")
    # W&B arguments: accepted for compatibility, not used
    p.add_argument("--entity", default=None, help="W&B entity (unused)")
    p.add_argument("--upload_dataset", nargs="?", const=True, default=False, help="W&B upload (unused)")
    p.add_argument("--bbox_interval", type=int, default=-1, help="W&B bbox interval (unused)")
    p.add_argument("--artifact_alias", type=str, default="latest", help="W&B artifact version (unused)")
    # --- yolov9c additions ---
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="execution backend: c (C/CUDA kernels, lazy activations: about a third of the activation "
                        "memory) or torch (plain PyTorch, the reference); default: c when training on a CUDA GPU, "
                        "torch on the CPU (c also runs on the CPU, through the C implementations)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="channels-last model and batches on CUDA (default: on with --backend c, off with torch)")
    p.add_argument("--accumulate", type=_checked("accumulate"), default=None,
                   help="micro-batches per optimizer step (default: round(64 / batch), the nominal-64 rule)")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True,
                   help="mixed precision on CUDA (default on; no effect on the CPU)")
    p.add_argument("--ckpt", action="store_true",
                   help="activation checkpointing per model layer: less memory, more time (measured, yolov9-s, batch 64, "
                        "640, H200: 23.05 -> 7.38 GiB peak allocated, 2.6x the step time); "
                        "torch backend only (ignored with a warning under --backend c)")
    add_switch_args(p)
    p.add_argument("--val-period", type=_checked("val_period"), default=1,
                   help="validate every N epochs (the last epoch always)")
    p.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=None,
                   help="pinned host memory for batches (default: PIN_MEMORY env, true; CUDA only)")
    p.add_argument("--gpu-augment", action=argparse.BooleanOptionalAction, default=False,
                   help="loader workers only read and decode; the augment op makes each batch's mosaic, "
                        "copy-paste, warp, mixup, HSV and flips on the training device (the C reference on the CPU); "
                        "same draws and boxes as the CPU pipeline. Default off: on for CUDA only once its GPU "
                        "benchmark and distribution check pass (benchmarks/RESULTS.md); no --rect")
    p.add_argument("--mosaic", type=_checked("mosaic"), default=None,
                   help="mosaic probability (overrides the hyp file)")
    p.add_argument("--mixup", type=_checked("mixup"), default=None,
                   help="mixup probability (overrides the hyp file)")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True,
                   help="capture the training step in CUDA graphs and replay it (default on; runs only on CUDA "
                        "without DDP, a graph per batch shape with --graph-shapes; the log says which step runs and "
                        "why)")
    p.add_argument("--graph-shapes", action=argparse.BooleanOptionalAction, default=True,
                   help="with the CUDA-graph step, one graph per micro-batch shape and box bucket (the --mem-budget "
                        "or out-of-memory micro-batch, --rect, --multi-scale, the last partial batch, --ckpt), "
                        "captured on first use, at most 12, one memory pool (default on; --no-graph-shapes: one "
                        "graph of the fixed shape, other shapes eager)")
    p.add_argument("--cudnn-benchmark", action=argparse.BooleanOptionalAction, default=True,
                   help="with the CUDA-graph step: cuDNN times its convolution algorithms for the fixed training "
                        "shape in the eager warm-up batches and the graphs replay the fastest (default on; not "
                        "with --deterministic; validation and eager batches of other shapes keep the default "
                        "choice)")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic algorithms (torch.use_deterministic_algorithms; slower; off by default)")
    p.add_argument("--max-nonfinite", type=_checked("max_nonfinite"), default=10,
                   help="stop after N optimizer steps in a row skipped for a non-finite loss or gradient "
                        "(default 10; 0 = never stop)")
    p.add_argument("--divergence-stop", action=argparse.BooleanOptionalAction, default=True,
                   help="stop at an epoch's end when the weights are not finite or the training losses are not "
                        "finite or beyond 1e6 (default on; a validation loss alone only warns)")
    p.add_argument("--mem-budget", type=budget_or_auto_type, default=None, metavar="SIZE|auto",
                   help="GPU memory a training step may reserve, e.g. 7.5G (binary) or 8GB (decimal): the memory "
                        "planner picks the micro-batch that fits and accumulates the rest of each batch (same "
                        "images per optimizer step and weight decay); auto: the card's free memory at set-up, the whole run "
                        "planned in it (c recompute switches, then a micro-batch (graphed with --graph-shapes), "
                        "validation with --val-chunks auto; options typed stay); not with --batch-size -1. "
                        "Default: a c run on CUDA reads the card and plans as auto only where its step does not "
                        "fit as set")
    p.add_argument("--mem-cap", type=budget_type, default=None, metavar="SIZE",
                   help="cap the GPU memory this whole run may reserve, e.g. 7G: the training runs as on a card "
                        "of that size (rehearse an 8 GB card on a bigger one: 7G, about what it leaves after the "
                        "CUDA context); --mem-budget caps at its budget unless --mem-cap is given")
    p.add_argument("--val-chunks", choices=VAL_CHUNKS, default=RunConfig.val_chunks,
                   help="auto (default): validation during training runs its forward in chunks sized to the GPU "
                        "memory left beside the CUDA-graph pool, so the graphs are kept (the validation batch, "
                        "detections and mAP stay those of one pass); off: one forward per validation batch, the "
                        "graphs' memory given back first when over half of the card is reserved")
    p.add_argument("--dynamic-img", action="store_true",
                   help="with --mem-budget: shrink the image size (down to --min-img) instead of splitting the "
                        "batch; changes the data distribution (smaller objects)")
    p.add_argument("--min-img", type=_checked("min_img"), default=MIN_IMG,
                   help=f"smallest image size of --dynamic-img (default {MIN_IMG}; rounded up to the max stride)")
    return p


def parse_opt(argv=None, prog="train_dual.py") -> RunConfig:
    """`argv` (default sys.argv[1:]) → the RunConfig of the run; argparse errors exit with code 2. Records in
    `cfg.given` the destinations set explicitly on the command line (resume uses them to override the stored
    options). The one-line way from a command line to a run: train(parse_opt([...]))."""
    parser = build_parser(prog)
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = parser.parse_args(argv)
    # which options did the user type? parse again with every default replaced by a sentinel
    probe = build_parser(prog)
    for a in probe._actions:
        a.default = argparse.SUPPRESS
    given = vars(probe.parse_args(argv))
    if ns.weights and "cfg" not in given:  # the checkpoint's own model, as the published `--cfg '' --weights X`
        ns.cfg = ""                        # (its untyped default, yolo.yaml, does not exist), not yolov9-t
    cfg = RunConfig.from_args(ns, given=given)
    why = combination_error(cfg, name=lambda k: "--" + k.replace("_", "-")) or \
        batch_error(ns.batch_size, 1, ns.mem_budget)  # the process count is checked in main()
    if why:
        parser.error(why)
    why = dynamic_img_error(ns.dynamic_img, ns.mem_budget, "min_img" in given)  # as `python -m yolov9c memory`
    if why:
        parser.error(why)
    return cfg


# The oldest torch that trains (pyproject.toml declares the same): the set-up makes torch.amp.GradScaler (2.3) and
# --backend c reads Tensor._use_count (2.4); older ones fail there with an AttributeError. val and detect run on 2.0.
TORCH_MIN = (2, 4)


def torch_error(version):
    """None when torch `version` ('2.4.1+cu121') can train, else why not (one line)."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None or (int(m[1]), int(m[2])) >= TORCH_MIN:
        return None
    need = ".".join(map(str, TORCH_MIN))
    return (f"training needs torch >= {need} and this is torch {version}: pip install -U 'torch>={need}' "
            f"(val and detect run on older torch)")


def main(argv=None, prog="train_dual.py") -> int:
    """train_dual.py's main (train.py's with prog="train.py"): parse, then train. Returns the exit code (0 done,
    2 usage or input error); `prog` names the script in the usage line and the error prefix."""
    cfg = parse_opt(argv, prog)
    if torch_error(torch.__version__):
        print(f"{prog}: error: {torch_error(torch.__version__)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # "Transferred X/Y items" and data messages
    if cfg.evolve is not None and cfg.evolve < 1:
        print(f"{prog}: error: --evolve {cfg.evolve}: the number of generations must be >= 1",
              file=sys.stderr)
        return 2
    # before CUDA starts: variable-size temporaries (loss, multi-scale) fragment fixed segments
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    dump_stacks_on_signal()
    world = len(_device_ids(cfg)) if _wants_ddp(cfg) else int(os.getenv("WORLD_SIZE", 1))
    if world == 1 and "RANK" not in os.environ:
        stop_on_signals(prog)
    cuda = torch.cuda.is_available() and str(cfg.device).strip().lower() != "cpu"
    why = batch_error(cfg.batch_size, world, cfg.mem_budget, cuda=cuda)  # set-up asks the same (batching.py)
    if why:
        return refuse_before_ddp(prog, why)
    if _wants_ddp(cfg):
        if cfg.evolve is not None:
            print(f"{prog}: error: --evolve is not compatible with multi-GPU DDP (as published): give one "
                  "--device", file=sys.stderr)
            return 2
        return _launch_ddp(cfg, sys.argv[1:] if argv is None else list(argv), prog)
    try:
        if cfg.evolve is not None:
            evolve(cfg, prog=prog)
        else:
            train(cfg, prog=prog)
    except (TrainError, *USER_ERRORS) as e:  # before any OSError handling: DiskFullError is an OSError
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"{prog}: {interrupt_hint(cfg, e)}", file=sys.stderr)
        return 130
    return 0


def refuse_before_ddp(prog, why) -> int:
    """A user error found before training starts, the same in every process torchrun started: rank 0 (or the
    only process) prints the one `error:` line, and every rank returns 2 only after it has. torchrun stops the
    other processes as soon as one exits, so a rank that left first could cut rank 0 off before it printed:
    the ranks meet in a gloo barrier first (CPU, any machine; best effort, the line is printed before it)."""
    rank, world = int(os.getenv("RANK", -1)), int(os.getenv("WORLD_SIZE", 1))
    if rank <= 0:
        print(f"{prog}: error: {why}", file=sys.stderr, flush=True)
    if rank >= 0 and world > 1:
        import datetime

        import torch.distributed as dist
        try:
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
            dist.barrier()
            dist.destroy_process_group()
        except (RuntimeError, ValueError):  # a rank that cannot reach the others still exits with code 2
            pass
        # leave together, now: torchrun sends SIGTERM to the ranks still shutting down (~0.1 s for an
        # interpreter with torch loaded) once one has exited, and reports them as killed, not as exit code 2
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)
    return 2


def stop_on_signals(prog="train_dual.py"):
    """Ctrl-C (SIGINT) and SIGTERM (a scheduler's time limit or preemption, `kill PID`) stop a one-process run
    alike: the first raises KeyboardInterrupt (the trainer's path: `interrupted; resume with --resume ...`, the
    loaders stopped, an unsaved fresh run folder removed). A second one while the run stops is one line and is
    otherwise ignored: its KeyboardInterrupt would cut that clean-up short and replace the resume line with
    "nothing was saved". A third quits at once (exit 128 + signal; checkpoints on disk are whole files).
    Not under DDP (torchrun stops its ranks with SIGTERM). Test: tests/cli/test_train_cli.py."""
    received = []

    def stop(signum, frame):
        received.append(signum)
        if len(received) == 1:
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        if len(received) == 2:
            print(f"{prog}: stopping: closing the run's files and loader workers ({name} once more quits at once)",
                  file=sys.stderr, flush=True)
            return
        print(f"{prog}: quit at once on a third signal ({name}); checkpoints already written are whole",
              file=sys.stderr, flush=True)
        os._exit(128 + signum)

    for sig in ("SIGINT", "SIGTERM"):
        if hasattr(signal, sig):
            signal.signal(getattr(signal, sig), stop)


def dump_stacks_on_signal():
    """`kill -USR1 <pid>` of a run that seems stuck prints every thread's Python stack to stderr; the run goes on
    (the process's own stderr, fd 2; docs/train.md). No-op without SIGUSR1 (Windows) or without a real stderr.
    Test: tests/cli/test_train_cli.py."""
    if hasattr(signal, "SIGUSR1"):
        try:
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True, chain=False)
        except (AttributeError, OSError, ValueError):  # no stderr, or one without a file descriptor
            pass


def interrupt_hint(cfg, e):
    """The one line printed after Ctrl-C: the checkpoint a --resume continues from, or that there is none."""
    if isinstance(e, Interrupted) and e.last is not None:
        return f"interrupted; resume with --resume {e.last}"
    if isinstance(e, Interrupted) and getattr(e, "removed", False):
        return (f"interrupted before the first epoch was saved: nothing to resume, {e.save_dir} removed; the same "
                f"command starts the run again there")
    if isinstance(e, Interrupted):
        return (f"interrupted: {e.save_dir} has no checkpoint to resume (none saved yet, or --nosave); start "
                f"the run again")
    if cfg.evolve is not None:
        return "interrupted; evolve.csv keeps the finished generations: add --resume to the same command to go on"
    if cfg.resume:
        return "interrupted before training went on; the run's checkpoint is unchanged: run the same --resume again"
    return "interrupted before training started; nothing was saved"


def _device_ids(cfg):
    return [d.strip() for d in str(cfg.device).replace("cuda:", "").split(",") if d.strip()]


def _wants_ddp(cfg):
    """--device 0,1[,…] in a plain `python train_dual.py` (no torchrun variables) on a CUDA machine."""
    ids = _device_ids(cfg)
    if len(ids) < 2 or os.getenv("RANK") is not None or str(cfg.device).strip().lower() == "cpu":
        return False
    return torch.cuda.is_available()


def _launch_ddp(cfg, argv, prog="train_dual.py"):
    """Start one process per listed GPU through torch.distributed.run (DDP, NCCL) instead of DataParallel;
    returns its exit code. CUDA_VISIBLE_DEVICES restricts the processes to the listed GPUs. torchrun runs
    through cli/ddp_launch.py: a rank's `error:` line is not followed by torchrun's traceback."""
    ids = _device_ids(cfg)  # main() checked the batch against len(ids) (batching.batch_error)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(ids))
    script = Path(sys.argv[0]).resolve() if Path(sys.argv[0]).name == prog else None
    target = [str(script)] if script else ["-m", "yolov9c.cli.train"]
    cmd = [sys.executable, "-m", "yolov9c.cli.ddp_launch", "--standalone", f"--nproc_per_node={len(ids)}", *target,
           *argv]
    print(f"{prog}: starting DDP: " + " ".join(cmd), file=sys.stderr)
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
