"""Tests of the task-aligned assigner without (B, M, A) tensors: yolov9c.ops.tal_assign.tal_assign (C CPU and
CUDA through yolov9c._C) against tal_assign_reference (the torch TaskAlignedAssigner, yolov9c/loss/assigner.py).

Tolerances and conventions:
  * The assignment must be IDENTICAL: target labels, target boxes, fg mask and assigned box index (torch.equal).
  * target_norm: |got - ref| <= 1e-6·|ref| + 1e-7. The C/CUDA CIoU is the reference's float32 arithmetic
    operation for operation, but atan and pow are evaluated in float64 and rounded, while torch's float32
    atan/pow can be an ulp off; a small CIoU is a difference of two numbers near 0.3, so one ulp there
    becomes ~1e-4 relative after the 6th power. Such anchors have tiny targets (1e-16 in the case seen), so
    the absolute 1e-7 term (targets lie in [0, 1]) covers them; on 200 random batches the worst case used
    under that bound. An assignment could differ only where two candidates' metrics lie within an ulp or
    two (none in these fixed-seed cases).
  * CUDA vs the C CPU code: same assignment and norms within the same bound (both use the same float32
    operation order and float64 transcendentals, so they agree bit for bit in practice).
  * Ties: the reference ranks equal metrics by lower anchor index (assigner.topk_mask); the zero-metric
    case, where anchors inside a box with score 0 fill a short candidate list, is tested on purpose.
CPU cases always run (a few seconds); CUDA cases (marked cuda) skip without a GPU.
Run: python -m pytest -q tests/ops/test_tal_assign.py
"""

import numpy as np
import pytest
import torch

from yolov9c.geometry import anchors_in_boxes, bbox_ciou, make_anchors
from yolov9c.loss.assigner import TaskAlignedAssigner
from yolov9c.ops import extension
from yolov9c.ops.tal_assign import AssignParams, expand_target_scores, tal_assign, tal_assign_reference, topk_mask

C = extension.load()
NORM_RTOL, NORM_ATOL = 1e-6, 1e-7
NAMES = ("target_labels", "target_boxes", "target_norm", "fg_mask", "target_gt_idx")


# ----------------------------------------------------------------------------------------------- inputs


