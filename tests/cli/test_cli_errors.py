"""Bad input to the command lines: each case exits with code 2 and ONE `error:` line on stderr that
says what is wrong and where (the file, line, key), no traceback, and leaves no run folder behind. The
mechanism is the existing one: set-up raises TrainError (yolov9c/engine/train/errors.py), the CLI prints it,
and a start that fails removes the folder it made (state.abandon_run_folder).

Cases: --hyp files (a `!!python/object` tag, a yaml syntax error, `lr0: abc`, `lr0: -1`, a missing key); --freeze
beyond the model's layers (the error says how many it has); under torchrun (2 gloo processes on the CPU) a batch
that does not split over the processes (printed by rank 0 only, every rank exits with code 2); --weights holding
NaN/inf (named, not lr0); a run stopped before its first save (divergence in epoch 0, a full disk) removes its
folder, so the same command gets the same name; --data given a folder (a .yaml is expected); the published guides'
missing `yolov9-s.pt` (one wording in train, val and detect) and `data/images/horses.jpg` say where to get them.
Not an error: a damaged `--cache disk` .npy (truncated, a pickled object) is rebuilt at start with one line and the
run trains.
Tiny on purpose: 8 synthetic images of 64 px, gelan-t at --img 64 (gelan_mini, tests/conftest.py, for the
runs that train); every case runs `main(argv)` of the real CLI
in this process (tests/inprocess.py), most stop in set-up within a second. The --hyp warning and the damaged
--cache disk cases read one run that trains to its end (odd_hyp_and_damaged_cache_run).

Run: python -m pytest -q tests/cli/test_cli_errors.py
"""

import errno
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import yolov9c.engine.train.trainer as T
from inprocess import call
from yolov9c.cli.train import main as train_main
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.resources import DEFAULT_HYP

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=5, root=tmp_path_factory.mktemp("syn"), n_train=8, n_val=4, imgsz=64))


def _train_args(data, project, *extra, cfg="gelan-t.yaml"):
    """cfg: gelan-t (the --freeze and --weights messages name its layers and tensors), or gelan_mini
    (tests/conftest.py) for the cases that train, whose checks do not depend on the model."""
    return ["--data", data, "--cfg", cfg, "--img", "64", "--batch", "4", "--epochs", "1", "--workers",
            "0", "--noval", "--noplots", "--device", "cpu", "--project", str(project), *extra]


def refused(entry, argv, project, stdout=False):
    """Run `entry(argv)`; assert exit code 2, exactly one `error:` line, no traceback, nothing left under
    `project`. Returns the error line (and what it printed on stdout, with `stdout`)."""
    r = call(entry, [str(a) for a in argv])
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert r.returncode == 2 and len(errors) == 1, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert not project.exists() or list(project.iterdir()) == [], sorted(project.rglob("*"))
    return (errors[0], r.stdout) if stdout else errors[0]


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
    "misspelt": (BASE_HYP.replace("mosaic: 1.0", "mosiac: 1.0"),
                 ["line 30: unknown key 'mosiac': did you mean 'mosaic'? (the file has no mosaic)"]),
    "not-utf8": (BASE_HYP.replace("# YOLOv9 hyperparameters", "# YOLOv9 param\u00e8tres").encode("latin-1"),
                 ["not a UTF-8 text file (byte 14: b'\\xe8tre'); save it as UTF-8"]),
}


@pytest.mark.parametrize("case", sorted(BAD_HYPS))
def test_bad_hyp_file_is_one_error_line_naming_file_and_line(data, tmp_path, case):
    text, says = BAD_HYPS[case]
    hyp = tmp_path / f"hyp.{case}.yaml"
    hyp.write_bytes(text) if isinstance(text, bytes) else hyp.write_text(text)
    line = refused(train_main, _train_args(data, tmp_path / "runs", "--hyp", hyp), tmp_path / "runs")
    assert line.startswith("train_dual.py: error: --hyp") and str(hyp) in line, line
    for s in says:
        assert s in line, line
    assert yaml.safe_load(BASE_HYP)["lr0"] == 0.01  # the cases edit the bundled file's own lines


