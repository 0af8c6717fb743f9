"""Tests of the YOLOv9 loss (yolov9c/loss/): golden loss from the stored head maps, CIoU by hand, the
assigner against a literal (B, M, topk, A) one-hot transcription of spec §4.3, assigner properties, edge cases;
and (last section) the c loss path, make_loss(model, backend="c") = DetectionLoss(..., backend="c")
(det_loss_decode + tal_assign + det_loss per branch), against the torch reference loss. The model-level goldens
through both loss paths are in tests/models/test_goldens_loss.py.

Run: python -m pytest -q tests/loss/test_loss.py        (CPU, about 15 s; CUDA cases skip without a GPU)

Tolerances:
  * golden loss from stored maps: 2.5e-7 relative (measured worst 1.3e-7). The published loss keeps its
    items in a float32 buffer (a few float32 roundings, ≤ 2^-24 relative each, between the float64 terms
    and the stored items); re-rounding the stored float32 maps moves the items by < 1e-7 (measured with
    ±2^-24 noise on the maps). Packing the targets in float64 instead of float32 (the published default
    dtype) moves the items by up to 4.9e-7, so this tolerance tells the two apart.
  * assigner vs literal transcription: bit-identical (torch.equal).
  * CIoU by hand: 1e-6 absolute (the eps = 1e-7 terms are left out of the hand values).
The c path:
  * golden stored maps (float64): loss items within 2.5e-7 of the published goldens, as the reference
    (above; the c path keeps target_norm in float64 for float64 scores, measured ≤ 5e-8 from
    the reference), and map gradients within 1e-6 of the reference's (relative to the largest).
  * float32 maps: loss and gradients within 1e-5 relative (gradients: + 1e-5 of the largest).
  * float16 maps: 2e-3 against the float32 reference of the same values (measured ≤ 5e-5 on the goldens).
  * dense image (5000 boxes in one image): every box reaches the assigner, and the c loss equals the
    reference (float32) within 1e-5; finite gradients.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from yolov9c.geometry import anchors_in_boxes, bbox_ciou, dist2bbox, make_anchors
from yolov9c.loss.assigner import TaskAlignedAssigner
from yolov9c.loss.bbox_loss import BboxLoss, dfl_loss
from yolov9c.loss.detection import DetectionLoss, pack_targets
from yolov9c.ops import tal_assign as tal_assign_op

from golden_weights import CONFIGS, GOLDEN_TARGETS as TARGETS, golden  # noqa: E402
from yolov9c.resources import DEFAULT_HYP as HYP  # noqa: E402

GOLDEN_RTOL = 2.5e-7


def golden_maps(cfg, dtype=torch.float64):
    """The stored train-mode maps of `cfg` as preds for the loss, plus all its stored tensors {name: array}."""
    z = golden(cfg)
    maps = [torch.from_numpy(z[f"train_map{i}"]).to(dtype) for i in range(6) if f"train_map{i}" in z]
    preds = [maps[:3], maps[3:]] if len(maps) == 6 else maps
    return preds, z


def loss_for(cfg, hyp=None):
    return DetectionLoss(80, 16, [8, 16, 32], hyp if hyp is not None else HYP, dual=cfg.startswith("yolov9"))


def rel_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.abs(a - b) / np.abs(b)


# -- golden loss from the stored maps --------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", CONFIGS)
def test_golden_loss_from_stored_maps(cfg):
    preds, z = golden_maps(cfg)
    total, items = loss_for(cfg)(preds, TARGETS)
    assert total.shape == (1,) and items.shape == (3,)
    assert total.dtype == torch.float64 and not items.requires_grad
    err_items = rel_err(items.numpy(), z["loss_items"])
    err_total = rel_err(total.detach().numpy(), z["loss_total"])
    assert err_items.max() < GOLDEN_RTOL, f"{cfg}: items {items.tolist()} vs {z['loss_items']} rel {err_items}"
    assert err_total.max() < GOLDEN_RTOL, f"{cfg}: total rel {err_total}"
    # loss_total = (box + cls + dfl) · B
    assert torch.allclose(total.detach(), items.sum() * 2, rtol=1e-12)


def test_eval_form_preds_give_the_same_loss():
    preds, _ = golden_maps("yolov9-s")
    fn = loss_for("yolov9-s")
    t1, i1 = fn(preds, TARGETS)
    t2, i2 = fn(([None, None], preds), TARGETS)  # eval-mode output: (y, [aux, main])
    assert torch.equal(t1, t2) and torch.equal(i1, i2)
    gpreds, _ = golden_maps("gelan-s")
    g = loss_for("gelan-s")
    assert torch.equal(g(gpreds, TARGETS)[1], g((None, gpreds), TARGETS)[1])


def test_bad_preds_raise():
    preds, _ = golden_maps("gelan-t")
    with pytest.raises(ValueError):
        loss_for("gelan-t")(preds[:2], TARGETS)
    with pytest.raises(ValueError):
        loss_for("yolov9-t")(preds, TARGETS)  # single-branch maps given to the dual loss


def test_dfl_loss_is_two_bin_cross_entropy():
    logits = torch.randn(5, 4, 16, dtype=torch.float64)
    t = torch.rand(5, 4, dtype=torch.float64) * 14.99
    got = dfl_loss(logits, t)
    logp = F.log_softmax(logits, -1)
    want = torch.zeros(5, 1, dtype=torch.float64)
    for n in range(5):
        for s in range(4):
            lo = int(math.floor(t[n, s]))
            want[n] -= (logp[n, s, lo] * (lo + 1 - t[n, s]) + logp[n, s, lo + 1] * (t[n, s] - lo)) / 4
    assert torch.allclose(got, want, rtol=1e-12)
    # minimised (over distributions) by the two-bin split: a sharp two-bin logit beats a one-bin one
    t1 = torch.full((1, 4), 3.25, dtype=torch.float64)
    two = torch.full((1, 4, 16), -30.0, dtype=torch.float64)
    two[..., 3], two[..., 4] = math.log(0.75), math.log(0.25)
    one = torch.full((1, 4, 16), -30.0, dtype=torch.float64)
    one[..., 3] = 0.0
    assert dfl_loss(two, t1).item() < dfl_loss(one, t1).item()


def test_bbox_loss_by_hand():
    """One image, three anchors, two of them foreground; a target side beyond the DFL range is clamped to 14.99."""
    pts = torch.tensor([[2.5, 2.5], [5.5, 3.5], [9.5, 9.5]], dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    pred_dist = torch.randn(1, 3, 64, generator=g, dtype=torch.float64)
    pred_boxes = torch.tensor([[[1.0, 1.0, 4.0, 5.0], [3.0, 2.0, 8.0, 6.0], [0.0, 0.0, 1.0, 1.0]]], dtype=torch.float64)
    tboxes = torch.tensor([[[0.5, 1.5, 4.5, 4.0], [-20.0, 1.0, 9.0, 5.0], [0.0, 0.0, 0.0, 0.0]]], dtype=torch.float64)
    tscores = torch.zeros(1, 3, 4, dtype=torch.float64)
    tscores[0, 0, 1], tscores[0, 1, 3], tscores[0, 2, 0] = 0.6, 0.3, 0.9  # anchor 2 is background
    fg = torch.tensor([[True, True, False]])
    tss = torch.tensor(2.5, dtype=torch.float64)
    loss_iou, loss_dfl = BboxLoss(16)(pred_dist, pred_boxes, pts, tboxes, tscores, tss, fg)
    w = torch.tensor([0.6, 0.3], dtype=torch.float64)
    ciou = torch.stack([bbox_ciou(pred_boxes[0, i], tboxes[0, i]) for i in range(2)])
    assert torch.allclose(loss_iou, ((1 - ciou) * w).sum() / 2.5, rtol=1e-12)
    ltrb = torch.tensor([[2.0, 1.0, 2.0, 1.5], [14.99, 2.5, 3.5, 1.5]], dtype=torch.float64)  # 25.5 -> 14.99
    want = (dfl_loss(pred_dist[0, :2].view(2, 4, 16), ltrb)[:, 0] * w).sum() / 2.5
    assert torch.allclose(loss_dfl, want, rtol=1e-12)


def test_pack_targets_keeps_order_and_pads():
    t = torch.tensor([[1, 4, 0.5, 0.5, 0.2, 0.2], [0, 1, 0.25, 0.25, 0.5, 0.5], [1, 7, 0.1, 0.2, 0.1, 0.2],
                      [1, 2, 0.9, 0.9, 0.1, 0.1]], dtype=torch.float64)
    scale = torch.tensor([100.0, 50.0, 100.0, 50.0], dtype=torch.float64)  # (W, H, W, H)
    out = pack_targets(t, 3, scale, torch.float64)
    assert out.shape == (3, 3, 5)
    assert out[1, :, 0].tolist() == [4, 7, 2]  # order within image 1 kept
    assert out[0, 0].tolist() == [1, 0.0, 0.0, 50.0, 25.0]
    assert torch.allclose(out[1, 1], torch.tensor([7, 5.0, 5.0, 15.0, 15.0], dtype=torch.float64))
    assert out[0, 1:].eq(0).all() and out[2].eq(0).all()  # padding rows are zero
    assert pack_targets(t[:0], 2, scale, torch.float32).shape == (2, 0, 5)
    with pytest.raises(ValueError):
        pack_targets(t, 1, scale, torch.float64)  # image index 1 >= batch size 1
    with pytest.raises(ValueError, match="outside the model's classes"):
        pack_targets(t, 3, scale, torch.float64, nc=int(t[:, 1].max()))  # the largest class == nc


# -- the assigner --------------------------------------------------------------------------------------------


def literal_assign(scores, boxes, points, gt_labels, gt_boxes, gt_mask, topk=10, alpha=0.5, beta=6.0, eps=1e-9):
    """Spec §4.3 written out step by step with the published tensor shapes (int64 one-hots, (B,M,A,4) deltas).
    Also returns how many anchors were positive for more than one box before step 7."""
    B, A, NC = scores.shape
    M = gt_boxes.shape[1]
    lab = gt_labels.long().view(B, M)
    bbox_scores = torch.stack([scores[b][:, lab[b]].T for b in range(B)])  # (B, M, A)
    overlaps = bbox_ciou(gt_boxes[:, :, None, :], boxes[:, None, :, :]).clamp(0)
    align = bbox_scores.pow(alpha) * overlaps.pow(beta)
    deltas = torch.cat((points[None, None] - gt_boxes[:, :, None, :2], gt_boxes[:, :, None, 2:] - points[None, None]), -1)
    in_gts = (deltas.amin(-1) > eps).to(align.dtype)
    idx = (align * in_gts).topk(topk, dim=-1).indices
    idx = torch.where(gt_mask.view(B, M, 1).bool().expand(B, M, topk), idx, 0)
    hits = F.one_hot(idx, A).sum(-2)
    in_topk = torch.where(hits > 1, 0, hits).to(align.dtype)
    mask_pos = in_topk * in_gts * gt_mask.view(B, M, 1).to(align.dtype)
    fg = mask_pos.sum(-2)
    n_multi = int((fg > 1).sum())
    if fg.max() > 1:
        multi = (fg[:, None, :] > 1).expand(B, M, A)
        best = F.one_hot(overlaps.argmax(1), M).permute(0, 2, 1).to(align.dtype)
        mask_pos = torch.where(multi, best, mask_pos)
        fg = mask_pos.sum(-2)
    gt_idx = mask_pos.argmax(-2)
    labels = lab.gather(1, gt_idx)
    tboxes = gt_boxes[torch.arange(B)[:, None], gt_idx]
    tscores = F.one_hot(labels, NC) * (fg[..., None] > 0)
    align = align * mask_pos
    norm = (align * (overlaps * mask_pos).amax(-1, keepdim=True) / (align.amax(-1, keepdim=True) + eps)).amax(-2)
    return labels, tboxes, tscores * norm[..., None], fg > 0, n_multi


def random_scene(seed, B=2, M=7, n_real=(7, 4), size=96, nc=5, dtype=torch.float64):
    """Anchors of a size×size image, random predictions and crowded, overlapping boxes (with padding)."""
    g = torch.Generator().manual_seed(seed)
    feats = [torch.zeros(1, 1, size // s, size // s) for s in (8, 16, 32)]
    pts, st = make_anchors(feats, [8, 16, 32])
    pts, st = (pts * st).to(dtype), st.to(dtype)
    A = pts.shape[0]
    scores = torch.rand(B, A, nc, generator=g, dtype=dtype)
    ltrb = (torch.rand(B, A, 4, generator=g, dtype=dtype) * 3 + 0.5) * st
    boxes = dist2bbox(ltrb, pts, xywh=False)
    gt_boxes = torch.zeros(B, M, 4, dtype=dtype)
    gt_labels = torch.zeros(B, M, 1, dtype=dtype)
    for b in range(B):
        n = n_real[b]
        c = 30 + torch.rand(n, 2, generator=g, dtype=dtype) * 36  # crowd them in the middle
        wh = 10 + torch.rand(n, 2, generator=g, dtype=dtype) * 40
        gt_boxes[b, :n] = torch.cat((c - wh / 2, c + wh / 2), -1)
        gt_labels[b, :n, 0] = torch.randint(0, nc, (n,), generator=g).to(dtype)
    gt_mask = gt_boxes.sum(-1, keepdim=True) > 0
    return scores, boxes, pts, gt_labels, gt_boxes, gt_mask


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_assigner_equals_literal_transcription(seed):
    scene = random_scene(seed)
    got = TaskAlignedAssigner(5)(*scene)
    *want, n_multi = literal_assign(*scene)
    assert n_multi > 0  # the crowded scenes exercise the multi-assignment step
    for name, a, b in zip(("labels", "boxes", "scores", "fg"), got, want):
        assert a.dtype == b.dtype or name == "scores", (name, a.dtype, b.dtype)
        assert torch.equal(a, b.to(a.dtype)), name


def test_assigner_float32_boxes_like_the_published_amp_path():
    scores, boxes, pts, labels, gtb, mask = random_scene(5)
    scene = (scores.half(), boxes.float(), pts.half(), labels.float(), gtb.float(), mask)
    got = TaskAlignedAssigner(5)(*scene)
    *want, _ = literal_assign(*scene)
    for a, b in zip(got, want):
        assert torch.equal(a, b.to(a.dtype))


def test_assigner_properties_on_separate_boxes():
    """Boxes that do not overlap: ≤ topk positives per box, every positive's centre inside its box, targets
    in [0, 1] with each box's best anchor getting that box's best CIoU, padding boxes never assigned."""
    scores, boxes, pts, labels, _, _ = random_scene(7, n_real=(3, 1))
    labels = labels[:, :3]
    gtb = torch.zeros(2, 3, 4, dtype=torch.float64)
    gtb[0, 0] = torch.tensor([2.0, 2.0, 40.0, 40.0])
    gtb[0, 1] = torch.tensor([50.0, 5.0, 94.0, 30.0])
    gtb[0, 2] = torch.tensor([60.0, 60.0, 70.0, 70.0])  # covers few anchors: fewer than topk positives
    gtb[1, 0] = torch.tensor([10.0, 50.0, 90.0, 90.0])  # rows 1, 2 of image 1 are padding
    mask = gtb.sum(-1, keepdim=True) > 0
    asg = TaskAlignedAssigner(5, topk=10)
    t_labels, t_boxes, t_scores, fg = asg(scores, boxes, pts, labels, gtb, mask)
    inside = anchors_in_boxes(pts, gtb)
    assert not (fg & (t_boxes == 0).all(-1)).any()  # no foreground anchor points at a (zero) padding row
    for b in range(2):
        for m in range(int(mask[b].sum())):
            mine = fg[b] & (t_boxes[b] == gtb[b, m]).all(-1)
            assert 1 <= int(mine.sum()) <= 10
            assert inside[b, m][mine].all()
            assert (t_labels[b][mine] == labels[b, m, 0].long()).all()
            # the best positive gets max CIoU · a_max / (a_max + 1e-9), a = score^0.5 · CIoU^6
            ciou = bbox_ciou(gtb[b, m], boxes[b][mine]).clamp(0)
            a_max = (scores[b][mine, labels[b, m, 0].long()].sqrt() * ciou**6).max()
            assert torch.allclose(t_scores[b][mine].amax(), ciou.max() * a_max / (a_max + 1e-9), rtol=1e-9)
    assert int(fg[0].sum()) > int(fg[1].sum()) > 0
    assert (t_scores >= 0).all() and (t_scores <= 1).all()
    assert (t_scores.sum(-1) > 0)[~fg].sum() == 0


def test_assigner_ignores_padding_rows():
    """An image's assignment does not depend on the padding added for a more crowded image in the batch."""
    scene = random_scene(11, n_real=(7, 2))
    full = TaskAlignedAssigner(5)(*scene)
    alone = TaskAlignedAssigner(5)(*(t[1:2, :2] if t.dim() == 3 and t.shape[1] == 7 else t[1:2] if t.dim() == 3 else t
                                     for t in scene))
    for a, b in zip(full, alone):
        assert torch.equal(a[1:2], b)


