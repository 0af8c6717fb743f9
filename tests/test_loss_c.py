"""Tests of the c loss path: make_loss(model, backend="c") = DetectionLoss(..., backend="c")
(det_loss_decode + tal_assign + det_loss per branch) against the torch reference loss.

Run: python -m pytest -q tests/test_loss_c.py        (CPU, about 10 s; CUDA cases skip without a GPU)

Tolerances:
  * golden stored maps (float64): loss items within 2.5e-7 of the published goldens, as the reference
    (tests/test_loss.py; the c path keeps target_norm in float64 for float64 scores, measured ≤ 5e-8 from
    the reference), and map gradients within 1e-6 of the reference's (relative to the largest).
  * float32 maps: loss and gradients within 1e-5 relative (gradients: + 1e-5 of the largest).
  * float16 maps: 2e-3 against the float32 reference of the same values (measured ≤ 5e-5 on the goldens).
  * dense image (5000 boxes in one image): every box reaches the assigner, and the c loss equals the
    reference (float32) within 1e-5; finite gradients.
The model-level goldens through the c loss are in tests/test_goldens_loss.py.
"""

import pytest
import torch
import torch.nn.functional as F
from golden_weights import CONFIGS
from golden_weights import GOLDEN_TARGETS as TARGETS
from test_loss import GOLDEN_RTOL, golden_maps, loss_for, rel_err

from yolov9c.loss.detection import DetectionLoss
from yolov9c.ops import tal_assign as tal_assign_op
from yolov9c.resources import DEFAULT_HYP as HYP


def c_loss_for(cfg, hyp=None):
    return DetectionLoss(80, 16, [8, 16, 32], hyp if hyp is not None else HYP, backend="c",
                         dual=cfg.startswith("yolov9"))


def maps_of(preds):
    """The flat list of maps of preds ([aux, main] lists or one list)."""
    return [m for b in preds for m in (b if isinstance(b, (list, tuple)) else [b])]


def convert(preds, fn):
    if isinstance(preds[0], (list, tuple)):
        return [[fn(m) for m in b] for b in preds]
    return [fn(m) for m in preds]


def leaf(preds, dtype=None):
    return convert(preds, lambda m: (m.to(dtype) if dtype else m).detach().clone().requires_grad_(True))


def assert_grads_close(got, want, rtol, atol_frac):
    for a, b in zip(maps_of(got), maps_of(want)):
        a, b = a.grad.double(), b.grad.double()
        tol = atol_frac * float(b.abs().max()) + rtol * b.abs()
        share = float(((a - b).abs() / tol).max())
        assert share <= 1.0, f"gradient: largest diff {float((a - b).abs().max()):.3g} is {100 * share:.0f}% of tol"


@pytest.mark.parametrize("cfg", CONFIGS)
def test_golden_stored_maps_through_the_c_loss(cfg):
    preds, z = golden_maps(cfg)
    total, items = c_loss_for(cfg)(preds, TARGETS)
    assert total.shape == (1,) and items.shape == (3,) and total.dtype == torch.float64
    err = rel_err(items.numpy(), z["loss_items"])
    assert err.max() < GOLDEN_RTOL, f"{cfg}: items {items.tolist()} vs {z['loss_items']} rel {err}"
    assert rel_err(total.detach().numpy(), z["loss_total"]).max() < GOLDEN_RTOL


@pytest.mark.parametrize("cfg", ["yolov9-s", "gelan-m"])
def test_gradients_equal_the_reference(cfg):
    preds, _ = golden_maps(cfg)
    pc, pr = leaf(preds), leaf(preds)
    c_loss_for(cfg)(pc, TARGETS)[0].backward()
    loss_for(cfg)(pr, TARGETS)[0].backward()
    assert_grads_close(pc, pr, 1e-6, 1e-6)


def test_float32_within_1e5():
    preds, _ = golden_maps("yolov9-s")
    pc, pr = leaf(preds, torch.float32), leaf(preds, torch.float32)
    tc, ic = c_loss_for("yolov9-s")(pc, TARGETS)
    tr, ir = loss_for("yolov9-s")(pr, TARGETS)
    assert tc.dtype == torch.float32 and rel_err(ic, ir).max() < 1e-5, (ic, ir)
    tc.backward()
    tr.backward()
    assert_grads_close(pc, pr, 1e-5, 1e-5)


def test_float16_within_2e3():
    preds, _ = golden_maps("gelan-t")
    p16 = leaf(convert(preds, lambda m: m / 8), torch.float16)  # logits in a range fp16 represents fairly
    t16, i16 = c_loss_for("gelan-t")(p16, TARGETS)
    i32 = loss_for("gelan-t")(convert(p16, lambda m: m.detach().float()), TARGETS)[1]
    assert t16.dtype == torch.float32 and rel_err(i16, i32).max() < 2e-3, (i16, i32)
    t16.backward()
    assert all(m.grad.dtype == torch.float16 and torch.isfinite(m.grad).all() for m in p16)


@pytest.mark.parametrize("hyp", [{"label_smoothing": 0.1}, {"cls_pw": 3.0}, {"fl_gamma": 1.5}])
def test_hyp_options_match_the_reference(hyp):
    preds, _ = golden_maps("gelan-s")
    full = {"cls_pw": 1.0, "fl_gamma": 0.0, "label_smoothing": 0.0, **hyp}
    ic = c_loss_for("gelan-s", full)(preds, TARGETS)[1]
    ir = loss_for("gelan-s", full)(preds, TARGETS)[1]
    assert rel_err(ic, ir).max() < 1e-7, (ic, ir)


