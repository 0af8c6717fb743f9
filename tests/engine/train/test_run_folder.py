"""Run folders that survive crashes: yolov9c/engine/train/run_folder.py (+ results.csv, atomic writes, run_dir).

- one writer: a real second Python process holds the lock → refused with its pid/host/since; released on a
  normal exit and, through atexit, on an uncaught exception; a kill -9'd holder (also still a zombie) and a
  reused pid are taken over with a log line; a lock of another host is respected; four processes starting
  together on a stale lock: exactly one gets it;
- results.csv: a fresh run moves an old one aside (never mixed), a resume keeps epochs <= E exactly once,
  torn lines dropped; real kill -9 of a child in the middle of a checkpoint save and between the checkpoint and
  the row (in the folder recovered from the first): temps removed on the next open, every epoch exactly once with
  its own values;
- a full disk: torch's wrapped inline_container error, a failing fsync, and (as root) a real 2 MB tmpfs → one
  DiskFullError line (file, MB needed, MB free), old last.pt intact, no temp left, no row appended;
- finishing: run_state.yaml phases and resume_action (train / finish / done), stripping twice is harmless;
- opt.yaml: atomic, an empty one falls back to the checkpoint's options;
- the trainer on its run folder (last section; real tiny CPU trainings: 8 synthetic 64 px images, gelan-mini
  (tests/conftest.py: gelan-t's module kinds at a fifth of its tensors) at --img 64, batch 8, --noval, --noplots;
  the --mem-budget case with gelan-t, as the planner finds it by name): a live run's folder refuses a second run (the lock held by a real
  child process), a fresh --exist-ok run moves results.csv aside, failed starts leave no folder, a run
  interrupted by Ctrl-C names its checkpoint and --resume has each epoch exactly once in results.csv, a run
  killed while finishing is finished by --resume, a done run has nothing to resume and a bare --resume
  skips it.

Run: python -m pytest -q tests/engine/train/test_run_folder.py
"""

import errno
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import yaml

from yolov9c.cli.train import interrupt_hint, main, parse_opt
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.run_dir import increment_path
from yolov9c.engine.train import results as R
from yolov9c.engine.train.run_folder import (LOCK_NAME, STATE_NAME, USER_ERRORS, RunFolder, RunFolderBusy,
                                             RunFolderError, read_opt, read_state, resume_action)
from yolov9c.engine.train.trainer import Interrupted, TrainError, train
from yolov9c.models.atomic_io import DiskFullError, atomic_torch_save
from yolov9c.models.checkpoint import read_checkpoint, strip_checkpoint

REPO = str(Path(__file__).resolve().parents[3])
NCOL = len(R.COLUMNS)


def row(epoch):
    """A results row whose every value tells which epoch wrote it."""
    return [epoch] + [epoch + k / 100 for k in range(1, NCOL)]


def ckpt(epoch, epochs=10, numel=1000):
    return {"format": "yolov9c", "version": 1, "epoch": epoch, "optimizer": {"state": {}}, "opt": {"epochs": epochs},
            "model": {"w": torch.full((numel,), float(epoch))}}


def temps(folder):
    return sorted(p.name for d in (folder, folder / "weights") if d.is_dir() for p in d.iterdir()
                  if p.name.endswith(".tmp"))


def proc_stat(pid):
    """(state letter, start time in clock ticks since boot) of process pid, read from /proc/PID/stat (fields 3
    and 22, after the command name in parentheses), or None without /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


class Log(list):
    def __call__(self, msg):
        self.append(str(msg))


# ---------------------------------------------------------------------------------------------------------
# real child processes
# ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def spawn():
    procs = []

    def start(code, *args):
        p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        for f in (p.stdin, p.stdout, p.stderr):
            f.close()


def first_line(p, expect):
    line = p.stdout.readline().strip()
    assert line.startswith(expect), f"child said {line!r}; stderr: {p.stderr.read() if p.poll() is not None else ''}"
    return line


HOLDER = """
import sys
from yolov9c.engine.train.run_folder import RunFolder
folder = RunFolder.open(sys.argv[1], log=lambda m: None)
print("HELD", flush=True)
sys.stdin.readline()
if sys.argv[2] == "with":
    folder.close()
    print("RELEASED", flush=True)
else:
    raise RuntimeError("crash without close")   # atexit must release the lock
"""

STARTER = """
import sys
from yolov9c.engine.train.run_folder import RunFolder, RunFolderBusy
try:
    folder = RunFolder.open(sys.argv[1], log=lambda m: None)
except RunFolderBusy as e:
    print("BUSY " + str(e), flush=True)
else:
    print("HELD", flush=True)
