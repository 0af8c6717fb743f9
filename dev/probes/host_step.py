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
    python dev/probes/host_step.py --host                   # host ms per step: wall minus the compute calls

Prints one JSON line per backend (median and min ms, Python function calls per step, torch op dispatches per
step, calls of the BN and pool ops into yolov9c._C per step, autograd Function applies per step); --profile adds
the cProfile tables, --ops the dispatches by op. Dispatches are counted by a TorchDispatchMode over one step:
every aten op that reaches the backend dispatch (below autograd, after composite ops decompose), in forward, in
the autograd engine's backward and in the optimizer; an op that another op's kernel calls is not seen (a foreach
op is one). On a GPU each dispatch costs several µs of host time (dispatcher, caching allocator, launch), as does
each extension call (extension.count_calls counts them). Torch threads are set to --threads (default 1) and the
backends run one after the other in this process.

--host runs --steps more steps inside compute_timed(), which wraps each compute call with time.perf_counter, and
adds the medians over them (ms per step) of wall_ms, of each group (conv2d_ms: torch.nn.functional.conv2d, the
forward convs; conv_backward_ms: torch.ops.aten.convolution_backward, the c backend's conv backward; ext_ms: the
yolov9c._C callables named bn_* or *pool*; foreach_ms: every torch._foreach_* function: optimizer, gradient
clip, EMA; alloc_ms: torch.empty/empty_like/zeros/zeros_like) and of host_ms = wall − the groups' sum (host_min_ms: its least). Not reachable from Python, hence
counted as host: torch's own backward convs (autograd's C++ calls them: the torch backend's host_ms holds its
conv backward), any compute op not listed, the wrappers' own cost. A call inside another wrapped call is not
counted twice. Invariants: every group >= 0, host_ms <= wall_ms; on leaving compute_timed every patched
attribute (_timed_attributes) is its original object again, so later modes and backends run unwrapped.
--device cuda runs the step as bench_step.py does on the GPU machine (AMP, channels-last, cuDNN benchmark, each
step ended by a synchronisation); the calls are asynchronous there, so each group's ms is the host time of its
calls (dispatch, allocation, launch) and --profile's table is where the host time of a host-bound step goes.
Test: dev/tests/test_host_step.py.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
import types
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
    state = bench_step._state(model, backend, args, device=args.device)
    for group in state.optimizer.param_groups:  # the optimizer step of a CUDA run (module docstring)
        group["foreach"] = True
    step = EagerStep()
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (args.batch, 3, args.img, args.img), dtype=torch.uint8, generator=gen)
    images = images.to(args.device)
    targets = random_targets(args.batch, args.boxes, args.nc, gen).to(args.device)
    ni = [0]

    def one():
        imgs = images.contiguous(memory_format=state.memory_format).float() / 255
        r = step(state, imgs, targets, ni[0])
        ni[0] += 1
        _sync(args.device)
        return r
    return one


def _sync(device):
    """Wait for the device (CUDA: the step's kernels; a host-bound step has queued little beyond its host time)."""
    if device == "cuda":
        torch.cuda.synchronize()


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


GROUPS = ("conv2d", "conv_backward", "ext", "foreach", "alloc")  # the compute groups of --host (module docstring)


class _Clock:
    """Seconds spent inside the wrapped compute calls since reset(), by group (GROUPS)."""

    def __init__(self):
        self.inside = False
        self.reset()

    def reset(self):
        self.seconds = dict.fromkeys(GROUPS, 0.0)


class _Timed:
    """fn, its calls' perf_counter time added to clock.seconds[group] (only the outermost of nested wrapped
    calls); every other attribute is fn's (torch.ops.aten.convolution_backward.default stays reachable)."""

    __slots__ = ("_fn", "_group", "_clock")

    def __init__(self, fn, group, clock):
        self._fn, self._group, self._clock = fn, group, clock

    def __call__(self, *args, **kwargs):
        clock = self._clock
        if clock.inside:
            return self._fn(*args, **kwargs)
        clock.inside = True
        t0 = time.perf_counter()
        try:
            return self._fn(*args, **kwargs)
        finally:
            clock.seconds[self._group] += time.perf_counter() - t0
            clock.inside = False

    def __getattr__(self, name):
        return getattr(self._fn, name)


def _timed_attributes():
    """[(owner, attribute name, group or None)]: what compute_timed replaces. group None: extension._module,
    the one place the ops get yolov9c._C from (extension.load and extension.enter read it)."""
    extension.load()  # so that extension._module is the module itself
    return [(torch.nn.functional, "conv2d", "conv2d"),
            (torch.ops.aten, "convolution_backward", "conv_backward"),
            *((torch, name, "foreach") for name in dir(torch) if name.startswith("_foreach_")),
            *((torch, name, "alloc") for name in ("empty", "empty_like", "zeros", "zeros_like")),
            (extension, "_module", None)]


def _timed_extension(module, clock):
    """A stand-in for yolov9c._C: its attributes, the callables named bn_* or *pool* wrapped in group "ext"."""
    return types.SimpleNamespace(**{
        name: _Timed(v, "ext", clock) if callable(v) and (name.startswith("bn_") or "pool" in name) else v
        for name, v in vars(module).items()})


@contextlib.contextmanager
def compute_timed():
    """Inside the block the compute calls (module docstring) are timed into the yielded _Clock's seconds; on exit,
    even by an exception, every attribute of _timed_attributes() is its original object again."""
    clock = _Clock()
    saved = []
    try:
        for owner, name, group in _timed_attributes():
            original = getattr(owner, name)
            saved.append((owner, name, original))
            setattr(owner, name, _Timed(original, group, clock) if group else _timed_extension(original, clock))
        yield clock
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def _host(one, steps):
    """{wall_ms, <group>_ms, host_ms, host_min_ms} over `steps` steps inside compute_timed (medians but
    host_min_ms)."""
    walls, groups, hosts = [], {g: [] for g in GROUPS}, []
    with compute_timed() as clock:
        for _ in range(steps):
            clock.reset()
            t0 = time.perf_counter()
            one()
            wall = time.perf_counter() - t0
            walls.append(wall)
            for g in GROUPS:
                groups[g].append(clock.seconds[g])
            hosts.append(wall - sum(clock.seconds.values()))

    def ms(xs):
        return round(1000 * statistics.median(xs), 2)
    return {"wall_ms": ms(walls), **{f"{g}_ms": ms(groups[g]) for g in GROUPS}, "host_ms": ms(hosts),
            "host_min_ms": round(1000 * min(hosts), 2)}


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
    if args.host:
        row.update(_host(one, args.steps))
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
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: the step as on the GPU machine (AMP, cuDNN benchmark); times are host times there")
    p.add_argument("--profile", type=int, default=0, help="steps under cProfile (0: none)")
    p.add_argument("--top", type=int, default=40, help="rows of each cProfile table")
    p.add_argument("--functions", action="store_true", help="autograd Function applies per step by class")
    p.add_argument("--ops", action="store_true", help="torch op dispatches per step by op")
    p.add_argument("--host", action="store_true",
                   help="host ms per step: wall minus the time inside the timed compute calls, and each group's ms")
    args = p.parse_args(argv)
    args.cudnn_benchmark = args.device == "cuda"  # what bench_step's RunState reads
    torch.set_num_threads(args.threads)
    for m in args.models:
        for b in args.backends:
            measure(m, b, args)


if __name__ == "__main__":
    main()