def anchor_points(img):
    """(A, 2) anchor centres in pixels of a 3-level (strides 8, 16, 32) grid over an img x img image."""
    feats = [torch.zeros(1, 1, img // s, img // s) for s in (8, 16, 32)]
    pts, st = make_anchors(feats, [8, 16, 32])
    return pts * st, st


def mosaic_batch(seed, B=4, img=320, nc=80, max_boxes=60, n_boxes=None, min_size=4.0, max_size=None):
    """A random batch as the loss sees it: scores a permuted (B, A, NC) view of (B, NC, A) sigmoid outputs,
    predicted boxes spread around their anchors, ground-truth boxes with log-uniform sizes (4 px to img/2)
    uniform over the image, a random number of boxes per image (padding rows zero, as pack_targets makes)."""
    g = torch.Generator().manual_seed(seed)
    pts, st = anchor_points(img)
    A = pts.shape[0]
    scores = (torch.randn(B, nc, A, generator=g) * 2 - 3).sigmoid().permute(0, 2, 1)
    ltrb = (torch.rand(B, A, 4, generator=g) * 4 + 0.2) * st
    pred = torch.cat((pts - ltrb[..., :2], pts + ltrb[..., 2:]), -1)
    n = torch.randint(0, max_boxes + 1, (B,), generator=g) if n_boxes is None else torch.as_tensor(n_boxes)
    M = int(n.max())
    gt_boxes = torch.zeros(B, M, 4)
    gt_labels = torch.zeros(B, M, 1)
    lo, hi = np.log(min_size), np.log(max_size or img / 2)
    for b in range(B):
        k = int(n[b])
        wh = torch.exp(lo + torch.rand(k, 2, generator=g) * (hi - lo))
        c = torch.rand(k, 2, generator=g) * img
        gt_boxes[b, :k] = torch.cat((c - wh / 2, c + wh / 2), -1).clamp(0.5, img)
        gt_labels[b, :k, 0] = torch.randint(0, nc, (k,), generator=g).float()
    gt_mask = gt_boxes.sum(-1, keepdim=True) > 0
    return scores, pred, pts, gt_labels, gt_boxes, gt_mask


def assert_same(got, ref, what=""):
    for name, a, b in zip(NAMES, got, ref):
        assert a.dtype == b.dtype and a.shape == b.shape, (what, name, a.dtype, b.dtype, a.shape, b.shape)
        if name == "target_norm":
            a, b = a.cpu().double(), b.cpu().double()
            excess = (a - b).abs() - (NORM_ATOL + NORM_RTOL * b.abs())
            assert excess.max() <= 0, (what, f"target_norm off by {float((a - b).abs().max()):.3g}")
        else:
            diff = int((a.cpu() != b.cpu()).sum()) if name != "target_boxes" else int((a.cpu() != b.cpu()).any(-1).sum())
            assert diff == 0, (what, name, f"{diff} anchors differ")


def n_multi_positive(scores, pred, pts, gt_labels, gt_boxes, gt_mask, topk=10):
    """How many anchors are positive for more than one box before the multiple-assignment rule (reference)."""
    B, A, _ = scores.shape
    M = gt_boxes.shape[1]
    s = scores.transpose(1, 2).gather(1, gt_labels.long().view(B, M, 1).expand(B, M, A))
    ov = bbox_ciou(gt_boxes[:, :, None], pred[:, None]).clamp(0)
    inside = anchors_in_boxes(pts, gt_boxes)
    pos = topk_mask(s.pow(0.5) * ov.pow(6.0) * inside, topk, gt_mask.view(B, M).bool()) & inside
    return int((pos.sum(1) > 1).sum())


# ----------------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("seed,img", [(0, 160), (1, 256), (2, 320)])
def test_cpu_equals_reference_on_random_batches(seed, img):
    batch = mosaic_batch(seed, img=img)
    assert not batch[0].is_contiguous()  # read through the permuted view
    got = tal_assign(*batch, 80)
    ref = tal_assign_reference(*batch, 80)
    assert_same(got, ref)
    assert n_multi_positive(*batch) > 0 and int(got[3].sum()) > 0
    # the reference's (B, A, NC) soft targets are the expansion of (labels, norm)
    _, _, t_scores, fg = TaskAlignedAssigner(80)(*batch)
    assert torch.equal(expand_target_scores(ref[0], ref[2], 80), t_scores) and torch.equal(fg, ref[3])
    assert torch.allclose(expand_target_scores(got[0], got[2], 80), t_scores, rtol=NORM_RTOL, atol=NORM_ATOL)


def test_cpu_float16_bfloat16_float64_scores_and_logits():
    scores, *rest = mosaic_batch(3, B=2, img=192)
    logits = torch.logit(scores.double(), eps=1e-6)
    cases = {"fp16": (scores.half(), False), "bf16": (scores.bfloat16(), False), "fp64": (scores.double(), False),
             "fp16 logits": (logits.half(), True), "fp32 logits": (logits.float(), True),
             "bf16 logits": (logits.bfloat16(), True)}
    for what, (s, lg) in cases.items():
        got = tal_assign(s, *rest, 80, logits=lg)
        ref = tal_assign_reference(s, *rest, 80, logits=lg)
        assert_same(got, ref, what)
        assert got[2].dtype == (torch.float64 if s.dtype == torch.float64 else torch.float32)


def test_cpu_empty_images_and_padding_rows():
    scores, pred, pts, labels, boxes, mask = mosaic_batch(4, B=3, img=160, n_boxes=[0, 5, 0])
    got = tal_assign(scores, pred, pts, labels, boxes, mask, 80)
    assert_same(got, tal_assign_reference(scores, pred, pts, labels, boxes, mask, 80))
    assert not got[3][0].any() and not got[3][2].any() and got[3][1].any()
    # M = 0: every anchor is background with label num_classes
    got = tal_assign(scores, pred, pts, labels[:, :0], boxes[:, :0], mask[:, :0], 80)
    assert_same(got, tal_assign_reference(scores, pred, pts, labels[:, :0], boxes[:, :0], mask[:, :0], 80))
    assert (got[0] == 80).all() and not got[3].any() and (got[1] == 0).all()
    assert (expand_target_scores(got[0], got[2], 80) == 0).all()


def test_cpu_one_box_and_box_without_anchor_inside():
    scores, pred, pts, _, _, _ = mosaic_batch(5, B=1, img=160)
    boxes = torch.tensor([[[30.0, 40.0, 90.0, 120.0], [1.0, 1.0, 3.0, 3.0]]])  # box 1 holds no anchor centre
    labels = torch.tensor([[[7.0], [3.0]]])
    mask = torch.ones(1, 2, 1, dtype=torch.bool)
    assert not anchors_in_boxes(pts, boxes)[0, 1].any()
    for m in (1, 2):
        got = tal_assign(scores, pred, pts, labels[:, :m], boxes[:, :m], mask[:, :m], 80)
        assert_same(got, tal_assign_reference(scores, pred, pts, labels[:, :m], boxes[:, :m], mask[:, :m], 80))
        assert 1 <= int(got[3].sum()) <= 10 and (got[4][got[3]] == 0).all() and (got[0][got[3]] == 7).all()


def grid_scene(img=64, stride=8):
    """One level of anchors every `stride` px (A = (img/stride)^2); returns points (A, 2)."""
    n = img // stride
    ys, xs = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    return torch.stack((xs.flatten(), ys.flatten()), -1).float() * stride + stride / 2


def test_cpu_anchor_inside_several_boxes_goes_to_highest_ciou_over_all_boxes():
    """Anchor X = (20, 20) lies in boxes g1, g2 (9 anchors each, so X is a candidate of both) and g3. Every
    prediction is g3 itself; X's score for g3's class is tiny, so X is not among g3's top 10 (15 anchors
    inside g3 have metric 1). X is positive for g1 and g2 and goes to g3, the box of highest CIoU over all
    boxes, although it was not one of g3's candidates (the published rule)."""
    pts = grid_scene()
    A = pts.shape[0]
    g1, g2, g3 = [10.0, 10.0, 30.0, 30.0], [12.0, 6.0, 31.0, 28.0], [8.0, 8.0, 40.0, 40.0]
    boxes = torch.tensor([[g1, g2, g3]])
    labels = torch.tensor([[[0.0], [1.0], [2.0]]])
    mask = torch.ones(1, 3, 1, dtype=torch.bool)
    pred = torch.tensor(g3).expand(1, A, 4).contiguous()
    scores = torch.full((1, A, 3), 0.5)
    scores[0, :, 2] = 1.0
    x = int(((pts - torch.tensor([20.0, 20.0])).abs().sum(-1) == 0).nonzero())
    scores[0, x, 2] = 1e-6
    batch = (scores, pred, pts, labels, boxes, mask)
    assert n_multi_positive(*batch) > 0
    got = tal_assign(*batch, 3)
    assert_same(got, tal_assign_reference(*batch, 3))
    cand3 = topk_mask(scores[0, :, 2].sqrt() * bbox_ciou(boxes[0, 2], pred[0]).clamp(0) ** 6
                      * anchors_in_boxes(pts, boxes)[0, 2], 10, torch.ones(1, dtype=torch.bool))
    assert not cand3[0, x]
    assert bool(got[3][0, x]) and int(got[4][0, x]) == 2 and int(got[0][0, x]) == 2


def test_cpu_zero_metric_anchors_inside_fill_a_short_list():
    """A box in the top-left corner holds anchors 0, 1, 8, 9; anchors 0 and 8 have score 0 (metric 0). The
    box has 2 anchors of positive metric < topk, so its list is completed by the lowest-index anchors of
    metric 0 (0, 2, 3, ..., 8 by the tie rule); 0 and 8 are inside and become positives with target 0."""
    pts = grid_scene()
    A = pts.shape[0]
    boxes = torch.tensor([[[0.5, 0.5, 20.0, 20.0]]])
    labels = torch.zeros(1, 1, 1)
    mask = torch.ones(1, 1, 1, dtype=torch.bool)
    pred = torch.tensor([2.0, 2.0, 18.0, 18.0]).expand(1, A, 4).contiguous()
    scores = torch.full((1, A, 1), 0.6)
    scores[0, [0, 8], 0] = 0.0
    batch = (scores, pred, pts, labels, boxes, mask)
    got = tal_assign(*batch, 1)
    assert_same(got, tal_assign_reference(*batch, 1))
    assert got[3][0].nonzero().flatten().tolist() == [0, 1, 8, 9]
    assert float(got[2][0, 0]) == 0.0 and float(got[2][0, 8]) == 0.0 and float(got[2][0, 1]) > 0
    # topk 2: only the two anchors of positive metric
    got = tal_assign(*batch, 1, AssignParams(topk=2))
    assert_same(got, tal_assign_reference(*batch, 1, AssignParams(topk=2)))
    assert got[3][0].nonzero().flatten().tolist() == [1, 9]


def test_cpu_topk_larger_than_anchor_count_and_equal_metrics():
    """A = 4 < topk; every prediction identical, so every metric of a box ties: lower index first."""
    pts = grid_scene(img=16)
    boxes = torch.tensor([[[0.5, 0.5, 15.0, 15.0], [0.5, 0.5, 15.0, 9.0]]])
    labels = torch.tensor([[[0.0], [1.0]]])
    mask = torch.ones(1, 2, 1, dtype=torch.bool)
    pred = torch.tensor([1.0, 1.0, 14.0, 12.0]).expand(1, 4, 4).contiguous()
    scores = torch.full((1, 4, 2), 0.25)
    for k in (1, 3, 10):
        got = tal_assign(scores, pred, pts, labels, boxes, mask, 2, AssignParams(topk=k))
        want = tal_assign_reference(scores, pred, pts, labels, boxes, mask, 2, AssignParams(topk=k))
        assert_same(got, want, f"topk {k}")
    got = tal_assign(scores, pred, pts, labels, boxes, mask, 2, AssignParams(topk=1))
    assert got[3][0].tolist() == [True, False, False, False]


def test_cpu_dense_image_of_5000_boxes_drops_no_label():
    """Deliverable 4: 5000 boxes in one image (the other image has 3, so 4997 padding rows). Same result as the
    reference; every box with a candidate keeps a positive unless each of its candidates went to a box of
    higher (or equal, lower-index) CIoU under the multiple-assignment rule — checked with the reference's
    candidates. (Predictions are random, so many small boxes have metric 0 at every anchor inside.)"""
    batch = mosaic_batch(6, B=2, img=256, n_boxes=[5000, 3], min_size=3.0, max_size=40.0)
    scores, pred, pts, labels, boxes, mask = batch
    got = tal_assign(*batch, 80)
    assert_same(got, tal_assign_reference(*batch, 80))
    assert_same(tal_assign(*batch, 80), got, "second run")  # deterministic
    fg, idx = got[3][0], got[4][0]
    has_pos = torch.zeros(5000, dtype=torch.bool)
    has_pos[idx[fg]] = True
    # the reference's candidates of image 0 (5000 x A here: fine for one image of a test)
    inside = anchors_in_boxes(pts, boxes[:1])[0]
    ov = bbox_ciou(boxes[0, :, None], pred[0, None]).clamp(0)  # (5000, A)
    s = scores[0].T.gather(0, labels[0].long().expand(5000, pts.shape[0]))
    metric = s.sqrt() * ov**6 * inside
    cand = topk_mask(metric[None], 10, mask[:1, :, 0])[0] & inside
    # every box with an anchor of positive metric inside has candidates; a box whose inside anchors all have
    # metric 0 (no predicted box overlaps it) has none unless one of them is among the lowest indices: that is
    # the published rule (top-k of metric · inside, then AND inside), not a dropped label
    assert (cand.any(1) | ~(metric > 0).any(1)).all()
    assert int((inside.any(1) & ~cand.any(1)).sum()) < 5000 // 4
    lonely = inside.any(1) & ~has_pos
    m, a = (cand & lonely[:, None]).nonzero(as_tuple=True)
    w = idx[a]
    assert fg[a].all() and (w != m).all()
    assert ((ov[w, a] > ov[m, a]) | ((ov[w, a] == ov[m, a]) & (w < m))).all()
    # anchors are the scarce resource here (A < 5000): every one holding a candidate is used
    assert int(fg.sum()) == int(cand.any(0).sum()) and int(has_pos.sum()) > 300


def test_cpu_deterministic_and_fused_switch(monkeypatch):
    batch = mosaic_batch(7, B=2, img=160)
    a, b = tal_assign(*batch, 80), tal_assign(*batch, 80)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    ref = tal_assign(*batch, 80)
    for x, y in zip(ref, tal_assign_reference(*batch, 80)):
        assert torch.equal(x, y)


def test_bad_arguments_raise():
    scores, pred, pts, labels, boxes, mask = mosaic_batch(8, B=2, img=64, n_boxes=[2, 1])
    with pytest.raises(ValueError, match="pred_boxes"):
        tal_assign(scores, pred[:, :-1], pts, labels, boxes, mask, 80)
    with pytest.raises(ValueError, match="num_classes"):
        tal_assign(scores, pred, pts, labels, boxes, mask, 81)
    # no boxes (M = 0): nothing reaches C, the shapes are still checked
    no_labels, no_boxes, no_mask = labels[:, :0], boxes[:, :0], mask[:, :0]
    with pytest.raises(ValueError, match="pred_boxes"):
        tal_assign(scores, pred[:, :-1], pts, no_labels, no_boxes, no_mask, 80)
    with pytest.raises(ValueError, match="points"):
        tal_assign(scores, pred, pts[:-1], no_labels, no_boxes, no_mask, 80)
    with pytest.raises(ValueError, match="topk"):
        tal_assign(scores, pred, pts, labels, boxes, mask, 80, AssignParams(topk=0))
    bad = labels.clone()
    bad[0, 0, 0] = 80
    with pytest.raises(ValueError, match="gt_labels"):
        tal_assign(scores, pred, pts, bad, boxes, mask, 80)
    # the raw binding checks its arguments itself
    B, A, _ = scores.shape
    M = boxes.shape[1]
    out = [torch.empty(B, A, dtype=torch.int64), torch.empty(B, A, 4), torch.empty(B, A),
           torch.empty(B, A, dtype=torch.bool), torch.empty(B, A, dtype=torch.int64)]
    ws = torch.empty(C.tal_assign_workspace_size(B, M, A, 10, False), dtype=torch.uint8)
    gt = (labels.view(B, M).long(), boxes, mask.view(B, M))
    targets = tuple(out)
    args = [scores, pred, pts, gt, (10, 0.5, 6.0, 1e-9), False, C.DTYPE_FLOAT32, ws, targets, 0]

    def call(**change):
        c = list(args)
        for i, v in change.items():
            c[int(i[1:])] = v
        return C.tal_assign_forward(*c)

    call()
    with pytest.raises(TypeError, match="10 positional"):
        C.tal_assign_forward(*args[:-1])
    with pytest.raises(TypeError, match="gt_boxes"):
        call(a3=(gt[0], boxes.double(), gt[2]))
    with pytest.raises(TypeError, match="gt_labels"):
        call(a3=(labels.view(B, M).int(), gt[1], gt[2]))
    with pytest.raises(TypeError, match="gt must be a tuple of 3"):
        call(a3=gt[:2])
    with pytest.raises(ValueError, match="workspace"):
        call(a7=ws[:16])
    with pytest.raises(ValueError, match="round_dtype"):
        call(a6=C.DTYPE_FLOAT16)
    with pytest.raises(ValueError, match="target_norm"):
        call(a8=targets[:2] + (torch.empty(B, A + 1),) + targets[3:])
    with pytest.raises(ValueError, match="topk"):
        call(a4=(0, 0.5, 6.0, 1e-9))


# ----------------------------------------------------------------------------------------------- CUDA


def cuda_cases():
    yield "random 320", mosaic_batch(10, B=4, img=320), 10
    yield "random 160", mosaic_batch(11, B=3, img=160, n_boxes=[0, 40, 7]), 10
    yield "dense 5000", mosaic_batch(12, B=2, img=256, n_boxes=[5000, 3], min_size=3.0, max_size=40.0), 10
    yield "topk 32", mosaic_batch(13, B=2, img=256), 32


@pytest.mark.cuda
def test_cuda_equals_cpu_and_reference():
    dev = torch.device("cuda")
    for what, batch, k in cuda_cases():
        scores, *rest = batch
        # scores as the head gives them: fp16 (B, NC, A) logits read through a permuted view
        logits = torch.logit(scores.double(), eps=1e-6).half().permute(0, 2, 1).contiguous().permute(0, 2, 1)
        for s, lg, name in ((scores, False, "fp32"), (logits, True, "fp16 logits"), (logits.sigmoid(), False, "fp16"),
                            (logits.bfloat16(), True, "bf16 logits")):
            gpu_in = [t.to(dev) for t in (s, *rest)]
            got = tal_assign(*gpu_in, 80, AssignParams(topk=k), logits=lg)
            assert all(t.device.type == "cuda" for t in got)
            cpu = tal_assign(s, *rest, 80, AssignParams(topk=k), logits=lg)
            assert_same(got, cpu, f"{what} {name} cuda vs C cpu")
            want = tal_assign_reference(*gpu_in, 80, AssignParams(topk=k), logits=lg)
            assert_same(got, want, f"{what} {name} vs reference")
            again = tal_assign(*gpu_in, 80, AssignParams(topk=k), logits=lg)
            for x, y in zip(got, again):
                assert torch.equal(x, y), f"{what} {name} not deterministic"


@pytest.mark.cuda
def test_cuda_small_cases_and_empty():
    dev = torch.device("cuda")
    pts = grid_scene()
    A = pts.shape[0]
    boxes = torch.tensor([[[0.5, 0.5, 20.0, 20.0], [1.0, 1.0, 3.0, 3.0]]])
    labels = torch.zeros(1, 2, 1)
    mask = torch.ones(1, 2, 1, dtype=torch.bool)
    pred = torch.tensor([2.0, 2.0, 18.0, 18.0]).expand(1, A, 4).contiguous()
    scores = torch.full((1, A, 1), 0.6)
    scores[0, [0, 8], 0] = 0.0
    batch = [scores, pred, pts, labels, boxes, mask]
    got = tal_assign(*[t.to(dev) for t in batch], 1)
    assert_same(got, tal_assign(*batch, 1), "zero-metric fill")
    assert got[3][0].nonzero().flatten().tolist() == [0, 1, 8, 9]
    empty = tal_assign(*[t.to(dev) for t in (scores, pred, pts, labels[:, :0], boxes[:, :0], mask[:, :0])], 1)
    assert (empty[0] == 1).all() and not empty[3].any()


@pytest.mark.cuda
def test_cuda_memory_stays_far_below_one_bma_tensor():
    """Batch 16 at 640 (A = 8400) with 500 boxes per image: the assigner's peak extra memory (outputs and
    workspace, about 8 MB) stays under a quarter of one (B, M, A) byte tensor (17 MB), let alone the
    reference's float ones."""
    dev = torch.device("cuda")
    batch = [t.to(dev) for t in mosaic_batch(14, B=16, img=640, n_boxes=[500] * 16)]
    B, A, _ = batch[0].shape
    M = batch[4].shape[1]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = tal_assign(*batch, 80)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra < B * M * A // 4, (extra, B * M * A)
    assert int(out[3].sum()) > 0
