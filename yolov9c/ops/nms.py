"""Class-aware non-maximum suppression: `nms()` (C/CUDA through yolov9c._C) and `nms_reference()` (stock torch).

Semantics (torchvision's `batched_nms`, made exact and deterministic):
    boxes   (N, 4) xyxy, float32 / float16 / bfloat16 (float64 is computed in float32)
    scores  (N,) the same dtype as boxes
    classes (N,) any integer dtype, or None (one class): different classes never suppress each other
    returns LongTensor (K,) of kept indices, by score descending, ties by lower index, NaN scores first;
            on the inputs' device.
A box is suppressed by a higher-ranked kept box of its class when IoU > iou_thres (strictly). IoU is float32
in one fixed operation order (csrc/nms_ref.c) in the reference, C and CUDA, so all three keep the same indices.
Dispatch: CUDA -> kernels/nms.cu, CPU -> csrc/nms_ref.c; YOLOV9C_FUSED=0 (read at call time) -> nms_reference.
No gradient (inputs are detached). Argument checks: csrc/nms.c on the fused path, _check on the reference path.
Test: python -m pytest -q tests/ops/test_nms.py; speed: python benchmarks/bench_nms.py
"""

import math
import numbers

import torch

from yolov9c.ops import extension

_FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check(boxes, scores, iou_thres, classes):
    """Raise TypeError/ValueError naming the bad argument."""
    if not isinstance(boxes, torch.Tensor):
        raise TypeError(f"nms: boxes must be a torch.Tensor, got {type(boxes).__name__}")
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"nms: scores must be a torch.Tensor, got {type(scores).__name__}")
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"nms: boxes must have shape (N, 4), got {tuple(boxes.shape)}")
    if boxes.dtype not in _FLOAT_TYPES:
        raise TypeError(f"nms: boxes must be float32, float16 or bfloat16, got {boxes.dtype}")
    if scores.ndim != 1 or scores.shape[0] != boxes.shape[0]:
        raise ValueError(f"nms: scores must have shape ({boxes.shape[0]},) to match boxes, got {tuple(scores.shape)}")
    if scores.dtype != boxes.dtype:
        raise TypeError(f"nms: scores must have the dtype of boxes ({boxes.dtype}), got {scores.dtype}")
    if scores.device != boxes.device:
        raise ValueError(f"nms: scores is on {scores.device} but boxes is on {boxes.device}")
    if classes is not None:
        if not isinstance(classes, torch.Tensor):
            raise TypeError(f"nms: classes must be a torch.Tensor or None, got {type(classes).__name__}")
        if classes.ndim != 1 or classes.shape[0] != boxes.shape[0]:
            raise ValueError(f"nms: classes must have shape ({boxes.shape[0]},) to match boxes, "
                             f"got {tuple(classes.shape)}")
        if classes.dtype.is_floating_point or classes.dtype.is_complex or classes.dtype == torch.bool:
            raise TypeError(f"nms: classes must be an integer tensor, got {classes.dtype}")
        if classes.device != boxes.device:
            raise ValueError(f"nms: classes is on {classes.device} but boxes is on {boxes.device}")
    if isinstance(iou_thres, bool) or not isinstance(iou_thres, numbers.Real):
        raise TypeError(f"nms: iou_thres must be a float, got {type(iou_thres).__name__}")
    if math.isnan(iou_thres):
        raise ValueError("nms: iou_thres must not be NaN")


def _check_converted(boxes, scores, classes):
    """What nms() reads or converts before csrc/nms.c sees it; every other check is C's."""
    for name, t in (("boxes", boxes), ("scores", scores)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"nms: {name} must be a torch.Tensor, got {type(t).__name__}")
    if classes is not None:
        if not isinstance(classes, torch.Tensor):
            raise TypeError(f"nms: classes must be a torch.Tensor or None, got {type(classes).__name__}")
        if classes.dtype.is_floating_point or classes.dtype.is_complex or classes.dtype == torch.bool:
            raise TypeError(f"nms: classes must be an integer tensor, got {classes.dtype}")
    if boxes.dtype in (torch.float64, torch.bfloat16) and scores.dtype != boxes.dtype:
        raise TypeError(f"nms: scores must have the dtype of boxes ({boxes.dtype}), got {scores.dtype}")


