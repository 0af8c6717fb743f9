"""Scanning a split: check every image/label pair once, report bad files, use and refresh the label cache.

A pair is skipped (counted corrupt, reported `path: reason`) when the image is unsupported, unreadable,
empty, corrupt or under 10 px, or when its label file fails a check (yolov9c/data/labels.py). Warnings
(duplicate rows removed, truncated JPEG decoded, EXIF orientation applied, libjpeg's "Corrupt JPEG data" line
with the file's name: data/libjpeg_notes.py) keep the image and its labels.
Summary: `N images, M backgrounds, K corrupt[, J missing][, O orphan]` — N usable images, of which M have no
labels; K skipped; J of the M backgrounds have no label file at all ("missing", the others an empty one);
O label files in the split's label folders belong to no image ("orphan", not used). The last two appear
only when not 0 (a clean dataset prints the published line), each after a line with up to EXAMPLES paths.
They are found on every scan, cache or not (an orphan is no file of the cache key).

Test: python -m pytest -q tests/data/test_data_labels.py tests/data/test_data_cache.py
"""

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from yolov9c.data.images import BadImage, check_image
from yolov9c.data.label_cache import cache_key, cache_path_for, load_label_cache, save_label_cache
from yolov9c.data.libjpeg_notes import MARK, attribute, captured_stderr
from yolov9c.data.labels import BadLabels, label_path_for, orphan_label_files, parse_label_file

EXAMPLES = 3  # paths shown for the missing and orphan counts


@dataclass
class ScanResult:
    """The usable pairs of a split and what the scan found.

    im_files, label_files: lists of str (usable pairs only); shapes: int64 (n, 2) upright (h, w);
    labels: list of float32 (k, 5) [cls, xc, yc, w, h] normalised; segments: list of lists of float32
    (p, 2) normalised polygons (empty list when the file has none); messages: 'path: reason' lines
    (skipped files and warnings); missing: usable images without a label file; orphans: label files
    without an image; counts as in the summary."""
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
    missing: list = field(default_factory=list)
    orphans: list = field(default_factory=list)

    def summary(self):
        s = f"{self.n_images} images, {self.n_backgrounds} backgrounds, {self.n_corrupt} corrupt"
        if self.missing:
            s += f", {len(self.missing)} missing"
        if self.orphans:
            s += f", {len(self.orphans)} orphan"
        return s

    def pairing_lines(self):
        """The lines printed before the summary for the missing and orphan counts (none when both are 0)."""
        lines = []
        if self.missing:
            n = len(self.missing)
            first = f"{self.missing[0]} (no {label_path_for(self.missing[0])})"
            lines.append(f"{n} image{'s' * (n > 1)} without a label file (missing, used as background{'s' * (n > 1)})"
                         f", e.g. {', '.join([first] + self.missing[1:EXAMPLES])}")
        if self.orphans:
            n = len(self.orphans)
            lines.append(f"{n} label file{'s' * (n > 1)} without an image (orphan, not used), "
                         f"e.g. {', '.join(self.orphans[:EXAMPLES])}")
        return lines


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
        with captured_stderr() as cap, ThreadPoolExecutor(threads) as pool:
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
        if MARK in cap.text:  # libjpeg's lines carry no file name: find the files that print them
            notes = attribute(im_files, check_image, cap.text.count(MARK))
            res.messages += notes
            res.n_warnings += len(notes)
        if cpath is not None:
            warn = save_label_cache(cpath, res, key)
            if warn:
                res.messages.append(f"{cpath}: {warn}")
    res.missing = [im for im, lb in zip(res.im_files, res.label_files) if not os.path.exists(lb)]
    lists = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources or [])
    res.orphans = orphan_label_files(im_files, exclude=[s for s in lists if str(s).endswith(".txt")])
    for m in res.messages + res.pairing_lines():
        log(f"{prefix}{m}")
    log(f"{prefix}{res.summary()}" + (f" (label cache {cpath})" if res.from_cache else ""))
    return res
