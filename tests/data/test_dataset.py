"""YoloDataset (yolov9c/data/dataset.py): boxes follow pixels through the whole per-item pipeline, rect
batch shapes, min-items, single-cls, close-mosaic, hyp overrides, item format, and the counts of the committed
COCO subset (tests/assets/coco24).

Run: python -m pytest -q tests/data/test_dataset.py
"""


import cv2
import numpy as np
import pytest
import torch

from yolov9c.data.dataset import DataError, DatasetConfig, YoloDataset
from yolov9c.data.hyp import augment_hyp
from yolov9c.data.rect import rect_batch_shapes

from repo_assets import COCO24  # noqa: E402
HUES = (0, 30, 60, 90, 120, 150)  # OpenCV hue of class c = HUES[c]


def _colour(c):
    return cv2.cvtColor(np.uint8([[[HUES[c], 255, 230]]]), cv2.COLOR_HSV2BGR)[0, 0].tolist()


def _boxes_dataset(root, n=8, seed=0, polygons=False):
    """Images of various sizes, grey (114, no saturation) with 3 filled rectangles of distinct classes;
    class c has hue HUES[c]. Labels are exactly the rectangles (as 4-point polygons with `polygons`)."""
    rng = np.random.default_rng(seed)
    im, lb = root / "images", root / "labels"
    im.mkdir(parents=True)
    lb.mkdir(parents=True)
    for i in range(n):
        h, w = int(rng.integers(120, 240)), int(rng.integers(120, 240))
        img = np.full((h, w, 3), 114, np.uint8)
        rows = []
        classes = rng.permutation(len(HUES))[:3]
        for k, c in enumerate(classes):
            # three non-overlapping vertical bands
            x1 = int(k * w / 3 + rng.integers(2, 8))
            x2 = int((k + 1) * w / 3 - rng.integers(2, 8))
            y1 = int(rng.integers(2, h // 2))
            y2 = int(rng.integers(y1 + 12, h - 2))
            img[y1:y2, x1:x2] = _colour(int(c))
            if polygons:
                rows.append(f"{c} " + " ".join(f"{x / w:.6f} {y / h:.6f}"
                                               for x, y in ((x1, y1), (x2, y1), (x2, y2), (x1, y2))))
            else:
                rows.append(f"{c} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} "
                            f"{(y2 - y1) / h:.6f}")
        cv2.imwrite(str(im / f"{i}.png"), img)
        (lb / f"{i}.txt").write_text("\n".join(rows) + "\n")
    return im


def _class_masks(img_chw):
    """CHW RGB uint8 tensor → {class: bool mask (H, W)} of pixels of that class's hue."""
    rgb = img_chw.permute(1, 2, 0).numpy()
    hsv = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2HSV).astype(int)
    sat = (hsv[..., 1] > 40) & (hsv[..., 2] > 40)  # the grey background and border have 0
    out = {}
    for c, hue in enumerate(HUES):
        d = np.abs(hsv[..., 0] - hue)
        out[c] = sat & (np.minimum(d, 180 - d) <= 7)
    return out


def _check_boxes_follow_pixels(img, labels, tol=3):
    """Every box is tight around pixels of its class; returns (uncovered, total) class pixel counts."""
    H, W = img.shape[1:]
    masks = _class_masks(img)
    covered = {c: np.zeros((H, W), bool) for c in masks}
    assert labels.shape[1] == 6 and (labels[:, 2:] >= 0).all() and (labels[:, 2:] <= 1).all()
    rows = labels.tolist()
    px = [((xc - w / 2) * W, (yc - h / 2) * H, (xc + w / 2) * W, (yc + h / 2) * H) for _, _, xc, yc, w, h in rows]
    for j, (_, c, xc, yc, w, h) in enumerate(rows):
        c = int(c)
        x1, y1, x2, y2 = px[j]
        # another box over this one: a copy-paste object (pasted where it covers < 30 % of every box, as
        # published) may hide part of it, so its visible pixels need not reach the box's edges
        occluded = any(k != j and min(x2, q[2]) > max(x1, q[0]) and min(y2, q[3]) > max(y1, q[1])
                       for k, q in enumerate(px))
        X1, Y1 = max(int(np.floor(x1)) - tol, 0), max(int(np.floor(y1)) - tol, 0)
        X2, Y2 = min(int(np.ceil(x2)) + tol, W), min(int(np.ceil(y2)) + tol, H)
        covered[c][Y1:Y2, X1:X2] = True
        m = masks[c]
        ys, xs = np.nonzero(m[Y1:Y2, X1:X2])
        assert len(ys), f"box of class {c} holds none of its pixels"
        if x1 < 1 or y1 < 1 or x2 > W - 1 or y2 > H - 1 or occluded:
            # cut by the border: a rotated box is clipped as published (its warped corners' bounds,
            # then clipped), which may leave it loose along the cut edge
            continue
        # tight: the class's pixels inside the box reach each of its four edges
        assert abs(xs.min() + X1 - x1) <= tol + 1 and abs(xs.max() + 1 + X1 - x2) <= tol + 1
        assert abs(ys.min() + Y1 - y1) <= tol + 1 and abs(ys.max() + 1 + Y1 - y2) <= tol + 1
    uncovered = sum(int((masks[c] & ~covered[c]).sum()) for c in masks)
    total = sum(int(m.sum()) for m in masks.values())
    return uncovered, total


def _hyp(**kw):
    hyp = augment_hyp(None, mixup=0.0)  # mixup blends colours: tested on its own (test_data_augment.py)
    hyp.update(degrees=8.0, shear=3.0, flipud=0.5, copy_paste=0.0)
    hyp.update(kw)
    return hyp


@pytest.mark.parametrize("mosaic, degrees, shear, polygons", [(1.0, 0.0, 0.0, False), (1.0, 8.0, 3.0, False),
                                                                (0.0, 8.0, 3.0, False), (1.0, 8.0, 3.0, True)])
def test_boxes_follow_pixels_through_the_pipeline(tmp_path, mosaic, degrees, shear, polygons):
    # with polygons: copy-paste on every mosaic (p = 1) and boxes from warped polygons
    im = _boxes_dataset(tmp_path, polygons=polygons)
    hyp = _hyp(mosaic=mosaic, degrees=degrees, shear=shear, copy_paste=1.0 if polygons else 0.0)
    ds = YoloDataset(str(im), DatasetConfig(img_size=160, augment=True, hyp=hyp, nc=6, seed=3, label_cache=False),
                     log=lambda s: None)
    assert all(len(s) == (len(lb) if polygons else 0) for s, lb in zip(ds.segments, ds.labels))
    unc = tot = 0
    n_boxes = 0
    for i in range(24):
        img, labels, path, shapes = ds[i % len(ds)]
        assert img.dtype == torch.uint8 and img.shape == (3, 160, 160)
        assert (shapes is None) == (mosaic == 1.0)
        u, t = _check_boxes_follow_pixels(img, labels)
        unc, tot, n_boxes = unc + u, tot + t, n_boxes + len(labels)
    assert n_boxes > 24  # not vacuous
    # boxes dropped by the published filter (< 10 % of their area left) leave a few uncovered slivers
    assert unc <= 0.05 * tot, (unc, tot)


def test_rect_val_items_and_batch_shapes(tmp_path):
    im = _boxes_dataset(tmp_path, n=8)
    ds = YoloDataset(str(im), DatasetConfig(img_size=256, batch_size=3, rect=True, pad=0.5, nc=6, label_cache=False),
                     log=lambda s: None)
    assert not ds.mosaic
    ar = ds.shapes[:, 0] / ds.shapes[:, 1]
    assert (np.diff(ar) >= 0).all()  # sorted by aspect ratio
    bi, bs = rect_batch_shapes(ds.shapes, 3, 256, 32, 0.5)
    assert np.array_equal(bi, ds.batch_index) and np.array_equal(bs, ds.batch_shapes)
    assert (bs % 32 == 0).all() and len(bs) == 3
    for i in range(len(ds)):
        img, labels, _, ((h0, w0), ((ry, rx), (pw, ph))) = ds[i]
        assert tuple(img.shape[1:]) == tuple(bs[bi[i]])
        assert (h0, w0) == tuple(ds.shapes[i])
        u, _ = _check_boxes_follow_pixels(img, labels)
        assert u == 0  # no augmentation: every box kept


def test_rect_batch_shape_formula():
    # wide batch, tall batch, mixed batch (published: ceil(ratio * imgsz / stride + pad) * stride)
    shapes = np.array([[300, 600], [320, 640], [600, 300], [640, 320], [500, 600], [600, 500]])
    bi, bs = rect_batch_shapes(shapes, 2, 640, 32, 0.0)
    assert bs.tolist() == [[320, 640], [640, 320], [640, 640]]
    _, bs = rect_batch_shapes(shapes[:2], 2, 640, 32, 0.5)
    assert bs.tolist() == [[352, 672]]
    _, bs = rect_batch_shapes(np.array([[640, 640]]), 1, 640, 32, 0.5)
    assert bs.tolist() == [[672, 672]]


def test_min_items_single_cls_and_close_mosaic(tmp_path):
    im = _boxes_dataset(tmp_path, n=6)
    (tmp_path / "labels" / "0.txt").write_text("1 0.5 0.5 0.2 0.2\n")   # 1 label
    (tmp_path / "labels" / "1.txt").write_text("")                       # background
    lines = []
    ds = YoloDataset(str(im), DatasetConfig(img_size=128, augment=True, hyp=_hyp(), single_cls=True, min_items=2, nc=6,
                                            label_cache=False), log=lines.append)
    assert len(ds) == 4 and all(len(lb) >= 2 for lb in ds.labels)
    assert any("2/6 images dropped by --min-items 2" in ln for ln in lines)
    assert all((lb[:, 0] == 0).all() for lb in ds.labels)
    assert ds.mosaic and ds[0][3] is None  # mosaic item
    ds.mosaic = False  # close-mosaic
    img, labels, _, shapes = ds[0]
    assert shapes is not None and img.shape == (3, 128, 128) and (labels[:, 1] == 0).all()
    with pytest.raises(DataError, match="min-items"):
        YoloDataset(str(im), DatasetConfig(img_size=128, min_items=50, nc=6, label_cache=False), log=lambda s: None)


def test_single_cls_keeps_labels_whose_class_is_beyond_nc(tmp_path):
    """--single-cls maps every class to 0, so a yaml's nc below the labels' classes (nc: 1 over a many-class set)
    drops nothing, as published; without it those images are skipped."""
    im = _boxes_dataset(tmp_path, n=3)
    (tmp_path / "labels" / "0.txt").write_text("5 0.5 0.5 0.2 0.2\n")
    ds = YoloDataset(str(im), DatasetConfig(img_size=128, single_cls=True, nc=1, label_cache=False), log=print)
    assert len(ds) == 3 and all((lb[:, 0] == 0).all() for lb in ds.labels)
    with pytest.raises(DataError, match="no usable images"):  # every image has a class >= 1
        YoloDataset(str(im), DatasetConfig(img_size=128, nc=1, label_cache=False), log=lambda s: None)


def test_no_usable_images_and_no_labels(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "x.jpg").write_bytes(b"")
    with pytest.raises(DataError, match="no usable images"):
        YoloDataset(str(tmp_path / "images"), DatasetConfig(nc=2, label_cache=False), log=lambda s: None)
    cv2.imwrite(str(tmp_path / "images" / "y.png"), np.zeros((20, 20, 3), np.uint8))
    ds = YoloDataset(str(tmp_path / "images"), DatasetConfig(img_size=32, nc=2, label_cache=False), log=lambda s: None)
    assert len(ds) == 1 and ds[0][1].shape == (0, 6)  # backgrounds are fine for validation
    with pytest.raises(DataError, match="no labels"):
        YoloDataset(str(tmp_path / "images"), DatasetConfig(img_size=32, augment=True, nc=2, label_cache=False),
                    log=lambda s: None)
    with pytest.raises(DataError, match="does not exist"):
        YoloDataset(str(tmp_path / "nope"), DatasetConfig(nc=2), log=lambda s: None)


def test_hyp_overrides_win():
    hyp = augment_hyp(None, mosaic=0.25, mixup=0.5)
    assert hyp["mosaic"] == 0.25 and hyp["mixup"] == 0.5 and hyp["scale"] == 0.9
    base = augment_hyp(None)
    assert base["mosaic"] == 1.0 and base["mixup"] == 0.15
    with pytest.raises(ValueError, match="mixup"):
        augment_hyp(None, mixup=1.5)
    with pytest.raises(KeyError, match="fliplr"):
        augment_hyp({k: v for k, v in base.items() if k != "fliplr"})


def test_same_key_same_item(tmp_path):
    im = _boxes_dataset(tmp_path, n=5)
    ds = YoloDataset(str(im),
                     DatasetConfig(img_size=96, augment=True, hyp=augment_hyp(None), nc=6, seed=1, label_cache=False),
                     log=lambda s: None)
    a, b = ds[(2, (1, 0, 0, 5), True)], ds[(2, (1, 0, 0, 5), True)]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c = ds[(2, (1, 1, 0, 5), True)]  # another epoch: other draws
    assert not torch.equal(a[0], c[0])


def test_coco24_counts():
    """The loader's image, background and box counts of the committed COCO subset equal those of its files."""
    from yolov9c.data.dataset_yaml import load_data_config

    cfg = load_data_config(COCO24 / "data.yaml")
    lines = []
    tr = YoloDataset(cfg["train"], DatasetConfig(img_size=640, augment=True, nc=80, label_cache=False),
                     log=lines.append)
    va = YoloDataset(cfg["val"],
                     DatasetConfig(img_size=640, batch_size=32, rect=True, pad=0.5, nc=80, label_cache=False),
                     log=lines.append)
    rows, backgrounds, images = {}, {}, {}
    for s in ("train", "val"):
        per_file = [[r for r in p.read_text().splitlines() if r.strip()]
                    for p in (COCO24 / "labels" / s).glob("*.txt")]
        rows[s], backgrounds[s] = sum(map(len, per_file)), sum(not r for r in per_file)
        images[s] = len(list((COCO24 / "images" / s).glob("*.jpg")))
    assert backgrounds["train"] >= 1 and min(rows.values()) > 0  # the subset has a background image and boxes
    assert len(tr) == images["train"] and len(va) == images["val"]
    assert lines == [f"{images[s]} images, {backgrounds[s]} backgrounds, 0 corrupt" for s in ("train", "val")]
    assert tr.n_boxes == rows["train"] and va.n_boxes == rows["val"]
    assert va.batch_shapes.max() == 672  # val rect pad 0.5: a 640 long side (the val images') becomes 672
    img, labels, _, _ = va[len(va) - 1]
    assert img.shape[0] == 3 and max(img.shape[1:]) == 672
