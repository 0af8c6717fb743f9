r"""The published YOLOv9 training step, timed the way bench_step.py times ours, for ratio tables with both in one
run. Pass the published checkout and a Python that has what it imports (its requirements.txt).

    python benchmarks/bench_published_step.py --published /path/to/published-yolov9            # s and c, 64, 640
    python benchmarks/bench_published_step.py --published P --models yolov9-s --modes nchw --markdown
    python benchmarks/bench_published_step.py --published P --device cpu --models yolov9-t --batch 2 --img 64 \
        --steps 2 --warmup 1 --profile 0

Each configuration runs in its own subprocess inside the checkout (dev/fidelity/published_side.py's stand-ins for its
optional imports; no yolov9c import): the published train_dual.py batch loop at accumulate 1, built as its
train() builds it, on bench_step.py's random uint8 images and targets. One JSON line per configuration: step_ms
(median), min_ms, peak allocated / reserved GiB, gpu_ms (profiled); an out-of-memory step is a row with status
"oom". Exit 2 when the checkout is missing, 1 when a row failed, else 0.
Test (what runs without the published code): python -m pytest -q tests/benchmarks/test_bench_published_step.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIB = 2 ** 30  # yolov9c.units.GIB spelled out: this file runs in the published code's interpreter too
MODES = ("nchw", "channels_last")
CLONE = "git clone https://github.com/WongKinYiu/yolov9"
HYP = "data/hyps/hyp.scratch-high.yaml"
MAX_GRAD_NORM = 10.0  # published train_dual.py clips to this before every optimizer step


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--published", metavar="PATH", help=f"the published YOLOv9 checkout ({CLONE})")
    p.add_argument("--models", nargs="+", default=["yolov9-s", "yolov9-c"], help="models/detect/<name>.yaml")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--img", type=int, default=640)
    p.add_argument("--boxes", type=int, default=20, help="boxes per image")
    p.add_argument("--nc", type=int, default=80)
    p.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--profile", type=int, default=2, help="steps under torch.profiler for the GPU time (0: off)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--no-deterministic", dest="deterministic", action="store_false",
                   help="leave torch.use_deterministic_algorithms off (published train() turns it on)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per configuration")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--one", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)  # the subprocess
    return p


def check_published(args):
    """The checkout and its model yamls (and --steps), before anything starts: an error line (str) or None."""
    if args.steps < 1:
        return f"error: --steps {args.steps}: at least 1 timed step"
    how = f"get the published code with `{CLONE}` and pass its folder as --published PATH"
    if not args.published:
        return f"error: --published PATH is required (the published YOLOv9 checkout, never part of this repo): {how}"
    root = Path(args.published)
    if not (root / "train_dual.py").is_file():
        return f"error: --published {root}: no train_dual.py there (not the published YOLOv9 checkout): {how}"
    missing = [m for m in args.models if not (root / "models" / "detect" / f"{m}.yaml").is_file()]
    if missing:
        have = sorted(f.stem for f in (root / "models" / "detect").glob("*.yaml"))
        return f"error: --published {root}: no models/detect/{missing[0]}.yaml (there: {', '.join(have)})"
    return None


# ---------------------------------------------------------------------------------------------------------
# One configuration (its own process, the published checkout as working directory)
# ---------------------------------------------------------------------------------------------------------

def _bench_helpers():
    """memory_plan.random_targets (the boxes bench_step.py gives ours; its module is loaded from its file: it
    imports only the standard library at the top, so no yolov9c package is imported) and bench_step._gpu_ms,
    without bench_step's import-time default of PYTORCH_CUDA_ALLOC_CONF (the published step runs with the
    caller's allocator settings)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_yolov9c_memory_plan", HERE.parent / "yolov9c" / "engine" / "train" / "memory_plan.py")
    plan = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = plan  # its dataclasses look their module up there
    spec.loader.exec_module(plan)
    before = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    sys.path.insert(0, str(HERE))
    from bench_step import _gpu_ms

    if before is None:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return plan.random_targets, _gpu_ms


def _published_modules(root):
    """Import the published pieces from `root` (after published_side's stand-ins)."""
    os.chdir(root)
    sys.path.insert(0, str(HERE.parent / "dev" / "fidelity"))
    import published_side  # noqa: F401  (its import puts the working directory first on sys.path, stand-ins)

    from models.yolo import Model
    from utils.general import init_seeds
    from utils.loss_tal_dual import ComputeLoss
    from utils.torch_utils import ModelEMA, smart_optimizer

    return Model, init_seeds, ComputeLoss, ModelEMA, smart_optimizer


class PublishedStep:
    """Model, loss, optimizer, scaler and EMA of a fresh published train_dual.py run; __call__ is one batch."""

    def __init__(self, model_name, mode, args):
        import torch
        import yaml

        Model, init_seeds, ComputeLoss, ModelEMA, smart_optimizer = _published_modules(args.published)
        init_seeds(0, deterministic=args.deterministic)  # train(): seed + 1 + RANK with RANK = -1
        self.device = torch.device(args.device)
        self.amp = self.device.type == "cuda"  # check_amp's answer on a working GPU
        self.fmt = torch.channels_last if mode == "channels_last" else torch.contiguous_format
        with open(HYP) as f:
            hyp = yaml.safe_load(f)
        hyp["label_smoothing"] = 0.0  # train_dual.py's --label-smoothing default
        model = Model(f"models/detect/{model_name}.yaml", ch=3, nc=args.nc, anchors=hyp.get("anchors"))
        self.model = model.to(self.device, memory_format=self.fmt)
        self.optimizer = smart_optimizer(self.model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
        self.ema = ModelEMA(self.model)
        self.model.half().float()  # train(): "pre-reduce anchor precision" (keeps the memory format)
        self.model.nc, self.model.hyp = args.nc, hyp
        self.model.train()
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp)
        self.loss = ComputeLoss(self.model)
        self.optimizer.zero_grad()

    def __call__(self, imgs_uint8, targets):
        import torch

        imgs = imgs_uint8.contiguous(memory_format=self.fmt).float() / 255
        with torch.autocast(self.device.type, enabled=self.amp):
            pred = self.model(imgs)
            loss, loss_items = self.loss(pred, targets.to(self.device))
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=MAX_GRAD_NORM)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
        self.ema.update(self.model)
        return loss_items


