"""Shared pytest set-up: the `cuda` marker for tests that need a GPU, one CPU thread, the
`one_thread` fixture (a module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`: it also keeps
torch at one thread where a caller chose more), `gelan_t`: a fresh seeded gelan-t checkpoint (3 classes)
for the detect tests, `gelan_mini`: the path of a model yaml with every module kind of gelan-t at a fraction of its
size (for trainings whose checks do not depend on the model), and `golden_model`: the golden recipe's model of each config for tests/models/test_goldens.py and
tests/models/test_goldens_loss.py together (one float64 build per config: ~14 s of CPU for the ten, once instead of
twice; session scope makes pytest run the two files' tests of one config one after another, so one model is
alive at a time).

One thread: the suite's tensors are tiny, and on the 2-core machine shared with other jobs torch's default of one
OpenMP thread per core costs far more than it gains: two threads that wait for each other spin while the other is
descheduled. Measured (2 cores, load average 1.6-3.8, test_resume_equals_uninterrupted + the three
test_uint8_input_only_where_the_model_reads_it, two runs each): 1 thread 18-19 s CPU, 21-28 s wall; 2 threads
53-59 s CPU, 54-86 s wall. The choice is made once, before any test runs, for this process
(torch.set_num_threads) and for every process a test starts (OMP_NUM_THREADS in the environment, which the
trainer's own thread choice also leaves alone). A thread count the caller chose (OMP_NUM_THREADS or
MKL_NUM_THREADS set) is kept.

Run everything: python -m pytest -q tests   (CUDA tests skip without a GPU; run them on a CUDA machine)
"""

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
from golden_weights import CONFIGS, golden_init_  # noqa: E402


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


# gelan-t's module kinds (Conv, ELAN1, AConv, RepNCSPELAN4, SPPELAN, Upsample, Concat, DDetect), each once, 16
# channels wide, strides 8/16/32: 247 tensors against gelan-t's 1339. A tiny CPU training (run folders, --resume)
# spends its CPU per tensor, not per image: the EMA copy, every checkpoint save and read (torch's weights-only
# unpickler), the strip and the final validation's load. Measured, one 1-epoch run of 8 images at --img 64:
# 5-6 s of CPU with gelan-t, ~1 s with this.
GELAN_MINI = """\
nc: 80
depth_multiple: 1.0
width_multiple: 1.0
backbone:
  [[-1, 1, Conv, [16, 3, 2]],  # 0-P1/2
   [-1, 1, Conv, [16, 3, 2]],  # 1-P2/4
   [-1, 1, ELAN1, [16, 16, 8]],  # 2
   [-1, 1, AConv, [16]],  # 3-P3/8
   [-1, 1, RepNCSPELAN4, [16, 16, 8, 1]],  # 4
   [-1, 1, AConv, [16]],  # 5-P4/16
   [-1, 1, AConv, [16]],  # 6-P5/32
   [-1, 1, SPPELAN, [16, 8]],  # 7
  ]
head:
  [[-1, 1, nn.Upsample, [None, 2, 'nearest']],  # 8
   [[-1, 5], 1, Concat, [1]],  # 9 (P4)
   [[4, 9, 7], 1, DDetect, [nc]],  # 10 DDetect(P3, P4, P5)
  ]
"""


@pytest.fixture(scope="session")
def gelan_mini(tmp_path_factory):
    """Path (str) of the GELAN_MINI model yaml: --cfg of tiny trainings that test the run, not the model."""
    path = tmp_path_factory.mktemp("cfg") / "gelan-mini.yaml"
    path.write_text(GELAN_MINI)
    return str(path)


@pytest.fixture(scope="session", params=CONFIGS)
def golden_build(request):
    """(cfg, float64 model with the recipe's weights, its buffers as built). Parametrise it indirectly to run a
    test on some configs only."""
    from yolov9c.models.model import DetectionModel

    model = golden_init_(DetectionModel(request.param).double())
    return request.param, model, {k: v.clone() for k, v in model.named_buffers()}


@pytest.fixture
def golden_model(golden_build):
    """(cfg, model) of golden_build as built: its BatchNorm buffers put back (a train-mode forward of an earlier
    test moved the running statistics), no gradients. Tests never change its weights."""
    cfg, model, buffers = golden_build
    with torch.no_grad():
        for k, v in model.named_buffers():
            v.copy_(buffers[k])
    model.zero_grad(set_to_none=True)
    return cfg, model


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one)")
    if not (os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS")):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