def test_no_targets():
    preds, _ = golden_maps("yolov9-t")
    p = leaf(preds)
    total, items = c_loss_for("yolov9-t")(p, torch.zeros(0, 6))
    assert items[0] == 0 and items[2] == 0
    sp = [sum(F.softplus(m[:, 64:]).sum() for m in branch) for branch in preds]
    assert torch.allclose(items[1], 0.5 * (0.25 * sp[0] + sp[1]), rtol=1e-12)
    total.backward()
    assert all(torch.isfinite(m.grad).all() and (m.grad[:, :64] == 0).all() for m in maps_of(p))


def test_make_loss_backend():
    import yolov9c

    model = yolov9c.build_model("gelan-t", nc=3)
    assert yolov9c.make_loss(model, backend="c").backend == "c" and yolov9c.make_loss(model).backend == "torch"
    with pytest.raises(ValueError, match="backend"):
        yolov9c.make_loss(model, backend="cuda")


@pytest.mark.parametrize("backend", ["torch", "c"])
@pytest.mark.parametrize("cfg", ["gelan-t", "yolov9-t"])
def test_non_finite_targets_raise_the_same_error_on_both_backends(cfg, backend):
    """NaN, inf, and a float64 value that overflows the float32 targets: one ValueError naming the rows, the
    same on both backends (the c branch used to drop such rows silently, the torch one to return NaN)."""
    import yolov9c

    preds, _ = golden_maps(cfg)
    loss_fn = yolov9c.make_loss(yolov9c.build_model(cfg, nc=80), backend=backend)  # the public API
    assert loss_fn.backend == backend and loss_fn.dual == cfg.startswith("yolov9")
    bad = TARGETS.clone().double()
    bad[1, 2] = float("nan")
    bad[3, 4] = float("inf")
    bad[4, 5] = 1e300  # finite in float64, inf once packed in float32
    with pytest.raises(ValueError, match=r"3 target row\(s\) not finite \(NaN or inf\): rows 1, 3, 4; row 1 is") as e:
        loss_fn(preds, bad)
    assert "[image, class, x, y, w, h]" in str(e.value)
    total, items = loss_fn(preds, TARGETS)  # the good rows alone are fine
    assert torch.isfinite(total).all() and torch.isfinite(items).all()


def test_dense_image_5000_boxes(monkeypatch):
    """One image with 5000 boxes (most of them share anchors; some have none inside): every box reaches the
    assigner, the loss is finite and equals the reference, gradients are finite."""
    torch.manual_seed(0)
    nc, size, B, n_dense = 3, 160, 2, 5000
    shapes = [(size // s, size // s) for s in (8, 16, 32)]
    preds = [[torch.randn(B, 64 + nc, h, w) * 2 for h, w in shapes] for _ in range(2)]
    xy = torch.rand(n_dense, 2) * 0.9 + 0.05
    wh = torch.rand(n_dense, 2) * 0.2 + 0.002
    dense = torch.cat([torch.zeros(n_dense, 1), torch.randint(0, nc, (n_dense, 1)).float(), xy, wh], 1)
    sparse = torch.tensor([[1, 1, 0.5, 0.5, 0.3, 0.4], [1, 2, 0.2, 0.3, 0.1, 0.1]])
    targets = torch.cat([dense, sparse])

    seen = []
    real = tal_assign_op.tal_assign

    def spy(*args, **kw):
        gt_boxes, gt_mask = args[4], args[5]
        seen.append((tuple(gt_boxes.shape), gt_mask.view(B, -1).sum(1).tolist()))
        return real(*args, **kw)

    monkeypatch.setattr(tal_assign_op, "tal_assign", spy)
    pc = leaf(preds)
    total, items = DetectionLoss(nc, 16, [8, 16, 32], HYP, backend="c", dual=True)(pc, targets)
    total.backward()
    assert seen == [((B, n_dense, 4), [n_dense, 2])] * 2  # both branches, every box of both images
    assert torch.isfinite(items).all() and (items > 0).all()
    assert all(torch.isfinite(m.grad).all() for m in maps_of(pc))
    monkeypatch.undo()
    ref = DetectionLoss(nc, 16, [8, 16, 32], HYP, dual=True)(preds, targets)[1]
    assert rel_err(items, ref).max() < 1e-5, (items, ref)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_c_loss_matches_reference():
    preds, _ = golden_maps("yolov9-s")
    p32 = convert(preds, lambda m: m.float().cuda())
    pc, pr = leaf(p32), leaf(p32)
    tc, ic = c_loss_for("yolov9-s")(pc, TARGETS.cuda())
    tr, ir = loss_for("yolov9-s")(pr, TARGETS.cuda())
    assert ic.is_cuda and rel_err(ic.cpu(), ir.cpu()).max() < 1e-5, (ic, ir)
    tc.backward()
    tr.backward()
    assert_grads_close(pc, pr, 1e-5, 1e-5)
    # fp16 maps under autocast, as the trainer runs them
    p16 = leaf(convert(p32, lambda m: m / 8), torch.float16)
    with torch.autocast("cuda", dtype=torch.float16):
        t16, i16 = c_loss_for("yolov9-s")(p16, TARGETS.cuda())
    i32 = loss_for("yolov9-s")(convert(p16, lambda m: m.detach().float()), TARGETS.cuda())[1]
    assert rel_err(i16.cpu(), i32.cpu()).max() < 2e-3, (i16, i32)
    t16.backward()
    assert all(m.grad.dtype == torch.float16 and torch.isfinite(m.grad).all() for m in maps_of(p16))