def run_one(model_name, mode, args):
    import torch

    random_targets, gpu_ms = _bench_helpers()
    cuda = args.device.startswith("cuda")
    row = {"model": model_name, "backend": "published", "mode": mode, "batch": args.batch, "img": args.img,
           "boxes": args.boxes, "device": args.device, "deterministic": args.deterministic,
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "torch": torch.__version__}

    def sync():
        if cuda:
            torch.cuda.synchronize(args.device)

    try:
        step = PublishedStep(model_name, mode, args)  # first: init_seeds sets cuBLAS's workspace before CUDA starts
        row["gpu"] = torch.cuda.get_device_name(step.device) if cuda else "cpu"
        gen = torch.Generator().manual_seed(0)
        images = torch.randint(0, 256, (args.batch, 3, args.img, args.img), dtype=torch.uint8, generator=gen)
        images = images.to(step.device).contiguous(memory_format=step.fmt)
        targets = random_targets(args.batch, args.boxes, args.nc, gen)
        for _ in range(args.warmup):
            step(images, targets)
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats(args.device)
        times = []
        for _ in range(args.steps):
            sync()
            t0 = time.perf_counter()
            items = step(images, targets)
            sync()
            times.append(time.perf_counter() - t0)
        last_loss = float(items.sum())
    except torch.cuda.OutOfMemoryError as e:
        return {**row, "status": "oom", "error": str(e).splitlines()[0][:200]}
    times.sort()
    row.update(status="ok", step_ms=round(1000 * times[len(times) // 2], 2), min_ms=round(1000 * times[0], 2),
               peak_alloc_gib=round(torch.cuda.max_memory_allocated(args.device) / GIB, 3) if cuda else None,
               peak_reserved_gib=round(torch.cuda.max_memory_reserved(args.device) / GIB, 3) if cuda else None,
               last_loss=last_loss, ema_updates=step.ema.updates,
               weights_channels_last=_weights_channels_last(step.model))
    if args.profile and cuda:
        gpu, launches = gpu_ms(lambda: step(images, targets), args.profile)[:2]  # (ms, launches, groups, top)
        row.update(gpu_ms=round(gpu, 2), gpu_launches=launches)
    return row


def _weights_channels_last(model):
    """Whether every 4-d weight is laid out channels-last (the mode took effect and survived half().float())."""
    import torch

    w = [p for p in model.parameters() if p.dim() == 4]
    return all(p.is_contiguous(memory_format=torch.channels_last) for p in w)


# ---------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------

def run_config(args, model_name, mode):
    argv = [sys.executable, str(Path(__file__).resolve()), "--one", model_name, mode,
            "--published", str(args.published), "--device", args.device]
    for k in ("batch", "img", "boxes", "nc", "steps", "warmup", "profile"):
        argv += [f"--{k}", str(getattr(args, k))]
    if not args.deterministic:
        argv.append("--no-deterministic")
    base = {"model": model_name, "backend": "published", "mode": mode, "batch": args.batch, "img": args.img}
    try:
        r = subprocess.run(argv, capture_output=True, text=True, cwd=args.published, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {**base, "status": "timeout"}
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = [s for s in r.stderr.strip().splitlines() if s.strip()]
    error = (tail[-1] if tail else "no output")[:300]
    if "ModuleNotFoundError" in error:
        error += f" (the published code's requirements: pip install -r {args.published}/requirements.txt)"
    return {**base, "status": "error", "error": error}


def markdown(rows):
    out = ["| model | backend | mode | status | step ms (median) | min ms | × nchw | GPU ms/step | "
           "peak allocated GiB | peak reserved GiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    nchw = {r["model"]: r.get("step_ms") for r in rows if r["mode"] == "nchw"}
    for r in rows:
        base = nchw.get(r["model"])
        ratio = f"{r['step_ms'] / base:.2f}" if r.get("step_ms") and base else "—"
        cells = [r.get(k) for k in ("step_ms", "min_ms")] + [ratio] + \
                [r.get(k) for k in ("gpu_ms", "peak_alloc_gib", "peak_reserved_gib")]
        out.append(f"| {r['model']} | {r['backend']} | {r['mode']} | {r['status']} | "
                   + " | ".join("—" if c is None else str(c) for c in cells) + " |")
    return "\n".join(out)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.one:
        args.models = [args.one[0]]
    error = check_published(args)
    if error:
        print(error, file=sys.stderr)
        return 2
    args.published = str(Path(args.published).resolve())
    if args.one:
        print(json.dumps(run_one(*args.one, args)), flush=True)
        return 0
    rows = []
    for m in args.models:
        for mode in args.modes:
            rows.append(run_config(args, m, mode))
            print(json.dumps(rows[-1]), flush=True)
    if args.markdown:
        print(markdown(rows))
    return 1 if any(r["status"] in ("error", "timeout") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
