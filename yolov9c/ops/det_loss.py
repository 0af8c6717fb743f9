"""The loss terms of one detection head branch, read straight from the head's level maps: `det_loss()`
(C/CUDA via yolov9c._C, autograd via `_DetLossFunction`), `det_loss_decode()` (the boxes the assigner reads)
and their torch references `det_loss_reference()` / `det_loss_decode_reference()`.

    out = det_loss(maps, strides, target_labels, target_boxes, target_norm, fg_mask, target_scores_sum,
                   reg_max=16, label_smoothing=0.0, pos_weight=1.0)        # (3,) = [box, cls, dfl]
Inputs: maps, nl tensors (B, 4·reg_max + NC, H_l, W_l) float32/16/bf16 (float64 on CPU), any strides; strides nl
floats; targets from tal_assign: labels (B, A) int64, boxes (B, A, 4) xyxy px float32, norm (B, A) float32,
fg_mask (B, A) bool; target_scores_sum a number or 0-dim/(1,) tensor >= 1. Returns (3,) float32 (float64 maps:
float64): box = Σ_fg (1 − CIoU)·norm / tss, cls = Σ BCE(x, t) / tss, dfl = Σ_fg DFL·norm / tss (published).
Invariants: no (B, A, NC) or (B, A, 4·reg_max) tensor; float32 arithmetic with fixed-order partial sums
(deterministic); backward recomputes from the saved maps and (B, A) targets, gradients in the maps' dtype.
Dispatch: CUDA f32/f16/bf16 -> kernels/det_loss.cu; CPU -> csrc/det_loss_ref.c (float64; bf16 via a float32
copy); CUDA float64 and YOLOV9C_FUSED=0 -> reference.
Test: python -m pytest -q tests/ops/test_det_loss.py; speed and memory: python benchmarks/bench_loss.py
"""


import torch
import torch.nn.functional as F

from yolov9c.geometry import bbox2dist, bbox_ciou, dfl_decode, make_anchors
from yolov9c.ops import extension

_FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def dfl_max_dist(reg_max):
    """The DFL target clamp, (reg_max − 1) − 0.01 = 14.99 for 16 bins: keeps the right bin ⌊t⌋+1 ≤ reg_max − 1."""
    return (reg_max - 1) - 0.01


def dfl_loss(pred_dist, target):
    """Distribution Focal Loss per foreground anchor.

    pred_dist: (N, 4, R) logits over R bins for each of the 4 sides; target: (N, 4) distances in [0, R−1).
    With left bin l = ⌊t⌋ and right bin r = l + 1 the loss of a side is
        CE(logits, l)·(r − t) + CE(logits, r)·(t − l),
    i.e. the cross-entropy against the two-bin distribution whose expectation is t. Returns (N, 1): the mean
    over the 4 sides. Computed in the promoted dtype of pred_dist and target.
    """
    left = target.long()
    right = left + 1
    w_left = right.to(target.dtype) - target
    w_right = 1 - w_left
    logp = F.log_softmax(pred_dist, dim=-1)  # CE(logits, k) = −log_softmax(logits)[k]
    ce_left = -logp.gather(-1, left[..., None]).squeeze(-1)
    ce_right = -logp.gather(-1, right[..., None]).squeeze(-1)
    return (ce_left * w_left + ce_right * w_right).mean(-1, keepdim=True)


def box_terms(pred_dist, pred_boxes, points, target_boxes, target_scores, target_scores_sum, fg_mask, reg_max=16):
    """The published CIoU and DFL terms of one branch from stock torch ops (published BboxLoss), in grid units:
    pred_dist (B, A, 4·reg_max) logits; pred_boxes (B, A, 4) decoded xyxy; points (A, 2); target_boxes (B, A, 4)
    xyxy; target_scores (B, A, NC); target_scores_sum (0-dim tensor or number, ≥ 1); fg_mask (B, A) bool.
    Returns (loss_iou, loss_dfl) 0-dim: Σ_fg (1 − CIoU)·w / tss and Σ_fg DFL·w / tss, w = Σ_classes
    target_scores of the anchor; fp16/bf16 foreground rows are promoted to float32 first."""
    # fp16/bf16 predictions (AMP) are promoted: box widths and log-softmax need more than 11 bits
    cdt = torch.promote_types(pred_dist.dtype, torch.float32)
    weight = target_scores.sum(-1)[fg_mask][:, None]  # (N, 1)
    tbox = target_boxes[fg_mask]  # (N, 4)

    ciou = bbox_ciou(pred_boxes[fg_mask].to(cdt), tbox)[:, None]
    loss_iou = ((1.0 - ciou) * weight).sum() / target_scores_sum

    # the anchor point of each foreground row: fg_mask is (B, A), points (A, 2)
    fg_points = points[None].expand(fg_mask.shape[0], -1, -1)[fg_mask]
    target_ltrb = bbox2dist(fg_points, tbox, dfl_max_dist(reg_max))  # (N, 4)
    dist = pred_dist[fg_mask].view(-1, 4, reg_max).to(cdt)
    loss_dfl = (dfl_loss(dist, target_ltrb) * weight).sum() / target_scores_sum
    return loss_iou, loss_dfl


