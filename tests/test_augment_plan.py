"""--gpu-augment's data path (yolov9c/data/augment_plan.py + the augment op's C reference): the same training
items as the CPU pipeline (yolov9c/data/dataset.py), batches independent of the worker count and reproducible
by epoch, the loader's checks, a corrupt image, the OOM fallback, and the distribution check.

Tolerances (pixels of whole items against the CPU pipeline; the op's own against OpenCV: tests/test_augment.py):
    labels, shapes, paths          identical (the same draws and the same box code)
    pixels                         >= 99.9 % of values equal and >= 99.9 % within 1 grey level (bilinear rounding
                                   of OpenCV's warp, amplified by HSV on a few near-grey pixels)
    distribution (stats.py)        box statistics identical; every pixel statistic |z| < 0.5
Image sizes are multiples of 64 (192, 320): OpenCV's HSV->BGR rounds a row's last width % 64 pixels
differently (tests/test_augment.py), which the op does not copy; 640 training images have none.
Run: python -m pytest -q tests/test_augment_plan.py
"""

import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from yolov9c.data import augment_plan
from yolov9c.data.augment_plan import BatchAssembler, plan_collate
from yolov9c.data.dataset import DatasetConfig, YoloDataset
from yolov9c.data.dataset_yaml import load_data_config
from yolov9c.data.hyp import augment_hyp
from yolov9c.data.loader import LoaderConfig, create_dataloader
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train.results import read_results

from inprocess import run_script  # noqa: E402
from shared_paths import COCO128  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "fidelity"))
import augment_stats  # noqa: E402

# every path of the op: mosaic and letterbox, mixup, rotation, shear, perspective, HSV, both flips
HYP = dict(augment_stats.HYP_OVERRIDES, flipud=0.3)


def _quiet(*a):
    pass


def _hyp(**kw):
    h = augment_hyp()
    h.update(HYP)
    h.update(kw)
    return h


@pytest.fixture(scope="module")
def syn(tmp_path_factory):
    return load_data_config(synthetic_dataset(seed=3, root=tmp_path_factory.mktemp("syn"), n_train=16, n_val=4,
                                              imgsz=160))


@pytest.fixture(scope="module")
def syn_poly(tmp_path_factory):
    return load_data_config(synthetic_dataset(seed=4, root=tmp_path_factory.mktemp("poly"), n_train=12, n_val=4,
                                              imgsz=160, polygons=True))


def _compare_items(source, imgsz, keys, hyp, cache=None):
    ds = YoloDataset(source, DatasetConfig(img_size=imgsz, augment=True, hyp=hyp, cache=cache, label_cache=False),
                     log=_quiet)
    ref = [ds[k] for k in keys]
    ds.plan_items = True
    imgs, labels, paths, shapes = BatchAssembler("cpu")(plan_collate([ds[k] for k in keys]))
    for b, (img, lab, path, shape) in enumerate(ref):
        assert torch.equal(labels[labels[:, 0] == b][:, 1:], lab[:, 1:]), f"item {b}: labels differ"
        assert path == paths[b] and shape == shapes[b]
        d = (imgs[b].int() - img.int()).abs()
        equal, within1 = (d == 0).float().mean().item(), (d <= 1).float().mean().item()
        assert equal >= 0.999 and within1 >= 0.999, f"item {b}: equal {equal:.6f}, within 1 {within1:.6f}"
    return shapes


def test_items_match_the_cpu_pipeline_coco128():
    keys = [(i, (0, 1, 0, i), True) for i in range(10)]
    shapes = _compare_items(str(COCO128 / "images" / "train"), 320, keys, _hyp())
    assert any(s is None for s in shapes) and any(s is not None for s in shapes)  # mosaic and letterbox both seen


@pytest.mark.parametrize("cache", [None, "ram"])
def test_items_match_the_cpu_pipeline_synthetic(syn, cache):
    keys = [(i % 16, (5, 2, 0, i), i % 5 != 0) for i in range(12)]  # some with close-mosaic
    _compare_items(syn["train"], 192, keys, _hyp(mixup=0.8), cache)


def test_polygon_boxes_match_without_copy_paste(syn_poly):
    keys = [(i, (1, 0, 0, i), True) for i in range(8)]
    _compare_items(syn_poly["train"], 192, keys, _hyp(copy_paste=0.0, degrees=20.0))


