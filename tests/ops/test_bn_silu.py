"""Tests of the fused BatchNorm/SiLU ops (yolov9c/ops/bn_silu.py, csrc/bn_silu*.c, kernels/bn_silu_*.cu).

Ground truth: torch.nn.BatchNorm2d(momentum=0.03, eps=1e-3) in training mode followed by F.silu (or
nothing, act="identity"), differentiated by autograd, all in float64 from the same stored inputs.

Tolerances (|actual - truth| <= tol · max|truth| per tensor; a failure prints the largest difference and
the share of the tolerance used):
  * float32 storage: 1e-5 (C CPU, CUDA and the torch reference alike; arithmetic is float32, sums float64).
  * float16 storage: 2e-3 (the output's own rounding is 2^-11 relative, plus float32 arithmetic).
  * bfloat16 storage: 1e-2 (rounding 2^-8 relative).
  * statistics (mean, invstd, running buffers): 1e-5 relative per channel, float32 storage, also for means
    ~10 with n = 64·160·160 on the GPU.
CPU cases always run (a few seconds); CUDA cases are marked `cuda` and skip without a GPU.
Run: python -m pytest -q tests/ops/test_bn_silu.py
"""


import os
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from yolov9c.ops import bn_silu as ops
from yolov9c.ops import extension

C_EXT = extension.load()
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
MOMENTUM, EPS = 0.03, 1e-3


def close(actual, truth, tol, what):
    actual, truth = actual.detach().double().cpu(), truth.detach().double().cpu()
    assert actual.shape == truth.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(truth.shape)}"
    scale = truth.abs().max().item() or 1.0
    diff = (actual - truth).abs().max().item()
    allowed = tol * scale
    assert diff <= allowed, f"{what}: max |diff| {diff:.3g} is {100 * diff / allowed:.0f}% of the allowed {allowed:.3g}"


def backward_reference(bn, grad_out, **kw):
    """ops.backward on the torch reference path (YOLOV9C_FUSED=0: the public way to the reference)."""
    with mock.patch.dict(os.environ, {"YOLOV9C_FUSED": "0"}):
        return ops.backward(bn, grad_out, **kw)


def per_channel_close(actual, truth, tol, what):
    actual, truth = actual.detach().double().cpu(), truth.detach().double().cpu()
    rel = ((actual - truth).abs() / truth.abs().clamp(min=1e-12)).max().item()
    assert rel <= tol, f"{what}: max relative error {rel:.3g} is {100 * rel / tol:.0f}% of the allowed {tol:.3g}"


# ----------------------------------------------------------------------------------------------- inputs


def make_z(shape, layout, dtype, device="cpu", seed=0, loc=1.0, scale=2.0):
    """z of `shape` (B, C, H, W) in a layout: 'nchw', 'cl' (channels-last), 'slice' (channels 2..2+C of an
    NCHW buffer), 'cl_slice' (same in a channels-last buffer), 'hw' (W and H swapped in memory)."""
    g = torch.Generator().manual_seed(seed)
    B, C, H, W = shape
    base = torch.randn(B, C + 5, H, W, generator=g) * scale + loc
    # per-channel offsets so that channels differ; every channel mean stays in [loc, 2·loc], away from 0,
    # so that per-channel relative checks of the mean are meaningful
    base = base + torch.linspace(0, 1, C + 5).view(1, -1, 1, 1) * loc
    if layout == "nchw":
        t = base[:, :C].contiguous()
    elif layout == "cl":
        t = base[:, :C].contiguous(memory_format=torch.channels_last)
    elif layout == "slice":
        t = base.to(dtype).to(device)[:, 2:2 + C]
        return t
    elif layout == "cl_slice":
        t = base.to(dtype).contiguous(memory_format=torch.channels_last).to(device)[:, 2:2 + C]
        return t
    elif layout == "hw":
        t = base[:, :C].transpose(2, 3).contiguous().transpose(2, 3)
    else:
        raise AssertionError(layout)
    return t.to(dtype).to(device)


