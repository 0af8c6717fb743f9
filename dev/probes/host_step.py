"""Host time of the eager training step per backend, on the CPU: a proxy for the Python/host overhead that makes
the eager c step host-bound on a fast GPU. At a tiny input (yolov9-s, 64 px, batch 2, one thread) the compute is
small and wall time ≈ host time; the step is the trainer's own (EagerStep on benchmarks/bench_step.py's RunState,
channels-last, fp32: no autocast on the CPU). The optimizer runs as on CUDA: torch.optim.SGD (foreach=None) takes
its foreach path for CUDA tensors and its per-tensor loop (~900 parameters × several ops) for CPU ones, so the
probe sets foreach=True on its parameter groups (the gradient clip and the EMA use foreach ops on both devices).

    python dev/probes/host_step.py                          # both backends: median ms of 20 steps after warm-up
    python dev/probes/host_step.py --backends c --profile 3 # and cProfile of 3 c steps (top by tottime / ncalls)
    python dev/probes/host_step.py --functions              # autograd Function applies per step, by class
    python dev/probes/host_step.py --ops                    # torch op dispatches per step, by op

Prints one JSON line per backend (median and min ms, Python function calls per step, torch op dispatches per
step, calls of the BN and pool ops into yolov9c._C per step, autograd Function applies per step); --profile adds
the cProfile tables, --ops the dispatches by op. Dispatches are counted by a TorchDispatchMode over one step:
every aten op that reaches the backend dispatch (below autograd, after composite ops decompose), in forward, in
the autograd engine's backward and in the optimizer; an op that another op's kernel calls is not seen (a foreach
op is one). On a GPU each dispatch costs several µs of host time (dispatcher, caching allocator, launch), as does
each extension call (extension.count_calls counts them). Torch threads are set to --threads (default 1) and the
backends run one after the other in this process.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))   # runs from a checkout without installing
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import bench_step  # noqa: E402
from yolov9c.engine.train.memory_plan import random_targets  # noqa: E402
from yolov9c.engine.train.step import EagerStep  # noqa: E402
from yolov9c.ops import extension  # noqa: E402


def _runner(model, backend, args):
    state = bench_step._state(model, backend, args, device="cpu")
    for group in state.optimizer.param_groups:  # the optimizer step of a CUDA run (module docstring)
        group["foreach"] = True
    step = EagerStep()
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (args.batch, 3, args.img, args.img), dtype=torch.uint8, generator=gen)
    targets = random_targets(args.batch, args.boxes, args.nc, gen)
    ni = [0]

    def one():
        imgs = images.contiguous(memory_format=state.memory_format).float() / 255
        r = step(state, imgs, targets, ni[0])
        ni[0] += 1
        return r
    return one


def _function_classes(cls=torch.autograd.Function):
    """cls's subclasses, transitively."""
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_function_classes(sub)]
    return out


def _function_applies(one):
    """{autograd Function class name: applies} in one step, counted by the forwards they run (an apply runs its
    class's forward once; the c backend calls torch's C apply without autograd.Function.apply)."""
    counts = collections.Counter()
    saved = {c: c.__dict__["forward"] for c in _function_classes() if type(c.__dict__.get("forward")) is staticmethod}

    def counted(cls, forward):
        def run(*a, **k):
            counts[cls.__name__] += 1
            return forward(*a, **k)
        return staticmethod(run)

    for cls, fwd in saved.items():
        cls.forward = counted(cls, fwd.__func__)
    try:
        one()
    finally:
        for cls, fwd in saved.items():
            cls.forward = fwd
    return counts


class _OpCounts(TorchDispatchMode):
    """Counts the aten ops dispatched while it is active, by name (module docstring)."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.__name__] += 1
        return func(*args, **(kwargs or {}))


def _dispatches(one):
    """({aten op overload name: dispatches}, {extension op: calls}) in one step."""
    with _OpCounts() as mode, extension.count_calls() as ext:
        one()
    return mode.counts, ext.calls


def _calls(one, steps):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        one()
    prof.disable()
    return prof


def measure(model, backend, args):
    one = _runner(model, backend, args)
    for _ in range(args.warmup):
        one()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        one()
        times.append(time.perf_counter() - t0)
    times.sort()
    prof = _calls(one, 1)
    calls = pstats.Stats(prof).total_calls
    applies = _function_applies(one)
    ops, ext = _dispatches(one)
    row = {"model": model, "backend": backend, "batch": args.batch, "img": args.img, "threads": args.threads,
           "median_ms": round(1000 * times[len(times) // 2], 2), "min_ms": round(1000 * times[0], 2),
           "py_calls_per_step": calls,
           "ops_per_step": sum(ops.values()), "ext_calls_per_step": sum(ext.values()),
           "function_applies_per_step": sum(applies.values())}
    if args.functions:
        row["applies_by_function"] = dict(applies.most_common())
    if args.ops:
        row["ops_by_name"] = dict(ops.most_common())
    print(json.dumps(row), flush=True)
    if args.profile:
        prof = _calls(one, args.profile)
        for key in ("tottime", "ncalls"):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(key).print_stats(args.top)
            print(f"--- {backend}: {args.profile} steps by {key}\n{out.getvalue()}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["yolov9-s"])
    p.add_argument("--backends", nargs="+", default=["c", "torch"], choices=["c", "torch"])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--img", type=int, default=64)
    p.add_argument("--boxes", type=int, default=4)
    p.add_argument("--nc", type=int, default=80)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile", type=int, default=0, help="steps under cProfile (0: none)")
    p.add_argument("--top", type=int, default=40, help="rows of each cProfile table")
    p.add_argument("--functions", action="store_true", help="autograd Function applies per step by class")
    p.add_argument("--ops", action="store_true", help="torch op dispatches per step by op")
    args = p.parse_args(argv)
    args.cudnn_benchmark = False  # what bench_step's RunState reads (no cuDNN here)
    torch.set_num_threads(args.threads)
    for m in args.models:
        for b in args.backends:
            measure(m, b, args)


if __name__ == "__main__":
    main()
