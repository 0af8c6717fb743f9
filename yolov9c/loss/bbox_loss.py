"""Box regression terms of the YOLOv9 loss: CIoU loss and Distribution Focal Loss (published BboxLoss).

Both are sums over foreground anchors weighted by the anchor's soft target score, divided by the batch's
target_scores_sum. Inputs are in grid units (boxes ÷ stride), as the published loss does. The maths is
yolov9c/ops/det_loss.py's (box_terms, dfl_loss: the reference of the fused loss); BboxLoss holds reg_max.

Test: python -m pytest -q tests/loss/test_loss.py -k "bbox or dfl"
"""

from yolov9c.ops.det_loss import box_terms, dfl_loss, dfl_max_dist  # noqa: F401 (dfl_loss re-exported)


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
        self.max_dist = dfl_max_dist(reg_max)

    def __call__(self, pred_dist, pred_boxes, points, target_boxes, target_scores, target_scores_sum, fg_mask):
        return box_terms(pred_dist, pred_boxes, points, target_boxes, target_scores, target_scores_sum, fg_mask,
                         self.reg_max)
