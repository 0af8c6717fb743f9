"""Run folders: runs/train/exp, exp2, exp3 … (published increment_path), and finding the checkpoint to resume.

Test: python -m pytest -q tests/engine/train/test_train_parts.py -k run_dir; tests/engine/train/test_run_folder.py
"""

from pathlib import Path


class RunDirError(ValueError):
    """A run folder that cannot be made (a file in its path, a read-only --project); str(e) is one line."""


def _cannot_make(path, e):
    return RunDirError(f"cannot make the run folder {path}: {e.strerror} ({e.filename}); give a --project "
                       f"you can write to")


def increment_path(path, exist_ok=False, mkdir=False):
    """`path` if it does not exist (or exist_ok), else path2, path3, … (first free). Creates it if mkdir.

    With mkdir and not exist_ok the folder is claimed atomically (os.mkdir fails on an existing name, and the
    next free name is tried), so two runs started together get exp and exp2, never the same folder."""
    path = Path(path)

    def candidates(first=1):  # path, path2, ..., path9999, made one at a time (most runs take the first)
        for n in range(first, 10000):
            yield path if n == 1 else path.with_name(f"{path.name}{n}")

    if mkdir and not exist_ok:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _cannot_make(path, e) from None
        for cand in candidates():
            try:
                cand.mkdir()
                return cand
            except FileExistsError:
                continue
            except OSError as e:
                raise _cannot_make(cand, e) from None
        raise FileExistsError(f"{path}: no free run folder name up to {path.name}9999")
    if path.exists() and not exist_ok:
        path = next((c for c in candidates(2) if not c.exists()), path)
    if mkdir:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _cannot_make(path, e) from None
    return path


def latest_last_pt(search_dir="."):
    """The most recently modified last*.pt under search_dir (recursive), or None."""
    found = [p for p in Path(search_dir).rglob("last*.pt") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None
