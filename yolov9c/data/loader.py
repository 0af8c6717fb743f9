"""The training/validation DataLoader: worker count, seeded and reproducible sampling, DDP, collate.

create_dataloader(path, imgsz, batch_size, cfg=LoaderConfig(...)) -> (RepeatingLoader, YoloDataset).
- workers = min(cpu_count // #GPUs, batch (0 when batch is 1), --workers), persistent, as published; the batch
  sampler is an endless stream of epochs (like the published InfiniteDataLoader) so workers never idle at an
  epoch end; batches built ahead with a stale state (close-mosaic, new image weights, another epoch) are dropped,
  so the batches are exactly those of a cold start.
- ItemSampler yields item keys (index, seed words, mosaic flag); order from (seed, epoch), draws from (seed,
  epoch, position): same seed -> same batches with any worker count; DDP ranks' k-th batches together equal
  the single-process k-th batch (tests/engine/train/test_train_ddp.py).
- item_threads per worker (YOLOV9C_LOADER_THREADS overrides); results do not depend on it.
- collate: images uint8 (B, 3, H, W) RGB; labels float32 (N, 6) [batch index, cls, xc, yc, w, h] normalised;
  paths, shapes. Unequal sizes (padded end of a DDP rect epoch) are padded with 114 bottom/right.
- --gpu-augment: workers hand decoded images + plans (augment_plan.py); the augment op assembles each batch.
Test: python -m pytest -q tests/data/test_loader.py
"""

import os
import signal
from dataclasses import dataclass, field, replace

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from yolov9c.data.augment_plan import BatchAssembler, plan_collate
from yolov9c.data.dataset import DatasetConfig, YoloDataset
from yolov9c.data.image_weights import image_weights as compute_image_weights


class ItemSampler(Sampler):
    """Yields (index, (seed, epoch, 0, position), mosaic) keys for YoloDataset.__getitem__.

    The order of an epoch is torch's DistributedSampler's (seeded permutation, padded to a multiple of
    world_size, rank r takes positions r, r + world_size, ...), also in a single process (one replica);
    `position` is the item's place in that whole order, so an item's random draws do not depend on the
    number of ranks. (The third word is always 0: it keeps a seed's draws unchanged.)
    weights: None, or (n,) per-image weights; when set, each epoch draws n indices with replacement with
    these probabilities (--image-weights; the trainer may assign new weights between epochs)."""

    def __init__(self, dataset, shuffle=False, seed=0, rank=-1, world_size=1, weights=None):
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = int(seed) & 0xFFFFFFFF
        self.rank = max(int(rank), 0)
        self.world_size = int(world_size)
        self.weights = weights
        self.epoch = 0
        # one replica in a single process too: the same permutation as the ranks of a DDP run share
        self.inner = DistributedSampler(dataset, num_replicas=max(self.world_size, 1), rank=self.rank,
                                        shuffle=self.shuffle, seed=self.seed)

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    def __len__(self):
        return len(self.inner)

    def order(self, epoch):
        """Dataset indices of `epoch` for this rank (list of int)."""
        n = len(self.dataset)
        if self.weights is not None:
            p = np.asarray(self.weights, np.float64)
            if p.sum() <= 0:
                raise ValueError("image weights sum to 0")
            g = np.random.default_rng([self.seed, epoch, 0x1A6E])
            return g.choice(n, n, replace=True, p=p / p.sum()).tolist()
        self.inner.set_epoch(epoch)
        return list(self.inner)

    def keys(self, epoch):
        """The item keys of `epoch` for this rank, with the mosaic flag and image weights as they are now."""
        order = self.order(epoch)
        mosaic = bool(self.dataset.mosaic)
        words = (self.seed, epoch & 0xFFFFFFFF, 0)
        # the j-th item of rank r is at place r + j * world_size of the whole epoch's order (image weights:
        # single process only, so place = j)
        w = max(self.world_size, 1)
        return [(i, words + (self.rank + j * w,), mosaic) for j, i in enumerate(order)]

    def state(self):
        """What an epoch's keys depend on besides its number: (mosaic flag, copy of the weights or None)."""
        w = None if self.weights is None else np.array(self.weights, np.float64)
        return bool(self.dataset.mosaic), w

    def __iter__(self):
        epoch = self.epoch
        self.epoch += 1
        return iter(self.keys(epoch))


def _same_state(a, b):
    return a[0] == b[0] and ((a[1] is None and b[1] is None) or
                             (a[1] is not None and b[1] is not None and np.array_equal(a[1], b[1])))


class EpochStream(Sampler):
    """Batch sampler of the RepeatingLoader: lists of at most batch_size keys of epochs start, start + 1, …
    without end (the last batch of an epoch may be short, as with drop_last off). len() is the number of
    batches of one epoch. `states[e]` records the ItemSampler state epoch e's keys were made with."""

    def __init__(self, sampler, batch_size):
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.start = 0
        self.states = {}

    def __len__(self):
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        epoch = self.start
        while True:
            self.states[epoch] = self.sampler.state()
            keys = self.sampler.keys(epoch)
            for k in range(0, len(keys), self.batch_size):
                yield keys[k:k + self.batch_size]
            epoch += 1


