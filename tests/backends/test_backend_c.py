"""The c backend (yolov9c.backends, "c") against the torch backend: same weights, same inputs.

Tolerances (err(a, ref) = max|a − ref| / max|ref| per tensor, "norm-relative"):
  - blocks (one layer, identical float32 inputs): outputs, input gradient, every parameter gradient, running
    statistics within 1e-5 of the torch block; num_batches_tracked equal.
  - whole models (float32, CPU): a randomly initialised YOLOv9 is numerically chaotic at test sizes (~30
    chained BatchNorms over 2×2..8×8 maps): the torch backend itself is only ~1e-4 (outputs) / ~1e-3
    (gradients) away from the same model in float64, and any change of rounding order moves a result by that
    much. So each backend is measured against the float64 torch model and the c backend must be as accurate
    as the torch backend: err_c ≤ 8·err_torch + 1e-5 for the head maps (max over maps), the loss, all
    parameter gradients (concatenated) and the BN buffers (concatenated); num_batches_tracked equal; the
    same parameters get gradients. (Measured: outputs, loss and buffers are within 1-3× of the torch error;
    yolov9-t's gradients are 3-5× it, gelan-s's below it, while every block alone is as accurate as torch.)
    The loss is ONE number, so its torch error is one draw, not a level: the yardstick for the loss is the
    larger error of two equally valid float32 evaluations of the torch backend, NCHW and channels-last.
    (Measured on yolov9-c at 64×64: torch NCHW 3.7e-7, torch channels-last 6.9e-6, c 3.6e-5; the loss terms
    there hang on target scores ~1e-3 = s^0.5·CIoU^6 of a random model, so map errors of ~1e-4 move the loss
    by 1e-6..3e-5 with no change of assignment: float64 maps perturbed by noise of the torch backend's own
    error size give a median loss error of 6.8e-6, up to 2.4e-5 in 40 draws. The maps, gradients and buffers
    are max-norms over many elements and keep the plain NCHW yardstick.)
  - CUDA (marked `cuda`): the same, plus fp16 autocast against the float32 torch model within 2e-2.
The whole models run the backend's defaults, so yolov9-t / yolov9-c recompute their PGI auxiliary branch (and
the stride-4/8 backbone blocks): these cases are that path's accuracy check (tests/backends/test_backend_pgi.py
checks it equals the stored path).
Run: python -m pytest -q tests/backends/test_backend_c.py
(GPU: python -m pytest -q -m cuda tests/backends/test_backend_c.py)
"""

import copy
import io

import pytest
import torch
import torch.nn as nn

from seeded_models import seeded_model, shared_seeded_model
from yolov9c.api import build_model, make_loss
from yolov9c.backends import apply, backend_of
from yolov9c.backends.c import layers, lazy
from yolov9c.backends.c.lazy import materialise_any
from yolov9c.models.common import (ADown, AConv, CBFuse, CBLinear, Conv, ELAN1, RepConvN, RepNBottleneck, RepNCSP,
                                   RepNCSPELAN4, SPPELAN)
from yolov9c.ops import bn_silu as ops

BLOCK_TOL = 1e-5


