"""Checks shared by the val_dual.py and detect_dual.py command lines: refused flags and the one --weights file.

Test: python -m pytest -q tests/test_val_cli.py tests/test_detect_cli.py
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
