"""The label cache: one `*.cache` file per split holding a scan's result, so a second run skips decoding every image.

Where: next to the `.txt` (or other) list when the split is one list file, else `<labels folder>.cache`, as published.
Format: a NumPy `.npz` (no pickle; read with allow_pickle=False, so a foreign cache cannot run code): arrays
`im_files`, `label_files`, `shapes` (n, 2) int64 (h, w upright), `n_labels` (n,), `labels` (L, 5) float32,
`seg_points` (L,) int64 points per polygon (0: none), `segments` (P, 2) float32, `messages`, `counts` [images,
backgrounds, corrupt, warnings], `version`, `key`.
Invalidated when CACHE_VERSION changes or `key` differs (a hash of nc and of path, size and mtime of every image
and label file: any edit, addition or removal rescans). A cache in another format (the published code's pickled
dict, any `.npy`) is ignored and replaced. An unwritable folder gives a warning (returned), never
an error. Written to `<cache>.<pid>.tmp` and renamed; a stale temp is removed by the next save.
Test: python -m pytest -q tests/data/test_data_cache.py
"""

import hashlib
import os
import re
import zipfile
from pathlib import Path

import numpy as np

from yolov9c.data.image_list import is_image_list
from yolov9c.data.stale_temps import remove_stale_temps

CACHE_VERSION = "yolov9c-labels-3"  # 2: zero-size boxes kept; 3: libjpeg warnings named


def cache_path_for(sources, label_files):
    """Path of the cache for a split given its sources (as in the yaml) and its label files."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if len(sources) == 1 and is_image_list(sources[0]):
        return Path(sources[0]).with_suffix(".cache")
    if not label_files:
        return None
    return Path(label_files[0]).parent.with_suffix(".cache")


def _stat(path):
    try:
        st = os.stat(path)
        return f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        return "-"


def folder_writable(folder):
    """True when files may be created in `folder`. A folder whose mode has no write bit at all counts as
    read-only even for root (who could write there anyway), so read-only datasets stay untouched."""
    try:
        st = os.stat(folder)
    except OSError:
        return False
    return bool(st.st_mode & 0o222) and os.access(folder, os.W_OK)


def cache_key(im_files, label_files, nc):
    """Hex sha256 over nc and (path, size, mtime) of every image and label file."""
    h = hashlib.sha256(f"{CACHE_VERSION}|nc={nc}".encode())
    for im, lb in zip(im_files, label_files):
        h.update(f"\n{im}|{_stat(im)}|{lb}|{_stat(lb)}".encode())
    return h.hexdigest()


def save_label_cache(path, scan, key):
    """Write `scan` (a ScanResult) to `path` atomically. Returns None, or a warning str when the folder
    is not writable."""
    path = Path(path)
    labels = scan.labels
    n_labels = np.array([len(lb) for lb in labels], np.int64)
    all_labels = np.concatenate(labels, 0) if labels else np.zeros((0, 5), np.float32)
    seg_points = []
    seg_arrays = []
    for lb, segs in zip(labels, scan.segments):
        if segs:
            seg_points += [len(s) for s in segs]
            seg_arrays += list(segs)
        else:
            seg_points += [0] * len(lb)
    segments = np.concatenate(seg_arrays, 0).astype(np.float32) if seg_arrays else np.zeros((0, 2), np.float32)
    arrays = dict(
        version=np.array(CACHE_VERSION), key=np.array(key),
        im_files=np.array(scan.im_files, dtype=str), label_files=np.array(scan.label_files, dtype=str),
        shapes=np.asarray(scan.shapes, np.int64).reshape(-1, 2), n_labels=n_labels,
        labels=all_labels.astype(np.float32).reshape(-1, 5), seg_points=np.array(seg_points, np.int64),
        segments=segments, messages=np.array(scan.messages, dtype=str),
        counts=np.array([scan.n_images, scan.n_backgrounds, scan.n_corrupt, scan.n_warnings], np.int64),
    )
    if not path.parent.is_dir():  # no label folder at all (images without labels): not a permissions problem
        return f"label cache not written, {path.parent} does not exist"
    if not folder_writable(path.parent):
        return f"label cache not written, {path.parent} is not writable"
    remove_stale_temps(path.parent, re.escape(path.name) + r"\.(?P<pid>\d+)\.tmp")  # left by a killed run
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        return f"label cache not written, {path.parent} is not writable ({e.strerror or e})"
    return None


def load_label_cache(path, key):
    """Read the cache at `path`; returns the fields of a ScanResult (yolov9c/data/scan.py) as a dict, or None
    when it is missing, unreadable, of another format (the published pickled dict, any `.npy` array), of
    another version or for other files (key mismatch)."""
    if path is None or not Path(path).is_file():
        return None
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):  # a bare .npy array (nothing left open): not ours
            return None
        with z:
            if str(z["version"]) != CACHE_VERSION or str(z["key"]) != key:
                return None
            n_labels = z["n_labels"]
            all_labels = z["labels"]
            seg_points = z["seg_points"]
            all_segs = z["segments"]
            labels, segments = [], []
            lo = 0
            plo = 0
            for n in n_labels:
                lb = all_labels[lo:lo + n]
                pts = seg_points[lo:lo + n]
                segs = []
                if n and pts.any():
                    for k in pts:
                        segs.append(all_segs[plo:plo + k])
                        plo += k
                labels.append(lb)
                segments.append(segs)
                lo += n
            counts = z["counts"].tolist()
            return dict(
                im_files=z["im_files"].tolist(), label_files=z["label_files"].tolist(),
                shapes=z["shapes"], labels=labels, segments=segments, messages=z["messages"].tolist(),
                n_images=counts[0], n_backgrounds=counts[1], n_corrupt=counts[2], n_warnings=counts[3],
                from_cache=True)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