def err(a, ref):
    a, ref = a.detach().double(), ref.detach().double()
    return ((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def flat(o):
    return [t for v in (o if isinstance(o, (list, tuple)) else [o]) for t in (v if isinstance(v, list) else [v])]


@pytest.fixture(autouse=True)
def _threads():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # the CI machine is small and shared; one thread is also deterministic
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------------------------------------ blocks

def _blocks():
    return {
        "Conv": lambda: Conv(8, 16, 3, 2),
        "Conv-identity": lambda: Conv(8, 16, 1, act=False),
        "Conv-leakyrelu": lambda: Conv(8, 16, 3, act=nn.LeakyReLU(0.1)),
        "RepConvN": lambda: RepConvN(8, 16),
        "RepNBottleneck": lambda: RepNBottleneck(8, 8),
        "RepNCSP": lambda: RepNCSP(8, 16, 2),
        "RepNCSPELAN4": lambda: RepNCSPELAN4(8, 16, 16, 8, 2),
        "ELAN1": lambda: ELAN1(8, 16, 16, 8),
        "ADown": lambda: ADown(8, 16),
        "AConv": lambda: AConv(8, 16),
        "SPPELAN": lambda: SPPELAN(8, 16, 8),
        "Upsample": lambda: nn.Upsample(None, 2, "nearest"),
    }


def _check_block(b1, b2, y1, y2, x1, x2):
    assert err(y2, y1) < BLOCK_TOL, "output"
    g = torch.randn_like(y1)
    (y1 * g).sum().backward()
    (y2 * g).sum().backward()
    assert err(x2.grad, x1.grad) < BLOCK_TOL, "input gradient"
    for (n, p1), p2 in zip(b1.named_parameters(), b2.parameters()):
        assert (p1.grad is None) == (p2.grad is None), n
        if p1.grad is not None:
            assert err(p2.grad, p1.grad) < BLOCK_TOL, n
    for (n, t1), t2 in zip(b1.named_buffers(), b2.buffers()):
        if t1.dtype.is_floating_point:
            assert err(t2, t1) < BLOCK_TOL, n
        else:
            assert torch.equal(t1, t2), n


@pytest.mark.parametrize("name", list(_blocks()))
@pytest.mark.parametrize("shape", [(2, 8, 8, 8), (1, 8, 6, 10)])
def test_block_matches_torch(name, shape):
    torch.manual_seed(1)
    b1 = _blocks()[name]().train()
    b2 = copy.deepcopy(b1)
    x1 = (torch.randn(shape) * 2 + 0.5).requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    y1 = b1(x1)
    out = layers.run(b2, x2)
    y2 = materialise_any(out)
    assert y2.shape == y1.shape
    _check_block(b1, b2, y1, y2, x1, x2)


def test_cblinear_cbfuse_match_torch():
    torch.manual_seed(2)
    lin, fuse = CBLinear(8, [4, 6]), CBFuse([1])
    lin2, fuse2 = copy.deepcopy(lin), copy.deepcopy(fuse)
    conv, conv2 = Conv(8, 6, 3), None
    conv2 = copy.deepcopy(conv)
    a1 = torch.randn(2, 8, 4, 4, requires_grad=True)
    m1 = torch.randn(2, 8, 8, 8, requires_grad=True)
    a2, m2 = a1.detach().clone().requires_grad_(), m1.detach().clone().requires_grad_()
    y1 = fuse([lin(a1), conv(m1)])
    y2 = materialise_any(layers.run(fuse2, [layers.run(lin2, a2), layers.run(conv2, m2)]))
    assert err(y2, y1) < BLOCK_TOL
    g = torch.randn_like(y1)
    (y1 * g).sum().backward()
    (y2 * g).sum().backward()
    for t1, t2 in ((a1, a2), (m1, m2), *zip(lin.parameters(), lin2.parameters()),
                   *zip(conv.parameters(), conv2.parameters())):
        assert err(t2.grad, t1.grad) < BLOCK_TOL


def test_sum_keeps_no_upsampled_term():
    """A CBFuse materialised without grad (a conv's input) keeps none of its upsampled terms: each is as large
    as the sum (yolov9-e's stem held five of them, 4 GiB at batch 64), so the evaluator drops each after adding."""
    from yolov9c.backends.c.lazy import Evaluator, Spatial, Sum
    torch.manual_seed(3)
    lin_a, lin_b, fuse = CBLinear(8, [4, 4]), CBLinear(8, [4]), CBFuse([1, 0])
    with torch.no_grad():
        xs = [layers.run(lin_a, torch.randn(2, 8, 4, 4)), layers.run(lin_b, torch.randn(2, 8, 2, 2)),
              layers.run(Conv(8, 4, 3), torch.randn(2, 8, 8, 8))]
        node = layers.run(fuse, xs)
        assert isinstance(node, Sum) and sum(isinstance(c, Spatial) for c in node.children) == 2
        ev = Evaluator(torch.float32, torch.contiguous_format, grad=False)
        y = ev.run(node)
        ref = materialise_any(node)
    assert torch.allclose(y, ref)
    kept = [c for c in node.children if id(c) in ev.memo]
    assert not kept, [type(c).__name__ for c in kept]


def test_sliced_leaf_makes_its_operand_once():
    """A BNAct or RepAct over part of its channels makes its BN operands (channel slices of the stored tensors) on
    first use and keeps them for its later reads; over all channels the stored operands serve as they are."""
    torch.manual_seed(5)
    bn1, bn2 = (ops.BN(torch.randn(2, 6, 3, 3), torch.randn(6), torch.rand(6) + 0.5, torch.randn(6), torch.randn(6))
                for _ in range(2))
    full = lazy.BNAct(bn1, "silu")
    assert full.op is bn1 and full.operand() is bn1
    part = full.slice(2, 5)
    assert part.op is None
    op = part.operand()
    assert part.op is op and part.operand() is op
    for got, t in zip(op, bn1):
        assert torch.equal(got, t[:, 2:5] if t.ndim == 4 else t[2:5])
    rep = lazy.RepAct(bn1, bn2)
    assert rep.operands() == (bn1, bn2)
    half = rep.slice(0, 3)
    pair = half.operands()
    assert half.pair is pair and half.operands() is pair
    assert torch.equal(pair[1].z, bn2.z[:, :3]) and torch.equal(pair[1].bias, bn2.bias[:3])
    with torch.no_grad():
        assert torch.equal(materialise_any(part), materialise_any(full)[:, 2:5])
        assert torch.equal(materialise_any(half), materialise_any(rep)[:, :3])


def test_fused_zero_uses_references(monkeypatch):
    """YOLOV9C_FUSED=0 keeps the c structure with the torch reference ops: same results."""
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    test_block_matches_torch("RepNCSPELAN4", (2, 8, 8, 8))


# ------------------------------------------------------------------------------------------------ models

_TARGETS = None


def _targets(batch):
    return torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [batch - 1, 2, 0.3, 0.6, 0.2, 0.25],
                         [0, 0, 0.7, 0.3, 0.2, 0.3]])


