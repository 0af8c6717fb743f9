#!/usr/bin/env python3
"""val.py: the published YOLOv9 `val.py` entry point (single-head GELAN and converted models; the same flags
and run folders runs/val/exp* as val_dual.py, which scores the main head of any model).

Thin wrapper around yolov9c/cli/val.py (flags, defaults and refusals documented there and in docs/val.md).
Run: python val.py --weights runs/train/exp/weights/best.pt --data path/to/data.yaml
Test: python -m pytest -q tests/cli/test_entry_points.py tests/docs/test_docs_commands.py
"""

import sys

from yolov9c.cli.val import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="val.py"))