def params(C, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    w = (0.5 + torch.rand(C, generator=g)).to(device)
    b = (torch.rand(C, generator=g) - 0.5).to(device)
    return w, b


def ground_truth(z, w, b, gy, act="silu", residual=None):
    """float64 BatchNorm2d (train) + act through autograd: y, dz, dw, db, mean, invstd, running mean/var."""
    bn = torch.nn.BatchNorm2d(z.shape[1], momentum=MOMENTUM, eps=EPS).double().train()
    with torch.no_grad():
        bn.weight.copy_(w.double().cpu())
        bn.bias.copy_(b.double().cpu())
    zd = z.detach().double().cpu().requires_grad_()
    y = bn(zd)
    y = F.silu(y) if act == "silu" else y
    if residual is not None:
        y = y + residual.detach().double().cpu()
    (y * gy.detach().double().cpu()).sum().backward()
    var, mean = torch.var_mean(zd.detach(), dim=(0, 2, 3), unbiased=False)
    return {"y": y.detach(), "dz": zd.grad, "dw": bn.weight.grad, "db": bn.bias.grad, "mean": mean,
            "invstd": 1 / torch.sqrt(var + EPS), "rm": bn.running_mean, "rv": bn.running_var}


def check_all(z, act="silu", device="cpu", seed=0):
    """Stats, running buffers, forward, autograd backward and the raw backward against the ground truth."""
    dtype = z.dtype
    tol = TOL[dtype]
    C = z.shape[1]
    w, b = params(C, device, seed + 1)
    gy = torch.randn(z.shape, generator=torch.Generator().manual_seed(seed + 2)).to(device)
    truth = ground_truth(z, w, b, gy, act)

    rm, rv = torch.zeros(C, device=device), torch.ones(C, device=device)
    mean, invstd = ops.stats(z, rm, rv, momentum=MOMENTUM, eps=EPS)
    assert mean.dtype == invstd.dtype == torch.float32 and mean.device == z.device
    stat_tol = 1e-5 if dtype == torch.float32 else 1e-4
    per_channel_close(mean, truth["mean"], stat_tol, "mean")
    per_channel_close(invstd, truth["invstd"], stat_tol, "invstd")
    per_channel_close(rm, truth["rm"], stat_tol, "running_mean")
    per_channel_close(rv, truth["rv"], stat_tol, "running_var")

    zg = z.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    wg, bg = w.clone().requires_grad_(), b.clone().requires_grad_()
    y = ops.forward(ops.BN(zg, mean, invstd, wg, bg), act=act)
    assert y.dtype == dtype and y.shape == z.shape
    close(y, truth["y"], tol, "y")
    # Backward with float16/bfloat16 storage: dy reaches the op rounded to the storage dtype too.
    gtol = tol if dtype == torch.float32 else 2 * tol
    (y.float() * gy).sum().backward()
    close(zg.grad, truth["dz"], gtol, "dz (autograd)")
    close(wg.grad, truth["dw"], gtol, "dweight (autograd)")
    close(bg.grad, truth["db"], gtol, "dbias (autograd)")

    dz, dw, db = ops.backward(ops.BN(z, mean, invstd, w, b), gy.to(dtype), act=act)
    assert dz.dtype == dtype and dw.dtype == db.dtype == torch.float32
    close(dz, truth["dz"], gtol, "dz (raw)")
    close(dw, truth["dw"], gtol, "dweight (raw)")
    close(db, truth["db"], gtol, "dbias (raw)")
    return mean, invstd, w, b, gy, truth


# ----------------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("layout", ["nchw", "cl", "slice", "cl_slice", "hw"])
@pytest.mark.parametrize("act", ["silu", "identity"])
def test_cpu_matches_batchnorm(layout, act):
    check_all(make_z((2, 13, 7, 9), layout, torch.float32), act=act)


@pytest.mark.parametrize("shape", [(1, 3, 5, 3), (3, 1, 1, 2), (4, 9, 1, 1), (2, 37, 3, 11)])
def test_cpu_odd_shapes(shape):
    check_all(make_z(shape, "nchw", torch.float32, seed=3), seed=3)
    check_all(make_z(shape, "cl", torch.float32, seed=4), seed=4)


def test_cpu_float16_storage():
    check_all(make_z((2, 6, 5, 7), "cl", torch.float16, seed=5), seed=5)


def test_cpu_bfloat16_storage_goes_through_reference():
    check_all(make_z((2, 6, 5, 7), "nchw", torch.bfloat16, seed=6), seed=6)


def test_cpu_stats_large_mean():
    z = make_z((8, 3, 64, 64), "nchw", torch.float32, seed=7, loc=10.0, scale=1.0)
    truth_var, truth_mean = torch.var_mean(z.double(), dim=(0, 2, 3), unbiased=False)
    mean, invstd = ops.stats(z, eps=EPS)
    per_channel_close(mean, truth_mean, 1e-6, "mean")
    per_channel_close(invstd, 1 / torch.sqrt(truth_var + EPS), 1e-5, "invstd")


def test_cpu_out_views_and_dtypes():
    z = make_z((2, 5, 4, 6), "nchw", torch.float32, seed=8)
    mean, invstd = ops.stats(z)
    w, b = params(5)
    want = ops.reference(ops.BN(z, mean, invstd, w, b))
    for fmt in (torch.contiguous_format, torch.channels_last):
        for dtype in (torch.float32, torch.float16):
            buf = torch.full((2, 11, 4, 6), 7.0, dtype=dtype).contiguous(memory_format=fmt)
            res = ops.forward(ops.BN(z, mean, invstd, w, b), out=buf[:, 3:8])
            assert res.data_ptr() == buf[:, 3:8].data_ptr()
            close(buf[:, 3:8], want, TOL[dtype], f"out view {dtype} {fmt}")
            assert (buf[:, :3] == 7).all() and (buf[:, 8:] == 7).all(), "wrote outside the slice"
    y = ops.forward(ops.BN(z.contiguous(memory_format=torch.channels_last), mean, invstd, w, b))
    assert y.is_contiguous(memory_format=torch.channels_last)


def test_cpu_out_slices_carry_autograd():
    """Two bn_silu outputs written into channel slices of one buffer: the buffer's gradient reaches both z."""
    za = make_z((2, 3, 4, 5), "nchw", torch.float32, seed=9).requires_grad_()
    zb = make_z((2, 4, 4, 5), "nchw", torch.float32, seed=10).requires_grad_()
    gy = torch.randn(2, 7, 4, 5)
    grads = []
    for fused in (True, False):
        za.grad = zb.grad = None
        f = ops.forward if fused else ops.reference
        buf = torch.empty(2, 7, 4, 5)
        for z, sl in ((za, slice(0, 3)), (zb, slice(3, 7))):
            m, i = ops.stats(z)
            w, b = params(z.shape[1])
            f(ops.BN(z, m, i, w, b), out=buf[:, sl])
        (buf * gy).sum().backward()
        grads.append((za.grad.clone(), zb.grad.clone()))
    close(grads[0][0], grads[1][0], 1e-5, "dz of slice a")
    close(grads[0][1], grads[1][1], 1e-5, "dz of slice b")


@pytest.mark.parametrize("dz_dtype", [torch.float32, torch.float16])
def test_cpu_dz_views_and_accumulate(dz_dtype):
    z = make_z((2, 6, 3, 5), "cl", dz_dtype, seed=11)
    mean, invstd = ops.stats(z)
    w, b = params(6)
    gy = torch.randn(z.shape).to(dz_dtype)
    want, want_dw, want_db = backward_reference(ops.BN(z, mean, invstd, w, b), gy)
    buf = torch.randn(2, 10, 3, 5).to(dz_dtype)
    before = buf.clone()
    dz, dw, db = ops.backward(ops.BN(z, mean, invstd, w, b), gy, dz=buf[:, 1:7])
    assert dz.data_ptr() == buf[:, 1:7].data_ptr()
    close(buf[:, 1:7], want, TOL[dz_dtype], "dz (=) into a view")
    assert torch.equal(buf[:, :1], before[:, :1]) and torch.equal(buf[:, 7:], before[:, 7:])
    close(dw, want_dw, TOL[dz_dtype], "dweight")
    close(db, want_db, TOL[dz_dtype], "dbias")
    buf2 = torch.randn(2, 6, 3, 5, dtype=torch.float32)
    start = buf2.clone()
    ops.backward(ops.BN(z, mean, invstd, w, b), gy, dz=buf2, accumulate=True)
    close(buf2, start + want.float(), TOL[dz_dtype], "dz (+=)")


def test_cpu_batch_stats_false_is_eval_backward():
    z = make_z((3, 4, 5, 5), "nchw", torch.float32, seed=12)
    mean = torch.tensor([0.5, -0.2, 1.0, 0.0])
    invstd = torch.tensor([1.5, 0.7, 1.1, 2.0])
    w, b = params(4)
    gy = torch.randn(z.shape)
    zd = z.double().requires_grad_()
    wd, bd = w.double().requires_grad_(), b.double().requires_grad_()
    yd = F.silu((zd - mean.double().view(1, -1, 1, 1)) * invstd.double().view(1, -1, 1, 1) * wd.view(1, -1, 1, 1)
                + bd.view(1, -1, 1, 1))
    (yd * gy.double()).sum().backward()
    for f in (ops.forward, ops.reference):
        zg, wg, bg = z.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
        y = f(ops.BN(zg, mean, invstd, wg, bg), batch_stats=False)
        (y * gy).sum().backward()
        close(y, yd, 1e-5, f"{f.__name__} y")
        close(zg.grad, zd.grad, 1e-5, f"{f.__name__} dz (eval)")
        close(wg.grad, wd.grad, 1e-5, f"{f.__name__} dweight (eval)")
        close(bg.grad, bd.grad, 1e-5, f"{f.__name__} dbias (eval)")
    dz, _, _ = ops.backward(ops.BN(z, mean, invstd, w, b), gy, batch_stats=False)
    close(dz, zd.grad, 1e-5, "raw dz (eval)")


def bn2_truth(z1, z2, p1, p2, gy):
    bns = []
    for (w, b) in (p1, p2):
        bn = torch.nn.BatchNorm2d(z1.shape[1], momentum=MOMENTUM, eps=EPS).double().train()
        with torch.no_grad():
            bn.weight.copy_(w.double().cpu())
            bn.bias.copy_(b.double().cpu())
        bns.append(bn)
    z1d = z1.detach().double().cpu().requires_grad_()
    z2d = z2.detach().double().cpu().requires_grad_()
    y = F.silu(bns[0](z1d) + bns[1](z2d))
    (y * gy.double().cpu()).sum().backward()
    return (y.detach(), z1d.grad, bns[0].weight.grad, bns[0].bias.grad, z2d.grad, bns[1].weight.grad,
            bns[1].bias.grad)


def grad_tol(dtype):
    """Backward with float16/bfloat16 storage: dy reaches the op rounded to the storage dtype too."""
    return TOL[dtype] if dtype == torch.float32 else 2 * TOL[dtype]


def check_bn2(z1, z2, device="cpu"):
    tol = TOL[z1.dtype]
    p1, p2 = params(z1.shape[1], device, 20), params(z1.shape[1], device, 21)
    gy = torch.randn(z1.shape, generator=torch.Generator().manual_seed(22)).to(device)
    y_t, dz1_t, dw1_t, db1_t, dz2_t, dw2_t, db2_t = bn2_truth(z1, z2, p1, p2, gy)
    m1, i1 = ops.stats(z1)
    m2, i2 = ops.stats(z2)
    leaves = [z1.detach().clone().requires_grad_(), p1[0].clone().requires_grad_(), p1[1].clone().requires_grad_(),
              z2.detach().clone().requires_grad_(), p2[0].clone().requires_grad_(), p2[1].clone().requires_grad_()]
    a1, w1, b1, a2, w2, b2 = leaves
    y = ops.forward(ops.BN(a1, m1, i1, w1, b1), ops.BN(a2, m2, i2, w2, b2))
    close(y, y_t, tol, "bn2 y")
    (y.float() * gy).sum().backward()
    for got, want, name in ((a1.grad, dz1_t, "dz1"), (w1.grad, dw1_t, "dw1"), (b1.grad, db1_t, "db1"),
                            (a2.grad, dz2_t, "dz2"), (w2.grad, dw2_t, "dw2"), (b2.grad, db2_t, "db2")):
        close(got, want, grad_tol(z1.dtype), f"bn2 {name} (autograd)")
    start1 = torch.randn(z1.shape, device=device)
    dz1 = start1.clone()
    raw = ops.backward(ops.BN(z1, m1, i1, *p1), gy.to(z1.dtype), ops.BN(z2, m2, i2, *p2), dz=dz1, accumulate=True)
    close(raw[0] - start1, dz1_t, 2 * tol, "bn2 dz1 (+=)")
    close(raw[3], dz2_t, 2 * tol, "bn2 dz2 (new)")
    close(raw[1], dw1_t, 2 * tol, "bn2 dw1 (raw)")
    close(raw[5], db2_t, 2 * tol, "bn2 db2 (raw)")


def test_cpu_bn2_silu():
    check_bn2(make_z((2, 7, 5, 6), "cl", torch.float32, seed=23), make_z((2, 7, 5, 6), "nchw", torch.float32, seed=24))


def check_add(z, residual, device="cpu"):
    tol = TOL[z.dtype]
    w, b = params(z.shape[1], device, 30)
    gy = torch.randn(z.shape, generator=torch.Generator().manual_seed(31)).to(device)
    truth = ground_truth(z, w, b, gy, "silu", residual=residual)
    mean, invstd = ops.stats(z)
    zg, rg = z.detach().clone().requires_grad_(), residual.detach().clone().requires_grad_()
    wg, bg = w.clone().requires_grad_(), b.clone().requires_grad_()
    y = ops.forward(ops.BN(zg, mean, invstd, wg, bg), residual=rg)
    close(y, truth["y"], tol, "add y")
    (y.float() * gy).sum().backward()
    close(zg.grad, truth["dz"], grad_tol(z.dtype), "add dz")
    close(wg.grad, truth["dw"], grad_tol(z.dtype), "add dw")
    close(rg.grad, gy, TOL[residual.dtype], "add d residual (= dy)")


def test_cpu_bn_silu_add():
    check_add(make_z((2, 5, 6, 3), "nchw", torch.float32, seed=32), make_z((2, 5, 6, 3), "cl", torch.float32, seed=33))


def test_function_matches_reference_autograd(monkeypatch):
    """forward()'s autograd gradients equal autograd through reference() (the YOLOV9C_FUSED=0 path)."""
    z = make_z((3, 6, 4, 5), "cl", torch.float32, seed=40)
    w, b = params(6)
    gy = torch.randn(z.shape)
    results = []
    for fused in ("1", "0"):
        monkeypatch.setenv("YOLOV9C_FUSED", fused)
        zg, wg, bg = z.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
        mean, invstd = ops.stats(zg)
        y = ops.forward(ops.BN(zg, mean, invstd, wg, bg))
        (y * gy).sum().backward()
        results.append((y.detach(), zg.grad, wg.grad, bg.grad))
    for k, name in enumerate(("y", "dz", "dw", "db")):
        close(results[0][k], results[1][k], 1e-5, f"Function vs reference {name}")


def test_fused_switch_routes_to_reference(monkeypatch):
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    monkeypatch.setattr(extension, "load", lambda: (_ for _ in ()).throw(AssertionError("C must not be used")))
    z = make_z((2, 3, 4, 4), "nchw", torch.float32)
    w, b = params(3)
    mean, invstd = ops.stats(z)
    ops.forward(ops.BN(z, mean, invstd, w, b))
    ops.backward(ops.BN(z, mean, invstd, w, b), torch.ones_like(z))
    ops.forward(ops.BN(z, mean, invstd, w, b), ops.BN(z, mean, invstd, w, b))
    ops.forward(ops.BN(z, mean, invstd, w, b), residual=z)


def test_function_saves_only_z_and_channel_vectors():
    z = make_z((2, 4, 3, 3), "nchw", torch.float32).requires_grad_()
    w, b = params(4)
    w.requires_grad_()
    mean, invstd = ops.stats(z)
    y = ops.forward(ops.BN(z, mean, invstd, w, b))
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 5
    assert {t.data_ptr() for t in saved} == {t.data_ptr() for t in (z, mean, invstd, w, b)}
    assert all(t.numel() in (z.numel(), 4) for t in saved)
    assert mean.grad_fn is None and not mean.requires_grad


def test_empty_batch():
    z = torch.zeros(0, 3, 4, 4)
    w, b = params(3)
    m, i = torch.zeros(3), torch.ones(3)
    assert ops.forward(ops.BN(z, m, i, w, b)).shape == z.shape
    dz, dw, db = ops.backward(ops.BN(z, m, i, w, b), z)
    assert dz.shape == z.shape and torch.equal(dw, torch.zeros(3)) and torch.equal(db, torch.zeros(3))


def bad_cases():
    z = torch.randn(2, 3, 4, 4)
    v = torch.ones(3)
    meta = torch.ones(3, device="meta")
    return [
        (lambda: ops.stats(torch.randn(2, 3, 4)), ValueError, "4 dimensions"),
        (lambda: ops.stats(z.double()), TypeError, "z must be float32, float16"),
        (lambda: ops.stats(torch.randn(1, 3, 1, 1)), ValueError, "more than 1 value"),
        (lambda: ops.stats(z, torch.ones(4)), ValueError, "running_mean"),
        (lambda: ops.stats(z, momentum=2.0), ValueError, "momentum"),
        (lambda: ops.forward(ops.BN(z, v, v, v, torch.ones(4))), ValueError, "bias"),
        (lambda: ops.forward(ops.BN(z, v.half(), v, v, v)), TypeError, "mean must be float32"),
        (lambda: ops.forward(ops.BN(z, v, v, meta, v)), ValueError, "weight is on meta"),
        (lambda: ops.forward(ops.BN(z, v, v, v, v), act="relu"), ValueError, "act"),
        (lambda: ops.forward(ops.BN(z, v, v, v, v), out=torch.empty(2, 3, 4, 5)), ValueError,
         "out must have the shape"),
        (lambda: ops.forward(ops.BN(z, v, v, v, v), out=torch.empty(2, 3, 4, 4, dtype=torch.int32)), TypeError, "out"),
        (lambda: ops.backward(ops.BN(z, v, v, v, v), torch.ones(2, 3, 4, 3)), ValueError, "grad_out"),
        (lambda: ops.backward(ops.BN(z, v, v, v, v), z, dz=z.half()), TypeError, "dz"),
        (lambda: ops.forward(ops.BN(z, v, v, v, v), ops.BN(torch.randn(2, 3, 4, 5), v, v, v, v)), ValueError, "z2"),
        (lambda: ops.forward(ops.BN(z, v, v, v, v), residual=torch.randn(2, 3, 3, 4)), ValueError, "residual"),
        (lambda: ops.forward(ops.BN(z.numpy(), v, v, v, v)), TypeError, "torch.Tensor"),
        (lambda: ops.forward(z), TypeError, "bn must be a BN"),
        (lambda: ops.backward((z, v, v, v), z), TypeError, "bn must be a BN"),
    ]


@pytest.mark.parametrize("case", range(len(bad_cases())))
def test_wrapper_rejects_bad_arguments(case):
    fn, exc, word = bad_cases()[case]
    with pytest.raises(exc, match=word):
        fn()


def test_raw_binding_checks():
    """The bindings check every argument themselves; a BN operand is one tuple (z, mean, invstd, weight, bias)."""
    z = torch.randn(2, 3, 4, 4).numpy()
    v = torch.ones(3).numpy()
    out = torch.empty(2, 3, 4, 4).numpy()
    bn = (z, v, v, v, v)
    fwd = C_EXT.bn_silu_forward
    fwd(bn, None, None, "silu", out, 0)
    with pytest.raises(TypeError, match="takes exactly 6"):
        fwd(bn, None, None, "silu", out)
    with pytest.raises(TypeError, match="bn_silu_forward: bn must be a tuple of 5"):
        fwd(bn[:4], None, None, "silu", out, 0)
    with pytest.raises(ValueError, match="bn_silu_forward: mean must have size 3"):
        fwd((z, torch.ones(4).numpy(), v, v, v), None, None, "silu", out, 0)
    with pytest.raises(ValueError, match="bn_silu_forward: mean2 must have size 3"):
        fwd(bn, (z, torch.ones(4).numpy(), v, v, v), None, "silu", out, 0)
    with pytest.raises(ValueError, match="z2 must have the shape of z1"):
        fwd(bn, (z[:, :, :3], v, v, v, v), None, "silu", out, 0)
    with pytest.raises(ValueError, match="act must be"):
        fwd(bn, None, None, "gelu", out, 0)
    with pytest.raises(ValueError, match="stream must be 0"):
        fwd(bn, None, None, "silu", out, 5)
    expanded = torch.empty(2, 3, 4, 1).expand(2, 3, 4, 4).numpy()
    with pytest.raises(ValueError, match="out is an output and has stride 0"):
        fwd(bn, None, None, "silu", expanded, 0)
    with pytest.raises(ValueError, match="out is an output and must be writeable"):
        ro = out.copy()
        ro.setflags(write=False)
        fwd(bn, None, None, "silu", ro, 0)
    with pytest.raises(ValueError, match="'silu' only"):
        fwd(bn, bn, None, "identity", out, 0)
    with pytest.raises(ValueError, match="bn_stats_forward: expected more than 1 value"):
        C_EXT.bn_stats_forward(torch.randn(1, 3, 1, 1).numpy(), None, None, 0.1, 1e-3, v.copy(), v.copy(), None, 0)
    bwd = C_EXT.bn_silu_backward
    grads = (np.empty_like(z), v.copy(), v.copy())
    bwd(bn, None, z, "silu", True, grads, None, False, None, 0)
    with pytest.raises(TypeError, match="bn_silu_backward: dz must be"):
        bwd(bn, None, z, "silu", True, (np.empty(z.shape, np.float16), v.copy(), v.copy()), None, False, None, 0)
    with pytest.raises(ValueError, match="grads2 must be None"):
        bwd(bn, None, z, "silu", True, grads, grads, False, None, 0)
    with pytest.raises(TypeError, match="grads1 must be a tuple"):
        bwd(bn, bn, z, "silu", True, None, grads, False, None, 0)
    assert C_EXT.bn_workspace_size((2, 3, 4, 4), False) == 0
    with pytest.raises(TypeError, match="bn_workspace_size: shape must be a tuple of 4"):
        C_EXT.bn_workspace_size((2, 3, 4), False)


# ----------------------------------------------------------------------------------------------- CUDA


CUDA_LAYOUTS = ["nchw", "cl", "slice", "cl_slice", "hw"]


@pytest.mark.cuda
@pytest.mark.parametrize("layout", CUDA_LAYOUTS)
@pytest.mark.parametrize("act", ["silu", "identity"])
@pytest.mark.parametrize("shape", [(2, 13, 7, 9), (1, 37, 5, 3), (4, 64, 20, 20), (3, 1, 9, 1)])
def test_cuda_float32(layout, act, shape):
    check_all(make_z(shape, layout, torch.float32, device="cuda", seed=50), act=act, device="cuda", seed=50)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["nchw", "cl", "cl_slice"])
