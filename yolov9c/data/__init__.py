"""yolov9c.data: datasets in the published YOLO format, label checks, augmentations, caching, loaders and the
built-in synthetic dataset. Entry points: `load_data_config` (dataset_yaml.py), `create_dataloader` and its
`LoaderConfig` (loader.py), `YoloDataset` and its `DatasetConfig` (dataset.py), `synthetic_dataset`
(synthetic.py), `check_data` (check.py).
Imports are kept out of this file so that importing one part does not load the others.

Test: python -m pytest -q tests/data/test_data_*.py
"""
