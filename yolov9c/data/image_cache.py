"""Image caching (`--cache ram | disk | val`) and the resize every image load ends with.

- `ram`: keeps every image resized (long side = imgsz) in memory. First the memory it needs is computed
  exactly from the image sizes the scan recorded (the published code samples 30 images); when
  need × 1.1 exceeds the available memory, caching is turned off with a message and training goes on.
- `disk`: writes each image, decoded and upright, at full resolution to a `.npy` next to it (rewritten
  when the image is newer than its `.npy`); loading a `.npy` skips JPEG decoding. A folder that is not
  writable gives a warning and those images are read from their files. The exact bytes to write are checked
  against each file system's free space (need × 1.1, as `ram`): too little, one line and nothing written. Each
  `.npy` is written to `<name>.npy.<pid>.tmp.npy` and renamed; a failed write removes its temporary at once (a
  killed run's are removed on the next disk run).
  Every existing `.npy` is checked at start (npy_problem: header, uint8 (h, w, 3) of the image's size, exact
  file size; no pickle): a damaged one is rebuilt with one line, so no epoch stops on a bad cache file.
- any other non-empty value (e.g. `val`, as train_dual passes for the val set): RAM without the check.
Test: python -m pytest -q tests/data/test_data_cache.py
"""

import errno
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np

from yolov9c.data.images import BadImage, read_image
from yolov9c.data.label_cache import folder_writable
from yolov9c.data.stale_temps import remove_stale_temps
from yolov9c.units import GIB, MIB


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


