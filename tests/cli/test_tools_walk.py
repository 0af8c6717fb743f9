"""`python -m yolov9c memory / info / convert / export` as a user meets them: each bad input is one `error:` line
naming what is wrong (and what to type instead), and the memory report says nothing it cannot stand behind.
Cases from a walkthrough of the tools; each one failed before its fix. Through main(argv) in this process.

Run: python -m pytest -q tests/cli/test_tools_walk.py
"""

import re

from yolov9c.cli.main import main


def test_memory_bad_batch_names_only_the_flag_given_wrong(capsys):
    """Before: `--batch 0` said '--batch and --val-batch must be ≥ 1 and --img ≥ 32, got 0, None and 640'."""
    assert main(["memory", "--cfg", "yolov9-s.yaml", "--batch", "0"]) == 2
    assert capsys.readouterr().err == "python -m yolov9c memory: error: --batch must be ≥ 1, got 0\n"
    assert main(["memory", "--cfg", "yolov9-s.yaml", "--img", "31", "--val-batch", "0"]) == 2
    assert capsys.readouterr().err == ("python -m yolov9c memory: error: --val-batch must be ≥ 1, got 0; "
                                       "--img must be ≥ 32, got 31\n")
