"""--val-chunks auto in training (yolov9c/engine/train/val_chunks.py, trainer._validate):
- ValChunks.before_pass on given memory (a fake measure of what is left and a fake graph step): the whole batch
  when it fits (no line, graphs kept); the largest chunk that fits beside the graphs, graphs kept, one line
  per change of chunk; the graphs given back only when fewer than MIN_CHUNK images fit beside them, the chunk
  then sized to what is left; after an out-of-memory pass half the chunk (guards.validate_with_backoff retries
  the same loader), at one image the loader's batch is halved as before;
- the option: off by default, recorded in opt.yaml, restored by --resume unless typed again; off the GPU it
  builds nothing;
- a CPU training run whose validations run in chunks of 3 (the memory measure faked) ends with the same metrics
  and final validation as one that validates each batch in one pass.
Run: python -m pytest -q tests/engine/train/test_val_chunks_run.py
"""

import types

import pytest
import torch

from yolov9c.cli.train import parse_opt
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train import memory_phases as mph
from yolov9c.engine.train.config import opt_dict
from yolov9c.engine.train.guards import OutOfMemory, validate_with_backoff
from yolov9c.engine.train.val_chunks import ValChunks

VC = mph.ValCost("toy", fwd_gib=0.1, params=1_000_000)


def _room(k, batch, model_gib=0.0):
    """GiB left in which exactly `k` images a forward fit (chunk_for's rule)."""
    return mph.RESERVED_SLACK * mph.val_need_gib(VC, batch, k, model_gib=model_gib) / mph.HEADROOM * 1.0001


class FakeGraphs:
    """A graph step holding `pool` GiB until suspended."""
    name = "cuda-graph"

    def __init__(self):
        self.suspends, self.held = 0, True

    def suspend(self, state):
        if not self.held:
            return False
        self.held, self.suspends = False, self.suspends + 1
        return True


def _state():
    lines = []
    return types.SimpleNamespace(device=torch.device("cpu"), step=FakeGraphs(), log=lines.append), lines


def test_the_chunk_follows_the_memory_left():
    state, lines = _state()
    left = {"gib": 100.0}
    chunks = ValChunks(VC, 640, True, left=lambda device: left["gib"])
    assert chunks.before_pass(state, 128) is None and lines == []  # the whole batch fits: one pass
    left["gib"] = _room(30, 128)
    assert chunks.before_pass(state, 128) == 30 and state.step.held  # beside the graphs
    assert len(lines) == 1 and "chunks of 30 images per batch of 128" in lines[0] and "beside the CUDA-graph" in \
        lines[0]
    assert chunks.before_pass(state, 128) == 30 and len(lines) == 1  # the same chunk: no new line
    left["gib"] = _room(mph.MIN_CHUNK, 128)
    assert chunks.before_pass(state, 128) == mph.MIN_CHUNK and state.step.held  # still enough beside the pool
    assert len(lines) == 2


def test_the_graphs_are_given_back_only_when_too_little_fits():
    state, lines = _state()
    left = {"gib": _room(mph.MIN_CHUNK - 1, 128)}

    def measure(device):  # the graphs' memory comes back when they are suspended
        return left["gib"] + (0.0 if state.step.held else _room(40, 128) - left["gib"])

    chunks = ValChunks(VC, 640, True, left=measure)
    assert chunks.before_pass(state, 128) == 40
    assert not state.step.held and state.step.suspends == 1
    assert "given back" in lines[0] and "chunks of 40 images per batch of 128" in lines[1] and "on the card" in \
        lines[1]
    # a small batch of record is never chunked below itself: 4 images that fit beside the pool keep the graphs
    state, lines = _state()
    chunks = ValChunks(VC, 640, True, left=lambda device: _room(4, 4))
    assert chunks.before_pass(state, 4) is None and state.step.held and lines == []


def test_a_loaded_model_counts_against_the_chunk():
    state, _ = _state()
    room = _room(20, 128)
    plain = ValChunks(VC, 640, True, left=lambda device: room).before_pass(state, 128)
    loaded = ValChunks(VC, 640, True, left=lambda device: room).before_pass(state, 128, model_gib=0.5)
    assert plain == 20 and loaded < plain


