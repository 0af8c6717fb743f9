"""AutoBatch (`train_dual.py --batch-size -1`, yolov9c/engine/train/autobatch.py):
- select_batch on given (batch, reserved GiB) samples: an exact line gives the batch at 80 % of the free memory;
  an out-of-memory sample at 16 fits only the sizes that worked and keeps the choice below 16; a noisy fit
  lands near the true answer; too few samples or a flat line fall back to 16 with a warning; clamping;
- the CPU path through train_dual.py: one tiny epoch (gelan_mini, tests/conftest.py), batch 16 chosen, the
  published message printed;
- refused under DDP;
- cuda: the real profile on a small model on a card of the test's own (capped; the size AutoBatch sees), the
  chosen batch's measured memory <= 0.8 x free memory.

Run: python -m pytest -q tests/engine/train/test_autobatch.py   (CPU part about 10 s)
"""

import numpy as np
import pytest
import torch

from yolov9c.engine.train.autobatch import autobatch, profile_step, select_batch


def _line(slope, intercept, sizes=(1, 2, 4, 8, 16)):
    return [(b, slope * b + intercept) for b in sizes]


def test_exact_line_gives_the_batch_at_80_percent_of_free():
    msgs = []
    b = select_batch(_line(0.5, 2.0), free_gib=41.0, log=msgs.append)
    assert b == int((41.0 * 0.8 - 2.0) / 0.5) == 61
    assert not msgs
    assert select_batch(_line(0.5, 2.0), free_gib=41.0, fraction=0.45) == 32  # (18.45 − 2) / 0.5 = 32.9


def test_oom_at_16_uses_the_sizes_that_worked_and_stays_below_it():
    samples = _line(1.0, 1.0, (1, 2, 4, 8)) + [(16, None)]
    # the line would allow (80·0.8 − 1)/1 = 63, but 16 ran out of memory: the largest size that ran
    assert select_batch(samples, free_gib=80.0) == 8
    # a sample after the failure is ignored (the profile stops there)
    assert select_batch(samples + [(32, 0.1)], free_gib=80.0) == 8
    # when the fit already chooses below the failure, it is kept
    assert select_batch(_line(1.0, 1.0, (1, 2, 4)) + [(8, None)], free_gib=8.0) == 5


def test_noisy_fit_lands_near_the_true_batch():
    rng = np.random.default_rng(0)
    sizes = (1, 2, 4, 8, 16)
    samples = [(b, 0.25 * b + 3.0 + rng.normal(0, 0.05)) for b in sizes]
    b = select_batch(samples, free_gib=50.0)
    true = (50.0 * 0.8 - 3.0) / 0.25  # 148
    assert abs(b - true) <= 0.05 * true


def test_fit_failures_fall_back_to_16_with_a_warning():
    for samples in ([(1, 1.0), (2, None)], [(1, None)], [], _line(0.0, 5.0), _line(-0.1, 5.0)):
        msgs = []
        assert select_batch(samples, free_gib=40.0, log=msgs.append) == 16
        assert msgs and "WARNING" in msgs[0] and "16" in msgs[0]


def test_clamped_to_1_and_1024():
    msgs = []
    assert select_batch(_line(0.001, 0.1), free_gib=100.0, log=msgs.append) == 1024
    assert "clamped" in msgs[0]
    assert select_batch(_line(1.0, 50.0), free_gib=40.0, log=[].append) == 1


def test_cpu_fallback_message():
    msgs = []
    model = torch.nn.Conv2d(3, 3, 1)
    assert autobatch(model, 64, None, "cpu", log=msgs.append) == 16
    assert msgs == ["AutoBatch: CUDA not detected, using default CPU batch-size 16"]


def test_train_dual_batch_minus_1_on_the_cpu(tmp_path, gelan_mini, capsys):
    from yolov9c.cli.train import main
    from yolov9c.data.synthetic import synthetic_dataset

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = str(synthetic_dataset(seed=5, root=tmp_path / "syn", n_train=4, n_val=2, imgsz=64))
        argv = ["--data", data, "--cfg", gelan_mini, "--img", "64", "--batch-size", "-1", "--epochs", "1",
                "--workers", "0", "--noplots", "--noval", "--device", "cpu", "--project", str(tmp_path / "runs")]
        assert main(argv) == 0
    finally:
        torch.set_num_threads(n)
    out = capsys.readouterr().out
    assert "AutoBatch: CUDA not detected, using default CPU batch-size 16" in out
    ck = torch.load(tmp_path / "runs" / "exp" / "weights" / "last.pt", map_location="cpu", weights_only=False)
    assert ck["opt"]["batch_size"] == 16


def test_refused_under_ddp(monkeypatch, capsys):
    from yolov9c.cli.train import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["--batch-size", "-1", "--epochs", "1"]) == 2
    assert "(AutoBatch) runs in one process only" in capsys.readouterr().err


class _Card:
    """A CUDA device's properties with another total_memory (every other attribute the real one's)."""

    def __init__(self, real, total_memory):
        self._real, self.total_memory = real, total_memory

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.mark.cuda
def test_real_profile_fits_in_80_percent_of_free_memory(monkeypatch):
    """The real profile on a card of its own: this process capped at CARD (what it reserves now plus at most half
    of what the GPU has free, so other processes' later allocations leave it room) and AutoBatch shown that
    card's size. The batch it picks (fitted, not clamped) runs within 80 % of the free memory it saw. Should the
    GPU's free memory still fall below the card's room meanwhile (other processes), the check cannot run:
    skipped, saying so."""
    import gc

    import yolov9c
    from yolov9c.loss.detection import make_loss

    device = torch.device("cuda:0")
    gc.collect()
    torch.cuda.empty_cache()
    gib = 2 ** 30
    room = min(8 * gib, torch.cuda.mem_get_info(device)[0] // 2)
    if room < 2 * gib:
        pytest.skip(f"{room / gib:.2f} GiB would be this test's room: other processes hold the GPU")
    physical = torch.cuda.get_device_properties(device)
    card = torch.cuda.memory_reserved(device) + room
    real = torch.cuda.get_device_properties

    def properties(d=None):  # device 0 is the test's card
        index = d if isinstance(d, int) else None if d is None else torch.device(d).index
        index = torch.cuda.current_device() if index is None else index
        return _Card(real(d), card) if index == 0 else real(d)

    torch.cuda.set_per_process_memory_fraction(card / physical.total_memory, device)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    try:
        model = yolov9c.build_model("gelan-t", nc=80).to(device)
        free = (card - (torch.cuda.memory_reserved(device) + torch.cuda.memory_allocated(device))) / gib
        msgs = []
        b = autobatch(model, 320, None, device, backend="torch", amp=True, log=msgs.append)
        assert 1 <= b < 1024 and not any("clamped" in m for m in msgs), msgs  # the fit chose it
        assert any("batch    1:" in m for m in msgs) and f"{free:.2f}G free" in msgs[-1], msgs
        loss = make_loss(model, None, backend="torch")
        mem = profile_step(model.train(), loss, b, 320, 80, device, True, 32, torch.Generator().manual_seed(1))
        left = torch.cuda.mem_get_info(device)[0]
        if mem is None and left < card - torch.cuda.memory_reserved(device):
            pytest.skip(f"batch {b} ran out of memory while other processes left {left / gib:.2f} GiB free, less "
                        f"than this test's card has room for")
        assert mem is not None, f"batch {b} ran out of memory: {msgs}"
        assert mem <= 0.8 * free, f"batch {b}: {mem:.2f}G > 0.8 x {free:.2f}G free; {msgs}"
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()
