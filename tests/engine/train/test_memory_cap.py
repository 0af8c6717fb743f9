"""The whole-run memory cap (engine/train/memory_cap.py): --mem-cap / --mem-budget, the phase peaks, the graphs'
pool given back before validation (GraphStep.suspend) and captured again.

CPU cases: the option's parsing and recording, what the cap does off the GPU. CUDA cases (skip without a GPU): the
allocator refuses beyond the cap; a run whose graphs are suspended before each validation ends with the same
weights as one that keeps them.
Run: python -m pytest -q tests/engine/train/test_memory_cap.py
"""

import pytest
import torch

from yolov9c.cli.train import parse_opt
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train import memory_cap as M
from yolov9c.engine.train.config import opt_dict


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=2, root=tmp_path_factory.mktemp("syn"), n_train=16, n_val=4, imgsz=96))


def test_cap_comes_from_mem_cap_else_mem_budget():
    assert M.cap_gib(parse_opt([])) is None
    assert M.cap_gib(parse_opt(["--mem-cap", "7G"])) == 7.0
    assert M.cap_gib(parse_opt(["--mem-budget", "6G"])) == 6.0
    assert M.cap_gib(parse_opt(["--mem-budget", "6G", "--mem-cap", "7.5G"])) == 7.5


def test_mem_cap_is_recorded_in_opt_yaml_and_bad_values_are_refused(capsys):
    cfg = parse_opt(["--mem-cap", "14.5G"])
    assert opt_dict(cfg)["mem_cap"] == 14.5
    with pytest.raises(SystemExit) as e:
        parse_opt(["--mem-cap", "lots"])
    assert e.value.code == 2 and "--mem-cap" in capsys.readouterr().err


def test_the_cap_does_nothing_off_the_gpu():
    """On the CPU: nothing capped; --mem-cap says so in one warning (before: silent), a --mem-budget alone is left to
    the memory plan's own warning."""
    lines = []
    assert M.apply_cap(parse_opt(["--mem-cap", "7G"]), torch.device("cpu"), lines.append) is None
    assert lines == ["memory cap: WARNING: --mem-cap caps GPU memory; this run is on the cpu, where it caps nothing"]
    assert M.apply_cap(parse_opt(["--mem-budget", "6G"]), torch.device("cpu"), lines.append) is None
    assert len(lines) == 1 and M.limit_bytes(torch.device("cpu")) == 0 and not M.tight(torch.device("cpu"))
    M.release_cap(torch.device("cpu"))  # nothing to lift
    peaks = M.PhasePeaks(torch.device("cpu"))
    peaks.mark("train")
    assert peaks.peaks == {} and peaks.line() == ""


def test_a_cpu_run_reports_its_validation_batch(data, gelan_mini, tmp_path):
    from yolov9c.engine.train.trainer import train

    out = train(parse_opt(["--data", data, "--cfg", gelan_mini, "--img", "64", "--batch", "4", "--epochs", "1",
                           "--workers", "0", "--noplots", "--device", "cpu", "--project", str(tmp_path)]),
                log=lambda *a, **k: None)
    assert out["val_batch"] == 4  # 2 x the training batch (as published), at most the 4 validation images
    assert "memory_peaks" not in out  # no GPU: no peaks


# ---------------------------------------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.cuda
def test_the_allocator_refuses_beyond_the_cap():
    """A cap 1 GiB above what this process reserves already (earlier tests in the process may leave memory
    reserved: 1.28 GiB once, over a fixed 1 GiB cap): tight past half of it, out of memory beyond it, lifted at
    the run's end."""
    import gc

    dev = torch.device("cuda", 0)
    gc.collect()  # an earlier test's graphs or tensors in reference cycles
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved(dev)
    cap = (base + M.GIB) / M.GIB
    lines = []
    try:
        assert M.apply_cap(parse_opt(["--mem-cap", f"{cap!r}G"]), dev, lines.append) == pytest.approx(cap)
        assert f"at most {cap:.2f} GiB" in lines[0] and M.limit_bytes(dev) == int(cap * M.GIB)
        keep = torch.empty(M.GIB // 2 + (64 << 20), dtype=torch.uint8, device=dev)  # over half the cap reserved
        assert M.tight(dev)
        over = M.limit_bytes(dev) - torch.cuda.memory_allocated(dev) + (64 << 20)  # cached blocks cannot hold it
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(over, dtype=torch.uint8, device=dev)
        M.release_cap(dev)  # the run's end: the cap is lifted
        assert M.limit_bytes(dev) == torch.cuda.get_device_properties(0).total_memory
        more = torch.empty(M.GIB // 2, dtype=torch.uint8, device=dev)
        del keep, more
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, dev)
        M._CAPS.clear()
        torch.cuda.empty_cache()


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["torch", "c"])
def test_suspending_the_graphs_before_validation_keeps_the_run(data, tmp_path, monkeypatch, backend):
    """Two deterministic CUDA runs of 3 epochs with the graph step, one giving the graphs' memory back before
    every validation (as on a tight card) and capturing them again: the same EMA weights bit for bit."""
    from yolov9c.engine.train import trainer

    def run(name, suspend):
        monkeypatch.setattr(trainer, "tight", lambda device: suspend)
        out = trainer.train(parse_opt(["--data", data, "--cfg", "gelan-t.yaml", "--img", "64", "--batch", "4",
                                       "--epochs", "3", "--workers", "0", "--noplots", "--device", "0",
                                       "--backend", backend, "--deterministic", "--project", str(tmp_path),
                                       "--name", name]), log=lambda *a, **k: None)
        ck = torch.load(out["save_dir"] / "weights" / "last.pt", map_location="cpu", weights_only=False)
        m = ck.get("ema") or ck["model"]  # the stripped last.pt holds the EMA as its model
        return (m.state_dict() if hasattr(m, "state_dict") else m), out

    kept, out_kept = run("kept", False)
    suspended, out_susp = run("suspended", True)
    assert out_susp["memory_peaks"] and "validation" in out_susp["memory_peaks"]
    assert kept.keys() == suspended.keys()
    for k in kept:
        assert torch.equal(kept[k], suspended[k]), k
