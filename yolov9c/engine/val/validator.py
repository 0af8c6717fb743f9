"""validate(): run a detection model over a validation loader and compute the published metrics (spec §7).

Per batch: uint8 letterboxed images → float / 255 (half if asked) → model in eval mode → main head (y[1]
for DualDDetect, y for DDetect; the raw maps go to compute_loss when given, so the validation loss is really
computed) → multi-label NMS (agnostic when single_cls) → boxes mapped back to each original image with the
loader's shapes ((h0, w0), ((gain_h, gain_w), (pad_w, pad_h))) → matching at IoU 0.50:0.05:0.95 → metrics.
Prints the published table (`Class Images Instances P R mAP50 mAP50-95`, the `all` line, per class when
verbose) and a speed line; while it runs, a progress bar whose description is that header (progress=False:
none). Optional outputs in save_dir: labels/*.txt (save_txt), the COCO-JSON predictions (save_json, file
json_name; COCO's evaluator then replaces mAP50 and mAP50-95 when it is installed and anno_json exists:
yolov9c/engine/val/coco.py), plots.

Test: python -m pytest -q tests/test_val_validator.py tests/test_val_coco.py
"""

import copy
import json
import time
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


@torch.no_grad()
def validate(model, dataloader, *, nc, names, conf_thres=0.001, iou_thres=0.7, max_det=300, half=False,
             single_cls=False, compute_loss=None, save_dir=None, plots=False, verbose=False, log=print,
             save_txt=False, save_conf=False, save_hybrid=False, save_json=False, anno_json=None,
             class_map=None, image_ids=None, json_name="predictions.json", time_limit=None, training=False,
             augment=False, progress=True):
    """Validate `model` on `dataloader` (a val loader: rect, pad 0.5, no augmentation).

    Returns dict: mp, mr, map50, map (floats), maps (nc,) numpy per-class mAP50-95 (classes without labels
    get the mean), box_loss, cls_loss, dfl_loss (mean per batch; 0 without compute_loss), fitness-ready
    values, speed (pre, inference, nms) in ms per image, ap_class (classes with labels), nt (nc,) label
    counts, seen (images), coco_stats (COCOeval's 12 stats when COCO evaluated, else None). names: list or dict
    of class names. save_json: write save_dir/json_name; class_map: class → category id (None: the index);
    anno_json: COCO annotations to evaluate against (None: write only); image_ids: the images COCO evaluates
    (None: all of anno_json). augment: test-time augmentation (yolov9c/engine/tta.py; the loss, when asked,
    is computed on the plain scale-1 pass). progress: a tqdm bar over the batches while it runs, its description
    the table's header (yolov9c/engine/progress.py; cleared at the end, when the header line is logged); False for
    a quiet validation."""
    if isinstance(names, dict):
        names = [names[k] for k in sorted(names)]
    names = list(names) if names is not None else [str(i) for i in range(nc)]
    device = _device_of(model)
    half = bool(half) and device.type == "cuda"
    caller, was_training = model, model.training
    # a converted copy, never the caller's weights in place: an fp16 round trip would quantise the EMA
    # (the published code leaves the training EMA in fp16 after the first validation)
    dtype = torch.float16 if half else torch.float32
    if any(p.is_floating_point() and p.dtype != dtype for p in model.parameters()):
        model = copy.deepcopy(model).to(dtype)
    model.eval()
    save_dir = Path(save_dir) if save_dir is not None else None
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
    if save_txt and save_dir is not None:
        (save_dir / "labels").mkdir(parents=True, exist_ok=True)
    iouv = IOU_THRESHOLDS.to(device)
    cm = ConfusionMatrix(nc=nc)
    dt = [_Timer(device), _Timer(device), _Timer(device)]
    loss = torch.zeros(3, device=device)
    stats, jdict, seen, shape = [], [], 0, None
    nb = 0
    batches = bar(dataloader, desc=HEADER, leave=False) if progress else dataloader
    for batch_i, (imgs, targets, paths, shapes) in enumerate(batches):
        nb += 1
        with dt[0]:
            imgs = imgs.to(device, non_blocking=True)
            imgs = (imgs.half() if half else imgs.float()) / 255
            targets = targets.to(device)
        bs, _, height, width = imgs.shape
        shape = (height, width)
        with dt[1]:
            if augment:
                from yolov9c.engine.tta import augmented_inference

                preds, raw = augmented_inference(model, imgs, return_maps=True)
            else:
                preds, raw = split_outputs(model(imgs))
        if compute_loss is not None:
            if raw is None:
                raise ValueError("compute_loss needs the raw maps: the model's eval output has none")
            loss += torch.as_tensor(compute_loss(raw, targets)[1], device=device).float().view(-1)[:3]
        targets = targets.clone()
        if single_cls:  # the loader does this with single_cls=True; repeated so any val loader works
            targets[:, 1] = 0
        targets[:, 2:] *= torch.tensor((width, height, width, height), device=device)  # to pixels
        hybrid = [targets[targets[:, 0] == i, 1:] for i in range(bs)] if save_hybrid else None
        with dt[2]:
            dets = non_max_suppression(preds, conf_thres, iou_thres, multi_label=True, agnostic=single_cls,
                                       max_det=max_det, time_limit=time_limit, labels=hybrid)
        for si, pred in enumerate(dets):
            labels = targets[targets[:, 0] == si, 1:]
            nl, npr = labels.shape[0], pred.shape[0]
            seen += 1
            correct = torch.zeros(npr, len(iouv), dtype=torch.bool, device=device)
            if npr == 0:
                if nl:
                    stats.append((correct, torch.zeros(0, device=device), torch.zeros(0, device=device),
                                  labels[:, 0]))
                    if plots:
                        cm.process_batch(None, labels[:, 0])
                continue
            if single_cls:
                pred[:, 5] = 0
            shape0, ratio_pad = shapes[si][0], shapes[si][1]
            predn = pred.clone().float()
            scale_boxes(predn, (height, width), shape0, ratio_pad)
            if nl:
                labelsn = torch.cat((labels[:, 0:1], xywh_to_xyxy(labels[:, 1:5])), 1).float()
                scale_boxes(labelsn[:, 1:], (height, width), shape0, ratio_pad)
                correct = match_predictions(predn, labelsn, iouv)
                if plots:
                    cm.process_batch(predn, labelsn)
            stats.append((correct, pred[:, 4].float(), pred[:, 5].float(), labels[:, 0]))
            if save_txt and save_dir is not None:
                _save_txt(predn, shape0, save_dir / "labels" / (Path(paths[si]).stem + ".txt"), save_conf)
            if save_json:
                jdict += json_rows(predn, paths[si], class_map)
        if plots and save_dir is not None and batch_i < 3:
            from yolov9c.engine.val.plots import plot_images

            plot_images(imgs, targets, paths, save_dir / f"val_batch{batch_i}_labels.jpg", names)
            plot_images(imgs, _dets_as_targets(dets), paths, save_dir / f"val_batch{batch_i}_pred.jpg", names)

    result = _summarise(stats, nc, names, seen, verbose, training, log)
    speed = tuple(t.t / max(seen, 1) * 1e3 for t in dt)
    if not training:
        log(f"Speed: %.1fms pre-process, %.1fms inference, %.1fms NMS per image at shape "
            f"{(dataloader.batch_size if hasattr(dataloader, 'batch_size') else '?', 3, *(shape or (0, 0)))}"
            % speed)
    if plots and save_dir is not None:
        from yolov9c.engine.val.plots import plot_confusion_matrix, plot_metric_curves

        plot_confusion_matrix(cm, names, save_dir)
        if result["curves"] is not None:
            plot_metric_curves(result["curves"], names, save_dir)
    coco_stats = None
    if save_json and save_dir is not None:
        jpath = save_dir / json_name
        jpath.write_text(json.dumps(jdict))
        log(f"Saving {jpath}... ({len(jdict)} predictions)")
        if anno_json is None:
            log("--save-json: predictions written; no COCO annotations given, COCO evaluation skipped")
        elif not jdict:
            log("--save-json: no predictions above the confidence threshold; COCO evaluation skipped")
        else:
            coco_stats = coco_evaluate(jpath, anno_json, image_ids, log)
            if coco_stats is not None:
                result["map"], result["map50"] = coco_stats[0], coco_stats[1]
    loss = (loss / max(nb, 1)).cpu().tolist()
    result.update(box_loss=loss[0], cls_loss=loss[1], dfl_loss=loss[2], speed=speed, seen=seen,
                  coco_stats=coco_stats)
    caller.train(was_training)
    if save_dir is not None and not training:
        log(f"Results saved to {save_dir}")
    return result


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