def test_shared_anchor_goes_to_the_box_of_higher_ciou():
    """Two small boxes (fewer than topk anchors each) share one anchor centre; every prediction is the same
    box P. The shared anchor is positive for both, so it goes to whichever box overlaps P more."""
    pts = torch.tensor([[4.0, 4.0], [12.0, 4.0], [20.0, 4.0], [4.0, 12.0], [12.0, 12.0], [20.0, 12.0]],
                       dtype=torch.float64)
    A = pts.shape[0]
    g1 = torch.tensor([1.0, 1.0, 14.0, 7.0], dtype=torch.float64)  # holds anchors 0, 1
    g2 = torch.tensor([9.0, 1.0, 23.0, 6.5], dtype=torch.float64)  # holds anchors 1, 2
    scores = torch.full((1, A, 2), 0.5, dtype=torch.float64)
    labels = torch.tensor([[[0.0], [1.0]]], dtype=torch.float64)
    gtb = torch.stack((g1, g2))[None]
    mask = torch.ones(1, 2, 1, dtype=torch.bool)
    for p, winner in ((torch.tensor([2.0, 1.0, 13.0, 7.0]), 0), (torch.tensor([10.0, 1.0, 22.0, 6.5]), 1)):
        boxes = p.to(torch.float64).expand(1, A, 4)
        assert bbox_ciou(gtb[0, winner], p) > bbox_ciou(gtb[0, 1 - winner], p)
        t_labels, t_boxes, t_scores, fg = TaskAlignedAssigner(2, topk=10)(scores, boxes, pts, labels, gtb, mask)
        assert fg[0].tolist() == [True, True, True, False, False, False]
        assert int(t_labels[0, 1]) == winner and torch.equal(t_boxes[0, 1], gtb[0, winner])
        assert t_labels[0, 0] == 0 and t_labels[0, 2] == 1


