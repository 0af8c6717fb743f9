"""Label cache (yolov9c/data/label_cache.py) and image caches (image_cache.py): reuse, invalidation when
files change, unwritable folders, RAM check and disk `.npy` files; a damaged `.npy` (truncated, padded, a pickled
object, another shape or dtype, not an npy at all) is found at start and rebuilt with one line each.

Run: python -m pytest -q tests/data/test_data_cache.py
"""

import os
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest

from yolov9c.data import label_cache
from yolov9c.data.dataset import DatasetConfig, YoloDataset
from yolov9c.data.image_cache import npy_bytes, ram_needed
from yolov9c.data.image_list import collect_image_files
from yolov9c.data.scan import scan_split


def _dataset(root, n=4, poly=False):
    im, lb = root / "images" / "train", root / "labels" / "train"
    im.mkdir(parents=True)
    lb.mkdir(parents=True)
    for i in range(n):
        img = np.full((40 + 8 * i, 64, 3), 60 + 20 * i, np.uint8)
        cv2.imwrite(str(im / f"{i}.png"), img)
        text = f"{i % 3} 0.5 0.5 0.25 0.5\n"
        if poly:
            text += "1 0.1 0.1 0.4 0.1 0.4 0.3 0.1 0.3\n"
        (lb / f"{i}.txt").write_text(text)
    return im, lb


def _scan(im, lines=None):
    return scan_split(collect_image_files(im), nc=3, sources=str(im), log=(lines.append if lines is not None
                                                                           else lambda s: None))


def _bump(path):
    # a later mtime even on coarse-timestamp file systems
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def test_cache_written_reused_and_equal(tmp_path):
    im, lb = _dataset(tmp_path, poly=True)
    a = _scan(im)
    cache = tmp_path / "labels" / "train.cache"
    assert cache.is_file() and not a.from_cache
    b = _scan(im)
    assert b.from_cache
    assert b.im_files == a.im_files and b.label_files == a.label_files
    assert np.array_equal(b.shapes, a.shapes)
    assert all(np.array_equal(x, y) for x, y in zip(a.labels, b.labels))
    assert all(len(x) == len(y) and all(np.array_equal(p, q) for p, q in zip(x, y))
               for x, y in zip(a.segments, b.segments))
    assert b.summary() == a.summary() == "4 images, 0 backgrounds, 0 corrupt"
    # no pickle inside: readable with allow_pickle=False
    with np.load(cache, allow_pickle=False) as z:
        assert str(z["version"]) == label_cache.CACHE_VERSION


def test_cache_invalidated_by_edits_additions_removals_and_version(tmp_path, monkeypatch):
    im, lb = _dataset(tmp_path)
    _scan(im)
    # same size, new content, later mtime: a size-only key would miss this
    (lb / "1.txt").write_text("2 0.5 0.5 0.25 0.5\n")
    _bump(lb / "1.txt")
    r = _scan(im)
    assert not r.from_cache and r.labels[1][0, 0] == 2
    assert _scan(im).from_cache
    cv2.imwrite(str(im / "9.png"), np.zeros((32, 32, 3), np.uint8))  # a new image (background)
    r = _scan(im)
    assert not r.from_cache and r.n_images == 5 and r.n_backgrounds == 1
    (im / "9.png").unlink()
    r = _scan(im)
    assert not r.from_cache and r.n_images == 4
    (lb / "2.txt").unlink()  # a label file removed: the image becomes a background
    r = _scan(im)
    assert not r.from_cache and r.n_backgrounds == 1
    monkeypatch.setattr(label_cache, "CACHE_VERSION", "yolov9c-labels-test")
    assert not _scan(im).from_cache


def test_corrupt_cache_file_is_rescanned(tmp_path):
    im, _ = _dataset(tmp_path)
    _scan(im)
    (tmp_path / "labels" / "train.cache").write_bytes(b"not a cache")
    r = _scan(im)
    assert not r.from_cache and r.n_images == 4


def _published_cache(f):  # what the published code leaves: np.save of a pickled dict, renamed to .cache
    np.save(f, {"hash": "0", "version": 0.6, "msgs": [], "results": (4, 0, 0, 0, 4)}, allow_pickle=True)


