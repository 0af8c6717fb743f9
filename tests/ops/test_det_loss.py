"""Tests of the detection-loss op: yolov9c.ops.det_loss (C CPU and CUDA through yolov9c._C) against
det_loss_reference (the published loss terms from stock torch ops, autograd for the gradients).

Tolerances (|got − want| <= atol + rtol·|want|, atol = a fraction of the largest |want|; a failure prints the
largest difference and the share of the tolerance it uses):
  * C CPU (float64 arithmetic) vs reference on float64 maps: rtol 1e-10 (both are float64 throughout).
  * float32 maps, CPU and CUDA: loss rtol 1e-5, gradients rtol 1e-5 + atol 1e-5·max (the issue's bound).
  * float16 maps: 2e-3 against the float32 reference of the same (fp16-representable) values; bfloat16: 1e-2.
Inputs: random logits, about a third of the anchors foreground with random soft scores, target boxes around
the anchors, some far enough that the DFL clamp (reg_max − 1.01) and the 0 floor act; odd grids, B = 1,
NC not a multiple of 8, reg_max 16 and 7, one and three levels, channels-last and channel-sliced maps.
CPU cases always run (a few seconds); CUDA cases skip without a GPU.
Run: python -m pytest -q tests/ops/test_det_loss.py
"""

import pytest
import torch

from yolov9c.ops import extension
from yolov9c.ops.det_loss import (
    det_loss,
    det_loss_decode,
    det_loss_decode_reference,
    det_loss_reference,
)

C = extension.load()
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

STRIDES = [8.0, 16.0, 32.0]


# ----------------------------------------------------------------------------------------------- inputs


def scene(B=2, nc=5, reg_max=16, shapes=((9, 7), (5, 4), (3, 2)), dtype=torch.float64, seed=0, fg_frac=0.35,
          layout="contiguous", scale=2.0, device="cpu"):
    """(maps, strides, targets dict) for one branch. layout: contiguous / channels_last / sliced."""
    g = torch.Generator().manual_seed(seed)
    C_ = 4 * reg_max + nc
    maps = []
    for h, w in shapes:
        if layout == "sliced":   # a channel slice of a wider tensor: non-contiguous channel and batch strides
            m = (torch.randn(B, C_ + 3, h, w, generator=g, dtype=torch.float64) * scale)[:, 2:2 + C_]
        else:
            m = torch.randn(B, C_, h, w, generator=g, dtype=torch.float64) * scale
        maps.append(m)
    strides = STRIDES[:len(shapes)]
    A = sum(h * w for h, w in shapes)
    # anchor centres in pixels
    pts = []
    for (h, w), s in zip(shapes, strides):
        gy, gx = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
        pts.append(torch.stack((gx, gy), -1).view(-1, 2).double() * s)
    stride_col = torch.cat([torch.full((h * w,), s, dtype=torch.float64) for (h, w), s in zip(shapes, strides)])
    pts = torch.cat(pts)
    centre = pts[None] + torch.randn(B, A, 2, generator=g, dtype=torch.float64) * stride_col[None, :, None] * 1.5
    wh = torch.rand(B, A, 2, generator=g, dtype=torch.float64) * stride_col[None, :, None] * 34 + 1
    boxes = torch.cat((centre - wh / 2, centre + wh / 2), -1).float()
    fg = torch.rand(B, A, generator=g) < fg_frac
    targets = {"target_labels": torch.randint(0, nc, (B, A), generator=g), "target_boxes": boxes,
               "target_norm": torch.where(fg, torch.rand(B, A, generator=g), 0.0).float(), "fg_mask": fg}
    targets["target_scores_sum"] = targets["target_norm"].sum().clamp(min=1)
    maps = [m.to(dtype) for m in maps]
    if layout == "channels_last":
        maps = [m.contiguous(memory_format=torch.channels_last) for m in maps]
    maps = [m.to(device) for m in maps]
    targets = {k: v.to(device) for k, v in targets.items()}
    return maps, strides, targets


