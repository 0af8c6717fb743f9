"""TaskAlignedAssigner: which anchors learn which ground-truth box (spec/yolov9-reference.md §4.3).

Torch reference with (B, M, A) intermediates (B images, M boxes per image after padding, A anchors). It gives
the same assignment as the published assigner but avoids its widest temporaries: the in-box test keeps a
running minimum instead of a (B, M, A, 4) delta tensor, the top-k selection is a threshold at each box's k-th
value instead of a (B, M, topk, A) int64 one-hot, and the class one-hot is never materialised. Ties in the
top-k resolve by lower anchor index (see topk_mask). `assign()` gives the same assignment without the
(B, A, NC) target scores (used by yolov9c/ops/tal_assign.py, the C/CUDA assigner without (B, M, A) tensors).

Test: python -m pytest -q tests/test_loss.py -k assign
"""

import torch

from yolov9c.geometry import anchors_in_boxes, bbox_ciou


def topk_mask(metric, topk, valid_gt):
    """Per box, the `topk` anchors with the largest metric, as a bool (B, M, A) mask.

    metric: (B, M, A) float; valid_gt: bool (B, M). Rows of padding boxes select nothing. Reproduces the
    published rule "an anchor hit more than once in a row is dropped": top-k indices of a row are distinct,
    so only a padding row (all indices replaced by 0) can hit an anchor twice, and such rows are empty here.

    Ties: equal metric values rank by lower anchor index first (what torch's CUDA top-k does; its CPU top-k
    picks among tied values by heap/introselect order). Ties happen in practice at 0: a box with fewer than
    topk anchors of nonzero metric inside fills its list with zero-metric anchors, and those that are inside
    the box (score 0 or CIoU <= 0) become positives. Deterministic here so that the C/CUDA assigner
    (yolov9c/ops/tal_assign.py) can give the same result; without ties it is torch.topk's selection.
    """
    k = min(topk, metric.shape[-1])
    kth = metric.topk(k, dim=-1, largest=True).values[..., -1:]  # (B, M, 1) the k-th largest value
    above = metric > kth
    tied = metric == kth
    room = k - above.sum(-1, keepdim=True, dtype=torch.int32)  # slots left for the tied values (>= 1)
    first_tied = tied.to(torch.int32).cumsum_(-1) <= room
    return (above | (tied & first_tied)) & valid_gt[..., None]


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
        B, A, NC = scores.shape
        M = gt_boxes.shape[1]
        device = scores.device
        if M == 0:
            return (
                torch.full((B, A), self.num_classes, dtype=torch.long, device=device),
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
        align = cls_scores.pow(self.alpha) * overlaps.pow(self.beta)

        # 4-6: candidates = top-k of the metric among anchors strictly inside the box, real boxes only
        inside = anchors_in_boxes(points, gt_boxes)
        pos = topk_mask(align * inside, self.topk, valid_gt) & inside

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
        norm = (align * box_max_iou / (box_max_align + self.eps)).amax(1)  # (B, A)

        return target_labels, target_boxes, norm * fg, fg, gt_idx
