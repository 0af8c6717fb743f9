"""extension.lean_host (on by default; YOLOV9C_LEAN_HOST=0 turns it off): the c step with its BatchNorm statistics
written into vectors kept across steps, workspaces kept per stream, num_batches_tracked counted once a forward and
the conv weights cast once a forward (casts.py) trains bit-identically to the plain path, makes fewer allocations
and launches, and never writes vectors something holds.
Run: python -m pytest -q tests/backends/test_lean_host.py (CUDA cases on a GPU)
"""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from seeded_models import shared_seeded_model
from yolov9c.api import make_loss
from yolov9c.backends import apply
from yolov9c.backends.c import casts, layers
from yolov9c.ops import bn_silu, extension

TARGETS = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 2, 0.3, 0.6, 0.2, 0.25], [0, 0, 0.7, 0.3, 0.2, 0.3]])
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = pytest.mark.usefixtures("one_thread")


def _train(base, lean, monkeypatch, steps=2, device="cpu", amp=False):
    """Loss per step, the gradients of the last and the state_dict after `steps` plain SGD steps of a c copy."""
    monkeypatch.setenv("YOLOV9C_LEAN_HOST", "1" if lean else "0")
    m = apply(copy.deepcopy(base).to(device), "c")
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(5)).to(device)
    loss_fn, losses = make_loss(m), []
    for _ in range(steps):
        for p in m.parameters():
            p.grad = None
        with torch.autocast(device, dtype=torch.float16 if device == "cuda" else torch.bfloat16, enabled=amp):
            out = m(x)
        loss, _ = loss_fn(out, TARGETS.to(device))
        loss.backward()
        with torch.no_grad():
            for p in m.parameters():
                if p.grad is not None:
                    p -= 0.01 * p.grad
        losses.append(loss.detach())
    return losses, [p.grad for p in m.parameters()], {k: v.clone() for k, v in m.state_dict().items()}


def _assert_same(a, b):
    assert all(torch.equal(x, y) for x, y in zip(a[0], b[0]))
    assert all((g is None and h is None) or torch.equal(g, h) for g, h in zip(a[1], b[1]))
    assert a[2].keys() == b[2].keys() and all(torch.equal(a[2][k], b[2][k]) for k in a[2])


@pytest.mark.parametrize("cfg", ["gelan-t", "yolov9-t"])  # yolov9-t: the recomputed auxiliary branch (StatsTape)
def test_lean_host_trains_bit_identically(cfg, monkeypatch):
    base = shared_seeded_model(cfg)
    default = _train(base, False, monkeypatch)
    lean = _train(base, True, monkeypatch)
    _assert_same(lean, default)
    counts = [v for k, v in lean[2].items() if k.endswith("num_batches_tracked")]
    assert counts and all(int(c) == int(c0) + 2 for c, c0 in
                          zip(counts, [v for k, v in base.state_dict().items() if k.endswith("num_batches_tracked")]))


class _Casts(TorchDispatchMode):
    """Counts the casts (aten._to_copy) of the parameters of `model` (by storage)."""

    def __init__(self, model):
        super().__init__()
        self.ptrs, self.n = {p.data_ptr() for p in model.parameters()}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in self.ptrs:
            self.n += 1
        return func(*args, **(kwargs or {}))


def test_lean_host_casts_the_weights_once_a_forward_bit_identically(monkeypatch):
    """Under autocast (bfloat16 on the CPU) the lean step reads the weights from one table refreshed a forward,
    also in its recomputed segments' backward (yolov9-t), with the default's losses, gradients and weights."""
    base = shared_seeded_model("yolov9-t")
    default = _train(base, False, monkeypatch, amp=True)
    lean = _train(base, True, monkeypatch, amp=True)
    _assert_same(lean, default)
    counted = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("YOLOV9C_LEAN_HOST", flag)
        m = apply(copy.deepcopy(base), "c")
        x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
        with _Casts(m) as mode:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = m(x)
            make_loss(m)(out, TARGETS)[0].backward()
        counted[flag] = mode.n
    assert counted["0"] > 100 and counted["1"] == 0, counted  # the table's refresh is one foreach copy


