"""YOLO label files: image → label path pairing, label files without an image, parsing and checking one `.txt`.

Format (published): one object per line, `class xc yc w h` normalised to [0, 1], or a polygon
`class x1 y1 … xk yk` (k >= 3; its bounds give the box; kept for copy-paste). A missing or empty file is a
background image; label files no image uses are reported as orphans. Unlike the published code, box and
polygon rows may be mixed in one file (a box row gets its rectangle as polygon, keeping rows aligned).
Only a regular file is read (data/regular_file.py): a FIFO, a device or a dangling link is a bad label file.
Encoding: UTF-8 with or without BOM, or UTF-16 with BOM; CRLF and CR read like LF.
Checks (a failing file is skipped with `path: reason`, line number and quoted line): column count, non-numeric
values, coordinates outside [0, 1] (within 1e-6 accepted and clipped: float printing), class not an integer in
[0, nc). Exact duplicate rows are removed with a warning. Zero-size boxes are kept with a note, as published
(augmentation drops them; validation keeps them as unmatchable ground truth).
Test: python -m pytest -q tests/data/test_data_labels.py
"""

import os
from pathlib import Path

import numpy as np

from yolov9c.data.images import is_image_path
from yolov9c.data.regular_file import NotRegularFile, read_regular

_EPS = 1e-6


class BadLabels(Exception):
    """Raised by parse_label_file with the reason as its message."""


def label_path_for(img_path):
    """The label file of an image, as published: the last `/images/` in the path becomes `/labels/`
    and the extension becomes `.txt` (an image outside any `images` folder has its `.txt` beside it)."""
    s = str(img_path)
    a = f"{os.sep}images{os.sep}"
    b = f"{os.sep}labels{os.sep}"
    if a in s:
        head, tail = s.rsplit(a, 1)
        s = head + b + tail
    return str(Path(s).with_suffix(".txt"))


def _names_in(folder):
    try:
        return os.listdir(folder)
    except OSError:
        return []


def orphan_label_files(im_files, exclude=()):
    """Label files without an image ("orphans"): the `.txt` files in the label folders of `im_files` whose
    stem matches no image file (any accepted extension) on disk in the image folders paired with that label
    folder — so a list that uses only some images of a folder makes no orphans. `exclude`: paths never
    counted (the split's own `.txt` lists). Returns a sorted list of str paths."""
    image_dirs = {}  # label folder -> the image folders whose labels live there
    for im in im_files:
        image_dirs.setdefault(os.path.dirname(label_path_for(im)), set()).add(os.path.dirname(str(im)))
    skip = {os.path.abspath(p) for p in exclude}
    orphans = []
    for lb_dir, dirs in image_dirs.items():
        stems = {os.path.splitext(n)[0] for d in dirs for n in _names_in(d) if is_image_path(n)}
        for n in _names_in(lb_dir):
            stem, ext = os.path.splitext(n)
            p = os.path.join(lb_dir, n)
            if ext == ".txt" and stem not in stems and os.path.abspath(p) not in skip and os.path.isfile(p):
                orphans.append(p)
    return sorted(orphans)


def read_label_text(path):
    """The text of label file `path`: UTF-8 without or with a BOM ('utf-8-sig' drops it), or UTF-16 when the
    file starts with a UTF-16 BOM. Raises FileNotFoundError; BadLabels for a path that is no regular file (a
    FIFO, /dev/zero, a dangling link: never read) and for an unreadable or undecodable file."""
    try:
        data = read_regular(path)
    except FileNotFoundError:
        raise
    except NotRegularFile as e:
        raise BadLabels(str(e)) from None
    except OSError as e:
        raise BadLabels(f"cannot read label file ({e.strerror or e})") from None
    try:
        if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
            return data.decode("utf-16")
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadLabels(f"not a UTF-8 text file (byte {e.start}: {data[e.start:e.start + 4]!r})") from None


