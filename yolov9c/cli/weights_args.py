"""Checks shared by the val_dual.py and detect_dual.py command lines: refused flags, the one --weights file,
the NMS settings.

Test: python -m pytest -q tests/cli/test_val_cli.py tests/cli/test_detect_cli.py
"""


def check_refused_and_weights(parser, opt, refused):
    """Argparse-style errors (exit 2): any flag in `refused` (attribute -> reason) that is set, a missing
    --weights, or more than one weights file (ensembles are not supported)."""
    for key, why in refused.items():
        if getattr(opt, key):
            parser.error(why)
    if not opt.weights:
        parser.error("--weights is required: a checkpoint such as runs/train/exp/weights/best.pt, a published "
                     "YOLOv9 .pt or a converted gelan file")
    if len(opt.weights) > 1:
        parser.error(f"--weights: one file expected, got {len(opt.weights)} (model ensembles are not supported)")


def check_nms_args(parser, opt):
    """Argparse-style errors for the NMS settings both CLIs share: --conf-thres, --iou-thres, --max-det."""
    if not 0 <= opt.conf_thres <= 1:
        parser.error(f"--conf-thres must be in [0, 1], got {opt.conf_thres}")
    if not 0 <= opt.iou_thres <= 1:
        parser.error(f"--iou-thres must be in [0, 1], got {opt.iou_thres}")
    if opt.max_det < 1:
        parser.error(f"--max-det must be >= 1, got {opt.max_det}")


def missing_extension():
    """The one-line reason detection and validation cannot run here, or None: NMS calls yolov9c._C unless
    YOLOV9C_FUSED=0, so a source checkout without the built extension would otherwise stop with a traceback at
    the first image that has a box, after some outputs were written."""
    from yolov9c.ops import extension

    if not extension.fused_enabled():
        return None
    try:
        extension.load()
    except ImportError as e:
        return str(e)
    return None
