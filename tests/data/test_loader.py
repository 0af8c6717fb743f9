"""The loader (yolov9c/data/loader.py): reproducible batches (same seed → same batches, with or without
workers), collate format, DDP partition, image weights, close-mosaic reaching persistent workers, workers
running on across epoch ends with the same batches as a cold start, pin memory, multi-scale sizes.

Run: python -m pytest -q tests/data/test_loader.py
"""

import dataclasses
import inspect
import multiprocessing

import numpy as np
import pytest
import torch

from yolov9c.data.dataset_yaml import load_data_config
from yolov9c.data.hyp import augment_hyp
from yolov9c.data.image_weights import class_weights, image_weights
from yolov9c.data.dataset import DatasetConfig, YoloDataset
from yolov9c.data.loader import ItemSampler, LoaderConfig, close_loader, collate, create_dataloader
from yolov9c.data.multi_scale import multi_scale, multi_scale_size
from yolov9c.data.synthetic import synthetic_dataset


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    y = synthetic_dataset(seed=2, root=tmp_path_factory.mktemp("syn"), n_train=24, n_val=8, imgsz=128)
    return load_data_config(y)


def _quiet(s):
    pass


def _batches(cfg, n=3, seed=7, workers=0):
    data = DatasetConfig(augment=True, hyp=augment_hyp(), seed=seed, nc=8)
    loader, ds = create_dataloader(cfg["train"], 128, 4, LoaderConfig(data, shuffle=True, workers=workers), log=_quiet)
    out = []
    for epoch in range(2):
        for k, (imgs, labels, paths, shapes) in enumerate(loader):
            if k == n:
                break
            out.append((epoch, imgs.clone(), labels.clone(), paths))
    return out, loader, ds


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x[1], y[1]) and torch.equal(x[2], y[2]) and x[3] == y[3]
                                    for x, y in zip(a, b))


# the keyword defaults of YoloDataset(...) and create_dataloader(path, imgsz, batch_size, ...) before their options
# moved into DatasetConfig and LoaderConfig: an old keyword is now a field of the same name and default
OLD_DATASET_DEFAULTS = dict(img_size=640, batch_size=16, augment=False, hyp=None, rect=False, image_weights=False,
                            cache=None, single_cls=False, stride=32, pad=0.0, min_items=0, prefix="", nc=None, seed=0,
                            label_cache=True)
OLD_LOADER_DEFAULTS = dict(stride=32, single_cls=False, hyp=None, augment=False, cache=None, pad=0.0, rect=False,
                           rank=-1, world_size=1, workers=8, image_weights=False, min_items=0, prefix="",
                           shuffle=False, seed=0, pin_memory=None, persistent_workers=True, nc=None, label_cache=True)
NEW_LOADER_FIELDS = {"augment_device"}  # options added since (no old keyword)


def test_options_keep_the_old_keyword_names_and_defaults():
    assert dataclasses.asdict(DatasetConfig()) == OLD_DATASET_DEFAULTS
    assert DatasetConfig(**OLD_DATASET_DEFAULTS) == DatasetConfig()
    own = {f.name for f in dataclasses.fields(LoaderConfig)} - {"data"} - NEW_LOADER_FIELDS
    # each old create_dataloader keyword is in exactly one place (imgsz, batch_size stay arguments)
    assert not own & set(OLD_DATASET_DEFAULTS)
    assert own | set(OLD_DATASET_DEFAULTS) == set(OLD_LOADER_DEFAULTS) | {"img_size", "batch_size"}
    cfg = LoaderConfig()
    for k, v in OLD_LOADER_DEFAULTS.items():
        assert getattr(cfg if k in own else cfg.data, k) == v, k
    assert LoaderConfig(DatasetConfig(), **{k: OLD_LOADER_DEFAULTS[k] for k in own}) == cfg
    assert LoaderConfig().data is not cfg.data  # a fresh DatasetConfig each, never a shared default
    # the shape: no argument lists of 20
    assert list(inspect.signature(create_dataloader).parameters) == ["path", "imgsz", "batch_size", "cfg", "log"]
    assert list(inspect.signature(YoloDataset).parameters) == ["sources", "cfg", "log"]


