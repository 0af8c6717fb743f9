"""--gpu-augment's data path (yolov9c/data/augment_plan.py + the augment op's C reference): the same training
items as the CPU pipeline (yolov9c/data/dataset.py), copy-paste included, batches independent of the worker count
and reproducible by epoch, the paste cap, the loader's checks, a corrupt image, the OOM fallback. (The distribution
check over whole batches is a developer tool's: dev/tests/test_augment_stats.py.)

Tolerances (pixels of whole items against the CPU pipeline; the op's own against OpenCV: tests/ops/test_augment.py):
    labels, shapes, paths          identical (the same draws and the same box code), with copy-paste too
    pixels                         >= 99.9 % of values equal and >= 99.9 % within 1 grey level (bilinear rounding
                                   of OpenCV's warp, amplified by HSV on a few near-grey pixels)
    pixels with copy-paste         the same, and a mean difference <= 0.01 grey level per item (polygon copy of
                                   coco24; the paste is drawContours' fill: only edges leaving the canvas differ)
    over the paste cap             labels identical; pixels >= 99.5 % within 1 level, mean difference <= 0.1
                                   (a 600-value cap: simplified outlines)
Image sizes are multiples of 64 (192, 320): OpenCV's HSV->BGR rounds a row's last width % 64 pixels
differently (tests/ops/test_augment.py), which the op does not copy; 640 training images have none.
Run: python -m pytest -q tests/data/test_augment_plan.py
"""

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
from yolov9c.ops.augment import paste_polygons
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train.results import read_results
from yolov9c.ops import extension

from inprocess import run_script
from repo_assets import COCO24

# scratch-high with every path of the op on: mosaic and letterbox, mixup, rotation, shear, perspective, HSV, both flips
HYP = {"mixup": 0.5, "degrees": 10.0, "shear": 2.0, "perspective": 0.0005, "mosaic": 0.8, "flipud": 0.3}


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


@pytest.fixture(scope="module")
def coco_poly(tmp_path_factory):
    """A polygon copy of the coco24 training images (their labels are boxes): each box becomes a
    16-vertex star inside it (radii 0.6-1 of the half sides at sorted random angles); the images are linked."""
    root = tmp_path_factory.mktemp("coco_poly")
    rng = np.random.default_rng(0)
    (root / "images").mkdir()
    (root / "labels").mkdir()
    for f in sorted((COCO24 / "images" / "train").glob("*.jpg")):
        (root / "images" / f.name).symlink_to(f)
        rows = []
        text = (COCO24 / "labels" / "train" / f"{f.stem}.txt").read_text()  # empty for a background image
        for c, xc, yc, w, h in np.array([r.split() for r in text.splitlines() if r.strip()], float).reshape(-1, 5):
            a, r = np.sort(rng.uniform(0, 2 * np.pi, 16)), rng.uniform(0.6, 1.0, 16)
            q = np.clip(np.stack((xc + w / 2 * r * np.cos(a), yc + h / 2 * r * np.sin(a)), 1), 0, 1)
            rows.append(" ".join([str(int(c))] + [f"{v:.6f}" for v in q.ravel()]))
        (root / "labels" / f"{f.stem}.txt").write_text("\n".join(rows) + "\n")
    return str(root / "images")


def _count(images):
    """The number of images in a folder (item keys index them)."""
    return len(list(Path(images).glob("*.jpg")))


def _items(source, imgsz, keys, hyp, cache=None):
    """(the CPU pipeline's items, the PlannedBatch of the same keys)."""
    ds = YoloDataset(source, DatasetConfig(img_size=imgsz, augment=True, hyp=hyp, cache=cache, label_cache=False),
                     log=_quiet)
    ref = [ds[k] for k in keys]
    ds.plan_items = True
    return ref, plan_collate([ds[k] for k in keys])


def _compare(ref, batch, equal_min=0.999, within1_min=0.999, mean_max=None):
    """Labels, paths and shapes identical; each item's pixels within the bounds. Returns the batch's shapes."""
    imgs, labels, paths, shapes = BatchAssembler("cpu")(batch)
    for b, (img, lab, path, shape) in enumerate(ref):
        assert torch.equal(labels[labels[:, 0] == b][:, 1:], lab[:, 1:]), f"item {b}: labels differ"
        assert path == paths[b] and shape == shapes[b]
        d = (imgs[b].int() - img.int()).abs()
        equal, within1, mean = (d == 0).float().mean().item(), (d <= 1).float().mean().item(), d.float().mean().item()
        assert equal >= equal_min and within1 >= within1_min and (mean_max is None or mean <= mean_max), \
            f"item {b}: equal {equal:.6f}, within 1 {within1:.6f}, mean difference {mean:.4f}"
    return shapes


