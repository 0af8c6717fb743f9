"""Temporary files that a killed run left in a dataset folder, removed by the next run.

The label cache (`labels/train.cache.<pid>.tmp`), `--cache disk` (`img.npy.<pid>.tmp.npy`) and the built-in
data set (a folder `.synthetic-….tmp<pid>` in its cache root) are written
to a temporary name carrying the writer's process id and renamed into place, so a reader never sees half a
file. A run killed between the two leaves the temporary behind; the next run that writes into that folder
removes every such file whose process is no longer alive on this machine (one alive, e.g. a concurrent run,
keeps its file). On a folder shared between machines a process id of another machine can look dead here: the
writer there then loses only that one cache write (a warning; the next run writes it).
Test: python -m pytest -q tests/data/test_data_cache.py -k stale
"""

import os
import re
import shutil
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether a process with id `pid` exists on this machine (ours or another user's)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists, owned by someone else (or cannot tell: keep the file)
    return True


def remove_stale_temps(folder, pattern: str, dirs: bool = False) -> list:
    """Remove the files (with dirs=True: the folders, with their contents) in `folder` whose names match the
    regex `pattern` (fully) and whose group 'pid' names a process that is not alive. Returns the removed
    paths; errors (a read-only folder, a file gone meanwhile) are ignored."""
    rx = re.compile(pattern)
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = rx.fullmatch(entry.name)
        kind_ok = entry.is_dir(follow_symlinks=False) if dirs else entry.is_file(follow_symlinks=False)
        if m is None or not kind_ok or pid_alive(int(m.group("pid"))):
            continue
        try:
            shutil.rmtree(entry.path) if dirs else os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            pass
    return removed
