"""Shared pytest set-up: where ../shared lives, the `cuda` marker for tests that need a GPU, and the
`one_thread` fixture (a module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`), and
`gelan_t`: a fresh seeded gelan-t checkpoint (3 classes) for the detect tests.

Run everything: python -m pytest -q tests   (CUDA tests skip without a GPU; run them on a CUDA machine)
"""

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
from shared_paths import SHARED  # noqa: E402,F401


@pytest.fixture
def one_thread():
    """One intra-op thread: tiny tensors gain nothing from more, and on a shared CPU two OpenMP threads wait
    on each other (measured 40x slower steps under load)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def gelan_t(tmp_path_factory):
    import yolov9c
    from yolov9c.models.checkpoint import save_checkpoint

    torch.manual_seed(0)
    m = yolov9c.build_model("gelan-t", nc=3)
    m.names = ["a", "b", "c"]
    return save_checkpoint(tmp_path_factory.mktemp("w") / "gelan-t.pt", m)


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