@pytest.fixture(scope="module")
def odd_hyp_and_damaged_cache_run(tmp_path_factory, gelan_mini):
    """One training run (main, in this process, to its end) read by two tests, as each needs a run that trains:
    --hyp with `lr0: 1e-3` and `lrO: 0.02` beside it, and --cache disk over a truncated .npy and one holding a
    pickled object, both newer than their images. Returns (Ran, project, hyp file, truncated .npy, pickled .npy)."""
    tmp = tmp_path_factory.mktemp("odd")
    hyp = tmp / "hyp.yaml"
    hyp.write_text(BASE_HYP.replace("lr0: 0.01", "lr0: 1e-3\nlrO: 0.02"))
    data = synthetic_dataset(seed=5, root=tmp / "syn", n_train=8, n_val=4, imgsz=64)
    images = sorted((data.parent / "images" / "train").glob("*.jpg"))
    truncated, pickled = images[0].with_suffix(".npy"), images[1].with_suffix(".npy")
    np.save(truncated, np.zeros((64, 64, 3), np.uint8))
    truncated.write_bytes(truncated.read_bytes()[:1000])
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    r = call(train_main, [str(a) for a in _train_args(str(data), tmp / "runs", "--hyp", hyp, "--cache", "disk",
                                                      "--batch", "8", cfg=gelan_mini)])
    return r, tmp / "runs", hyp, truncated, pickled


def test_hyp_key_no_one_reads_is_one_warning_and_1e3_is_a_number(odd_hyp_and_damaged_cache_run):
    """`lrO: 0.02` beside `lr0` (read by no one; before: silently ignored) is one warning naming lr0; `lr0: 1e-3`
    (PyYAML reads a string; before: "'1e-3' is not a number" without a hint) trains with lr0 0.001."""
    r, project, hyp, _, _ = odd_hyp_and_damaged_cache_run
    assert r.returncode == 0 and "error:" not in r.stderr, r.stderr[-3000:]
    warned = [ln for ln in r.stdout.splitlines() if "lrO" in ln and "hyperparameters:" not in ln]
    assert warned == [f"WARNING: {hyp}: line 4: 'lrO' is not a hyperparameter training reads: ignored (did you "
                      f"mean 'lr0'? it is set on line 3)"], warned
    stored = yaml.safe_load((project / "exp" / "hyp.yaml").read_text())
    assert stored["lr0"] == 0.001, stored


# ---------------------------------------------------------------------------------------------------------
# --cache disk: a damaged .npy is rebuilt at start, never a failure mid-epoch
# ---------------------------------------------------------------------------------------------------------

def test_damaged_disk_cache_is_rebuilt_and_the_run_trains(odd_hyp_and_damaged_cache_run):
    """A truncated .npy and one holding a pickled object, both newer than their images (the old start-up check
    looked at the times only): one line each at start, rebuilt, and the epoch trains (before: a traceback in
    the first batch that read them)."""
    r, project, _, truncated, pickled = odd_hyp_and_damaged_cache_run
    assert r.returncode == 0 and "error:" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    rebuilt = [ln for ln in r.stdout.splitlines() if "damaged disk cache" in ln]
    assert len(rebuilt) == 2 and str(truncated) in rebuilt[0] and str(pickled) in rebuilt[1], rebuilt
    assert (project / "exp" / "weights" / "last.pt").is_file()
    for npy in (truncated, pickled):
        assert np.load(npy, allow_pickle=False).shape == (64, 64, 3)


