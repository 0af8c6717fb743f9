"""The trainer's guards on a CUDA GPU (skipped without one): a real out-of-memory error (a per-process memory
limit below what the full batch needs) halves the micro-batch and the step completes; an allocation the GPU
cannot hold inside a real training run is survived by both backends; an injected NaN gradient is skipped on
CUDA with AMP on and off, both backends; the guard counts device flags without a host synchronisation.
CPU versions and the rules: tests/test_train_guards.py.
Run (on a GPU machine): python -m pytest -q tests/test_train_guards_cuda.py
"""

import math

import numpy as np
import pytest
import torch

import yolov9c.engine.train.step as S
from yolov9c.cli.train import parse_opt
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train.guards import NonFiniteCounter
from yolov9c.engine.train.results import read_results
from yolov9c.engine.train.state import setup
from yolov9c.engine.train.step import prepare_batch
from yolov9c.engine.train.trainer import train

pytestmark = pytest.mark.cuda
BACKENDS = ["torch", "c"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=1, root=tmp_path_factory.mktemp("syn"), n_train=32, n_val=4, imgsz=160))


def _args(data, project, backend, *extra):
    return ["--data", data, "--cfg", "gelan-t.yaml", "--img", "64", "--batch", "8", "--epochs", "2",
            "--accumulate", "1", "--workers", "0", "--noval", "--noplots", "--device", "0", "--backend", backend,
            "--no-cuda-graph", "--project", str(project), *extra]  # the eager step: the faults are injected there


def _logger():
    lines = []
    return lines, lambda *a, **k: lines.append(" ".join(map(str, a)))


def _state_dicts(state):
    return ({k: v.clone() for k, v in state.model.state_dict().items()},
            {k: v.clone() for k, v in state.ema.ema.state_dict().items()}, state.ema.updates)


def test_lazy_flags_are_counted_without_a_host_sync():
    c = NonFiniteCounter(0, lambda *a, **k: None)
    flags = [torch.tensor(v, device="cuda") for v in (True, False, False, True)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for ni, f in enumerate(flags):
            c.observe(f, 0, ni, lambda: "")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    c.drain(lambda: "", wait=True)
    assert c.epoch_skipped == 2 and not c.pending


@pytest.mark.parametrize("backend", BACKENDS)
def test_real_oom_under_a_memory_limit_halves_the_micro_batch(data, tmp_path, backend):
    lines, log = _logger()
    state = setup(parse_opt(_args(data, tmp_path, backend, "--img", "256", "--batch", "32", "--no-amp")),
                  log=log)  # fp32: no GradScaler skip of an early step (the assertion below needs an applied step)
    state.model.train()
    imgs, targets, _, _ = next(iter(state.train_loader))
    x = prepare_batch(state, imgs, np.random.default_rng(0))
    state.progress.micro_batch = 2
    state.guard.step(state, x, targets, 0)  # warm-up at micro-batches of 2: cuDNN's choices, lazy buffers
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    state.guard.step(state, x, targets, 1)  # calibrate: the activations and temporaries of 2 images
    torch.cuda.synchronize()
    per2 = torch.cuda.max_memory_allocated() - base
    state.progress.micro_batch = None
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((base + 4 * per2 + 2 ** 25) / total)
    try:
        result = state.guard.step(state, x, targets, 2)  # 32 images need ~16 x per2: over the limit
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert any("CUDA out of memory at iteration 2 with a micro-batch of 32" in s for s in lines), (per2, lines[-3:])
    assert 1 <= state.progress.micro_batch <= 16 and result.images == 32 and result.finite is True
    assert all(torch.isfinite(p).all() for p in state.model.parameters())


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_allocation_the_gpu_cannot_hold_is_survived(data, tmp_path, backend, monkeypatch):
    fb, sizes = S.forward_backward, []

    def forward_backward(state, imgs, targets):
        sizes.append(imgs.shape[0])
        if imgs.shape[0] > 4:  # a real allocator failure (1 TiB), inside the step
            torch.empty(2 ** 40, dtype=torch.uint8, device=state.device)
        return fb(state, imgs, targets)
    monkeypatch.setattr(S, "forward_backward", forward_backward)
    out = train(parse_opt(_args(data, tmp_path, backend)), log=lambda *a, **k: None)
    assert sizes[:3] == [8, 4, 4] and set(sizes[3:]) == {4}
    last = torch.load(out["save_dir"] / "weights" / "last.pt", map_location="cpu", weights_only=True)
    assert all(torch.isfinite(v).all() for v in last["model"].values() if v.is_floating_point())


@pytest.mark.parametrize("amp", ["--amp", "--no-amp"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_gradient_is_skipped(data, tmp_path, backend, amp, monkeypatch):
    fb, opt_step = S.forward_backward, S.optimizer_step
    calls, seen, oks = [], {}, []

    def forward_backward(state, imgs, targets):
        calls.append(1)
        if len(calls) == 3:
            seen["before"] = _state_dicts(state)
        out = fb(state, imgs, targets)
        if len(calls) == 3:
            g = next(p for p in state.model.parameters() if p.grad is not None).grad
            g[(0,) * g.dim()] = math.nan  # any layout (a channels-last gradient has no flat view)
        return out

    def optimizer_step(state):
        oks.append(opt_step(state))
        if len(calls) == 3:
            seen["after"] = _state_dicts(state)
        return oks[-1]
    monkeypatch.setattr(S, "forward_backward", forward_backward)
    monkeypatch.setattr(S, "optimizer_step", optimizer_step)
    out = train(parse_opt(_args(data, tmp_path, backend, amp)), log=lambda *a, **k: None)
    assert oks[2] is False  # the injected step (under AMP the GradScaler may skip early steps too)
    (m0, e0, u0), (m1, e1, u1) = seen["before"], seen["after"]
    assert all(torch.equal(m0[k], m1[k]) for k in m0) and all(torch.equal(e0[k], e1[k]) for k in e0) and u0 == u1
    res = read_results(out["save_dir"] / "results.csv")
    assert res["skipped_steps"].sum() == oks.count(False) and (amp == "--amp" or oks.count(False) == 1)
    last = torch.load(out["save_dir"] / "weights" / "last.pt", map_location="cpu", weights_only=True)
    assert all(torch.isfinite(v).all() for v in last["model"].values() if v.is_floating_point())
