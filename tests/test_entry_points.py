"""The root entry points run as scripts: `--help` prints the published usage and exits 0; a refused option
gives one clear `error:` line, exit code 2 and no traceback.

Run: python -m pytest -q tests/test_entry_points.py
"""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(*args):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize("script", ["train_dual.py", "detect_dual.py", "val.py", "detect.py", "val_dual.py"])
def test_entry_point_help(script):
    """The _dual scripts and the published single-head ones (val.py, detect.py: the same flags)."""
    r = _run(REPO / script, "--help")
    assert r.returncode == 0, r.stderr
    assert f"usage: {script}" in r.stdout
    assert "--weights" in r.stdout and "--device" in r.stdout


def test_train_dual_refused_option_is_a_clear_error():
    r = _run(REPO / "train_dual.py", "--evolve", "0", "--epochs", "1")
    assert r.returncode == 2
    assert "--evolve 0: the number of generations must be >= 1" in r.stderr
    assert "Traceback" not in r.stderr


def test_train_dual_bad_value_is_an_argparse_error():
    r = _run(REPO / "train_dual.py", "--optimizer", "RMSprop")
    assert r.returncode == 2
    assert "invalid choice" in r.stderr and "SGD" in r.stderr and "LION" in r.stderr


def test_train_py_has_the_train_dual_flags():
    r = _run(REPO / "train.py", "--help")
    assert r.returncode == 0, r.stderr
    for flag in ("--cfg", "--hyp", "--data", "--min-items", "--close-mosaic", "--backend"):
        assert flag in r.stdout
    r = _run(REPO / "train.py", "--optimizer", "RMSprop")
    assert r.returncode == 2 and "invalid choice" in r.stderr