def test_dataset_size_fields_conflicting_with_the_arguments_are_refused(cfg):
    """imgsz and batch_size are create_dataloader's arguments; a cfg.data.img_size / batch_size that says
    otherwise is an error (not silently replaced); equal to the argument, it is accepted."""
    split = cfg["train"]
    with pytest.raises(ValueError, match=r"cfg.data.img_size=320 conflicts with its imgsz argument \(64\)"):
        create_dataloader(split, 64, 2, LoaderConfig(DatasetConfig(img_size=320), workers=0), log=lambda *a: None)
    with pytest.raises(ValueError, match="cfg.data.batch_size=5 conflicts with its batch_size argument"):
        create_dataloader(split, 64, 2, LoaderConfig(DatasetConfig(batch_size=5), workers=0), log=lambda *a: None)
    loader, ds = create_dataloader(split, 64, 2, LoaderConfig(DatasetConfig(img_size=64, batch_size=2), workers=0),
                                   log=lambda *a: None)
    assert ds.img_size == 64
    close_loader(loader)


def test_collate_format(cfg):
    batches, loader, ds = _batches(cfg, n=2)
    _, imgs, labels, paths = batches[0]
    assert imgs.dtype == torch.uint8 and imgs.shape == (4, 3, 128, 128)
    assert labels.dtype == torch.float32 and labels.shape[1] == 6 and len(paths) == 4
    assert set(labels[:, 0].long().tolist()) <= {0, 1, 2, 3}
    assert ((labels[:, 1] >= 0) & (labels[:, 1] < 8)).all()
    assert ((labels[:, 2:] >= 0) & (labels[:, 2:] <= 1)).all()
    assert (labels[:, 0].diff() >= 0).all()  # rows grouped by image, in order


def test_same_seed_same_batches_any_workers(cfg, monkeypatch):
    a, _, _ = _batches(cfg)
    b, _, _ = _batches(cfg)
    c, _, _ = _batches(cfg, workers=2)
    assert _same(a, b) and _same(a, c)
    monkeypatch.setenv("YOLOV9C_LOADER_THREADS", "3")  # items of a batch built by 3 threads per worker
    t, _, ds = _batches(cfg, workers=1)
    assert ds.item_threads == 3 and _same(a, t)
    d, _, _ = _batches(cfg, seed=8)
    assert not _same(a, d)
    # epochs differ from each other (order and augmentation)
    e0 = [x for x in a if x[0] == 0]
    e1 = [x for x in a if x[0] == 1]
    assert not torch.equal(e0[0][1], e1[0][1])


def test_a_bad_loader_threads_variable_names_itself(cfg, monkeypatch):
    monkeypatch.setenv("YOLOV9C_LOADER_THREADS", "abc")
    data = DatasetConfig(augment=False, nc=8)
    with pytest.raises(ValueError, match=r"^YOLOV9C_LOADER_THREADS='abc': must be a number of threads"):
        create_dataloader(cfg["train"], 64, 4, LoaderConfig(data, workers=0), log=_quiet)


def test_set_epoch_replays_an_epoch(cfg):
    data = DatasetConfig(augment=True, hyp=augment_hyp(), seed=1, nc=8)
    loader, _ = create_dataloader(cfg["train"], 128, 4, LoaderConfig(data, shuffle=True, workers=0), log=_quiet)
    loader.sampler.set_epoch(5)
    first = next(iter(loader))
    loader.sampler.set_epoch(5)
    again = next(iter(loader))
    assert torch.equal(first[0], again[0]) and first[2] == again[2]


def test_close_mosaic_reaches_persistent_workers(cfg):
    data = DatasetConfig(augment=True, hyp=augment_hyp(), nc=8)
    loader, ds = create_dataloader(cfg["train"], 128, 4, LoaderConfig(data, shuffle=True, workers=2), log=_quiet)
    assert loader.num_workers == 2 and loader.persistent_workers
    shapes = [s for _, _, _, ss in loader for s in ss]
    assert all(s is None for s in shapes)  # hyp mosaic 1.0: every item is a mosaic
    ds.mosaic = False  # what train_dual does at epoch == epochs - close_mosaic
    shapes = [s for _, _, _, ss in loader for s in ss]
    assert all(s is not None for s in shapes)  # the same (persistent) workers now letterbox


def _script(cfg, workers):
    """Batches of a run of passes that changes the loader's state between (and inside) epochs."""
    data = DatasetConfig(augment=True, hyp=augment_hyp(), seed=4, nc=8)
    loader, ds = create_dataloader(cfg["train"], 128, 4, LoaderConfig(data, shuffle=True, workers=workers),
                                   log=_quiet)
    out, ahead = [], []

    def take(n=None):
        for k, (imgs, labels, paths, _) in enumerate(loader):
            if k == n:
                break
            out.append((imgs.clone(), labels.clone(), paths))
        ahead.append(sorted(loader.stream.states) if workers else [])

    take()  # epoch 0
    take()  # epoch 1
    ds.mosaic = False  # close-mosaic
    take()  # epoch 2
    ds.mosaic = True
    loader.sampler.set_epoch(1)  # replay epoch 1, left after 2 batches
    take(2)
    loader.sampler.weights = np.arange(len(ds), dtype=np.float64)  # new image weights
    take()  # epoch 2 again, weighted
    take()  # epoch 3, same weights
    return out, ahead, len(loader)