# -- the loss: edge cases and options ------------------------------------------------------------------------


def test_no_targets_gives_cls_only():
    preds, _ = golden_maps("yolov9-t")
    preds = [[m.clone().requires_grad_(True) for m in branch] for branch in preds]
    total, items = loss_for("yolov9-t")(preds, torch.zeros(0, 6))
    assert torch.isfinite(total).all() and items[0] == 0 and items[2] == 0 and items[1] > 0
    total.backward()
    assert all(torch.isfinite(m.grad).all() for branch in preds for m in branch)
    # every class target is 0, so cls = 0.5 · (0.25·Σ softplus(x_aux) + Σ softplus(x_main)) (target_scores_sum = 1)
    sp = [sum(F.softplus(m[:, 64:]).sum() for m in branch) for branch in preds]
    assert torch.allclose(items[1], 0.5 * (0.25 * sp[0] + sp[1]), rtol=1e-12)


def test_label_smoothing_acts_and_zero_is_identity():
    preds, _ = golden_maps("gelan-s")
    base = loss_for("gelan-s")(preds, TARGETS)[1]
    zero = loss_for("gelan-s", {"cls_pw": 1.0, "fl_gamma": 0.0, "label_smoothing": 0.0})(preds, TARGETS)[1]
    assert torch.equal(base, zero)
    smooth = loss_for("gelan-s", {"cls_pw": 1.0, "fl_gamma": 0.0, "label_smoothing": 0.1})(preds, TARGETS)[1]
    assert smooth[1] != base[1] and torch.equal(smooth[[0, 2]], base[[0, 2]])
    # without boxes every target is 0 and target_scores_sum = 1; smoothing makes them eps/2:
    # cls = 0.5 · Σ [(eps/2)·softplus(−x) + (1 − eps/2)·softplus(x)]
    eps = 0.2
    cls = loss_for("gelan-s", {"label_smoothing": eps})(preds, torch.zeros(0, 6))[1][1]
    x = torch.cat([m[:, 64:].flatten() for m in preds])
    want = 0.5 * ((eps / 2) * F.softplus(-x) + (1 - eps / 2) * F.softplus(x)).sum()
    assert torch.allclose(cls, want, rtol=1e-12)