def _step(model, x, targets):
    for p in model.parameters():
        p.grad = None
    out = model(x)
    loss, _ = make_loss(model)(out, targets)
    loss.backward()
    return (flat(out), loss.detach(), [p.grad for p in model.parameters()],
            [b.detach().clone() for b in model.buffers()])


def _loss_channels_last(model, x, targets):
    """The torch backend's loss with model and input in channels-last: the same maths in another equally
    valid float32 rounding order (train-mode forward on `model`, which it changes)."""
    model = model.to(memory_format=torch.channels_last)
    with torch.no_grad():
        return make_loss(model)(model(x.contiguous(memory_format=torch.channels_last)), targets)[0]


def _cat(ts):
    return torch.cat([t.detach().double().flatten() for t in ts])


def _compare_models(cfg, shape, device="cpu", factor=8.0):
    if isinstance(cfg, str):
        base = shared_seeded_model(cfg)  # only read and copied here
    else:  # a yaml dict
        torch.manual_seed(0)
        base = build_model(cfg, nc=3).train()
    m_t = copy.deepcopy(base).to(device)
    m_c = apply(copy.deepcopy(base).to(device), "c")
    m_64 = copy.deepcopy(base).double().to(device)
    x = torch.rand(*shape, device=device)
    tg = _targets(shape[0]).to(device)
    rt, rc, r64 = _step(m_t, x, tg), _step(m_c, x, tg), _step(m_64, x.double(), tg)
    loss_cl = _loss_channels_last(copy.deepcopy(base).to(device), x, tg)

    # the same parameters get gradients; num_batches_tracked counts the same
    assert [g is None for g in rc[2]] == [g is None for g in rt[2]]
    ints_t = [b for b in rt[3] if not b.dtype.is_floating_point]
    ints_c = [b for b in rc[3] if not b.dtype.is_floating_point]
    assert all(torch.equal(a, b) for a, b in zip(ints_c, ints_t))
    before = [b for b in base.buffers() if not b.dtype.is_floating_point]  # the stride probe counted 1
    assert ints_c and all(int(b) == int(b0) + 1 for b, b0 in zip(ints_c, before))

    def check(what, c, t, ref, *more_t):
        ec, et = err(c, ref), max(err(tt, ref) for tt in (t, *more_t))
        assert ec <= factor * et + 1e-5, f"{cfg} {what}: c error {ec:.2e} vs torch error {et:.2e} (float64 reference)"

    for i, (c, t, ref) in enumerate(zip(rc[0], rt[0], r64[0])):
        assert c.shape == t.shape and c.dtype == t.dtype
        check(f"map {i}", c, t, ref)
    check("loss", rc[1], rt[1], r64[1], loss_cl)  # a scalar: two torch evaluations (module docstring)
    got = [i for i, g in enumerate(r64[2]) if g is not None]
    check("gradients", _cat(rc[2][i] for i in got), _cat(rt[2][i] for i in got), _cat(r64[2][i] for i in got))
    fl = [i for i, b in enumerate(r64[3]) if b.dtype.is_floating_point]
    check("BN buffers", _cat(rc[3][i] for i in fl), _cat(rt[3][i] for i in fl), _cat(r64[3][i] for i in fl))
    return m_c