def total_ram():
    """Bytes of physical memory of this machine (0 when unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
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


def npy_problem(npy, hw=None):
    """Why `.npy` file `npy` cannot serve as the disk cache of an image of `hw` (h, w) (None when it can),
    from its header and size alone: a format np.load(allow_pickle=False) reads, uint8 (h, w, 3) in C order,
    and exactly the bytes that shape needs (a truncated or padded file is refused)."""
    fmt = np.lib.format
    try:
        with open(npy, "rb") as f:
            version = fmt.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                return f"npy format version {version}"
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = read_header(f)
            data_start = f.tell()
        size = os.path.getsize(npy)
    except (OSError, ValueError, EOFError) as e:
        return f"unreadable header: {e}"
    if dtype != np.uint8 or fortran or len(shape) != 3 or shape[2] != 3:
        return f"holds {dtype}{list(shape)}{' Fortran order' if fortran else ''}, not uint8 [h, w, 3]"
    if hw is not None and tuple(shape[:2]) != tuple(int(v) for v in hw):
        return f"holds an image of {shape[0]}x{shape[1]}, the image is {int(hw[0])}x{int(hw[1])}"
    need = data_start + int(np.prod(shape))
    if size != need:
        return f"{size} bytes, its header needs {need}"
    return None


def _npy_to_write(im_file, hw=None):
    """Whether `im_file`, an image of `hw` (h, w), needs its .npy written → None (its .npy is up to date), or ''
    (missing or older than the image) or the line saying why the existing one is damaged."""
    npy = npy_path_for(im_file)
    try:
        if npy.is_file() and npy.stat().st_mtime_ns >= Path(im_file).stat().st_mtime_ns:
            why = npy_problem(npy, hw)
            return None if why is None else f"{npy}: damaged disk cache ({why})"
    except OSError:
        pass
    return ""


def npy_bytes(hw):
    """Bytes of the .npy of an image of `hw` (h, w): its uint8 pixels and at most a 128-byte header."""
    return 128 + 3 * int(hw[0]) * int(hw[1])


def disk_space_problem(im_files, shapes, margin=1.1):
    """The line saying that the .npy files of `im_files` (images of `shapes` (h, w) each) do not fit the free space
    of their file system with `margin` (None when they do, or when it cannot be told)."""
    need = {}  # st_dev → [bytes, a folder on it]
    for im, hw in zip(im_files, shapes):
        folder = Path(im).parent
        try:
            dev = os.stat(folder).st_dev
        except OSError:
            continue
        need.setdefault(dev, [0, folder])[0] += npy_bytes(hw)
    for total, folder in need.values():
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            continue
        if total * margin > free:
            return (f"--cache disk needs {_size(total)} (+{round(100 * (margin - 1))} % margin) for {len(im_files)} "
                    f".npy files on the disk of {folder} but {_size(free)} is free: none written (those images "
                    f"are read from their files)")
    return None


def _size(n):
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.2f} MiB"


def _write_npy(im_file, rebuilt=""):
    """Write the disk cache of `im_file` (`rebuilt`: why its old .npy was damaged, '' when missing or stale) →
    (its .npy, or None when the image is to be read from its file; None or one line to log). A failed write
    removes its temporary: no empty or partial .npy is left."""
    npy = npy_path_for(im_file)
    if not folder_writable(npy.parent):
        return None, (f"{rebuilt}: not rebuilt ({npy.parent} is not writable), the image is read from its file"
                      if rebuilt else f"{npy.parent}: not writable, disk cache off for its images")
    tmp = npy.with_name(f"{npy.name}.{os.getpid()}.tmp.npy")
    try:
        img = read_image(im_file)
        try:
            np.save(tmp, img, allow_pickle=False)
            os.replace(tmp, npy)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # one line for the folder, not one per image
            return None, f"{npy.parent}: {os.strerror(e.errno)}: disk cache not written for some of its images"
        return None, f"{im_file}: disk cache not written ({e})"
    except BadImage as e:
        return None, f"{im_file}: disk cache not written ({e})"
    return npy, rebuilt and f"{rebuilt}: rebuilt from {Path(im_file).name}"


def cache_images(dataset, mode, log=print, prefix=""):
    """Fill `dataset`'s image cache for `mode` ('ram', 'disk', other truthy = RAM unchecked, falsy = none).
    Sets dataset.ims (list of arrays or None) or dataset.npy_files. Returns the mode in force."""
    n = len(dataset.im_files)
    if not mode or n == 0:
        return None
    if mode == "disk":
        for folder in {Path(f).parent for f in dataset.im_files}:  # temporaries of a killed run
            remove_stale_temps(folder, r".+\.npy\.(?P<pid>\d+)\.tmp\.npy")
        known = len(dataset.shapes) == n
        shapes = dataset.shapes if known else [None] * n
        with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
            todo = list(pool.map(_npy_to_write, dataset.im_files, shapes))  # None: its .npy is up to date
            stale = [i for i, why in enumerate(todo) if why is not None]
            full = disk_space_problem([dataset.im_files[i] for i in stale], [shapes[i] for i in stale]) \
                if stale and known else None
            if full:  # as --cache ram: one line, and nothing written
                log(f"{prefix}{full}")
                if len(stale) == n:
                    return None
                stale = []
            written = dict(zip(stale, pool.map(_write_npy, [dataset.im_files[i] for i in stale],
                                               [todo[i] for i in stale])))
        done = [written.get(i, (None, None) if why is not None else (npy_path_for(f), None))
                for i, (f, why) in enumerate(zip(dataset.im_files, todo))]
        for w in sorted({w for _, w in done if w}):
            log(f"{prefix}{w}")
        dataset.npy_files = [npy for npy, _ in done]
        log(f"{prefix}disk cache: {sum(p is not None for p in dataset.npy_files)}/{n} images as .npy")
        return "disk"
    need = ram_needed(dataset.shapes, dataset.img_size)
    if mode == "ram":
        have = available_ram()
        if need * 1.1 > have:
            log(f"{prefix}--cache ram needs {need / GIB:.1f} GiB (+10 % margin) but {have / GIB:.1f} GiB is "
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
    log(f"{prefix}RAM cache: {n} images, {need / GIB:.2f} GiB")
    return mode