def test_focal_gamma_lowers_cls_only():
    preds, _ = golden_maps("gelan-t")
    base = loss_for("gelan-t")(preds, TARGETS)[1]
    focal = loss_for("gelan-t", {"cls_pw": 1.0, "fl_gamma": 1.5})(preds, TARGETS)[1]
    assert torch.isfinite(focal).all() and 0 < focal[1] < base[1] and torch.equal(focal[[0, 2]], base[[0, 2]])


def test_cls_pw_weights_positive_targets():
    preds, _ = golden_maps("gelan-t")
    base = loss_for("gelan-t")(preds, TARGETS)[1]
    heavier = loss_for("gelan-t", {"cls_pw": 3.0, "fl_gamma": 0.0})(preds, TARGETS)[1]
    assert heavier[1] > base[1] and torch.equal(heavier[[0, 2]], base[[0, 2]])


def test_float32_and_float64_agree_and_gradients_flow():
    p64, _ = golden_maps("yolov9-s")
    p32 = [[m.float().requires_grad_(True) for m in b] for b in p64]
    p64 = [[m.clone().requires_grad_(True) for m in b] for b in p64]
    t64, i64 = loss_for("yolov9-s")(p64, TARGETS)
    t32, i32 = loss_for("yolov9-s")(p32, TARGETS.float())
    assert t32.dtype == torch.float32 and t64.dtype == torch.float64
    assert rel_err(i32.double(), i64).max() < 1e-5
    t64.backward()
    t32.backward()
    for b64, b32 in zip(p64, p32):
        for m64, m32 in zip(b64, b32):
            assert torch.isfinite(m64.grad).all() and m64.grad.abs().sum() > 0
            assert torch.allclose(m32.grad.double(), m64.grad, rtol=1e-3, atol=1e-5 * m64.grad.abs().max())


