"""Diagnosis of the training loader's scaling with worker processes: times the pieces separately.

Parts (--parts, any of):
  faults    fresh-page cost: P processes x T threads each map anonymous (or /dev/shm, MAP_SHARED) memory,
            touch every page with memset and unmap it, for --dur seconds → pages/s in all and us per page
            per thread. All calls go through ctypes, which releases the GIL, so threads really run together.
  items     the dataset's item pipeline without the DataLoader: the parent builds the YoloDataset, forks P
            processes (OpenCV single-threaded, torch 1 thread, as in a loader worker) that each build items
            with T threads for --dur seconds → img/s in all, CPU ms, system ms and minor page faults per image.
  transfer  the DataLoader's transfer path alone: a dataset whose items are ready-made (one copy of a
            3x640x640 uint8 tensor each), our collate, W workers, pin memory as in training → img/s ceiling.
  loader    create_dataloader as bench_dataloader.py uses it, W workers, with variants patched in (see
            VARIANTS): per-batch time spent in the workers building items and collating, and img/s.
Prints one JSON line per measurement. What it found on the 16-core GPU machine: benchmarks/RESULTS.md.

Run: python benchmarks/diag_loader.py --parts faults items transfer loader --workers 8 16 \
         --loader 16:base 16:cold 16:private 16:malloc
"""

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import resource
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a checkout without installing
import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import yolov9c.data.loader as loader_mod  # noqa: E402
from yolov9c.data.dataset import DatasetConfig, YoloDataset  # noqa: E402
from yolov9c.data.dataset_yaml import load_data_config  # noqa: E402
from yolov9c.data.hyp import augment_hyp  # noqa: E402
from yolov9c.data.loader import LoaderConfig  # noqa: E402
from yolov9c.data.synthetic import synthetic_dataset  # noqa: E402

CTX = mp.get_context("fork")
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mmap.restype = ctypes.c_void_p
LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
LIBC.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
LIBC.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
PROT_RW, MAP_PRIVATE, MAP_SHARED, MAP_ANON = 3, 2, 1, 0x20
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3


def emit(**kw):
    print(json.dumps(kw), flush=True)


def run_procs(n, fn, args):
    """Fork n processes running fn(rank, barrier, queue, *args): each waits at the barrier (n parties) to start
    its timed window with the others, and puts one dict; returns the dicts."""
    q = CTX.Queue()
    go = CTX.Barrier(n)
    ps = [CTX.Process(target=fn, args=(r, go, q) + tuple(args)) for r in range(n)]
    for p in ps:
        p.start()
    out = [q.get(timeout=120) for _ in ps]
    for p in ps:
        p.join()
    return out


# ---- faults ---------------------------------------------------------------------------------------------

def _touch_loop(dur, size, shared):
    pages = 0
    t_end = time.perf_counter() + dur
    name = f"/dev/shm/diag_{os.getpid()}_{threading.get_ident()}"
    while time.perf_counter() < t_end:
        fd = -1
        if shared:  # as torch's shared-memory storages: a tmpfs file, MAP_SHARED
            fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o600)
            os.unlink(name)
            os.ftruncate(fd, size)
        addr = LIBC.mmap(None, size, PROT_RW, (MAP_SHARED if shared else MAP_PRIVATE | MAP_ANON), fd, 0)
        LIBC.memset(addr, 1, size)
        LIBC.munmap(addr, size)
        if fd >= 0:
            os.close(fd)
        pages += size // 4096
    return pages


def _fault_proc(rank, go, q, threads, dur, size, shared):
    go.wait()
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        pages = sum(ex.map(lambda _: _touch_loop(dur, size, shared), range(threads)))
    q.put({"pages": pages, "s": time.perf_counter() - t})


def part_faults(args):
    configs = [(False, 1, 1), (False, 8, 1), (False, 16, 1), (False, 8, 2), (False, 1, 16),
               (True, 1, 1), (True, 16, 1), (True, 8, 2)]
    for shared, procs, threads in configs:
        r = run_procs(procs, _fault_proc, (threads, args.dur / 2, 16 << 20, shared))
        pages = sum(x["pages"] for x in r)
        s = max(x["s"] for x in r)
        emit(part="faults", shm=shared, procs=procs, threads=threads, pages_per_s=round(pages / s),
             us_per_page_per_thread=round(s * procs * threads / pages * 1e6, 3),
             gb_per_s=round(pages * 4096 / s / 1e9, 2))


