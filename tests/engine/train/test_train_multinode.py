"""Multi-node DDP on the CPU: two torchrun agents as two "nodes" on 127.0.0.1 (gloo, `--nnodes 2 --node_rank r
--nproc_per_node 1 --rdzv_endpoint 127.0.0.1:PORT`, the command of docs/train.md "Multi-node"):

- one short epoch ends with bit-identical parameters on both ranks (gloo's all-reduce gives every rank the same
  gradients), one run folder written by rank 0 whose epoch0.pt holds rank 0's parameters, exit code 0 on both;
  this run is also the suite's c backend under DDP (`--backend c`, applied before the DDP wrapper; it was a
  separate 2-process run in test_train_ddp.py): rank 0 logs `backend: c`, and no checkpoint holds the wrapper's
  `module.` names;
- a node killed mid-run (its agent and its worker, after epoch 0): the other rank, waiting in the next
  collective, stops with exit code != 0 and one `error:` line naming the lost process and the --resume to run,
  its last.pt and results.csv those of epoch 0 (before: a traceback, and no hint).

Each rank's parameters come from a wrapper of the training CLI (written below) that saves them after each
end_epoch; it also holds one rank after epoch 0 so that the kill lands mid-run at a known point.
Tiny on purpose: 8 synthetic images of 64 px, tests/conftest.py's gelan_mini (gelan-t's module kinds at 247
tensors: the cost of these runs is per tensor) at --img 64, batch 4 (2 per rank), --noval.
Run: python -m pytest -q tests/engine/train/test_train_multinode.py
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train.results import read_results

REPO = Path(__file__).resolve().parents[3]
HANG_S = 300  # a rank still running this long after its peer died is a hang

WRAPPER = '''
import os, sys, time
from pathlib import Path
import torch
import yolov9c.engine.train.trainer as T
from yolov9c.cli.train import main

out, hold = Path(os.environ["MN_OUT"]), os.environ.get("MN_HOLD")
end_epoch = T.end_epoch

def saving_end_epoch(state, epoch, stats):
    end_epoch(state, epoch, stats)
    m = getattr(state.model, "module", state.model)
    torch.save({k: v.detach().clone() for k, v in m.named_parameters()}, out / f"rank{state.rank}.tmp")
    os.replace(out / f"rank{state.rank}.tmp", out / f"rank{state.rank}_epoch{epoch}.pt")
    if hold == str(state.rank):
        (out / "pid.tmp").write_text(str(os.getpid()))
        os.replace(out / "pid.tmp", out / f"rank{state.rank}.pid")  # whole, when the test sees it
        while True:
            time.sleep(0.2)

T.end_epoch = saving_end_epoch
sys.exit(main(sys.argv[1:]))
'''


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=1, root=tmp_path_factory.mktemp("syn"), n_train=8, n_val=2, imgsz=64))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_nodes(tmp_path, data, cfg, epochs, hold=None, extra=()):
    """Two torchrun agents (node 0 and node 1), each in its own session, the training CLI given `extra` too;
    returns (procs, out folder, logs)."""
    out = tmp_path / "out"
    out.mkdir()
    wrapper = tmp_path / "train_wrapper.py"
    wrapper.write_text(WRAPPER)
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", MN_OUT=str(out), PYTHONPATH=str(REPO))
    if hold is not None:
        env["MN_HOLD"] = str(hold)
    args = ["--data", data, "--cfg", cfg, "--img", "64", "--batch", "4", "--epochs", str(epochs),
            "--workers", "0", "--noval", "--noplots", "--device", "cpu", "--save-period", "1",
            "--project", str(tmp_path / "runs"), *extra]
    procs, logs = [], []
    for node in (0, 1):
        log = tmp_path / f"node{node}.log"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
               "--nproc_per_node", "1", "--rdzv_endpoint", f"127.0.0.1:{port}", str(wrapper), *args]
        with open(log, "w") as f:
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path, env=env,
                                          start_new_session=True))
        logs.append(log)
    return procs, out, logs


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _params_equal(a, b):
    return a.keys() == b.keys() and len(a) > 0 and all(torch.equal(a[k], b[k]) for k in a)


def test_two_nodes_train_with_identical_weights_and_one_run_folder(data, gelan_mini, tmp_path):
    procs, out, logs = _start_nodes(tmp_path, data, gelan_mini, epochs=1, extra=["--backend", "c"])
    try:
        codes = [p.wait(timeout=HANG_S) for p in procs]
    finally:
        _stop(procs)
    text = [log.read_text() for log in logs]
    assert codes == [0, 0], text[0][-3000:] + text[1][-3000:]
    assert "backend: c" in text[0]
    r0, r1 = (torch.load(out / f"rank{r}_epoch0.pt") for r in (0, 1))
    assert _params_equal(r0, r1), "the two ranks ended with different parameters"
    run = tmp_path / "runs" / "exp"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["exp"]  # one run folder: rank 0 writes
    res = read_results(run / "results.csv")
    assert res["epoch"].tolist() == [0.0] and res["images_per_s"][0] > 0
    saved = torch.load(run / "weights" / "epoch0.pt", map_location="cpu", weights_only=True)
    assert _params_equal({k: saved["model"][k] for k in r0}, r0)  # the unstripped float32 model of rank 0
    stripped = torch.load(run / "weights" / "last.pt", map_location="cpu", weights_only=True)
    assert not any(k.startswith("module.") for k in [*saved["model"], *stripped["model"]])  # the wrapper not saved
    assert yaml.safe_load((run / "opt.yaml").read_text())["world_size"] == 2


def test_a_killed_node_stops_the_other_with_one_error_line(data, gelan_mini, tmp_path):
    procs, out, logs = _start_nodes(tmp_path, data, gelan_mini, epochs=3, hold=1)
    try:
        pid_file = out / "rank1.pid"
        while not pid_file.exists():  # rank 1 finished epoch 0 and holds; rank 0 waits for it in epoch 1
            assert procs[0].poll() is None and procs[1].poll() is None, logs[0].read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(procs[1].pid, signal.SIGKILL)  # node 1 dies: its agent and (in its own session) its worker
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        code = procs[0].wait(timeout=HANG_S)
    finally:
        _stop(procs)
    text = logs[0].read_text()
    errors = [line for line in text.splitlines() if "error:" in line]
    assert code != 0 and len(errors) == 1, text[-4000:]
    run = tmp_path / "runs" / "exp"
    assert errors[0].startswith("train_dual.py: error: rank 0: another process of this DDP run stopped")
    assert f"--resume {run / 'weights' / 'last.pt'}" in errors[0]
    assert "Traceback" not in text.split("failed (exitcode")[0]  # the worker's part; torchrun's own report follows
    ck = torch.load(run / "weights" / "last.pt", map_location="cpu", weights_only=True)
    assert ck["epoch"] == 0 and read_results(run / "results.csv")["epoch"].tolist() == [0.0]
