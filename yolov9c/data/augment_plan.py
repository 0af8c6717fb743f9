"""The training pipeline split in two for the augment op (--gpu-augment): a loader worker decodes the images and
draws every random choice on the host; the op (yolov9c/ops/augment.py) does a batch's pixel work in one pass.

- `plan_item(ds, index, rng, mosaic_on)` -> (ItemPlan, labels (n, 6) float32, path, shapes): one item as
  YoloDataset.__getitem__ builds it, draw for draw from the same Generator and box code but without pixels;
  labels and shapes identical to __getitem__'s. Covers mosaic, copy-paste, letterbox, random perspective, mixup,
  HSV, flips; not rect batches (create_dataloader refuses them with --gpu-augment). Copy-paste: each layer's
  pasted polygons go to the op (`paste_list`: at most PASTE_CAP int32 values a layer, what happens beyond).
- `plan_collate(items)` -> PlannedBatch: the source crops each output can sample (`reach`, widened to the
  sources of the pastes it can sample) back to back in one uint8 buffer (shared memory in a worker), the plan
  arrays (paste: (B, 2, L) with L the batch's longest list), labels (N, 6) [image index, cls, xc, yc, w, h].
- `BatchAssembler(device)`: PlannedBatch -> (imgs uint8 (B, 3, H, W) on `device`, labels, paths, shapes), as the
  CPU pipeline's collate gives. On CUDA out of memory it falls back to the C reference on the CPU (one log line).
Test: python -m pytest -q tests/data/test_augment_plan.py
"""

from dataclasses import dataclass, replace

import cv2
import numpy as np
import torch

from yolov9c.data.copy_paste import paste_draws, paste_sources
from yolov9c.data.hsv import hsv_luts
from yolov9c.data.letterbox import letterbox_geometry
from yolov9c.data.mixup import MIXUP_ALPHA
from yolov9c.data.mosaic import mosaic_tiles
from yolov9c.data.perspective import random_matrix, warp_labels
from yolov9c.geometry import xywhn_to_xyxy, xyxy_to_xywhn

_EMPTY_TILE = (0, 0, 0, 0, 0, 0, 0, 0, 0)
PASTE_CAP = 8192  # int32 values of one layer's paste list (32 KiB): about 3900 polygon vertices
_SIMPLIFY_PX = (1, 2, 4, 8, 16, 32, 64)  # approxPolyDP tolerances tried, in turn, for a list over PASTE_CAP


class ItemPlan:
    """One output image's plan. crops: the source pixels (h, w, 3) uint8 views; tiles (2, 4, 9) int64 whose
    column 0 holds the crop's index in `crops` (plan_collate turns it into a byte offset); warp (2, 9)
    float32; mix (2,) float32; flags (4,) int64; luts (3, 256) uint8; paste: 2 int32 paste lists; hw the
    output (H, W). Layouts: yolov9c/ops/augment.py."""

    __slots__ = ("crops", "tiles", "warp", "mix", "flags", "luts", "paste", "hw")

    def __init__(self, hw):
        self.crops = []
        self.tiles = np.zeros((2, 4, 9), np.int64)
        self.warp = np.zeros((2, 9), np.float32)
        self.mix = np.array([1.0, 0.0], np.float32)
        self.flags = np.array([1, 0, 0, 0], np.int64)
        self.luts = np.zeros((3, 256), np.uint8)
        self.paste = [np.zeros(2, np.int32), np.zeros(2, np.int32)]
        self.hw = hw

    def add_layer(self, layer, pieces, M, pastes=(), mirror=0):
        """pieces: up to 4 (image, image rectangle (x1b, y1b, x2b, y2b), canvas origin (x1a, y1a)); M: the
        forward 3x3 warp of the layer's canvas; pastes: copy_paste.paste_sources' list, mirror: canvas width - 1.
        Each piece is cut to the canvas region the output can sample (`reach`) and the sources of the pastes
        that land in it, so only those bytes travel to the op; pastes that land outside it are left out."""
        inv = np.linalg.inv(np.asarray(M, np.float64))
        rx1, ry1, rx2, ry2 = region = reach(inv, self.hw)
        used = []
        for poly, (x0, y0, x1, y1) in pastes:  # lands on columns mirror + 1 - x1 .. mirror - x0
            if mirror + 1 - x1 < region[2] and mirror + 1 - x0 > region[0] and y0 < region[3] and y1 > region[1]:
                used.append((poly, (x0, y0, x1, y1)))
                rx1, ry1, rx2, ry2 = min(rx1, x0), min(ry1, y0), max(rx2, x1), max(ry2, y1)
        self.paste[layer] = paste_list(used, mirror)
        for t, (img, (x1b, y1b, x2b, y2b), (x1a, y1a)) in enumerate(pieces):
            # the canvas rectangle of the piece, cut to the reachable region
            cx1, cy1 = max(x1a, rx1), max(y1a, ry1)
            cx2, cy2 = min(x1a + x2b - x1b, rx2), min(y1a + y2b - y1b, ry2)
            if cx2 <= cx1 or cy2 <= cy1:
                self.tiles[layer, t] = _EMPTY_TILE
                continue
            ix1, iy1 = x1b + cx1 - x1a, y1b + cy1 - y1a  # the cut's corner in the image
            self.tiles[layer, t] = (len(self.crops), cy2 - cy1, cx2 - cx1, cx1, cy1, cx2, cy2, cx1, cy1)
            self.crops.append(img[iy1:iy1 + cy2 - cy1, ix1:ix1 + cx2 - cx1])
        self.warp[layer] = inv.astype(np.float32).ravel()