@pytest.mark.parametrize("cfg, shape", [
    ("yolov9-t", (2, 3, 64, 64)),
    ("gelan-s", (2, 3, 96, 64)),  # odd aspect (the CPU-sized stand-in for 320×256)
    ("yolov9-t", (1, 3, 64, 96)),  # batch 1: P5 is 2×3, still more than one value per channel
])
def test_model_matches_torch(cfg, shape):
    _compare_models(cfg, shape)


def test_yolov9c_matches_torch():
    """yolov9-c: CBLinear/CBFuse and the second backbone (PGI), at 64×64 (batch 1 there leaves 4 values per
    channel at P5, where float32 and float64 torch already differ by ~10 %: too ill-conditioned to compare)."""
    _compare_models("yolov9-c", (2, 3, 64, 64))


def test_sgd_trajectory():
    """5 SGD steps (momentum, weight decay) from the same start: the c run stays as close to the float64 run
    as the torch run does."""
    base = shared_seeded_model("yolov9-t")  # only read and copied here
    runs = []
    for backend, dtype in (("torch", torch.float32), ("c", torch.float32), ("torch", torch.float64)):
        m = apply(copy.deepcopy(base).to(dtype), backend)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        gen = torch.Generator().manual_seed(3)
        for _ in range(5):
            x = torch.rand(2, 3, 64, 64, generator=gen).to(dtype)
            opt.zero_grad()
            loss, _ = make_loss(m)(m(x), _targets(2))
            loss.backward()
            opt.step()
        runs.append(_cat(list(m.parameters()) + [b for b in m.buffers() if b.dtype.is_floating_point]))
    start = _cat(list(base.parameters()) + [b for b in base.buffers() if b.dtype.is_floating_point])
    t, c, ref = (r - start for r in runs)  # the change made by the 5 steps
    # after 5 steps the float32 torch run itself is far from the float64 run (assignments flip): only the
    # relative bound is meaningful here
    assert err(c, ref) <= 8 * err(t, ref) + 1e-5


# ------------------------------------------------------------------------------------------------ transform

def test_apply_keeps_state_and_restores():
    m = seeded_model("yolov9-t")
    keys = list(m.state_dict())
    names = [n for n, _ in m.named_modules()]
    ref = copy.deepcopy(m)
    assert backend_of(m) == "torch"
    assert apply(m, "c") is m and backend_of(m) == "c"
    apply(m, "c")  # idempotent
    assert list(m.state_dict()) == keys and [n for n, _ in m.named_modules()] == names
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), ref.state_dict().values()))
    assert apply(m, "torch") is m and backend_of(m) == "torch"
    assert all("forward" not in layer.__dict__ for layer in m.model)
    x = torch.rand(2, 3, 64, 64)
    assert all(torch.equal(a, b) for a, b in zip(flat(m(x)), flat(ref(x))))  # plain torch again, bit for bit
    with pytest.raises(ValueError, match="backend"):
        apply(m, "cuda")
    with pytest.raises(TypeError):
        apply(nn.Linear(2, 2), "c")