def test_workers_run_across_epochs_same_batches(cfg, monkeypatch):
    a, _, nb = _script(cfg, 0)
    b, ahead, _ = _script(cfg, 2)
    monkeypatch.setenv("YOLOV9C_LOADER_THREADS", "2")
    c, _, _ = _script(cfg, 1)
    assert len(a) == 5 * nb + 2
    for x, y, z in zip(a, b, c):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and x[2] == y[2]
        assert torch.equal(x[0], z[0]) and torch.equal(x[1], z[1]) and x[2] == z[2]
    assert ahead[0] == [0, 1]  # by the end of epoch 0 the workers had been given epoch 1's batches
    assert ahead[-1] == [3, 4]


def test_ddp_ranks_partition_the_epoch(cfg):
    seen = []
    for rank in range(2):
        ddp = LoaderConfig(DatasetConfig(augment=False, seed=3, nc=8), rank=rank, world_size=2, workers=0,
                           shuffle=True)
        loader, _ = create_dataloader(cfg["train"], 128, 4, ddp, log=_quiet)
        assert isinstance(loader.sampler.inner, torch.utils.data.DistributedSampler)
        assert len(loader.sampler) == 12
        seen.append([p for _, _, paths, _ in loader for p in paths])
    assert not set(seen[0]) & set(seen[1]) and len(set(seen[0]) | set(seen[1])) == 24
    with pytest.raises(ValueError, match="image-weights"):
        create_dataloader(cfg["train"], 128, 4, LoaderConfig(DatasetConfig(image_weights=True, nc=8), rank=0,
                                                             world_size=2), log=_quiet)


def test_image_weights(cfg):
    labels = [np.array([[0, .5, .5, .1, .1]] * 3, np.float32), np.array([[1, .5, .5, .1, .1]], np.float32),
              np.zeros((0, 5), np.float32)]
    cw = class_weights(labels, 3)
    np.testing.assert_allclose(cw, np.array([1 / 3, 1, 1]) / (1 / 3 + 2))  # unseen class counts as 1
    np.testing.assert_allclose(image_weights(labels, 3, cw), [3 * cw[0], cw[1], 0])
    loader, ds = create_dataloader(cfg["train"], 128, 4, LoaderConfig(DatasetConfig(image_weights=True, nc=8),
                                                                      workers=0), log=_quiet)
    assert not ds.rect and loader.sampler.weights is not None
    # the trainer may set new weights: all the mass on image 5 → every draw is image 5
    w = np.zeros(len(ds))
    w[5] = 1
    loader.sampler.weights = w
    paths = [p for _, _, ps, _ in loader for p in ps]
    assert len(paths) == len(ds) and set(paths) == {ds.im_files[5]}


def test_rect_loader_batches_and_shuffle_off(cfg, tmp_path):
    lines = []
    data = DatasetConfig(rect=True, pad=0.5, nc=8)
    loader, ds = create_dataloader(cfg["val"], 128, 4, LoaderConfig(data, shuffle=True, workers=0), log=lines.append)
    assert any("shuffle=False" in ln for ln in lines) and not loader.sampler.shuffle
    shapes = [tuple(b[0].shape[2:]) for b in loader]
    assert shapes == [(160, 160), (160, 160)]  # square 128 images, pad 0.5: ceil(4 + 0.5) * 32


def test_collate_pads_mixed_shapes():
    a = (torch.full((3, 32, 64), 7, dtype=torch.uint8), torch.tensor([[0, 1, .5, .5, .5, .5]]), "a", None)
    b = (torch.full((3, 64, 32), 9, dtype=torch.uint8), torch.tensor([[0, 2, .5, .5, 1., 1.]]), "b", None)
    imgs, labels, paths, _ = collate([a, b])
    assert imgs.shape == (2, 3, 64, 64) and paths == ("a", "b")
    assert (imgs[0, :, 32:] == 114).all() and (imgs[1, :, :, 32:] == 114).all()
    # the same pixels in normalised coordinates of the padded image
    assert labels.tolist() == [[0, 1, .5, .25, .5, .25], [1, 2, .25, .5, .5, 1.]]


