"""DDP on the CPU: `torchrun --nproc_per_node 2 train_dual.py --device cpu` trains with 2 gloo processes (per-rank
batch = total / 2, DistributedSampler shares, loss × WORLD_SIZE) and rank 0 writes the run folder; with the
torch backend and with --backend c (applied before the DDP wrapper; static_graph DDP over its Functions).

Not yet checked: equality with the single-process run of the same total batch (the two see different image
groupings per step and per-rank BatchNorm statistics).
Run: python -m pytest -q tests/test_train_ddp.py
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.results import read_results

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("backend", ["torch", "c"])
def test_two_gloo_processes_train(tmp_path, backend):
    data = synthetic_dataset(seed=1, root=tmp_path / "syn", n_train=16, n_val=4, imgsz=96)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(REPO / "train_dual.py"), "--data", str(data), "--cfg", "gelan-t.yaml", "--img", "64", "--batch", "8",
           "--epochs", "1", "--workers", "0", "--noplots", "--device", "cpu", "--project", str(tmp_path / "runs"),
           "--backend", backend]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"backend: {backend}" in r.stdout
    run = tmp_path / "runs" / "exp"
    assert not (tmp_path / "runs" / "exp2").exists()  # only rank 0 writes
    res = read_results(run / "results.csv")
    assert res["epoch"].tolist() == [0.0]
    assert res["images_per_s"][0] > 0
    ck = torch.load(run / "weights" / "last.pt", map_location="cpu", weights_only=True)
    assert not any(k.startswith("module.") for k in ck["model"])  # the DDP wrapper is not saved