def test_checkpoint_moves_between_backends():
    m = apply(seeded_model("yolov9-t"), "c")
    loss, _ = make_loss(m)(m(torch.rand(2, 3, 64, 64)), _targets(2))
    loss.backward()
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    plain = seeded_model("yolov9-t")
    plain.load_state_dict(torch.load(buf, weights_only=True))
    assert backend_of(plain) == "torch"
    for (k, a), b in zip(m.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), k


def test_eval_and_deepcopy_run_torch():
    """Eval mode (validation, the EMA copy) runs every layer's torch forward: identical to the torch backend;
    a deep copy of a c model is a c model whose forwards are bound to the copy."""
    m = apply(seeded_model("yolov9-t"), "c")
    ref = apply(copy.deepcopy(m), "torch").eval()
    ema = copy.deepcopy(m).eval()
    assert backend_of(ema) == "c"
    assert all(layer.forward.__self__ is layer for layer in ema.model)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        y_ema, y_ref = ema(x), ref(x)
    assert all(torch.equal(a, b) for a, b in zip(flat(y_ema[0]), flat(y_ref[0])))


def test_fused_model_trains_through_torch_path():
    """A fused (deploy) model has no BatchNorm: its layers run the torch forward even in train mode."""
    m = seeded_model("gelan-s").eval().fuse().train()
    ref = copy.deepcopy(m)
    apply(m, "c")
    x = torch.rand(1, 3, 64, 64)
    assert all(torch.equal(a, b) for a, b in zip(flat(m(x)), flat(ref(x))))
    assert not any(layers.supported(layer) for layer in m.model if any(True for _ in layer.parameters()))


def test_leakyrelu_activation_yaml():
    """A yaml `activation:` other than SiLU: those Convs apply BN + act through torch; results still match.
    gelan-t: gelan-s's layers at a quarter of the widths (test_model_matches_torch runs gelan-s itself)."""
    from yolov9c.models.parse import resolve_config

    d, _, _ = resolve_config("gelan-t")
    d["activation"] = "nn.LeakyReLU(0.1)"
    _compare_models(d, (2, 3, 64, 64))


# ------------------------------------------------------------------------------------------------ CUDA

def _cuda_pair(cfg, channels_last):
    torch.manual_seed(0)
    base = build_model(cfg, nc=3).train().cuda()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    m_t = copy.deepcopy(base).to(memory_format=fmt)
    m_c = apply(copy.deepcopy(base).to(memory_format=fmt), "c")
    return m_t, m_c


