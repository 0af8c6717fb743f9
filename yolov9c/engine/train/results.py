"""Run-folder outputs of training: results.csv (published columns + ours), results.png (values, a smoothed
line and a legend), train_batch*.jpg, labels.jpg (with its box-overlay panel) and labels_correlogram.jpg.

results.csv: one row per epoch; header cells '%20s', values '%20.5g', comma-separated, as published. Columns:
the published 14 (epoch, train/*_loss, metrics/*, val/*_loss, x/lr0..2; val losses here are really computed)
and ours: gpu_mem_peak_alloc, gpu_mem_reserved (GiB; 0 on the CPU), epoch_seconds, images_per_s.

The file survives any crash: every change writes the whole new file and renames it over the old one
(append_row, drop_epochs_from), so a reader or a kill sees the old rows or the new ones, never a torn line.
A line that is torn or malformed anyway (an older version appended in place) is dropped by the next change.
A results.csv of fewer columns (a published run's 14) gets ours at the next row, its rows padded with nan.
The plots are written atomically too (save_figure); one that cannot be written (a full disk) is a warning.

Test: python -m pytest -q tests/engine/train/test_train_parts.py -k results; tests/engine/train/test_run_folder.py
"""

import csv
import io
import os
import warnings
from pathlib import Path

import numpy as np

from yolov9c.models.atomic_io import atomic_write

COLUMNS = ("epoch", "train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision", "metrics/recall",
           "metrics/mAP_0.5", "metrics/mAP_0.5:0.95", "val/box_loss", "val/cls_loss", "val/dfl_loss",
           "x/lr0", "x/lr1", "x/lr2", "gpu_mem_peak_alloc", "gpu_mem_reserved", "epoch_seconds", "images_per_s",
           "skipped_steps")


def _header_line():
    return ("%20s," * len(COLUMNS) % COLUMNS).rstrip(",") + "\n"


def _row_line(values):
    return ("%20.5g," * len(values) % tuple(float(v) for v in values)).rstrip(",") + "\n"


def _row_epoch(line, n_fields):
    """The epoch of a complete data line (ends in a newline, n_fields numbers), else None (torn/malformed)."""
    if not line.endswith("\n"):
        return None
    cells = line.split(",")
    if len(cells) != n_fields:
        return None
    try:
        nums = [float(c) for c in cells]
    except ValueError:
        return None
    return int(nums[0]) if nums[0] == nums[0] else None


def read_rows(path):
    """(header line, [(epoch, line), ...]) of results.csv, complete lines only (a torn last line or a malformed
    row is left out). A missing or empty file gives (None, [])."""
    path = Path(path)
    if not path.is_file():
        return None, []
    lines = path.read_text(errors="replace").splitlines(keepends=True)
    if not lines or not lines[0].endswith("\n") or lines[0].split(",")[0].strip() != "epoch":
        return None, []
    n = len(lines[0].split(","))
    rows = [(e, line) for line in lines[1:] if (e := _row_epoch(line, n)) is not None]
    return lines[0], rows


def _write(path, header, rows):
    atomic_write(path, (header or _header_line()) + "".join(line for _, line in rows), what="results.csv")


def append_row(path, values):
    """Append one epoch's row (len(COLUMNS) numbers) to results.csv, writing the header first if new. Atomic:
    the whole file is written anew and renamed over the old one; torn lines of an older writer are dropped."""
    path = Path(path)
    if len(values) != len(COLUMNS):
        raise ValueError(f"results row has {len(values)} values, expected {len(COLUMNS)}")
    header, rows = read_rows(path)
    if header is not None and header != _header_line():
        header, rows = _widened(header, rows)
    _write(path, header, rows + [(int(values[0]), _row_line(values))])


def _widened(header, rows):
    """(header, rows) of a results.csv with fewer columns than ours, its header a prefix of COLUMNS (the
    published 14, or an older version's): our header, each row padded with nan (not recorded), so that the rows
    still parse once ours follow; read_rows would drop the old rows as malformed. Another header: as it is."""
    names = [c.strip() for c in header.split(",")]
    if len(names) >= len(COLUMNS) or names != list(COLUMNS[:len(names)]):
        return header, rows
    pad = ("," + "%20.5g" % float("nan")) * (len(COLUMNS) - len(names))
    return _header_line(), [(e, line.rstrip("\n") + pad + "\n") for e, line in rows]


def epochs_in(path):
    """The epochs of results.csv's complete rows, in file order."""
    return [e for e, _ in read_rows(path)[1]]


