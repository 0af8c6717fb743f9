"""Training augmentation's pixel work as one op: `augment()` (C/CUDA via yolov9c._C) and `augment_reference()`
(the same plan through OpenCV calls). A batch plan (drawn on the host by yolov9c/data/augment_plan.py):
    src   (N,) uint8            the source images' bytes, each h x w x 3 BGR, back to back
    tiles (B, 2, 4, 9) int64    per image, layer (2nd only with mixup), mosaic tile: [offset in src, h, w, x1, y1,
                                x2, y2, padw, padh]: canvas x1 <= cx < x2, y1 <= cy < y2 shows source
                                (cx - padw, cy - padh); the rest is grey 114; x2 <= x1 marks an empty tile
    paste (B, 2, L) int32       each layer's copy-paste list, L >= 2: [n, m, then n times: k, x0, y0, x1, y1, k
                                vertices (x, y)]: canvas pixel (c, y) shows (m - c, y) when that lies in one of
                                the n polygons (bounding rectangle x0 <= x < x1, y0 <= y < y1)
    warp (B, 2, 9) float32 inverse maps (output -> canvas); mix (B, 2) float32 (r, 1 - r) for mixup
    flags (B, 4) int64 (layers 1|2, flipud, fliplr, hsv on); luts (B, 3, 256) uint8 HSV tables
    out (B, 3, H, W) uint8 written: RGB planes, the loader's batch layout
Maths: kernels/augment_pixel.h. C and CUDA write the same bytes; OpenCV within 1 grey level on >= 99.9 %.
Dispatch: CUDA -> kernels/augment.cu, CPU -> csrc/augment_ref.c; YOLOV9C_FUSED=0 -> augment_reference. No grad.
Test: python -m pytest -q tests/ops/test_augment.py
"""

import cv2
import numpy as np
import torch

from yolov9c.ops import extension

GREY = 114


def augment(out, src, tiles, warp, mix, flags, luts, paste):
    """Fill out (B, 3, H, W) uint8 from the plan (module docstring); every tensor on out's device. Returns out."""
    if not extension.fused_enabled():  # the OpenCV reference runs on the host, whatever the device
        plan = [t.cpu() for t in (src, tiles, warp, mix, flags, luts, paste)]
        out.copy_(augment_reference(*plan, out.shape[2], out.shape[3]))
        return out
    extension.load().augment_forward(out, src, tiles, warp, mix, flags, luts, paste, extension.stream_of(out.device))
    return out


def paste_polygons(ps):
    """A paste list (module docstring) -> (m, [(polygon (k, 2) int32, (x0, y0, x1, y1))])."""
    ps = np.asarray(ps).astype(np.int64)
    out, at = [], 2
    for _ in range(int(ps[0])):
        k = int(ps[at])
        out.append((ps[at + 5:at + 5 + 2 * k].reshape(k, 2).astype(np.int32), tuple(int(v) for v in ps[at + 1:at + 5])))
        at += 5 + 2 * k
    return int(ps[1]), out


def _layer(src, tiles, warp, paste, H, W):
    """One layer with OpenCV: the grey canvas with its tiles placed, the pasted polygons' pixels (drawContours
    fill, as yolov9c/data/copy_paste.py) read from the canvas mirrored, warped (bilinear, border 114) → (H, W, 3)."""
    t = tiles.tolist()
    mirror, polys = paste_polygons(paste)
    ch = max([q[6] for q in t if q[5] > q[3] and q[6] > q[4]] + [r[3] for _, r in polys] + [1])
    cw = max([q[5] for q in t if q[5] > q[3] and q[6] > q[4]] + [r[2] for _, r in polys] + [mirror + 1 if polys else 1])
    canvas = np.full((ch, cw, 3), GREY, np.uint8)
    for off, h, w, x1, y1, x2, y2, pw, ph in t:
        if x2 > x1 and y2 > y1:
            img = src[off:off + h * w * 3].reshape(h, w, 3)
            canvas[y1:y2, x1:x2] = img[y1 - ph:y2 - ph, x1 - pw:x2 - pw]
    if polys:
        mask = np.zeros((ch, cw), np.uint8)
        for poly, (x0, y0, x1, y1) in polys:
            one = np.zeros((y1 - y0, x1 - x0), np.uint8)
            cv2.drawContours(one, [poly], -1, 1, cv2.FILLED, offset=(-x0, -y0))
            mask[y0:y1, x0:x1] |= one
        mirrored = canvas[:, mirror::-1].copy()  # its column c is canvas column mirror - c, read before any write
        np.copyto(canvas[:, :mirror + 1], mirrored, where=mask[:, mirror::-1, None].astype(bool))
    m = np.asarray(warp, np.float64).reshape(3, 3)
    return cv2.warpPerspective(canvas, m, (W, H), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                               borderValue=(GREY, GREY, GREY))


def augment_reference(src, tiles, warp, mix, flags, luts, paste, H, W):
    """The plan run through OpenCV as data/mosaic.py, copy_paste.py, mixup.py, hsv.py and flip.py do it (CPU
    tensors or arrays in, (B, 3, H, W) uint8 tensor out)."""
    src, tiles, warp, mix, flags, luts, paste = (np.asarray(x) for x in (src, tiles, warp, mix, flags, luts, paste))
    out = np.empty((len(tiles), 3, H, W), np.uint8)
    for b in range(len(tiles)):
        img = _layer(src, tiles[b, 0], warp[b, 0], paste[b, 0], H, W)
        if flags[b, 0] == 2:
            img = cv2.addWeighted(img, float(mix[b, 0]), _layer(src, tiles[b, 1], warp[b, 1], paste[b, 1], H, W),
                                  float(mix[b, 1]), 0.0)
        if flags[b, 3]:
            hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
            planes = cv2.split(hsv)
            for plane, lut in zip(planes, luts[b]):
                cv2.LUT(plane, lut, dst=plane)
            img = cv2.cvtColor(cv2.merge(planes), cv2.COLOR_HSV2BGR)
        if flags[b, 1]:
            img = img[::-1]
        if flags[b, 2]:
            img = img[:, ::-1]
        out[b] = img[..., ::-1].transpose(2, 0, 1)
    return torch.from_numpy(out)
