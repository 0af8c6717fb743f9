"""Detection metrics as the published validator computes them: IoU matching, AP, P/R, confusion matrix.

- match_predictions(det, labels, iouv): which detections are true positives at each IoU threshold
  (0.50:0.05:0.95), class-matched, one detection per label.
- ap_per_class(tp, conf, pred_cls, target_cls): per-class AP at each threshold (COCO 101-point interpolation
  of the monotone precision envelope), and P, R, F1 at the confidence maximising the class-mean F1 (F1 curve
  smoothed by a box filter 10 % wide). Classes without labels are left out.
- ConfusionMatrix: (nc+1) × (nc+1) counts [predicted, true], last row/column = background.
- fitness(mp, mr, map50, map) = 0.1·mAP50 + 0.9·mAP50-95.

Test: python -m pytest -q tests/engine/val/test_metrics.py
"""

import numpy as np
import torch

from yolov9c.geometry import box_iou

IOU_THRESHOLDS = torch.linspace(0.5, 0.95, 10)  # mAP@0.5:0.95
EPS = 1e-16


def fitness(mp, mr, map50, map5095):
    """Scalar used for best.pt and early stopping: 0.1·mAP@0.5 + 0.9·mAP@0.5:0.95 (P and R weigh 0)."""
    del mp, mr
    return 0.1 * float(map50) + 0.9 * float(map5095)


def _unique_pairs(label_idx, det_idx, iou):
    """Published greedy uniqueness for the candidate pairs of one threshold (numpy arrays of equal length).

    Pairs are ranked by IoU (highest first); each detection keeps its best pair; then, among what is left,
    each label keeps the pair with the *lowest detection index* — the published code re-orders by detection
    index between the two steps, and since NMS output is sorted by confidence this prefers the most
    confident detection. Returns the kept detection indices."""
    order = np.argsort(-iou, kind="stable")
    label_idx, det_idx = label_idx[order], det_idx[order]
    _, first = np.unique(det_idx, return_index=True)  # best pair per detection, result sorted by det index
    label_idx, det_idx = label_idx[first], det_idx[first]
    _, first = np.unique(label_idx, return_index=True)  # per label: lowest detection index
    return det_idx[first]


def match_predictions(detections, labels, iouv=IOU_THRESHOLDS):
    """True-positive flags of the detections of one image.

    detections: (n, 6) [x1, y1, x2, y2, conf, cls]; labels: (m, 5) [cls, x1, y1, x2, y2] (same pixel frame).
    Returns a bool tensor (n, len(iouv))."""
    correct = np.zeros((detections.shape[0], len(iouv)), dtype=bool)
    if detections.shape[0] and labels.shape[0]:
        iou = box_iou(labels[:, 1:].float(), detections[:, :4].float())
        same_cls = labels[:, 0:1] == detections[:, 5]
        for k, thr in enumerate(iouv.tolist()):
            li, di = torch.where((iou >= thr) & same_cls)
            if li.numel():
                kept = _unique_pairs(li.cpu().numpy(), di.cpu().numpy(), iou[li, di].cpu().numpy())
                correct[kept, k] = True
    return torch.from_numpy(correct).to(detections.device)


def smooth(y, fraction=0.05):
    """Box filter of width ≈ 2·fraction·len(y) (odd), edges padded with the end values."""
    nf = round(len(y) * fraction * 2) // 2 + 1
    half = nf // 2
    padded = np.concatenate((np.full(half, y[0]), y, np.full(half, y[-1])))
    return np.convolve(padded, np.ones(nf) / nf, mode="valid")


def compute_ap(recall, precision):
    """AP of one PR curve: sentinels (recall 0 → precision 1, recall 1 → precision 0), monotone envelope,
    trapezoid over 101 recall points (COCO). Returns (ap, envelope precision, padded recall).

    With the sentinels, a perfect curve (precision 1 up to recall 1) gives 0.995, not 1: the last 0.01
    recall step interpolates down to the sentinel precision 0 — the published figure for perfect boxes."""
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([1.0], precision, [0.0]))
    mpre = np.flip(np.maximum.accumulate(np.flip(mpre)))
    x = np.linspace(0, 1, 101)
    y = np.interp(x, mrec, mpre)
    ap = float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))
    return ap, mpre, mrec