sys.stdin.readline()
"""


def test_second_run_is_refused_while_the_first_lives(tmp_path, spawn):
    folder = tmp_path / "exp"
    holder = spawn(HOLDER, folder, "with")
    first_line(holder, "HELD")
    info = json.loads((folder / LOCK_NAME).read_text())
    assert info["pid"] == holder.pid and info["host"] == socket.gethostname()
    with pytest.raises(RunFolderBusy) as e:
        RunFolder.open(folder)
    msg = str(e.value)
    assert f"pid {holder.pid} on {socket.gethostname()}" in msg and f"since {info['since']}" in msg
    assert "\n" not in msg and isinstance(e.value, USER_ERRORS)
    assert json.loads((folder / LOCK_NAME).read_text())["token"] == info["token"]  # the refusal changed nothing
    holder.stdin.write("\n")
    holder.stdin.flush()
    first_line(holder, "RELEASED")
    assert holder.wait() == 0 and not (folder / LOCK_NAME).exists()
    with RunFolder.open(folder) as f:  # free again
        assert f.held


def test_lock_released_at_exit_after_an_uncaught_exception(tmp_path, spawn):
    folder = tmp_path / "exp"
    holder = spawn(HOLDER, folder, "raise")
    first_line(holder, "HELD")
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.wait() == 1 and "crash without close" in holder.stderr.read()
    assert not (folder / LOCK_NAME).exists()


def test_lock_of_a_killed_run_is_taken_over(tmp_path, spawn):
    """The lock of a kill -9'd holder is taken over while the holder is a zombie (not reaped: its pid still
    exists), and again, the lock file it wrote put back, once it is reaped (dead). One holder for both cases: a
    child's start (importing torch) is most of this test's CPU."""
    folder = tmp_path / "exp"
    holder = spawn(HOLDER, folder, "with")
    first_line(holder, "HELD")
    holder.kill()  # SIGKILL: no atexit, the lock stays behind
    while (proc_stat(holder.pid) or ("Z",))[0] != "Z":  # not reaped: the pid still exists, as a zombie
        time.sleep(0.01)
    written = (folder / LOCK_NAME).read_bytes()
    assert json.loads(written)["pid"] == holder.pid
    for reaped in (False, True):
        if reaped:
            holder.wait()
            (folder / LOCK_NAME).write_bytes(written)
        log = Log()
        with RunFolder.open(folder, log=log) as f:
            assert json.loads(f.lock_path.read_text())["pid"] == os.getpid()
        assert any("taking over the lock" in m and f"pid {holder.pid}" in m for m in log), (reaped, log)
        assert not (folder / LOCK_NAME).exists()


def test_reused_pid_is_not_the_lock_holder(tmp_path, spawn):
    """A live process with the recorded pid but another start time started after the holder died."""
    other = spawn("import sys; sys.stdin.readline()")
    if proc_stat(other.pid) is None:
        pytest.skip("no /proc: pid reuse cannot be told apart")
    folder = tmp_path / "exp"
    folder.mkdir()
    lock = {"pid": other.pid, "host": socket.gethostname(), "since": "2026-01-01T00:00:00+00:00",
            "start": proc_stat(other.pid)[1] + 1, "token": "x"}
    (folder / LOCK_NAME).write_text(json.dumps(lock))
    with RunFolder.open(folder, log=Log()):
        pass
    lock["start"] -= 1  # now it is the same process: respected
    (folder / LOCK_NAME).write_text(json.dumps(lock))
    with pytest.raises(RunFolderBusy, match=f"pid {other.pid}"):
        RunFolder.open(folder)


def test_lock_of_another_host_is_respected(tmp_path):
    folder = tmp_path / "exp"
    folder.mkdir()
    lock = {"pid": 1, "host": "gpu-node-7.example", "since": "2026-01-01T00:00:00+00:00", "token": "x"}
    (folder / LOCK_NAME).write_text(json.dumps(lock))
    with pytest.raises(RunFolderBusy) as e:
        RunFolder.open(folder)
    msg = str(e.value)
    assert "pid 1 on gpu-node-7.example" in msg and "last saved" in msg and f"delete {folder / LOCK_NAME}" in msg
    assert json.loads((folder / LOCK_NAME).read_text()) == lock


def test_unreadable_old_lock_is_stale_but_a_fresh_empty_one_is_a_starting_run(tmp_path):
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / LOCK_NAME).write_text("")  # kill between O_EXCL and the write, long ago
    old = time.time() - 3600
    os.utime(folder / LOCK_NAME, (old, old))
    log = Log()
    with RunFolder.open(folder, log=log):
        pass
    assert any("taking over" in m and "unreadable" in m for m in log)


def test_one_of_four_simultaneous_starters_takes_a_stale_lock(tmp_path, spawn):
    folder = tmp_path / "exp"
    dead = spawn("pass")
    dead.wait()
    folder.mkdir()
    (folder / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "since": "then",
                                                "token": "old"}))
    kids = [spawn(STARTER, folder) for _ in range(4)]
    said = [k.stdout.readline().strip() for k in kids]
    holders = [k for k, s in zip(kids, said) if s == "HELD"]
    assert len(holders) == 1, said
    owner = json.loads((folder / LOCK_NAME).read_text())["pid"]
    assert owner == holders[0].pid
    assert all(s.startswith("BUSY") and f"pid {owner} " in s for s in said if s != "HELD"), said


@pytest.mark.parametrize("empty", [False, True], ids=["pid-of-a-dead-taker", "older-empty-file"])
def test_takeover_mutex_of_a_taker_killed_midway_is_removed(tmp_path, spawn, empty):
    """A start killed inside its takeover left `run.lock.takeover` beside the stale lock: the next start removes it
    at once, with one line, and takes the lock (before: it spun for 25 s, then blamed other processes)."""
    dead = spawn("pass")
    dead.wait()
    folder = tmp_path / "exp"
    folder.mkdir()
    stale = json.dumps({"pid": dead.pid, "host": socket.gethostname(), "since": "then", "token": "old"})
    (folder / LOCK_NAME).write_text(stale)
    mutex = folder / (LOCK_NAME + ".takeover")
    mutex.write_text("" if empty else stale)
    if empty:  # an older version's empty mutex: stale once it is older than a start takes to write it
        old = time.time() - 60
        os.utime(mutex, (old, old))
    log = Log()
    with RunFolder.open(folder, log=log) as f:
        assert f.held and json.loads(f.lock_path.read_text())["pid"] == os.getpid()
    who = "unreadable" if empty else f"pid {dead.pid} on {socket.gethostname()}"
    assert log == [f"{folder}: removed {mutex.name} of a lock takeover killed midway ({who})",
                   f"{folder}: taking over the lock of a run that no longer runs (pid {dead.pid} on "
                   f"{socket.gethostname()}, since then)"], log
    assert not mutex.exists()


def test_a_live_takers_mutex_is_kept(tmp_path, spawn):
    """A mutex whose taker still runs is not removed: the start waits for it, and ends refused when it never goes."""
    folder = tmp_path / "exp"
    folder.mkdir()
    dead = spawn("pass")
    dead.wait()
    (folder / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "since": "then",
                                                "token": "old"}))
    taker = spawn("import sys; sys.stdin.readline()")
    mutex = folder / (LOCK_NAME + ".takeover")
    mutex.write_text(json.dumps({"pid": taker.pid, "host": socket.gethostname(), "since": "now",
                                 "start": (proc_stat(taker.pid) or (None, None))[1], "token": "t"}))
    f = RunFolder(folder, Log())
    f._remove_stale_mutex(mutex)
    assert mutex.exists() and not f.log


def test_unwritable_folders_are_refused_before_anything_is_taken(tmp_path):
    """A read-only run folder, its read-only weights/, or a read-only folder a new one would be made in: one
    RunFolderError naming it, and no lock or file made (no write bit counts for root too)."""
    folder = tmp_path / "exp"
    (folder / "weights").mkdir(parents=True)
    project = tmp_path / "ro"
    project.mkdir()
    cases = [(folder, folder, f"{folder} is not writable (read-only): make it writable, or train into another "
                              f"folder (another --project or --name)"),
             (folder / "weights", folder, f"{folder / 'weights'} is not writable (read-only)"),
             (project, project / "train" / "exp", f"cannot make {project / 'train' / 'exp'}: {project} is not "
                                                  f"writable (read-only): give a --project you can write to")]
    for ro, target, says in cases:
        os.chmod(ro, 0o555)
        try:
            with pytest.raises(RunFolderError) as e:
                RunFolder.open(target)
        finally:
            os.chmod(ro, 0o755)
        assert str(e.value).startswith(says), str(e.value)
        assert isinstance(e.value, USER_ERRORS)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["exp", "exp/weights", "ro"]


def test_an_open_that_has_not_begun_changes_nothing(tmp_path):
    """open(begin=False) (set-up, until the run is built): an earlier run's files, its temps and the yaml files
    written meanwhile stay as they were when the folder is closed without begin(); begin() does it all."""
    folder = tmp_path / "exp"
    with RunFolder.open(folder) as f:
        f.save_epoch(0, row(0), ckpt(0))
        f.write_yaml("opt.yaml", {"epochs": 1})
    (folder / ".opt.yaml.x1.tmp").write_text("junk")

    def tree():
        return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None for p in folder.rglob("*")}

    before = tree()
    with RunFolder.open(folder, begin=False) as f:
        f.write_yaml("opt.yaml", {"epochs": 2})
        assert tree() == {**before, LOCK_NAME: (folder / LOCK_NAME).read_bytes()}
    assert tree() == before
    with RunFolder.open(folder, begin=False) as f:
        f.write_yaml("opt.yaml", {"epochs": 3})
        f.begin()
    after = tree()
    assert yaml.safe_load(after["opt.yaml"]) == {"epochs": 3} and after["results.1.csv"] == before["results.csv"]
    assert "weights.1/last.pt" in after and ".opt.yaml.x1.tmp" not in after and "results.csv" not in after


def test_second_open_in_the_same_process_is_refused(tmp_path):
    with RunFolder.open(tmp_path / "exp"):
        with pytest.raises(RunFolderBusy, match="already open in this process"):
            RunFolder.open(tmp_path / "exp")
    with RunFolder.open(tmp_path / "exp"):
        pass


# ---------------------------------------------------------------------------------------------------------
# results.csv and the order of writes
# ---------------------------------------------------------------------------------------------------------

def test_fresh_run_into_an_existing_folder_moves_results_aside(tmp_path):
    folder = tmp_path / "exp"
    with RunFolder.open(folder) as f:
        for e in range(3):
            f.save_epoch(e, row(e), ckpt(e))
        f.save_epoch(2, row(2), ckpt(2), also=("epoch2.pt", "best.pt"))
    first = (folder / "results.csv").read_text()
    log = Log()
    with RunFolder.open(folder, log=log) as f:  # --exist-ok: a new run, same folder
        assert not f.results.exists()
        assert not list(f.weights.iterdir())  # the earlier run's models are not beside this run's
        f.save_epoch(0, row(0), ckpt(0))
    assert (folder / "results.1.csv").read_text() == first
    assert R.epochs_in(folder / "results.csv") == [0]
    assert sorted(p.name for p in (folder / "weights.1").iterdir()) == ["best.pt", "epoch2.pt", "last.pt"]
    assert sorted(p.name for p in (folder / "weights").iterdir()) == ["last.pt"]
    assert any("results.csv to results.1.csv and weights/ to weights.1/ moved aside" in m for m in log), log
    with RunFolder.open(folder):
        pass
    assert (folder / "results.1.csv").read_text() == first  # never overwritten: the next goes to .2
    assert R.epochs_in(folder / "results.2.csv") == [0] and not (folder / "results.csv").exists()


def test_resume_keeps_each_epoch_once_and_drops_a_torn_line(tmp_path):
    folder = tmp_path / "exp"
    with RunFolder.open(folder) as f:
        for e in range(5):
            f.save_epoch(e, row(e), ckpt(e))
    with open(folder / "results.csv", "a") as fh:  # an older, in-place writer killed mid-line
        fh.write(" " * 19 + "5,   0.1")
    resume_from = ckpt(2)  # e.g. --resume weights/epoch2.pt: epochs 3, 4 are redone
    resume_from["results_row"] = row(2)
    log = Log()
    with RunFolder.open(folder, resume=resume_from, log=log) as f:
        assert f.resume_action == "train"
        assert R.epochs_in(f.results) == [0, 1, 2]
        for e in (3, 4):
            f.save_epoch(e, row(e), ckpt(e))
    assert any("dropped 3 row(s) after epoch 2" in m for m in log), log
    data = R.read_results(folder / "results.csv")
    assert data["epoch"].tolist() == [0, 1, 2, 3, 4]
    for e in range(5):
        assert data[R.COLUMNS[-1]][e] == pytest.approx(row(e)[-1], rel=1e-4)


def test_row_is_written_after_last_pt_and_stored_in_it(tmp_path, monkeypatch):
    folder = tmp_path / "exp"
    f = RunFolder.open(folder)
    f.save_epoch(0, row(0), ckpt(0), also=("best.pt", "epoch0.pt"))
    assert read_checkpoint(f.last)["results_row"] == pytest.approx(row(0))
    assert f.best.stat().st_ino == f.last.stat().st_ino  # a hard link: no second write of the checkpoint
    seen = []
    monkeypatch.setattr(R, "append_row", lambda path, values: seen.append(read_checkpoint(f.last)["epoch"]))
    f.save_epoch(1, row(1), ckpt(1))
    assert seen == [1]  # last.pt of epoch 1 was on disk when the row was appended
    assert torch.load(f.best, weights_only=True)["epoch"] == 0  # best.pt kept epoch 0 when last.pt was replaced
    assert torch.load(folder / "weights" / "epoch0.pt", weights_only=True)["epoch"] == 0
    f.close()


def test_nosave_epoch_writes_the_row_only(tmp_path):
    with RunFolder.open(tmp_path / "exp") as f:
        f.save_epoch(0, row(0), None)
        assert R.epochs_in(f.results) == [0] and not f.last.exists()


SAVER = """
import io, sys, time, torch
from pathlib import Path
from yolov9c.engine.train import results as R
from yolov9c.engine.train.run_folder import RunFolder
from yolov9c.models.checkpoint import read_checkpoint, strip_checkpoint

