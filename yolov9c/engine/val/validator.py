"""validate(model, loader, nc=, names=, cfg=ValConfig(...)): run a detection model over a validation loader and
compute the published metrics (val_dual.py).

Per batch: uint8 letterboxed images → float / 255 (half if asked) → model in eval mode (cfg.chunk images per
forward: _chunked_forward) → main head (y[1] for DualDDetect, y for DDetect; the raw maps go to compute_loss
when given, so the validation loss is really computed) → multi-label NMS (agnostic when single_cls) → boxes
mapped back to each original image with the loader's shapes ((h0, w0), ((gain_h, gain_w), (pad_w, pad_h))) →
matching at IoU 0.50:0.05:0.95 → metrics.
Prints the published table (`Class Images Instances P R mAP50 mAP50-95`, the `all` line, per class when
verbose) and a speed line; while it runs, a progress bar whose description is that header (progress=False:
none). Optional outputs in save_dir (ValConfig): labels/*.txt (save_txt), the COCO-JSON predictions (save_json,
file json_name; COCO's evaluator then replaces mAP50 and mAP50-95 when it is installed and anno_json exists:
yolov9c/engine/val/coco.py), plots. Each image's matching and outputs: _Run.add_image.
Test: python -m pytest -q tests/engine/val/test_validator.py tests/engine/val/test_coco.py \
    tests/engine/val/test_val_chunks.py
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from yolov9c.engine.progress import bar
from yolov9c.engine.val.coco import coco_evaluate, json_rows
from yolov9c.engine.val.metrics import (
    IOU_THRESHOLDS,
    ConfusionMatrix,
    ap_per_class,
    match_predictions,
)
from yolov9c.engine.postprocess import non_max_suppression
from yolov9c.geometry import scale_boxes, xywh_to_xyxy

HEADER = ("%22s" + "%11s" * 6) % ("Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95")
ROW = "%22s" + "%11i" * 2 + "%11.3g" * 4


def split_outputs(out):
    """Model eval output → (main-head predictions (B, 4+nc, A), raw train-form maps or None).

    DDetect: (y, maps); DualDDetect: ([y_aux, y_main], [maps_aux, maps_main]); a bare tensor is taken as y."""
    if isinstance(out, torch.Tensor):
        return out, None
    y, raw = (out[0], out[1]) if len(out) == 2 else (out, None)
    if isinstance(y, (list, tuple)):
        y = y[-1] if len(y) == 2 else y[0]
    return y, raw


def to_float(imgs, half):
    """uint8 (B, 3, H, W) images → float in [0, 1]: fp16 when `half`, else fp32."""
    return (imgs.half() if half else imgs.float()) / 255


def _forward(model, imgs, augment):
    """(main-head predictions, raw maps or None) of float images `imgs` (test-time augmentation when `augment`)."""
    if augment:
        from yolov9c.engine.tta import augmented_inference

        return augmented_inference(model, imgs, return_maps=True)
    return split_outputs(model(imgs))


def _chunked_forward(model, imgs, chunk, half, augment):
    """_forward over uint8 `imgs` (B, 3, H, W) `chunk` images at a time (the last chunk smaller), each chunk made
    float on its own: the same (predictions, raw maps) as one pass over the whole batch, since an eval-mode
    model treats every image on its own (BatchNorm uses its running statistics). The outputs of the whole batch
    are written into buffers allocated at the first chunk, so only one chunk's activations are alive at a time.
    Test: tests/engine/val/test_val_chunks.py."""
    out = None
    for start in range(0, imgs.shape[0], chunk):
        part = _forward(model, to_float(imgs[start:start + chunk], half), augment)
        if out is None:
            out = _batch_buffers(part, imgs.shape[0])
        _copy_rows(out, part, start)
        del part  # the chunk's outputs, before the next chunk's activations
    return out


def _batch_buffers(part, n):
    """Empty tensors like each tensor of the nested lists/tuples `part`, with n rows (dim 0); None stays None."""
    if isinstance(part, torch.Tensor):
        return part.new_empty((n, *part.shape[1:]))
    if isinstance(part, (list, tuple)):
        return type(part)(_batch_buffers(p, n) for p in part)
    return part


def _copy_rows(out, part, start):
    """out[start:start + rows] = part, leaf by leaf over the same nesting as _batch_buffers made."""
    if isinstance(part, torch.Tensor):
        out[start:start + part.shape[0]].copy_(part)
    elif isinstance(part, (list, tuple)):
        for o, p in zip(out, part):
            _copy_rows(o, p, start)


def _device_of(model):
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


class _Timer:
    def __init__(self, device):
        self.t, self.cuda = 0.0, device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
        self.t += time.perf_counter() - self.start


def _save_txt(predn, shape0, path, save_conf):
    h0, w0 = shape0
    lines = []
    for x1, y1, x2, y2, conf, cls in predn.tolist():
        row = [int(cls), (x1 + x2) / 2 / w0, (y1 + y2) / 2 / h0, (x2 - x1) / w0, (y2 - y1) / h0]
        if save_conf:
            row.append(conf)
        lines.append(("%g " * len(row)).rstrip() % tuple(row))
    with open(path, "a") as f:
        f.write("".join(line + "\n" for line in lines))


@dataclass
class ValConfig:
    """How validate() runs and what it writes: val_dual.py builds one from its flags, training's per-epoch and
    final validations their own (training=True: no speed line, no "Results saved")."""
    # detections
    conf_thres: float = 0.001
    iou_thres: float = 0.7
    max_det: int = 300
    half: bool = False  # fp16, CUDA only, on an fp16 copy: the caller's weights are never converted
    single_cls: bool = False  # every label and prediction class 0, class-agnostic NMS
    augment: bool = False  # test-time augmentation (yolov9c/engine/tta.py; the loss on the scale-1 pass)
    time_limit: float | None = None  # NMS seconds per batch (None: no limit; postprocess.published_time_limit)
    # outputs in save_dir
    save_dir: str | Path | None = None
    plots: bool = False  # val_batch*_labels/pred.jpg, confusion matrix, PR/F1/P/R curves
    verbose: bool = False  # the per-class rows of the table
    save_txt: bool = False  # labels/*.txt, one row per detection (save_conf: with its confidence)
    save_conf: bool = False
    save_hybrid: bool = False  # the labels join the detections before NMS (published --save-hybrid)
    save_json: bool = False  # the COCO-JSON predictions as save_dir/json_name
    json_name: str = "predictions.json"
    # COCO evaluation of the save_json predictions (yolov9c/engine/val/coco.py)
    anno_json: str | Path | None = None  # None: the predictions are written, not evaluated
    class_map: list | None = None  # class → category id (None: the index)
    image_ids: list | None = None  # the images COCO evaluates (None: all of anno_json)
    # the caller
    training: bool = False
    progress: bool = True  # a tqdm bar over the batches, its description the table's header
    chunk: int | None = None  # images per forward (None: the whole batch); the batch of record is the loader's


@torch.no_grad()
def validate(model, dataloader, *, nc, names, cfg=None, compute_loss=None, log=print):
    """Validate `model` on `dataloader` (a val loader: rect, pad 0.5, no augmentation) as `cfg` (a ValConfig;
    None: its defaults) says; compute_loss: the training loss, to report the validation loss on the raw maps.

    Returns dict: mp, mr, map50, map (floats), maps (nc,) numpy per-class mAP50-95 (classes without labels
    get the mean), box_loss, cls_loss, dfl_loss (mean per batch; 0 without compute_loss), fitness-ready
    values, speed (pre, inference, nms) in ms per image, ap_class (classes with labels), nt (nc,) label
    counts, seen (images), coco_stats (COCOeval's 12 stats when COCO evaluated, else None). names: list or dict
    of class names."""
    cfg = cfg or ValConfig()
    if isinstance(names, dict):
        names = [names[k] for k in sorted(names)]
    names = list(names) if names is not None else [str(i) for i in range(nc)]
    device = _device_of(model)
    half = bool(cfg.half) and device.type == "cuda"
    caller, was_training = model, model.training
    # a converted copy, never the caller's weights in place: an fp16 round trip would quantise the EMA
    # (the published code leaves the training EMA in fp16 after the first validation)
    dtype = torch.float16 if half else torch.float32
    if any(p.is_floating_point() and p.dtype != dtype for p in model.parameters()):
        model = copy.deepcopy(model).to(dtype)
    model.eval()
    save_dir = Path(cfg.save_dir) if cfg.save_dir is not None else None
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
        if cfg.save_txt:
            (save_dir / "labels").mkdir(parents=True, exist_ok=True)
    run = _Run(cfg, save_dir, nc, device)
    dt = [_Timer(device), _Timer(device), _Timer(device)]
    loss = torch.zeros(3, device=device)
    nb, shape = 0, None
    batches = bar(dataloader, desc=HEADER, leave=False) if cfg.progress else dataloader
    for batch_i, (imgs, targets, paths, shapes) in enumerate(batches):
        nb += 1
        bs, _, height, width = imgs.shape
        chunked = cfg.chunk is not None and cfg.chunk < bs
        with dt[0]:
            imgs = imgs.to(device, non_blocking=True)
            if not chunked:  # chunked: each chunk is made float in _chunked_forward (one chunk's float copy)
                imgs = to_float(imgs, half)
            targets = targets.to(device)
        shape = (height, width)
        with dt[1]:
            if chunked:
                preds, raw = _chunked_forward(model, imgs, cfg.chunk, half, cfg.augment)
            else:
                preds, raw = _forward(model, imgs, cfg.augment)
        if compute_loss is not None:
            if raw is None:
                raise ValueError("compute_loss needs the raw maps: the model's eval output has none")
            loss += torch.as_tensor(compute_loss(raw, targets)[1], device=device).float().view(-1)[:3]
        targets = targets.clone()
        if cfg.single_cls:  # the loader does this with single_cls=True; repeated so any val loader works
            targets[:, 1] = 0
        targets[:, 2:] *= torch.tensor((width, height, width, height), device=device)  # to pixels
        hybrid = [targets[targets[:, 0] == i, 1:] for i in range(bs)] if cfg.save_hybrid else None
        with dt[2]:
            dets = non_max_suppression(preds, cfg.conf_thres, cfg.iou_thres, multi_label=True,
                                       agnostic=cfg.single_cls, max_det=cfg.max_det, time_limit=cfg.time_limit,
                                       labels=hybrid)
        for si, pred in enumerate(dets):
            run.add_image(pred, targets[targets[:, 0] == si, 1:], shape, shapes[si], paths[si])
        if cfg.plots and save_dir is not None and batch_i < 3:
            from yolov9c.engine.val.plots import plot_images

            plot_images(imgs, targets, paths, save_dir / f"val_batch{batch_i}_labels.jpg", names)
            plot_images(imgs, _dets_as_targets(dets), paths, save_dir / f"val_batch{batch_i}_pred.jpg", names)

    result = _summarise(run.stats, nc, names, run.seen, cfg.verbose, cfg.training, log)
    speed = tuple(t.t / max(run.seen, 1) * 1e3 for t in dt)
    if not cfg.training:
        log(f"Speed: %.1fms pre-process, %.1fms inference, %.1fms NMS per image at shape "
            f"{_nominal_shape(dataloader, shape)}" % speed)
    if cfg.plots and save_dir is not None:
        from yolov9c.engine.val.plots import plot_confusion_matrix, plot_metric_curves

        plot_confusion_matrix(run.cm, names, save_dir)
        if result["curves"] is not None:
            plot_metric_curves(result["curves"], names, save_dir)
    coco_stats = _save_json(run.jdict, cfg, save_dir, log) if cfg.save_json and save_dir is not None else None
    if coco_stats is not None:
        result["map"], result["map50"] = coco_stats[0], coco_stats[1]
    loss = (loss / max(nb, 1)).cpu().tolist()
    result.update(box_loss=loss[0], cls_loss=loss[1], dfl_loss=loss[2], speed=speed, seen=run.seen,
                  coco_stats=coco_stats)
    caller.train(was_training)
    if save_dir is not None and not cfg.training:
        log(f"Results saved to {save_dir}")
    return result


def _nominal_shape(dataloader, last_hw):
    """(batch size, 3, imgsz, imgsz) for the speed line, as published: the loader's nominal size, not the shape
    of its last rect batch (e.g. 480 × 672 at imgsz 640); a loader whose dataset has no int img_size gives
    the last batch's (h, w)."""
    imgsz = getattr(getattr(dataloader, "dataset", None), "img_size", None)
    hw = (imgsz, imgsz) if isinstance(imgsz, int) else (last_hw or (0, 0))
    return (getattr(dataloader, "batch_size", "?"), 3, *hw)


class _Run:
    """What one validation gathers image by image: the match statistics, the confusion matrix (plots), the
    COCO-JSON rows (save_json) and the label files (save_txt)."""

    def __init__(self, cfg, save_dir, nc, device):
        self.cfg, self.save_dir, self.device = cfg, save_dir, device
        self.iouv = IOU_THRESHOLDS.to(device)
        self.cm = ConfusionMatrix(nc=nc)
        self.stats, self.jdict, self.seen = [], [], 0

    def add_image(self, pred, labels, shape, shapes_i, path):
        """One image: pred (n, 6) NMS rows at the letterboxed `shape`, labels (m, 5) [cls, xywh pixels],
        shapes_i the loader's ((h0, w0), ratio_pad)."""
        cfg, device = self.cfg, self.device
        nl, npr = labels.shape[0], pred.shape[0]
        self.seen += 1
        correct = torch.zeros(npr, len(self.iouv), dtype=torch.bool, device=device)
        if npr == 0:
            if nl:
                self.stats.append((correct, torch.zeros(0, device=device), torch.zeros(0, device=device),
                                   labels[:, 0]))
                if cfg.plots:
                    self.cm.process_batch(None, labels[:, 0])
            return
        if cfg.single_cls:
            pred[:, 5] = 0
        shape0, ratio_pad = shapes_i[0], shapes_i[1]
        predn = pred.clone().float()
        scale_boxes(predn, shape, shape0, ratio_pad)
        if nl:
            labelsn = torch.cat((labels[:, 0:1], xywh_to_xyxy(labels[:, 1:5])), 1).float()
            scale_boxes(labelsn[:, 1:], shape, shape0, ratio_pad)
            correct = match_predictions(predn, labelsn, self.iouv)
            if cfg.plots:
                self.cm.process_batch(predn, labelsn)
        self.stats.append((correct, pred[:, 4].float(), pred[:, 5].float(), labels[:, 0]))
        if cfg.save_txt and self.save_dir is not None:
            _save_txt(predn, shape0, self.save_dir / "labels" / (Path(path).stem + ".txt"), cfg.save_conf)
        if cfg.save_json:
            self.jdict += json_rows(predn, path, cfg.class_map)


def _save_json(jdict, cfg, save_dir, log):
    """Write the COCO-JSON predictions; COCO's 12 stats when cfg.anno_json is given and there are
    predictions (and pycocotools evaluates them), else None."""
    jpath = save_dir / cfg.json_name
    jpath.write_text(json.dumps(jdict))
    log(f"Saving {jpath}... ({len(jdict)} predictions)")
    if cfg.anno_json is None:
        log("--save-json: predictions written; no COCO annotations given, COCO evaluation skipped")
        return None
    if not jdict:
        log("--save-json: no predictions above the confidence threshold; COCO evaluation skipped")
        return None
    return coco_evaluate(jpath, cfg.anno_json, cfg.image_ids, log)


def _dets_as_targets(dets):
    """NMS output list → (N, 7) [image, cls, xc, yc, w, h, conf] pixel rows for plot_images."""
    rows = []
    for i, d in enumerate(dets):
        if d.shape[0]:
            d = d[:, :6].float()
            xywh = torch.cat(((d[:, :2] + d[:, 2:4]) / 2, d[:, 2:4] - d[:, :2]), 1)
            rows.append(torch.cat((torch.full_like(d[:, :1], i), d[:, 5:6], xywh, d[:, 4:5]), 1))
    return torch.cat(rows, 0) if rows else torch.zeros((0, 7))


def _summarise(stats, nc, names, seen, verbose, training, log):
    """Concatenate per-image stats, compute metrics and print the table."""
    if stats:
        tp, conf, pcls, tcls = (torch.cat([s[k] for s in stats], 0).cpu().numpy() for k in range(4))
    else:
        tp, conf, pcls, tcls = np.zeros((0, 10), bool), np.zeros(0), np.zeros(0), np.zeros(0)
    nt = np.bincount(tcls.astype(np.int64), minlength=nc) if len(tcls) else np.zeros(nc, np.int64)
    mp = mr = map50 = map5095 = 0.0
    ap_class, ap50, ap = np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    res = None
    if len(tp) and tp.any():
        res = ap_per_class(tp, conf, pcls, tcls)
        ap_class, ap50, ap = res["classes"], res["ap"][:, 0], res["ap"].mean(1)
        mp, mr, map50, map5095 = res["p"].mean(), res["r"].mean(), ap50.mean(), ap.mean()
    log(HEADER)
    log(ROW % ("all", seen, nt.sum(), mp, mr, map50, map5095))
    if nt.sum() == 0:
        log("WARNING: no labels found in the val set, can not compute metrics without labels")
    if (verbose or (nc < 50 and not training)) and nc > 1 and res is not None:
        for i, c in enumerate(ap_class):
            name = names[c] if c < len(names) else str(c)
            log(ROW % (name, seen, nt[c], res["p"][i], res["r"][i], ap50[i], ap[i]))
    maps = np.zeros(nc) + map5095
    for i, c in enumerate(ap_class):
        if c < nc:
            maps[c] = ap[i]
    return {"mp": float(mp), "mr": float(mr), "map50": float(map50), "map": float(map5095), "maps": maps,
                "ap_class": ap_class, "ap50": ap50, "nt": nt, "curves": res}
