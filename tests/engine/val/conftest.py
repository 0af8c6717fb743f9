"""Shared set-up of the validation tests (test_validator.py, test_val_chunks.py): `val_split`, which writes a
synthetic dataset (2 training images, 8 val images) under a fresh temporary folder and returns its data config with
a val loader as validation reads it (no augmentation, rect batches, pad 0.5, no workers).

Run: python -m pytest -q tests/engine/val/test_validator.py tests/engine/val/test_val_chunks.py
"""

import pytest

from yolov9c.data.dataset import DatasetConfig
from yolov9c.data.dataset_yaml import load_data_config
from yolov9c.data.loader import LoaderConfig, create_dataloader
from yolov9c.data.synthetic import synthetic_dataset


@pytest.fixture(scope="session")
def val_split(tmp_path_factory):
    """make(seed, imgsz, batch, img_size=96) -> (data config, val loader): the synthetic dataset of `seed` drawn at
    `imgsz` px, its 8 val images read at `img_size` in batches of `batch`."""

    def make(seed, imgsz, batch, img_size=96):
        root = tmp_path_factory.mktemp("synth")
        cfg = load_data_config(str(synthetic_dataset(seed=seed, root=root, n_train=2, n_val=8, imgsz=imgsz)))
        data = DatasetConfig(augment=False, rect=True, pad=0.5, prefix="val: ", nc=cfg["nc"])
        loader, _ = create_dataloader(cfg["val"], img_size, batch, LoaderConfig(data, workers=0))
        return cfg, loader

    return make
