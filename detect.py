#!/usr/bin/env python3
"""detect.py: the published YOLOv9 `detect.py` entry point, the one its README uses for converted (GELAN)
weights; the same flags and run folders as detect_dual.py (both use the main head of any model).

Thin wrapper around yolov9c/cli/detect.py (flags, defaults and refusals documented there and in
docs/detect.md). Run: python detect.py --weights yolov9-c-converted.pt --source path/to/images
Test: python -m pytest -q tests/cli/test_entry_points.py tests/docs/test_docs_commands.py
"""

import sys

from yolov9c.cli.detect import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="detect.py"))
