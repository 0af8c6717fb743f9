"""Training-step memory and speed per backend and layout.

    python benchmarks/bench_memory.py                                   # yolov9-s and yolov9-c, batch 64, 640, CUDA
    python benchmarks/bench_memory.py --models yolov9-s --markdown      # + the markdown table
    python benchmarks/bench_memory.py --device cpu --batch 2 --img 64 --steps 2 --models yolov9-t --threads 1
    python benchmarks/bench_memory.py --table out.jsonl                 # the table of saved JSON lines

One step is train_dual.py's per batch: random uint8 images → float/255 → forward and the dual loss under fp16
autocast (CUDA) → GradScaler backward → unscale, clip to 10, SGD step → zero_grad; --boxes random boxes per
image. Configurations (--configs), each in a fresh subprocess (an out-of-memory error is a row): torch-nchw
(the published layout, the reference of the ratios), torch-cl, torch-ckpt (per-layer checkpointing as --ckpt),
c-cl, c-nchw, and c-cl-graph / torch-cl-graph (the trainer's own step replayed as CUDA graphs, bench_step.py's
code; CUDA only). Measured after --warmup steps: peak allocated and reserved GiB, the memory held between
steps, the median of --steps step times. PYTORCH_CUDA_ALLOC_CONF defaults to expandable_segments:True.
One JSON line per configuration; --markdown adds the table.
Test: python -m pytest -q tests/benchmarks/test_bench_memory.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before torch starts CUDA

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runs from a checkout without installing
from yolov9c.units import GIB  # noqa: E402
CONFIGS = {  # name: (backend, channels_last, per-layer checkpointing, whole-step CUDA graph); the default run
    # order (c rows early, so that a run cut short by a time limit still has them)
    "torch-nchw": ("torch", False, False, False),
    "c-cl": ("c", True, False, False),
    "c-cl-graph": ("c", True, False, True),
    "torch-cl": ("torch", True, False, False),
    "torch-cl-graph": ("torch", True, False, True),
    "c-nchw": ("c", False, False, False),
    "torch-ckpt": ("torch", False, True, False),
}
REFERENCE = "torch-nchw"


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["yolov9-s", "yolov9-c"], help="model yaml names")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS), help="rows to run")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--img", type=int, default=640)
    p.add_argument("--boxes", type=int, default=20, help="boxes per image")
    p.add_argument("--nc", type=int, default=80, help="classes")
    p.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (cuDNN choices, allocator)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--threads", type=int, default=0, help="CPU threads of torch (0: torch's default)")
    p.add_argument("--no-amp", dest="amp", action="store_false", help="float32 on CUDA (default fp16 autocast)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per configuration")
    p.add_argument("--markdown", action="store_true", help="also print the markdown table")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="torch.backends.cudnn.benchmark = True in every row (as bench_step.py's flag; the -graph rows "
                        "then warm up and capture under it, as train_dual.py's default)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after timing, profile N steps (torch.profiler tables to stderr)")
    p.add_argument("--table", metavar="JSONL", help="only print the markdown table of saved JSON lines")
    p.add_argument("--one", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)  # the subprocess
    return p


# ---------------------------------------------------------------------------------------------------------
# One configuration (runs in its own process)
# ---------------------------------------------------------------------------------------------------------

def run_one(model_name, config, args):
    """Build, warm up and time one configuration; returns its result dict (status ok or oom)."""
    import torch

    from yolov9c.api import build_model, make_loss
    from yolov9c.engine.train.layer_ckpt import bn_buffers, checkpointed_forward
    from yolov9c.engine.train.memory_plan import random_targets

    backend, channels_last, ckpt, graph = CONFIGS[config]
    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    if graph:
        return _run_graph(model_name, config, args)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    amp = cuda and args.amp
    row = {"model": model_name, "config": config, "backend": backend,
           "layout": "channels_last" if channels_last else "nchw", "ckpt": ckpt, "device": str(device),
           "gpu": torch.cuda.get_device_name(device) if cuda else None, "torch": torch.__version__,
           "batch": args.batch, "img": args.img, "boxes": args.boxes, "amp": amp, "steps": args.steps,
           "warmup": args.warmup}
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = build_model(model_name, nc=args.nc).to(device, memory_format=fmt).train()
    # the loss of the same backend (c: tal_assign + det_loss kernels), built before the backend as the trainer does
    loss_fn = make_loss(model, backend=backend)
    if backend != "torch":
        from yolov9c.backends import apply

        out = apply(model, backend)
        model = model if out is None else out
    if ckpt:
        import types

        model.forward = types.MethodType(checkpointed_forward, model)
    saved_buffers = bn_buffers(model) if ckpt else []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    images = torch.randint(0, 256, (args.batch, 3, args.img, args.img), dtype=torch.uint8, generator=gen)
    images = images.to(device).contiguous(memory_format=fmt)
    targets = random_targets(args.batch, args.boxes, args.nc, gen).to(device)
    losses = []

    def step():
        imgs = images.float() / 255
        with torch.autocast(device.type, enabled=amp):
            pred = model(imgs)
            loss, _items = loss_fn(pred, targets)
        saved = [b.clone() for b in saved_buffers]
        scaler.scale(loss.sum()).backward()
        for b, s in zip(saved_buffers, saved):  # as the trainer: --ckpt's second forward must not count twice
            b.copy_(s)
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(float(loss.detach().sum()))

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    try:
        for _ in range(args.warmup):
            step()
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            static = torch.cuda.memory_allocated(device)
        times = []
        for _ in range(args.steps):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
    except torch.cuda.OutOfMemoryError as e:
        row.update(status="oom", error=str(e).splitlines()[0][:300])
        return row
    if getattr(args, "profile", 0):
        _profile(step, sync, args.profile, f"{model_name} {config}")
    times.sort()
    n = len(times)
    ms = 1000 * (times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) / 2)
    row.update(status="ok", step_ms=round(ms, 2), img_per_s=round(args.batch / (ms / 1000), 1),
               first_loss=losses[0], last_loss=losses[-1])
    if cuda:
        row.update(peak_alloc_gib=round(torch.cuda.max_memory_allocated(device) / GIB, 3),
                   peak_reserved_gib=round(torch.cuda.max_memory_reserved(device) / GIB, 3),
                   static_alloc_gib=round(static / GIB, 3))
    else:
        row.update(peak_alloc_gib=None, peak_reserved_gib=None, static_alloc_gib=None)
    return row


def _run_graph(model_name, config, args):
    """A -graph configuration: bench_step.py's graphed trainer step (the same fields as the other rows)."""
    import bench_step
    import torch

    backend = CONFIGS[config][0]
    row = {"model": model_name, "config": config, "backend": backend, "layout": "channels_last", "ckpt": False,
           "device": args.device, "batch": args.batch, "img": args.img, "boxes": args.boxes}
    if torch.device(args.device).type != "cuda":
        return {**row, "status": "error", "error": f"{config} needs a CUDA device (whole-step CUDA graphs)"}
    r = bench_step.run_one(model_name, backend, "graph", "fixed", args)
    row.update({k: r[k] for k in ("status", "error", "step_ms", "peak_alloc_gib", "peak_reserved_gib", "gpu_ms")
                if k in r})
    if r.get("status") == "ok":
        row.update(img_per_s=round(args.batch / (r["step_ms"] / 1000), 1), static_alloc_gib=None,
                   graphed=r.get("graphed"))
    return row