def test_float16_predictions():
    p64, _ = golden_maps("gelan-t")
    # the golden logits are in the hundreds; scale them into a range where fp16 is a fair comparison
    p64 = [m / 8 for m in p64]
    p16 = [m.half().requires_grad_(True) for m in p64]
    t16, i16 = loss_for("gelan-t")(p16, TARGETS)
    t32, i32 = loss_for("gelan-t")([m.float() for m in p64], TARGETS)
    assert t16.dtype == torch.float32 and torch.isfinite(t16).all()
    assert rel_err(i16, i32).max() < 2e-2, (i16, i32)
    t16.backward()
    assert all(torch.isfinite(m.grad).all() and m.grad.dtype == torch.float16 for m in p16)


# -- make_loss, autocast, CUDA ---------------------------------------------------------------------------------


class _Wrapper(torch.nn.Module):
    """Stands where DataParallel/DDP would: the real model is `.module`."""

    def __init__(self, module):
        super().__init__()
        self.module = module


def _detection_container(head):
    """The smallest thing make_loss reads: an object whose .model[-1] is a real head with strides set."""
    head.stride = torch.tensor([8.0, 16.0, 32.0])
    box = torch.nn.Module()
    box.model = torch.nn.Sequential(torch.nn.Identity(), head)
    return box