class RepeatingLoader:
    """Iterating gives one epoch of batches (len(self) of them) from a DataLoader whose workers keep
    building the next epoch's batches meanwhile. Same batches as a plain DataLoader over `sampler`.

    Attributes as the DataLoader's that callers use: sampler (the ItemSampler: set_epoch, weights),
    batch_size, num_workers, pin_memory, persistent_workers, dataset; `loader` is the DataLoader."""

    def __init__(self, dataset, batch_size, sampler, num_workers=0, **kw):
        self.dataset = dataset
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.stream = EpochStream(sampler, batch_size)
        self.loader = DataLoader(dataset, batch_sampler=self.stream, num_workers=num_workers,
                                 persistent_workers=num_workers > 0, **kw)
        self.num_workers = self.loader.num_workers
        self.pin_memory = self.loader.pin_memory
        self.persistent_workers = self.loader.persistent_workers
        self._it = None
        self._next = None  # (epoch, batch) the stream hands out next; None: unknown (a pass in progress)
        self.assemble = None  # --gpu-augment: a BatchAssembler making each planned batch's pixels (augment op)

    def __len__(self):
        return len(self.stream)

    def __iter__(self):
        epoch = self.sampler.epoch
        self.sampler.epoch = epoch + 1  # as ItemSampler.__iter__: each pass advances the epoch
        for e in [e for e in self.stream.states if e < epoch]:  # epochs handed out already
            del self.stream.states[e]
        made = self.stream.states.get(epoch)  # None: the stream has not reached this epoch yet
        if self._it is None or self._next != (epoch, 0) or (made is not None and
                                                            not _same_state(made, self.sampler.state())):
            # restart the stream at `epoch`; with workers, DataLoader.__iter__ resets the persistent ones
            # (their batches in flight are dropped)
            self.stream.start = epoch
            self.stream.states.clear()
            self._it = iter(self.loader)
        self._next = None
        return self._epoch(epoch)

    def close(self):
        """Stop the workers now (their prefetched batches of the next epochs are dropped), rather than when
        the interpreter exits. Iterating again starts them anew."""
        it, self._it, self._next = self._it, None, None
        shutdown = getattr(it, "_shutdown_workers", None)  # torch's multi-process iterator; None without workers
        if shutdown is not None:
            shutdown()
            self.loader._iterator = None  # the DataLoader keeps its persistent iterator: a new one next time

    def _epoch(self, epoch):
        n = len(self)
        for k in range(n):
            batch = next(self._it)
            self._next = (epoch, k + 1) if k + 1 < n else (epoch + 1, 0)
            yield batch if self.assemble is None else self.assemble(batch)


def close_loader(loader):
    """Stop a loader's workers now (a RepeatingLoader's persistent ones; a plain DataLoader's stop with its
    iterator; None: nothing)."""
    if isinstance(loader, RepeatingLoader):
        loader.close()


def collate(batch):
    """List of dataset items → (imgs uint8 (B, 3, H, W), labels float32 (N, 6) with the image index in
    column 0, paths tuple, shapes tuple). In a loader worker the images are stacked straight into shared
    memory, as torch's default_collate does: a private tensor would be copied into shared memory again when
    the batch is sent (one more 78 MB copy per 64 × 640² batch)."""
    imgs, labels, paths, shapes = zip(*batch)
    for i, lb in enumerate(labels):
        lb[:, 0] = i
    hs = {im.shape[1] for im in imgs}
    ws = {im.shape[2] for im in imgs}
    if len(hs) > 1 or len(ws) > 1:
        H, W = max(hs), max(ws)
        padded = []
        for im, lb in zip(imgs, labels):
            h, w = im.shape[1:]
            out = torch.full((3, H, W), 114, dtype=torch.uint8)
            out[:, :h, :w] = im
            padded.append(out)
            lb[:, [2, 4]] *= w / W  # normalised x, w of the unpadded image → of the padded one
            lb[:, [3, 5]] *= h / H
        imgs = padded
    out = None
    if torch.utils.data.get_worker_info() is not None:
        out = torch.empty((len(imgs),) + tuple(imgs[0].shape), dtype=torch.uint8).share_memory_()
    return torch.stack(imgs, 0, out=out), torch.cat(labels, 0), paths, shapes


def _worker_init(worker_id):
    # the global RNGs, for any code that uses them (ours does not); OpenCV single-threaded in each worker,
    # so that W workers use W cores, not W × cores threads
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    import random

    random.seed(seed)
    cv2.setNumThreads(0)
    if callable(signal.getsignal(signal.SIGTERM)):  # the training process stops on SIGTERM (cli.train.stop_on_signals)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # and stops its workers: a group's SIGTERM kills none first


def _pin_default():
    return str(os.getenv("PIN_MEMORY", "true")).lower() == "true"