def _compare_items(source, imgsz, keys, hyp, cache=None):
    return _compare(*_items(source, imgsz, keys, hyp, cache))


def test_items_match_the_cpu_pipeline_coco24():
    keys = [(i, (0, 1, 0, i), True) for i in range(10)]
    shapes = _compare_items(str(COCO24 / "images" / "train"), 320, keys, _hyp())
    assert any(s is None for s in shapes) and any(s is not None for s in shapes)  # mosaic and letterbox both seen


@pytest.mark.parametrize("cache", [None, "ram"])
def test_items_match_the_cpu_pipeline_synthetic(syn, cache):
    keys = [(i % 16, (5, 2, 0, i), i % 5 != 0) for i in range(12)]  # some with close-mosaic
    _compare_items(syn["train"], 192, keys, _hyp(mixup=0.8), cache)


def test_polygon_boxes_match_without_copy_paste(syn_poly):
    keys = [(i, (1, 0, 0, i), True) for i in range(8)]
    _compare_items(syn_poly["train"], 192, keys, _hyp(copy_paste=0.0, degrees=20.0))


@pytest.mark.parametrize("p", [1.0, 0.3])
def test_copy_paste_items_match_the_cpu_pipeline(coco_poly, p):
    """Copy-paste with probability p (mosaic and mixup layers): the same labels as the CPU pipeline, and
    pixels within the bounds, which a plan without its pastes misses by far."""
    keys = [(i % _count(coco_poly), (0, 1, 0, i), True) for i in range(16)]
    ref, batch = _items(coco_poly, 320, keys, _hyp(copy_paste=p))
    assert batch.paste[:, :, 0].sum() >= 10 and (batch.paste[:, 1, 0] > 0).any()  # pasted, mixup layers too
    _compare(ref, batch, mean_max=0.01)
    batch.paste.zero_()
    with pytest.raises(AssertionError, match="mean difference"):
        _compare(ref, batch, mean_max=0.01)


def test_synthetic_polygons_copy_paste_match(syn_poly):
    keys = [(i % 12, (7, 0, 0, i), True) for i in range(8)]
    ref, batch = _items(syn_poly["train"], 192, keys, _hyp(copy_paste=1.0, mixup=0.5))
    assert batch.paste[:, :, 0].sum() >= 4
    _compare(ref, batch, mean_max=0.01)


def test_more_polygons_than_the_cap(coco_poly, monkeypatch):
    """A 600-value cap (PASTE_CAP is 8192): the longest lists get simplified outlines, every list fits,
    labels stay identical and pixels stay close."""
    keys = [(i % _count(coco_poly), (0, 1, 0, i), True) for i in range(16)]
    full = _items(coco_poly, 320, keys, _hyp(copy_paste=1.0))[1].paste
    monkeypatch.setattr(augment_plan, "PASTE_CAP", 600)
    ref, batch = _items(coco_poly, 320, keys, _hyp(copy_paste=1.0))
    assert batch.paste.shape[2] <= 600 < full.shape[2]
    _compare(ref, batch, equal_min=0.0, within1_min=0.995, mean_max=0.1)


def test_paste_list_simplifies_then_cuts_beyond_the_cap():
    rng = np.random.default_rng(1)
    a = np.linspace(0, 2 * np.pi, 40, endpoint=False)
    polys = []
    for _ in range(50):
        c, r = rng.uniform(100, 500, 2), rng.uniform(20, 60)
        q = (c + r * rng.uniform(0.8, 1, (40, 1)) * np.stack((np.cos(a), np.sin(a)), 1)).astype(np.int32)
        polys.append((q, (*q.min(0).tolist(), *(q.max(0) + 1).tolist())))
    raw = augment_plan.paste_list(polys, 639, cap=10 ** 6)
    assert len(raw) == 2 + 50 * (5 + 80) and raw[0] == 50 and raw[1] == 639
    small = augment_plan.paste_list(polys, 639, cap=1000)
    m, kept = paste_polygons(small)
    assert len(small) <= 1000 and m == 639 and len(kept) == 50  # simplified: every polygon still pasted
    for (q, r), (q0, r0) in zip(kept, polys):
        assert r == r0 and 3 <= len(q) < 40 and {tuple(v) for v in q} <= {tuple(v) for v in q0}
    tiny = augment_plan.paste_list(polys, 639, cap=40)
    assert len(tiny) <= 40 and tiny[0] == 3  # still over at 64 px: the polygons past the cap are cut


