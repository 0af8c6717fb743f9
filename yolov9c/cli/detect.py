"""The command line of detect_dual.py: the published flags, run through yolov9c.engine.detect.predictor.

    python detect_dual.py --weights runs/train/exp/weights/best.pt --source path/to/images --img 640
    python detect_dual.py --weights yolov9-c.pt --source video.mp4 --save-txt --save-conf --save-crop

Defaults that differ from the published ones, because those would not work here: `--weights` has no default
(the published `yolo.pt` does not exist; a missing flag is a usage error), `--source` defaults to the
built-in synthetic validation images (generated on first use), `--data` (names for non-PyTorch backends)
is accepted and unused. Flags whose feature this package does not provide (`--view-img`: headless OpenCV,
`--visualize`, `--dnn`, `--update`, more than one `--weights`) are refused with a message.
Every user error prints `detect_dual.py: error: …` and returns exit code 2, as argparse does.
Exit codes: 0 every file was processed; 1 the run finished but some files could not be read (each named on
a `WARNING:` line, counted on the last line; the outputs of the others are written); 2 usage or input error.

Test: python -m pytest -q tests/cli/test_detect_cli.py
"""

import argparse
import dataclasses
import sys
from pathlib import Path

from yolov9c.cli.weights_args import check_nms_args, check_refused_and_weights, missing_extension

EXIT_OK, EXIT_SKIPPED, EXIT_USAGE = 0, 1, 2

_REFUSED = {
    "view_img": "--view-img needs a display; OpenCV here is headless. The annotated files are written to "
                "runs/detect/exp*",
    "visualize": "--visualize (feature-map dumps) is not supported by yolov9c",
    "dnn": "--dnn (OpenCV DNN for ONNX files) is not supported: yolov9c runs PyTorch weights (.pt) only",
    "update": "--update is not needed: yolov9c reads published .pt files as they are (to strip a checkpoint "
              "use yolov9c.models.checkpoint.strip_checkpoint)",
}


def build_parser(prog="detect_dual.py"):
    """The argparse parser with the published detect_dual.py flags (same names, abbreviations, defaults)."""
    p = argparse.ArgumentParser(prog=prog, description="YOLOv9 detection on images and videos (yolov9c).")
    p.add_argument("--weights", nargs="+", type=str, default=None,
                   help="model checkpoint: ours, a published YOLOv9 .pt or a converted gelan file (required)")
    p.add_argument("--source", type=str, default=None,
                   help="image/video file, folder, glob or .txt list (default: the built-in synthetic val images)")
    p.add_argument("--data", type=str, default=None,
                   help="dataset yaml (accepted, unused: names come from the weights)")
    p.add_argument("--imgsz", "--img", "--img-size", nargs="+", type=int, default=[640],
                   help="inference size h,w (one value: square)")
    p.add_argument("--conf-thres", type=float, default=0.25, help="confidence threshold")
    p.add_argument("--iou-thres", type=float, default=0.45, help="NMS IoU threshold")
    p.add_argument("--max-det", type=int, default=1000, help="maximum detections per image")
    p.add_argument("--device", default="", help="cuda device, i.e. 0 or 0,1,2,3 (the first is used) or cpu")
    p.add_argument("--view-img", action="store_true", help="show results (not supported: headless)")
    p.add_argument("--save-txt", action="store_true", help="save results to labels/*.txt")
    p.add_argument("--save-conf", action="store_true", help="save confidences in --save-txt labels")
    p.add_argument("--save-crop", action="store_true", help="save cropped prediction boxes")
    p.add_argument("--nosave", action="store_true", help="do not save images/videos")
    p.add_argument("--classes", nargs="+", type=int, help="filter by class: --classes 0, or --classes 0 2 3")
    p.add_argument("--agnostic-nms", action="store_true", help="class-agnostic NMS")
    p.add_argument("--augment", action="store_true", help="augmented inference (TTA: scales 1, 0.83, 0.67 with a flip)")
    p.add_argument("--visualize", action="store_true", help="visualize features (not supported)")
    p.add_argument("--update", action="store_true", help="update all models (not needed here)")
    p.add_argument("--project", default="runs/detect", help="save results to project/name")
    p.add_argument("--name", default="exp", help="save results to project/name")
    p.add_argument("--exist-ok", action="store_true", help="existing project/name ok, do not increment")
    p.add_argument("--line-thickness", default=3, type=int, help="bounding box thickness (pixels)")
    p.add_argument("--hide-labels", default=False, action="store_true", help="hide labels")
    p.add_argument("--hide-conf", default=False, action="store_true", help="hide confidences")
    p.add_argument("--half", action="store_true", help="use FP16 half-precision inference (CUDA)")
    p.add_argument("--dnn", action="store_true", help="use OpenCV DNN for ONNX inference (not supported)")
    p.add_argument("--vid-stride", type=int, default=1, help="video frame-rate stride")
    return p


def _check(parser, opt):
    """Argparse-style errors (exit 2) for values the parser's types cannot catch."""
    check_refused_and_weights(parser, opt, _REFUSED)
    if len(opt.imgsz) not in (1, 2) or min(opt.imgsz) < 1:
        parser.error(f"--imgsz: one or two positive sizes expected, got {opt.imgsz}")
    check_nms_args(parser, opt)
    if opt.vid_stride < 1:
        parser.error(f"--vid-stride must be >= 1, got {opt.vid_stride}")
    if opt.line_thickness < 1:
        parser.error(f"--line-thickness must be >= 1, got {opt.line_thickness}")


def main(argv=None, prog="detect_dual.py"):
    """Parse `argv` (default sys.argv[1:]), run detection, return the exit code (0 ok, 1 some files could not be
    read and were skipped, 2 usage/input error)."""
    from yolov9c.data.dataset_yaml import DataConfigError
    from yolov9c.engine.detect.sources import SourceError
    from yolov9c.models.checkpoint import CheckpointError

    parser = build_parser(prog)
    opt = parser.parse_args(argv)
    _check(parser, opt)
    if not Path(opt.weights[0]).is_file():
        from yolov9c.models.published import weights_not_found

        print(f"{prog}: error: {weights_not_found(opt.weights[0])}", file=sys.stderr)
        return EXIT_USAGE
    why = missing_extension()
    if why:
        print(f"{prog}: error: {why}", file=sys.stderr)
        return EXIT_USAGE
    imgsz = opt.imgsz * 2 if len(opt.imgsz) == 1 else opt.imgsz
    try:
        source = opt.source
        if source is None:
            from yolov9c.data.dataset_yaml import load_data_config

            source = load_data_config("synthetic")["val"][0]
        from yolov9c.engine.detect.predictor import DetectConfig, detect

        # the flags carry DetectConfig's names (argparse: --conf-thres → conf_thres, ...)
        flags = {f.name for f in dataclasses.fields(DetectConfig)} - {"weights", "source", "imgsz"}
        cfg = DetectConfig(weights=opt.weights[0], source=source, imgsz=imgsz,
                           **{k: v for k, v in vars(opt).items() if k in flags})
        result = detect(cfg)
    except (FileNotFoundError, CheckpointError, SourceError, DataConfigError, ValueError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_SKIPPED if result["failed"] else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