def ap_per_class(tp, conf, pred_cls, target_cls, eps=EPS):
    """Per-class metrics over a whole validation set.

    tp: (n, T) bool, conf: (n,), pred_cls: (n,) — all detections; target_cls: (m,) classes of all labels.
    Returns a dict: classes (k,) int (classes with labels), ap (k, T), p, r, f1 (k,) at the confidence
    maximising the smoothed mean F1, tp_count/fp_count (k,), and the curves px (1000,), p_curve, r_curve,
    f1_curve (k, 1000) over confidence, pr_curve (k, 1000) precision at recall px (IoU 0.5)."""
    tp, conf = np.asarray(tp, bool).reshape(len(conf), -1), np.asarray(conf, np.float64)
    pred_cls, target_cls = np.asarray(pred_cls).astype(np.int64), np.asarray(target_cls).astype(np.int64)
    order = np.argsort(-conf, kind="stable")
    tp, conf, pred_cls = tp[order], conf[order], pred_cls[order]
    classes, n_labels = np.unique(target_cls, return_counts=True)
    k, t = len(classes), tp.shape[1]
    px = np.linspace(0, 1, 1000)
    ap = np.zeros((k, t))
    p_curve, r_curve, pr_curve = np.zeros((k, 1000)), np.zeros((k, 1000)), np.zeros((k, 1000))
    for ci, c in enumerate(classes):
        sel = pred_cls == c
        if not sel.any():
            continue
        tpc = tp[sel].cumsum(0)
        fpc = (~tp[sel]).cumsum(0)
        recall = tpc / (n_labels[ci] + eps)
        precision = tpc / (tpc + fpc)
        # np.interp needs increasing x: confidence decreases along the list, so negate both
        r_curve[ci] = np.interp(-px, -conf[sel], recall[:, 0], left=0)
        p_curve[ci] = np.interp(-px, -conf[sel], precision[:, 0], left=1)
        for j in range(t):
            ap[ci, j], mpre, mrec = compute_ap(recall[:, j], precision[:, j])
            if j == 0:
                pr_curve[ci] = np.interp(px, mrec, mpre)
    f1_curve = 2 * p_curve * r_curve / (p_curve + r_curve + eps)
    best = int(smooth(f1_curve.mean(0), 0.1).argmax()) if k else 0
    p, r, f1 = p_curve[:, best], r_curve[:, best], f1_curve[:, best]
    tp_count = (r * n_labels).round()
    fp_count = (tp_count / (p + eps) - tp_count).round()
    return {"classes": classes, "ap": ap, "p": p, "r": r, "f1": f1, "tp_count": tp_count, "fp_count": fp_count, "px": px,
                "p_curve": p_curve, "r_curve": r_curve, "f1_curve": f1_curve, "pr_curve": pr_curve, "n_labels": n_labels}


class ConfusionMatrix:
    """Counts matrix[predicted, true] of shape (nc+1, nc+1); index nc = background (missed / spurious).

    Published thresholds: detections below conf 0.25 are ignored; a label and a detection match when their
    IoU > 0.45 (each detection keeps its best label, then each label its best detection)."""

    def __init__(self, nc, conf=0.25, iou_thres=0.45):
        self.nc, self.conf, self.iou_thres = int(nc), conf, iou_thres
        self.matrix = np.zeros((self.nc + 1, self.nc + 1))

    def process_batch(self, detections, labels):
        """detections: (n, 6) [x1, y1, x2, y2, conf, cls] or None; labels: (m, 5) [cls, x1, y1, x2, y2], or
        (m,) classes when detections is None (an image without detections)."""
        if detections is None:
            for c in labels.reshape(-1).long().tolist():
                self.matrix[self.nc, c] += 1
            return
        detections = detections[detections[:, 4] > self.conf]
        gt = labels[:, 0].long().tolist()
        dc = detections[:, 5].long().tolist()
        iou = box_iou(labels[:, 1:].float(), detections[:, :4].float())
        li, di = torch.where(iou > self.iou_thres)
        pairs = {}
        if li.numel():
            v = iou[li, di].cpu().numpy()
            li, di = li.cpu().numpy(), di.cpu().numpy()
            order = np.argsort(-v, kind="stable")  # best label per detection ...
            li, di, v = li[order], di[order], v[order]
            _, first = np.unique(di, return_index=True)
            li, di, v = li[first], di[first], v[first]
            order = np.argsort(-v, kind="stable")  # ... then best of those per label
            li, di = li[order], di[order]
            _, first = np.unique(li, return_index=True)
            pairs = {int(a): int(b) for a, b in zip(li[first], di[first])}
        for i, c in enumerate(gt):
            if i in pairs:
                self.matrix[dc[pairs[i]], c] += 1
            else:
                self.matrix[self.nc, c] += 1  # missed label
        matched = set(pairs.values())
        # published quirk kept: unmatched detections count as background only when some pair matched
        for j, c in enumerate(dc if pairs else []):
            if j not in matched:
                self.matrix[c, self.nc] += 1  # spurious detection

    def tp_fp(self):
        """(tp, fp) per class (nc,), background excluded."""
        tp = self.matrix.diagonal()
        fp = self.matrix.sum(1) - tp
        return tp[:-1], fp[:-1]