def leaf(maps):
    return [m.detach().clone().requires_grad_(True) for m in maps]


def run(fn, maps, strides, targets, weights=(0.7, 1.3, -0.4), **kw):
    """out (3,) and the map gradients of Σ out·weights."""
    ms = leaf(maps)
    out = fn(ms, strides, **targets, **kw)
    (out * torch.tensor(weights, dtype=out.dtype, device=out.device)).sum().backward()
    return out.detach(), [m.grad for m in ms]


def assert_close(got, want, rtol, atol_frac=0.0, what=""):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    atol = atol_frac * float(want.abs().max()) if want.numel() else 0.0
    tol = atol + rtol * want.abs()
    diff = (got - want).abs()
    share = float((diff / tol).max()) if diff.numel() else 0.0
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    assert share <= 1.0, f"{what}: largest diff {float(diff.max()):.3g} uses {100 * share:.0f}% of the tolerance"


# ------------------------------------------------------------------------------------------- CPU: exact


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "sliced"])
@pytest.mark.parametrize("eps,pw", [(0.0, 1.0), (0.1, 2.5)])
def test_cpu_float64_equals_reference(layout, eps, pw):
    maps, strides, t = scene(layout=layout, seed=1)
    got, ggot = run(det_loss, maps, strides, t, label_smoothing=eps, pos_weight=pw)
    want, gwant = run(det_loss_reference, maps, strides, t, label_smoothing=eps, pos_weight=pw)
    assert got.dtype == torch.float64
    assert_close(got, want, 1e-10, what="loss")
    for k, (a, b) in enumerate(zip(ggot, gwant)):
        assert a.dtype == torch.float64 and a.stride() == maps[k].stride() or layout == "sliced"
        assert_close(a, b, 1e-10, 1e-12, what=f"grad level {k}")


@pytest.mark.parametrize("B,nc,reg_max,shapes", [(1, 3, 16, ((5, 3),)), (3, 11, 7, ((4, 6), (2, 3))),
                                                 (2, 1, 2, ((3, 3), (2, 2), (1, 1)))])
def test_cpu_odd_shapes(B, nc, reg_max, shapes):
    maps, strides, t = scene(B=B, nc=nc, reg_max=reg_max, shapes=shapes, seed=2)
    got, ggot = run(det_loss, maps, strides, t, reg_max=reg_max)
    want, gwant = run(det_loss_reference, maps, strides, t, reg_max=reg_max)
    assert_close(got, want, 1e-10, what="loss")
    for a, b in zip(ggot, gwant):
        assert_close(a, b, 1e-10, 1e-12, what="grad")


def test_cpu_terms_are_not_trivial():
    """The inputs exercise every term: foreground CIoU, both DFL clamps, soft class targets."""
    maps, strides, t = scene(seed=3)
    out, grads = run(det_loss, maps, strides, t)
    assert (out > 0).all()
    # DFL targets beyond the clamp on both sides exist in this scene
    from yolov9c.geometry import make_anchors

    pts, sc = make_anchors(maps, strides, 0.5)
    tb = t["target_boxes"].double() / sc
    ltrb = torch.cat((pts - tb[..., :2], tb[..., 2:] - pts), -1)[t["fg_mask"]]
    assert (ltrb < 0).any() and (ltrb > 14.99).any()
    # background anchors get no DFL gradient, foreground ones do
    B = maps[0].shape[0]
    g = torch.cat([x.reshape(B, x.shape[1], -1) for x in grads], 2)[:, :64]  # (B, 64, A)
    assert (g.permute(0, 2, 1)[~t["fg_mask"]] == 0).all() and (g.permute(0, 2, 1)[t["fg_mask"]] != 0).any()


