#!/usr/bin/env python3
"""train.py: the published YOLOv9 `train.py` entry point, the one its README uses for the single-head GELAN
models (`python train.py --cfg models/detect/gelan-c.yaml ...`).

Same command line and run folders as train_dual.py (yolov9c.cli.train): the loss follows the model's head,
so a gelan-* (DDetect) model trains with the single-head loss and a yolov9-* (DualDDetect) model with the
dual loss, whichever script starts it; usage and error lines name train.py. How it differs from the published train.py: docs/train.md.
Run: python train.py --cfg models/detect/gelan-t.yaml --img 160 --epochs 3 --batch 16   (built-in synthetic data)
Test: python -m pytest -q tests/cli/test_entry_points.py tests/docs/test_docs_commands.py
"""

import sys

from yolov9c.cli.train import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="train.py"))
