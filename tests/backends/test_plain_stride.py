"""The c backend's plain_stride switch (backends/c/switches.py, pgi.py): main layers and main head levels whose
finest input is at that stride or coarser run their torch forward on the activated input.

- Same results: with plain_stride 16 (with the auxiliary branch recomputed, and stored) the head maps, the loss,
  every parameter gradient and every BN buffer are as close to a float64 copy as the default c step's (within 8x
  its error + 1e-5, the bound test_backend_c.py holds c to against torch), and num_batches_tracked counts one
  update per step.
- It takes effect: the lazy path's calls fall (fewer BN/SiLU kernel calls and lazy conv Functions at 16 than the
  default; with the auxiliary branch stored and plain_stride 1 every layer runs torch's forward: no BN/SiLU call).
- Off (0, the default) is the step as before: the same calls as Switches() itself.
Run: python -m pytest -q tests/backends/test_plain_stride.py
"""

import copy

import pytest
import torch

from seeded_models import shared_seeded_model
from yolov9c.api import make_loss
from yolov9c.backends import apply
from yolov9c.backends.c.switches import Switches
from yolov9c.ops import extension

TARGETS = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 2, 0.3, 0.6, 0.2, 0.25], [0, 0, 0.7, 0.3, 0.2, 0.3]])


@pytest.fixture(autouse=True)
def _threads():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _step(m, x):
    """(maps, loss, parameter gradients, buffers) of one training step of m on x; and the BN/SiLU and lazy conv
    calls it made."""
    with extension.count_calls() as n:
        out = m(x)
        loss, _ = make_loss(m)(out, TARGETS)
        loss.backward()
    maps = [t.detach() for level in out for t in level]
    return (maps, loss.detach(), [p.grad for p in m.parameters()], [b.detach().clone() for b in m.buffers()],
            sum(v for k, v in n.calls.items() if k.startswith("bn_")))


def _cat(ts):
    return torch.cat([t.detach().double().flatten() for t in ts])


def _err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("cfg", ["yolov9-t", "yolov9-c"])
@pytest.mark.parametrize("aux", [True, False])
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