@pytest.mark.parametrize("write", [
    _published_cache,
    lambda f: np.save(f, np.arange(5)),  # a plain array: np.load returns an ndarray, not an archive
    lambda f: np.save(f, np.array("yolov9c-labels-3")),
    lambda f: np.savez(f, version=np.array("yolov9c-labels-1"), key=np.array("0")),  # an older yolov9c
], ids=["published", "npy-array", "npy-str", "older-yolov9c"])
def test_foreign_cache_file_is_rescanned_and_replaced(tmp_path, write):
    im, lb = _dataset(tmp_path)
    cache = tmp_path / "labels" / "train.cache"
    with open(cache, "wb") as f:
        write(f)
    (lb / "0.txt").write_text("2 0.5 0.5 0.25 0.5\n")  # the labels of now, not of the foreign scan
    r = _scan(im)
    assert not r.from_cache and r.n_images == 4 and r.labels[0][0, 0] == 2
    assert _scan(im).from_cache  # replaced by a cache of ours


def test_missing_label_folder_is_not_called_unwritable(tmp_path):
    im, lb = _dataset(tmp_path)
    for f in lb.iterdir():
        f.unlink()
    lb.rmdir()
    (tmp_path / "labels").rmdir()
    lines = []
    assert _scan(im, lines).n_backgrounds == 4
    cache = tmp_path / "labels" / "train.cache"
    assert f"{cache}: label cache not written, {tmp_path / 'labels'} does not exist" in lines, lines


def test_unwritable_folder_warns_and_still_works(tmp_path):
    im, lb = _dataset(tmp_path)
    parent = tmp_path / "labels"
    os.chmod(parent, 0o555)  # read-only mode: we do not write even as root
    try:
        lines = []
        r = _scan(im, lines)
        assert r.n_images == 4
        assert any("label cache not written" in ln and "not writable" in ln for ln in lines)
        assert not (parent / "train.cache").exists()
        assert lines[-1] == "4 images, 0 backgrounds, 0 corrupt"
    finally:
        os.chmod(parent, 0o755)


def test_ram_cache_and_its_estimate(tmp_path):
    im, _ = _dataset(tmp_path)
    lines = []
    ds = YoloDataset(str(im), DatasetConfig(img_size=32, cache="ram", nc=3), log=lines.append)
    assert ds.cache == "ram" and all(x is not None for x in ds.ims)
    # exact estimate: long side 64 -> 32, so each image is (h/2) x 32 x 3 bytes
    assert ram_needed(ds.shapes, 32) == sum(x.nbytes for x in ds.ims)
    item = ds[0]
    assert item[0].shape == (3, 32, 32)
    ds2 = YoloDataset(str(im), DatasetConfig(img_size=32, cache=None, nc=3), log=lambda s: None)
    assert all(np.array_equal(a[0].numpy(), b[0].numpy()) for a, b in zip((ds[i] for i in range(4)),
                                                                          (ds2[i] for i in range(4))))


def test_ram_cache_falls_back_when_it_does_not_fit(tmp_path):
    im, _ = _dataset(tmp_path)
    lines = []
    # 4 images at a long side of 2^20 px need terabytes: more than any test machine has
    ds = YoloDataset(str(im), DatasetConfig(img_size=2 ** 20, cache="ram", nc=3), log=lines.append)
    assert ds.cache is None and all(x is None for x in ds.ims)
    assert any("not caching images" in ln for ln in lines)


def test_disk_cache_npy_and_refresh(tmp_path):
    im, _ = _dataset(tmp_path)
    ds = YoloDataset(str(im), DatasetConfig(img_size=64, cache="disk", nc=3), log=lambda s: None)
    npys = sorted(im.glob("*.npy"))
    assert ds.cache == "disk" and len(npys) == 4
    # the free-space check's estimate is each file's size (image_cache.disk_space_problem)
    assert [p.stat().st_size for p in npys] == [npy_bytes(hw) for hw in ds.shapes]
    arr = np.load(npys[0], allow_pickle=False)
    assert arr.dtype == np.uint8 and arr.shape == (40, 64, 3) and (arr == 60).all()
    # a rewritten image is newer than its .npy: the .npy is rewritten
    cv2.imwrite(str(im / "0.png"), np.full((40, 64, 3), 7, np.uint8))
    _bump(im / "0.png")
    time.sleep(0.01)
    YoloDataset(str(im), DatasetConfig(img_size=64, cache="disk", nc=3), log=lambda s: None)
    assert (np.load(im / "0.npy", allow_pickle=False) == 7).all()


