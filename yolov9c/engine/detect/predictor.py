"""The detect workflow of detect_dual.py: weights → fused model → sources → NMS → annotated files and labels.

`detect(DetectConfig(weights=..., source=..., ...))` runs it and returns a summary dict (yolov9c/cli/detect.py is
its command line). Published behaviour (detect_dual.py): fused model; letterbox with minimal stride padding; the main
head's output (y[1] of DualDDetect, y of DDetect); single-label NMS (conf 0.25, IoU 0.45, max_det 1000 by
default); boxes scaled back to the original image. Outputs in `runs/detect/exp{N}`:
- annotated images under the same name, videos as `<stem>.mp4` (mp4v), unless `nosave`;
- with `save_txt`, `labels/<stem>.txt` (`_<frame>` for video frames): `class xc yc w h [conf]` rows normalised
  to the original image (conf with `save_conf`) of the whole-pixel boxes, least confident first (as published);
- with `save_crop`, `crops/<class name>/<stem>.jpg` (`<stem>2.jpg`, … for further boxes).
One log line per image/frame (`image 1/3 path: 128x160 2 ellipses, <t>ms`), then the speed summary. An
unreadable file gives one `WARNING: image 2/5 path: reason, skipped` line and the run goes on; the last line
counts the skipped files and the result's `failed` lists them.
Test: python -m pytest -q tests/engine/detect/test_detect_predictor.py
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch

from yolov9c.engine.detect.annotate import class_color, crop_box, detection_label, draw_detection
from yolov9c.engine.run_dir import increment_path
from yolov9c.engine.detect.sources import MediaSource, resolve_sources
from yolov9c.geometry import scale_boxes


def inference_device(spec=""):
    """--device string → torch.device: '' (CUDA 0 when available, else CPU), 'cpu', '0' or '0,1' (the first
    listed GPU: detection runs on one device). Raises ValueError for a GPU request without CUDA."""
    spec = str(spec).strip().lower().replace("cuda:", "")
    if spec in ("", None):
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    ids = [s for s in spec.replace(" ", "").split(",") if s]
    if not ids or not all(s.isdigit() for s in ids):
        raise ValueError(f"--device {spec!r}: expected 'cpu', a GPU index such as 0, or a list such as 0,1")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {spec}: CUDA is not available on this machine (use --device cpu)")
    if int(ids[0]) >= torch.cuda.device_count():
        raise ValueError(f"--device {spec}: GPU {ids[0]} does not exist ({torch.cuda.device_count()} visible)")
    return torch.device(f"cuda:{ids[0]}")


def load_detector(weights, device="cpu", half=False, fuse=True):
    """The model of checkpoint `weights` (ours, a published YOLOv9 .pt, or a converted gelan file), ready for
    inference: eval mode, fused (BatchNorm folded, RepConvN merged) when `fuse`, on `device`, fp16 when
    `half` (CUDA only). Raises FileNotFoundError / CheckpointError from the loader."""
    from yolov9c.models.weights import load_model  # imports flow down: not the package face

    model = load_model(weights)
    if fuse:
        model.fuse()
    model = model.to(device).eval()
    return model.half() if half else model.float()


def main_head_output(out):
    """The main head's decoded predictions from an eval-mode forward: DDetect (y, maps) → y; DualDDetect
    ([y_aux, y_main], maps) → y_main; a bare tensor passes. Returns (B, 4+nc, A)."""
    y = out[0] if isinstance(out, tuple) else out
    if isinstance(y, (list, tuple)):
        y = y[-1]  # [aux, main]: the published detect_dual.py takes pred[0][1]
    return y


def label_rows(det, shape, save_conf=False):
    """Label-file lines for detections `det` ((n, 6) [x1, y1, x2, y2, conf, cls], original pixels) of an
    image of shape (h, w): 'cls xc yc w h[ conf]' normalised, numbers in %g format."""
    h, w = shape[:2]
    rows = []
    for x1, y1, x2, y2, conf, c in det.tolist():
        vals = [int(c), (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h]
        if save_conf:
            vals.append(conf)
        rows.append(" ".join(f"{v:g}" for v in vals))
    return rows


def _unique_file(path):
    """path, or stem2, stem3, … beside it: the first name not taken (crops of several boxes of one image)."""
    path, n = Path(path), 2
    out = path
    while out.exists():
        out = path.with_name(f"{path.stem}{n}{path.suffix}")
        n += 1
    return out


def _counts_text(det, names):
    """'2 ellipses, 1 star, ' (published plural: an 's' appended) for the log line."""
    parts = []
    for c in det[:, 5].unique().tolist():
        n = int((det[:, 5] == c).sum())
        parts.append(f"{n} {_name(names, c)}{'s' * (n > 1)}, ")
    return "".join(parts)


def _name(names, c):
    c = int(c)
    return names[c] if 0 <= c < len(names) else str(c)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class DetectConfig:
    """Every option of one detection run: detect_dual.py's flags, same names and defaults."""
    weights: str | Path | None = None  # checkpoint path (unused when detect() is given a model)
    source: object = None  # what sources.resolve_sources accepts: a file, folder, glob, list or .txt list
    imgsz: int | tuple = (640, 640)  # int or (h, w); rounded up to the model's stride, with a warning
    conf_thres: float = 0.25
    iou_thres: float = 0.45
    max_det: int = 1000
    classes: list | None = None  # class ids to keep (None: all)
    agnostic_nms: bool = False
    augment: bool = False  # test-time augmentation (yolov9c/engine/tta.py)
    device: str = ""  # '' (CUDA 0 when available, else CPU), 'cpu', '0', '0,1' (the first listed GPU)
    half: bool = False  # fp16, CUDA only (on the CPU a note is logged and fp32 used)
    vid_stride: int = 1
    # outputs in project/name (exp, exp2, … unless exist_ok)
    project: str | Path = "runs/detect"
    name: str = "exp"
    exist_ok: bool = False
    save_txt: bool = False
    save_conf: bool = False
    save_crop: bool = False
    nosave: bool = False  # no annotated images or videos
    line_thickness: int = 3
    hide_labels: bool = False
    hide_conf: bool = False