def test_pin_memory_and_workers(cfg, monkeypatch):
    data = DatasetConfig(nc=8)
    loader, _ = create_dataloader(cfg["val"], 128, 1, LoaderConfig(data, workers=8, pin_memory=True), log=_quiet)
    assert loader.num_workers == 0  # batch 1 → no workers (published)
    assert loader.pin_memory == torch.cuda.is_available()
    loader, _ = create_dataloader(cfg["val"], 128, 4, LoaderConfig(data, workers=8, pin_memory=False), log=_quiet)
    assert not loader.pin_memory
    assert loader.num_workers == min(8, 4, (__import__("os").cpu_count() or 1) // max(torch.cuda.device_count(), 1))
    monkeypatch.setenv("PIN_MEMORY", "false")
    loader, _ = create_dataloader(cfg["val"], 128, 4, LoaderConfig(data, workers=0), log=_quiet)
    assert not loader.pin_memory


def test_sampler_keys(cfg):
    data = DatasetConfig(augment=True, hyp=augment_hyp(), seed=9, nc=8)
    loader, ds = create_dataloader(cfg["train"], 128, 4, LoaderConfig(data, shuffle=False, workers=0), log=_quiet)
    s = ItemSampler(ds, shuffle=False, seed=9)
    keys = list(iter(s))
    assert [k[0] for k in keys] == list(range(len(ds)))
    assert keys[3] == (3, (9, 0, 0, 3), True)
    assert list(iter(s))[3][1] == (9, 1, 0, 3)  # next pass: epoch 1


def test_multi_scale():
    rng = np.random.default_rng(0)
    sizes = {multi_scale_size(640, 32, rng) for _ in range(400)}
    assert min(sizes) == 320 and max(sizes) == 960 and all(s % 32 == 0 for s in sizes)
    imgs = torch.rand(2, 3, 640, 480)
    rng = np.random.default_rng(1)
    out = multi_scale(imgs, 640, 32, rng)
    sz = multi_scale_size(640, 32, np.random.default_rng(1))
    assert max(out.shape[2:]) == sz and all(x % 32 == 0 for x in out.shape[2:])
    assert out.shape[2] / out.shape[3] == pytest.approx(640 / 480, rel=0.1)


def test_chw_conversion_of_views():
    from yolov9c.data.chw import to_chw_rgb

    img = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    for v in (img, img[::-1], img[:, ::-1], img[::-1, ::-1], img[5:20, 3:40], img[::2]):
        out = to_chw_rgb(v)
        assert out.shape == (3,) + v.shape[:2] and out.flags.c_contiguous
        assert np.array_equal(out, np.ascontiguousarray(v.transpose(2, 0, 1)[::-1]))


def test_close_stops_the_workers_and_a_new_pass_gives_the_same_batches(cfg):
    data = DatasetConfig(augment=True, hyp=augment_hyp(), seed=7, nc=8)
    loader, _ = create_dataloader(cfg["train"], 128, 4, LoaderConfig(data, shuffle=True, workers=2), log=_quiet)
    before = set(multiprocessing.active_children())
    first = [imgs.clone() for imgs, *_ in loader]  # epoch 0; the workers go on building epoch 1
    workers = [w for w in multiprocessing.active_children() if w not in before]
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    close_loader(loader)
    for w in workers:
        w.join(timeout=10)
    assert not any(w.is_alive() for w in workers)
    loader.sampler.set_epoch(0)
    again = [imgs.clone() for imgs, *_ in loader]  # new workers, the same epoch 0
    close_loader(loader)
    close_loader(None)
    assert len(first) == len(again) and all(torch.equal(a, b) for a, b in zip(first, again))


def test_workers_leave_sigterm_to_a_training_process_that_handles_it():
    """_worker_init ignores SIGTERM when the process it was forked from handles it (cli.train.stop_on_signals):
    a scheduler's SIGTERM to the whole group then stops the run through its Ctrl-C path, which stops the workers,
    instead of killing them first; with the default disposition the worker keeps it."""
    import subprocess
    import sys

    code = ("import signal; from yolov9c.data.loader import _worker_init\n"
            "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, end=' '); _worker_init(0)\n"
            "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, end=' ')\n"
            "signal.signal(signal.SIGTERM, lambda *a: None); _worker_init(0)\n"
            "print(signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["True", "True", "True"], (r.stdout, r.stderr)
