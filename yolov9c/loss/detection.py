"""The YOLOv9 detection losses: single-head (gelan-*, DDetect) and dual (yolov9-*, DualDDetect).

    loss_fn = make_loss(model)                    # hyp defaults to configs/hyps/hyp.scratch-high.yaml
    loss_total, loss_items = loss_fn(preds, targets)  # (box + cls + dfl) · B, shape (1,); detached items (3,)
    loss_fn.assignments(preds, targets)           # per branch: the assigned labels, boxes, soft scores, fg

The published loss_tal.py / loss_tal_dual.py: per head branch, DFL box decode,
TaskAlignedAssigner targets, BCE on the soft scores, CIoU and DFL on the foreground, all ÷ target_scores_sum;
gains box 7.5, cls 0.5, dfl 1.5; the dual loss adds the auxiliary branch's terms × 0.25. Backend "torch" is the
reference; "c" computes the same terms through ops.tal_assign and ops.det_loss without (B, M, A) or (B, A, NC)
tensors, its assigner reading the published fp16 decode for fp16/bf16 maps so both backends assign the same
targets (fl_gamma > 0 takes the reference). Deliberate differences: hyp label_smoothing = eps acts (targets
t·(1 − eps) + eps/2; eps = 0 is bit-identical); fp16/bf16 predictions get float32 BCE and box terms.
Test: python -m pytest -q tests/loss/test_loss.py tests/models/test_goldens_loss.py
"""

import os

import torch
import torch.nn.functional as F

from yolov9c.geometry import bbox2dist, bbox_ciou, dfl_decode, make_anchors, xywh_to_xyxy
from yolov9c.loss.assigner import TaskAlignedAssigner
from yolov9c.loss.bbox_loss import BboxLoss, dfl_loss
from yolov9c.ops import tal_assign as tal_assign_op
from yolov9c.ops.det_loss import det_loss, det_loss_decode
from yolov9c.resources import load_hyp

BOX_GAIN, CLS_GAIN, DFL_GAIN = 7.5, 0.5, 1.5  # hard-coded in the published loss (loss_tal_dual.py:247-249)
AUX_WEIGHT = 0.25  # weight of the auxiliary (PGI) branch's terms in the dual loss
FOCAL_ALPHA = 0.25  # published FocalLoss default, used only when hyp fl_gamma > 0
BACKENDS = ("torch", "c")
MAX_ROWS_SHOWN = 10  # non-finite target rows named in the error
# The boxes the c assigner reads: for fp16/bf16 maps those of the published decode itself (softmax, matmul and
# anchor offsets in the maps' dtype, computed as the torch branch computes them, a few images at a time), so
# that both backends assign the same targets on the same maps (docs/fidelity.md).
DECODE_CHUNK_ELEMS = 1 << 22  # the c assigner's published decode: bin logits at once (a ~32 MB transient)


def _check_finite(targets):
    """ValueError naming the rows of (N, 6) targets that hold NaN or ±inf (both backends pack through here)."""
    bad = ~torch.isfinite(targets).all(1)
    if not bool(bad.any()):
        return
    rows = bad.nonzero().flatten().tolist()
    shown = ", ".join(str(r) for r in rows[:MAX_ROWS_SHOWN]) + (f" and {len(rows) - MAX_ROWS_SHOWN} more"
                                                                 if len(rows) > MAX_ROWS_SHOWN else "")
    first = [round(v, 6) for v in targets[rows[0]].tolist()]
    raise ValueError(f"loss: {len(rows)} target row(s) not finite (NaN or inf): rows {shown}; row {rows[0]} is "
                     f"{first} [image, class, x, y, w, h]. Fix the labels, or the augmentation that produced them")


