"""Box regression terms of the YOLOv9 loss: CIoU loss and Distribution Focal Loss (spec §4.4).

Both are sums over foreground anchors weighted by the anchor's soft target score, divided by the batch's
target_scores_sum. Inputs are in grid units (boxes ÷ stride), as the published loss does.

Test: python -m pytest -q tests/test_loss.py -k "bbox or dfl"
"""

import torch
import torch.nn.functional as F

from yolov9c.geometry import bbox2dist, bbox_ciou


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


class BboxLoss:
    """CIoU + DFL terms for one head branch.

    reg_max: number of DFL bins per side (16). Call with
        pred_dist (B, A, 4·reg_max) logits; pred_boxes (B, A, 4) decoded xyxy (grid units);
        points (A, 2) anchor points (grid units); target_boxes (B, A, 4) xyxy (grid units);
        target_scores (B, A, NC); target_scores_sum (0-dim tensor or number, ≥ 1); fg_mask (B, A) bool.
    Returns (loss_iou, loss_dfl) 0-dim tensors:
        loss_iou = Σ_fg (1 − CIoU)·w / target_scores_sum,  loss_dfl = Σ_fg DFL·w / target_scores_sum,
    with w = Σ_classes target_scores of the anchor. Foreground rows of fp16/bf16 predictions are promoted to
    float32 before the CIoU and the log-softmax (the rows are few, so this costs no memory to speak of).
    """

    def __init__(self, reg_max=16):
        self.reg_max = reg_max
        self.max_dist = (reg_max - 1) - 0.01  # 14.99: keeps the right bin ⌊t⌋+1 ≤ reg_max − 1

    def __call__(self, pred_dist, pred_boxes, points, target_boxes, target_scores, target_scores_sum, fg_mask):
        # fp16/bf16 predictions (AMP) are promoted: box widths and log-softmax need more than 11 bits
        cdt = torch.promote_types(pred_dist.dtype, torch.float32)
        weight = target_scores.sum(-1)[fg_mask][:, None]  # (N, 1)
        tbox = target_boxes[fg_mask]  # (N, 4)

        ciou = bbox_ciou(pred_boxes[fg_mask].to(cdt), tbox)[:, None]
        loss_iou = ((1.0 - ciou) * weight).sum() / target_scores_sum

        # the anchor point of each foreground row: fg_mask is (B, A), points (A, 2)
        fg_points = points[None].expand(fg_mask.shape[0], -1, -1)[fg_mask]
        target_ltrb = bbox2dist(fg_points, tbox, self.max_dist)  # (N, 4)
        dist = pred_dist[fg_mask].view(-1, 4, self.reg_max).to(cdt)
        loss_dfl = (dfl_loss(dist, target_ltrb) * weight).sum() / target_scores_sum
        return loss_iou, loss_dfl
