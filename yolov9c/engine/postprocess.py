"""Detection post-processing: raw head output (B, 4+nc, A) → per-image boxes after non-maximum suppression.

Published behaviour (non_max_suppression): no objectness column; an anchor is a candidate when its best class score
is above conf_thres; with multi_label (and nc > 1) every (anchor, class) pair above conf_thres is a
candidate; candidates are sorted by score and at most 30 000 are kept; class-aware NMS (agnostic: all boxes
one class) through yolov9c.ops.nms; at most max_det detections per image. A time limit per call (the
published one is 2.5 s + 0.05 s × batch) stops processing the remaining images with a warning; here it is
opt-in (time_limit=None, the default, means no limit) because a limit makes results depend on machine
speed. `published_time_limit(batch)` gives the published figure for callers that want it.

Test: python -m pytest -q tests/engine/test_val_postprocess.py
"""

import time
import warnings

import torch

from yolov9c.geometry import xywh_to_xyxy

MAX_CANDIDATES = 30000  # published cap on boxes entering NMS per image
MAX_WH = 7680  # published class-offset size; kept only for documentation: ops.nms is class-aware natively


def published_time_limit(batch_size):
    """Seconds the published NMS allows per call for a batch of `batch_size` images."""
    return 2.5 + 0.05 * int(batch_size)


def _main_output(pred):
    """Accept the published forms: a tensor, (y, x) eval tuples, and DualDDetect's [y_aux, y_main]."""
    while isinstance(pred, (list, tuple)):
        if len(pred) == 2 and isinstance(pred[0], (list, tuple)):  # ([y_aux, y_main], maps)
            pred = pred[0]
        elif len(pred) == 2 and all(isinstance(p, torch.Tensor) and p.ndim == 3 for p in pred):
            pred = pred[1]  # [y_aux, y_main]: main head
        else:
            pred = pred[0]  # (y, maps)
    return pred


def non_max_suppression(pred, conf_thres=0.25, iou_thres=0.45, classes=None, agnostic=False, multi_label=False,
                        max_det=300, time_limit=None, labels=None):
    """NMS over a batch of raw predictions.

    pred: (B, 4+nc, A) float tensor, rows 0-3 xywh pixel boxes, rows 4.. per-class sigmoid scores (the main
    head's eval output; the published tuple/list forms are accepted and the main head taken).
    classes: None or an iterable of class ids to keep. agnostic: suppress across classes.
    multi_label: one candidate per (anchor, class) above conf_thres (ignored when nc == 1).
    time_limit: None (no limit) or seconds for the whole call; on expiry a warning is issued and the
    remaining images get no detections (as published).
    labels: None, or per image a (n, 5) tensor [cls, xc, yc, w, h] in pixels added as candidates with score 1
    (val --save-hybrid, published "autolabelling").
    Returns a list of B tensors (n, 6) [x1, y1, x2, y2, conf, cls] in pred's dtype and device, by conf
    descending."""
    if not 0 <= conf_thres <= 1:
        raise ValueError(f"conf_thres must be in [0, 1], got {conf_thres}")
    if not 0 <= iou_thres <= 1:
        raise ValueError(f"iou_thres must be in [0, 1], got {iou_thres}")
    from yolov9c.ops.nms import nms

    pred = _main_output(pred)
    if not isinstance(pred, torch.Tensor) or pred.ndim != 3 or pred.shape[1] < 5:
        raise ValueError(f"pred must be a (B, 4+nc, A) tensor, got {getattr(pred, 'shape', type(pred))}")
    bs, nc = pred.shape[0], pred.shape[1] - 4
    multi_label = multi_label and nc > 1
    keep_cls = None if classes is None else torch.as_tensor(list(classes), device=pred.device)
    out = [torch.zeros((0, 6), dtype=pred.dtype, device=pred.device) for _ in range(bs)]
    start = time.time()
    for i in range(bs):
        x = pred[i].transpose(0, 1)  # (A, 4+nc)
        scores = x[:, 4:]
        if labels is not None and len(labels[i]):
            lb = labels[i].to(x)
            extra = torch.zeros((lb.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
            extra[:, :4] = lb[:, 1:5]
            extra[torch.arange(lb.shape[0]), lb[:, 0].long() + 4] = 1.0
            x = torch.cat((x, extra), 0)
            scores = x[:, 4:]
        x = x[scores.amax(1) > conf_thres]
        if not x.shape[0]:
            continue
        box = xywh_to_xyxy(x[:, :4])
        cls_scores = x[:, 4:]
        if multi_label:
            a, c = (cls_scores > conf_thres).nonzero(as_tuple=True)
            det = torch.cat((box[a], cls_scores[a, c, None], c[:, None].to(x.dtype)), 1)
        else:
            conf, c = cls_scores.max(1, keepdim=True)
            det = torch.cat((box, conf, c.to(x.dtype)), 1)[conf.view(-1) > conf_thres]
        if keep_cls is not None:
            det = det[(det[:, 5:6] == keep_cls.to(det.dtype)).any(1)]
        if not det.shape[0]:
            continue
        # stable sort: equal scores keep anchor order, so the result does not depend on the sort backend
        det = det[det[:, 4].argsort(descending=True, stable=True)[:MAX_CANDIDATES]]
        cls_ids = None if agnostic else det[:, 5].long()
        kept = nms(det[:, :4].contiguous(), det[:, 4].contiguous(), float(iou_thres), cls_ids)
        out[i] = det[kept[:max_det]]
        if time_limit is not None and time.time() - start > time_limit:
            warnings.warn(f"NMS time limit {time_limit:.3f}s exceeded; the remaining {bs - i - 1} image(s) "
                          f"of this batch get no detections (published behaviour)", stacklevel=2)
            break
    return out
