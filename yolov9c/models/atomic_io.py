"""Atomic file writes: a reader or a crash sees the old file or the whole new one, never a torso.

atomic_write (bytes/str), atomic_copy (hard link or copy), atomic_torch_save (torch.save): a temp file
".<name>.<random>.tmp" next to the target (is_temp_name recognises it, so a run folder can remove those of a killed
writer), flush + fsync, os.replace, fsync of the directory. A full disk raises DiskFullError (an OSError whose str
is one `error:` line: the file, its estimated size, the free space); the old file stays and no temp file is left.

Test: python -m pytest -q tests/models/test_checkpoint.py -k "atomic or disk or temp"
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from yolov9c.units import MIB

def _default_file_mode() -> int:
    """Permission bits a plain open(path, 'w') would give (0o666 minus the umask); mkstemp would use 0o600."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    return 0o644


# Temp files of an atomic write: ".<name>.<random>.tmp" next to the target, so that a run folder can find and
# remove those of a killed writer (yolov9c/engine/train/run_folder.py).
TEMP_PREFIX, TEMP_SUFFIX = ".", ".tmp"
# errno values meaning "the disk (or the quota) is full"
_NO_SPACE = {errno.ENOSPC} | ({errno.EDQUOT} if hasattr(errno, "EDQUOT") else set())


def is_temp_name(name: str) -> bool:
    """True for the name of an atomic write's temp file (".last.pt.k2j4x9_a.tmp")."""
    return name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX) and len(name) > 5


class DiskFullError(OSError):
    """A write ran out of disk space (ENOSPC / EDQUOT). The file being replaced is intact and no temp file is
    left. str(e) is one line for `error:`: what was written, about how much it needs and how much is free.
    Attributes: path, what, needed (bytes, an estimate), free (bytes)."""

    def __init__(self, path: Path, what: str, needed: int, free: int | None, err: int = errno.ENOSPC):
        self.path, self.what, self.needed, self.free = Path(path), what, needed, free
        mb = lambda n: f"{n / 1e6:.1f} MB"  # noqa: E731
        if free is None:
            room = f"it needs about {mb(needed)}, free space in {self.path.parent} unknown"
        elif free < needed:
            room = f"it needs about {mb(needed)}, {mb(free)} free in {self.path.parent}"
        else:  # the estimate fits the free space the failed write left: the file system's overhead did not
            room = (f"about {mb(needed)} did not fit in the {mb(free)} free in {self.path.parent} (file-system "
                    f"blocks, a quota or space reserved for root take the rest)")
        kept = f"the previous {self.path.name} is intact" if self.path.exists() else "nothing was written"
        # --resume needs a saved checkpoint: a run whose first save failed starts again with the same command
        saved = [p for p in (self.path.parent / "last.pt", self.path.parent / "weights" / "last.pt") if p.is_file()]
        again = (f"run again with --resume {saved[0]} (it continues from the last saved epoch)" if saved else
                 "run the same command again (no checkpoint was saved yet: nothing to resume)")
        msg = (f"No space left on device writing {self.path} ({what}): {room}; {kept}. Free some space (or use "
               f"another --project), then {again}")
        super().__init__(err, msg)

    def __str__(self) -> str:
        return self.strerror


class _CountingWriter:
    """The temp file as torch.save sees it: counts the bytes written and keeps the first OSError, which torch
    otherwise turns into "RuntimeError: [enforce fail at inline_container.cc:...] unexpected pos"."""

    def __init__(self, f):
        self.f, self.written, self.error = f, 0, None

    def write(self, b):
        try:
            n = self.f.write(b)
        except OSError as e:
            self.error = self.error or e
            raise
        self.written += len(b)
        return n

    def flush(self):
        self.f.flush()


def _space_error(exc: BaseException, writer: _CountingWriter) -> OSError | None:
    """The OSError behind a failed write when it means "no space left", else None. torch wraps the error of a
    file-like object's write in a RuntimeError (inline_container.cc); its context or our writer still has it."""
    for e in (exc, writer.error, exc.__context__, exc.__cause__):
        if isinstance(e, OSError) and e.errno in _NO_SPACE:
            return e
    if isinstance(exc, RuntimeError) and "No space left on device" in str(exc):
        return OSError(errno.ENOSPC, str(exc))
    return None


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _fsync_dir(folder: Path) -> None:
    """The rename itself must reach the disk too, or a power cut can bring back the old directory entry."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _atomic(path: Path, write: Callable[[Any], None], what: str, size_hint: int) -> Path:
    """write(f) fills a temp file next to `path`; flush + fsync; os.replace over `path`; fsync the directory.
    On any failure (KeyboardInterrupt included) the temp file is removed and the error re-raised, as
    DiskFullError when the disk is full."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else _default_file_mode()
    fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    writer = None
    try:
        with os.fdopen(fd, "wb") as f:
            writer = _CountingWriter(f)
            write(writer)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        full = _space_error(e, writer or _CountingWriter(None)) if isinstance(e, Exception) else None
        if full is not None:
            needed = max(size_hint, writer.written if writer else 0)
            raise DiskFullError(path, what, needed, _free_bytes(path.parent), full.errno) from e
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write(path: str | os.PathLike, data: bytes | str, what: str = "file") -> Path:
    """Write `data` (str: UTF-8) to `path` atomically: `path` is the old file or the whole new one, never a
    torso (temp + fsync + rename). A full disk raises DiskFullError naming `what`, the old file intact."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    return _atomic(Path(path), lambda f: f.write(raw), what, len(raw))


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike, what: str = "file") -> Path:
    """Make `dst` an atomic copy of `src`: a hard link under a temp name renamed over `dst` (no bytes written,
    no space needed; `src` replaced later by a rename leaves `dst` unchanged), or, where the file system has no
    hard links, a full copy written as atomic_write does. A full disk raises DiskFullError."""
    src, dst = Path(src), Path(dst)
    tmp = dst.with_name(f"{TEMP_PREFIX}{dst.name}.{os.urandom(4).hex()}{TEMP_SUFFIX}")
    try:
        os.link(src, tmp)
    except OSError:
        pass
    else:
        try:
            os.replace(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(dst.parent)
        return dst

    def copy(f):
        with open(src, "rb") as s:
            shutil.copyfileobj(s, f, MIB)

    return _atomic(dst, copy, what, src.stat().st_size)


def _tensor_bytes(obj: Any) -> int:
    """Bytes of all tensors in a nest of dicts/lists/tuples: the size of a torch.save file, give or take the
    pickled metadata."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def atomic_torch_save(obj: Any, path: str | os.PathLike, what: str = "checkpoint") -> Path:
    """torch.save(obj) to `path` so that `path` is either the old file or the complete new one, never a torso:
    write a temp file in the same directory (".<name>.<random>.tmp"), flush + fsync it, os.replace it over
    `path`, fsync the directory. On any failure (including KeyboardInterrupt) the temp file is removed and the
    exception re-raised; a full disk (ENOSPC/EDQUOT, also when torch wraps it in its inline_container.cc
    RuntimeError) raises DiskFullError with the file's estimated size and the free space."""
    return _atomic(Path(path), lambda f: torch.save(obj, f), what, _tensor_bytes(obj) + 65536)