# ---- items ----------------------------------------------------------------------------------------------

def _items_proc(rank, go, q, ds, threads, mode, dur, malloc):
    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    if malloc:
        _tune_malloc()
    ds.item_threads = threads
    pool = ThreadPoolExecutor(1) if mode == "pool" else None
    n_ds = len(ds)

    def chunk(k):  # 8 items with keys of their own
        keys = [((rank * 7919 + k * 8 + i) % n_ds, (0, 0, rank, k * 8 + i), True) for i in range(8)]
        if pool is not None:
            return pool.submit(ds.__getitems__, keys).result()
        return ds.__getitems__(keys)

    chunk(0)  # warm: thread pool, page cache
    go.wait()
    k, n = 1, 0
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    c0 = time.process_time()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < dur:
        n += len(chunk(k))
        k += 1
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    q.put({"n": n, "s": dt, "cpu": time.process_time() - c0, "sys": r1.ru_stime - r0.ru_stime,
           "minflt": r1.ru_minflt - r0.ru_minflt})


def part_items(args, ds):
    configs = [(8, 1, "inline", False), (16, 1, "inline", False), (8, 2, "inline", False), (4, 4, "inline", False),
               (16, 1, "pool", False), (16, 1, "inline", True), (8, 2, "inline", True)]
    for procs, threads, mode, malloc in configs:
        r = run_procs(procs, _items_proc, (ds, threads, mode, args.dur, malloc))
        n = sum(x["n"] for x in r)
        s = max(x["s"] for x in r)
        emit(part="items", procs=procs, threads=threads, mode=mode, malloc_tuned=malloc, img_per_s=round(n / s, 1),
             cpu_ms_per_img=round(sum(x["cpu"] for x in r) / n * 1e3, 2),
             sys_ms_per_img=round(sum(x["sys"] for x in r) / n * 1e3, 2),
             minflt_per_img=round(sum(x["minflt"] for x in r) / n, 1))


# ---- transfer -------------------------------------------------------------------------------------------

class ReadyItems(torch.utils.data.Dataset):
    """Items made in no time: a fresh copy of one 3x640x640 uint8 image and 40 label rows."""

    def __init__(self, n=1 << 24):
        self.n = n  # more items than any measurement takes: one pass, no epoch end
        self.img = torch.randint(0, 255, (3, 640, 640), dtype=torch.uint8)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.img.clone(), torch.zeros(40, 6), "x.jpg", None


def _time_loader(dl, warm, dur):
    it = iter(dl)
    for _ in range(warm):
        next(it)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < dur:
        n += next(it)[0].shape[0]
    return n / (time.perf_counter() - t0)


def part_transfer(args):
    cuda = torch.cuda.is_available()
    for w in args.workers:
        for pin, name in ((cuda, "private"), (cuda, "base"), (False, "base")):
            fn = VARIANTS[name][0]
            dl = torch.utils.data.DataLoader(ReadyItems(), batch_size=64, num_workers=w, collate_fn=fn,
                                             pin_memory=pin, persistent_workers=True)
            rate = _time_loader(dl, 2 * w, args.dur / 2)
            emit(part="transfer", workers=w, pin=pin, collate=name, img_per_s=round(rate, 1))
            del dl


# ---- loader (with variants) -----------------------------------------------------------------------------

def collate_private(batch):
    """The collate before 57eac83: the image batch stacked into a private tensor, which pickling then copies
    into a new shared-memory one."""
    imgs, labels, paths, shapes = zip(*batch)
    for i, lb in enumerate(labels):
        lb[:, 0] = i
    return torch.stack(imgs, 0), torch.cat(labels, 0), paths, shapes


def _tune_malloc():
    # keep freed heap memory in the process instead of giving it back (and faulting it in again)
    LIBC.mallopt(M_MMAP_THRESHOLD, 32 << 20)
    LIBC.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    LIBC.mallopt(M_TOP_PAD, 64 << 20)


def _init_malloc(worker_id, _base=loader_mod._worker_init):
    _base(worker_id)
    _tune_malloc()


VARIANTS = {  # name: (collate, worker_init, cold): cold = a plain DataLoader per epoch, as before 57eac83
    "base": (loader_mod.collate, loader_mod._worker_init, False),
    "private": (collate_private, loader_mod._worker_init, False),
    "malloc": (loader_mod.collate, _init_malloc, False),
    "cold": (loader_mod.collate, loader_mod._worker_init, True),
}