def test_cuda_half_storage(dtype, layout):
    check_all(make_z((4, 40, 11, 13), layout, dtype, device="cuda", seed=51), device="cuda", seed=51)


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["nchw", "cl"])
def test_cuda_stats_large_mean_and_n(layout):
    z = make_z((64, 4, 160, 160), layout, torch.float32, device="cuda", seed=52, loc=10.0, scale=1.0)
    truth_var, truth_mean = torch.var_mean(z.double(), dim=(0, 2, 3), unbiased=False)
    rm, rv = torch.zeros(4, device="cuda"), torch.ones(4, device="cuda")
    mean, invstd = ops.stats(z, rm, rv, momentum=MOMENTUM, eps=EPS)
    per_channel_close(mean, truth_mean, 1e-5, "mean")
    per_channel_close(invstd, 1 / torch.sqrt(truth_var + EPS), 1e-5, "invstd")
    n = 64 * 160 * 160
    per_channel_close(rv, (1 - MOMENTUM) + MOMENTUM * truth_var * n / (n - 1), 1e-5, "running_var")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layout", ["nchw", "slice", "cl"])
@pytest.mark.parametrize("shape", [(3, 24, 8, 12), (2, 5, 32, 40), (2, 16, 64, 64)])
def test_cuda_vector_paths(dtype, layout, shape):
    """H·W a multiple of 8: the 16-byte planar kernels (NCHW, NCHW slices; planes shorter and longer than a
    block's tile) and the channels-last ones, every form: stats, forward, backward (=, +=), bn2, add."""
    check_all(make_z(shape, layout, dtype, device="cuda", seed=70), device="cuda", seed=70)
    z2 = make_z(shape, layout, dtype, device="cuda", seed=71)
    check_bn2(make_z(shape, layout, dtype, device="cuda", seed=72), z2, device="cuda")
    check_add(make_z(shape, layout, dtype, device="cuda", seed=73), z2, device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["nchw", "slice"])