def detect(cfg, model=None, log=print):
    """Run detection as `cfg` (a DetectConfig) says and write the outputs; returns {'save_dir': Path, 'frames':
    int, 'detections': int, 'labels': int (label files written), 'speed': (pre, inference, nms) ms per image,
    'files': int (sources), 'failed': [(path, reason)] of the files skipped because they could not be read}.

    model: an eval-mode module with `stride` and `names` whose eval forward returns the published structures
    (cfg.weights is then not loaded). Unreadable files are skipped (see above), never raised. Raises
    SourceError / FileNotFoundError / CheckpointError / ValueError for a source, weights file or option that
    cannot be used at all (before anything is written)."""
    from yolov9c.engine.postprocess import non_max_suppression
    from yolov9c.engine.tta import augmented_inference

    files = resolve_sources(cfg.source)
    dev = inference_device(cfg.device)
    half = cfg.half
    if half and dev.type != "cuda":
        log("half precision needs CUDA: running in float32 on the CPU")
        half = False
    if model is None:
        model = load_detector(cfg.weights, dev, half)
    stride = int(max(float(s) for s in torch.as_tensor(model.stride).flatten()))
    names = list(getattr(model, "names", []) or [])
    imgsz = _image_size(cfg.imgsz, stride, log)
    out = _Outputs(cfg, names)
    dtype = torch.float16 if half else torch.float32
    totals = np.zeros(3)
    frames = n_det = 0
    try:
        source = MediaSource(files, imgsz, stride, auto=True, vid_stride=cfg.vid_stride, warn=log)
        for fr in source:
            t0 = time.perf_counter()
            x = torch.from_numpy(fr.img).to(dev).to(dtype)[None] / 255
            _sync(dev)
            t1 = time.perf_counter()
            with torch.inference_mode():
                pred = augmented_inference(model, x) if cfg.augment else main_head_output(model(x))
            _sync(dev)
            t2 = time.perf_counter()
            det = non_max_suppression(pred, cfg.conf_thres, cfg.iou_thres, classes=cfg.classes,
                                      agnostic=cfg.agnostic_nms, multi_label=False, max_det=cfg.max_det)[0]
            _sync(dev)
            t3 = time.perf_counter()
            totals += (t1 - t0, t2 - t1, t3 - t2)
            frames += 1

            det = det.float().cpu()
            scale_boxes(det, x.shape[2:], fr.img0.shape[:2])
            det[:, :4] = det[:, :4].round()  # published: whole pixels for labels, crops and drawing
            n_det += len(det)
            msg = fr.describe() + f"{x.shape[2]}x{x.shape[3]} " + (_counts_text(det, names) if len(det) else
                                                                    "(no detections), ")
            log(f"{msg}{(t2 - t1) * 1e3:.1f}ms")
            out.write(fr, det)
    finally:
        out.close()

    speed = tuple(totals / max(frames, 1) * 1e3)
    log(f"Speed: {speed[0]:.1f}ms pre-process, {speed[1]:.1f}ms inference, {speed[2]:.1f}ms NMS per image at "
        f"shape {(1, 3, *imgsz)}")
    saved = f"\n{len(out.label_files)} labels saved to {out.save_dir / 'labels'}" if cfg.save_txt else ""
    if cfg.save_txt or not cfg.nosave or cfg.save_crop:
        log(f"Results saved to {out.save_dir}{saved}")
    if source.failed:
        log(f"WARNING: {len(source.failed)} of {len(files)} files could not be read and were skipped "
            "(the WARNING lines above say why)")
    return {"save_dir": out.save_dir, "frames": frames, "detections": n_det, "labels": len(out.label_files),
            "speed": speed, "files": len(files), "failed": list(source.failed)}


