"""Task-aligned label assignment without (B, M, A) tensors: `tal_assign()` (C/CUDA via yolov9c._C) and
`tal_assign_reference()` (the torch maths of yolov9c/loss/assigner.py's TaskAlignedAssigner).

    tal_assign(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, params=AssignParams(),
               logits=False)     # params: (topk=10, alpha=0.5, beta=6.0, eps=1e-9)
Inputs: scores (B, A, NC) float32/16/bf16/64, any strides (logits=True: sigmoid on read); pred_boxes (B, A, 4)
xyxy pixels; points (A, 2); gt_labels (B, M, 1); gt_boxes (B, M, 4) xyxy pixels; gt_mask (B, M, 1).
Returns (target_labels (B, A) int64, target_boxes (B, A, 4), target_norm (B, A) float32 (float64 for float64
scores), fg_mask (B, A) bool, target_gt_idx (B, A) int64); the reference's target_scores ==
expand_target_scores(target_labels, target_norm, num_classes). Background anchors: box 0's label/box, idx 0.
Invariants: top-k ties go to the lower anchor index; the C/CUDA maths equals the fp32 reference op for op but
evaluates atan/pow/exp in float64 and rounds (torch's are off by an ulp at times): differences only at near-ties.
Dispatch: YOLOV9C_FUSED=0, non-float32 gt_boxes, float64 pred_boxes, float64 scores on CUDA, topk > 32 ->
reference; CPU -> csrc/tal_assign_ref.c; CUDA -> kernels/tal_assign.cu.
Test: python -m pytest -q tests/ops/test_tal_assign.py
"""


from typing import NamedTuple

import torch

from yolov9c.geometry import anchors_in_boxes, bbox_ciou
from yolov9c.ops import extension

MAX_TOPK = 32  # the kernels keep each box's candidate list in registers and shared memory


class AssignParams(NamedTuple):
    """The assigner's parameters (TOOD; the published defaults): candidates per box, the metric's exponents
    s^alpha · CIoU^beta, and the normalisation's eps. Crosses to C as this 4-tuple."""
    topk: int = 10
    alpha: float = 0.5
    beta: float = 6.0
    eps: float = 1e-9


def expand_target_scores(target_labels, target_norm, num_classes):
    """(B, A, NC) soft class targets of the reference: one_hot(target_labels) · target_norm[..., None].

    Labels >= num_classes (background with M == 0) give an all-zero row."""
    B, A = target_labels.shape
    out = torch.zeros((B, A, num_classes), dtype=target_norm.dtype, device=target_norm.device)
    ok = target_labels < num_classes
    out.scatter_(-1, torch.where(ok, target_labels, 0)[..., None], (target_norm * ok)[..., None])
    return out


def topk_mask(metric, topk, valid_gt):
    """Per box, the `topk` anchors with the largest metric, as a bool (B, M, A) mask.

    metric: (B, M, A) float; valid_gt: bool (B, M). Rows of padding boxes select nothing. Reproduces the
    published rule "an anchor hit more than once in a row is dropped": top-k indices of a row are distinct,
    so only a padding row (all indices replaced by 0) can hit an anchor twice, and such rows are empty here.

    Ties: equal metric values rank by lower anchor index first (what torch's CUDA top-k does; its CPU top-k
    picks among tied values by heap/introselect order). Ties happen in practice at 0: a box with fewer than
    topk anchors of nonzero metric inside fills its list with zero-metric anchors, and those that are inside
    the box (score 0 or CIoU <= 0) become positives. Deterministic here so that the C/CUDA assigner
    (tal_assign) can give the same result; without ties it is torch.topk's selection.
    """
    k = min(topk, metric.shape[-1])
    kth = metric.topk(k, dim=-1, largest=True).values[..., -1:]  # (B, M, 1) the k-th largest value
    above = metric > kth
    tied = metric == kth
    room = k - above.sum(-1, keepdim=True, dtype=torch.int32)  # slots left for the tied values (>= 1)
    first_tied = tied.to(torch.int32).cumsum_(-1) <= room
    return (above | (tied & first_tied)) & valid_gt[..., None]