@pytest.mark.parametrize("shape", [(2, 6, 3, 4), (3, 5, 2, 3), (2, 7, 5, 3), (300, 3, 2, 4), (2, 1500, 2, 2),
                                   (64, 8, 40, 40), (1, 2, 1, 20000)])
def test_cuda_planar_shapes(dtype, layout, shape):
    """The planar kernels' branches: H·W = 12, 6, 15 (8-, 4-, 2-byte vectors: V = 4, 2, 1 in fp16), many images
    of tiny planes, more channels than reduction blocks (a block adds several whole channels), 40x40 planes
    (channels split over blocks, ranges crossing channel boundaries), one long plane per channel (B == 1)."""
    check_all(make_z(shape, layout, dtype, device="cuda", seed=80), device="cuda", seed=80)
    z2 = make_z(shape, layout, dtype, device="cuda", seed=81)
    check_bn2(make_z(shape, layout, dtype, device="cuda", seed=82), z2, device="cuda")
    check_add(make_z(shape, layout, dtype, device="cuda", seed=83), z2, device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(64, 32, 40, 40), (2, 1500, 2, 2)])
def test_cuda_planar_reductions_repeat_bit_for_bit(shape):
    """The planar reductions add in a fixed order: the same inputs give the same bits, call after call."""
    z = make_z(shape, "nchw", torch.float16, device="cuda", seed=84)
    w, b = params(shape[1], "cuda")
    gy = torch.randn(z.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(85)).half()
    first = [*ops.stats(z)]
    first += ops.backward(ops.BN(z, first[0], first[1], w, b), gy)
    for _ in range(2):
        again = [*ops.stats(z)]
        again += ops.backward(ops.BN(z, again[0], again[1], w, b), gy)
        for x, y, name in zip(first, again, ("mean", "invstd", "dz", "dw", "db")):
            assert torch.equal(x, y), name


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["cl", "nchw"])
def test_cuda_graph_replays_statistics_and_backward_bit_for_bit(layout):
    """Captured in a CUDA graph, the statistics, forward and backward (fast kernels for channels-last, planar
    for NCHW), each consuming the previous one's output, give the eager calls' bits on every replay."""
    shape = (16, 64, 20, 20)
    z = make_z(shape, layout, torch.float16, device="cuda", seed=95)
    gy = make_z(shape, layout, torch.float16, device="cuda", seed=96)
    w, b = params(shape[1], "cuda")

    def run():
        mean, invstd = ops.stats(z)
        y = ops.forward(ops.BN(z, mean, invstd, w, b))
        return [mean, invstd, y, *ops.backward(ops.BN(y, mean, invstd, w, b), gy)]

    eager = run()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    for _ in range(3):
        for t in captured:
            t.zero_()
        graph.replay()
        torch.cuda.synchronize()
        for x, y, name in zip(eager, captured, ("mean", "invstd", "y", "dz", "dweight", "dbias")):
            assert torch.equal(x, y), name


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["cl", "nchw"])
@pytest.mark.parametrize("shape", [(64, 5, 48, 48), (64, 1, 64, 64), (3, 4099, 4, 4), (2, 3, 3, 3)])
def test_cuda_finish_channel_tails_and_splits(layout, shape):
    """The finish kernels (blocks of 4 channels x 64 lanes over the S partials per channel): C not a multiple
    of 4 (5, 1, 4099, 3: the last block partly empty), S from 1 (n = 18, 48) to a full wave (n = 147456 and
    262144: 528 partials on an H200, lanes with 8 or 9 of them); statistics, backward with 2 sums and with 3
    (bn2); the same bits on a second call."""
    z = make_z(shape, layout, torch.float32, device="cuda", seed=90)
    check_all(z, device="cuda", seed=90)
    check_bn2(make_z(shape, layout, torch.float32, device="cuda", seed=91),
              make_z(shape, layout, torch.float32, device="cuda", seed=92), device="cuda")
    w, b = params(shape[1], "cuda")
    gy = torch.randn(z.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(93))
    first = [*ops.stats(z)]
    first += ops.backward(ops.BN(z, first[0], first[1], w, b), gy)
    again = [*ops.stats(z)]
    again += ops.backward(ops.BN(z, again[0], again[1], w, b), gy)
    for x, y, name in zip(first, again, ("mean", "invstd", "dz", "dw", "db")):
        assert torch.equal(x, y), name