def pack_targets(targets, batch_size, scale, dtype, nc=None, rows=0):
    """(N, 6) rows [image, class, x, y, w, h] (normalised xywh) -> (B, M, 5) [class, x1, y1, x2, y2] pixels.

    M = the largest number of rows of one image (0 when N = 0), at least `rows` (the CUDA-graph step pads to
    a fixed bucket); rows keep their order within an image and unused slots are zero (a zero box marks
    padding). scale: (4,) = (W, H, W, H) image size in pixels.
    nc: when given, a class outside [0, nc) raises ValueError (the dataset and the model disagree). A row with
    a NaN or infinite value (in `dtype`) raises ValueError naming the rows.
    """
    device = scale.device
    if targets.dim() != 2 or targets.shape[1] != 6:
        raise ValueError(f"loss: targets must be (N, 6) rows [image, class, x, y, w, h], got {tuple(targets.shape)}")
    targets = targets.to(device=device, dtype=dtype)
    _check_finite(targets)
    if targets.shape[0] == 0:
        return torch.zeros((batch_size, rows, 5), dtype=dtype, device=device)
    img = targets[:, 0].long()
    if int(img.min()) < 0 or int(img.max()) >= batch_size:
        raise ValueError(f"loss: target image index out of range [0, {batch_size}): {img.min()}..{img.max()}")
    if nc is not None:
        cls = targets[:, 1]
        if float(cls.min()) < 0 or float(cls.max()) >= nc:
            raise ValueError(f"loss: target class {int(cls.max()) if float(cls.max()) >= nc else int(cls.min())} "
                             f"is outside the model's classes [0, {nc}): the data's names/nc and the model's nc "
                             f"differ (build the model with nc={int(cls.max()) + 1} or more, or fix the labels)")
    counts = torch.bincount(img, minlength=batch_size)
    order = torch.argsort(img, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(img.numel(), device=device) - starts[img[order]]  # position within its image
    out = torch.zeros((batch_size, max(int(counts.max()), rows), 5), dtype=dtype, device=device)
    out[img[order], slot] = targets[order, 1:6]
    out[..., 1:5] = xywh_to_xyxy(out[..., 1:5] * scale)
    return out


def pack_targets_host(targets, batch_size, size, dtype, device, nc=None, out=None):
    """pack_targets computed on the host and sent to `device` in one transfer: (B, M, 5) as pack_targets.

    size: (W, H) image size in pixels. The checks, M (the largest row count of one image) and the scatter
    all read host memory, so targets on the CPU (as the data loader yields them) cost no synchronisation
    with the device; targets on a device are brought over once. On CUDA the result goes through pinned
    memory with a non-blocking copy (a pageable copy would wait for the stream). out: a (B, M', 5) tensor
    on `device` (M' >= M, the CUDA-graph step's static buffer) to copy into, zero-padded; returned."""
    w, h = size
    host = pack_targets(targets.detach().to("cpu"), batch_size, torch.tensor([w, h, w, h], dtype=dtype), dtype,
                        nc=nc, rows=0 if out is None else out.shape[1])
    if device.type == "cuda":
        host = host.pin_memory()
    if out is not None:
        return out.copy_(host, non_blocking=device.type == "cuda")
    return host.to(device, non_blocking=device.type == "cuda")


class DetectionLoss:
    """The YOLOv9 loss (published loss_tal.ComputeLoss, and loss_tal_dual.ComputeLoss with dual=True).

    nc: classes; reg_max: DFL bins (16); stride: per-level strides [8, 16, 32] (list or tensor); hyp: as
    load_hyp; backend: "torch" (the reference) or "c" (tal_assign + det_loss kernels: the module docstring);
    dual: a DualDDetect head (PGI): preds = [aux_maps, main_maps] and the result is main + 0.25·aux for each
    of box, cls, dfl (aux box/dfl only with positives); both branches share the targets but are assigned
    independently.
    Call with preds = list of nl maps (B, 4·reg_max + nc, H_l, W_l) ([aux, main] lists when dual), or the
    eval-mode tuple (y, maps), and targets (N, 6) [image, class, x, y, w, h] normalised. Returns (loss_total
    (1,), loss_items (3,) detached [box, cls, dfl]), float32 (float64 for float64 predictions). Non-finite
    targets raise ValueError on both backends.
    """

    def __init__(self, nc, reg_max=16, stride=(8, 16, 32), hyp=None, backend="torch", dual=False):
        if backend not in BACKENDS:
            raise ValueError(f"loss: backend must be one of {BACKENDS}, got {backend!r}")
        self.hyp = load_hyp(hyp)
        self.backend = backend
        self.dual = bool(dual)
        self.nc = int(nc)
        self.reg_max = int(reg_max)
        self.no = self.nc + 4 * self.reg_max
        self.stride = [float(s) for s in (stride.tolist() if torch.is_tensor(stride) else stride)]
        self.cls_pw = float(self.hyp.get("cls_pw", 1.0))
        self.fl_gamma = float(self.hyp.get("fl_gamma", 0.0))
        self.label_smoothing = float(self.hyp.get("label_smoothing", 0.0) or 0.0)
        # the published loss reads these environment overrides (YOLOM = topk, YOLOA = alpha, YOLOB = beta)
        topk = int(os.getenv("YOLOM", 10))
        alpha = float(os.getenv("YOLOA", 0.5))
        beta = float(os.getenv("YOLOB", 6.0))
        self.assigner = TaskAlignedAssigner(self.nc, topk=topk, alpha=alpha, beta=beta)
        self.bbox_loss = BboxLoss(self.reg_max)
        # the c kernels have no focal term (fl_gamma > 0, off in every published hyp): that case keeps the
        # reference branch; the targets are still packed on the host (no device synchronisation)
        self._fused = backend == "c" and self.fl_gamma == 0
        self._branch = self._branch_fused if self._fused else self._branch_torch

    # -- input handling -------------------------------------------------------------------------------------

    def _branches(self, preds):
        """The list of branches (each a list of nl maps) in the order [aux, main] (dual) / [main]."""
        maps = preds[1] if isinstance(preds, tuple) else preds
        if not self.dual:
            self._check_maps(maps, "preds")
            return [list(maps)]
        if not isinstance(maps, (list, tuple)) or len(maps) != 2:
            raise ValueError("loss: dual preds must be [aux_maps, main_maps] or (y, [aux_maps, main_maps])")
        self._check_maps(maps[0], "aux preds")
        self._check_maps(maps[1], "main preds")
        return [list(maps[0]), list(maps[1])]

    def _check_maps(self, maps, what):
        if not isinstance(maps, (list, tuple)) or len(maps) != len(self.stride):
            raise ValueError(f"loss: {what} must be a list of {len(self.stride)} maps, got {type(maps).__name__}")
        for m in maps:
            if not torch.is_tensor(m) or m.dim() != 4 or m.shape[1] != self.no:
                shape = tuple(m.shape) if torch.is_tensor(m) else type(m).__name__
                raise ValueError(f"loss: {what}: each map must be (B, {self.no}, H, W), got {shape}")

    def _pack(self, targets, batch_size, size, dtype, device):
        """(B, M, 5) packed targets in pixels: on the host for the c backend (one transfer, no sync)."""
        if self.backend == "c":
            return pack_targets_host(targets, batch_size, size, dtype, device, nc=self.nc)
        w, h = size
        return pack_targets(targets, batch_size, torch.tensor([w, h, w, h], dtype=dtype, device=device), dtype,
                            nc=self.nc)

    # -- one head branch ------------------------------------------------------------------------------------

    def _torch_preds(self, maps, points):
        """One branch's maps → (pred_dist (B, A, 4·reg_max), pred_scores (B, A, nc), pred_boxes (B, A, 4) xyxy grid
        units, decoded in the maps' dtype as the published loss does); points: the anchors (A, 2), grid units."""
        B = maps[0].shape[0]
        pred = torch.cat([m.reshape(B, self.no, -1) for m in maps], dim=2)  # (B, no, A)
        pred_dist, pred_scores = pred.split((4 * self.reg_max, self.nc), dim=1)
        pred_dist = pred_dist.permute(0, 2, 1).contiguous()  # (B, A, 4·reg_max)
        pred_scores = pred_scores.permute(0, 2, 1).contiguous()  # (B, A, nc)
        return pred_dist, pred_scores, dfl_decode(pred_dist, points, self.reg_max)

    def _assign_torch(self, pred_scores, pred_boxes, gt_labels, gt_boxes, gt_mask, points, stride_col):
        """The reference assignment: (target_labels, target_boxes pixels, target_scores (B, A, nc), fg)."""
        return self.assigner(pred_scores.detach().sigmoid(), (pred_boxes.detach() * stride_col).to(gt_boxes.dtype),
                             points * stride_col, gt_labels, gt_boxes, gt_mask)

    def _branch_torch(self, maps, gt_labels, gt_boxes, gt_mask, points, stride_col, static=False):
        """Loss terms of one branch: (box, cls, dfl, has_fg), unweighted, each ÷ target_scores_sum.

        maps: nl tensors (B, no, H, W); gt_*: packed targets (pixels); points (A, 2) grid units, stride_col
        (A, 1). box/dfl are None when the branch has no foreground anchor. static: no host synchronisation
        (the box terms over every anchor, _box_terms_static; has_fg is then always True).
        """
        pred_dist, pred_scores, pred_boxes = self._torch_preds(maps, points)
        target_labels, target_boxes, target_scores, fg = self._assign_torch(pred_scores, pred_boxes, gt_labels,
                                                                            gt_boxes, gt_mask, points, stride_col)
        target_boxes = target_boxes / stride_col
        target_scores_sum = target_scores.sum().clamp(min=1)

        cls = self._cls_loss(pred_scores, target_scores).sum() / target_scores_sum
        if static:
            box, dfl = self._box_terms_static(pred_dist, pred_boxes, points, target_boxes, target_scores,
                                              target_scores_sum, fg)
            return box, cls, dfl, True
        if not bool(fg.any()):
            return None, cls, None, False
        box, dfl = self.bbox_loss(pred_dist, pred_boxes, points, target_boxes, target_scores, target_scores_sum, fg)
        return box, cls, dfl, True

    def _box_terms_static(self, pred_dist, pred_boxes, points, target_boxes, target_scores, target_scores_sum,
                          fg):
        """BboxLoss's CIoU and DFL terms summed over every anchor with background anchors weighted 0: no
        boolean indexing, so no host synchronisation and fixed shapes (a CUDA graph can hold it). Same terms
        as BboxLoss up to the order of the sums; 0 without a foreground anchor (what BboxLoss's absence adds)."""
        B, A = fg.shape
        cdt = torch.promote_types(pred_dist.dtype, torch.float32)
        weight = target_scores.sum(-1)  # (B, A)
        zero = torch.zeros((), dtype=cdt, device=fg.device)
        ciou = bbox_ciou(pred_boxes.to(cdt), target_boxes)
        loss_iou = torch.where(fg, (1.0 - ciou) * weight, zero).sum() / target_scores_sum
        target_ltrb = bbox2dist(points[None], target_boxes, self.bbox_loss.max_dist)  # (B, A, 4)
        dist = pred_dist.reshape(B * A, 4, self.reg_max).to(cdt)
        dfl = dfl_loss(dist, target_ltrb.reshape(B * A, 4)).reshape(B, A)
        loss_dfl = torch.where(fg, dfl * weight, zero).sum() / target_scores_sum
        return loss_iou, loss_dfl

    @torch.no_grad()
    def _assign_fused(self, maps, gt_labels, gt_boxes, gt_mask, points, stride_col):
        """The c assignment from the kernels: (labels (B, A), boxes (B, A, 4) pixels, norm (B, A), 0 off the
        foreground, fg (B, A)); no (B, A, NC) or (B, M, A) tensor."""
        B, nc = maps[0].shape[0], self.nc
        a = self.assigner
        pred_boxes = self._assigner_boxes(maps, points, stride_col)
        # the class logits as one (B, NC, A) tensor (a transient copy in the maps' dtype, freed on return);
        # tal_assign reads it through a (B, A, NC) view and applies the sigmoid itself
        logits = torch.cat([m.detach()[:, 4 * self.reg_max:].reshape(B, nc, -1) for m in maps], dim=2)
        labels, boxes, norm, fg, _ = tal_assign_op.tal_assign(
            logits.transpose(1, 2), pred_boxes, (points * stride_col).float(), gt_labels, gt_boxes, gt_mask, nc,
            tal_assign_op.AssignParams(a.topk, a.alpha, a.beta, a.eps), logits=True)
        return labels, boxes, torch.where(fg, norm, 0.0), fg

    def _assigner_boxes(self, maps, points, stride_col):
        """(B, A, 4) float32 pixel boxes for the c assigner: the published decode for fp16/bf16 maps (module
        comment above DECODE_CHUNK_ELEMS), the kernels' float32 decode for float32/float64 maps (the same boxes
        up to the order of a sum)."""
        if maps[0].dtype in (torch.float16, torch.bfloat16):
            return self._published_boxes(maps, points, stride_col)
        return det_loss_decode(maps, self.stride, self.reg_max)

    def _published_boxes(self, maps, points, stride_col):
        """(B, A, 4) float32 pixel boxes of the torch branch's decode (dfl_decode in the maps' dtype, times the
        stride in that dtype), a few images at a time so that no (B, A, 4·reg_max) copy is whole."""
        B, R = maps[0].shape[0], self.reg_max
        A = points.shape[0]
        out = torch.empty((B, A, 4), dtype=torch.float32, device=maps[0].device)
        step = max(1, DECODE_CHUNK_ELEMS // (A * 4 * R))
        for b0 in range(0, B, step):
            dist = torch.cat([m[b0:b0 + step, :4 * R].detach().flatten(2) for m in maps], dim=2)
            boxes = dfl_decode(dist.transpose(1, 2).contiguous(), points, R)
            out[b0:b0 + step] = boxes * stride_col
        return out

    def _branch_fused(self, maps, gt_labels, gt_boxes, gt_mask, points, stride_col, static=False):
        """The c branch: same terms, returned as (box, cls, dfl, True) (box = dfl = 0 without a foreground
        anchor, which adds nothing, so no host synchronisation is needed to test for one)."""
        labels, boxes, norm, fg = self._assign_fused(maps, gt_labels, gt_boxes, gt_mask, points, stride_col)
        target_scores_sum = norm.sum().clamp(min=1)
        out = det_loss(maps, self.stride, labels, boxes, norm, fg, target_scores_sum, self.reg_max,
                       self.label_smoothing, self.cls_pw)
        return out[0], out[1], out[2], True

    @torch.no_grad()
    def assignments(self, preds, targets):
        """The targets each branch trains on, by this loss's backend, for the same preds and targets as __call__:
        a list (one per branch, [aux, main] when dual) of dicts with labels (B, A) int64 (the class), boxes
        (B, A, 4) float32 pixels, norm (B, A) float32 (the soft score of the assigned class, 0 off the
        foreground) and fg (B, A) bool. Developer use: comparing the two backends' assignments on identical
        predictions (dev/fidelity/backend_grads.py --assign)."""
        branches = self._branches(preds)
        feats = branches[-1]
        gt_labels, gt_boxes, gt_mask = self._gt_parts(self._packed(feats, targets))
        points, stride_col = make_anchors(feats, self.stride, 0.5)
        out = []
        for maps in branches:
            if self._fused:
                labels, boxes, norm, fg = self._assign_fused(maps, gt_labels, gt_boxes, gt_mask, points, stride_col)
            else:
                _, scores, pred_boxes = self._torch_preds(maps, points)
                labels, boxes, tscores, fg = self._assign_torch(scores, pred_boxes, gt_labels, gt_boxes, gt_mask,
                                                                points, stride_col)
                norm = tscores.sum(-1).float()
            out.append({"labels": labels.long(), "boxes": boxes.float(), "norm": norm.float(), "fg": fg})
        return out

    def _cls_loss(self, logits, targets):
        """Element-wise BCE-with-logits (pos_weight = cls_pw), optional focal factor and label smoothing.

        logits (B, A, nc) any float dtype; targets (B, A, nc) in [0, 1]. Returns (B, A, nc) in float32 at least.
        """
        cdt = torch.promote_types(logits.dtype, torch.float32)
        logits = logits.to(cdt)
        targets = targets.to(cdt)
        if self.label_smoothing > 0:
            eps = self.label_smoothing
            targets = targets * (1.0 - eps) + 0.5 * eps
        pos_weight = torch.full((1,), self.cls_pw, dtype=cdt, device=logits.device)  # a fill: no host copy
        loss = F.binary_cross_entropy_with_logits(logits, targets, pos_weight=pos_weight, reduction="none")
        if self.fl_gamma > 0:
            p = logits.sigmoid()
            p_t = targets * p + (1 - targets) * (1 - p)
            alpha_t = targets * FOCAL_ALPHA + (1 - targets) * (1 - FOCAL_ALPHA)
            loss = loss * (alpha_t * (1.0 - p_t) ** self.fl_gamma)
        return loss

    # -- the whole loss -------------------------------------------------------------------------------------

    def __call__(self, preds, targets):
        branches = self._branches(preds)
        return self._total(branches, self._packed(branches[-1], targets), static=False)

    def _packed(self, feats, targets):
        """targets (N, 6) → packed (B, M, 5) pixels for the maps feats."""
        # The published loss packs the targets in the default dtype (float32), so its assigner compares
        # float32 boxes even for a float64 model; the goldens depend on it at the 1e-7 level.
        gt_dtype = torch.promote_types(torch.get_default_dtype(), torch.float32)
        # image size (h, w) in pixels from the first map and the first stride
        h, w = feats[0].shape[2] * self.stride[0], feats[0].shape[3] * self.stride[0]
        return self._pack(targets, feats[0].shape[0], (w, h), gt_dtype, feats[0].device)

    @staticmethod
    def _gt_parts(gt):
        """(gt_labels (B, M, 1), gt_boxes (B, M, 4), gt_mask (B, M, 1)); padding rows are all-zero."""
        gt_labels, gt_boxes = gt.split((1, 4), dim=2)
        return gt_labels, gt_boxes, gt_boxes.sum(2, keepdim=True) > 0

    def padded(self, preds, gt):
        """The loss of already packed targets, without a host synchronisation (the CUDA-graph step's entry).

        gt: (B, M, 5) [class, x1, y1, x2, y2] pixels as pack_targets gives it, padded to any M with all-zero
        rows (a zero box is padding: the mask is gt's box sum > 0, as in __call__). Equals
        __call__(preds, targets) for the targets gt was packed from; on the torch path the box terms are
        summed over every anchor with background weighted 0 (no boolean indexing), so the sums may differ in
        rounding. Returns (loss_total (1,), loss_items (3,) detached)."""
        return self._total(self._branches(preds), gt, static=True)

    def _total(self, branches, gt, static):
        """(loss_total (1,), loss_items (3,)) of the branches against packed targets gt (B, M, 5)."""
        feats = branches[-1]
        B, device = feats[0].shape[0], feats[0].device
        acc = torch.promote_types(feats[0].dtype, torch.float32)  # dtype of the loss sums
        gt_labels, gt_boxes, gt_mask = self._gt_parts(gt)

        points, stride_col = make_anchors(feats, self.stride, 0.5)
        terms = [self._branch(maps, gt_labels, gt_boxes, gt_mask, points, stride_col, static) for maps in branches]

        zero = torch.zeros((), dtype=acc, device=device)
        box, cls, dfl = zero, zero, zero
        for k, (b, c, d, has_fg) in enumerate(terms):
            weight = AUX_WEIGHT if k < len(terms) - 1 else 1.0  # every branch but the last is auxiliary
            cls = cls + weight * c
            if has_fg:
                box = box + weight * b
                dfl = dfl + weight * d
        loss = torch.stack((box * BOX_GAIN, cls * CLS_GAIN, dfl * DFL_GAIN)).to(acc)
        return (loss.sum() * B).reshape(1), loss.detach()


HEAD_ATTRS = ("nc", "reg_max", "stride", "cv2", "cv3", "dfl")  # what every DDetect-like head has


def make_loss(model, hyp=None, backend="torch"):
    """The loss for `model`: DetectionLoss with dual=True for a DualDDetect head, dual=False for a DDetect.

    model: a DetectionModel (or a DataParallel/DDP wrapper of one); nc, reg_max and stride come from its head
    model.model[-1] (a dual head is the one with the second DFL, `dfl2`: the published attribute names, read
    here so that the loss does not import the models layer above it). hyp: None
    (configs/hyps/hyp.scratch-high.yaml), a dict or a yaml path. backend: "torch" (the reference) or "c"
    (the same loss through the tal_assign and det_loss kernels).
    Returns a callable (preds, targets) -> (loss_total (1,), loss_items (3,) detached).
    """
    if backend not in BACKENDS:
        raise ValueError(f"make_loss: backend must be one of {BACKENDS}, got {backend!r}")
    model = getattr(model, "module", model)
    head = model.model[-1]
    if not all(hasattr(head, a) for a in HEAD_ATTRS):
        raise TypeError(f"make_loss: the model's last layer is {type(head).__name__}, not DDetect/DualDDetect")
    return DetectionLoss(head.nc, head.reg_max, head.stride, hyp, backend=backend, dual=hasattr(head, "dfl2"))
