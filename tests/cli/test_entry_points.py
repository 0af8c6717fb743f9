"""The root entry points run as scripts: `--help` prints the published usage and exits 0; a refused option
gives one clear `error:` line naming the script, exit code 2 and no traceback.

Each script is started as a real subprocess at least once in the suite: train.py, val.py and detect.py here
(`--help`), train_dual.py in tests/engine/train/test_train_e2e.py and tests/engine/train/test_train_ddp.py
(training runs), val_dual.py in tests/cli/test_val_cli.py, detect_dual.py in tests/cli/test_detect_cli.py and
tests/engine/detect/test_detect_bad_inputs.py, `python -m yolov9c` in tests/cli/test_cli.py and
tests/data/test_check.py. The other cases run the script in this process (tests/inprocess.py: the same
`__main__`, sys.argv and exit code, without a Python start).

Run: python -m pytest -q tests/cli/test_entry_points.py
"""

import subprocess
import sys
from pathlib import Path

import pytest

from inprocess import run_script

REPO = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=REPO, timeout=120)


def _usage(r, script):
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {script} ")
    assert "--weights" in r.stdout and "--device" in r.stdout


@pytest.mark.parametrize("script", ["train_dual.py", "detect_dual.py", "val_dual.py"])
def test_entry_point_help(script):
    _usage(run_script(REPO / script, "--help"), script)


@pytest.mark.parametrize("script", ["val.py", "detect.py"])
def test_single_head_entry_points_help(script):
    """val.py / detect.py (and train.py below): the published single-head scripts, same flags as the _dual
    ones; started as real processes."""
    _usage(_run(REPO / script, "--help"), script)


@pytest.mark.parametrize("script", ["train_dual.py", "train.py"])
def test_refused_option_is_a_clear_error_naming_the_script(script):
    r = run_script(REPO / script, "--evolve", "0", "--epochs", "1")
    assert r.returncode == 2
    assert r.stderr.startswith(f"{script}: error: --evolve 0: the number of generations must be >= 1")
    assert script != "train.py" or "train_dual" not in r.stderr


@pytest.mark.parametrize("script", ["train_dual.py", "train.py"])
def test_options_line_names_the_script(script, tmp_path):
    """The published options echo (`train: weights=..., cfg=...`) carries the invoked script's stem (before:
    train.py printed `train_dual: ...`). A one-epoch run of 8 images of 64 px."""
    from yolov9c.data.synthetic import synthetic_dataset

    data = synthetic_dataset(seed=5, root=tmp_path / "syn", n_train=8, n_val=4, imgsz=64)
    r = run_script(REPO / script, "--data", data, "--cfg", "gelan-t.yaml", "--img", "64", "--batch", "8", "--epochs",
                   "1", "--workers", "0", "--noval", "--noplots", "--device", "cpu", "--project", tmp_path / "runs")
    assert r.returncode == 0, r.stderr[-3000:]
    echo = [ln for ln in r.stdout.splitlines() if ": weights=" in ln]
    assert len(echo) == 1 and echo[0].startswith(f"{script[:-3]}: weights=, cfg=gelan-t.yaml, "), echo


@pytest.mark.parametrize("script", ["train_dual.py", "train.py"])
def test_bad_value_is_an_argparse_error(script):
    r = run_script(REPO / script, "--optimizer", "RMSprop")
    assert r.returncode == 2
    assert "invalid choice" in r.stderr and "SGD" in r.stderr and "LION" in r.stderr


def test_train_py_has_the_train_dual_flags():
    r = _run(REPO / "train.py", "--help")
    _usage(r, "train.py")
    for flag in ("--cfg", "--hyp", "--data", "--min-items", "--close-mosaic", "--backend"):
        assert flag in r.stdout