# ----------------------------------------------------------------------------------------------- checks


def _check_maps(maps, strides, reg_max, op):
    if not isinstance(maps, (list, tuple)) or not maps or not all(isinstance(m, torch.Tensor) for m in maps):
        raise TypeError(f"{op}: maps must be a non-empty list of tensors")
    if any(m.ndim != 4 for m in maps):  # their H·W sizes the outputs before C sees them
        raise ValueError(f"{op}: maps must have 4 dimensions, got {[tuple(m.shape) for m in maps]}")
    if len(maps) > 4:
        raise ValueError(f"{op}: at most 4 level maps are supported, got {len(maps)}")
    if not isinstance(strides, (list, tuple)) or len(strides) != len(maps):
        raise ValueError(f"{op}: strides must hold one float per level map ({len(maps)})")
    m0 = maps[0]
    for m in maps:
        if m.ndim != 4 or m.shape[:2] != m0.shape[:2]:
            raise ValueError(f"{op}: every map must be (B, C, H, W) with the first map's B and C, got "
                             f"{tuple(m.shape)} and {tuple(m0.shape)}")
        if m.dtype != m0.dtype or m.dtype not in _FLOAT_TYPES:
            raise TypeError(f"{op}: maps must share one float dtype (float32/float16/bfloat16/float64), got {m.dtype}")
        if m.device != m0.device:
            raise ValueError(f"{op}: maps must be on one device, got {m.device} and {m0.device}")
    if isinstance(reg_max, bool) or not isinstance(reg_max, int) or not 2 <= reg_max <= 64:
        raise ValueError(f"{op}: reg_max must be an int in [2, 64], got {reg_max!r}")
    if m0.shape[1] <= 4 * reg_max:
        raise ValueError(f"{op}: maps have {m0.shape[1]} channels, need 4·reg_max + NC = {4 * reg_max} + NC")


def _check_converted(maps, op, targets=None):
    """What the fused path reads or converts before csrc/det_loss.c sees it: maps a non-empty list of tensors,
    the targets tensors, target_labels (B, A) (its shape sizes the workspace). Every other check is C's."""
    if not isinstance(maps, (list, tuple)) or not maps or not all(isinstance(m, torch.Tensor) for m in maps):
        raise TypeError(f"{op}: maps must be a non-empty list of tensors")
    if any(m.ndim != 4 for m in maps):  # their H·W sizes the outputs before C sees them
        raise ValueError(f"{op}: maps must have 4 dimensions, got {[tuple(m.shape) for m in maps]}")
    for name, t in zip(("target_labels", "target_boxes", "target_norm", "fg_mask"), targets or ()):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a tensor, got {type(t).__name__}")
    if targets and targets[0].ndim != 2:
        raise ValueError(f"{op}: target_labels must be (B, A), got {tuple(targets[0].shape)}")


def _check_targets(maps, target_labels, target_boxes, target_norm, fg_mask):
    B, A = maps[0].shape[0], sum(m.shape[2] * m.shape[3] for m in maps)
    device = maps[0].device
    for name, t, shape in (("target_labels", target_labels, (B, A)), ("target_boxes", target_boxes, (B, A, 4)),
                           ("target_norm", target_norm, (B, A)), ("fg_mask", fg_mask, (B, A))):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"det_loss: {name} must be a tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            raise ValueError(f"det_loss: {name} must have shape {shape}, got {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"det_loss: {name} is on {t.device}, the maps on {device}")
    if target_labels.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"det_loss: target_labels must be int32/int64, got {target_labels.dtype}")
    if fg_mask.dtype != torch.bool:
        raise TypeError(f"det_loss: fg_mask must be bool, got {fg_mask.dtype}")
    if not target_boxes.dtype.is_floating_point or not target_norm.dtype.is_floating_point:
        raise TypeError("det_loss: target_boxes and target_norm must be float tensors")


# ------------------------------------------------------------------------------------------ C/CUDA path


def _targets_for_c(t, cuda):
    """Targets as the kernels read them: contiguous; float32 on CUDA, float32 or float64 on the CPU."""
    if t.dtype.is_floating_point and (cuda or t.dtype != torch.float64):
        t = t.float()
    return t.contiguous()