@dataclass
class LoaderConfig:
    """The options of one create_dataloader call: the dataset's (data) and the loader's own."""
    data: DatasetConfig = field(default_factory=DatasetConfig)  # img_size, batch_size: create_dataloader's own
    rank: int = -1  # DDP rank of this process (-1: no DDP)
    world_size: int = 1  # DDP processes (1: no DDP)
    workers: int = 8  # at most this many loader workers (also capped by cores per GPU and the batch size)
    shuffle: bool = False  # a new seeded order each epoch (off with data.rect, with a message)
    pin_memory: bool | None = None  # pinned batches when CUDA is available (None: PIN_MEMORY, default true)
    persistent_workers: bool = True  # workers run on across epoch ends (RepeatingLoader); False: restarted each pass
    augment_device: str | None = None  # --gpu-augment: 'cpu' or 'cuda:N' assembles the augmented batches with the
    #                                    augment op (workers only decode and draw); None: the CPU pipeline


def create_dataloader(path, imgsz, batch_size, cfg=None, log=print):
    """Build (loader, dataset) for split `path` (sources as in load_data_config's train/val lists) with
    images of long side `imgsz` in batches of `batch_size` per rank, as `cfg` (a LoaderConfig; None: its
    defaults) says. cfg.data's img_size and batch_size come from the arguments (the dataset gets imgsz, and
    rect shapes grouped by batch_size × world_size): left at their defaults or equal to those, else a
    ValueError. rect forces shuffle off (with a message); image_weights is single process only. Raises
    DataError for an unusable split, ValueError for image weights under DDP."""
    cfg = cfg or LoaderConfig()
    data, world_size, shuffle = cfg.data, cfg.world_size, cfg.shuffle
    group = batch_size * max(world_size, 1)  # under DDP a rank takes every world_size-th image
    for name, arg, value in (("img_size", "imgsz", imgsz), ("batch_size", "batch_size", group)):
        own = getattr(data, name)
        if own != getattr(DatasetConfig, name) and own != value:
            raise ValueError(f"create_dataloader: cfg.data.{name}={own} conflicts with its {arg} argument "
                             f"({value}); {arg} sets it, leave cfg.data.{name} at its default")
    if data.rect and shuffle:
        log(f"{data.prefix}--rect is incompatible with DataLoader shuffle, setting shuffle=False")
        shuffle = False
    if data.image_weights and world_size > 1:
        raise ValueError("--image-weights is not supported with DDP (as in the published code)")
    dataset = YoloDataset(path, replace(data, img_size=imgsz, batch_size=group), log=log)
    batch_size = min(batch_size, len(dataset))
    nd = torch.cuda.device_count()
    nw = min((os.cpu_count() or 1) // max(nd, 1), batch_size if batch_size > 1 else 0, cfg.workers)
    weights = None
    if dataset.image_weights:
        weights = compute_image_weights(dataset.labels, data.nc if data.nc is not None else _max_class(dataset) + 1)
    # idle cores at --workers below the core count: each worker builds its batch's items with threads
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    env = os.getenv("YOLOV9C_LOADER_THREADS")
    if env:
        if not env.strip().isdigit():  # int()'s own message would not name the variable
            raise ValueError(f"YOLOV9C_LOADER_THREADS={env!r}: must be a number of threads such as 2 (or unset it)")
        dataset.item_threads = max(1, int(env))
    elif nw > 0:
        dataset.item_threads = max(1, min(4, cpus // (nw * max(world_size, 1))))
    collate_fn = collate
    if cfg.augment_device is not None and data.augment:
        _check_gpu_augment(dataset, cfg)
        dataset.plan_items = True
        collate_fn = plan_collate
    sampler = ItemSampler(dataset, shuffle=shuffle, seed=data.seed, rank=cfg.rank, world_size=world_size,
                          weights=weights)
    pin = _pin_default() if cfg.pin_memory is None else bool(cfg.pin_memory)
    g = torch.Generator()
    g.manual_seed(6148914691236517205 + data.seed)
    if cfg.persistent_workers or nw == 0:
        loader = RepeatingLoader(dataset, batch_size, sampler, num_workers=nw,
                                 pin_memory=pin and torch.cuda.is_available(), collate_fn=collate_fn,
                                 worker_init_fn=_worker_init, generator=g)
        if dataset.plan_items:
            loader.assemble = BatchAssembler(cfg.augment_device, log=log)
            log(f"{data.prefix}--gpu-augment: workers decode and draw, the augment op makes the pixels on "
                f"{cfg.augment_device}")
    else:  # workers started for each pass: nothing can run on across epoch ends
        if dataset.plan_items:
            raise ValueError("--gpu-augment needs the persistent loader (LoaderConfig.persistent_workers=True)")
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=nw,
                            pin_memory=pin and torch.cuda.is_available(), collate_fn=collate,
                            worker_init_fn=_worker_init, generator=g, persistent_workers=False)
    return loader, dataset


def _check_gpu_augment(dataset, cfg):
    """What --gpu-augment cannot do yet (rect batches): ValueError saying what to change."""
    if dataset.rect:
        raise ValueError("--gpu-augment does not support --rect training batches: drop one of them")


def _max_class(dataset):
    m = [int(lb[:, 0].max()) for lb in dataset.labels if len(lb)]
    return max(m) if m else 0
