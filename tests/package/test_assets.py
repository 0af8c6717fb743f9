"""The suite's committed test data (tests/assets/, read through tests/repo_assets.py): the byte-plane packing is
lossless, every config's golden tensors are there with the recorded names, shapes and dtypes and agree with
summary.json, every coco24 image is paired with its label file and listed with an allowed licence, and the folder
keeps to its 10 MB budget. (That the wheel leaves tests/ out: tests/package/test_resources.py.)

Run: python -m pytest -q tests/package/test_assets.py
"""

import csv
import json

import cv2
import numpy as np
import pytest
import yaml

from golden_weights import CONFIGS
from repo_assets import ASSETS, COCO24, GOLDEN_DIR, from_planes, golden, golden_lines, to_planes

BUDGET = 10_000_000  # bytes, everything under tests/assets
LICENCES = {"Attribution License", "Attribution-ShareAlike License", "No known copyright restrictions"}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_byte_planes_round_trip_bit_for_bit(dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3, 5, 7)).astype(dtype)
    a.flat[:5] = [np.nan, np.inf, -np.inf, -0.0, np.finfo(dtype).tiny / 4]  # a subnormal too
    p = to_planes(a)
    assert p.dtype == np.uint8 and p.shape == (a.itemsize, *a.shape)
    # plane 0 holds the lowest byte of every element (little-endian)
    assert np.array_equal(p[0].ravel(), a.astype(a.dtype.newbyteorder("<")).view(np.uint8)[..., 0::a.itemsize].ravel())
    b = from_planes(p)
    assert b.dtype == a.dtype and b.shape == a.shape and b.tobytes() == a.tobytes() and b.flags.writeable
    big = a.astype(a.dtype.newbyteorder(">"))  # another byte order in: the same values out
    assert from_planes(to_planes(big)).tobytes() == a.tobytes()
    with pytest.raises(ValueError, match="byte planes"):
        from_planes(p[:3])


@pytest.mark.parametrize("cfg", CONFIGS)
def test_every_config_has_its_golden_tensors(cfg):
    summary = json.loads((GOLDEN_DIR / "summary.json").read_text())[cfg]
    z = golden(cfg)
    maps = [f"train_map{i}" for i in range(summary["maps"])]
    assert set(z) == {"eval_decoded", "loss_total", "loss_items", "grad_norms", *maps}
    assert z["eval_decoded"].shape == (1, 84, 525) and z["eval_decoded"].dtype == np.float32
    for i, name in enumerate(maps):
        side = 20 >> (i % 3)  # P3, P4, P5 at 160 px, per branch
        assert z[name].shape == (2, 144, side, side) and z[name].dtype == np.float32, name
    names = golden_lines(cfg, "grad_names")
    assert z["grad_norms"].shape == (len(names),) and z["grad_norms"].dtype == np.float64
    assert z["loss_total"].shape == (1,) and z["loss_items"].shape == (3,)
    assert all(np.isfinite(a).all() for a in z.values())
    # summary.json holds the losses rounded to float32
    assert np.allclose(z["loss_items"], summary["loss_items"], rtol=1e-6)
    assert np.isclose(z["loss_total"][0], summary["loss_total"], rtol=1e-6)
    keys = golden_lines(cfg, "keys")
    assert len(keys) > len(names) and set(names) <= {k.split(" ", 1)[0] for k in keys}
    z["train_map0"][:] = 0  # a caller's copy: the next read is the recording again
    assert golden(cfg)["train_map0"].any()


def test_coco24_images_labels_and_licences():
    cfg = yaml.safe_load((COCO24 / "data.yaml").read_text())
    assert cfg["nc"] == 80 and len(cfg["names"]) == 80
    rows = list(csv.DictReader(open(COCO24 / "image_licenses.csv", newline="")))
    listed = {(r["split"], r["file"]) for r in rows}
    assert all(r["license_name"] in LICENCES and r["flickr_url"].startswith("http") for r in rows)
    found = set()
    for split in ("train", "val"):
        images = sorted((COCO24 / "images" / split).iterdir())
        labels = sorted((COCO24 / "labels" / split).iterdir())
        assert [p.stem for p in images] == [p.stem for p in labels] and len(images) >= 10
        for p in images:
            assert p.suffix == ".jpg" and cv2.imread(str(p)) is not None, p
            found.add((split, p.name))
    assert found == listed


def test_assets_keep_to_the_budget():
    total = sum(f.stat().st_size for f in ASSETS.rglob("*") if f.is_file())
    assert total <= BUDGET, f"tests/assets holds {total} bytes, over the {BUDGET}-byte budget"
