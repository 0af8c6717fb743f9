"""`python -m yolov9c check-data --data D.yaml`: scan a dataset's splits without training (yolov9c/data/check.py).

Prints one `path: reason` line per bad file, a line with the count and up to 3 paths of images without a
label file ("missing") and of label files without an image ("orphan"), then per split
`N images, M backgrounds, K corrupt[, J missing][, O orphan]` and the box count; exit code 0 when the data
is usable, 1 when a split has no usable image (or train has no labels), 2 when the dataset yaml cannot be
used. `--data` defaults to the built-in synthetic dataset.

Wiring into the package CLI: `add_parser(subparsers)` adds the subcommand (and sets `func=run` on it);
`run(args)` executes it. Standalone: `main(argv)`.
Test: python -m pytest -q tests/data/test_check.py
"""

import argparse
import sys


def add_parser(subparsers):
    """Add the `check-data` subcommand to an argparse subparsers object; returns its parser."""
    p = subparsers.add_parser("check-data", help="scan a dataset's images and labels without training",
                              description="Scan train/val (and test) of a dataset yaml: bad files one per line "
                                          "(path: reason), images without a label file (missing) and label files "
                                          "without an image (orphan) with a few paths, then 'N images, M backgrounds, "
                                          "K corrupt[, J missing][, O orphan]' per split. "
                                          "Exit 0 usable, 1 a split has no usable image, 2 bad dataset yaml.")
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def _add_arguments(p):
    p.add_argument("--data", default=None,
                   help="dataset yaml, or 'synthetic' / 'synthetic:SEED' (default: the built-in synthetic data)")
    p.add_argument("--no-label-cache", action="store_true",
                   help="neither read nor write the *.cache label cache files")


def run(args):
    """Run check-data for parsed `args` (attributes data, no_label_cache); returns the exit code."""
    from yolov9c.data.check import check_data

    return check_data(args.data, label_cache=not args.no_label_cache,
                      err=lambda m: print(m, file=sys.stderr))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m yolov9c check-data")
    _add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