@pytest.mark.parametrize("which", ["coco24", "polygons"])
def test_cut_sources_give_the_same_bytes_as_whole_ones(which, coco_poly, monkeypatch):
    """ItemPlan.add_layer sends only the canvas region the output can sample (augment_plan.reach), widened to
    the sources of the pastes landing in it: the batch equals, byte for byte, the one built from the whole
    tiles and every paste, with far fewer source bytes."""
    hyp = _hyp(scale=0.9, degrees=30.0, perspective=0.001, copy_paste=1.0)
    source = str(COCO24 / "images" / "train") if which == "coco24" else coco_poly
    ds = YoloDataset(source, DatasetConfig(img_size=320, augment=True, hyp=hyp, label_cache=False), log=_quiet)
    ds.plan_items = True
    keys = [(i, (2, 0, 0, i), True) for i in range(8)]
    cut = plan_collate([ds[k] for k in keys])
    monkeypatch.setattr(augment_plan, "reach", lambda inv, hw: (-(1 << 40), -(1 << 40), 1 << 40, 1 << 40))
    whole = plan_collate([ds[k] for k in keys])
    assert len(cut.src) < 0.8 * len(whole.src)
    assert (which == "coco24") == (whole.paste[:, :, 0].sum() == 0)
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


@pytest.mark.parametrize("which", ["boxes", "copy-paste"])
def test_batches_do_not_depend_on_workers_and_replay_by_epoch(which, syn, syn_poly):
    source, kw = (syn["train"], {}) if which == "boxes" else (syn_poly["train"], {"copy_paste": 1.0})
    a = _take(_loader(source, **kw)[0])
    b = _take(_loader(source, workers=2, **kw)[0])
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and x[2] == y[2] for x, y in zip(a, b))
    assert all(x[0].shape == (4, 3, 192, 192) and x[0].dtype == torch.uint8 for x in a)
    cpu = _take(_loader(source, device=None, **kw)[0])  # the CPU pipeline: same images, same labels
    assert all(torch.equal(x[1], y[1]) and x[2] == y[2] for x, y in zip(a, cpu))
    resumed, _ = _loader(source, **kw)  # a resumed run starts at epoch 1: the same batches as the first run's
    resumed.sampler.set_epoch(1)
    r = _take(resumed, epochs=1)
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(r, a[2:]))
    assert not torch.equal(a[0][0], a[2][0])


def test_loader_refuses_what_the_op_does_not_do(syn, syn_poly):
    with pytest.raises(ValueError, match="--gpu-augment does not support --rect"):
        data = DatasetConfig(augment=True, hyp=_hyp(), rect=True, nc=8)
        create_dataloader(syn["train"], 160, 4, LoaderConfig(data, augment_device="cpu"), log=_quiet)
    for p in (0.0, 0.5):  # polygons with and without copy-paste: both planned
        loader, ds = _loader(syn_poly["train"], copy_paste=p)
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


@pytest.mark.cuda
def test_pinned_batch_keeps_its_contents():
    if not torch.cuda.is_available():
        pytest.skip("pinning needs CUDA")
    plan = augment_plan.ItemPlan((8, 8))
    plan.add_layer(0, [(np.zeros((8, 8, 3), np.uint8), (0, 0, 8, 8), (0, 0))], np.eye(3))
    b = plan_collate([(plan, torch.zeros(0, 6), "x", None)]).pin_memory()
    assert b.src.is_pinned() and b.paste.is_pinned() and b.hw == (8, 8)


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and extension.load().build_info()["cuda"]),
                    reason="needs a CUDA GPU and a CUDA build of yolov9c._C")
def test_cuda_assembles_copy_paste_batches_as_the_c_reference(coco_poly):
    keys = [(i % _count(coco_poly), (0, 2, 0, i), True) for i in range(12)]
    _, batch = _items(coco_poly, 320, keys, _hyp(copy_paste=1.0))
    assert batch.paste[:, :, 0].sum() >= 10
    assert torch.equal(BatchAssembler("cuda:0")(batch.pin_memory())[0].cpu(), BatchAssembler("cpu")(batch)[0])


def test_train_dual_with_gpu_augment_trains_like_the_cpu_pipeline(syn, gelan_mini, tmp_path, monkeypatch):
    """train_dual.py --gpu-augment on the CPU (the C reference assembles the batches): the same run as without
    it, mosaic epoch then close-mosaic epoch, to within the 1-grey-level pixel differences: train losses
    within 2 %."""
    monkeypatch.chdir(tmp_path)
    data = str(Path(syn["train"][0]).parents[1] / "data.yaml")
    losses = []
    for name, extra in (("cpu", []), ("op", ["--gpu-augment"])):
        r = run_script(Path(__file__).resolve().parents[2] / "train_dual.py", "--data", data, "--cfg", gelan_mini,
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