def test_cpu_no_foreground():
    maps, strides, t = scene(fg_frac=0.0, seed=4)
    t["target_scores_sum"] = torch.tensor(1.0)
    out, grads = run(det_loss, maps, strides, t, weights=(1.0, 1.0, 1.0))
    assert out[0] == 0 and out[2] == 0
    x = torch.cat([m[:, 64:].flatten() for m in maps])
    assert torch.allclose(out[1], torch.nn.functional.softplus(x).sum(), rtol=1e-12)
    assert all((g[:, :64] == 0).all() for g in grads)


# -------------------------------------------------------------------------------- CPU: float32 / 16 / bf16


def test_cpu_float32_within_1e5():
    maps, strides, t = scene(dtype=torch.float32, seed=5)
    got, ggot = run(det_loss, maps, strides, t, label_smoothing=0.05)
    want, gwant = run(det_loss_reference, maps, strides, t, label_smoothing=0.05)
    assert got.dtype == torch.float32
    assert_close(got, want, 1e-5, what="loss")
    for a, b in zip(ggot, gwant):
        assert a.dtype == torch.float32
        assert_close(a, b, 1e-5, 1e-5, what="grad")


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_cpu_half_maps(dtype, tol):
    maps, strides, t = scene(dtype=dtype, seed=6)
    got, ggot = run(det_loss, maps, strides, t)
    want, gwant = run(det_loss_reference, [m.float() for m in maps], strides, t)
    assert got.dtype == torch.float32
    assert_close(got, want, tol, what="loss")
    for a, b in zip(ggot, gwant):
        assert a.dtype == dtype
        assert_close(a, b, tol, tol, what="grad")


def test_cpu_float16_gradients_are_rounded_float32_gradients():
    """The float16 gradient is the float32-computed gradient of the same values, rounded to nearest."""
    maps, strides, t = scene(dtype=torch.float16, seed=7)
    _, g16 = run(det_loss, maps, strides, t)
    _, g64 = run(det_loss, [m.double() for m in maps], strides, t)
    for a, b in zip(g16, g64):
        # double -> float -> half may differ from double -> half by one half ulp at most
        ulp = torch.finfo(torch.float16).eps * b.abs().clamp(min=2 ** -14)
        assert ((a.double() - b).abs() <= ulp).all()


def test_decode_cpu():
    maps, strides, _ = scene(seed=8)
    assert torch.equal(det_loss_decode(maps, strides), det_loss_decode_reference(maps, strides))
    maps32 = [m.float() for m in maps]
    assert_close(det_loss_decode(maps32, strides), det_loss_decode_reference(maps32, strides), 1e-6, 1e-6,
                 what="decode float32")


def test_fused_off_uses_the_reference(monkeypatch):
    maps, strides, t = scene(seed=9)
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    out = det_loss(leaf(maps), strides, **t)
    assert out.grad_fn is not None and "DetLoss" not in type(out.grad_fn).__name__
    assert_close(out, det_loss_reference(maps, strides, **t), 1e-12, what="loss")


# ------------------------------------------------------------------------------- memory contract (CPU)


def test_saved_for_backward_is_maps_and_anchor_targets():
    """Nothing (B, A, C)-sized is saved except the maps themselves (the same storage, no copy)."""
    maps, strides, t = scene(dtype=torch.float32, seed=10)
    ms = leaf(maps)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x):
        out = det_loss(ms, strides, **t)
    B, A = t["fg_mask"].shape
    map_ptrs = {m.data_ptr() for m in ms}
    for x in saved:
        assert x.data_ptr() in map_ptrs or x.numel() <= B * A * 4, tuple(x.shape)
    assert sum(x.data_ptr() in map_ptrs for x in saved) == len(ms)
    out.sum().backward()


# ------------------------------------------------------------------------------------------ bad arguments