@pytest.mark.parametrize("case", ["no-room", "fills-while-writing"])
def test_disk_cache_on_a_full_disk_is_one_line_and_leaves_no_npy(tmp_path, monkeypatch, case, gelan_mini):
    """--cache disk with too little free space: checked against the exact need before writing, one line, nothing
    written; a disk that fills while writing: one line for the folder and the partial temporaries removed (before:
    a line per image and a zero-byte .npy per image left in the dataset folder). The run trains either way."""
    import shutil

    from yolov9c.data import image_cache

    data = synthetic_dataset(seed=5, root=tmp_path / "syn", n_train=8, n_val=4, imgsz=64)
    train = data.parent / "images" / "train"
    if case == "no-room":
        usage = shutil.disk_usage(train)
        monkeypatch.setattr(image_cache.shutil, "disk_usage", lambda p: usage._replace(free=4 * 64 * 64 * 3))
    else:
        save = np.save

        def fill(file, arr, *a, **k):
            if str(file).endswith(".tmp.npy"):
                Path(file).write_bytes(b"\x93NUMPY")  # a few bytes in, the disk is full
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return save(file, arr, *a, **k)
        monkeypatch.setattr(np, "save", fill)
    r = call(train_main, _train_args(str(data), tmp_path / "runs", "--cache", "disk", "--batch", "8", cfg=gelan_mini))
    assert r.returncode == 0 and "error:" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    said = [ln for ln in r.stdout.splitlines() if "--cache disk needs" in ln or "No space left" in ln]
    assert said == {"no-room": [f"train: --cache disk needs 0.09 MiB (+10 % margin) for 8 .npy files on the disk of "
                                f"{train} but 0.05 MiB is free: none written (those images are read from their "
                                f"files)"],
                    "fills-while-writing": [f"train: {train}: No space left on device: disk cache not written for "
                                            f"some of its images"]}[case], said
    assert list(data.parent.rglob("*.npy")) == [], list(data.parent.rglob("*.npy"))
    assert (tmp_path / "runs" / "exp" / "weights" / "last.pt").is_file()


# ---------------------------------------------------------------------------------------------------------
# run folders: refused before the work, and a failed start leaves an existing folder as it was
# ---------------------------------------------------------------------------------------------------------

def _tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None for p in folder.rglob("*")}


def _earlier_run(folder):
    """An earlier run's folder, as --exist-ok finds it."""
    (folder / "weights").mkdir(parents=True)
    for name, text in (("hyp.yaml", "lr0: 0.02\n"), ("opt.yaml", "epochs: 7\n"), ("run_state.yaml", "phase: done\n"),
                       ("results.csv", "epoch,x\n0,1\n"), ("weights/last.pt", "old weights")):
        (folder / name).write_text(text)


@pytest.mark.parametrize("read_only", ["project", "run folder", "weights"])
def test_unwritable_run_folder_is_one_error_line_before_training(data, tmp_path, read_only):
    """A read-only --project, or an --exist-ok run folder or its weights/ that cannot be written (no write bit;
    for root too): one line at set-up naming the folder (before, for a user: tracebacks, the weights/ one after a
    whole epoch). Nothing made or changed."""
    project = tmp_path / "runs"
    if read_only != "project":
        _earlier_run(project / "exp")
    else:
        project.mkdir()
    ro = {"project": project, "run folder": project / "exp", "weights": project / "exp" / "weights"}[read_only]
    before = _tree(tmp_path)
    os.chmod(ro, 0o555)
    try:
        target = project / "sub" if read_only == "project" else project
        r = call(train_main, [str(a) for a in _train_args(data, target, "--exist-ok")])
    finally:
        os.chmod(ro, 0o755)
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert errors[0] == "train_dual.py: error: " + {
        "project": f"cannot make {project / 'sub' / 'exp'}: {project} is not writable (read-only): give a --project "
                   f"you can write to",
        "run folder": f"{project / 'exp'} is not writable (read-only): make it writable, or train into another folder "
                      f"(another --project or --name)",
        "weights": f"{project / 'exp' / 'weights'} is not writable (read-only): make it writable, or train into "
                   f"another folder (another --project or --name)"}[read_only], errors
    assert _tree(tmp_path) == before


def test_a_failed_start_into_an_exist_ok_folder_leaves_it_as_it_was(data, tmp_path):
    """--exist-ok into an earlier run's folder, then a start that fails in set-up (here --freeze beyond the model):
    the folder keeps its results.csv, weights/, hyp.yaml, opt.yaml and run_state.yaml as they were (before: moved
    aside and replaced by this start's run_state.yaml, yaml files and an empty weights/)."""
    project = tmp_path / "runs"
    _earlier_run(project / "exp")
    before = _tree(project)
    r = call(train_main, [str(a) for a in _train_args(data, project, "--exist-ok", "--freeze", "100")])
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert r.returncode == 2 and len(errors) == 1 and "--freeze 100: " in errors[0], r.stderr[-3000:]
    assert _tree(project) == before