@pytest.mark.cuda
def test_cuda_views_accumulate_bn2_add():
    z = make_z((2, 35, 6, 7), "cl", torch.float32, device="cuda", seed=53)
    mean, invstd = ops.stats(z)
    w, b = params(35, "cuda")
    gy = torch.randn(z.shape, device="cuda")
    want = ops.reference(ops.BN(z, mean, invstd, w, b))
    buf = torch.full((2, 40, 6, 7), 3.0, device="cuda", dtype=torch.float16)
    ops.forward(ops.BN(z, mean, invstd, w, b), out=buf[:, 4:39])
    close(buf[:, 4:39], want, TOL[torch.float16], "cuda out view fp16")
    assert (buf[:, :4] == 3).all() and (buf[:, 39:] == 3).all()
    want_dz, _, _ = backward_reference(ops.BN(z, mean, invstd, w, b), gy)
    dzbuf = torch.randn(2, 40, 6, 7, device="cuda")
    start = dzbuf.clone()
    ops.backward(ops.BN(z, mean, invstd, w, b), gy, dz=dzbuf[:, 2:37], accumulate=True)
    close(dzbuf[:, 2:37] - start[:, 2:37], want_dz, 1e-5, "cuda dz (+=) view")
    assert torch.equal(dzbuf[:, :2], start[:, :2]) and torch.equal(dzbuf[:, 37:], start[:, 37:])
    check_bn2(make_z((2, 33, 5, 6), "cl", torch.float32, "cuda", 54), make_z((2, 33, 5, 6), "nchw", torch.float32,
                                                                              "cuda", 55), device="cuda")
    check_add(make_z((2, 9, 6, 3), "nchw", torch.float16, "cuda", 56), make_z((2, 9, 6, 3), "cl", torch.float16,
                                                                              "cuda", 57), device="cuda")