def paste_list(pastes, mirror, cap=None):
    """pastes [(polygon (k, 2) int32, rectangle (x0, y0, x1, y1))] -> one layer's paste list (int32, layout:
    yolov9c/ops/augment.py) of at most `cap` (None: PASTE_CAP) values. Over the cap, every polygon is simplified
    (cv2.approxPolyDP, never below 3 vertices) with the tolerances of _SIMPLIFY_PX in turn until the list fits:
    a pasted outline moves by at most that many pixels; still over at 64 px, the polygons past the cap are not
    pasted. Labels never change: they come from the draws (paste_draws)."""
    cap = PASTE_CAP if cap is None else cap
    polys = list(pastes)
    for eps in _SIMPLIFY_PX:
        if 2 + sum(5 + 2 * len(q) for q, _ in polys) <= cap:
            break
        simpler = [cv2.approxPolyDP(q.reshape(-1, 1, 2), eps, True).reshape(-1, 2) for q, _ in pastes]
        polys = [(s if len(s) >= 3 else q, r) for s, (q, r) in zip(simpler, polys)]
    out = [0, mirror]
    for q, r in polys:
        if len(out) + 5 + 2 * len(q) > cap:
            break
        out += [len(q), *r, *q.ravel().tolist()]
        out[0] += 1
    return np.array(out, np.int32)


def reach(inv, hw, margin=2):
    """The canvas rectangle (x1, y1, x2, y2), end exclusive, holding every pixel that a bilinear sample of an
    output of hw = (H, W) through the inverse map inv (3x3) can read: the bounds of the 4 corner pixels'
    pre-images (a projective map takes the output rectangle to a convex quadrilateral), widened by the
    bilinear neighbour and `margin` pixels for float32 rounding. Unbounded when a corner maps to or behind
    the camera (never with the published perspective range)."""
    H, W = hw
    pts = inv @ np.array([[0, W - 1, 0, W - 1], [0, 0, H - 1, H - 1], [1, 1, 1, 1]], np.float64)
    if (pts[2] <= 1e-9).any():
        return -(1 << 40), -(1 << 40), 1 << 40, 1 << 40
    u, v = pts[0] / pts[2], pts[1] / pts[2]
    return (int(np.floor(u.min())) - margin, int(np.floor(v.min())) - margin,
            int(np.floor(u.max())) + 2 + margin, int(np.floor(v.max())) + 2 + margin)