@torch.no_grad()
def assign(scores, boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, params=AssignParams()):
    """The task-aligned assignment from torch ops with (B, M, A) intermediates (B images, M boxes per image
    after padding, A anchors): scores (B, A, NC) probabilities, boxes (B, A, 4) predicted xyxy pixels, points
    (A, 2) anchor centres in pixels, the targets as tal_assign's. Returns (target_labels, target_boxes, norm,
    fg, gt_idx): norm (B, A) the normalised alignment of a foreground anchor (0 for background; dtype of the
    metric), so target_scores = one_hot(target_labels) · norm[..., None]; gt_idx (B, A) int64 the assigned
    box's row (0 for background). The in-box test keeps a running minimum instead of a (B, M, A, 4) tensor
    and the top-k is a threshold at each box's k-th value (topk_mask)."""
    B, A, NC = scores.shape
    M = gt_boxes.shape[1]
    device = scores.device
    if M == 0:
        return (
            torch.full((B, A), num_classes, dtype=torch.long, device=device),
            torch.zeros_like(boxes),
            torch.zeros((B, A), dtype=scores.dtype, device=device),
            torch.zeros((B, A), dtype=torch.bool, device=device),
            torch.zeros((B, A), dtype=torch.long, device=device),
        )

    labels = gt_labels.long().view(B, M)
    valid_gt = gt_mask.view(B, M).bool()

    # 1-3: alignment metric s^alpha · CIoU^beta between every box and every predicted box
    cls_scores = scores.transpose(1, 2).gather(1, labels[..., None].expand(B, M, A))  # (B, M, A)
    overlaps = bbox_ciou(gt_boxes[:, :, None, :], boxes[:, None, :, :]).clamp_(0)  # (B, M, A)
    align = cls_scores.pow(params.alpha) * overlaps.pow(params.beta)

    # 4-6: candidates = top-k of the metric among anchors strictly inside the box, real boxes only
    inside = anchors_in_boxes(points, gt_boxes)
    pos = topk_mask(align * inside, params.topk, valid_gt) & inside

    # 7: an anchor positive for several boxes goes to the box of highest CIoU over ALL M boxes (even one
    # it was not a candidate of, as in the published code)
    n_pos = pos.sum(1)  # (B, A)
    if M > 1:  # unconditional (no host read of n_pos): a no-op where no anchor has several boxes
        best = overlaps.argmax(1)  # (B, A); first index on ties
        best_hot = torch.arange(M, device=device)[None, :, None] == best[:, None, :]
        pos = torch.where((n_pos > 1)[:, None, :], best_hot, pos)
    fg = pos.any(1)  # (B, A)
    gt_idx = pos.to(torch.uint8).argmax(1)  # (B, A), 0 for background anchors

    target_labels = labels.gather(1, gt_idx)
    target_boxes = gt_boxes.gather(1, gt_idx[..., None].expand(B, A, 4))

    # 9: per box, rescale the metric of its positives so that its max equals the box's best CIoU among its
    # positives; each foreground anchor takes the max over boxes (its only box after step 7)
    align = align * pos
    box_max_align = align.amax(-1, keepdim=True)  # (B, M, 1)
    box_max_iou = (overlaps * pos).amax(-1, keepdim=True)  # (B, M, 1)
    norm = (align * box_max_iou / (box_max_align + params.eps)).amax(1)  # (B, A)

    return target_labels, target_boxes, norm * fg, fg, gt_idx


