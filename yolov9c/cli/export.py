"""`python -m yolov9c export --weights best.pt --format onnx`: a trained model as an ONNX file, checked.

    python -m yolov9c export --weights runs/train/exp/weights/best.pt --format onnx          # -> best.onnx
    python -m yolov9c export --weights best.pt --img 320 --dynamic --source path/to/images    # batch left free

Loads the checkpoint (ours, a published .pt or a converted gelan file), fuses it as detect_dual.py does and writes
`<weights stem>.onnx` beside the weights (as the published export.py does): input `images` (B, 3, H, W) float32 RGB
in [0, 1], output `output0` (B, 4 + nc, A), the main head's predictions before NMS (yolov9c/models/export.py). Then,
when onnxruntime is installed, it runs `--check N` images (default 3, from `--source`, default the built-in
synthetic validation images; letterboxed to --img) through both the torch model and the file and fails when they
differ beyond float32 rounding (boxes in pixels, class scores absolutely: models/export.py), removing the file it
wrote (0: no check, the file is kept unchecked). `--include onnx` is accepted as in the published script. onnx
missing: one error line naming the pip command (`pip install "yolov9c[export]"`); exit code 2 for every user error,
as the other subcommands.
Test: python -m pytest -q tests/models/test_export.py
"""

from __future__ import annotations

import sys
from pathlib import Path

FORMATS = ("onnx",)
MIN_OPSET = 9  # torch's constant folding needs 9; opset 7 cannot export the upsampling
EXIT_USAGE = 2


def add_parser(subparsers):
    """Add the `export` subcommand to an argparse subparsers object (func=run); returns its parser."""
    p = subparsers.add_parser("export", help="export a trained model to ONNX (checked against the torch model)",
                              description="Export a checkpoint to ONNX: <weights stem>.onnx beside the weights, "
                                          "input images (B,3,H,W) float in [0,1], output0 (B,4+nc,A) before NMS.")
    p.add_argument("--weights", required=True, help="checkpoint: ours, a published YOLOv9 .pt or a converted gelan")
    p.add_argument("--format", "--include", dest="format", nargs="+", default=["onnx"], choices=FORMATS,
                   help="export format (onnx)")
    p.add_argument("--imgsz", "--img", "--img-size", nargs="+", type=int, default=[640],
                   help="image size h w (one value: square; default 640), a multiple of the model stride")
    p.add_argument("--batch-size", "--batch", type=int, default=1, help="batch size of the graph (default 1)")
    p.add_argument("--dynamic", action="store_true", help="leave the batch size free")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset version (default 17)")
    p.add_argument("--device", default="cpu", help="device to trace on: cpu (default) or a GPU index")
    p.add_argument("--check", type=int, default=3, metavar="N",
                   help="compare N images through torch and onnxruntime (default 3; 0 = no check)")
    p.add_argument("--source", default=None,
                   help="images for --check (file, folder, glob; default: the built-in synthetic val images)")
    p.set_defaults(func=run)
    return p


def _check_args(args):
    """Argument errors as ValueError (the CLI prints them as one error line, exit 2)."""
    if len(args.imgsz) not in (1, 2) or min(args.imgsz) < 32:
        raise ValueError(f"--imgsz: one or two sizes of at least 32 expected, got {args.imgsz}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.opset < MIN_OPSET:  # below it torch's exporter fails on this graph after printing the whole IR graph
        raise ValueError(f"--opset {args.opset}: the model exports at opset {MIN_OPSET} or later (default 17)")
    if args.check < 0:
        raise ValueError(f"--check must be >= 0, got {args.check}")
    if not Path(args.weights).is_file():
        from yolov9c.models.published import weights_not_found

        raise FileNotFoundError(weights_not_found(args.weights))


def check_images(source, n, imgsz):
    """Up to `n` images of `source` (None: the synthetic val images), letterboxed to imgsz (h, w):
    (N, 3, h, w) float32 RGB in [0, 1]."""
    import numpy as np
    import torch

    from yolov9c.data.images import IMG_FORMATS, BadImage, read_image
    from yolov9c.data.letterbox import letterbox
    from yolov9c.engine.detect.sources import resolve_sources

    if source is None:
        from yolov9c.data.dataset_yaml import load_data_config

        source = load_data_config("synthetic")["val"][0]
    batch = []
    for f in (f for f in resolve_sources(source) if Path(f).suffix[1:].lower() in IMG_FORMATS):
        try:  # a bad file is skipped with its name, as detect does, not the whole export refused without it
            im = read_image(f)
        except BadImage as e:
            print(f"WARNING: --check: {f}: {e}, skipped")
            continue
        batch.append(letterbox(im, imgsz, auto=False)[0][:, :, ::-1].transpose(2, 0, 1))
        if len(batch) == n:
            break
    if not batch:
        raise ValueError(f"--source {source}: no readable image files for --check")
    return torch.from_numpy(np.ascontiguousarray(np.stack(batch))).float() / 255.0


def run(args) -> int:
    """Export as `args` says; returns the exit code: 0 done, 2 a user error (one `error:` line on stderr)."""
    from yolov9c.data.images import BadImage
    from yolov9c.models.checkpoint import CheckpointError
    from yolov9c.models.export import ExportDependencyError, ExportError

    try:
        return _export(args)
    except (ExportDependencyError, ExportError, CheckpointError, FileNotFoundError, ValueError, BadImage) as e:
        print(f"python -m yolov9c export: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _export(args) -> int:
    from yolov9c.engine.detect.predictor import inference_device, load_detector
    from yolov9c.models.export import ExportError, check_onnx, export_onnx, num_anchors

    _check_args(args)
    imgsz = args.imgsz * 2 if len(args.imgsz) == 1 else args.imgsz
    device = inference_device(args.device)
    model = load_detector(args.weights, device=device, fuse=True)
    images = None
    if args.check:  # read the check images first: a bad --source fails before anything is written
        images = check_images(args.source, max(args.check, args.batch_size), imgsz)
    out = Path(args.weights).with_suffix(".onnx")
    export_onnx(model, out, imgsz=imgsz, batch=args.batch_size, opset=args.opset, dynamic=args.dynamic)
    b = "batch" if args.dynamic else args.batch_size
    print(f"ONNX: exported {out} ({out.stat().st_size / 1e6:.1f} MB, opset {args.opset}): input images "
          f"({b}, 3, {imgsz[0]}, {imgsz[1]}) float RGB in [0, 1], output0 ({b}, {4 + model.nc}, "
          f"{num_anchors(model, imgsz)}) before NMS")
    if images is None:
        return 0
    try:
        import onnxruntime  # noqa: F401  (optional: checking only)
    except ImportError:
        print("ONNX: output not checked: onnxruntime is not installed (pip install onnxruntime)", file=sys.stderr)
        return 0
    try:
        report = check_onnx(model, out, images)
    except ExportError as e:  # a file that failed its check is not left beside the weights
        out.unlink(missing_ok=True)
        raise ExportError(f"{e}; removed {out} (--check 0 keeps an unchecked file)") from e
    print(f"ONNX: checked on {report['images']} image(s) against the torch model: boxes differ by at most "
          f"{report['box_px']:.3g} px, class scores by at most {report['score']:.3g}")
    return 0
