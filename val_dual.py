#!/usr/bin/env python3
"""val_dual.py: the published YOLOv9 `val_dual.py` entry point (same flags, same run folders runs/val/exp*).

Thin wrapper around yolov9c/cli/val.py (flags, defaults and refusals documented there and in docs/val.md).
Run: python val_dual.py --weights runs/train/exp/weights/best.pt --data path/to/data.yaml
Test: python -m pytest -q tests/cli/test_val_cli.py
"""

import sys

from yolov9c.cli.val import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="val_dual.py"))