def test_out_of_memory_halves_the_chunk_then_the_batch():
    state, lines = _state()
    chunks = ValChunks(VC, 640, True, left=lambda device: _room(16, 128))
    state.val_loader = types.SimpleNamespace(batch_size=128)
    made, used = [], []

    def run(loader):
        used.append((loader.batch_size, chunks.before_pass(state, loader.batch_size)))
        if len(used) < 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
        return "ok"

    def make_loader(batch):
        made.append(batch)
        return types.SimpleNamespace(batch_size=batch)

    assert validate_with_backoff(state, run, make_loader, shrink=chunks.shrink) == "ok"
    assert used == [(128, 16), (128, 8), (128, 4)] and made == []  # the batch of record kept
    assert "chunks of 16 ran out of memory" in lines[-2] and "chunks of 8 ran out of memory" in lines[-1]
    # at one image a forward the batch itself is halved (the retry without chunks)
    one = ValChunks(VC, 640, True, left=lambda device: _room(1, 128))
    state.val_loader = types.SimpleNamespace(batch_size=2)
    calls = []

    def run_one(loader):
        calls.append(one.before_pass(state, loader.batch_size))
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")

    with pytest.raises(OutOfMemory):
        validate_with_backoff(state, run_one, make_loader, shrink=one.shrink)
    assert made == [1]


def test_the_option_is_on_by_default_recorded_and_cpu_runs_build_nothing():
    assert parse_opt([]).val_chunks == "auto"
    assert opt_dict(parse_opt(["--val-chunks", "off"]))["val_chunks"] == "off"
    cfg = parse_opt(["--val-chunks", "auto"])
    assert cfg.val_chunks == "auto" and opt_dict(cfg)["val_chunks"] == "auto"
    with pytest.raises(SystemExit):
        parse_opt(["--val-chunks", "sometimes"])
    state = types.SimpleNamespace(cfg=cfg, device=torch.device("cpu"), main=True, log=print)
    assert ValChunks.for_run(state) is None


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=6, root=tmp_path_factory.mktemp("syn"), n_train=8, n_val=4, imgsz=96))


def _train(data, cfg, tmp_path, name, extra=(), epochs=1, **kw):
    """A CPU training of the model yaml `cfg` (gelan_mini, tests/conftest.py: the run, not the model)."""
    from yolov9c.engine.train.trainer import train

    lines = []
    argv = ["--data", data, "--cfg", cfg, "--img", "64", "--batch", "4", "--epochs", str(epochs),
            "--workers", "0", "--noplots", "--device", "cpu", "--project", str(tmp_path), "--name", name, *extra]
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = train(parse_opt(argv), log=lambda *a, **k: lines.append(" ".join(map(str, a))), **kw)
    finally:
        torch.set_num_threads(n)
    return out, lines


def test_a_chunked_training_validation_equals_one_pass(data, gelan_mini, tmp_path, monkeypatch):
    whole, _ = _train(data, gelan_mini, tmp_path, "whole")
    # on the CPU the option builds nothing; here a ValChunks with a faked measure: 3 images of the batch of 4
    # (twice the training batch, at most the 4 validation images) fit, fewer beside best.pt's weights
    vc = mph.ValCost("toy", fwd_gib=1.0, params=1_000)
    room = mph.RESERVED_SLACK * mph.val_need_gib(vc, 4, 3, img=64, half=False) / mph.HEADROOM * 1.0001
    monkeypatch.setattr(ValChunks, "for_run", classmethod(
        lambda cls, state: cls(vc, state.imgsz, state.amp, left=lambda device: room)))
    chunked, lines = _train(data, gelan_mini, tmp_path, "chunked", ["--val-chunks", "auto"])
    said = [line for line in lines if line.startswith("validation: the forward in chunks")]
    assert len(said) == 2 and "chunks of 3 images per batch of 4" in said[0], lines
    assert "chunks of 2 images per batch of 4" in said[1]  # the final validation, best.pt loaded beside
    assert chunked["metrics"] == whole["metrics"]
    for k in ("mp", "mr", "map50", "map", "box_loss", "cls_loss", "dfl_loss"):
        assert chunked["final"][k] == whole["final"][k], k


def test_resume_restores_the_option(data, gelan_mini, tmp_path):
    from yolov9c.engine.train.resume import read_resume

    out, _ = _train(data, gelan_mini, tmp_path, "auto", ["--val-chunks", "auto"], epochs=2, stop_after_epoch=0)
    last = str(out["save_dir"] / "weights" / "last.pt")
    assert read_resume(parse_opt(["--resume", last]), log=lambda *a: None).cfg.val_chunks == "auto"
    assert read_resume(parse_opt(["--resume", last, "--val-chunks", "off"]), log=lambda *a: None).cfg.val_chunks \
        == "off"