folder, hang_epoch, where, ncol = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], len(R.COLUMNS)
real_save, real_append = torch.save, R.append_row

def save(obj, f, *a, **k):
    if obj.get("epoch") == hang_epoch and where == "save":
        buf = io.BytesIO()
        real_save(obj, buf)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        f.flush()
        print("HANG", flush=True)
        time.sleep(600)
    return real_save(obj, f, *a, **k)

def append(path, values):
    if int(values[0]) == hang_epoch and where == "row":
        print("HANG", flush=True)
        time.sleep(600)
    return real_append(path, values)

torch.save, R.append_row = save, append
last = folder / "weights" / "last.pt"
ck = read_checkpoint(last) if last.exists() else None
with RunFolder.open(folder, resume=ck, log=lambda m: print("LOG " + m, file=sys.stderr)) as rf:
    for e in range(0 if ck is None else ck["epoch"] + 1, 10):
        c = {"format": "yolov9c", "version": 1, "epoch": e, "optimizer": {}, "opt": {"epochs": 10}, "model": {"w": torch.full((300000,), float(e))}}
        rf.save_epoch(e, [e] + [e + k / 100 for k in range(1, ncol)], c, also=("best.pt",) if e % 2 else ())
print("DONE", flush=True)
"""


def test_kill_9_during_saves_never_duplicates_or_loses_an_epoch(tmp_path, spawn):
    """Two real kill -9's: in the middle of last.pt's write, then, in the folder recovered from it, between
    last.pt and the row; a third run recovers that and finishes."""
    folder = tmp_path / "exp"
    for hang, where in ((2, "save"), (5, "row")):
        child = spawn(SAVER, folder, hang, where)
        first_line(child, "HANG")
        if where == "save":
            assert temps(folder) and temps(folder)[0].startswith(".last.pt.")  # the torso of the killed write
        child.kill()
        child.wait()
        done = hang - 1 if where == "save" else hang  # the last epoch whose last.pt is complete
        assert read_checkpoint(folder / "weights" / "last.pt")["epoch"] == done
        assert R.epochs_in(folder / "results.csv") == list(range(hang))
    child = spawn(SAVER, folder, -1, "none")
    assert child.stdout.readline().strip() == "DONE", child.stderr.read()
    assert child.wait() == 0
    err = child.stderr.read()
    assert "taking over the lock" in err and "restored the row of epoch 5" in err, err
    assert temps(folder) == [] and not (folder / LOCK_NAME).exists()
    data = R.read_results(folder / "results.csv")
    assert data["epoch"].tolist() == list(range(10))
    for e in range(10):
        assert data[R.COLUMNS[1]][e] == pytest.approx(row(e)[1], rel=1e-4)
    assert read_checkpoint(folder / "weights" / "last.pt")["model"]["w"][0].item() == 9


def test_open_removes_temp_files_of_interrupted_saves(tmp_path):
    folder = tmp_path / "exp"
    (folder / "weights").mkdir(parents=True)
    junk = [folder / "weights" / ".last.pt.k2j4x9_a.tmp", folder / ".results.csv.zz81.tmp",
            folder / ".opt.yaml.q.tmp"]
    for p in junk:
        p.write_bytes(b"x" * 1000)
    keep = folder / "weights" / "notes.tmp.txt"
    keep.write_text("mine")
    log = Log()
    with RunFolder.open(folder, log=log):
        pass
    assert not any(p.exists() for p in junk) and keep.exists()
    assert any("removed 3 temp file(s)" in m for m in log)


# ---------------------------------------------------------------------------------------------------------
# a full disk
# ---------------------------------------------------------------------------------------------------------

class FullAfter:
    """A file that takes `room` bytes and then fails as a full disk does."""

    def __init__(self, f, room):
        self.f, self.room = f, room

    def write(self, b):
        if len(b) > self.room:
            self.f.write(bytes(b[: self.room]))
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(b)
        return self.f.write(b)

    def flush(self):
        self.f.flush()


def assert_full_disk_kept_everything(folder, err, before_bytes, epoch):
    msg = str(err)
    assert isinstance(err, USER_ERRORS) and "\n" not in msg
    assert msg.startswith(f"No space left on device writing {folder / 'weights' / 'last.pt'} (checkpoint of epoch")
    assert "MB free in" in msg and "the previous last.pt is intact" in msg
    assert err.needed >= 4 * 300000  # the size estimate covers the tensors
    assert (folder / "weights" / "last.pt").read_bytes() == before_bytes
    assert read_checkpoint(folder / "weights" / "last.pt")["epoch"] == epoch
    assert temps(folder) == []
    assert R.epochs_in(folder / "results.csv") == list(range(epoch + 1))  # no row for the unsaved epoch


def test_full_disk_through_torch_is_one_clear_error(tmp_path, monkeypatch):
    folder = tmp_path / "exp"
    f = RunFolder.open(folder)
    f.save_epoch(0, row(0), ckpt(0, numel=300000))
    before = f.last.read_bytes()
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, fh, *a, **k: real_save(obj, FullAfter(fh, 4096), *a, **k))
    with pytest.raises(RuntimeError, match="inline_container"):  # what torch itself raises
        real_save(ckpt(1), FullAfter(io.BytesIO(), 4096))
    with pytest.raises(DiskFullError) as e:
        f.save_epoch(1, row(1), ckpt(1, numel=300000))
    assert isinstance(e.value.__cause__, RuntimeError) and e.value.errno == errno.ENOSPC
    assert f"{e.value.needed / 1e6:.1f} MB" in str(e.value)
    assert_full_disk_kept_everything(folder, e.value, before, 0)
    f.close()


def test_full_disk_message_promises_only_what_can_happen(tmp_path, monkeypatch):
    # the first save of a run fails: nothing to resume, so the message does not offer --resume
    folder = tmp_path / "exp"
    f = RunFolder.open(folder)
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, fh, *a, **k: real_save(obj, FullAfter(fh, 4096), *a, **k))
    with pytest.raises(DiskFullError) as e:
        f.save_epoch(0, row(0), ckpt(0, numel=300000))
    msg = str(e.value)
    assert "--resume" not in msg and "nothing to resume" in msg and "nothing was written" in msg, msg
    monkeypatch.setattr(torch, "save", real_save)
    f.save_epoch(0, row(0), ckpt(0))
    monkeypatch.setattr(torch, "save", lambda obj, fh, *a, **k: real_save(obj, FullAfter(fh, 4096), *a, **k))
    with pytest.raises(DiskFullError) as e:  # a later save: --resume of the saved last.pt
        f.save_epoch(1, row(1), ckpt(1, numel=300000))
    assert f"--resume {f.last}" in str(e.value)
    f.close()
    # an estimate below the free space the failed write left: no "needs 4.1 MB, 4.2 MB free"
    msg = str(DiskFullError(folder / "weights" / "last.pt", "checkpoint", 4_100_000, 4_200_000))
    assert "needs about" not in msg and "about 4.1 MB did not fit in the 4.2 MB free" in msg, msg
    msg = str(DiskFullError(folder / "weights" / "last.pt", "checkpoint", 4_100_000, 1_000_000))
    assert "it needs about 4.1 MB, 1.0 MB free" in msg


def test_full_disk_at_fsync_and_other_errors_pass_through(tmp_path, monkeypatch):
    folder = tmp_path / "exp"
    f = RunFolder.open(folder)
    f.save_epoch(0, row(0), ckpt(0, numel=300000))
    before = f.last.read_bytes()
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".last.pt."):
            raise OSError(errno.ENOSPC, "No space left on device")  # delayed allocation fails at fsync
        return real_fsync(fd)

    if not os.path.exists("/proc/self/fd"):
        pytest.skip("no /proc/self/fd")
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(DiskFullError) as e:
        f.save_epoch(1, row(1), ckpt(1, numel=300000))
    assert_full_disk_kept_everything(folder, e.value, before, 0)
    monkeypatch.setattr(os, "fsync", real_fsync)

    def broken(obj, fh, *a, **k):
        raise RuntimeError("some other torch failure")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(RuntimeError, match="some other torch failure") as e:
        f.save_epoch(1, row(1), ckpt(1))
    assert not isinstance(e.value, DiskFullError) and temps(folder) == []
    f.close()


@pytest.fixture
def tiny_fs(tmp_path):
    """A real 2 MB tmpfs (root only)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_full_disk_on_a_real_tiny_filesystem(tiny_fs):
    folder = tiny_fs / "exp"
    f = RunFolder.open(folder)
    f.save_epoch(0, row(0), ckpt(0, numel=150000))  # 0.6 MB
    before = f.last.read_bytes()
    with pytest.raises(DiskFullError) as e:
        f.save_epoch(1, row(1), ckpt(1, numel=400000))  # 1.6 MB more does not fit next to the old one
    assert_full_disk_kept_everything(folder, e.value, before, 0)
    assert e.value.free == shutil.disk_usage(tiny_fs).free < e.value.needed
    f.save_epoch(1, row(1), ckpt(1, numel=150000))  # the torso's space came back: a file that fits is saved
    assert R.epochs_in(f.results) == [0, 1] and read_checkpoint(f.last)["epoch"] == 1
    f.close()