def _mosaic_layer(ds, index, rng, plan, layer):
    """load_mosaic without pixels → labels (m, 5) [cls, x1, y1, x2, y2] of the output; fills plan layer."""
    hyp, s = ds.hyp, ds.img_size
    half = s // 2
    images, places, labels4, segments4, any_polygons = mosaic_tiles(index, len(ds), ds.load_image, ds.labels,
                                                                    ds.segments, s, rng)
    pastes = []
    if any_polygons:  # load_mosaic's copy_paste, its draws and labels; the pixels go to the op as polygons
        chosen, labels4, pasted = paste_draws(labels4, segments4, 2 * s, rng, hyp["copy_paste"])
        pastes = paste_sources(segments4, chosen, 2 * s, 2 * s)
        segments4 = pasted
    out = 2 * s - 2 * half
    M, sc = random_matrix(rng, (2 * s, 2 * s), (out, out), hyp["degrees"], hyp["translate"], hyp["scale"],
                          hyp["shear"], hyp["perspective"])
    labels, _ = warp_labels(labels4, segments4, M, sc, (out, out), hyp["perspective"])
    plan.add_layer(layer, [(img, b, a[:2]) for img, (a, b) in zip(images, places)], M, pastes, 2 * s - 1)
    return labels


def _letterbox_layer(ds, index, rng, plan):
    """The non-mosaic branch (letterbox to img_size, up-scaling allowed, then random perspective of the
    boxes and pixels) → (labels (n, 5) pixels, shapes); fills plan layer 0 and plan.hw."""
    hyp = ds.hyp
    img, (h0, w0), (h, w) = ds.load_image(index)
    (new_w, new_h), (rx, ry), (dw, dh), (top, bottom, left, right) = letterbox_geometry(h, w, ds.img_size)
    if (w, h) != (new_w, new_h):  # as letterbox: only when the long side is not img_size already
        img = cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    H, W = new_h + top + bottom, new_w + left + right
    lab = ds.labels[index]
    labels = np.zeros((len(lab), 5), np.float32)
    if len(lab):
        labels[:, 0] = lab[:, 0]
        labels[:, 1:] = xywhn_to_xyxy(lab[:, 1:], rx * w, ry * h, dw, dh)
    M, sc = random_matrix(rng, (H, W), (H, W), hyp["degrees"], hyp["translate"], hyp["scale"], hyp["shear"],
                          hyp["perspective"])
    labels, _ = warp_labels(labels, [], M, sc, (H, W), hyp["perspective"])
    plan.hw = (H, W)
    plan.add_layer(0, [(img, (0, 0, new_w, new_h), (left, top))], M)
    return labels, ((h0, w0), ((h / h0, w / w0), (dw, dh)))