def test_make_loss_dispatches_on_the_head_class(tmp_path):
    from yolov9c.loss.detection import make_loss
    from yolov9c.models.head import DDetect, DualDDetect

    single = make_loss(_detection_container(DDetect(7, (16, 32, 64))))
    dual = make_loss(_Wrapper(_detection_container(DualDDetect(80, (16, 32, 64, 16, 32, 64)))))
    assert type(single) is DetectionLoss and type(dual) is DetectionLoss and dual.dual and not single.dual
    assert (single.nc, single.reg_max, single.no, single.stride) == (7, 16, 71, [8.0, 16.0, 32.0])
    assert single.hyp["cls_pw"] == 1.0 and single.hyp["fl_gamma"] == 0.0 and "lr0" in single.hyp  # default yaml
    (tmp_path / "h.yaml").write_text("cls_pw: 2.0\nfl_gamma: 1.5\nlabel_smoothing: 0.1\n")
    custom = make_loss(_detection_container(DDetect(7, (16, 32, 64))), tmp_path / "h.yaml")
    assert (custom.cls_pw, custom.fl_gamma, custom.label_smoothing) == (2.0, 1.5, 0.1)
    assert make_loss(_detection_container(DDetect(7, (16, 32, 64))), {"cls_pw": 3.0}).cls_pw == 3.0
    # the dual loss built from a real head gives the golden numbers on the golden maps
    preds, z = golden_maps("yolov9-t")
    assert rel_err(dual(preds, TARGETS)[1], z["loss_items"]).max() < GOLDEN_RTOL
    with pytest.raises(TypeError):
        make_loss(_detection_container(torch.nn.Conv2d(1, 1, 1)))