# ---------------------------------------------------------------------------------------------------------
# finishing, opt.yaml, run_dir
# ---------------------------------------------------------------------------------------------------------

_MODELS = []


def real_ckpt(epoch, epochs, cfg):
    """A trainer-like checkpoint (model, EMA, optimizer) of a small model (cfg: gelan_mini), built once per
    session."""
    from yolov9c.models.checkpoint import make_checkpoint
    from yolov9c.models.model import DetectionModel
    if not _MODELS:
        torch.manual_seed(0)
        _MODELS.extend([DetectionModel(cfg, nc=2), DetectionModel(cfg, nc=2)])
    model, ema = _MODELS
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return make_checkpoint(model, ema=ema, optimizer=opt, epoch=epoch, opt={"epochs": epochs}, half=False)


def test_a_kill_while_finishing_resumes_as_finish(tmp_path, gelan_mini):
    folder = tmp_path / "exp"
    with RunFolder.open(folder) as f:
        for e in range(3):
            f.save_epoch(e, row(e), real_ckpt(e, 3, gelan_mini), also=("best.pt",) if e == 1 else ())
        assert read_state(folder)["phase"] == "training"
        f.begin_finish()
        f.last.unlink()  # stand-in for a kill: last.pt stripped...
        atomic_torch_save(real_ckpt(2, 3, gelan_mini), f.last)  # ...or not yet: either way
        f.strip_weights()
        # killed here: best.pt validation never ran
    ck = read_checkpoint(folder / "weights" / "last.pt")
    assert ck["optimizer"] is None and ck["epoch"] == -1
    with RunFolder.open(folder, resume=ck) as f:
        assert f.resume_action == "finish"
        assert R.epochs_in(f.results) == [0, 1, 2]  # rows untouched
        sd = read_checkpoint(f.best)["model"]
        assert [p.name for p in f.strip_weights(log=Log())] == ["last.pt", "best.pt"]
        again = read_checkpoint(f.best)["model"]
        assert all(torch.equal(v, again[k]) for k, v in sd.items())  # idempotent
        f.mark_done()
    with RunFolder.open(folder, resume=ck) as f:
        assert f.resume_action == "done"