def _image_size(imgsz, stride, log):
    """(h, w) from an int or a 1- or 2-sequence, rounded up to a multiple of `stride` (the published
    check_img_size, with its warning)."""
    imgsz = (int(imgsz), int(imgsz)) if np.isscalar(imgsz) else tuple(int(v) for v in imgsz)
    if len(imgsz) == 1:
        imgsz = imgsz * 2
    fixed = tuple(-(-v // stride) * stride for v in imgsz)
    if fixed != imgsz:
        log(f"WARNING: --imgsz {list(imgsz)} must be a multiple of max stride {stride}, updating to {list(fixed)}")
    return fixed


class _Outputs:
    """What one run writes in its save_dir (project/name, exp, exp2, …): label files, crops, annotated images
    and videos (one cv2.VideoWriter per video, released by close())."""

    def __init__(self, cfg, names):
        self.cfg, self.names = cfg, names
        self.save_dir = increment_path(Path(cfg.project) / cfg.name, exist_ok=cfg.exist_ok, mkdir=True)
        if cfg.save_txt:
            (self.save_dir / "labels").mkdir(exist_ok=True)
        self.writers = {}  # video path -> cv2.VideoWriter
        self.label_files = set()

    def write(self, fr, det):
        """Frame `fr` (sources.Frame) and its detections (n, 6) in original pixels, most confident first. They
        are written least confident first (published reversed(det)): label rows and crop numbering in that
        order, and the most confident box is drawn last, on top."""
        cfg, names, p = self.cfg, self.names, Path(fr.path)
        det = det.flip(0)
        if cfg.save_txt and len(det):
            lf = self.save_dir / "labels" / (p.stem + (f"_{fr.frame}" if fr.is_video else "") + ".txt")
            with open(lf, "a") as f:  # append, as published (one file per image / frame)
                f.write("".join(r + "\n" for r in label_rows(det, fr.img0.shape, cfg.save_conf)))
            self.label_files.add(lf)
        if cfg.save_crop and len(det):
            for *xyxy, conf, c in det.tolist():
                folder = self.save_dir / "crops" / _name(names, c)
                folder.mkdir(parents=True, exist_ok=True)
                cv2.imwrite(str(_unique_file(folder / f"{p.stem}.jpg")), crop_box(fr.img0, xyxy))
        if cfg.nosave:
            return
        im = fr.img0  # drawn in place: crops were cut first
        for *xyxy, conf, c in det.tolist():
            draw_detection(im, xyxy, detection_label(_name(names, c), conf, cfg.hide_labels, cfg.hide_conf),
                           class_color(c), cfg.line_thickness)
        if fr.is_video:
            w = self.writers.get(fr.path)
            if w is None:
                out = str(self.save_dir / f"{p.stem}.mp4")
                w = cv2.VideoWriter(out, cv2.VideoWriter_fourcc(*"mp4v"), fr.fps or 30.0, (im.shape[1], im.shape[0]))
                if not w.isOpened():
                    raise RuntimeError(f"cannot write video {out} (OpenCV has no mp4v encoder?)")
                self.writers[fr.path] = w
            w.write(im)
        else:
            cv2.imwrite(str(self.save_dir / p.name), im)

    def close(self):
        for w in self.writers.values():
            w.release()
