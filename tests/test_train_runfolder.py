"""The trainer on its run folder (yolov9c/engine/train/run_folder.py), with real tiny CPU trainings: a live run's
folder refuses a second run (the lock held by a real child process), a fresh --exist-ok run moves results.csv
aside, failed starts leave no folder, a run interrupted by Ctrl-C names its checkpoint and --resume has each epoch
exactly once in results.csv (temp files of killed saves removed at the start), a run killed while finishing is
finished by --resume, a done run has nothing to resume and a bare --resume skips it.

Tiny on purpose: 8 synthetic training images of 64 px, gelan-t at --img 64, batch 8 (1 step per epoch), --noval
(the last epoch still validates; the finish tests validate best.pt too), --noplots.
Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_train_runfolder.py
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from yolov9c.cli.train import interrupt_hint, main, parse_opt
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train import results as R
from yolov9c.engine.train.run_folder import read_state
from yolov9c.engine.train.trainer import Interrupted, TrainError, train
from yolov9c.models.checkpoint import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=3, root=tmp_path_factory.mktemp("syn"), n_train=8, n_val=4, imgsz=64))


def _args(data, project, *extra):
    return ["--data", data, "--cfg", "gelan-t.yaml", "--img", "64", "--batch", "8", "--epochs", "1", "--workers",
            "0", "--noval", "--noplots", "--device", "cpu", "--project", str(project), *extra]


def _quiet(*a, **k):
    pass


class _Stop(Exception):
    pass


def _stop_at(text, nth=1, exc=_Stop):
    """A log function that raises `exc` at the nth line starting with `text` (a kill at that point of a run)."""
    seen = []

    def log(*a, **k):
        line = " ".join(map(str, a))
        if text.strip() in line:
            seen.append(line)
            if len(seen) == nth:
                raise exc()
    return log


def _epochs(run):
    return R.epochs_in(run / "results.csv")


def test_failed_starts_leave_no_folder_and_exist_ok_moves_results_aside(data, tmp_path):
    project = tmp_path / "runs"
    with pytest.raises(TrainError):
        train(parse_opt(_args(str(tmp_path / "nosuch.yaml"), project)), log=_quiet)
    with pytest.raises(TrainError, match="--cfg"):
        train(parse_opt(_args(data, project, "--cfg", str(tmp_path / "nosuch-model.yaml"))), log=_quiet)
    assert not project.exists() or list(project.iterdir()) == []
    out = train(parse_opt(_args(data, project)), log=_quiet)
    run = out["save_dir"]
    assert run == project / "exp"  # not exp3: the failed starts took no name
    assert _epochs(run) == [0] and read_state(run)["phase"] == "done"
    assert not (run / "run.lock").exists()  # released
    assert yaml.safe_load((run / "opt.yaml").read_text())["epochs"] == 1
    first = (run / "results.csv").read_text()
    again = train(parse_opt(_args(data, project, "--exist-ok")), log=_quiet)
    assert again["save_dir"] == run
    assert (run / "results.1.csv").read_text() == first  # the earlier run's rows, moved aside
    assert (run / "weights.1" / "last.pt").is_file() and (run / "weights" / "last.pt").is_file()  # and its models
    assert _epochs(run) == [0]  # the new run's own results.csv: one row, not two


def test_a_live_runs_folder_refuses_a_second_run(data, tmp_path, capsys):
    run = tmp_path / "runs" / "exp"
    run.mkdir(parents=True)
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; from yolov9c.engine.train.run_folder import RunFolder; "
                               f"f = RunFolder.open({str(run)!r}, log=lambda *a: None); print('held', flush=True); "
                               "sys.stdin.read()"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        code = main(_args(data, tmp_path / "runs", "--exist-ok"))
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2
        assert err[-1].startswith("train_dual.py: error: ") and f"pid {child.pid}" in err[-1]
        assert "in use by another training run" in err[-1]
        assert sorted(p.name for p in run.iterdir()) == ["run.lock", "run_state.yaml", "weights"]  # untouched
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert not (run / "run.lock").exists()


def test_ctrl_c_names_the_checkpoint_and_resume_has_each_epoch_once(data, tmp_path):
    project = tmp_path / "runs"
    header = ("%11s" * 2) % ("Epoch", "GPU_mem")
    # Ctrl-C in the first epoch: no checkpoint yet, and the hint says so
    with pytest.raises(Interrupted) as e0:
        train(parse_opt(_args(data, project, "--epochs", "2")), log=_stop_at(header, 1, KeyboardInterrupt))
    assert e0.value.last is None and e0.value.save_dir == project / "exp"
    assert "nothing to resume" in interrupt_hint(parse_opt([]), e0.value)
    assert not (project / "exp").exists()  # no checkpoint, no folder: the same command takes exp again
    # Ctrl-C at the start of epoch 1: last.pt of epoch 0 is named
    with pytest.raises(Interrupted) as e1:
        train(parse_opt(_args(data, project, "--epochs", "2")), log=_stop_at(header, 2, KeyboardInterrupt))
    run = project / "exp"
    last = run / "weights" / "last.pt"
    assert e1.value.last == last and not (run / "run.lock").exists()
    assert interrupt_hint(parse_opt([]), e1.value) == f"interrupted; resume with --resume {last}"
    assert read_checkpoint(last)["epoch"] == 0 and _epochs(run) == [0]
    # a kill between last.pt and its results.csv row, a torn line, temp files of killed saves
    columns = (run / "results.csv").read_text().splitlines()[0]
    (run / "results.csv").write_text(columns + "\n         1,  0.5,")
    (run / "weights" / ".last.pt.k2j4x9_a.tmp").write_bytes(b"\0" * 1000)
    (run / ".opt.yaml.zz9.tmp").write_text("epochs: ")
    # a newer finished run: a bare --resume skips it and says which run it picked
    done = Path(shutil.copytree(run, project / "exp3"))
    (done / "run_state.yaml").write_text("phase: done\n")
    os.utime(done / "weights" / "last.pt", (time.time() + 5, time.time() + 5))
    lines = []
    out = train(parse_opt(["--resume", "--project", str(project)]), log=lambda *a, **k: lines.append(" ".join(
        map(str, a))))
    text = "\n".join(lines)
    assert out["save_dir"] == run and out["epochs_done"] == 2
    assert f"--resume: resuming {last}, the newest unfinished run under {project}; skipped 1 newer finished" in text
    assert "removed 2 temp file(s) of interrupted saves" in text
    assert "restored the row of epoch 0 from last.pt" in text
    assert _epochs(run) == [0, 1]  # each epoch exactly once
    assert not [p for p in run.rglob("*.tmp")]
    assert read_state(run)["phase"] == "done" and read_checkpoint(last)["epoch"] == -1  # finished and stripped
    with pytest.raises(TrainError, match="every run under .* finished"):
        train(parse_opt(["--resume", "--project", str(project)]), log=_quiet)


def test_a_run_killed_at_the_finish_is_finished_by_resume(data, tmp_path):
    """Killed after the last epoch's save (before the finish began), then its --resume killed while finishing
    (weights stripped, run_state "finishing", final validation not done): each --resume only strips and
    validates (no epoch loop); then the run is done and a further --resume has nothing to do."""
    with pytest.raises(_Stop):
        train(parse_opt([a for a in _args(data, tmp_path / "runs") if a != "--noval"]),
              log=_stop_at("epochs completed"))
    run = tmp_path / "runs" / "exp"
    last = run / "weights" / "last.pt"
    assert read_state(run)["phase"] == "training" and read_checkpoint(last)["epoch"] == 0
    assert not (run / "run.lock").exists()
    lines, kill = [], [True]

    def log(*a, **k):
        lines.append(" ".join(map(str, a)))
        if lines[-1].lstrip().startswith("Validating"):
            assert read_state(run)["phase"] == "finishing"
            if kill.pop() if kill else False:
                raise _Stop  # the first --resume is killed while finishing

    with pytest.raises(_Stop):
        train(parse_opt(["--resume", str(last)]), log=log)
    text = "\n".join(lines)
    assert "training ended after epoch 0; finishing the run" in text and "Starting training" not in text
    assert read_state(run)["phase"] == "finishing" and read_checkpoint(last)["epoch"] == -1  # stripped
    lines.clear()
    out = train(parse_opt(["--resume", str(last)]), log=log)
    text = "\n".join(lines)
    assert "training ended and its weights were stripped; finishing the run" in text
    assert "Starting training" not in text  # no epoch loop
    assert f"Optimizer stripped from {last}" in text and f"Validating {run / 'weights' / 'best.pt'}" in text
    assert set(out["final"]) >= {"map50", "map"}
    assert read_state(run)["phase"] == "done" and read_checkpoint(last)["optimizer"] is None
    assert _epochs(run) == [0]
    with pytest.raises(TrainError, match="nothing to resume: this run finished"):
        train(parse_opt(["--resume", str(last)]), log=_quiet)