def test_cpu_autocast_bfloat16():
    p64, _ = golden_maps("gelan-t")
    maps = [(m / 8).float().requires_grad_(True) for m in p64]  # logits in a range bf16 can represent fairly
    fn = loss_for("gelan-t")
    ref = fn([m.detach() for m in maps], TARGETS)[1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        total, items = fn(maps, TARGETS)
    total.backward()
    assert total.dtype == torch.float32 and rel_err(items, ref).max() < 2e-2, (items, ref)
    assert all(torch.isfinite(m.grad).all() for m in maps)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu_and_runs_under_fp16_autocast():
    preds, z = golden_maps("yolov9-s")
    fn = loss_for("yolov9-s")
    cpu = fn(preds, TARGETS)[1]
    cuda64 = fn([[m.cuda() for m in b] for b in preds], TARGETS.cuda())[1]
    # same assignment; the assigner's CIoU runs on float32 boxes (the published target dtype), whose last bits
    # differ between CUDA and CPU maths (measured 4.7e-9 on an H200)
    assert cuda64.is_cuda and rel_err(cuda64.cpu(), cpu).max() < 1e-7
    assert rel_err(cuda64.cpu(), z["loss_items"]).max() < GOLDEN_RTOL
    maps = [[(m / 8).float().cuda().requires_grad_(True) for m in b] for b in preds]
    ref = fn([[m.detach() for m in b] for b in maps], TARGETS)[1]
    with torch.autocast("cuda", dtype=torch.float16):
        total, items = fn([[m.half() for m in b] for b in maps], TARGETS)
    total.backward()
    assert total.dtype == torch.float32 and rel_err(items.cpu(), ref.cpu()).max() < 2e-2, (items, ref)
    assert all(torch.isfinite(m.grad).all() for b in maps for m in b)


# -- the c assigner's decode of fp16 maps ------------------------------------------------------------


def _half_preds():
    preds, _ = golden_maps("yolov9-s", torch.float32)
    return [[m.half().requires_grad_() for m in branch] for branch in preds]


def _spy_assigner_boxes(monkeypatch):
    """A list that collects the pred_boxes of every c assigner call from now on (the calls still run)."""
    from yolov9c.loss import detection
    seen = []
    real = detection.tal_assign_op.tal_assign

    def spy(scores, pred_boxes, *a, **k):
        seen.append(pred_boxes.clone())
        return real(scores, pred_boxes, *a, **k)

    monkeypatch.setattr(detection.tal_assign_op, "tal_assign", spy)
    return seen


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_c_assigner_reads_the_torch_decode_of_fp16_maps(monkeypatch, device):
    """The c branch's assigner reads the torch branch's own fp16 decode (a few images at a time), so on the
    same fp16 maps the two backends' assignments agree."""
    from yolov9c.geometry import dfl_decode
    from yolov9c.loss import detection
    preds = [[m.detach().to(device).requires_grad_() for m in b] for b in _half_preds()]
    targets = TARGETS.to(device)
    seen = _spy_assigner_boxes(monkeypatch)
    monkeypatch.setattr(detection, "DECODE_CHUNK_ELEMS", 1)  # one image at a time: the chunks are stitched
    got = {b: DetectionLoss(80, 16, [8, 16, 32], HYP, backend=b, dual=True).assignments(preds, targets)
           for b in ("torch", "c")}
    main = preds[1]
    B = main[0].shape[0]
    points, stride_col = make_anchors(main, [8, 16, 32], 0.5)
    dist = torch.cat([m.detach().reshape(B, 144, -1) for m in main], 2)[:, :64].transpose(1, 2).contiguous()
    torch_boxes = (dfl_decode(dist, points, 16) * stride_col).float()
    assert seen[1].dtype == torch.float32 and torch.equal(seen[1], torch_boxes)
    for t, c in zip(got["torch"], got["c"]):
        assert int(t["fg"].sum()) > 10 and torch.equal(t["fg"], c["fg"])
        assert torch.equal(t["labels"][t["fg"]], c["labels"][t["fg"]])
        assert torch.allclose(t["norm"], c["norm"], rtol=1e-5, atol=1e-7)
    total, _ = DetectionLoss(80, 16, [8, 16, 32], HYP, backend="c", dual=True)(preds, targets)
    total.backward()  # the loss itself still trains through the c kernels
    assert preds[1][0].grad is not None and torch.isfinite(preds[1][0].grad.float()).all()


def test_assignments_of_the_two_backends_agree_on_float32_maps():
    """DetectionLoss.assignments: the targets each branch trains on. On the same float32 maps the reference
    assigner and the c kernels give the same foreground, classes and boxes, and soft scores to rounding;
    their target_scores_sum is what the loss divides by."""
    preds, _ = golden_maps("yolov9-s", torch.float32)
    got = {b: DetectionLoss(80, 16, [8, 16, 32], HYP, backend=b, dual=True).assignments(preds, TARGETS)
           for b in ("torch", "c")}
    assert len(got["torch"]) == len(got["c"]) == 2  # aux, main
    for t, c in zip(got["torch"], got["c"]):
        assert t["fg"].shape == t["labels"].shape == t["norm"].shape == t["boxes"].shape[:2]
        assert int(t["fg"].sum()) > 10 and torch.equal(t["fg"], c["fg"])
        fg = t["fg"]
        assert torch.equal(t["labels"][fg], c["labels"][fg])
        assert torch.allclose(t["boxes"][fg], c["boxes"][fg], rtol=1e-6, atol=1e-4)
        assert torch.allclose(t["norm"], c["norm"], rtol=1e-5, atol=1e-7) and float(t["norm"][~fg].abs().max()) == 0
    # the c loss's terms are the reference's: the same targets give the same loss
    items = {b: DetectionLoss(80, 16, [8, 16, 32], HYP, backend=b, dual=True)(preds, TARGETS)[1] for b in ("torch", "c")}
    assert torch.allclose(items["torch"], items["c"], rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# the c loss path against the torch reference
# ---------------------------------------------------------------------------------------------------------


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