STATS = None  # shared (workers x 4) float64: build s, collate s, batches, minflt during build


def _timed_getitems(self, keys, _orig=YoloDataset.__getitems__):
    info = torch.utils.data.get_worker_info()
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.perf_counter()
    out = _orig(self, keys)
    if info is not None:
        row = STATS[info.id]
        row[0] += time.perf_counter() - t
        row[2] += 1
        row[3] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0
    return out


def _timed(collate_fn):
    def f(batch):
        t = time.perf_counter()
        out = collate_fn(batch)
        info = torch.utils.data.get_worker_info()
        if info is not None:
            STATS[info.id][1] += time.perf_counter() - t
        return out
    return f


def part_loader(args, source, nc):
    global STATS
    YoloDataset.__getitems__ = _timed_getitems
    for config in args.loader:
        w, v = config.split(":")
        w = int(w)
        collate_fn, init, cold = VARIANTS[v]
        STATS = np.frombuffer(CTX.RawArray("d", w * 4), np.float64).reshape(w, 4)
        loader_mod.collate, loader_mod._worker_init = _timed(collate_fn), init
        data = DatasetConfig(augment=True, hyp=augment_hyp(), stride=32, nc=nc, seed=0)
        dl, ds = loader_mod.create_dataloader(source, 640, 64, LoaderConfig(data, workers=w, shuffle=True),
                                              log=lambda s: None)
        if cold:  # one DataLoader pass per epoch: the workers idle at each epoch end
            dl = torch.utils.data.DataLoader(ds, batch_size=64, sampler=dl.sampler, num_workers=w,
                                             pin_memory=dl.pin_memory, collate_fn=loader_mod.collate,
                                             worker_init_fn=init, persistent_workers=True)

        def endless(dl=dl):
            while True:
                yield from dl

        it = endless()
        for _ in range(args.warmup):
            next(it)
        STATS[:] = 0
        t0 = time.perf_counter()
        for _ in range(args.batches):
            next(it)
        dt = time.perf_counter() - t0
        b = STATS[:, 2].sum()
        emit(part="loader", workers=w, threads=ds.item_threads, variant=v, img_per_s=round(args.batches * 64 / dt, 1),
             worker_build_s_per_batch=round(STATS[:, 0].sum() / max(b, 1), 3),
             worker_collate_s_per_batch=round(STATS[:, 1].sum() / max(b, 1), 3),
             worker_minflt_per_img=round(STATS[:, 3].sum() / max(b, 1) / 64, 1),
             batches_built_in_window=int(b), pin=dl.pin_memory)
        del it, dl
    loader_mod.collate, loader_mod._worker_init = VARIANTS["base"][:2]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", nargs="+", default=["faults", "items", "transfer", "loader"])
    ap.add_argument("--workers", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--loader", nargs="+", default=["8:base", "16:base", "16:cold"],
                    help="loader part: WORKERS:VARIANT, variants: " + " ".join(VARIANTS))
    ap.add_argument("--dur", type=float, default=4.0, help="seconds per faults/items/transfer measurement")
    ap.add_argument("--batches", type=int, default=32, help="timed batches of the loader part")
    ap.add_argument("--warmup", type=int, default=16)
    args = ap.parse_args(argv)
    emit(part="machine", cpus=os.cpu_count(), affinity=len(os.sched_getaffinity(0)), torch=torch.__version__,
         opencv=cv2.__version__, cuda=torch.cuda.is_available(), start_method=mp.get_start_method(),
         sharing=torch.multiprocessing.get_sharing_strategy())
    source = nc = ds = None
    if "items" in args.parts or "loader" in args.parts:
        y = synthetic_dataset(seed=0, n_train=512, n_val=0, imgsz=640, boxes=(10, 40), size=(0.03, 0.15), name="bench")
        cfg = load_data_config(y)
        source, nc = cfg["train"], cfg["nc"]
        ds = YoloDataset(source, DatasetConfig(img_size=640, batch_size=64, augment=True, hyp=augment_hyp(), nc=nc),
                         log=lambda s: None)
    for part in args.parts:
        t = time.perf_counter()
        if part == "faults":
            part_faults(args)
        elif part == "items":
            part_items(args, ds)
        elif part == "transfer":
            part_transfer(args)
        elif part == "loader":
            part_loader(args, source, nc)
        emit(part=part, done_s=round(time.perf_counter() - t, 1))


if __name__ == "__main__":
    main()