@pytest.mark.cuda
def test_cuda_matches_cpu_implementation():
    for layout in ("nchw", "cl"):
        z = make_z((3, 21, 9, 10), layout, torch.float16, seed=58)
        w, b = params(21)
        gy = torch.randn(z.shape).half()
        cpu = [ops.stats(z)]
        cpu.append(ops.forward(ops.BN(z, *cpu[0], w, b)))
        cpu.append(ops.backward(ops.BN(z, *cpu[0], w, b), gy))
        zc, wc, bc, gc = z.cuda(), w.cuda(), b.cuda(), gy.cuda()
        st = ops.stats(zc)
        per_channel_close(st[0], cpu[0][0], 1e-5, "mean cpu vs cuda")
        per_channel_close(st[1], cpu[0][1], 1e-5, "invstd cpu vs cuda")
        close(ops.forward(ops.BN(zc, *st, wc, bc)), cpu[1], TOL[torch.float16], "y cpu vs cuda")
        g = ops.backward(ops.BN(zc, *st, wc, bc), gc)
        for k, name in enumerate(("dz", "dw", "db")):
            close(g[k], cpu[2][k], TOL[torch.float16], f"{name} cpu vs cuda")


@pytest.mark.cuda
def test_cuda_non_default_stream():
    stream = torch.cuda.Stream()
    z0 = make_z((8, 32, 40, 40), "cl", torch.float16, "cuda", 60)
    w, b = params(32, "cuda")
    gy0 = torch.randn(z0.shape, device="cuda").half()
    mean_d, inv_d = ops.stats(z0)
    y_d = ops.forward(ops.BN(z0, mean_d, inv_d, w, b))
    dz_d = ops.backward(ops.BN(z0, mean_d, inv_d, w, b), gy0)[0]
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        z = z0 * 1.0      # produced on the side stream: the ops must wait for it on that stream
        gy = gy0 * 1.0
        mean, inv = ops.stats(z)
        y = ops.forward(ops.BN(z, mean, inv, w, b))
        dz = ops.backward(ops.BN(z, mean, inv, w, b), gy)[0]
    stream.synchronize()
    assert torch.equal(mean, mean_d) and torch.equal(inv, inv_d)
    assert torch.equal(y, y_d) and torch.equal(dz, dz_d)


