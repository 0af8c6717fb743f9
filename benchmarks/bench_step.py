"""The trainer's training step, eager against CUDA graphs, per model and backend.

    python benchmarks/bench_step.py                                # yolov9-s and yolov9-c, batch 64, 640, AMP
    python benchmarks/bench_step.py --models yolov9-s --backends c --steps 10 --markdown
    python benchmarks/bench_step.py --models yolov9-s --paths fixed micro rect multiscale partial ckpt

The step is the trainer's own (yolov9c.engine.train.step.EagerStep, graph_shapes.ShapeGraphStep, and with
--no-graph-shapes graph_step.GraphStep) on a RunState
built here as setup() builds it for a fresh run: DetectionModel → channels-last on CUDA → the optimizer of
build_optimizer (SGD, Nesterov, three groups) → EMA → GradScaler → the loss of the backend → the backend (c: its
switches as a run takes them, the YOLOV9C_* variables of docs/switches.md included, e.g. YOLOV9C_PLAIN_STRIDE=16).
accumulate = 1 (batch 64 = the nominal batch): every step is forward, loss, scaled backward, unscale, clip,
optimizer step, scaler update, EMA update. Inputs: random uint8 images (on the device, turned float/255 in
the memory format as prepare_batch does) and --boxes random boxes per image (host targets, as the loader
gives them). After --warmup steps (the graph step captures after its own 3 eager ones), --steps timed steps
with torch.cuda.synchronize() around each: the median ms; GPU time per step = the sum of kernel times of
--profile steps under torch.profiler (also split by op group and the longest kernels); peak allocated / reserved GiB over the timed steps;
host ms = the median time until the step returns, before the synchronize (≈ step ms: the step is host-bound);
--host-profile N: N more steps under cProfile, the row's host_py_calls (per step) and host_top (the functions of
most own host time, ms and calls per step): where an eager step's host time goes on the GPU machine.
--paths (PATHS): the trainer's paths besides the fixed shape — the micro-batch the out-of-memory guard picks
(batch / 2, two forward/backward passes a batch), a --rect shape (batch × 3/4 img × img), --multi-scale sizes (each
step the next of 0.5, 1.0 and 1.5 × img), the epoch's last partial batch (2/3 of the batch every step) and
--ckpt (torch only: the c backend ignores it); the graph rows are keyed by shape, as the trainer's default
(--no-graph-shapes: the fixed-shape graph, other shapes eager).
Each configuration runs in its own subprocess. One JSON line per configuration; --markdown adds the table.
--interleave CFG ... (eager, fixed shape; CFG: c, torch, or c+VAR=VALUE: c with that environment switch set during
its steps and while it is built, e.g. c+YOLOV9C_LEAN_HOST=0, c+YOLOV9C_PLAIN_STRIDE=16): the
configurations of each model in one process, one step of each in turn (each round starts one later), so a drift of
the host falls on all alike: per configuration the median ms and host ms and `vs_first`, the median over rounds of
its step time / the first configuration's in that round, with the quartiles (an A/B of 1-5 % that separate
processes, swinging ±12 %, cannot resolve).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

REPO = Path(__file__).resolve().parents[1]
GIB = 2 ** 30  # yolov9c.units.GIB spelled out: this file runs in the published code's interpreter too


def _round(x, stride=32):
    return max(stride, int(round(x / stride)) * stride)


# path: (batch, img) -> the (images, height, width) of each step, cycling; plus what it sets on the run
PATHS = {
    "fixed": lambda b, img: [(b, img, img)],
    "micro": lambda b, img: [(b, img, img)],  # state.progress.micro_batch = b // 2, as the guard sets it
    "rect": lambda b, img: [(b, _round(img * 3 / 4), img)],
    "multiscale": lambda b, img: [(b, _round(img * f), _round(img * f)) for f in (0.5, 1.0, 1.5)],
    "partial": lambda b, img: [(max(1, b * 2 // 3), img, img)],
    "ckpt": lambda b, img: [(b, img, img)],  # cfg.ckpt: torch's layer checkpointing
}


def interleave_config(text):
    """An --interleave configuration: BACKEND[+VAR=VALUE...] -> (backend, {VAR: VALUE}), the environment set
    during its steps (switches read at every call, e.g. c+YOLOV9C_LEAN_HOST=0). argparse's type."""
    backend, *pairs = text.split("+")
    env = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
    if backend not in ("c", "torch") or len(env) != len(pairs) or not all(env):
        raise argparse.ArgumentTypeError(f"{text!r}: expected c or torch, then optionally +VAR=VALUE ...")
    return backend, env


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
    p.add_argument("--host-profile", type=int, default=0,
                   help="steps under cProfile: host ms and calls per step by function (0: off)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="torch.backends.cudnn.benchmark = True in every configuration (cuDNN times its algorithms per "
                        "shape in the warm-up): the eager steps run with it throughout, the graph step as the "
                        "trainer runs it by default (--cudnn-benchmark: warm-up and captures); off: neither")
    p.add_argument("--paths", nargs="+", default=["fixed"], choices=sorted(PATHS),
                   help="the training paths measured (module docstring); default: the fixed shape only")
    p.add_argument("--no-channels-last", action="store_true",
                   help="the model and images in NCHW (the trainer's --no-channels-last) instead of channels-last")
    p.add_argument("--graph-shapes", action=argparse.BooleanOptionalAction, default=True,
                   help="the trainer's --graph-shapes in the graph rows (default on, as in the trainer: one graph per "
                        "input shape; --no-graph-shapes: the fixed-shape graph)")
    p.add_argument("--interleave", nargs="+", metavar="CFG",
                   help="eager configurations stepped in turn in one process (module docstring): c, torch, "
                        "c+VAR=VALUE (an environment switch set during its steps, e.g. c+YOLOV9C_LEAN_HOST=0)")
    p.add_argument("--one", nargs=4, metavar=("MODEL", "BACKEND", "MODE", "PATH"), help=argparse.SUPPRESS)
    return p


def _state(model_name, backend, args, path="fixed", mode="eager", device="cuda"):
    """The RunState of one configuration on `device` (AMP on CUDA only: dev/probes/host_step.py builds it on the
    CPU as a host-time proxy)."""
    import torch

    from yolov9c.api import build_model, make_loss
    from yolov9c.backends import apply
    from yolov9c.engine.train.batching import Batching
    from yolov9c.engine.train.config import RunConfig, switch_overrides, switches
    from yolov9c.engine.train.ema import ModelEMA
    from yolov9c.engine.train.layer_ckpt import bn_buffers, checkpointed_forward
    from yolov9c.engine.train.optim import build_optimizer
    from yolov9c.engine.train.state import RunState
    from yolov9c.resources import load_hyp

    device = torch.device(device)
    amp = device.type == "cuda"
    torch.manual_seed(0)
    hyp = load_hyp(None)
    channels_last = not getattr(args, "no_channels_last", False)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = build_model(model_name, nc=args.nc).to(device, memory_format=fmt).train()
    optimizer = build_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"], log=lambda *a: None)
    ema = ModelEMA(model)
    loss = make_loss(model, hyp, backend=backend)
    if backend != "torch":
        # the c switches as a training run takes them: the defaults, or the YOLOV9C_* variables that override them
        sw = switches(switch_overrides(RunConfig(backend=backend), log=lambda *a: None))
        out = apply(model, backend, sw)
        model = model if out is None else out
    ckpt = path == "ckpt" and backend == "torch"
    if ckpt:
        model.forward = types.MethodType(checkpointed_forward, model)
    cfg = RunConfig(backend=backend, channels_last=channels_last, cudnn_benchmark=bool(args.cudnn_benchmark), ckpt=ckpt,
                    rect=path == "rect", multi_scale=path == "multiscale",
                    graph_shapes=mode == "graph" and bool(getattr(args, "graph_shapes", True)))
    state = RunState(cfg=cfg, device=device, amp=amp,
                     memory_format=fmt, hyp=hyp, model=model, ema=ema, loss=loss,
                     optimizer=optimizer, scaler=torch.amp.GradScaler(device.type, enabled=amp),
                     batching=Batching(args.batch, 1, nominal=args.batch, fixed_accumulate=1),
                     bn_stats=bn_buffers(model), bn_buffers=bn_buffers(model) if ckpt else [], log=lambda *a: None,
                     params=list(model.parameters()))
    if path == "micro":
        state.progress.micro_batch = max(1, args.batch // 2)
    return state


def run_one(model_name, backend, mode, path, args):
    import torch

    from yolov9c.engine.train.graph_shapes import ShapeGraphStep
    from yolov9c.engine.train.graph_step import GraphStep
    from yolov9c.engine.train.memory_plan import random_targets
    from yolov9c.engine.train.step import EagerStep

    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    state = _state(model_name, backend, args, path, mode)
    # the trainer's choice (graph_shapes.select_step): keyed by shape (the default), else the fixed-shape graph
    graph_step = ShapeGraphStep if state.cfg.graph_shapes else GraphStep
    step = graph_step(state) if mode == "graph" else EagerStep()
    gen = torch.Generator().manual_seed(0)
    inputs = []
    for b, h, w in PATHS[path](args.batch, args.img):
        images = torch.randint(0, 256, (b, 3, h, w), dtype=torch.uint8, generator=gen)
        inputs.append((images.cuda().contiguous(memory_format=state.memory_format),
                       random_targets(b, args.boxes, args.nc, gen)))
    ni = [0]

    def one():
        images, targets = inputs[ni[0] % len(inputs)]
        imgs = images.contiguous(memory_format=state.memory_format).float() / 255
        r = step(state, imgs, targets, ni[0])
        ni[0] += 1
        return r

    row = {"model": model_name, "backend": backend, "mode": mode, "path": path, "batch": args.batch,
           "img": args.img, "shapes": [list(s) for s in PATHS[path](args.batch, args.img)], "boxes": args.boxes,
           "graph_shapes": bool(state.cfg.graph_shapes), "gpu": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "cudnn_benchmark": bool(args.cudnn_benchmark),
           "channels_last": bool(state.cfg.channels_last)}
    try:
        for _ in range(args.warmup + 3 * (len(inputs) - 1)):  # every shape reaches its capture
            one()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times, hosts, losses = [], [], []
        for _ in range(args.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = one()
            hosts.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(float(r.loss_items.sum()))
    except torch.cuda.OutOfMemoryError as e:
        return {**row, "status": "oom", "error": str(e).splitlines()[0][:200]}
    times.sort()
    hosts.sort()
    row.update(status="ok", step_ms=round(1000 * times[len(times) // 2], 2), min_ms=round(1000 * times[0], 2),
               host_ms=round(1000 * hosts[len(hosts) // 2], 2),
               peak_alloc_gib=round(torch.cuda.max_memory_allocated() / GIB, 3),
               peak_reserved_gib=round(torch.cuda.max_memory_reserved() / GIB, 3), last_loss=losses[-1],
               graphed=mode == "graph" and bool(step.micro))
    if args.profile:
        gpu, launches, groups, top = _gpu_ms(one, args.profile)
        row.update(gpu_ms=round(gpu, 2), gpu_launches=launches, gpu_ms_by_group=groups, top_kernels=top)
    steps = getattr(args, "host_profile", 0)  # bench_memory.py's graph rows hand their own args (no such flag)
    if steps:
        calls, top = host_profile(one, steps, torch.cuda.synchronize)
        row.update(host_py_calls=calls, host_top=top)
    return row


@contextlib.contextmanager
def _environ(values):
    """Inside, os.environ holds `values` (switches read at every call, as extension.lean_host); restored after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_interleaved(model_name, configs, args, device="cuda"):
    """The eager step of each configuration (interleave_config) of `model_name` at the fixed shape, in one process, one
    step of each per round; round r starts at configuration r mod n. After --warmup rounds, --steps timed rounds
    (each step between synchronisations). Returns one row per configuration: step_ms / host_ms (medians),
    vs_first = the median of its per-round step time / the first configuration's, vs_first_q = its quartiles.
    Test: tests/benchmarks/test_bench_step.py."""
    import torch

    from yolov9c.engine.train.memory_plan import random_targets
    from yolov9c.engine.train.step import EagerStep

    cuda = torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    runs = []
    for name in configs:
        backend, env = interleave_config(name)
        with _environ(env):
            runs.append((name, env, _state(model_name, backend, args, "fixed", "eager", device), EagerStep()))
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (args.batch, 3, args.img, args.img), dtype=torch.uint8, generator=gen)
    images = images.to(device)
    targets = random_targets(args.batch, args.boxes, args.nc, gen)
    times = {name: [] for name in configs}
    hosts = {name: [] for name in configs}
    for r in range(args.warmup + args.steps):
        for k in range(len(runs)):
            name, env, state, step = runs[(r + k) % len(runs)]
            imgs = images.contiguous(memory_format=state.memory_format).float() / 255
            with _environ(env):
                sync()
                t0 = time.perf_counter()
                step(state, imgs, targets, r)
                host = time.perf_counter() - t0
                sync()
                wall = time.perf_counter() - t0
            if r >= args.warmup:
                times[name].append(wall)
                hosts[name].append(host)
    first = times[configs[0]]
    rows = []
    for name in configs:
        ratios = [t / f for t, f in zip(times[name], first)]
        rows.append({"model": model_name, "config": name, "mode": "eager", "path": "fixed", "interleaved": True,
                     "batch": args.batch, "img": args.img, "rounds": args.steps, "status": "ok",
                     "step_ms": round(1000 * _quantile(times[name], 0.5), 2),
                     "host_ms": round(1000 * _quantile(hosts[name], 0.5), 2),
                     "vs_first": round(_quantile(ratios, 0.5), 4),
                     "vs_first_q": [round(_quantile(ratios, 0.25), 4), round(_quantile(ratios, 0.75), 4)],
                     "gpu": torch.cuda.get_device_name(0) if cuda else "cpu"})
    return rows


def host_profile(one, steps, sync=lambda: None, top=25):
    """Where the host time of a step goes: `steps` calls of one() under cProfile, each started after sync() (the
    GPU idle, outside the profile). Returns (Python function calls per step, the `top` functions by own time as
    [file:line(name), own ms per step, calls per step]); a time includes any wait inside the step (a host sync
    shows as its function). Test: tests/benchmarks/test_bench_step.py."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    for _ in range(steps):
        sync()
        prof.enable()
        one()
        prof.disable()
    sync()
    stats = pstats.Stats(prof).stats  # (file, line, name): (primitive calls, calls, own s, cumulative s, callers)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    calls = sum(v[1] for v in stats.values())
    return (round(calls / steps), [[f"{Path(f).name}:{line}({name})", round(1000 * v[2] / steps, 3),
                                    round(v[1] / steps, 1)] for (f, line, name), v in rows])


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
    """GPU time per step under torch.profiler (graph replays included): the sum of CUDA kernel times, the kernel
    launches per step (a graph replay's kernels counted as launched), the time split by op group (KERNEL_GROUPS)
    and the 12 longest kernels, all per step."""
    from gpu_timing import kernel_times

    kernels = kernel_times(one, steps, counts=True)
    groups = {}
    for name, ms, _ in kernels:
        groups[kernel_group(name)] = groups.get(kernel_group(name), 0.0) + ms
    top = kernels[:12]
    return (sum(ms for _, ms, _ in kernels), round(sum(n for _, _, n in kernels)),
            {g: round(ms, 2) for g, ms in sorted(groups.items(), key=lambda g: -g[1])},
            [[name[:90], round(ms, 2)] for name, ms, _ in top])


def run_config(args, model_name, backend, mode, path="fixed"):
    argv = [sys.executable, str(Path(__file__).resolve()), "--one", model_name, backend, mode, path]
    for k in ("batch", "img", "boxes", "nc", "steps", "warmup", "profile", "host_profile"):
        argv += [f"--{k.replace('_', '-')}", str(getattr(args, k, 0))]
    if args.cudnn_benchmark:
        argv.append("--cudnn-benchmark")
    argv.append("--graph-shapes" if getattr(args, "graph_shapes", True) else "--no-graph-shapes")
    if getattr(args, "no_channels_last", False):
        argv.append("--no-channels-last")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    base = {"model": model_name, "backend": backend, "mode": mode, "path": path}
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
    out = ["| model | backend | path | step | status | step ms (median) | host ms | × eager | GPU ms/step | "
           "peak allocated GiB | peak reserved GiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    key = lambda r: (r["model"], r["backend"], r.get("path", "fixed"))  # noqa: E731
    eager = {key(r): r.get("step_ms") for r in rows if r["mode"] == "eager"}
    for r in rows:
        base = eager.get(key(r))
        ratio = f"{r['step_ms'] / base:.2f}" if r.get("step_ms") and base else "—"
        out.append(f"| {r['model']} | {r['backend']} | {r.get('path', 'fixed')} | {r['mode']} | {r['status']} | "
                   f"{r.get('step_ms', '—')} | {r.get('host_ms', '—')} | {ratio} | {r.get('gpu_ms', '—')} | "
                   f"{r.get('peak_alloc_gib', '—')} | {r.get('peak_reserved_gib', '—')} |")
    return "\n".join(out)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.one:
        print(json.dumps(run_one(*args.one, args)), flush=True)
        return
    if args.interleave:
        for m in args.models:
            for row in run_interleaved(m, args.interleave, args):
                print(json.dumps(row), flush=True)
        return
    rows = []
    for m in args.models:
        for b in args.backends:
            for path in args.paths:
                if path == "ckpt" and b != "torch":
                    continue  # the c backend ignores --ckpt (it stores one tensor per layer already)
                for mode in args.modes:
                    rows.append(run_config(args, m, b, mode, path))
                    print(json.dumps(rows[-1]), flush=True)
    if args.markdown:
        print(markdown(rows))


if __name__ == "__main__":
    main()
