"""The run folder of one training (runs/train/NAME): one writer at a time, and files that survive any crash.

    folder = RunFolder.open(save_dir, begin=False, log=log)   # resume=read_checkpoint(last_pt); folder.begin()
    folder.save_epoch(epoch, row, ckpt, also=("best.pt",)); folder.begin_finish(); folder.mark_done()
- Writable or refused: open() and check_writable raise RunFolderError for a folder, its weights/ or its parent
  that cannot be written (no write bit counts even for root), before the lock is taken or anything is trained.
- A failed start changes nothing: with begin=False the folder is only locked; what a start changes (temps, an
  earlier run moved aside, run_state.yaml, yaml files) happens in begin(), once set-up has built everything.
- One writer: `run.lock` (pid, host, process start time, token) is created with O_EXCL; a live holder raises
  RunFolderBusy; a lock of a dead (or reused) pid on this host is taken over under `run.lock.takeover` (holding
  the taker's pid: one left by a taker killed midway is removed once its pid is dead); a lock from another host
  is always respected. Released by close(), atexit, and on any exception in open().
- Atomic files (atomic_io.atomic_write: temp, fsync, rename); a full disk raises DiskFullError, the old file kept.
- results.csv: a row is appended only after last.pt is on disk and is stored in it too: each epoch exactly once.
Test: python -m pytest -q tests/engine/train/test_run_folder.py
"""

from __future__ import annotations

import atexit
import datetime
import errno
import json
import os
import socket
import sys
import time
from pathlib import Path

import yaml

from yolov9c.data.label_cache import folder_writable
from yolov9c.engine.run_dir import RunDirError
from yolov9c.engine.train import results as R
from yolov9c.models.atomic_io import DiskFullError, atomic_copy, atomic_torch_save, atomic_write, is_temp_name
from yolov9c.models.checkpoint import strip_checkpoint, to_plain

LOCK_NAME = "run.lock"
STATE_NAME = "run_state.yaml"
RESULTS_NAME = "results.csv"
STARTING_S = 5.0  # a lock file this young without readable content: its writer is between O_EXCL and write
TAKEOVER_STALE_S = 30.0  # a takeover mutex older than this belongs to a process killed in the middle
PHASES = ("training", "finishing", "done")

_HELD: set[str] = set()  # lock files this process holds (a second open in the same process is refused too)


class RunFolderError(RuntimeError):
    """A run folder problem the user can fix; str(e) is one `error:` line."""


class RunFolderBusy(RunFolderError):
    """Another live training run holds the folder (its pid, host and start time are in the message)."""


# What the CLI prints as one `error:` line (DiskFullError lives in models/atomic_io.py, below engine).
USER_ERRORS = (RunFolderError, DiskFullError, RunDirError)


# ---------------------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------------------

def _proc_stat(pid: int):
    """(state letter, start time in clock ticks since boot) of process `pid` from /proc, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name in (...) may hold spaces
    return fields[0], int(fields[19])


def pid_alive(pid: int, start: int | None = None) -> bool:
    """Whether process `pid` of this host runs: it exists, is no zombie and (when `start` is given and /proc
    can tell) is the same process that started at `start` ticks, not a later one that reuses the pid."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except OSError:
        return False
    st = _proc_stat(pid)
    if st is None:
        return True
    state, ticks = st
    if state in ("Z", "X"):
        return False
    return start is None or ticks == start


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------------------
# Files of a run folder read without holding it
# ---------------------------------------------------------------------------------------------------------