def test_resume_action_without_a_state_file(tmp_path):
    """Folders of older versions: judged from the checkpoint."""
    (tmp_path / "old").mkdir()
    assert resume_action(tmp_path / "old", ckpt(4, epochs=10)) == "train"
    assert resume_action(tmp_path / "old", ckpt(9, epochs=10)) == "finish"  # killed before the strip
    stripped = dict(ckpt(-1), optimizer=None)
    assert resume_action(tmp_path / "old", stripped) == "done"
    (tmp_path / "old" / STATE_NAME).write_text(yaml.safe_dump({"phase": "training"}))
    assert resume_action(tmp_path / "old", ckpt(9, epochs=10)) == "finish"  # after the last save_epoch


def test_yaml_files_are_atomic_and_an_empty_opt_yaml_falls_back(tmp_path, monkeypatch):
    folder = tmp_path / "exp"
    with RunFolder.open(folder) as f:
        f.write_yaml("opt.yaml", {"epochs": 3, "save_dir": folder, "hyp": {"lr0": 0.01}})
        assert read_opt(folder) == {"epochs": 3, "save_dir": str(folder), "hyp": {"lr0": 0.01}}
        monkeypatch.setattr(yaml, "safe_dump", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            f.write_yaml("opt.yaml", {"epochs": 4})  # a kill while rewriting it on resume
        monkeypatch.undo()
        assert read_opt(folder)["epochs"] == 3 and temps(folder) == []
    (folder / "opt.yaml").write_text("")  # what an older version's in-place write left
    log = Log()
    assert read_opt(folder, fallback={"epochs": 7}, log=log) == {"epochs": 7}
    assert "opt.yaml is empty" in log[0]
    with pytest.raises(RunFolderError, match="opt.yaml is empty"):
        read_opt(folder)
    with pytest.raises(RunFolderError, match="opt.yaml is missing"):
        read_opt(tmp_path / "nowhere")


def test_increment_path_claims_a_folder_atomically(tmp_path):
    a = increment_path(tmp_path / "runs" / "exp", mkdir=True)
    b = increment_path(tmp_path / "runs" / "exp", mkdir=True)
    assert (a.name, b.name) == ("exp", "exp2") and a.is_dir() and b.is_dir()
    assert increment_path(tmp_path / "runs" / "exp", exist_ok=True, mkdir=True) == a


# ---------------------------------------------------------------------------------------------------------
# the trainer on its run folder (real tiny CPU trainings)
# ---------------------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=3, root=tmp_path_factory.mktemp("syn"), n_train=8, n_val=4, imgsz=64))


@pytest.fixture(scope="module")
def args(data, gelan_mini):
    """args(project, *extra, data=None): the command line of a tiny training into `project` (another --data
    if given)."""
    def make(project, *extra, data=data):
        return ["--data", data, "--cfg", gelan_mini, "--img", "64", "--batch", "8", "--epochs", "1", "--workers",
                "0", "--noval", "--noplots", "--device", "cpu", "--project", str(project), *extra]
    return make


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


def test_failed_starts_leave_no_folder_and_exist_ok_moves_results_aside(args, tmp_path):
    project = tmp_path / "runs"
    with pytest.raises(TrainError):
        train(parse_opt(args(project, data=str(tmp_path / "nosuch.yaml"))), log=_quiet)
    with pytest.raises(TrainError, match="--cfg"):
        train(parse_opt(args(project, "--cfg", str(tmp_path / "nosuch-model.yaml"))), log=_quiet)
    assert not project.exists() or list(project.iterdir()) == []
    out = train(parse_opt(args(project)), log=_quiet)
    run = out["save_dir"]
    assert run == project / "exp"  # not exp3: the failed starts took no name
    assert _epochs(run) == [0] and read_state(run)["phase"] == "done"
    assert not (run / "run.lock").exists()  # released
    assert yaml.safe_load((run / "opt.yaml").read_text())["epochs"] == 1
    first = (run / "results.csv").read_text()
    again = train(parse_opt(args(project, "--exist-ok")), log=_quiet)
    assert again["save_dir"] == run
    assert (run / "results.1.csv").read_text() == first  # the earlier run's rows, moved aside
    assert (run / "weights.1" / "last.pt").is_file() and (run / "weights" / "last.pt").is_file()  # and its models
    assert _epochs(run) == [0]  # the new run's own results.csv: one row, not two


def test_a_live_runs_folder_refuses_a_second_run(args, tmp_path, capsys):
    run = tmp_path / "runs" / "exp"
    run.mkdir(parents=True)
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; from yolov9c.engine.train.run_folder import RunFolder; "
                               f"f = RunFolder.open({str(run)!r}, log=lambda *a: None); print('held', flush=True); "
                               "sys.stdin.read()"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        code = main(args(tmp_path / "runs", "--exist-ok"))
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2
        assert err[-1].startswith("train_dual.py: error: ") and f"pid {child.pid}" in err[-1]
        assert "in use by another training run" in err[-1]
        assert sorted(p.name for p in run.iterdir()) == ["run.lock", "run_state.yaml", "weights"]  # untouched
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert not (run / "run.lock").exists()


def test_ctrl_c_names_the_checkpoint_and_resume_has_each_epoch_once(args, tmp_path):
    project = tmp_path / "runs"
    header = ("%11s" * 2) % ("Epoch", "GPU_mem")
    # Ctrl-C in the first epoch: no checkpoint yet, and the hint says so
    with pytest.raises(Interrupted) as e0:
        train(parse_opt(args(project, "--epochs", "2")), log=_stop_at(header, 1, KeyboardInterrupt))
    assert e0.value.last is None and e0.value.save_dir == project / "exp"
    assert "nothing to resume" in interrupt_hint(parse_opt([]), e0.value)
    assert not (project / "exp").exists()  # no checkpoint, no folder: the same command takes exp again
    # Ctrl-C at the start of epoch 1: last.pt of epoch 0 is named
    with pytest.raises(Interrupted) as e1:
        train(parse_opt(args(project, "--epochs", "2")), log=_stop_at(header, 2, KeyboardInterrupt))
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
    # an earlier run's weights that --exist-ok moved aside (weights.1/) are never a bare --resume's pick
    aside = Path(shutil.copytree(run / "weights", project / "exp4" / "weights.1"))
    os.utime(aside / "last.pt", (time.time() + 9, time.time() + 9))
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


def test_ctrl_c_of_a_nosave_run_keeps_its_finished_epochs(args, tmp_path):
    """--nosave writes no checkpoint before the last epoch: a Ctrl-C after finished epochs has nothing to resume
    but keeps the folder and its results.csv rows (only a run with no finished epoch is removed)."""
    header = ("%11s" * 2) % ("Epoch", "GPU_mem")
    with pytest.raises(Interrupted) as e:
        train(parse_opt(args(tmp_path / "runs", "--epochs", "3", "--nosave")),
              log=_stop_at(header, 2, KeyboardInterrupt))
    run = tmp_path / "runs" / "exp"
    assert e.value.last is None and not e.value.removed and _epochs(run) == [0]
    assert "no checkpoint to resume" in interrupt_hint(parse_opt([]), e.value)


def test_mem_budget_run_resumes(args, tmp_path):
    """A resume builds the model from the checkpoint's dict (no --cfg): the planner still finds the model by the
    checkpoint's yaml_file (gelan-t.yaml, a name: the planner resolves it). The resume stops after epoch 1 of 3:
    the planner has run by then, and a finish (strip, final validation) has nothing to do with it."""
    project = tmp_path / "runs"
    train(parse_opt(args(project, "--cfg", "gelan-t.yaml", "--epochs", "3", "--mem-budget", "1G")),
          stop_after_epoch=0, log=_quiet)
    last = project / "exp" / "weights" / "last.pt"
    out = train(parse_opt(["--resume", str(last)]), stop_after_epoch=1, log=_quiet)
    assert out["epochs_done"] == 2 and _epochs(project / "exp") == [0, 1]


def test_a_run_killed_at_the_finish_is_finished_by_resume(args, tmp_path):
    """Killed after the last epoch's save (before the finish began), then its --resume killed while finishing
    (weights stripped, run_state "finishing", final validation not done): each --resume only strips and
    validates (no epoch loop); then the run is done and a further --resume has nothing to do."""
    with pytest.raises(_Stop):
        train(parse_opt([a for a in args(tmp_path / "runs") if a != "--noval"]),
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


def test_resume_from_an_epoch_checkpoint_of_a_finished_run(args, tmp_path):
    """--resume RUN/weights/epoch0.pt of a finished run (to go back before a divergence) trains again from epoch 1
    in a new folder RUN-from-epoch0: the finished run's files stay byte for byte, the new folder has each epoch
    once in results.csv (epoch 0 copied, 1 and 2 trained) and, resume being exact on the CPU, ends with the same
    weights as the finished run. Before: "nothing to resume: this run finished"."""
    import torch

    out = train(parse_opt(args(tmp_path, "--epochs", "3", "--save-period", "1")), log=_quiet)
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
    # the final epoch's checkpoint: nothing to train; the branch finishes with it as its best.pt (validated
    # unless --noval, as this run has)
    lines.clear()
    out3 = train(parse_opt(["--resume", str(run / "weights" / "epoch2.pt")]), log=lambda *a, **k: lines.append(
        " ".join(map(str, a))))
    final = run.parent / f"{run.name}-from-epoch2"
    assert out3["save_dir"] == final and read_state(final)["phase"] == "done"
    assert any("training ended after epoch 2; finishing the run" in s for s in lines)
    for name in ("best.pt", "last.pt"):  # both stripped, as a finished run's
        assert read_checkpoint(final / "weights" / name)["optimizer"] is None
    assert after == {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}


def test_an_interrupted_run_moved_aside_by_exist_ok_resumes_in_a_new_folder(args, tmp_path):
    """A run interrupted after epoch 0 of 2, then a new --exist-ok run in its folder (which moves its weights/ to
    weights.1/ and results.csv to results.1.csv): --resume RUN/weights.1/last.pt continues the interrupted run
    with its own options (the checkpoint's: opt.yaml is the new run's) in RUN-from-weights.1-last; RUN stays as
    it is. Before: "nothing to resume: this run finished", judged from the new run's state."""
    project = tmp_path / "runs"
    run = train(parse_opt(args(project, "--epochs", "2")), stop_after_epoch=0, log=_quiet)["save_dir"]
    assert train(parse_opt(args(project, "--exist-ok")), log=_quiet)["save_dir"] == run
    aside = run / "weights.1" / "last.pt"
    assert read_checkpoint(aside)["epoch"] == 0 and read_state(run)["phase"] == "done"
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    out = train(parse_opt(["--resume", str(aside)]), log=_quiet)
    branch = project / f"{run.name}-from-weights.1-last"
    assert out["save_dir"] == branch and out["epochs_done"] == 2
    assert _epochs(branch) == [0, 1] and read_state(branch)["phase"] == "done"
    assert yaml.safe_load((branch / "opt.yaml").read_text())["epochs"] == 2  # the interrupted run's, not 1
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


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


def test_best_pt_linked_to_last_pt_is_stripped_once_and_equals_a_separate_strip(tmp_path, gelan_mini):
    folder = tmp_path / "exp"
    with RunFolder.open(folder) as f:
        f.save_epoch(0, row(0), real_ckpt(0, 2, gelan_mini))
        f.save_epoch(1, row(1), real_ckpt(1, 2, gelan_mini), also=("best.pt",))  # the last epoch is the best: a hard link
        assert os.path.samefile(f.last, f.best)
        separate = tmp_path / "separate.pt"
        strip_checkpoint(f.best, out=separate)
        f.begin_finish()
        assert [p.name for p in f.strip_weights(log=Log())] == ["last.pt", "best.pt"]
        assert os.path.samefile(f.last, f.best)  # linked again, not written twice
        want, got = read_checkpoint(separate), read_checkpoint(f.best)
        assert got["optimizer"] is None and got["ema"] is None and got["epoch"] == -1
        assert want["model"].keys() == got["model"].keys()
        assert all(torch.equal(v, got["model"][k]) and v.dtype == got["model"][k].dtype
                   for k, v in want["model"].items())
