"""The "not yet available" answer of the root entry points whose workflow has not landed yet.

train_dual.py / val_dual.py / detect_dual.py call main(); tests/test_entry_points.py checks the message and
the exit code (2, like an argparse usage error).
"""

import sys

_WHAT_WORKS = (
    "What works today: `python -m yolov9c info --cfg yolov9-s.yaml` (layer table, parameters, GFLOPs), "
    "`python -m yolov9c convert --weights IN.pt --cfg gelan-c.yaml --out OUT.pt`, and the Python API "
    "(yolov9c.build_model, yolov9c.load_model, yolov9c.make_loss); see README.md."
)


def main(script, argv):
    """Print why `script` cannot run yet and return exit code 2. `argv` is accepted and ignored."""
    del argv
    print(f"{script}: error: not yet available in this version of yolov9c "
          f"(the {script.split('_')[0]} workflow is not implemented yet). {_WHAT_WORKS}", file=sys.stderr)
    return 2
