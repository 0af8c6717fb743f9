#!/usr/bin/env python3
"""detect_dual.py: the published YOLOv9 `detect_dual.py` entry point (same flags, same run folders).

Thin wrapper around yolov9c/cli/detect.py (flags, defaults and refusals documented there and in
docs/detect.md). Run: python detect_dual.py --weights best.pt --source path/to/images
Test: python -m pytest -q tests/cli/test_detect_cli.py
"""

import sys

from yolov9c.cli.detect import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="detect_dual.py"))