@pytest.mark.cuda
def test_cuda_bad_arguments():
    z = torch.randn(2, 3, 4, 4, device="cuda")
    v = torch.ones(3, device="cuda")
    with pytest.raises(ValueError, match="mean is on cpu"):
        ops.forward(ops.BN(z, torch.ones(3), v, v, v))
    with pytest.raises(ValueError, match="out is on cpu"):
        ops.forward(ops.BN(z, v, v, v, v), out=torch.empty(2, 3, 4, 4))
    ws = torch.empty(8, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="bn_stats_forward: workspace has 8 bytes"):
        C_EXT.bn_stats_forward(z, None, None, 0.1, 1e-3, v.clone(), v.clone(), ws,
                               torch.cuda.current_stream().cuda_stream)
    with pytest.raises(ValueError, match="weight is on cpu"):
        ops.backward(ops.BN(z, v, v, torch.ones(3), v), z)


@pytest.mark.cuda
def test_cuda_saved_memory_is_z_only():
    z = torch.randn(16, 64, 80, 80, device="cuda", dtype=torch.float16).requires_grad_()
    w, b = params(64, "cuda")
    mean, invstd = ops.stats(z)
    torch.cuda.synchronize()
    # Free cached blocks left by earlier tests: a cached block just over y's size would be handed out whole
    # (the allocator splits a large block only when more than 1 MiB is left) and counted as allocated.
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    y = ops.forward(ops.BN(z, mean, invstd, w, b))
    after = torch.cuda.memory_allocated()
    # Only y itself was allocated (rounded to the allocator's 512-byte blocks); nothing else is kept.
    assert after - before <= y.numel() * y.element_size() + 512
    del y
    assert torch.cuda.memory_allocated() == before   # and nothing outlives it
    y = ops.forward(ops.BN(z, mean, invstd, w, b))
    y.float().sum().backward()
    assert z.grad is not None