def test_cast_table_follows_the_weights_and_two_forwards_share_it(monkeypatch):
    """Two training forwards before one backward (the second refreshes the copies the first saved) pass autograd's
    in-place check and give the default's gradients; a forward after the weights change reads the new weights;
    outside a training forward, and without autocast, no table is read."""
    base = shared_seeded_model("gelan-t")
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    runs = []
    for flag in ("0", "1"):
        monkeypatch.setenv("YOLOV9C_LEAN_HOST", flag)
        m = apply(copy.deepcopy(base), "c")
        loss_fn = make_loss(m)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a, b = m(x), m(x.flip(-1))
        (loss_fn(a, TARGETS)[0] + loss_fn(b, TARGETS)[0]).backward()
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(0.5)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            c = m(x)
        runs.append(([p.grad for p in m.parameters()], loss_fn(c, TARGETS)[0].detach()))
    assert all((g is None and h is None) or torch.equal(g, h) for g, h in zip(runs[0][0], runs[1][0]))
    assert torch.equal(runs[0][1], runs[1][1])
    table = casts._TABLES[m]
    w = table.params[0]
    assert torch.equal(table.copies[w], w.detach().to(torch.bfloat16))
    with casts.weights_cast(m, None):
        assert casts.current() is None
    with torch.no_grad(), casts.weights_cast(m, torch.bfloat16):
        assert casts.current() is None


def test_kept_vectors_are_reused_only_when_free(monkeypatch):
    """Step to step the same vectors (no new statistics allocation); two forwards before one backward: the second
    gets new ones (the first's saved for its backward), and both backwards match the default."""
    monkeypatch.setenv("YOLOV9C_LEAN_HOST", "1")
    bn = torch.nn.BatchNorm2d(4)
    z = torch.rand(2, 4, 3, 3)
    first = layers._stats_out(bn, z)
    assert layers._stats_out(bn, z) is first  # nothing holds them
    held = first[0]
    assert layers._stats_out(bn, z) is None  # a Python reference holds the mean
    del held
    assert layers._stats_out(bn, z) is first
    base = shared_seeded_model("gelan-t")
    m = apply(copy.deepcopy(base), "c")
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    loss_fn = make_loss(m)
    a, _ = loss_fn(m(x), TARGETS)
    b, _ = loss_fn(m(x.flip(-1)), TARGETS)
    (a + b).backward()
    monkeypatch.setenv("YOLOV9C_LEAN_HOST", "0")
    r = apply(copy.deepcopy(base), "c")
    ra, _ = loss_fn(r(x), TARGETS)
    rb, _ = loss_fn(r(x.flip(-1)), TARGETS)
    (ra + rb).backward()
    assert torch.equal(a, ra) and torch.equal(b, rb)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(m.parameters(), r.parameters()) if p.grad is not None)


def test_counts_are_kept_when_the_forward_fails(monkeypatch):
    """counting_batches adds the counts the forward reached, also when it raises (as per-layer adds leave them)."""
    monkeypatch.setenv("YOLOV9C_LEAN_HOST", "1")
    bns = [torch.nn.BatchNorm2d(2) for _ in range(3)]
    z = torch.rand(2, 2, 3, 3)
    with pytest.raises(RuntimeError, match="stop"):
        with layers.counting_batches():
            for bn in bns[:2]:
                layers._batch_stats(bn, z)
            assert [int(b.num_batches_tracked) for b in bns] == [0, 0, 0]  # counted when the block ends
            raise RuntimeError("stop")
    assert [int(b.num_batches_tracked) for b in bns] == [1, 1, 0]
    layers._batch_stats(bns[2], z)  # outside a block: at once
    assert int(bns[2].num_batches_tracked) == 1


def test_lean_host_is_on_by_default_and_off_with_0(monkeypatch):
    monkeypatch.delenv("YOLOV9C_LEAN_HOST", raising=False)
    assert extension.lean_host()
    monkeypatch.setenv("YOLOV9C_LEAN_HOST", "0")
    assert not extension.lean_host()
    monkeypatch.setenv("YOLOV9C_LEAN_HOST", "1")
    assert extension.lean_host()


@CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("amp", [False, True])
def test_cuda_lean_host_trains_bit_identically_with_one_workspace_per_stream(amp, monkeypatch):
    # cuDNN's default float32 algorithms differ run to run (two default runs differ too): deterministic ones here
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    base = shared_seeded_model("yolov9-t")
    default = _train(base, False, monkeypatch, device="cuda", amp=amp)
    bn_silu._WORKSPACES.clear()
    lean = _train(base, True, monkeypatch, device="cuda", amp=amp)
    _assert_same(lean, default)
    stream = torch.cuda.current_stream().cuda_stream
    assert list(bn_silu._WORKSPACES) == [(torch.device("cuda", torch.cuda.current_device()), stream)]