def test_damaged_disk_cache_files_are_rebuilt_at_start(tmp_path):
    im, _ = _dataset(tmp_path, n=6)
    YoloDataset(str(im), DatasetConfig(img_size=64, cache="disk", nc=3), log=lambda s: None)
    good = {p.name: p.read_bytes() for p in im.glob("*.npy")}
    (im / "0.npy").write_bytes(good["0.npy"][:len(good["0.npy"]) // 2])  # truncated
    (im / "1.npy").write_bytes(good["1.npy"] + b"\0" * 7)  # padded
    np.save(im / "2.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)  # a pickled object
    np.save(im / "3.npy", np.zeros((40 + 8 * 3, 64), np.uint8))  # grey, not (h, w, 3)
    np.save(im / "4.npy", np.zeros((9, 9, 3), np.uint8))  # another image's size
    (im / "5.npy").write_bytes(b"not an npy file")
    for p in im.glob("*.npy"):
        _bump(p)  # newer than its image: only the check can tell
    lines = []
    ds = YoloDataset(str(im), DatasetConfig(img_size=64, cache="disk", nc=3), log=lines.append)
    rebuilt = [ln for ln in lines if "damaged disk cache" in ln]
    assert len(rebuilt) == 6 and all(ln.endswith(f"rebuilt from {i}.png") for i, ln in enumerate(rebuilt)), lines
    assert "(holds object[1], not uint8 [h, w, 3])" in rebuilt[2] and "the image is 72x64" in rebuilt[4]
    assert {p.name: p.read_bytes() for p in im.glob("*.npy")} == good
    assert all(ds[i][0].shape == (3, 64, 64) for i in range(6))


def test_disk_cache_unwritable_folder(tmp_path):
    im, _ = _dataset(tmp_path)
    os.chmod(im, 0o555)
    try:
        lines = []
        ds = YoloDataset(str(im), DatasetConfig(img_size=64, cache="disk", nc=3, label_cache=False), log=lines.append)
        assert not list(im.glob("*.npy")) and all(p is None for p in ds.npy_files)
        assert any("not writable" in ln for ln in lines)
        assert ds[1][0].shape == (3, 64, 64)
    finally:
        os.chmod(im, 0o755)


@pytest.mark.parametrize("mode", ["val", True])
def test_other_cache_values_mean_ram_without_check(tmp_path, mode):
    im, _ = _dataset(tmp_path)
    ds = YoloDataset(str(im), DatasetConfig(img_size=32, cache=mode, nc=3), log=lambda s: None)
    assert ds.cache == mode and all(x is not None for x in ds.ims)


def _dead_pid():
    """The id of a process that has exited (its id not yet reused: ids are handed out in increasing order)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temps_of_a_killed_run_are_removed(tmp_path):
    # a run killed between writing a temporary and renaming it left these; the next run removes those of dead
    # processes and keeps one whose process is alive (a concurrent run still writing it)
    im, lb = _dataset(tmp_path)
    dead, alive = _dead_pid(), os.getppid()
    labels = tmp_path / "labels"
    stale_cache, live_cache = labels / f"train.cache.{dead}.tmp", labels / f"train.cache.{alive}.tmp"
    stale_npy, live_npy = im / f"0.npy.{dead}.tmp.npy", im / f"1.npy.{alive}.tmp.npy"
    for p in (stale_cache, live_cache, stale_npy, live_npy):
        p.write_bytes(b"half a file")
    other = labels / f"notes.{dead}.tmp"  # not ours: kept
    other.write_bytes(b"x")
    YoloDataset(str(im), DatasetConfig(img_size=64, cache="disk", nc=3), log=lambda s: None)
    assert (labels / "train.cache").is_file() and len(list(im.glob("?.npy"))) == 4
    assert not stale_cache.exists() and not stale_npy.exists()
    assert live_cache.exists() and live_npy.exists() and other.exists()
