"""Bad input to the command lines (issue 50): each case exits with code 2 and ONE `error:` line on stderr that
says what is wrong and where (the file, line, key), no traceback, and leaves no run folder behind. The
mechanism is the existing one: set-up raises TrainError (yolov9c/engine/train/errors.py), the CLI prints it,
and a start that fails removes the folder it made (state.abandon_run_folder).

Cases: --hyp files (a `!!python/object` tag, a yaml syntax error, `lr0: abc`, `lr0: -1`, a missing key).
Tiny on purpose: 8 synthetic images of 64 px, gelan-t at --img 64; every case runs `main(argv)` of the real CLI
in this process (tests/inprocess.py), most stop in set-up within a second.

Run: python -m pytest -q tests/test_cli_errors.py
"""

import pytest
import yaml

from inprocess import call
from yolov9c.cli.train import main as train_main
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.resources import DEFAULT_HYP


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=5, root=tmp_path_factory.mktemp("syn"), n_train=8, n_val=4, imgsz=64))


def _train_args(data, project, *extra):
    return ["--data", data, "--cfg", "gelan-t.yaml", "--img", "64", "--batch", "4", "--epochs", "1", "--workers",
            "0", "--noval", "--noplots", "--device", "cpu", "--project", str(project), *extra]


def refused(entry, argv, project):
    """Run `entry(argv)`; assert exit code 2, exactly one `error:` line, no traceback, nothing left under
    `project`. Returns the error line."""
    r = call(entry, [str(a) for a in argv])
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert r.returncode == 2 and len(errors) == 1, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert not project.exists() or list(project.iterdir()) == [], sorted(project.rglob("*"))
    return errors[0]


# ---------------------------------------------------------------------------------------------------------
# --hyp
# ---------------------------------------------------------------------------------------------------------

BASE_HYP = DEFAULT_HYP.read_text()
BAD_HYPS = {  # name: (file text, what the error line must say)
    "python-tag": (BASE_HYP.replace("lr0: 0.01", "lr0: !!python/object/apply:os.getcwd []"),
                   ["line 3", "!!python/object/apply:os.getcwd", "refused"]),
    "syntax": (BASE_HYP + "extra: [1, 2\n", [f"line {len(BASE_HYP.splitlines()) + 1}: not a valid hyp file",
                                             "flow sequence"]),
    "not-a-number": (BASE_HYP.replace("lr0: 0.01", "lr0: abc"), ["line 3: lr0: 'abc' is not a number"]),
    "negative": (BASE_HYP.replace("lr0: 0.01", "lr0: -1"), ["line 3: lr0: -1 is out of range: lr0 must be a "
                                                            "number > 0"]),
    "probability": (BASE_HYP.replace("mixup: 0.15", "mixup: 1.5"), ["line 31: mixup: 1.5 is out of range"]),
    "missing": (BASE_HYP.replace("lr0: 0.01", ""), ["hyp lacks training keys: lr0"]),
}


@pytest.mark.parametrize("case", sorted(BAD_HYPS))
def test_bad_hyp_file_is_one_error_line_naming_file_and_line(data, tmp_path, case):
    text, says = BAD_HYPS[case]
    hyp = tmp_path / f"hyp.{case}.yaml"
    hyp.write_text(text)
    line = refused(train_main, _train_args(data, tmp_path / "runs", "--hyp", hyp), tmp_path / "runs")
    assert line.startswith("train_dual.py: error: --hyp") and str(hyp) in line, line
    for s in says:
        assert s in line, line
    assert yaml.safe_load(BASE_HYP)["lr0"] == 0.01  # the cases edit the bundled file's own lines
