"""Run folders: runs/train/exp, exp2, exp3 … (published increment_path), and finding the checkpoint to resume.

Test: python -m pytest -q tests/test_train_parts.py -k run_dir
"""

from pathlib import Path


def increment_path(path, exist_ok=False, mkdir=False):
    """`path` if it does not exist (or exist_ok), else path2, path3, … (first free). Creates it if mkdir."""
    path = Path(path)
    if path.exists() and not exist_ok:
        for n in range(2, 10000):
            cand = path.with_name(f"{path.name}{n}")
            if not cand.exists():
                path = cand
                break
    if mkdir:
        path.mkdir(parents=True, exist_ok=True)
    return path


def latest_last_pt(search_dir="."):
    """The most recently modified last*.pt under search_dir (recursive), or None."""
    found = [p for p in Path(search_dir).rglob("last*.pt") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None