@pytest.mark.cuda
def test_cuda_over_2_31_elements():
    """(1, 2, 46341, 23171) float16: 2 147 534 622 elements, 4.3 GB; offsets past 2^31 must be right."""
    shape = (1, 2, 46341, 23171)
    z = torch.empty(shape, dtype=torch.float16, device="cuda")
    z[:, 0].normal_(3.0, 1.0)
    z[:, 1].normal_(-1.0, 2.0)
    mean, invstd = ops.stats(z, eps=EPS)
    zf = z.view(2, -1)
    ref_mean = torch.stack([zf[c].double().mean() for c in range(2)])
    ref_var = torch.stack([(zf[c].double() - ref_mean[c]).square().mean() for c in range(2)])
    per_channel_close(mean, ref_mean, 1e-5, "huge mean")
    per_channel_close(invstd, 1 / torch.sqrt(ref_var + EPS), 1e-5, "huge invstd")
    w = torch.tensor([1.5, 0.5], device="cuda")
    b = torch.tensor([0.1, -0.2], device="cuda")
    y = ops.forward(ops.BN(z, mean, invstd, w, b))
    idx = torch.cat([torch.arange(0, 1000, device="cuda"), torch.arange(zf.shape[1] - 1000, zf.shape[1], device="cuda"),
                     torch.randint(0, zf.shape[1], (10000,), device="cuda")])
    for c in range(2):
        u = (zf[c, idx].float() - mean[c]) * invstd[c] * w[c] + b[c]
        close(y.view(2, -1)[c, idx], F.silu(u), TOL[torch.float16], f"huge y channel {c}")
    del y
    gy = z     # any gradient will do; reuse z's memory
    dz, dw, db = ops.backward(ops.BN(z, mean, invstd, w, b), gy)
    for c in range(2):
        sg = sgx = 0.0
        for chunk in zf[c].split(1 << 28):
            x = chunk.double()
            xh = (x - mean[c].double()) * invstd[c].double()
            u = xh * w[c].double() + b[c].double()
            s = torch.sigmoid(u)
            g = x * s * (1 + u * (1 - s))
            sg += g.sum().item()
            sgx += (g * xh).sum().item()
        assert abs(db[c].item() - sg) <= 1e-4 * abs(sg) + 1e-3 * (zf.shape[1] ** 0.5), ("db", c, db[c].item(), sg)
        assert abs(dw[c].item() - sgx) <= 1e-4 * abs(sgx) + 1e-3 * (zf.shape[1] ** 0.5), ("dw", c, dw[c].item(), sgx)
        n = zf.shape[1]
        x = zf[c, idx].double()
        xh = (x - mean[c].double()) * invstd[c].double()
        u = xh * w[c].double() + b[c].double()
        s = torch.sigmoid(u)
        g = x * s * (1 + u * (1 - s))
        want = w[c].double() * invstd[c].double() * (g - sg / n - xh * sgx / n)
        close(dz.view(2, -1)[c, idx], want, TOL[torch.float16], f"huge dz channel {c}")