class _DetLossFunction(torch.autograd.Function):
    """autograd.Function of det_loss. forward(cfg, target_labels, target_boxes, target_norm, fg_mask, tss,
    *maps) with cfg = (strides, reg_max, label_smoothing, pos_weight) -> (3,) [box, cls, dfl].
    Saved for backward: the maps themselves (no copy) and the (B, A)-sized targets; nothing (B, A, C)-sized."""

    @staticmethod
    def forward(ctx, cfg, target_labels, target_boxes, target_norm, fg_mask, tss, *maps):
        strides, reg_max, eps, pos_weight = cfg
        C = extension.load()
        device = maps[0].device
        cuda = device.type == "cuda"
        cmaps = [m.detach() for m in maps]
        if not cuda and cmaps[0].dtype == torch.bfloat16:
            cmaps = [m.float() for m in cmaps]   # csrc/det_loss.c takes no CPU bfloat16: a float32 copy
        acc = torch.float64 if cmaps[0].dtype == torch.float64 else torch.float32
        labels = target_labels.detach().contiguous()
        boxes = _targets_for_c(target_boxes.detach(), cuda)
        norm = _targets_for_c(target_norm.detach(), cuda)
        if boxes.dtype != norm.dtype:   # the C reference reads both in one dtype
            boxes = boxes.to(norm.dtype)
        fg = fg_mask.detach().contiguous()
        tss = tss.detach().to(torch.float32 if cuda else acc).reshape(1).contiguous()
        B, A = labels.shape
        workspace = torch.empty(C.det_loss_workspace_size(B, A, cuda), dtype=torch.uint8, device=device)
        out = torch.empty(3, dtype=acc, device=device)
        C.det_loss_forward(tuple(cmaps), strides, reg_max, (labels, boxes, norm, fg, tss), eps, pos_weight,
                           float(dfl_max_dist(reg_max)), workspace, out, extension.stream_of(device))
        ctx.cfg = cfg
        ctx.save_for_backward(labels, boxes, norm, fg, tss, *maps)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        strides, reg_max, eps, pos_weight = ctx.cfg
        labels, boxes, norm, fg, tss, *maps = ctx.saved_tensors
        C = extension.load()
        device = maps[0].device
        cuda = device.type == "cuda"
        cmaps = [m.detach() for m in maps]
        upcast = not cuda and cmaps[0].dtype == torch.bfloat16
        if upcast:
            cmaps = [m.float() for m in cmaps]
        grads = [torch.empty_like(m) for m in cmaps]
        grad_out = grad_out.to(torch.float32 if cuda else tss.dtype).contiguous()
        C.det_loss_backward(tuple(cmaps), strides, reg_max, (labels, boxes, norm, fg, tss), eps, pos_weight,
                            float(dfl_max_dist(reg_max)), grad_out, tuple(grads), extension.stream_of(device))
        if upcast:
            grads = [g.to(torch.bfloat16) for g in grads]
        return (None, None, None, None, None, None, *grads)


def _tss_tensor(target_scores_sum, like):
    if isinstance(target_scores_sum, torch.Tensor):
        if target_scores_sum.numel() != 1:
            raise ValueError(f"det_loss: target_scores_sum must hold one value, got shape "
                             f"{tuple(target_scores_sum.shape)}")
        return target_scores_sum.detach().reshape(()).to(like.device)
    return torch.tensor(float(target_scores_sum), dtype=torch.float64, device=like.device)


def det_loss(maps, strides, target_labels, target_boxes, target_norm, fg_mask, target_scores_sum, reg_max=16,
             label_smoothing=0.0, pos_weight=1.0):
    """The (3,) loss terms [box, cls, dfl] of one branch; see the module docstring. Argument checks: C's on
    the fused path (_check_converted: what Python reads first), the reference's own on the reference path."""
    if not extension.fused_enabled():
        return det_loss_reference(maps, strides, target_labels, target_boxes, target_norm, fg_mask,
                                  target_scores_sum, reg_max, label_smoothing, pos_weight)
    maps = list(maps) if isinstance(maps, (list, tuple)) else maps
    _check_converted(maps, "det_loss", (target_labels, target_boxes, target_norm, fg_mask))
    tss = _tss_tensor(target_scores_sum, maps[0])
    if maps[0].is_cuda and maps[0].dtype == torch.float64:
        return det_loss_reference(maps, strides, target_labels, target_boxes, target_norm, fg_mask, tss, reg_max,
                                  label_smoothing, pos_weight)
    cfg = (tuple(strides) if isinstance(strides, (list, tuple)) else strides, reg_max, label_smoothing, pos_weight)
    return _DetLossFunction.apply(cfg, target_labels, target_boxes, target_norm, fg_mask, tss, *maps)