def _check_converted(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, topk):
    """What tal_assign reads or converts before csrc/tal_assign.c sees it (shapes it reshapes by, dtypes it
    casts from, num_classes and topk, which C never receives as such); TypeError/ValueError naming it."""
    for name, t in (("scores", scores), ("pred_boxes", pred_boxes), ("points", points), ("gt_labels", gt_labels),
                    ("gt_boxes", gt_boxes), ("gt_mask", gt_mask)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tal_assign: {name} must be a torch.Tensor, got {type(t).__name__}")
    if scores.ndim != 3:
        raise ValueError(f"tal_assign: scores must be (B, A, NC), got {tuple(scores.shape)}")
    B, A, NC = scores.shape
    for name, t in (("scores", scores), ("pred_boxes", pred_boxes), ("points", points)):
        if not t.dtype.is_floating_point:
            raise TypeError(f"tal_assign: {name} must be a float tensor, got {t.dtype}")
    if gt_boxes.ndim != 3 or gt_boxes.shape[0] != B or gt_boxes.shape[2] != 4 or not gt_boxes.dtype.is_floating_point:
        raise ValueError(f"tal_assign: gt_boxes must be float (B, M, 4) with B = {B}, got "
                         f"{tuple(gt_boxes.shape)} {gt_boxes.dtype}")
    M = gt_boxes.shape[1]
    if gt_labels.numel() != B * M or gt_labels.ndim not in (2, 3) or tuple(gt_labels.shape[:2]) != (B, M):
        raise ValueError(f"tal_assign: gt_labels must be (B, M, 1) = ({B}, {M}, 1), got {tuple(gt_labels.shape)}")
    if gt_mask.numel() != B * M or gt_mask.ndim not in (2, 3) or tuple(gt_mask.shape[:2]) != (B, M):
        raise ValueError(f"tal_assign: gt_mask must be (B, M, 1) = ({B}, {M}, 1), got {tuple(gt_mask.shape)}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes != NC:
        raise ValueError(f"tal_assign: num_classes must be the int NC = {NC} of scores, got {num_classes!r}")
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"tal_assign: topk must be an int >= 1, got {topk!r}")


def _check(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, topk):
    """The reference path's checks: _check_converted's, then the devices and the shapes C checks on its path."""
    _check_converted(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, topk)
    B, A, _ = scores.shape
    for name, t in (("pred_boxes", pred_boxes), ("points", points), ("gt_labels", gt_labels),
                    ("gt_boxes", gt_boxes), ("gt_mask", gt_mask)):
        if t.device != scores.device:
            raise ValueError(f"tal_assign: {name} is on {t.device} but scores is on {scores.device}")
    if tuple(pred_boxes.shape) != (B, A, 4):
        raise ValueError(f"tal_assign: pred_boxes must be float (B, A, 4) = ({B}, {A}, 4), got "
                         f"{tuple(pred_boxes.shape)} {pred_boxes.dtype}")
    if tuple(points.shape) != (A, 2):
        raise ValueError(f"tal_assign: points must be float (A, 2) = ({A}, 2), got {tuple(points.shape)} "
                         f"{points.dtype}")


@torch.no_grad()
def tal_assign_reference(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes,
                         params=AssignParams(), logits=False):
    """assign() with tal_assign's signature and outputs ((B, M, A) intermediates)."""
    params = AssignParams(*params)
    _check(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, params.topk)
    scores = scores.detach()
    if logits:
        scores = scores.sigmoid()
    labels, boxes, norm, fg, gt_idx = assign(scores, pred_boxes.detach(), points.detach(), gt_labels.detach(),
                                             gt_boxes.detach(), gt_mask.detach(), num_classes, params)
    if gt_boxes.shape[1] == 0:
        boxes = torch.zeros(pred_boxes.shape, dtype=gt_boxes.dtype, device=gt_boxes.device)
    norm_dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    return labels, boxes, norm.to(norm_dtype), fg, gt_idx


def _use_reference(scores, pred_boxes, gt_boxes, topk):
    if topk > MAX_TOPK:
        return True
    if gt_boxes.dtype != torch.float32 or pred_boxes.dtype == torch.float64:
        return True  # the C maths is the reference's float32 arithmetic
    if scores.device.type == "cuda" and scores.dtype == torch.float64:
        return True
    return scores.device.type not in ("cpu", "cuda")


@torch.no_grad()
def tal_assign(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, params=AssignParams(),
               logits=False):
    """Task-aligned assignment with O(B·A + B·M·topk) working memory; see the module docstring."""
    params = AssignParams(*params)
    topk = params.topk
    if not extension.fused_enabled():
        return tal_assign_reference(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, params,
                                    logits)
    _check_converted(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, topk)
    B, A, NC = scores.shape
    M = gt_boxes.shape[1]
    device = scores.device
    if _use_reference(scores, pred_boxes, gt_boxes, topk):
        return tal_assign_reference(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, params,
                                    logits)
    norm_dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    if M == 0:  # nothing reaches C: the reference path's checks (shapes, devices) instead
        _check(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, topk)
        return (torch.full((B, A), num_classes, dtype=torch.int64, device=device),
                torch.zeros((B, A, 4), dtype=gt_boxes.dtype, device=device),
                torch.zeros((B, A), dtype=norm_dtype, device=device),
                torch.zeros((B, A), dtype=torch.bool, device=device),
                torch.zeros((B, A), dtype=torch.int64, device=device))

    C = extension.load()
    cuda = device.type == "cuda"
    score_dtype = scores.dtype  # the dtype the reference's sigmoid and pow round to
    scores = scores.detach()
    if scores.dtype == torch.bfloat16 and not cuda:
        scores = scores.float()  # csrc/tal_assign.c takes no CPU bfloat16; C rounds to it where the reference does
    pred_boxes = pred_boxes.detach().float().contiguous()
    points = points.detach().float().contiguous()
    labels = gt_labels.detach().reshape(B, M).long().contiguous()
    mask = gt_mask.detach().reshape(B, M).bool().contiguous()
    gt = gt_boxes.detach().contiguous()

    target_labels = torch.empty((B, A), dtype=torch.int64, device=device)
    target_boxes = torch.empty((B, A, 4), dtype=torch.float32, device=device)
    target_norm = torch.empty((B, A), dtype=norm_dtype, device=device)
    fg = torch.empty((B, A), dtype=torch.bool, device=device)
    gt_idx = torch.empty((B, A), dtype=torch.int64, device=device)
    workspace = torch.empty(C.tal_assign_workspace_size(B, M, A, topk, cuda), dtype=torch.uint8, device=device)
    targets = (target_labels, target_boxes, target_norm, fg, gt_idx)
    C.tal_assign_forward(scores, pred_boxes, points, (labels, gt, mask),
                         (int(topk), float(params.alpha), float(params.beta), float(params.eps)), bool(logits),
                         extension.dtype_code(score_dtype), workspace, targets, extension.stream_of(device))
    return target_labels, target_boxes, target_norm, fg, gt_idx