def test_bad_arguments_raise():
    maps, strides, t = scene(seed=11)
    with pytest.raises(ValueError, match="strides"):
        det_loss(maps, strides[:2], **t)
    with pytest.raises(ValueError, match="channels"):
        det_loss([m[:, :60] for m in maps], strides, **t)
    with pytest.raises(ValueError, match="target_boxes"):
        det_loss(maps, strides, **{**t, "target_boxes": t["target_boxes"][:, :-1]})
    with pytest.raises(TypeError, match="fg_mask"):
        det_loss(maps, strides, **{**t, "fg_mask": t["fg_mask"].float()})
    with pytest.raises(ValueError, match="reg_max"):
        det_loss(maps, strides, **t, reg_max=65)
    with pytest.raises(ValueError, match="4 dimensions"):
        det_loss_decode([maps[0][0]] + list(maps[1:]), strides)
    with pytest.raises(TypeError, match="strides"):
        det_loss_decode(maps, [strides[0], True, strides[2]])
    bad = t["target_labels"].clone()
    bad[t["fg_mask"]] = 5  # nc = 5: out of range on foreground anchors
    with pytest.raises(ValueError, match="outside"):
        det_loss(maps, strides, **{**t, "target_labels": bad})
    bad[~t["fg_mask"]] = -7  # background labels are never read
    bad[t["fg_mask"]] = 0
    det_loss(maps, strides, **{**t, "target_labels": bad})


def test_raw_binding_checks():
    maps, strides, t = scene(seed=12)
    tss = t["target_scores_sum"].reshape(1).float()
    ws, out = torch.empty(0, dtype=torch.uint8), torch.empty(3, dtype=torch.float64)
    targets = (t["target_labels"], t["target_boxes"], t["target_norm"], t["fg_mask"], tss)
    args = [tuple(maps), tuple(strides), 16, targets, 0.0, 1.0, 14.99, ws, out, 0]
    C.det_loss_forward(*args)
    assert torch.isfinite(out).all()
    with pytest.raises(TypeError, match="takes exactly 10"):
        C.det_loss_forward(*args[:-1])

    def with_target(k, v):
        return targets[:k] + (v,) + targets[k + 1:]

    for k, v, err, msg in [(1, (8.0, 16.0), ValueError, "strides"), (1, (8.0, -16.0, 32.0), ValueError, "positive"),
                           (2, 1, ValueError, "reg_max"), (4, -0.1, ValueError, "label_smoothing"),
                           (5, 0.0, ValueError, "pos_weight"), (6, 15.0, ValueError, "max_dist"),
                           (6, float("nan"), ValueError, "max_dist"), (9, 5, ValueError, "stream"),
                           (3, with_target(4, torch.zeros(1)), ValueError, "target_scores_sum"),
                           (3, with_target(0, t["target_labels"].float()), TypeError, "target_labels"),
                           (3, targets[:4], TypeError, "targets must be a tuple of 5"),
                           (8, torch.empty(2, dtype=torch.float64), ValueError, "out"),
                           (0, (), ValueError, "maps"), (0, maps[0].numpy(), TypeError, "maps")]:
        bad = list(args)
        bad[k] = v
        with pytest.raises(err, match=msg):
            C.det_loss_forward(*bad)
    grads = tuple(torch.empty_like(m) for m in maps)
    bargs = args[:7] + [torch.ones(3, dtype=torch.float64), grads, 0]
    C.det_loss_backward(*bargs)
    bad = list(bargs)
    bad[8] = grads[:2]
    with pytest.raises(ValueError, match="grads"):
        C.det_loss_backward(*bad)
    bad[8] = tuple(torch.empty(2, 69, 3, 3, dtype=torch.float64) for _ in maps)
    with pytest.raises(ValueError, match="grads"):
        C.det_loss_backward(*bad)
    with pytest.raises(ValueError, match="boxes"):
        C.det_loss_decode(args[0], args[1], 16, torch.empty(2, 5, 4), 0)


