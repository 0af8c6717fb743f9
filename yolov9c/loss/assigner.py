"""TaskAlignedAssigner: which anchors learn which ground-truth box (published utils/tal/assigner.py).

Torch reference with (B, M, A) intermediates (B images, M boxes per image after padding, A anchors). It gives
the same assignment as the published assigner but avoids its widest temporaries: the in-box test keeps a
running minimum instead of a (B, M, A, 4) delta tensor, the top-k selection is a threshold at each box's k-th
value instead of a (B, M, topk, A) int64 one-hot, and the class one-hot is never materialised. Ties in the
top-k resolve by lower anchor index (see topk_mask). The maths lives in yolov9c/ops/tal_assign.py (`assign`,
the reference of the C/CUDA assigner without (B, M, A) tensors): this class holds the parameters and adds the
(B, A, NC) target scores.

Test: python -m pytest -q tests/loss/test_loss.py -k assign
"""

import torch

from yolov9c.ops.tal_assign import AssignParams, assign, topk_mask  # noqa: F401 (topk_mask: the rule, re-exported)


class TaskAlignedAssigner:
    """Task-aligned label assignment (TOOD), parameters topk = 10, alpha = 0.5, beta = 6.0, eps = 1e-9.

    Called without autograd on detached inputs:
        scores (B, A, NC) sigmoid probabilities; boxes (B, A, 4) predicted xyxy in pixels;
        points (A, 2) anchor centres in pixels; gt_labels (B, M, 1) class ids (float or int);
        gt_boxes (B, M, 4) xyxy pixels; gt_mask (B, M, 1) bool/float, 1 for real boxes, 0 for padding.
    Returns
        target_labels (B, A) int64, class of the assigned box (box 0's class for background anchors);
        target_boxes (B, A, 4) xyxy pixels of the assigned box (box 0 for background), dtype of gt_boxes;
        target_scores (B, A, NC) float (dtype of the metric): for a foreground anchor, its box's class
            column holds the normalised alignment, all else 0;
        fg_mask (B, A) bool.
    """

    def __init__(self, num_classes, topk=10, alpha=0.5, beta=6.0, eps=1e-9):
        self.num_classes = num_classes
        self.topk = topk
        self.alpha = alpha
        self.beta = beta
        self.eps = eps

    @torch.no_grad()
    def __call__(self, scores, boxes, points, gt_labels, gt_boxes, gt_mask):
        target_labels, target_boxes, norm, fg, _ = self.assign(scores, boxes, points, gt_labels, gt_boxes, gt_mask)
        B, A, NC = scores.shape
        target_scores = torch.zeros((B, A, NC), dtype=norm.dtype, device=scores.device)
        if gt_boxes.shape[1] > 0:
            target_scores.scatter_(-1, target_labels[..., None], norm[..., None])
        return target_labels, target_boxes, target_scores, fg

    @torch.no_grad()
    def assign(self, scores, boxes, points, gt_labels, gt_boxes, gt_mask):
        """The assignment without the (B, A, NC) target scores: (target_labels, target_boxes, norm, fg,
        gt_idx). norm (B, A) is the normalised alignment of a foreground anchor (0 for background; dtype of
        the metric), so target_scores = one_hot(target_labels) · norm[..., None]; gt_idx (B, A) int64 is the
        assigned box's row (0 for background)."""
        return assign(scores, boxes, points, gt_labels, gt_boxes, gt_mask, self.num_classes,
                      AssignParams(self.topk, self.alpha, self.beta, self.eps))