# ---------------------------------------------------------------------------------------------------------
# --freeze
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layers, says", [
    (["23"], "so N can be at most 22"),  # gelan-t has 23 layers: --freeze 23 would freeze the head too
    (["100"], "so N can be at most 22"),
    (["0", "1", "30"], "no layer 30"),
    ([str(i) for i in range(23)], "nothing left to train"),
], ids=["23", "100", "list-30", "every-layer"])
def test_freeze_beyond_the_model_is_one_error_line(data, tmp_path, layers, says):
    """Before: `RuntimeError: element 0 of tensors does not require grad` in the first step, exit 1, and a run
    folder with an empty weights/."""
    line = refused(train_main, _train_args(data, tmp_path / "runs", "--freeze", *layers), tmp_path / "runs")
    assert f"error: --freeze {' '.join(layers)}: " in line and "the model has 23 layers (0-22)" in line, line
    assert says in line, line


def test_an_img_whose_batch_exceeds_the_machines_memory_is_one_error_line(data, tmp_path, monkeypatch):
    """Before: `--img 100000` started training and the first batch's mosaics got the process killed for memory
    (exit 137, its run folder left with a stale lock). Here a machine of 1 MiB: the uint8 batch of 4 images at
    320 px (1.2 MB) cannot fit, so set-up refuses it in one line, naming the size and the machine's memory."""
    import yolov9c.engine.train.state as state_mod

    monkeypatch.setattr(state_mod, "total_ram", lambda: 2 ** 20)
    argv = _train_args(data, tmp_path / "runs", "--img", "300")
    line = refused(train_main, argv, tmp_path / "runs")
    assert "error: --img 300 with a batch of 4: one training batch alone takes 0.00114 GiB of host memory " \
           "(4 x 3 x 320 x 320 bytes), more than this machine's 0.000977 GiB" in line, line


# ---------------------------------------------------------------------------------------------------------
# torchrun: a batch that does not split over the processes
# ---------------------------------------------------------------------------------------------------------

