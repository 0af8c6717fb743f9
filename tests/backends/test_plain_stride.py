"""The c backend's plain_stride switch (backends/c/switches.py, pgi.py): main layers and main head levels whose
finest input is at that stride or coarser run their torch forward on the activated input.

- Same results: with plain_stride 16 (the auxiliary branch recomputed, and stored; gelan-t: no PGI head, the layer
  loop) the head maps, the loss,
  every parameter gradient and every BN buffer are as close to a float64 copy as the default c step's (within 8x
  its error + 1e-5, the bound test_backend_c.py holds c to against torch), and num_batches_tracked counts one
  update per step.
- It takes effect: the lazy path's calls fall (fewer BN/SiLU kernel calls and lazy conv Functions at 16 than the
  default; with the auxiliary branch stored and plain_stride 1 every layer runs torch's forward: no BN/SiLU call).
- Off (0, the default) is the step as before: the same calls as Switches() itself.
- CUDA (marked cuda): under AMP its gradients are as close to the torch backend's as the lazy step's, and its
  peak rises by 0.5-1.5x what switch_cost.plain_bytes counts.
Run: python -m pytest -q tests/backends/test_plain_stride.py
"""

import copy

import pytest
import torch

from saved_tensors import cuda_step_peak
from seeded_models import shared_seeded_model
from yolov9c.api import make_loss
from yolov9c.backends import apply
from yolov9c.backends.c.switches import Switches
from yolov9c.ops import extension

TARGETS = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 2, 0.3, 0.6, 0.2, 0.25], [0, 0, 0.7, 0.3, 0.2, 0.3]])


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """conftest's one_thread for every test here."""


def _step(m, x):
    """(maps, loss, parameter gradients, buffers) of one training step of m on x; and the BN/SiLU and lazy conv
    calls it made."""
    with extension.count_calls() as n:
        out = m(x)
        loss, _ = make_loss(m)(out, TARGETS)
        loss.backward()
    maps = [t.detach() for level in out for t in (level if isinstance(level, list) else [level])]
    return (maps, loss.detach(), [p.grad for p in m.parameters()], [b.detach().clone() for b in m.buffers()],
            sum(v for k, v in n.calls.items() if k.startswith("bn_")))


def _cat(ts):
    return torch.cat([t.detach().double().flatten() for t in ts])


def _err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("cfg, aux", [("yolov9-t", True), ("yolov9-t", False), ("yolov9-c", True),
                                      ("yolov9-c", False), ("gelan-t", True)])
def test_plain_stride_as_close_to_float64_as_the_lazy_step(cfg, aux):
    base = shared_seeded_model(cfg)
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    lazy = _step(apply(copy.deepcopy(base), "c", Switches(aux_recompute=aux)), x)
    plain = _step(apply(copy.deepcopy(base), "c", Switches(aux_recompute=aux, plain_stride=16)), x)
    ref = _step(copy.deepcopy(base).double(), x.double())

    def check(what, p, c, r):
        ep, ec = _err(p, r), _err(c, r)
        assert ep <= 8 * ec + 1e-5, f"{cfg} {what}: plain_stride 16 error {ep:.2e} vs the lazy step's {ec:.2e}"

    for i, (p, c, r) in enumerate(zip(plain[0], lazy[0], ref[0])):
        assert p.shape == c.shape and p.dtype == c.dtype
        check(f"map {i}", p, c, r)
    check("loss", plain[1], lazy[1], ref[1])
    assert [g is None for g in plain[2]] == [g is None for g in lazy[2]]
    got = [i for i, g in enumerate(ref[2]) if g is not None]
    check("gradients", _cat(plain[2][i] for i in got), _cat(lazy[2][i] for i in got), _cat(ref[2][i] for i in got))
    fl = [i for i, b in enumerate(ref[3]) if b.dtype.is_floating_point]
    check("BN buffers", _cat(plain[3][i] for i in fl), _cat(lazy[3][i] for i in fl), _cat(ref[3][i] for i in fl))
    before = [b for b in base.buffers() if not b.dtype.is_floating_point]
    ints = [b for b in plain[3] if not b.dtype.is_floating_point]
    assert ints and all(int(b) == int(b0) + 1 for b, b0 in zip(ints, before))  # one BN update per step
    assert plain[4] < lazy[4]  # the coarse layers no longer run the lazy path's kernels


def test_every_layer_plain_runs_no_lazy_kernel_and_off_is_the_default():
    base = shared_seeded_model("yolov9-t")
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    calls = {}
    for name, sw in (("default", Switches()), ("off", Switches(plain_stride=0)), ("16", Switches(plain_stride=16)),
                     ("all", Switches(aux_recompute=False, plain_stride=1))):
        calls[name] = _step(apply(copy.deepcopy(base), "c", sw), x)[4]
    assert calls["default"] == calls["off"] > calls["16"] > calls["all"] == 0, calls


def _cuda_step(base, sw, x, tg):
    """(parameter gradients, peak allocated bytes above the start less the gradients) of one AMP training step of a
    copy of base on CUDA, channels-last (the c backend with `sw`, or the torch backend when sw is None)."""
    m = copy.deepcopy(base).cuda().to(memory_format=torch.channels_last).train()
    if sw is not None:
        apply(m, "c", sw)
    loss_fn = make_loss(m, backend="torch" if sw is None else "c")
    inp = x if sw is not None else x.float() / 255

    def step():
        with torch.autocast("cuda", dtype=torch.float16):
            loss, _ = loss_fn(m(inp), tg)
        loss.sum().backward()

    params = list(m.parameters())
    _, peak = cuda_step_peak(step, params)
    return [p.grad.float() for p in params], peak


@pytest.mark.cuda
def test_plain_stride_cuda_amp_gradients_and_counted_memory():
    """yolov9-s, 8 × 320², AMP: plain_stride 16's gradients are as close to the torch backend's as the lazy step's
    (within 2x + 1e-3), and its peak rises by 0.5-1.5x what switch_cost counts for it."""
    from yolov9c.engine.train import switch_cost

    torch.manual_seed(0)
    base = shared_seeded_model("yolov9-s", nc=80)  # as switch_cost counts it
    x = torch.randint(0, 256, (8, 3, 320, 320), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)).cuda()
    tg = TARGETS.cuda()
    ref, _ = _cuda_step(base, None, x, tg)
    lazy, lazy_peak = _cuda_step(base, Switches(), x, tg)
    plain, plain_peak = _cuda_step(base, Switches(plain_stride=16), x, tg)
    assert _err(_cat(plain), _cat(ref)) <= 2 * _err(_cat(lazy), _cat(ref)) + 1e-3
    counted = switch_cost.plain_bytes("yolov9-s", Switches(plain_stride=16)) * 8 * (320 / 640) ** 2
    assert 0.5 * counted <= plain_peak - lazy_peak <= 1.5 * counted, (plain_peak - lazy_peak, counted)
