"""Scanning a split: check every image/label pair once, report bad files, use and refresh the label cache.

A pair is skipped (counted corrupt, reported `path: reason`) when the image is unsupported, unreadable,
empty, corrupt or under 10 px, or when its label file fails a check (yolov9c/data/labels.py). Warnings
(duplicate rows removed, truncated JPEG decoded, EXIF orientation applied) keep the image and its labels.
Summary: `N images, M backgrounds, K corrupt` — N usable images, of which M have no labels; K skipped.

Test: python -m pytest -q tests/test_data_labels.py tests/test_data_cache.py
"""

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from yolov9c.data.images import BadImage, check_image
from yolov9c.data.label_cache import cache_key, cache_path_for, load_label_cache, save_label_cache
from yolov9c.data.labels import BadLabels, label_path_for, parse_label_file


@dataclass
class ScanResult:
    """The usable pairs of a split and what the scan found.

    im_files, label_files: lists of str (usable pairs only); shapes: int64 (n, 2) upright (h, w);
    labels: list of float32 (k, 5) [cls, xc, yc, w, h] normalised; segments: list of lists of float32
    (p, 2) normalised polygons (empty list when the file has none); messages: 'path: reason' lines
    (skipped files and warnings); counts as in the summary."""
    im_files: list
    label_files: list
    shapes: np.ndarray
    labels: list
    segments: list
    messages: list = field(default_factory=list)
    n_images: int = 0
    n_backgrounds: int = 0
    n_corrupt: int = 0
    n_warnings: int = 0
    from_cache: bool = False

    def summary(self):
        return f"{self.n_images} images, {self.n_backgrounds} backgrounds, {self.n_corrupt} corrupt"


def _check_pair(im_file, lb_file, nc):
    """→ (ok, shape, labels, segments, messages)."""
    msgs = []
    try:
        shape, notes = check_image(im_file)
    except BadImage as e:
        return False, None, None, None, [f"{im_file}: {e} (skipped)"]
    msgs += [f"{im_file}: {n}" for n in notes if not n.startswith("EXIF")]
    try:
        labels, segments, notes = parse_label_file(lb_file, nc)
    except BadLabels as e:
        return False, None, None, None, [f"{lb_file}: {e} (image {im_file} skipped)"]
    msgs += [f"{lb_file}: {n}" for n in notes]
    return True, shape, labels, segments, msgs


def scan_split(im_files, nc, sources=None, use_cache=True, log=print, prefix=""):
    """Scan the pairs of image files `im_files` (labels by label_path_for). Reads the label cache when
    valid, else checks every pair (threads: OpenCV decodes outside the GIL) and writes the cache.
    Prints every message line and the summary through `log`. Returns a ScanResult."""
    label_files = [label_path_for(f) for f in im_files]
    cpath = cache_path_for(sources, label_files) if (use_cache and sources is not None) else None
    key = cache_key(im_files, label_files, nc) if cpath is not None else None
    cached = load_label_cache(cpath, key) if cpath is not None else None
    res = ScanResult(**cached) if cached is not None else None
    if res is None:
        res = ScanResult([], [], np.zeros((0, 2), np.int64), [], [])
        shapes = []
        threads = min(8, os.cpu_count() or 1)
        with ThreadPoolExecutor(threads) as pool:
            results = pool.map(_check_pair, im_files, label_files, [nc] * len(im_files))
            for im, lb, (ok, shape, labels, segs, msgs) in zip(im_files, label_files, results):
                res.messages += msgs
                res.n_warnings += len(msgs) if ok else 0
                if not ok:
                    res.n_corrupt += 1
                    continue
                res.im_files.append(im)
                res.label_files.append(lb)
                shapes.append(shape)
                res.labels.append(labels)
                res.segments.append(segs)
                res.n_images += 1
                res.n_backgrounds += len(labels) == 0
        res.shapes = np.array(shapes, np.int64).reshape(-1, 2)
        if cpath is not None:
            warn = save_label_cache(cpath, res, key)
            if warn:
                res.messages.append(f"{cpath}: {warn}")
    for m in res.messages:
        log(f"{prefix}{m}")
    log(f"{prefix}{res.summary()}" + (f" (label cache {cpath})" if res.from_cache else ""))
    return res