def _quoted(line, limit=80):
    """The offending line for a message: stripped, repr-quoted (so a stray BOM, tab or NUL shows as an
    escape), cut to `limit` characters."""
    s = line.strip()
    return repr(s if len(s) <= limit else s[:limit] + "…")


def parse_label_file(path, nc=None):
    """Read and check label file `path`.

    Returns (labels, segments, notes):
      labels   float32 (n, 5) [cls, xc, yc, w, h], normalised, cls integer-valued;
      segments list of n float32 (k, 2) normalised polygons when any row is a polygon, else [];
      notes    list of str warnings (duplicates removed).
    A missing or empty file gives (zeros (0, 5), [], []). Raises BadLabels(reason) for a file to skip."""
    try:
        text = read_label_text(path)
    except FileNotFoundError:
        return np.zeros((0, 5), np.float32), [], []
    rows = []
    lines = text.splitlines()
    for lineno, line in enumerate(lines, 1):
        parts = line.split()
        if not parts:
            continue
        ncol = len(parts)
        if ncol != 5 and (ncol < 7 or ncol % 2 == 0):
            raise BadLabels(f"line {lineno}: {ncol} columns in {_quoted(line)}; expected 5 (class xc yc w h) "
                            f"or an odd count >= 7 (class and >= 3 polygon points)")
        vals = []
        for p in parts:
            try:
                vals.append(float(p))
            except ValueError:
                raise BadLabels(f"line {lineno}: non-numeric value {p!r} in {_quoted(line)}") from None
        if not all(np.isfinite(vals)):
            raise BadLabels(f"line {lineno}: non-finite value in {_quoted(line)}")
        c = vals[0]
        if c < 0 or c != int(c):
            raise BadLabels(f"line {lineno}: class {parts[0]} is not a non-negative integer in {_quoted(line)}")
        if nc is not None and c >= nc:
            raise BadLabels(f"line {lineno}: class {int(c)} >= nc ({nc}) in {_quoted(line)}")
        coords = vals[1:]
        if min(coords) < -_EPS or max(coords) > 1 + _EPS:
            raise BadLabels(f"line {lineno}: coordinate outside [0, 1] in {_quoted(line)}")
        rows.append((lineno, vals))
    if not rows:
        return np.zeros((0, 5), np.float32), [], []

    # exact duplicates (same class and same numbers) are dropped, keeping the first
    seen = set()
    unique = []
    for lineno, vals in rows:
        key = tuple(vals)
        if key not in seen:
            seen.add(key)
            unique.append((lineno, vals))
    notes = []
    if len(unique) < len(rows):
        notes.append(f"{len(rows) - len(unique)} duplicate label rows removed")

    any_poly = any(len(v) > 5 for _, v in unique)
    zero_size = 0  # kept, as published: the augmentations' box filters drop them (docs/fidelity.md)
    labels = np.zeros((len(unique), 5), np.float32)
    segments = []
    for j, (lineno, vals) in enumerate(unique):
        c = vals[0]
        if len(vals) == 5:
            xc, yc, w, h = np.clip(vals[1:], 0.0, 1.0)
            zero_size += w <= 0 or h <= 0
            if any_poly:
                x1, y1, x2, y2 = xc - w / 2, yc - h / 2, xc + w / 2, yc + h / 2
                segments.append(np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]], np.float32))
        else:
            pts = np.clip(np.array(vals[1:], np.float32).reshape(-1, 2), 0.0, 1.0)
            x1, y1 = pts.min(0)
            x2, y2 = pts.max(0)
            w, h = x2 - x1, y2 - y1
            zero_size += w <= 0 or h <= 0
            xc, yc = x1 + w / 2, y1 + h / 2
            segments.append(pts)
        labels[j] = (c, xc, yc, w, h)
    if zero_size:
        # val has no augmentation: each one stays a ground truth no prediction can overlap (published: the same)
        notes.append(f"{zero_size} zero-size boxes kept, as published (training's augmentations drop them; "
                     f"validation counts each as an object no detection can match)")
    return labels, segments, notes
