"""Task-aligned label assignment without (B, M, A) tensors: `tal_assign()` (C/CUDA through yolov9c._C) and
`tal_assign_reference()` (the torch TaskAlignedAssigner of yolov9c/loss/assigner.py, spec §4.3).

    tal_assign(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, topk=10, alpha=0.5,
               beta=6.0, eps=1e-9, logits=False)
        scores     (B, A, NC) float32/float16/bfloat16 (float64 too), any strides: a permuted view of a
                   (B, NC, A) head tensor is read in place; logits=True applies the sigmoid on read (in the
                   scores' dtype, as `scores.sigmoid()` would)
        pred_boxes (B, A, 4) predicted xyxy in pixels, float32 (or float16)
        points     (A, 2) anchor centres in pixels
        gt_labels  (B, M, 1) class ids (float or int); gt_boxes (B, M, 4) xyxy pixels;
        gt_mask    (B, M, 1) bool/float, 1 for real boxes, 0 for padding rows
    returns (target_labels (B, A) int64, target_boxes (B, A, 4) dtype of gt_boxes, target_norm (B, A) float32
             (float64 when scores are float64, the reference's metric dtype), fg_mask (B, A) bool,
             target_gt_idx (B, A) int64)
    target_norm is the normalised alignment of a foreground anchor (0 for background): the reference's
    target_scores == expand_target_scores(target_labels, target_norm, num_classes). Background anchors get
    box 0's label and box, gt_idx 0; with M == 0 every label is num_classes and every box 0.

Ties in the top-k resolve by lower anchor index in both (see yolov9c/loss/assigner.py::topk_mask). The
C/CUDA maths is stated at the top of csrc/tal_assign_ref.c; it equals the reference's fp32 arithmetic
operation for operation except that atan, pow and exp are evaluated in float64 and rounded (torch's float32
versions differ from the correctly rounded value by an ulp at times), so an assignment can differ from the
reference only where two candidates' metrics lie within an ulp or two of each other.

Dispatch: YOLOV9C_FUSED=0 -> reference; CPU -> csrc/tal_assign_ref.c through NumPy (bfloat16 scores are
upcast, the rounding of the reference's bfloat16 arithmetic is kept); CUDA -> kernels/tal_assign.cu on the
current stream. gt_boxes that are not float32, float64 pred boxes, float64 scores on CUDA and topk > 32 go to
the reference. No autograd: everything runs under no_grad on detached inputs.
Test: python -m pytest -q tests/test_tal_assign.py
"""


import torch

from yolov9c.loss.assigner import TaskAlignedAssigner
from yolov9c.ops import extension

MAX_TOPK = 32  # the kernels keep each box's candidate list in registers and shared memory


def expand_target_scores(target_labels, target_norm, num_classes):
    """(B, A, NC) soft class targets of the reference: one_hot(target_labels) · target_norm[..., None].

    Labels >= num_classes (background with M == 0) give an all-zero row."""
    B, A = target_labels.shape
    out = torch.zeros((B, A, num_classes), dtype=target_norm.dtype, device=target_norm.device)
    ok = target_labels < num_classes
    out.scatter_(-1, torch.where(ok, target_labels, 0)[..., None], (target_norm * ok)[..., None])
    return out


def _check(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, topk):
    for name, t in (("scores", scores), ("pred_boxes", pred_boxes), ("points", points), ("gt_labels", gt_labels),
                    ("gt_boxes", gt_boxes), ("gt_mask", gt_mask)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tal_assign: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != scores.device:
            raise ValueError(f"tal_assign: {name} is on {t.device} but scores is on {scores.device}")
    if scores.ndim != 3:
        raise ValueError(f"tal_assign: scores must be (B, A, NC), got {tuple(scores.shape)}")
    B, A, NC = scores.shape
    if not scores.dtype.is_floating_point:
        raise TypeError(f"tal_assign: scores must be a float tensor, got {scores.dtype}")
    if tuple(pred_boxes.shape) != (B, A, 4) or not pred_boxes.dtype.is_floating_point:
        raise ValueError(f"tal_assign: pred_boxes must be float (B, A, 4) = ({B}, {A}, 4), got "
                         f"{tuple(pred_boxes.shape)} {pred_boxes.dtype}")
    if tuple(points.shape) != (A, 2) or not points.dtype.is_floating_point:
        raise ValueError(f"tal_assign: points must be float (A, 2) = ({A}, 2), got {tuple(points.shape)} {points.dtype}")
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


@torch.no_grad()
def tal_assign_reference(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, topk=10,
                         alpha=0.5, beta=6.0, eps=1e-9, logits=False):
    """The torch TaskAlignedAssigner with tal_assign's signature and outputs ((B, M, A) intermediates)."""
    _check(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, topk)
    scores = scores.detach()
    if logits:
        scores = scores.sigmoid()
    assigner = TaskAlignedAssigner(num_classes, topk=topk, alpha=alpha, beta=beta, eps=eps)
    labels, boxes, norm, fg, gt_idx = assigner.assign(scores, pred_boxes.detach(), points.detach(),
                                                      gt_labels.detach(), gt_boxes.detach(), gt_mask.detach())
    if gt_boxes.shape[1] == 0:
        boxes = torch.zeros(pred_boxes.shape, dtype=gt_boxes.dtype, device=gt_boxes.device)
    norm_dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    return labels, boxes, norm.to(norm_dtype), fg, gt_idx


def _use_reference(scores, pred_boxes, gt_boxes, topk):
    if not extension.fused_enabled() or topk > MAX_TOPK:
        return True
    if gt_boxes.dtype != torch.float32 or pred_boxes.dtype == torch.float64:
        return True  # the C maths is the reference's float32 arithmetic
    if scores.device.type == "cuda" and scores.dtype == torch.float64:
        return True
    return scores.device.type not in ("cpu", "cuda")


@torch.no_grad()
def tal_assign(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, topk=10, alpha=0.5,
               beta=6.0, eps=1e-9, logits=False):
    """Task-aligned assignment with O(B·A + B·M·topk) working memory; see the module docstring."""
    _check(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, topk)
    B, A, NC = scores.shape
    M = gt_boxes.shape[1]
    device = scores.device
    if _use_reference(scores, pred_boxes, gt_boxes, topk):
        return tal_assign_reference(scores, pred_boxes, points, gt_labels, gt_boxes, gt_mask, num_classes, topk,
                                    alpha, beta, eps, logits)
    norm_dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    if M == 0:
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
        scores = scores.float()  # NumPy has no bfloat16; the C code rounds to bfloat16 where the reference does
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
    a = extension.arg
    C.tal_assign_forward(a(scores), a(pred_boxes), a(points), (a(labels), a(gt), a(mask)),
                         (int(topk), float(alpha), float(beta), float(eps)), bool(logits),
                         extension.dtype_code(score_dtype), a(workspace),
                         (a(target_labels), a(target_boxes), a(target_norm), a(fg), a(gt_idx)),
                         extension.stream_of(device))
    return target_labels, target_boxes, target_norm, fg, gt_idx
