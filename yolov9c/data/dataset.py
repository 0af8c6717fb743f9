"""YoloDataset: a split of a YOLO dataset as a torch Dataset — scan, filters, rect shapes, caching and the
per-item pipeline of the published loader (utils/dataloaders.py).

Per augmenting item: with probability hyp mosaic (while `self.mosaic`; close-mosaic turns it off) a 4-image
mosaic + copy-paste + perspective (mosaic.py), then maybe mixup (mixup.py); otherwise letterbox (up-scaling
only when augmenting) + perspective; then labels -> normalised xywh clipped, HSV, flips. Without augmentation
only the letterbox. Always HWC BGR -> CHW RGB uint8 (chw.py). With `plan_items` (--gpu-augment) an augmenting
item is the plan of the same draws and the augment op makes the pixels (augment_plan.py).
Returns (img uint8 (3, H, W), labels float32 (n, 6) [0, cls, xc, yc, w, h] normalised (collate fills column 0),
path str, shapes): shapes = ((h0, w0), ((h / h0, w / w0), (padw, padh))) for letterboxed items (validation maps
boxes back with it), None for mosaics.
Randomness: every draw comes from a numpy Generator seeded by the item's key (index, seed words, mosaic flag)
from the sampler (loader.py), so batches depend on seed and epoch only, not on the worker count. A plain int
index uses the key (seed, index) and `self.mosaic`.
Test: python -m pytest -q tests/data/test_dataset.py
"""

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from yolov9c.data.chw import to_chw_rgb
from yolov9c.data.image_cache import cache_images, resize_long_side
from yolov9c.data.image_list import ImageListError, collect_image_files, ignored_images_line
from yolov9c.data.images import jpeg_reduction, read_image
from yolov9c.data.rect import rect_batch_shapes, rect_order
from yolov9c.data.scan import scan_split
from yolov9c.geometry import xywhn_to_xyxy, xyxy_to_xywhn


class DataError(ValueError):
    """A split that cannot be used (no usable image, no labels for training)."""


@dataclass
class DatasetConfig:
    """Every option of one split's YoloDataset (create_dataloader sets img_size and batch_size from its arguments)."""
    img_size: int = 640  # the long side in pixels, a multiple of stride
    batch_size: int = 16  # rect grouping: the images that share one rect shape
    augment: bool = False  # the training pipeline (mosaic, mixup, perspective, HSV, flips)
    hyp: dict | None = None  # the augmentation keys (hyp.py); None with augment: augment_hyp()'s defaults
    rect: bool = False  # rectangular batches (off with image_weights, as published)
    image_weights: bool = False  # draw images by class-frequency weights (the loader's sampler draws them)
    cache: str | None = None  # image cache: None, 'ram', 'disk', 'val'… (image_cache.py)
    single_cls: bool = False  # every class → 0
    stride: int = 32  # the model's largest stride (rect shapes are multiples of it)
    pad: float = 0.0  # rect padding in strides (validation: 0.5)
    min_items: int = 0  # drop the images with fewer labels (--min-items)
    prefix: str = ""  # starts every log line and error message ('train: ', 'val: ')
    nc: int | None = None  # class count for the class < nc check (None: no check)
    seed: int = 0  # base of every item's random draws
    label_cache: bool = True  # read/write the `*.cache` label cache beside the labels