def drop_epochs_from(path, epoch):
    """Keep only the complete rows of epochs < `epoch` (the epochs a resume redoes go), atomically. Returns the
    number of lines dropped (rows of epochs >= epoch and torn/malformed lines); 0 leaves the file untouched."""
    path = Path(path)
    if not path.is_file():
        return 0
    total = max(len(path.read_text(errors="replace").splitlines()) - 1, 0)
    header, rows = read_rows(path)
    keep = [(e, line) for e, line in rows if e < epoch]
    dropped = total - len(keep)
    if dropped or header is None:
        _write(path, header, keep)
    return dropped


def move_aside(path):
    """Rename results.csv to results.1.csv (the first free results.N.csv; never overwrites). Returns the new
    path, or None if there was no file."""
    path = Path(path)
    if not path.exists():
        return None
    n = 1
    while (dest := path.with_name(f"{path.stem}.{n}{path.suffix}")).exists():
        n += 1
    path.rename(dest)
    return dest


def read_results(path):
    """results.csv → dict column name (stripped) → float64 array."""
    with open(path) as f:
        rows = [[c.strip() for c in r] for r in csv.reader(f)]
    head, body = rows[0], rows[1:]
    return {h: np.array([float(r[i]) for r in body], np.float64) for i, h in enumerate(head)}


def smooth(y, sigma=3.0):
    """y (1-D) convolved with a Gaussian of standard deviation `sigma` samples (radius 4·sigma), the ends
    mirrored (half-sample symmetric): results.png's dotted 'smooth' line, as published."""
    y = np.asarray(y, np.float64)
    if len(y) == 0 or sigma <= 0:
        return y.copy()
    r = int(4 * sigma + 0.5)
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    k /= k.sum()
    padded = np.pad(y, r, mode="symmetric")
    return np.convolve(padded, k, mode="valid")


RESULT_PANELS = ("train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision", "metrics/recall",
                 "val/box_loss", "val/cls_loss", "val/dfl_loss", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95")


def results_figure(data, label="results"):
    """The matplotlib Figure of results.png for read_results() output `data`: 2×5 panels (RESULT_PANELS), each
    with the values (dots, `label`) and their Gaussian-smoothed line (dotted, 'smooth'); a legend on the second
    panel, as published."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = data["epoch"]
    fig, ax = plt.subplots(2, 5, figsize=(12, 6), tight_layout=True)
    for a, k in zip(ax.ravel(), RESULT_PANELS):
        a.plot(x, data[k], marker=".", label=label, linewidth=2, markersize=8)
        a.plot(x, smooth(data[k]), ":", label="smooth", linewidth=2)
        a.set_title(k, fontsize=12)
    ax.ravel()[1].legend()
    return fig


def save_figure(fig, path, dpi):
    """Write matplotlib figure `fig` to `path` (format from its suffix) atomically, and close it. A plot never
    ends a run: a write that fails (a full disk, no permission) leaves the old file or none, is one warning
    naming the file, and returns None; else returns the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format=path.suffix.lstrip(".").lower(), dpi=dpi)
        return atomic_write(path, buf.getvalue(), what=path.name)
    except OSError as e:  # DiskFullError's own advice (--resume) is for checkpoints: only the cause here
        why = os.strerror(e.errno) if e.errno else str(e)
        warnings.warn(f"{path.name} not written ({why}: {path}); a plot only: the run goes on", stacklevel=3)
        return None
    finally:
        plt.close(fig)


def plot_results(path):
    """results.png next to results.csv (results_figure). Returns its path (None: not written, save_figure)."""
    path = Path(path)
    fig = results_figure(read_results(path), label=path.stem)
    return save_figure(fig, path.with_name("results.png"), dpi=200)


def _color(c):
    """A distinct BGR colour per class (golden-angle hues)."""
    import cv2
    hsv = np.uint8([[[(int(c) * 47) % 180, 220, 230]]])
    return tuple(int(v) for v in cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0])


