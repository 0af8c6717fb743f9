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


def test_resume_from_an_epoch_checkpoint_of_a_finished_run(data, tmp_path):
    """--resume RUN/weights/epoch0.pt of a finished run (to go back before a divergence) trains again from epoch 1
    in a new folder RUN-from-epoch0: the finished run's files stay byte for byte, the new folder has each epoch
    once in results.csv (epoch 0 copied, 1 and 2 trained) and, resume being exact on the CPU, ends with the same
    weights as the finished run. Before: "nothing to resume: this run finished"."""
    import torch

    out = train(parse_opt(_args(data, tmp_path, "--epochs", "3", "--save-period", "1")), log=_quiet)
    run = out["save_dir"]
    assert read_state(run)["phase"] == "done"
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    lines = []
    out2 = train(parse_opt(["--resume", str(run / "weights" / "epoch0.pt")]), log=lambda *a, **k: lines.append(
        " ".join(map(str, a))))
    branch = run.parent / f"{run.name}-from-epoch0"
    assert out2["save_dir"] == branch and out2["epochs_done"] == 3
    assert any(f"continuing in a new run folder {branch}" in s for s in lines)
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after == before  # nothing of the finished run changed
    assert read_state(branch)["phase"] == "done" and _epochs(branch) == [0, 1, 2]
    a = torch.load(run / "weights" / "last.pt", weights_only=True)["model"]
    b = torch.load(branch / "weights" / "last.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # a second resume of the same epoch gets its own folder
    train(parse_opt(["--resume", str(run / "weights" / "epoch1.pt")]), log=_quiet)
    assert _epochs(run.parent / f"{run.name}-from-epoch1") == [0, 1, 2]


def test_branch_folder_is_used_again_until_it_saved_an_epoch(tmp_path):
    """resume.branch: a second --resume of the same epochN.pt whose first start failed before saving an epoch
    continues in the folder made then (its last.pt still the same file); once that folder saved an epoch, a new
    one (…-from-epoch02) is made. The run's own files are never touched."""
    import torch

    from yolov9c import build_model
    from yolov9c.engine.train.resume import branch
    from yolov9c.models.checkpoint import save_checkpoint

    run = tmp_path / "exp"
    (run / "weights").mkdir(parents=True)
    (run / "opt.yaml").write_text("epochs: 3\n")
    (run / "results.csv").write_text("epoch\n0\n1\n")
    model = build_model("gelan-t", nc=2)
    src = save_checkpoint(run / "weights" / "epoch0.pt", model, optimizer=torch.optim.SGD(model.parameters()),
                          epoch=0, half=False)
    first = branch(src, {"epoch": 0}, log=_quiet)
    assert first == tmp_path / "exp-from-epoch0" / "weights" / "last.pt" and first.read_bytes() == src.read_bytes()
    assert (first.parent.parent / "results.csv").read_text() == "epoch\n0\n1\n"
    assert branch(src, {"epoch": 0}, log=_quiet) == first  # not trained yet: used again
    first.unlink()
    first.write_bytes(src.read_bytes())  # the branch saved an epoch of its own (a new file)
    second = branch(src, {"epoch": 0}, log=_quiet)
    assert second == tmp_path / "exp-from-epoch02" / "weights" / "last.pt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp", "exp-from-epoch0", "exp-from-epoch02"]
    assert (run / "results.csv").read_text() == "epoch\n0\n1\n" and sorted(os.listdir(run / "weights")) == \
        ["epoch0.pt"]