@torch.no_grad()
def det_loss_decode(maps, strides, reg_max=16):
    """DFL expectation of every anchor as boxes (B, A, 4) float32 xyxy in pixels, detached: what the assigner
    reads. Computed in float32 on CUDA and in float64 (rounded to float32) on the CPU."""
    if not extension.fused_enabled():
        return det_loss_decode_reference(maps, strides, reg_max)
    maps = list(maps) if isinstance(maps, (list, tuple)) else maps
    _check_converted(maps, "det_loss_decode")
    if maps[0].is_cuda and maps[0].dtype == torch.float64:
        return det_loss_decode_reference(maps, strides, reg_max)
    C = extension.load()
    device = maps[0].device
    cuda = device.type == "cuda"
    cmaps = [m.detach() for m in maps]
    if not cuda and cmaps[0].dtype == torch.bfloat16:
        cmaps = [m.float() for m in cmaps]
    B, A = cmaps[0].shape[0], sum(m.shape[2] * m.shape[3] for m in cmaps)
    boxes = torch.empty((B, A, 4), dtype=torch.float32, device=device)
    C.det_loss_decode(tuple(cmaps), tuple(strides), reg_max, boxes, extension.stream_of(device))
    return boxes


# ------------------------------------------------------------------------------------------- references


def _concat(maps, reg_max):
    """The reference's (B, A, 4·reg_max) DFL logits and (B, A, NC) class logits (permuted copies)."""
    B, C = maps[0].shape[:2]
    pred = torch.cat([m.reshape(B, C, -1) for m in maps], dim=2)
    pred_dist, pred_scores = pred.split((4 * reg_max, C - 4 * reg_max), dim=1)
    return pred_dist.permute(0, 2, 1).contiguous(), pred_scores.permute(0, 2, 1).contiguous()


@torch.no_grad()
def det_loss_decode_reference(maps, strides, reg_max=16):
    """det_loss_decode from stock torch ops, as the published loss decodes (in the maps' dtype), as float32."""
    maps = list(maps) if isinstance(maps, (list, tuple)) else maps
    _check_maps(maps, strides, reg_max, "det_loss_decode")
    points, stride_col = make_anchors(maps, strides, 0.5)
    pred_dist, _ = _concat([m.detach() for m in maps], reg_max)
    return (dfl_decode(pred_dist, points, reg_max) * stride_col).float()


def det_loss_reference(maps, strides, target_labels, target_boxes, target_norm, fg_mask, target_scores_sum,
                       reg_max=16, label_smoothing=0.0, pos_weight=1.0):
    """det_loss from stock torch ops: the published loss_tal_dual.py branch terms (box_terms for CIoU and DFL),
    building the (B, A, NC) target_scores = one_hot(target_labels)·target_norm·fg it never needs in C."""
    maps = list(maps) if isinstance(maps, (list, tuple)) else maps
    _check_maps(maps, strides, reg_max, "det_loss")
    _check_targets(maps, target_labels, target_boxes, target_norm, fg_mask)
    tss = _tss_tensor(target_scores_sum, maps[0])
    points, stride_col = make_anchors(maps, strides, 0.5)
    pred_dist, pred_scores = _concat(maps, reg_max)
    pred_boxes = dfl_decode(pred_dist, points, reg_max)
    nc = pred_scores.shape[-1]
    norm = torch.where(fg_mask, target_norm, torch.zeros((), dtype=target_norm.dtype, device=target_norm.device))
    target_scores = torch.zeros(pred_scores.shape, dtype=target_norm.dtype, device=target_norm.device)
    target_scores.scatter_(-1, target_labels.long().clamp(0, nc - 1)[..., None], norm[..., None])

    cdt = torch.promote_types(pred_scores.dtype, torch.float32)
    targets = target_scores.to(cdt)
    if label_smoothing > 0:
        targets = targets * (1.0 - label_smoothing) + 0.5 * label_smoothing
    pw = torch.tensor([pos_weight], dtype=cdt, device=targets.device)
    tss = tss.to(cdt)
    cls = F.binary_cross_entropy_with_logits(pred_scores.to(cdt), targets, pos_weight=pw, reduction="none").sum() / tss
    if bool(fg_mask.any()):
        box, dfl = box_terms(pred_dist, pred_boxes, points, target_boxes / stride_col, target_scores, tss, fg_mask,
                             reg_max)
    else:
        box = dfl = torch.zeros((), dtype=cdt, device=targets.device)
    return torch.stack((box.to(cdt), cls, dfl.to(cdt)))