def plot_train_batch(imgs, targets, path, names=None, max_images=16):
    """A grid of up to 16 images of a batch with their label boxes, written with cv2.

    imgs: uint8 (B, 3, H, W) RGB tensor or array; targets: (N, 6) [image index, cls, xc, yc, w, h] normalised."""
    import cv2

    imgs = np.asarray(imgs.cpu() if hasattr(imgs, "cpu") else imgs)
    targets = np.asarray(targets.cpu() if hasattr(targets, "cpu") else targets)
    b, _, h, w = imgs.shape
    b = min(b, max_images)
    ns = int(np.ceil(b ** 0.5))
    grid = np.full((ns * h, ns * w, 3), 255, np.uint8)
    for i in range(b):
        y0, x0 = (i // ns) * h, (i % ns) * w
        tile = np.ascontiguousarray(imgs[i].transpose(1, 2, 0)[:, :, ::-1])  # RGB → BGR for cv2
        for t in targets[targets[:, 0] == i]:
            c, xc, yc, bw, bh = t[1:]
            p1 = (int((xc - bw / 2) * w), int((yc - bh / 2) * h))
            p2 = (int((xc + bw / 2) * w), int((yc + bh / 2) * h))
            cv2.rectangle(tile, p1, p2, _color(c), 1)
            label = names[int(c)] if names is not None and int(c) < len(names) else str(int(c))
            cv2.putText(tile, label, (p1[0], max(p1[1] - 2, 8)), cv2.FONT_HERSHEY_SIMPLEX, 0.3, _color(c), 1)
        grid[y0:y0 + h, x0:x0 + w] = tile
        cv2.rectangle(grid, (x0, y0), (x0 + w - 1, y0 + h - 1), (255, 255, 255), 1)
    cv2.imwrite(str(path), grid)
    return path


def box_overlay(lb, size=1000, max_boxes=1000):
    """labels.jpg's box panel: the first `max_boxes` boxes of `lb` (k, 5) [cls, xc, yc, w, h] normalised, all
    centred, outlined in their class colour on a white size × size RGB uint8 image (how big and how square
    the objects are, at a glance)."""
    import cv2

    img = np.full((size, size, 3), 255, np.uint8)
    for c, _, _, w, h in np.asarray(lb, np.float64)[:max_boxes]:
        p1 = (int(round((0.5 - w / 2) * (size - 1))), int(round((0.5 - h / 2) * (size - 1))))
        p2 = (int(round((0.5 + w / 2) * (size - 1))), int(round((0.5 + h / 2) * (size - 1))))
        cv2.rectangle(img, p1, p2, _color(c)[::-1], 1)
    return img


def plot_labels(labels, names, path):
    """labels.jpg (2×2: class histogram, the boxes' sizes overlaid (box_overlay), box centres x-y, box sizes
    width-height) and labels_correlogram.jpg beside it (x, y, width, height: histograms on the diagonal, 2-D
    histograms below it), as published at the start of a run. labels: list of (k, 5) arrays [cls, xc, yc, w, h]
    normalised (a dataset's labels). Returns the labels.jpg path (None: not written, save_figure)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    lb = np.concatenate([np.asarray(x).reshape(-1, 5) for x in labels], 0) if labels else np.zeros((0, 5))
    nc = max(len(names), int(lb[:, 0].max()) + 1 if len(lb) else 1)
    fig, ax = plt.subplots(2, 2, figsize=(8, 8), tight_layout=True)
    ax = ax.ravel()
    counts = np.bincount(lb[:, 0].astype(int), minlength=nc)
    ax[0].bar(range(nc), counts, color=[np.array(_color(i)[::-1]) / 255 for i in range(nc)])
    ax[0].set_ylabel("instances")
    if nc <= 30:
        ax[0].set_xticks(range(nc), [str(n) for n in list(names)[:nc]] + [str(i) for i in range(len(names), nc)],
                         rotation=90, fontsize=8)
    ax[1].imshow(box_overlay(lb))
    ax[1].axis("off")
    for a, (i, j, xl, yl) in zip(ax[2:], ((1, 2, "x", "y"), (3, 4, "width", "height"))):
        a.hist2d(lb[:, i], lb[:, j], bins=50, range=[[0, 1], [0, 1]], cmap="Blues")
        a.set_xlabel(xl)
        a.set_ylabel(yl)
    saved = save_figure(fig, path, dpi=120)
    plot_label_correlogram(lb, path.with_name("labels_correlogram.jpg"))
    return saved


def plot_label_correlogram(lb, path):
    """labels_correlogram.jpg: x, y, width, height of every box of `lb` (k, 5) against each other (lower
    triangle: 2-D histograms; diagonal: histograms; upper triangle empty). Returns the path (None: not written,
    save_figure)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = ("x", "y", "width", "height")
    fig, ax = plt.subplots(4, 4, figsize=(8, 8), tight_layout=True)
    for i in range(4):
        for j in range(4):
            a = ax[i, j]
            if j > i:
                a.axis("off")
                continue
            if i == j:
                a.hist(lb[:, 1 + i], bins=50, range=(0, 1), color="#3b75af")
            else:
                a.hist2d(lb[:, 1 + j], lb[:, 1 + i], bins=50, range=[[0, 1], [0, 1]], cmap="Blues")
            if i == 3:
                a.set_xlabel(cols[j])
            if j == 0:
                a.set_ylabel(cols[i])
    return save_figure(fig, path, dpi=100)
