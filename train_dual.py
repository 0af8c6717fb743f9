#!/usr/bin/env python3
"""train_dual.py: the published YOLOv9 `train_dual.py` entry point (same flags, same run folders).

Thin wrapper around yolov9c.cli.train (argparse → RunConfig, main) and yolov9c.engine.train.trainer (the loop).
Run: python train_dual.py --cfg gelan-t.yaml --img 160 --epochs 3 --batch 16   (built-in synthetic data)
Test: python -m pytest -q tests/cli/test_train_cli.py tests/engine/train/test_train_e2e.py
"""

import sys

from yolov9c.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