def _profile(step, sync, steps, label):
    """torch.profiler over `steps` steps: the top kernels by GPU time and the top ops by CPU time, to stderr,
    plus GPU-busy time per step (sum of kernel times) — a step much longer than it is launch/host bound."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    sync()
    with profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        sync()
    ka = prof.key_averages()
    dev_attr = "self_device_time_total" if hasattr(ka[0], "self_device_time_total") else "self_cuda_time_total"
    busy = sum(getattr(e, dev_attr) for e in ka if e.device_type == torch.autograd.DeviceType.CUDA)
    print(f"== profile {label}: GPU kernel time {busy / 1000 / steps:.1f} ms/step", file=sys.stderr)
    print(ka.table(sort_by=dev_attr, row_limit=45, max_name_column_width=70), file=sys.stderr)
    print(ka.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70), file=sys.stderr)


# ---------------------------------------------------------------------------------------------------------
# The driver: one subprocess per configuration, ratios, table
# ---------------------------------------------------------------------------------------------------------

def child_argv(args, model_name, config):
    argv = [sys.executable, str(Path(__file__).resolve()), "--one", model_name, config, "--batch", str(args.batch),
            "--img", str(args.img), "--boxes", str(args.boxes), "--nc", str(args.nc), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--device", args.device, "--threads", str(args.threads), "--profile", str(args.profile)]
    return argv + ([] if args.amp else ["--no-amp"]) + (["--cudnn-benchmark"] if args.cudnn_benchmark else [])


def run_config(args, model_name, config):
    """Run one configuration in a fresh interpreter; a crash, an OOM or a timeout becomes a row."""
    base = {"model": model_name, "config": config, "backend": CONFIGS[config][0],
            "layout": "channels_last" if CONFIGS[config][1] else "nchw", "ckpt": CONFIGS[config][2],
            "device": args.device, "batch": args.batch, "img": args.img, "boxes": args.boxes}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    try:
        r = subprocess.run(child_argv(args, model_name, config), capture_output=True, text=True, env=env,
                           timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {**base, "status": "timeout", "error": f"no result within {args.timeout:g} s"}
    if args.profile and r.stderr:
        sys.stderr.write(r.stderr)  # the profiler tables
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = [s for s in r.stderr.strip().splitlines() if s.strip()]
    oom = "out of memory" in r.stderr.lower()
    return {**base, "status": "oom" if oom else "error", "returncode": r.returncode,
            "error": (tail[-1] if tail else "no output")[:300]}


def add_ratios(rows):
    """alloc/reserved/step ratios to the torch-nchw row of the same model (None where either is missing)."""
    ref = {r["model"]: r for r in rows if r["config"] == REFERENCE and r.get("status") == "ok"}
    for r in rows:
        base = ref.get(r["model"])
        for key, out in (("peak_alloc_gib", "alloc_ratio"), ("peak_reserved_gib", "reserved_ratio"),
                         ("step_ms", "step_ratio")):
            a, b = r.get(key), base.get(key) if base else None
            r[out] = round(a / b, 3) if a is not None and b else None
    return rows


def markdown(rows):
    """The RESULTS.md table of a list of rows (ratios already added)."""
    def f(v, spec):
        return "—" if v is None else format(v, spec)

    out = ["| model | config | status | peak allocated GiB | × torch | peak reserved GiB | × torch | held between "
           "steps GiB | step ms | × torch | img/s |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['config']} | {r.get('status')} | {f(r.get('peak_alloc_gib'), '.2f')} | "
                   f"{f(r.get('alloc_ratio'), '.2f')} | {f(r.get('peak_reserved_gib'), '.2f')} | "
                   f"{f(r.get('reserved_ratio'), '.2f')} | {f(r.get('static_alloc_gib'), '.2f')} | "
                   f"{f(r.get('step_ms'), '.1f')} | {f(r.get('step_ratio'), '.2f')} | {f(r.get('img_per_s'), '.1f')} |")
    return "\n".join(out)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.table:
        rows = [json.loads(s) for s in Path(args.table).read_text().splitlines() if s.startswith("{")]
        print(markdown(add_ratios(rows)))
        return 0
    if args.one:
        model_name, config = args.one
        if config not in CONFIGS:
            raise SystemExit(f"bench_memory: unknown configuration {config!r}")
        print(json.dumps(run_one(model_name, config, args)), flush=True)
        return 0
    configs = [REFERENCE] + [c for c in args.configs if c != REFERENCE] if REFERENCE in args.configs \
        else list(args.configs)  # the reference first, so each later row can carry its ratios at once
    rows = []
    for model_name in args.models:
        for config in configs:
            row = run_config(args, model_name, config)
            rows.append(row)
            add_ratios(rows)
            print(json.dumps(row), flush=True)
    if args.markdown:
        print()
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