def read_state(save_dir) -> dict:
    """run_state.yaml of a run folder as a dict ({} when missing or unreadable)."""
    try:
        state = yaml.safe_load((Path(save_dir) / STATE_NAME).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return state if isinstance(state, dict) else {}


def read_opt(save_dir, fallback: dict | None = None, log=print) -> dict:
    """The run's options from opt.yaml. An empty or damaged opt.yaml (left by an older version's in-place
    write) falls back to `fallback` (the options stored in last.pt, ckpt['opt']) with a warning; without a
    fallback it raises RunFolderError."""
    path = Path(save_dir) / "opt.yaml"
    try:
        opt = yaml.safe_load(path.read_text())
        why = None if isinstance(opt, dict) else ("empty" if opt is None else f"a {type(opt).__name__}, not a "
                                                                                "mapping")
    except FileNotFoundError:
        opt, why = None, "missing"
    except (OSError, yaml.YAMLError) as e:
        opt, why = None, f"unreadable ({type(e).__name__})"
    if why is None:
        return opt
    if isinstance(fallback, dict) and fallback:
        log(f"WARNING: {path} is {why}; using the options stored in the checkpoint")
        return dict(fallback)
    raise RunFolderError(f"{path} is {why} and the checkpoint stores no options; give the run's options on the "
                         f"command line and start it again with --weights instead of --resume")


def resume_action(save_dir, ckpt: dict) -> str:
    """What a --resume from checkpoint `ckpt` (read from save_dir/weights/last.pt) has left to do:
    "train" (continue at epoch ckpt['epoch'] + 1), "finish" (training ended; strip and final validation were cut
    off) or "done" (nothing left). run_state.yaml decides; folders without one (older versions) are judged from
    the checkpoint: stripped is done, the last planned epoch saved is finish. save_dir None: a folder not made
    yet (a --resume branch), judged from the checkpoint."""
    phase = read_state(save_dir).get("phase") if save_dir is not None else None
    if phase == "done":
        return "done"
    if phase == "finishing":
        return "finish"
    if ckpt.get("optimizer") is None or int(ckpt.get("epoch", -1)) < 0:
        return "done"  # stripped: a finished run (or an older one this folder's fresh run has not replaced yet)
    epochs = (ckpt.get("opt") or {}).get("epochs")
    if epochs is not None and int(ckpt["epoch"]) + 1 >= int(epochs):
        return "finish"  # killed after the last epoch's save, before the finish began
    return "train"


def check_writable(folder) -> None:
    """Raise RunFolderError when a run could not write its files in run folder `folder`: the folder and its
    weights/ where they exist, else the nearest existing folder above it, where it would be made. A folder with
    no write bit at all counts as read-only even for root (label_cache.folder_writable)."""
    folder = Path(folder)
    if folder.exists():
        for d in (folder, folder / "weights"):
            if d.is_dir() and not folder_writable(d):
                raise RunFolderError(f"{d} is not writable (read-only): make it writable, or train into another "
                                     f"folder (another --project or --name)")
        return
    above = folder.absolute().parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not folder_writable(above):
        raise RunFolderError(f"cannot make {folder}: {above} is not writable (read-only): give a --project you can "
                             f"write to")


# ---------------------------------------------------------------------------------------------------------
# The run folder
# ---------------------------------------------------------------------------------------------------------

class RunFolder:
    """A run folder held by this process. Open with RunFolder.open(); close() (or `with`) releases it."""

    def __init__(self, path, log=print):
        self.dir = Path(path)
        self.weights = self.dir / "weights"
        self.last = self.weights / "last.pt"
        self.best = self.weights / "best.pt"
        self.results = self.dir / RESULTS_NAME
        self.lock_path = self.dir / LOCK_NAME
        self.log = log
        self.resume_action = None  # None for a fresh run; "train" / "finish" / "done" for a resume
        self._token = os.urandom(8).hex()
        self._pid = os.getpid()
        self._held = False
        self._resume = None  # the checkpoint dict of a resume (begin() prepares results.csv from it)
        self._pending = None  # [(name, text)]: write_yaml before begin(), written by begin(); None once begun

    # --- opening and closing ---

    @classmethod
    def open(cls, path, *, resume: dict | None = None, log=print, begin=True) -> "RunFolder":
        """Take the folder (RunFolderError if it cannot be written, RunFolderBusy if a live run holds it); a
        resume from checkpoint dict `resume` (read_checkpoint of its last.pt) sets resume_action. begin=True also
        calls begin(); with begin=False nothing in the folder changes until the caller does (set-up, once the
        whole run is built: a start that fails leaves the folder as it was)."""
        check_writable(path)
        folder = cls(path, log)
        folder.dir.mkdir(parents=True, exist_ok=True)
        folder._acquire()
        try:
            folder._resume = resume
            folder._pending = []
            if resume is not None:
                folder.resume_action = resume_action(folder.dir, resume)
            if begin:
                folder.begin()
        except BaseException:
            folder.close()
            raise
        return folder

    def begin(self) -> None:
        """Make the folder this run's: remove temp files of interrupted saves, prepare results.csv (a fresh run
        moves an old one and an earlier run's weights/ aside; a resume that trains keeps only the rows of epochs
        <= resume['epoch'], restoring that epoch's row from the checkpoint if it is missing), run_state.yaml, then
        the yaml files written since open(). Once."""
        if self._pending is None:
            return
        self.weights.mkdir(exist_ok=True)
        self._remove_temps()
        if self._resume is None:
            self._start_fresh()
        else:
            self._start_resume(self._resume)
        pending, self._pending = self._pending, None
        for name, text in pending:
            atomic_write(self.dir / name, text, what=name)

    def close(self) -> None:
        """Release the lock (only if it is still ours, and only in the process that took it). Idempotent."""
        if not self._held or os.getpid() != self._pid:
            return
        self._held = False
        _HELD.discard(str(self.lock_path.resolve()))
        atexit.unregister(self.close)
        try:
            if json.loads(self.lock_path.read_text()).get("token") == self._token:
                self.lock_path.unlink()
        except (OSError, ValueError):
            pass

    def __enter__(self) -> "RunFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def held(self) -> bool:
        return self._held

    # --- writing ---

    def write_yaml(self, name: str, data) -> Path:
        """Write `data` (plain data after to_plain, as it is now) as YAML to the folder's file `name`, atomically;
        before begin(), begin() writes it."""
        text = yaml.safe_dump(to_plain(data, name), sort_keys=False)
        if self._pending is not None:
            self._pending.append((name, text))
            return self.dir / name
        return atomic_write(self.dir / name, text, what=name)

    def save_epoch(self, epoch: int, row, ckpt: dict | None = None, also=()) -> None:
        """The end-of-epoch writes, in the order that survives a kill at any point: `ckpt` to weights/last.pt
        (with the row stored in it as ckpt['results_row']), then each name of `also` ("best.pt", "epoch5.pt")
        as an atomic copy of that last.pt (a hard link where possible: no bytes written), then the results.csv
        row. ckpt None (--nosave) writes the row only. A full disk raises DiskFullError with the old file of
        that name intact and, when it hits a checkpoint, no row appended."""
        if ckpt is not None:
            ckpt["results_row"] = [float(v) for v in row]
            atomic_torch_save(ckpt, self.last, what=f"checkpoint of epoch {epoch}")
            for name in also:
                atomic_copy(self.last, self.weights / name, what=f"{name} of epoch {epoch}")
        R.append_row(self.results, row)
        try:
            os.utime(self.lock_path)  # "last saved" for a lock seen from another host
        except OSError:
            pass

    def begin_finish(self) -> None:
        """Training is over (last epoch or early stop): from here a --resume only finishes (strip, validate)."""
        self._write_state("finishing")

    def strip_weights(self, log=None) -> list:
        """Strip weights/last.pt and best.pt in place (EMA → model, fp16, no optimizer; atomic, and doing it
        twice is harmless, so an interrupted finish simply strips again). Returns the stripped paths. best.pt
        saved as a hard link of last.pt (the last epoch was the best) is stripped once: linked again to the
        stripped last.pt."""
        log = log or self.log
        linked = self.last.exists() and self.best.exists() and os.path.samefile(self.last, self.best)
        done = []
        for f in (self.last, self.best):
            if f.exists():
                if f == self.best and linked:
                    atomic_copy(self.last, f, what="stripped best.pt")
                else:
                    strip_checkpoint(f)
                log(f"Optimizer stripped from {f}, {f.stat().st_size / 1e6:.1f}MB")
                done.append(f)
        return done

    def mark_done(self) -> None:
        """The final validation and plots are written: a later --resume has nothing to do."""
        self._write_state("done")

    # --- internals ---

    def _write_state(self, phase: str) -> None:
        atomic_write(self.dir / STATE_NAME, yaml.safe_dump({"phase": phase, "updated": _now(), "pid": os.getpid(),
                                                            "host": socket.gethostname()}, sort_keys=False),
                     what=STATE_NAME)

    def _start_fresh(self) -> None:
        moved = R.move_aside(self.results)
        old_weights = self._move_weights_aside()
        if moved is not None or old_weights is not None:
            what = " and ".join(x for x in (moved and f"{RESULTS_NAME} to {moved.name}",
                                            old_weights and f"weights/ to {old_weights.name}/") if x)
            self.log(f"{self.dir}: an earlier run's {what} moved aside; this run writes a new {RESULTS_NAME} "
                     f"and weights/")
        self._write_state("training")

    def _move_weights_aside(self):
        """An earlier run's weights/ (holding a *.pt) renamed to weights.1/ (the first free weights.N/; never
        overwritten) and an empty weights/ made: one folder never mixes two runs' models (its epochN.pt
        beside this run's last.pt). Returns the new path, or None when weights/ holds no *.pt."""
        if not any(self.weights.glob("*.pt")):
            return None
        n = 1
        while (dest := self.dir / f"weights.{n}").exists():
            n += 1
        self.weights.rename(dest)
        self.weights.mkdir()
        return dest

    def _start_resume(self, ckpt: dict) -> None:
        if self.resume_action != "train":
            R.drop_epochs_from(self.results, float("inf"))  # keeps every complete row, drops a torn one
            return
        done = int(ckpt["epoch"])
        dropped = R.drop_epochs_from(self.results, done + 1)
        if dropped:
            self.log(f"{self.results}: dropped {dropped} row(s) after epoch {done} (redone by this resume)")
        row = ckpt.get("results_row")
        if row is not None and int(row[0]) == done and done not in R.epochs_in(self.results):
            if len(row) == len(R.COLUMNS):
                R.append_row(self.results, row)
                self.log(f"{self.results}: restored the row of epoch {done} from {self.last.name}")
            else:
                self.log(f"WARNING: {self.results} lacks epoch {done}; the row stored in the checkpoint has "
                         f"{len(row)} columns, not {len(R.COLUMNS)}: not restored")
        self._write_state("training")

    def _remove_temps(self) -> None:
        n, size = 0, 0
        for d in (self.dir, self.weights):
            for p in d.iterdir():
                if is_temp_name(p.name) and p.is_file():
                    try:
                        size += p.stat().st_size
                        p.unlink()
                        n += 1
                    except FileNotFoundError:
                        pass
        if n:
            self.log(f"{self.dir}: removed {n} temp file(s) of interrupted saves ({size / 1e6:.1f} MB)")

    # --- the lock ---

    def _lock_text(self) -> str:
        st = _proc_stat(os.getpid())
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now(), "start": st[1] if st else None,
                "token": self._token, "command": " ".join(sys.argv)[:200]}
        return json.dumps(info) + "\n"

    def _acquire(self) -> None:
        text = self._lock_text()
        for _ in range(1000):
            if self._create_lock(text):
                break
            try:
                seen = self.lock_path.read_text()
                age = time.time() - self.lock_path.stat().st_mtime
            except FileNotFoundError:
                continue  # released in between: try to create it again
            try:
                info = json.loads(seen)
            except ValueError:
                info = None
            verdict = self._verdict(info, age)
            if verdict == "starting":
                time.sleep(0.05)
                continue
            if verdict != "stale":
                raise RunFolderBusy(verdict)
            if self._take_over(seen, text):
                who = f"pid {info.get('pid')} on {info.get('host')}, since {info.get('since')}" \
                    if isinstance(info, dict) else "unreadable"
                self.log(f"{self.dir}: taking over the lock of a run that no longer runs ({who})")
                break
            time.sleep(0.02)
        else:
            raise RunFolderBusy(f"{self.dir}: could not take {self.lock_path} (other processes keep changing it)")
        self._held = True
        _HELD.add(str(self.lock_path.resolve()))
        atexit.register(self.close)

    def _create_lock(self, text: str) -> bool:
        try:
            fd = os.open(self.lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            self.lock_path.unlink(missing_ok=True)
            if e.errno == errno.ENOSPC:
                raise DiskFullError(self.lock_path, "run lock", len(text), None) from e
            raise
        return True

    def _verdict(self, info, age: float) -> str:
        """"stale", "starting", or the RunFolderBusy message for a lock that must be respected."""
        if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
            return "starting" if age < STARTING_S else "stale"
        pid, host, since = info["pid"], info.get("host"), info.get("since")
        if host != socket.gethostname():
            saved = datetime.datetime.fromtimestamp(time.time() - age).astimezone().isoformat(timespec="seconds")
            return (f"{self.dir} is in use by a training run on another host (pid {pid} on {host}, since {since}, "
                    f"last saved {saved}); this host cannot tell whether it still runs: if it does not, delete "
                    f"{self.lock_path} and run again")
        if pid == os.getpid():
            if str(self.lock_path.resolve()) in _HELD:
                return f"{self.dir} is already open in this process (pid {pid}); close that run first"
            return "stale"
        if pid_alive(pid, info.get("start")):
            cmd = f" ({info['command']})" if info.get("command") else ""
            return (f"{self.dir} is in use by another training run (pid {pid} on {host}, since {since}){cmd}: wait "
                    f"for it to end or stop it, or train into another folder (another --name, or without "
                    f"--exist-ok)")
        return "stale"

    def _take_over(self, seen: str, text: str) -> bool:
        """Replace the stale lock whose content is `seen` by ours, unless someone else got there first."""
        mutex = self.lock_path.with_name(LOCK_NAME + ".takeover")
        try:
            fd = os.open(mutex, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            self._remove_stale_mutex(mutex)
            return False
        try:
            with os.fdopen(fd, "w") as f:  # who takes over: a taker killed midway is recognised by its pid
                f.write(self._lock_text())
        except OSError:
            mutex.unlink(missing_ok=True)
            return False
        try:
            try:
                current = self.lock_path.read_text()
            except FileNotFoundError:
                return False
            if current != seen:
                return False
            atomic_write(self.lock_path, text, what="run lock")
            return True
        finally:
            mutex.unlink(missing_ok=True)

    def _remove_stale_mutex(self, mutex: Path) -> None:
        """Remove the takeover mutex `mutex` when its taker no longer runs: a pid of this host that is dead (or
        reused), no readable content after STARTING_S (an older version's empty file), or any mutex older than
        TAKEOVER_STALE_S. A live taker's (or another host's young one) stays: the caller tries again."""
        try:
            seen = mutex.read_text()
            age = time.time() - mutex.stat().st_mtime
        except FileNotFoundError:
            return
        try:
            info = json.loads(seen)
        except ValueError:
            info = None
        if isinstance(info, dict) and isinstance(info.get("pid"), int) and info.get("host") == socket.gethostname():
            stale = not pid_alive(info["pid"], info.get("start"))
        else:
            stale = age > (STARTING_S if info is None else TAKEOVER_STALE_S)
        if not (stale or age > TAKEOVER_STALE_S):
            return
        try:
            if mutex.read_text() != seen:  # another starter's new mutex: not the one judged
                return
            mutex.unlink()
        except FileNotFoundError:
            return
        who = f"pid {info.get('pid')} on {info.get('host')}" if isinstance(info, dict) else "unreadable"
        self.log(f"{self.dir}: removed {mutex.name} of a lock takeover killed midway ({who})")