def test_torchrun_batch_error_is_printed_once_and_every_rank_exits_2(data, tmp_path):
    """2 gloo processes on the CPU, --batch 3: rank 0 prints the one line (it counts processes: no GPU here),
    every rank exits with code 2 (before: the line once per rank, or not at all when torchrun killed rank 0
    first), and the only traceback is torchrun's own report after the workers' part. No folder."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(REPO / "train_dual.py"), *_train_args(data, tmp_path / "runs", "--batch", "3")]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    text = r.stdout + r.stderr
    errors = [ln for ln in text.splitlines() if "error:" in ln]
    assert r.returncode != 0 and len(errors) == 1, text[-4000:]
    assert errors[0] == ("train_dual.py: error: --batch-size 3 must be a multiple of WORLD_SIZE 2 (the number of "
                         "processes): each one trains on batch-size / 2 images"), errors[0]
    assert "Traceback" not in text.split("failed (exitcode")[0], text[-4000:]  # torchrun's own report follows
    assert text.count("exitcode  : 2 ") == 2, text[-4000:]  # both ranks, none killed by torchrun's SIGTERM
    assert not (tmp_path / "runs").exists()


def test_ddp_launch_of_train_dual_ends_without_torchruns_traceback(data, tmp_path):
    """The torchrun that `train_dual.py --device 0,1` starts runs through yolov9c.cli.ddp_launch: the same 2 gloo
    processes and --batch 3 end with our one line, torch's one `failed (exitcode: 2)` log line and exit code 2,
    and no traceback (a direct torchrun adds its 35-line ChildFailedError traceback, above: a worker cannot avoid
    it, cli/ddp_launch.py says why)."""
    cmd = [sys.executable, "-m", "yolov9c.cli.ddp_launch", "--standalone", "--nproc_per_node", "2",
           str(REPO / "train_dual.py"), *_train_args(data, tmp_path / "runs", "--batch", "3")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    text = r.stdout + r.stderr
    errors = [ln for ln in text.splitlines() if "error:" in ln]
    assert r.returncode == 2 and errors == ["train_dual.py: error: --batch-size 3 must be a multiple of WORLD_SIZE 2 "
                                            "(the number of processes): each one trains on batch-size / 2 images"], text
    assert "Traceback" not in text and "ChildFailedError" not in text, text[-4000:]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("exitcode, says, code", [
    (2, None, 2),
    (1, "train_dual.py: rank 1 (pid 123) exited with code 1 (its output above says why)", 1),
    (-9, "train_dual.py: rank 1 (pid 123) was killed by SIGKILL", 137)])
def test_ddp_launch_says_how_a_rank_ended_in_one_line(monkeypatch, capsys, exitcode, says, code):
    """A rank stopped by our error (exit code 2) printed its line: nothing added; another exit code or a signal:
    one line naming the rank, and that exit code (128 + N for signal N)."""
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from yolov9c.cli import ddp_launch

    def fail(argv):
        raise ChildFailedError("train_dual.py", {1: ProcessFailure(1, 123, exitcode, "/nonexistent")})

    monkeypatch.setattr(torchrun, "main", fail)
    assert ddp_launch.main(["--nproc_per_node", "2", "train_dual.py"]) == code
    assert capsys.readouterr().err.splitlines() == ([says] if says else [])


# ---------------------------------------------------------------------------------------------------------
# messages that name the right thing
# ---------------------------------------------------------------------------------------------------------

def test_non_finite_weights_file_is_named_not_lr0(data, tmp_path):
    """--weights whose tensors hold NaN/inf: refused at load, naming the file and the tensors (before: the run
    skipped its steps and stopped in epoch 0 blaming `lr0=0.01` and the data)."""
    from yolov9c import build_model
    from yolov9c.models.checkpoint import save_checkpoint

    model = build_model("gelan-t", nc=8)
    with torch.no_grad():
        model.model[1].conv.weight.view(-1)[0] = math.nan
        model.model[2].cv1.bn.running_var.view(-1)[0] = math.inf
    weights = save_checkpoint(tmp_path / "diverged.pt", model)
    line = refused(train_main, _train_args(data, tmp_path / "runs", "--weights", weights), tmp_path / "runs")
    assert f"error: --weights {weights}: 2 tensors hold inf/NaN (model.1.conv.weight, model.2.cv1.bn.running_var)" \
           in line, line
    assert "lr0" not in line and "diverged run" in line, line


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_run_stopped_before_its_first_save_leaves_no_folder(data, tmp_path, monkeypatch, gelan_mini):
    """Divergence in epoch 0 and a full disk at the first checkpoint: one error line that says the folder was
    removed, no folder (before: runs/exp with an empty weights/, and the advised same command wrote exp2); the
    same command then trains in runs/exp."""
    project = tmp_path / "runs"
    argv = _train_args(data, project, cfg=gelan_mini)
    end_epoch = T.end_epoch

    def diverge(state, epoch, stats):
        next(state.ema.ema.parameters()).data.view(-1)[0] = math.nan
        return end_epoch(state, epoch, stats)

    removed = f"{project / 'exp'} removed: the run stopped before it saved anything"
    with monkeypatch.context() as m:
        m.setattr(T, "end_epoch", diverge)
        line, out = refused(train_main, argv, project, stdout=True)
    assert "error: epoch 0: training diverged: " in line and removed in out, line
    with monkeypatch.context() as m:
        m.setattr(torch, "save", _no_space)
        line, out = refused(train_main, argv, project, stdout=True)
    assert f"error: No space left on device writing {project / 'exp' / 'weights' / 'last.pt'}" in line, line
    assert "run the same command again" in line and removed in out, line
    r = call(train_main, argv)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in project.iterdir()) == ["exp"] and (project / "exp" / "weights" / "last.pt").is_file()


def test_data_folder_says_a_yaml_is_expected(data, tmp_path):
    """--data given the dataset's folder (before: "data yaml not found", though the folder exists)."""
    folder = Path(data).parent
    line = refused(train_main, _train_args(str(folder), tmp_path / "runs"), tmp_path / "runs")
    assert line == (f"train_dual.py: error: {folder} is a folder: a dataset .yaml file is expected (keys train, val, "
                    f"nc, names; docs/data.md), e.g. {data} there"), line