def test_cut_sources_give_the_same_bytes_as_whole_ones(monkeypatch):
    """ItemPlan.add_layer sends only the canvas region the output can sample (augment_plan.reach): the batch
    equals, byte for byte, the one built from the whole tiles, with far fewer source bytes."""
    hyp = _hyp(scale=0.9, degrees=30.0, perspective=0.001)
    ds = YoloDataset(str(COCO128 / "images" / "train"), DatasetConfig(img_size=320, augment=True, hyp=hyp,
                                                                      label_cache=False), log=_quiet)
    ds.plan_items = True
    keys = [(i, (2, 0, 0, i), True) for i in range(8)]
    cut = plan_collate([ds[k] for k in keys])
    monkeypatch.setattr(augment_plan, "reach", lambda inv, hw: (-(1 << 40), -(1 << 40), 1 << 40, 1 << 40))
    whole = plan_collate([ds[k] for k in keys])
    assert len(cut.src) < 0.8 * len(whole.src)
    assert torch.equal(BatchAssembler("cpu")(cut)[0], BatchAssembler("cpu")(whole)[0])


def test_reach_holds_every_bilinear_neighbour():
    rng = np.random.default_rng(0)
    H, W = 48, 40
    ys, xs = np.mgrid[0:H, 0:W]
    for _ in range(50):
        M = np.eye(3)
        M[:2, :2] = rng.uniform(-1.5, 1.5, (2, 2)) + np.eye(2)
        M[:2, 2] = rng.uniform(-50, 50, 2)
        M[2, :2] = rng.uniform(-2e-3, 2e-3, 2)
        inv = np.linalg.inv(M)
        p = inv @ np.stack([xs.ravel(), ys.ravel(), np.ones(xs.size)])
        if (p[2] <= 0).any():
            continue
        u, v = np.floor(p[0] / p[2]), np.floor(p[1] / p[2])
        x1, y1, x2, y2 = augment_plan.reach(inv.astype(np.float32).astype(np.float64), (H, W))
        assert x1 <= u.min() and u.max() + 1 < x2 and y1 <= v.min() and v.max() + 1 < y2


def _loader(source, workers=0, device="cpu", seed=3, **kw):
    data = DatasetConfig(augment=True, hyp=_hyp(**kw), seed=seed, nc=8)
    cfg = LoaderConfig(data, shuffle=True, workers=workers, pin_memory=False, augment_device=device)
    return create_dataloader(source, 192, 4, cfg, log=_quiet)


def _take(loader, n=2, epochs=2):
    out = []
    for _ in range(epochs):
        for k, (imgs, labels, paths, shapes) in enumerate(loader):
            if k == n:
                break
            out.append((imgs.clone(), labels.clone(), paths))
    loader.close()
    return out


def test_batches_do_not_depend_on_workers_and_replay_by_epoch(syn):
    a = _take(_loader(syn["train"])[0])
    b = _take(_loader(syn["train"], workers=2)[0])
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and x[2] == y[2] for x, y in zip(a, b))
    assert all(x[0].shape == (4, 3, 192, 192) and x[0].dtype == torch.uint8 for x in a)
    cpu = _take(_loader(syn["train"], device=None)[0])  # the CPU pipeline: same images, same labels
    assert all(torch.equal(x[1], y[1]) and x[2] == y[2] for x, y in zip(a, cpu))
    resumed, _ = _loader(syn["train"])  # a resumed run starts at epoch 1: the same batches as the first run's
    resumed.sampler.set_epoch(1)
    r = _take(resumed, epochs=1)
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(r, a[2:]))
    assert not torch.equal(a[0][0], a[2][0])


def test_loader_refuses_what_the_op_does_not_do(syn, syn_poly):
    with pytest.raises(ValueError, match="--gpu-augment does not support --rect"):
        data = DatasetConfig(augment=True, hyp=_hyp(), rect=True, nc=8)
        create_dataloader(syn["train"], 160, 4, LoaderConfig(data, augment_device="cpu"), log=_quiet)
    with pytest.raises(ValueError, match="copy-paste"):
        _loader(syn_poly["train"], copy_paste=0.5)
    loader, ds = _loader(syn_poly["train"], copy_paste=0.0)  # polygons without copy-paste: fine
    assert ds.plan_items and loader.assemble is not None
    loader, ds = _loader(syn["train"], device=None)
    assert not ds.plan_items and loader.assemble is None  # off by default