def nms(boxes, scores, iou_thres, classes=None):
    """Class-aware NMS; see the module docstring. Returns LongTensor (K,) on the inputs' device."""
    if not extension.fused_enabled():
        return nms_reference(boxes, scores, iou_thres, classes)
    _check_converted(boxes, scores, classes)
    device = boxes.device
    n = boxes.shape[0]
    if n == 0 and boxes.shape == (0, 4) and scores.shape == (0,) and (classes is None or classes.shape == (0,)):
        return torch.empty(0, dtype=torch.int64, device=device)

    C = extension.load()
    boxes, scores = boxes.detach(), scores.detach()
    cuda = device.type == "cuda"
    # The kernels read float32/float16 (and bfloat16 on CUDA); upcasting is exact, and float64 is documented
    # as computed in float32. csrc/nms.c takes no CPU bfloat16, hence the CPU upcast.
    if boxes.dtype == torch.float64 or (boxes.dtype == torch.bfloat16 and not cuda):
        boxes, scores = boxes.float(), scores.float()
    boxes, scores = boxes.contiguous(), scores.contiguous()
    if classes is not None:
        classes = classes.detach()
        if classes.dtype not in (torch.int32, torch.int64):
            classes = classes.long()
        classes = classes.contiguous()

    workspace = torch.empty(C.nms_workspace_size(n, cuda), dtype=torch.uint8, device=device)
    keep = torch.empty(n, dtype=torch.int64, device=device)
    count = torch.zeros(1, dtype=torch.int64, device=device)
    C.nms_forward(boxes, scores, classes, iou_thres, workspace, keep, count, extension.stream_of(device))
    # The kept count is data-dependent: reading it is the one host synchronisation (torchvision has it too).
    return keep[: int(count.item())]


def _max(a, b):
    # a > b ? a : b, operation for operation as the C and CUDA code (differs from torch.maximum on NaN).
    return torch.where(a > b, a, b)


def _min(a, b):
    return torch.where(a < b, a, b)


def nms_reference(boxes, scores, iou_thres, classes=None):
    """The same NMS from stock torch ops (greedy, one iteration per kept box). Same arguments and result
    as `nms`; float32 arithmetic in the order stated in csrc/nms_ref.c."""
    _check(boxes, scores, iou_thres, classes)
    device = boxes.device
    n = boxes.shape[0]
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    # Stable descending sort: equal scores keep index order; torch puts NaN first and treats -0 == +0.
    order = torch.sort(scores.detach().float(), descending=True, stable=True).indices
    b = boxes.detach().float()[order]
    x1, y1, x2, y2 = (b[:, k].contiguous() for k in range(4))
    area = (x2 - x1) * (y2 - y1)
    cls = classes.detach()[order].long() if classes is not None else torch.zeros(n, dtype=torch.int64, device=device)
    thr = torch.tensor(iou_thres, dtype=torch.float32, device=device)

    kept = []
    remaining = torch.arange(n, device=device)
    while remaining.numel() > 0:
        r, rest = remaining[0], remaining[1:]
        kept.append(r)
        iw = _min(x2[r], x2[rest]) - _max(x1[r], x1[rest])
        ih = _min(y2[r], y2[rest]) - _max(y1[r], y1[rest])
        iw = torch.where(iw > 0, iw, 0.0)
        ih = torch.where(ih > 0, ih, 0.0)
        inter = iw * ih
        iou = inter / ((area[r] + area[rest]) - inter)
        suppressed = (cls[rest] == cls[r]) & (iou > thr)
        remaining = rest[~suppressed]
    return order[torch.stack(kept)]