@pytest.mark.parametrize("cli", ["train", "val", "detect"])
def test_missing_published_weights_say_where_to_get_them_in_one_wording(data, tmp_path, monkeypatch, cli):
    """The published guides' `--weights yolov9-s.pt` without the file: the same line in all three CLIs, naming
    the release page (README.md's FAQ), from models.published.weights_not_found."""
    from yolov9c.cli.detect import main as detect_main
    from yolov9c.cli.val import main as val_main

    monkeypatch.chdir(tmp_path)
    project = tmp_path / "runs"
    entry, argv = {
        "train": (train_main, _train_args(data, project, "--weights", "yolov9-s.pt")),
        "val": (val_main, ["--weights", "yolov9-s.pt", "--data", data, "--project", project, "--device", "cpu"]),
        "detect": (detect_main, ["--weights", "yolov9-s.pt", "--project", project, "--device", "cpu"]),
    }[cli]
    line = refused(entry, argv, project)
    prog = {"train": "train_dual.py", "val": "val_dual.py", "detect": "detect_dual.py"}[cli]
    assert line == (f"{prog}: error: --weights yolov9-s.pt: file not found; yolov9-s.pt is a release asset of the "
                    f"published YOLOv9 repository: download it from https://github.com/WongKinYiu/yolov9/releases "
                    f"(yolov9c downloads nothing)"), line


@pytest.mark.parametrize("case", ["folder", "missing-pth", "pth"])
def test_weights_that_are_no_pt_file_are_refused_not_ignored(data, tmp_path, monkeypatch, case):
    """--weights naming a folder, a missing yolov9-s.pth or an existing .pth (before: trained from scratch with
    exit code 0; the published train stops on any suffix but .pt)."""
    from yolov9c import build_model
    from yolov9c.models.checkpoint import save_checkpoint

    monkeypatch.chdir(tmp_path)
    (tmp_path / "w").mkdir()
    save_checkpoint(tmp_path / "w" / "best.pt", build_model("gelan-t", nc=8))
    if case == "pth":
        (tmp_path / "w" / "best.pt").rename(tmp_path / "yolov9-s.pth")
    weights = {"folder": "w", "missing-pth": "yolov9-s.pth", "pth": "yolov9-s.pth"}[case]
    line = refused(train_main, _train_args(data, tmp_path / "runs", "--weights", weights), tmp_path / "runs")
    assert line == "train_dual.py: error: " + {
        "folder": "--weights w: a folder, not a checkpoint file: give a .pt file, e.g. w/best.pt",
        "missing-pth": "--weights yolov9-s.pth: file not found",
        "pth": "--weights yolov9-s.pth: not a .pt file; training starts from a .pt checkpoint (ours, or a published "
               "YOLOv9 .pt), as published"}[case], line


@pytest.mark.parametrize("cli", ["val", "detect"])
def test_a_weights_folder_is_named_a_folder_in_val_and_detect(data, tmp_path, monkeypatch, cli):
    """val/detect --weights runs/train/exp/weights (a folder): train's wording, a .pt inside named, not "file not
    found" (models.published.weights_not_found)."""
    from yolov9c.cli.detect import main as detect_main
    from yolov9c.cli.val import main as val_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "last.pt").write_bytes(b"")
    project = tmp_path / "runs"
    entry, argv = {
        "val": (val_main, ["--weights", "w", "--data", data, "--project", project, "--device", "cpu"]),
        "detect": (detect_main, ["--weights", "w", "--project", project, "--device", "cpu"]),
    }[cli]
    line = refused(entry, argv, project)
    assert line == (f"{cli}_dual.py: error: --weights w: a folder, not a checkpoint file: give a .pt file, "
                    f"e.g. w/last.pt"), line


def test_missing_sample_image_says_where_to_get_it(gelan_t, tmp_path, monkeypatch):
    """detect_dual.py --source data/images/horses.jpg (the published guides' image) without the file."""
    from yolov9c.cli.detect import main as detect_main

    monkeypatch.chdir(tmp_path)
    line = refused(detect_main, ["--weights", gelan_t, "--source", "data/images/horses.jpg", "--project",
                                 tmp_path / "runs", "--device", "cpu"], tmp_path / "runs")
    assert line.startswith("detect_dual.py: error: --source data/images/horses.jpg: no such file or folder; "), line
    assert "in the data/images folder of the published YOLOv9 repository (https://github.com/WongKinYiu/yolov9)" \
           in line, line