# --------------------------------------------------------------------------------------------------- CUDA


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "sliced"])
def test_cuda_float32_within_1e5(layout):
    maps, strides, t = scene(B=3, dtype=torch.float32, seed=20, layout=layout, device="cuda",
                             shapes=((40, 40), (20, 20), (10, 10)))
    got, ggot = run(det_loss, maps, strides, t, label_smoothing=0.1, pos_weight=1.5)
    want, gwant = run(det_loss_reference, maps, strides, t, label_smoothing=0.1, pos_weight=1.5)
    assert got.is_cuda and got.dtype == torch.float32
    assert_close(got, want, 1e-5, what="loss")
    for a, b in zip(ggot, gwant):
        assert a.dtype == torch.float32 and a.is_cuda
        assert_close(a, b, 1e-5, 1e-5, what="grad")
    # the C CPU implementation (float64 arithmetic) agrees as well
    cpu, gcpu = run(det_loss, [m.cpu() for m in maps], strides, {k: v.cpu() for k, v in t.items()},
                    label_smoothing=0.1, pos_weight=1.5)
    assert_close(got, cpu, 1e-5, what="loss vs CPU")
    for a, b in zip(ggot, gcpu):
        assert_close(a, b, 1e-5, 1e-5, what="grad vs CPU")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_cuda_half_maps(dtype, tol):
    maps, strides, t = scene(B=4, dtype=dtype, seed=21, device="cuda", shapes=((32, 32), (16, 16), (8, 8)))
    got, ggot = run(det_loss, maps, strides, t)
    want, gwant = run(det_loss_reference, [m.float() for m in maps], strides, t)
    assert_close(got, want, tol, what="loss")
    for a, b in zip(ggot, gwant):
        assert a.dtype == dtype
        assert_close(a, b, tol, tol, what="grad")


@pytest.mark.cuda
@cuda
def test_cuda_deterministic_and_decode():
    maps, strides, t = scene(B=8, dtype=torch.float16, seed=22, device="cuda", shapes=((80, 80), (40, 40), (20, 20)))
    o1, g1 = run(det_loss, maps, strides, t)
    o2, g2 = run(det_loss, maps, strides, t)
    assert torch.equal(o1, o2) and all(torch.equal(a, b) for a, b in zip(g1, g2))
    m32 = [m.float() for m in maps]
    assert_close(det_loss_decode(maps, strides), det_loss_decode_reference(m32, strides), 1e-5, 1e-6,
                 what="decode")


@pytest.mark.cuda
@cuda
def test_cuda_bad_label_gives_nan_and_float64_uses_reference():
    maps, strides, t = scene(dtype=torch.float32, seed=23, device="cuda")
    bad = t["target_labels"].clone()
    bad[t["fg_mask"]] = 99
    out = det_loss(maps, strides, **{**t, "target_labels": bad})
    assert torch.isnan(out).all()
    maps64, _, _ = scene(dtype=torch.float64, seed=23, device="cuda")
    out = det_loss(leaf(maps64), strides, **t)
    assert "DetLoss" not in type(out.grad_fn).__name__


@pytest.mark.cuda
@cuda
def test_cuda_memory_contract():
    """Forward + backward at B=16, 640, nc 80: the op allocates the gradients, the (3,) output and a
    workspace of a few KiB; nothing (B, A, NC)-sized."""
    maps, strides, t = scene(B=16, nc=80, dtype=torch.float16, seed=24, device="cuda",
                             shapes=((80, 80), (40, 40), (20, 20)))
    ms = leaf(maps)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = det_loss(ms, strides, **t)
    fwd_peak = torch.cuda.max_memory_allocated() - base
    assert fwd_peak < 1 << 20, f"forward allocated {fwd_peak} bytes"
    out.sum().backward()
    grads = sum(m.grad.numel() * m.grad.element_size() for m in ms)
    bwd_peak = torch.cuda.max_memory_allocated() - base
    assert bwd_peak < grads + (1 << 20), f"backward peak {bwd_peak} bytes, gradients {grads}"
