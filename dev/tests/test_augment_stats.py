"""dev/fidelity/augment_stats.py, the distribution check of --gpu-augment: on tests/assets/coco24 and a synthetic
set, compare() finds the augment op's batches (its C reference on the CPU) distributed as the CPU pipeline's — box
statistics identical, class/side/aspect histograms identical, every pixel statistic |z| < 0.5 — and main()
prints one table per data set. The item-by-item equality of the two pipelines is the product's test
(tests/data/test_augment_plan.py).
Run: OMP_NUM_THREADS=1 python -m pytest -q dev/tests/test_augment_stats.py
"""

import sys
from pathlib import Path

import pytest

from repo_assets import COCO24
from yolov9c.data.dataset_yaml import load_data_config
from yolov9c.data.synthetic import synthetic_dataset

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "dev" / "fidelity"))
import augment_stats  # noqa: E402

EXACT = ("boxes_per_image", "empty_images", "box_side_px", "mosaic_rate")  # the same draws and box code
Z_MAX = 0.5  # pixel statistics: 1-grey-level rounding differences on a few pixels move them by far less


@pytest.fixture(scope="module")
def syn(tmp_path_factory):
    return load_data_config(synthetic_dataset(seed=3, root=tmp_path_factory.mktemp("syn"), n_train=16, n_val=4,
                                              imgsz=160))


def test_the_overrides_turn_on_every_path_of_the_op():
    o = augment_stats.HYP_OVERRIDES
    assert all(o[k] > 0 for k in ("mixup", "degrees", "shear", "perspective")) and 0 < o["mosaic"] < 1


@pytest.mark.parametrize("which", ["coco24", "synthetic"])
def test_distribution_matches_the_cpu_pipeline(which, syn):
    source = str(COCO24 / "images" / "train") if which == "coco24" else syn["train"]
    rows = augment_stats.compare(source, imgsz=192 if which == "synthetic" else 320, batches=2, batch_size=8)
    names = {r[0] for r in rows}
    assert {"boxes_per_image", "box_side_px", "pixel_mean_R", "pixel_std_B", "grey_share", "sharpness",
            "mosaic_rate", "hist_cls"} <= names
    for metric, op, cpu, z, kind in rows:
        if kind == "tv":
            assert z == 0.0, f"{metric}: histograms differ (distance {z})"
        elif metric in EXACT:
            assert op == cpu, f"{metric}: {op} vs {cpu}"
        else:
            assert abs(z) < Z_MAX, f"{metric}: {op} vs {cpu}, z {z}"


def test_main_prints_a_table_per_data_set(syn, capsys):
    assert augment_stats.main(["--data", syn["train"][0], "--imgsz", "192", "--batches", "1",
                               "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert f"{syn['train'][0]}: 1 x 4 images at 192, seed 0" in out and "augment op" in out
    table = {line.split()[0]: line.split()[1:] for line in out.splitlines()[3:] if line.strip()}
    assert {"boxes_per_image", "mosaic_rate", "hist_cls"} <= set(table)
    assert table["boxes_per_image"][0] == table["boxes_per_image"][1]  # augment op, CPU pipeline
