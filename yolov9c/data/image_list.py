"""The image files of a split: folders, `.txt` lists of image paths, or lists of both (published rules).

- a folder: every file under it (recursively) whose extension is an image format; other files
  (label caches, `.npy` disk caches, notes) are ignored;
- a `.txt` file: one image path per line; `./x` and other relative lines are taken relative to the list's
  folder (the published code does so for `./` lines; a relative line that exists only relative to the
  current folder is still accepted). Every listed line counts: a listed file that is not an image is
  reported by the scan as an unsupported format rather than dropped silently;
- a single image file.

Test: python -m pytest -q tests/test_data_yaml.py
"""

import os
from pathlib import Path

from yolov9c.data.images import is_image_path


def collect_image_files(sources):
    """Sorted unique list of str paths from `sources` (a path or a list of paths). Raises FileNotFoundError
    naming the source for one that does not exist."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    files = []
    for src in sources:
        p = Path(src).expanduser()
        if p.is_dir():
            files += [str(f) for f in p.rglob("*") if f.is_file() and is_image_path(f)]
        elif p.is_file() and p.suffix.lower() == ".txt":
            parent = p.parent
            for line in p.read_text().splitlines():
                line = line.strip()
                if not line:
                    continue
                q = Path(line)
                if not q.is_absolute():
                    r = parent / (line[2:] if line.startswith("./") else line)
                    q = r if (r.exists() or line.startswith("./") or not q.exists()) else q
                files.append(str(q))
        elif p.is_file():
            files.append(str(p))
        else:
            raise FileNotFoundError(f"{src} does not exist")
    return sorted(set(files))
