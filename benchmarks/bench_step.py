"""The trainer's training step, eager against CUDA graphs, per model and backend.

    python benchmarks/bench_step.py                                # yolov9-s and yolov9-c, batch 64, 640, AMP
    python benchmarks/bench_step.py --models yolov9-s --backends c --steps 10 --markdown

The step is the trainer's own (yolov9c.engine.train.step.EagerStep and graph_step.GraphStep) on a RunState
built here as setup() builds it for a fresh run: DetectionModel → channels-last on CUDA → the optimizer of
build_optimizer (SGD, Nesterov, three groups) → EMA → GradScaler → the loss of the backend → the backend.
accumulate = 1 (batch 64 = the nominal batch): every step is forward, loss, scaled backward, unscale, clip,
optimizer step, scaler update, EMA update. Inputs: random uint8 images (on the device, turned float/255 in
the memory format as prepare_batch does) and --boxes random boxes per image (host targets, as the loader
gives them). After --warmup steps (the graph step captures after its own 3 eager ones), --steps timed steps
with torch.cuda.synchronize() around each: the median ms; GPU time per step = the sum of kernel times of
--profile steps under torch.profiler (also split by op group and the longest kernels); peak allocated / reserved GiB over the timed steps. Each configuration
runs in its own subprocess. One JSON line per configuration; --markdown adds the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

REPO = Path(__file__).resolve().parents[1]
GIB = 2 ** 30


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["yolov9-s", "yolov9-c"])
    p.add_argument("--backends", nargs="+", default=["c", "torch"], choices=["c", "torch"])
    p.add_argument("--modes", nargs="+", default=["eager", "graph"], choices=["eager", "graph"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--img", type=int, default=640)
    p.add_argument("--boxes", type=int, default=20)
    p.add_argument("--nc", type=int, default=80)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5, help="untimed steps (≥ 4: the graph step captures at the 4th)")
    p.add_argument("--profile", type=int, default=2, help="steps under torch.profiler for the GPU time (0: off)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="torch.backends.cudnn.benchmark = True in every configuration (cuDNN times its algorithms per "
                        "shape in the warm-up): the eager steps run with it throughout, the graph step as the "
                        "trainer runs it by default (--cudnn-benchmark: warm-up and captures); off: neither")
    p.add_argument("--one", nargs=3, metavar=("MODEL", "BACKEND", "MODE"), help=argparse.SUPPRESS)
    return p


def _state(model_name, backend, args):
    import torch

    from yolov9c.api import build_model, make_loss
    from yolov9c.backends import apply
    from yolov9c.engine.train.batching import Batching
    from yolov9c.engine.train.config import RunConfig
    from yolov9c.engine.train.ema import ModelEMA
    from yolov9c.engine.train.layer_ckpt import bn_buffers
    from yolov9c.engine.train.optim import build_optimizer
    from yolov9c.engine.train.state import RunState
    from yolov9c.resources import load_hyp

    device = torch.device("cuda")
    torch.manual_seed(0)
    hyp = load_hyp(None)
    model = build_model(model_name, nc=args.nc).to(device, memory_format=torch.channels_last).train()
    optimizer = build_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"], log=lambda *a: None)
    ema = ModelEMA(model)
    loss = make_loss(model, hyp, backend=backend)
    if backend != "torch":
        out = apply(model, backend)
        model = model if out is None else out
    cfg = RunConfig(backend=backend, channels_last=True, cudnn_benchmark=bool(args.cudnn_benchmark))
    return RunState(cfg=cfg, device=device, amp=True,
                    memory_format=torch.channels_last, hyp=hyp, model=model, ema=ema, loss=loss,
                    optimizer=optimizer, scaler=torch.amp.GradScaler("cuda"),
                    batching=Batching(args.batch, 1, nominal=args.batch, fixed_accumulate=1), bn_stats=bn_buffers(model), log=lambda *a: None)


def run_one(model_name, backend, mode, args):
    import torch

    from yolov9c.engine.train.graph_step import GraphStep
    from yolov9c.engine.train.memory_plan import random_targets
    from yolov9c.engine.train.step import EagerStep

    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    state = _state(model_name, backend, args)
    step = GraphStep(state) if mode == "graph" else EagerStep()
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (args.batch, 3, args.img, args.img), dtype=torch.uint8, generator=gen)
    images = images.cuda().contiguous(memory_format=torch.channels_last)
    targets = random_targets(args.batch, args.boxes, args.nc, gen)
    ni = [0]

    def one():
        imgs = images.contiguous(memory_format=state.memory_format).float() / 255
        r = step(state, imgs, targets, ni[0])
        ni[0] += 1
        return r

    row = {"model": model_name, "backend": backend, "mode": mode, "batch": args.batch, "img": args.img,
           "boxes": args.boxes, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cudnn_benchmark": bool(args.cudnn_benchmark)}
    try:
        for _ in range(args.warmup):
            one()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times, losses = [], []
        for _ in range(args.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = one()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(float(r.loss_items.sum()))
    except torch.cuda.OutOfMemoryError as e:
        return {**row, "status": "oom", "error": str(e).splitlines()[0][:200]}
    times.sort()
    row.update(status="ok", step_ms=round(1000 * times[len(times) // 2], 2), min_ms=round(1000 * times[0], 2),
               peak_alloc_gib=round(torch.cuda.max_memory_allocated() / GIB, 3),
               peak_reserved_gib=round(torch.cuda.max_memory_reserved() / GIB, 3), last_loss=losses[-1],
               graphed=mode == "graph" and bool(step.micro))
    if args.profile:
        gpu, groups, top = _gpu_ms(one, args.profile)
        row.update(gpu_ms=round(gpu, 2), gpu_ms_by_group=groups, top_kernels=top)
    return row


# kernel-name patterns of the op groups of the GPU-time breakdown, first match wins
KERNEL_GROUPS = [
    ("bn_silu", ("bn_", "batchnorm", "silu")),
    ("pool_upsample", ("pool", "upsample")),
    ("conv", ("xmma", "implicit", "conv", "dgrad", "wgrad", "cutlass", "gemm", "cudnn")),
    ("loss_assign", ("det_loss", "tal_")),
    ("optimizer", ("multi_tensor", "foreach", "fused_sgd", "fused_adam", "_amp_", "optimizer")),
    ("copy", ("copy", "memcpy", "memset", "catarray", "fill")),
    ("elementwise", ("elementwise", "vectorized", "unrolled")),
    ("reduce", ("reduce",)),
]


def kernel_group(name):
    low = name.lower()
    for group, keys in KERNEL_GROUPS:
        if any(k in low for k in keys):
            return group
    return "other"


def _gpu_ms(one, steps):
    """GPU time per step under torch.profiler (graph replays included): the sum of CUDA kernel times, the same
    split by op group (KERNEL_GROUPS) and the 12 longest kernels, all in ms per step."""
    from gpu_timing import kernel_times

    kernels = kernel_times(one, steps)
    groups = {}
    for name, ms in kernels:
        groups[kernel_group(name)] = groups.get(kernel_group(name), 0.0) + ms
    top = kernels[:12]
    return (sum(ms for _, ms in kernels), {g: round(ms, 2) for g, ms in sorted(groups.items(), key=lambda g: -g[1])},
            [[name[:90], round(ms, 2)] for name, ms in top])


def run_config(args, model_name, backend, mode):
    argv = [sys.executable, str(Path(__file__).resolve()), "--one", model_name, backend, mode]
    for k in ("batch", "img", "boxes", "nc", "steps", "warmup", "profile"):
        argv += [f"--{k}", str(getattr(args, k))]
    if args.cudnn_benchmark:
        argv.append("--cudnn-benchmark")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    base = {"model": model_name, "backend": backend, "mode": mode}
    try:
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {**base, "status": "timeout"}
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = [s for s in r.stderr.strip().splitlines() if s.strip()]
    return {**base, "status": "error", "error": (tail[-1] if tail else "no output")[:300]}


def markdown(rows):
    out = ["| model | backend | step | status | step ms (median) | × eager | GPU ms/step | peak allocated GiB | "
           "peak reserved GiB |", "|---|---|---|---|---|---|---|---|---|"]
    eager = {(r["model"], r["backend"]): r.get("step_ms") for r in rows if r["mode"] == "eager"}
    for r in rows:
        base = eager.get((r["model"], r["backend"]))
        ratio = f"{r['step_ms'] / base:.2f}" if r.get("step_ms") and base else "—"
        out.append(f"| {r['model']} | {r['backend']} | {r['mode']} | {r['status']} | {r.get('step_ms', '—')} | "
                   f"{ratio} | {r.get('gpu_ms', '—')} | {r.get('peak_alloc_gib', '—')} | "
                   f"{r.get('peak_reserved_gib', '—')} |")
    return "\n".join(out)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.one:
        print(json.dumps(run_one(*args.one, args)), flush=True)
        return
    rows = []
    for m in args.models:
        for b in args.backends:
            for mode in args.modes:
                rows.append(run_config(args, m, b, mode))
                print(json.dumps(rows[-1]), flush=True)
    if args.markdown:
        print(markdown(rows))


if __name__ == "__main__":
    main()
