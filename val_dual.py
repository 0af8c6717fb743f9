#!/usr/bin/env python3
"""val_dual.py: the published YOLOv9 `val_dual.py` entry point (same flags, same run folders).

Thin wrapper around yolov9c.cli; the val workflow lands in a later issue. Until then this prints a clear
error and exits with code 2. Run: python val_dual.py --help
"""

import sys

from yolov9c.cli.unavailable import main

if __name__ == "__main__":
    sys.exit(main("val_dual.py", sys.argv[1:]))