@pytest.mark.cuda
@pytest.mark.parametrize("cfg", ["yolov9-t", "gelan-s", "yolov9-c"])
def test_cuda_fp32_matches_torch(cfg):
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False  # true float32 convs
    try:
        _compare_models(cfg, (2, 3, 320, 256), device="cuda")
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.cuda
@pytest.mark.parametrize("cfg", ["yolov9-t", "yolov9-c"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cuda_amp_matches_torch(cfg, channels_last):
    """fp16 autocast: z is stored in fp16, channels-last models run channels-last, and the c backend is as
    close to the float32 (TF32 off) result as the torch backend under autocast is. A direct c-vs-torch 2e-2
    bound is not met by ANY two fp16 implementations of these randomly initialised train-mode models: the c
    kernels round once where torch rounds BN's output and then SiLU's (two fp16 roundings), and the ~60
    train-mode BatchNorms amplify such 1-ulp differences (measured on the H200: head maps 3-8e-2 apart).
    So: err(c_amp, fp32) <= 2·err(torch_amp, fp32) + 2e-2 for head maps, loss and gradients."""
    m_t, m_c = _cuda_pair(cfg, channels_last)
    m_32 = copy.deepcopy(m_t)
    x = torch.rand(4, 3, 320, 256, device="cuda")
    tg = _targets(4).cuda()
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    res = []
    try:
        for m, amp in ((m_t, True), (m_c, True), (m_32, False)):
            with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                out = m(x)
                loss, _ = make_loss(m)(out, tg)
            loss.backward()
            res.append((flat(out), loss.detach().float(), [p.grad for p in m.parameters()]))
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
    (ot, lt, gt), (oc, lc, gc), (o32, l32, g32) = res
    for a, b, r in zip(oc, ot, o32):
        assert a.dtype == b.dtype == torch.float16
        assert err(a.float(), r) <= 2 * err(b.float(), r) + 2e-2, (err(a.float(), r), err(b.float(), r))
    assert err(lc, l32) <= 2 * err(lt, l32) + 2e-2, (err(lc, l32), err(lt, l32))
    got = [i for i, g in enumerate(g32) if g is not None]
    assert [i for i, g in enumerate(gc) if g is not None] == got
    e_c, e_t = err(_cat(gc[i] for i in got), _cat(g32[i] for i in got)), err(_cat(gt[i] for i in got), _cat(g32[i] for i in got))
    assert e_c <= 2 * e_t + 2e-2, (e_c, e_t)
    if channels_last:
        assert oc[0].is_contiguous(memory_format=torch.channels_last)


def _block_grads(block, x, g):
    for p in block.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    (materialise_any(layers.run(block, x)) * g).sum().backward()
    return [x.grad] + [p.grad for p in block.parameters()]


def test_shared_bn_backward_runs_once_per_output(monkeypatch):
    """A conv output read by several lazy convs (RepNCSPELAN4's first conv: its halves go to the next stage
    and to the last conv) gets its readers' dL/dy summed in a lazy.SharedGrad and one BN backward, run by its
    producer: fewer BN backwards than one per reader (SharedGrad.deferred off) and the same gradients."""
    torch.manual_seed(3)
    block = RepNCSPELAN4(8, 16, 16, 8, 2).train()
    x = torch.randn(2, 8, 8, 8)
    g = torch.randn(2, 16, 8, 8)
    sizes = []
    real = ops.backward
    monkeypatch.setattr(ops, "backward", lambda bn, *a, **k: sizes.append(bn.z.numel()) or real(bn, *a, **k))
    shared = _block_grads(block, x, g)
    n_shared = len(sizes)
    sizes.clear()
    monkeypatch.setattr(lazy.SharedGrad, "deferred", lambda self: False)
    per_reader = _block_grads(block, x, g)
    assert 0 < n_shared < len(sizes)
    for a, b in zip(shared, per_reader):
        assert (a is None) == (b is None)
        if a is not None:
            assert err(a, b) < 1e-6


def test_autocast_dtype_reads_the_autocast_state():
    """conv.autocast_dtype and conv.autocast_on (the c backend's compute dtype comes from them), off and under CPU
    autocast."""
    from yolov9c.backends.c import conv

    assert conv.autocast_dtype("cpu") is None and conv.autocast_on("cpu") is False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert conv.autocast_dtype("cpu") == torch.bfloat16 and conv.autocast_dtype("cuda") is None
        assert conv.autocast_on("cpu") is True and conv.autocast_on("cuda") is False
    assert conv.autocast_dtype("cpu") is None


def test_autocast_off_inside_the_function(monkeypatch):
    """LazyConvFunction runs its convs with autocast off when it was on, and on again after, also when the inside
    raises; without autocast it sets nothing."""
    import types

    import torch.nn.functional as F

    from yolov9c.backends.c import conv

    seen, fail = [], [False]

    def conv2d(*args):
        seen.append(conv.autocast_dtype("cpu"))
        if fail[0]:
            raise KeyError
        return F.conv2d(*args)

    monkeypatch.setattr(conv, "F", types.SimpleNamespace(conv2d=conv2d))
    c = nn.Conv2d(2, 3, 1)
    x = lazy.Plain(torch.randn(1, 2, 3, 3, requires_grad=True))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (z,) = conv.lazy_conv(x, [c])
        assert seen == [None] and z.dtype == torch.bfloat16
        assert conv.autocast_dtype("cpu") == torch.bfloat16
        fail[0] = True
        with pytest.raises(KeyError):
            conv.lazy_conv(x, [c])
        assert conv.autocast_dtype("cpu") == torch.bfloat16
    fail[0] = False
    (z,) = conv.lazy_conv(x, [c])
    assert seen[-1] is None and z.dtype == torch.float32
    assert conv.autocast_dtype("cpu") is None


def test_supported_follows_replaced_submodules():
    """layers.supported() caches its answer on the layer; replacing a sub-module by one the c forwards cannot run
    (a reflect-padded conv) and back changes the answer each time, also when the new module takes the freed one's
    address (as CPython tends to: a cache keyed by ids would keep the old answer)."""
    block = RepNCSPELAN4(8, 16, 16, 8, 1).train()
    assert layers.supported(block)
    c_in, c_out = block.cv4.conv.in_channels, block.cv4.conv.out_channels
    for mode in ["reflect", "zeros"] * 4:
        del block.cv4.conv  # freed here unless something still holds it
        block.cv4.conv = nn.Conv2d(c_in, c_out, 1, bias=False, padding_mode=mode)
        assert layers.supported(block) == (mode == "zeros"), mode


def test_direct_apply_is_the_function_apply(monkeypatch):
    """conv.direct_apply(F): the same outputs and gradients as F.apply through torch's C apply; F.apply itself
    while functorch transforms are active, and for a Function with setup_context (torch's wrapper binds its
    defaults)."""
    from yolov9c.backends.c import conv

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            ctx.k = k
            return x * k

        @staticmethod
        def backward(ctx, g):
            return g * ctx.k, None

    class WithSetup(Twice):
        @staticmethod
        def forward(x, k):
            return x * k

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.k = inputs[1]

    assert conv.direct_apply(WithSetup) == WithSetup.apply
    apply = conv.direct_apply(Twice)
    x = torch.randn(3, requires_grad=True)
    y = apply(x, 3.0)
    y.sum().backward()
    assert type(y.grad_fn).__name__ == "TwiceBackward"
    assert torch.equal(y, x * 3) and torch.equal(x.grad, torch.full((3,), 3.0))
    seen = []
    monkeypatch.setattr(torch._C, "_are_functorch_transforms_active", lambda: True)
    monkeypatch.setattr(Twice, "apply", classmethod(lambda cls, *a: seen.append(a) or "wrapper"))
    assert conv.direct_apply(Twice)(x, 2.0) == "wrapper" and seen == [(x, 2.0)]


def test_lazy_conv_function_inputs_are_what_autograd_needs(monkeypatch):
    """LazyConvFunction's inputs after its call object are tensors that require grad (the leaves of its lazy
    input that do, then the conv's parameters): no None, no batch statistic or image."""
    from yolov9c.backends.c import conv

    inputs = []
    forward = conv.LazyConvFunction.forward
    monkeypatch.setattr(conv.LazyConvFunction, "forward",
                        staticmethod(lambda ctx, call, *a: inputs.append(a) or forward(ctx, call, *a)))
    block = RepNCSPELAN4(8, 16, 16, 8, 1).train()
    x = torch.randint(0, 256, (2, 8, 8, 8), dtype=torch.uint8)
    materialise_any(layers.run(block, lazy.Image(x))).sum().backward()
    assert len(inputs) == 12  # cv1, RepNCSP's (cv1, cv2), its RepConvN, bottleneck cv2, cv3, a 3x3 conv, twice; cv4
    assert all(isinstance(t, torch.Tensor) and t.requires_grad for a in inputs for t in a)
    first = (block.cv1.conv.weight, block.cv1.bn.weight, block.cv1.bn.bias)  # the uint8 image is no input
    assert len(inputs[0]) == 3 and all(a is b for a, b in zip(inputs[0], first))