class YoloDataset(torch.utils.data.Dataset):
    """One split. sources: folder(s) / .txt list(s) / images (as in the dataset yaml, resolved); cfg: a
    DatasetConfig (None: its defaults); log: a print-like callable (lines of the scan)."""

    def __init__(self, sources, cfg=None, log=print):
        cfg = cfg or DatasetConfig()
        prefix, nc, min_items = cfg.prefix, cfg.nc, cfg.min_items
        self.img_size = int(cfg.img_size)
        self.augment = bool(cfg.augment)
        self.hyp = cfg.hyp
        if self.augment and cfg.hyp is None:
            from yolov9c.data.hyp import augment_hyp

            self.hyp = augment_hyp()
        self.image_weights = bool(cfg.image_weights)
        self.rect = False if self.image_weights else bool(cfg.rect)
        self.mosaic = self.augment and not self.rect  # close-mosaic sets this False
        self.stride = int(cfg.stride)
        self.seed = int(cfg.seed)
        self.prefix = prefix
        self.nc = nc

        ignored = []
        try:
            files = collect_image_files(sources, ignored)
        except (FileNotFoundError, ImageListError) as e:
            raise DataError(f"{prefix}{e}") from None
        if ignored:
            log(f"{prefix}{ignored_images_line(ignored)}")
        # --single-cls makes every class 0, so no class id is out of range (published: no check then)
        scan = scan_split(files, None if cfg.single_cls else nc, sources=sources, use_cache=cfg.label_cache, log=log,
                          prefix=prefix)
        if scan.n_images == 0:
            raise DataError(f"{prefix}no usable images in {sources}")
        if self.augment and scan.n_images == scan.n_backgrounds:
            raise DataError(f"{prefix}no labels found in {sources}: cannot train")
        self.scan = scan
        self.im_files = list(scan.im_files)
        self.label_files = list(scan.label_files)
        self.shapes = np.asarray(scan.shapes, np.int64).reshape(-1, 2)  # (h, w) upright originals
        self.labels = [lb.copy() for lb in scan.labels]
        self.segments = [list(s) for s in scan.segments]

        if min_items:
            keep = [i for i, lb in enumerate(self.labels) if len(lb) >= min_items]
            log(f"{prefix}{len(self.labels) - len(keep)}/{len(self.labels)} images dropped by --min-items "
                f"{min_items}")
            self._select(keep)
            if not self.im_files:
                raise DataError(f"{prefix}no image has >= {min_items} labels (--min-items)")
        if cfg.single_cls:
            for lb in self.labels:
                lb[:, 0] = 0

        n = len(self.im_files)
        self.batch_index = None
        self.batch_shapes = None
        if self.rect:
            order = rect_order(self.shapes)
            self._select(order.tolist())
            self.batch_index, self.batch_shapes = rect_batch_shapes(self.shapes, cfg.batch_size, self.img_size,
                                                                    self.stride, cfg.pad)
        self.ims = [None] * n  # RAM cache
        self.im_hw0 = [None] * n
        self.im_hw = [None] * n
        self.npy_files = [None] * n  # disk cache
        self.item_threads = 1  # threads per process building a batch's items (loader.py sets it)
        self.plan_items = False  # --gpu-augment: items are augment plans (data/augment_plan.py; loader.py sets it)
        self._pool = None
        self._pool_pid = None
        self.cache = cache_images(self, cfg.cache, log=log, prefix=prefix)

    def _select(self, idx):
        self.im_files = [self.im_files[i] for i in idx]
        self.label_files = [self.label_files[i] for i in idx]
        self.shapes = self.shapes[np.asarray(idx, np.int64)].reshape(-1, 2)
        self.labels = [self.labels[i] for i in idx]
        self.segments = [self.segments[i] for i in idx]

    def __len__(self):
        return len(self.im_files)

    def load_image(self, i):
        """Image i resized so its long side is img_size → (img (h, w, 3) uint8 BGR, (h0, w0), (h, w)).
        The RAM-cached array itself is returned: callers must not modify it in place."""
        im = self.ims[i]
        if im is not None:
            return im, self.im_hw0[i], self.im_hw[i]
        npy = self.npy_files[i]
        if npy is not None:
            try:
                return resize_long_side(np.load(npy, allow_pickle=False), self.img_size, self.augment)
            except (OSError, ValueError):  # checked at start (image_cache.npy_problem), damaged since: the image
                self.npy_files[i] = None
        hw0 = tuple(int(v) for v in self.shapes[i])
        # Validation: a JPEG at least twice the target size is decoded at 1/2, 1/4 or 1/8 scale (libjpeg DCT
        # scaling), close to the published full decode + INTER_AREA. Training: the published full decode +
        # INTER_LINEAR, whose aliasing on large photos is part of the images the model learns from; a reduced
        # decode gives smoother images (30 % less Laplacian energy at 4x; docs/fidelity.md).
        k = 1 if self.augment else jpeg_reduction(max(hw0), self.img_size)
        return resize_long_side(read_image(self.im_files[i], k), self.img_size, self.augment, hw0)

    def __getitem__(self, key):
        if isinstance(key, (tuple, list)):
            index, seed_words, mosaic_on = key
        else:
            index, seed_words, mosaic_on = int(key), (self.seed, int(key)), self.mosaic
        rng = np.random.default_rng(list(seed_words))
        if self.plan_items and self.augment:  # --gpu-augment: the same draws, the pixels left to the augment op
            from yolov9c.data.augment_plan import plan_item

            return plan_item(self, index, rng, mosaic_on)
        hyp = self.hyp
        shapes = None
        if self.augment and mosaic_on and rng.random() < hyp["mosaic"]:
            from yolov9c.data.mixup import mixup
            from yolov9c.data.mosaic import load_mosaic

            img, labels, _ = load_mosaic(index, len(self), self.load_image, self.labels, self.segments,
                                         self.img_size, rng, hyp)
            if rng.random() < hyp["mixup"]:
                j = int(rng.integers(len(self)))
                img2, labels2, _ = load_mosaic(j, len(self), self.load_image, self.labels, self.segments,
                                               self.img_size, rng, hyp)
                img, labels = mixup(img, labels, img2, labels2, rng)
        else:
            from yolov9c.data.letterbox import letterbox

            img, (h0, w0), (h, w) = self.load_image(index)
            shape = tuple(self.batch_shapes[self.batch_index[index]]) if self.rect else self.img_size
            img, ratio, pad = letterbox(img, shape, auto=False, scaleup=self.augment)
            shapes = (h0, w0), ((h / h0, w / w0), pad)
            lab = self.labels[index]
            labels = np.zeros((len(lab), 5), np.float32)
            if len(lab):
                labels[:, 0] = lab[:, 0]
                labels[:, 1:] = xywhn_to_xyxy(lab[:, 1:], ratio[0] * w, ratio[1] * h, pad[0], pad[1])
            if self.augment:
                from yolov9c.data.perspective import random_perspective

                img, labels, _ = random_perspective(img, labels, [], rng, degrees=hyp["degrees"],
                                                    translate=hyp["translate"], scale=hyp["scale"],
                                                    shear=hyp["shear"], perspective=hyp["perspective"])
        labels = np.asarray(labels, np.float32).reshape(-1, 5)
        if len(labels):
            labels[:, 1:] = xyxy_to_xywhn(labels[:, 1:], img.shape[1], img.shape[0])
        if self.augment:
            from yolov9c.data.flip import random_flip
            from yolov9c.data.hsv import augment_hsv

            augment_hsv(img, rng, hgain=hyp["hsv_h"], sgain=hyp["hsv_s"], vgain=hyp["hsv_v"])
            img, labels = random_flip(img, labels, rng, flipud=hyp["flipud"], fliplr=hyp["fliplr"])
        out = torch.zeros((len(labels), 6), dtype=torch.float32)
        if len(labels):
            out[:, 1:] = torch.from_numpy(np.ascontiguousarray(labels))
        return torch.from_numpy(to_chw_rgb(img)), out, self.im_files[index], shapes

    def __getitems__(self, keys):
        """The items of one batch (torch's fetcher calls this when it exists). With item_threads > 1 they
        are built by a thread pool of this process: OpenCV's decode, warp, colour and split calls release
        the GIL, so one loader worker keeps several cores busy. Every item draws from its own Generator,
        so the result does not depend on the thread count."""
        if self.item_threads <= 1 or len(keys) < 2:
            return [self[k] for k in keys]
        if self._pool is None or self._pool_pid != os.getpid():  # a worker process builds its own pool
            self._pool = ThreadPoolExecutor(self.item_threads)
            self._pool_pid = os.getpid()
        return list(self._pool.map(self.__getitem__, keys))

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_pool"] = None  # thread pools do not cross process boundaries
        state["_pool_pid"] = None
        return state

    @property
    def n_boxes(self):
        return int(sum(len(lb) for lb in self.labels))

