"""Image caching (`--cache ram | disk | val`) and the resize every image load ends with.

- `ram`: keeps every image resized (long side = imgsz) in memory. First the memory it needs is computed
  exactly from the image sizes the scan recorded (the published code samples 30 images); when
  need × 1.1 exceeds the available memory, caching is turned off with a message and training goes on.
- `disk`: writes each image, decoded and upright, at full resolution to a `.npy` next to it (rewritten
  when the image is newer than its `.npy`); loading a `.npy` skips JPEG decoding. A folder that is not
  writable gives a warning and those images are read from their files. Each `.npy` is written to
  `<name>.npy.<pid>.tmp.npy` and renamed; such files left by a killed run are removed on the next disk run.
- any other non-empty value (e.g. `val`, as train_dual passes for the val set): RAM without the check.

Test: python -m pytest -q tests/test_data_cache.py
"""

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np

from yolov9c.data.images import BadImage, read_image
from yolov9c.data.label_cache import folder_writable
from yolov9c.data.stale_temps import remove_stale_temps


def resize_long_side(img, img_size, augment, hw0=None):
    """Resize `img` so its long side is `img_size` → (img, (h0, w0), (h, w)).
    hw0: the original (h0, w0) when `img` was decoded at a reduced size (the output size is computed from
    it, so it does not depend on the reduction). INTER_LINEAR when augmenting or enlarging, INTER_AREA when
    shrinking for evaluation (published)."""
    h0, w0 = hw0 if hw0 is not None else img.shape[:2]
    r = img_size / max(h0, w0)
    # truncated, as published (int(w0 * r)): 900 x 1300 at 320 is 221 x 320, not 222
    size = (max(1, int(w0 * r)), max(1, int(h0 * r)))
    if size != (img.shape[1], img.shape[0]):
        enlarge = size[0] > img.shape[1]
        interp = cv2.INTER_LINEAR if (augment or enlarge) else cv2.INTER_AREA
        img = cv2.resize(img, size, interpolation=interp)
    return img, (int(h0), int(w0)), img.shape[:2]


def available_ram():
    """Bytes of memory available to new allocations (MemAvailable of /proc/meminfo; sysconf fallback)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def ram_needed(shapes, img_size):
    """Bytes that the resized uint8 BGR images of `shapes` (n, 2) (h, w) take."""
    shapes = np.asarray(shapes, np.float64).reshape(-1, 2)
    if len(shapes) == 0:
        return 0
    r = img_size / shapes.max(1)
    return int((np.maximum(np.floor(shapes[:, 0] * r), 1) * np.maximum(np.floor(shapes[:, 1] * r), 1) * 3).sum())


def npy_path_for(im_file):
    return Path(im_file).with_suffix(".npy")


def _write_npy(im_file):
    """→ None or a warning line."""
    npy = npy_path_for(im_file)
    try:
        if npy.is_file() and npy.stat().st_mtime_ns >= Path(im_file).stat().st_mtime_ns:
            return None
        if not folder_writable(npy.parent):
            return f"{npy.parent}: not writable, disk cache off for its images"
        img = read_image(im_file)
        tmp = npy.with_name(f"{npy.name}.{os.getpid()}.tmp.npy")
        np.save(tmp, img, allow_pickle=False)
        os.replace(tmp, npy)
    except (OSError, BadImage) as e:
        return f"{im_file}: disk cache not written ({e})"
    return None


def cache_images(dataset, mode, log=print, prefix=""):
    """Fill `dataset`'s image cache for `mode` ('ram', 'disk', other truthy = RAM unchecked, falsy = none).
    Sets dataset.ims (list of arrays or None) or dataset.npy_files. Returns the mode in force."""
    n = len(dataset.im_files)
    if not mode or n == 0:
        return None
    if mode == "disk":
        for folder in {Path(f).parent for f in dataset.im_files}:  # temporaries of a killed run
            remove_stale_temps(folder, r".+\.npy\.(?P<pid>\d+)\.tmp\.npy")
        with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
            warnings = [w for w in pool.map(_write_npy, dataset.im_files) if w]
        for w in sorted(set(warnings)):
            log(f"{prefix}{w}")
        dataset.npy_files = [npy_path_for(f) if npy_path_for(f).is_file() else None for f in dataset.im_files]
        log(f"{prefix}disk cache: {sum(p is not None for p in dataset.npy_files)}/{n} images as .npy")
        return "disk"
    need = ram_needed(dataset.shapes, dataset.img_size)
    if mode == "ram":
        have = available_ram()
        if need * 1.1 > have:
            log(f"{prefix}--cache ram needs {need / 2**30:.1f} GiB (+10 % margin) but {have / 2**30:.1f} GiB is "
                f"available: not caching images")
            return None
    ims = [None] * n
    hw0 = [None] * n
    hw = [None] * n

    def load(i):
        ims[i], hw0[i], hw[i] = dataset.load_image(i)

    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(load, range(n)))
    dataset.ims, dataset.im_hw0, dataset.im_hw = ims, hw0, hw
    log(f"{prefix}RAM cache: {n} images, {need / 2**30:.2f} GiB")
    return mode