def test_a_corrupt_image_is_reported_and_skipped(syn, tmp_path):
    im, lb = tmp_path / "images", tmp_path / "labels"
    im.mkdir()
    lb.mkdir()
    src = Path(syn["train"][0])
    for f in sorted(src.glob("*.jpg"))[:6]:
        (im / f.name).write_bytes(f.read_bytes())
        (lb / f"{f.stem}.txt").write_text((src.parent.parent / "labels" / "train" / f"{f.stem}.txt").read_text())
    (im / "bad.jpg").write_bytes(b"\xff\xd8\xff broken")
    (lb / "bad.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    lines = []
    data = DatasetConfig(augment=True, hyp=_hyp(), nc=8, label_cache=False)
    loader, ds = create_dataloader(str(im), 192, 4, LoaderConfig(data, shuffle=True, workers=0, pin_memory=False,
                                                                 augment_device="cpu"), log=lines.append)
    assert any("corrupt" in ln for ln in lines) and len(ds) == 6
    for imgs, labels, paths, _ in loader:
        assert imgs.shape[1:] == (3, 192, 192) and all("bad" not in p for p in paths)


def test_out_of_gpu_memory_falls_back_to_the_cpu(syn, monkeypatch):
    ds = YoloDataset(syn["train"], DatasetConfig(img_size=192, augment=True, hyp=_hyp(), label_cache=False),
                     log=_quiet)
    ds.plan_items = True
    batch = plan_collate([ds[(i, (0, 0, 0, i), True)] for i in range(3)])
    want = BatchAssembler("cpu")(batch)[0]
    lines = []
    asm = BatchAssembler("cuda:0", log=lines.append)

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(augment_plan.torch.Tensor, "to", oom)
    for _ in range(2):
        imgs, labels, paths, shapes = asm(batch)
        assert imgs.device.type == "cpu" and torch.equal(imgs, want)
    assert len(lines) == 1 and "out of GPU memory" in lines[0]


def test_pinned_batch_keeps_its_contents():
    if not torch.cuda.is_available():
        pytest.skip("pinning needs CUDA")
    plan = augment_plan.ItemPlan((8, 8))
    plan.add_layer(0, [(np.zeros((8, 8, 3), np.uint8), (0, 0, 8, 8), (0, 0))], np.eye(3))
    b = plan_collate([(plan, torch.zeros(0, 6), "x", None)]).pin_memory()
    assert b.src.is_pinned() and b.hw == (8, 8)


@pytest.mark.parametrize("which", ["coco128", "synthetic"])
def test_distribution_matches_the_cpu_pipeline(which, syn):
    source = str(COCO128 / "images" / "train") if which == "coco128" else syn["train"]
    rows = augment_stats.compare(source, imgsz=192 if which == "synthetic" else 320, batches=2, batch_size=8)
    names = {r[0] for r in rows}
    assert {"boxes_per_image", "box_side_px", "pixel_mean_R", "pixel_std_B", "grey_share", "sharpness",
            "mosaic_rate", "hist_cls"} <= names
    for metric, ours, cpu, z, kind in rows:
        if kind == "tv":
            assert z == 0.0, f"{metric}: histograms differ (distance {z})"
        elif metric in ("boxes_per_image", "empty_images", "box_side_px", "mosaic_rate"):
            assert ours == cpu, f"{metric}: {ours} vs {cpu}"
        else:
            assert abs(z) < 0.5, f"{metric}: {ours} vs {cpu}, z {z}"


def test_train_dual_with_gpu_augment_trains_like_the_cpu_pipeline(syn, tmp_path, monkeypatch):
    """train_dual.py --gpu-augment on the CPU (the C reference assembles the batches): the same run as without
    it, mosaic epoch then close-mosaic epoch, to within the 1-grey-level pixel differences: train losses
    within 2 %."""
    monkeypatch.chdir(tmp_path)
    data = str(Path(syn["train"][0]).parents[1] / "data.yaml")
    losses = []
    for name, extra in (("cpu", []), ("op", ["--gpu-augment"])):
        r = run_script(Path(__file__).resolve().parents[1] / "train_dual.py", "--data", data, "--cfg", "gelan-t.yaml",
                       "--img", "64", "--batch", "8", "--epochs", "2", "--close-mosaic", "1", "--workers", "0",
                       "--noval", "--nosave", "--noplots", "--project", str(tmp_path / "runs"), "--name", name,
                       *extra)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert ("--gpu-augment: workers decode and draw, the augment op makes the pixels on cpu" in r.stdout) == \
            (name == "op")
        res = read_results(tmp_path / "runs" / name / "results.csv")
        losses.append(np.array([res[f"train/{k}_loss"].tolist() for k in ("box", "cls", "dfl")]))
    assert np.all(losses[0] > 0) and np.allclose(losses[1], losses[0], rtol=0.02), losses


def test_the_flag_is_off_by_default_and_says_why():
    from yolov9c.cli.train import build_parser, parse_opt

    assert parse_opt([]).gpu_augment is False and parse_opt(["--gpu-augment"]).gpu_augment is True
    assert parse_opt(["--gpu-augment", "--no-gpu-augment"]).gpu_augment is False
    text = " ".join(build_parser("train_dual.py").format_help().split())
    assert "Default off: on for CUDA only once its GPU benchmark and distribution check pass" in text
