"""Shared pytest set-up: where ../shared lives, and the `cuda` marker for tests that need a GPU.

Run everything: python -m pytest -q tests   (CUDA tests skip without a GPU; run them on a CUDA machine)
"""

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
from shared_paths import SHARED  # noqa: E402,F401


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