def plan_item(ds, index, rng, mosaic_on):
    """YoloDataset.__getitem__'s augmenting branch as a plan (module docstring). ds: the YoloDataset (img_size,
    hyp, labels, segments, load_image, im_files). Returns (ItemPlan, labels (n, 6) float32 tensor, path, shapes)."""
    hyp, s = ds.hyp, ds.img_size
    plan = ItemPlan((2 * s - 2 * (s // 2),) * 2)
    shapes = None
    if mosaic_on and rng.random() < hyp["mosaic"]:
        labels = _mosaic_layer(ds, index, rng, plan, 0)
        if rng.random() < hyp["mixup"]:
            j = int(rng.integers(len(ds)))
            labels2 = _mosaic_layer(ds, j, rng, plan, 1)
            r = rng.beta(MIXUP_ALPHA, MIXUP_ALPHA)
            plan.mix[:] = (r, 1.0 - r)
            plan.flags[0] = 2
            labels = np.concatenate((np.asarray(labels, np.float32).reshape(-1, 5),
                                     np.asarray(labels2, np.float32).reshape(-1, 5)), 0)
    else:
        labels, shapes = _letterbox_layer(ds, index, rng, plan)
    H, W = plan.hw
    labels = np.asarray(labels, np.float32).reshape(-1, 5)
    if len(labels):
        labels[:, 1:] = xyxy_to_xywhn(labels[:, 1:], W, H)
    gains = (hyp["hsv_h"], hyp["hsv_s"], hyp["hsv_v"])
    if any(gains):  # augment_hsv's draw
        plan.luts[:] = np.stack(hsv_luts(rng.uniform(-1, 1, 3) * gains + 1))
        plan.flags[3] = 1
    if rng.random() < hyp["flipud"]:  # random_flip's two draws, in its order
        plan.flags[1] = 1
        if len(labels):
            labels[:, 2] = 1 - labels[:, 2]
    if rng.random() < hyp["fliplr"]:
        plan.flags[2] = 1
        if len(labels):
            labels[:, 1] = 1 - labels[:, 1]
    out = torch.zeros((len(labels), 6), dtype=torch.float32)
    if len(labels):
        out[:, 1:] = torch.from_numpy(labels)
    return plan, out, ds.im_files[index], shapes


@dataclass
class PlannedBatch:
    """A batch before its pixels: src (N,) uint8, tiles (B, 2, 4, 9) int64 with byte offsets, warp, mix, flags,
    luts, paste (layouts: yolov9c/ops/augment.py), labels (n, 6), paths, shapes, hw = (H, W). pin_memory() is
    what the DataLoader's pinning thread calls."""

    src: torch.Tensor
    tiles: torch.Tensor
    warp: torch.Tensor
    mix: torch.Tensor
    flags: torch.Tensor
    luts: torch.Tensor
    paste: torch.Tensor
    labels: torch.Tensor
    paths: tuple
    shapes: tuple
    hw: tuple

    ARRAYS = ("src", "tiles", "warp", "mix", "flags", "luts", "paste")  # the augment op's tensors, in its order

    def arrays(self):
        return tuple(getattr(self, name) for name in self.ARRAYS)

    def pin_memory(self, device=None):
        return replace(self, **{name: getattr(self, name).pin_memory() for name in self.ARRAYS})

    def __len__(self):
        return len(self.tiles)


def plan_collate(batch):
    """List of (ItemPlan, labels, path, shapes) → PlannedBatch. Every plan must have the same output size."""
    plans, labels, paths, shapes = zip(*batch)
    hws = {p.hw for p in plans}
    if len(hws) > 1:
        raise ValueError(f"augment plan: one batch mixes output sizes {sorted(hws)} (rect batches are not "
                         "supported by --gpu-augment)")
    for i, lb in enumerate(labels):
        lb[:, 0] = i
    total = sum(c.size for p in plans for c in p.crops)
    src = torch.empty(total, dtype=torch.uint8)
    if torch.utils.data.get_worker_info() is not None:  # sent to the main process through shared memory
        src.share_memory_()
    buf = src.numpy()
    tiles = np.stack([p.tiles for p in plans])
    at = 0
    for b, p in enumerate(plans):
        offsets = []
        for c in p.crops:
            buf[at:at + c.size].reshape(c.shape)[...] = c
            offsets.append(at)
            at += c.size
        for tile in tiles[b].reshape(-1, 9):
            if tile[5] > tile[3]:  # a used tile: crop index -> byte offset
                tile[0] = offsets[tile[0]]
    paste = np.zeros((len(plans), 2, max(len(q) for p in plans for q in p.paste)), np.int32)
    for b, p in enumerate(plans):
        for layer, q in enumerate(p.paste):
            paste[b, layer, :len(q)] = q
    arrays = [torch.from_numpy(a) for a in (tiles, np.stack([p.warp for p in plans]), np.stack([p.mix for p in plans]),
                                            np.stack([p.flags for p in plans]), np.stack([p.luts for p in plans]),
                                            paste)]
    return PlannedBatch(src, *arrays, torch.cat(labels, 0), paths, shapes, plans[0].hw)


class BatchAssembler:
    """PlannedBatch → (imgs uint8 (B, 3, H, W) on `device`, labels, paths, shapes); anything else passes
    through unchanged. device: 'cpu' (the C reference) or a CUDA device (the kernel)."""

    def __init__(self, device, log=print):
        self.device = torch.device(device)
        self.log = log
        self.on_cpu = self.device.type != "cuda"

    def __call__(self, batch):
        if not isinstance(batch, PlannedBatch):
            return batch
        from yolov9c.ops.augment import augment

        H, W = batch.hw
        if not self.on_cpu:
            try:
                args = [t.to(self.device, non_blocking=True) for t in batch.arrays()]
                out = torch.empty((len(batch), 3, H, W), dtype=torch.uint8, device=self.device)
                return augment(out, *args), batch.labels, batch.paths, batch.shapes
            except torch.OutOfMemoryError:
                self.on_cpu = True
                self.log("gpu-augment: out of GPU memory for a batch's source images; assembling the batches on "
                         "the CPU (C reference) from now on")
        out = torch.empty((len(batch), 3, H, W), dtype=torch.uint8)
        return augment(out, *[t.cpu() for t in batch.arrays()]), batch.labels, batch.paths, batch.shapes
