"""`train_dual.py --backend c` on the CPU (the c backend through the C implementations): a one-epoch run on the
synthetic data writes the run folder, and its first training iteration gives the same loss as a `--backend
torch` run from the same seed (fp32, within 1e-4 relative). Checkpoints of a c run are plain torch: the same
state_dict keys and shapes as a torch run's. Also: `--backend c` without the built extension is one clear error;
each backend trains with its own loss, whatever YOLOV9C_LOSS_BACKEND says (the developer tool that swaps the loss,
dev/accuracy/train_other_loss.py, is tested in dev/tests/test_patched_train.py).

The backends' comparison runs yolov9-t (dual head, auxiliary branch) at 64×64, one batch of 4 images per epoch
(so the first iteration is the whole epoch), without the final best.pt validation, on one CPU thread; the loss
backend's wiring runs gelan_mini (tests/conftest.py) the same way. The layer-by-layer equality of the backends on
every model family is the backend's own tests' job (tests/backends/test_backend_c.py).
Run: python -m pytest -q tests/engine/train/test_train_backend.py
"""

import pytest
import torch
import yaml

import yolov9c.engine.train.state as train_state
from yolov9c.cli.train import main
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train.results import read_results

REL_TOL = 1e-4  # fp32 on the CPU; the backends differ only in summation order
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=5, root=tmp_path_factory.mktemp("syn"), n_train=4, n_val=2, imgsz=64))


def _train(data, project, monkeypatch, backend, *extra):
    """Run train_dual.py's main in-process; returns the first loss the trainer computed (total, items)."""
    seen = []
    real = train_state.make_loss

    def recording_make_loss(model, hyp=None, backend="torch"):
        fn = real(model, hyp, backend=backend)

        def loss(preds, targets):
            out = fn(preds, targets)
            seen.append((out[0].detach().clone(), out[1].detach().clone()))
            return out
        return loss

    monkeypatch.setattr(train_state, "make_loss", recording_make_loss)
    argv = ["--data", data, "--cfg", "yolov9-t.yaml", "--img", "64", "--batch", "4", "--epochs", "1",
            "--workers", "0", "--noplots", "--noval", "--device", "cpu", "--seed", "7", "--project", str(project),
            "--backend", backend, *extra]
    assert main(argv) == 0
    assert seen, "the trainer never called the loss"
    return seen[0]


def test_c_backend_trains_and_matches_torch(data, tmp_path, monkeypatch, capsys):
    loss_t, items_t = _train(data, tmp_path / "t", monkeypatch, "torch")
    capsys.readouterr()
    loss_c, items_c = _train(data, tmp_path / "c", monkeypatch, "c", "--ckpt")
    out = capsys.readouterr().out
    assert "backend: c" in out
    assert "--ckpt ignored" in out  # --ckpt is torch-backend checkpointing

    rel = ((loss_c - loss_t).abs() / loss_t.abs()).max().item()
    assert rel <= REL_TOL, f"first-iteration loss c {loss_c.tolist()} vs torch {loss_t.tolist()}: rel {rel:.2e}"
    # the box and DFL items here are ~1e-4, differences of O(1) float32 values (1 − CIoU, DFL terms near their
    # floor): their rounding is absolute, ~1e-8 (measured 1.2e-8 and 2.0e-8 on one machine, 1.1e-4 relative)
    assert torch.allclose(items_c, items_t, rtol=REL_TOL, atol=1e-7), \
        f"loss items c {items_c.tolist()} vs torch {items_t.tolist()}"

    run_t, run_c = tmp_path / "t" / "exp", tmp_path / "c" / "exp"
    res = read_results(run_c / "results.csv")
    assert res["epoch"].tolist() == [0.0]
    assert all(torch.isfinite(torch.tensor(v)).all() for v in res.values())
    assert res["train/box_loss"][0] > 0 and res["val/cls_loss"][0] > 0
    assert yaml.safe_load((run_c / "opt.yaml").read_text())["backend"] == "c"
    assert yaml.safe_load((run_t / "opt.yaml").read_text())["backend"] == "torch"
    sd_t = torch.load(run_t / "weights" / "last.pt", map_location="cpu", weights_only=True)["model"]
    sd_c = torch.load(run_c / "weights" / "last.pt", map_location="cpu", weights_only=True)["model"]
    assert list(sd_c) == list(sd_t)
    assert all(sd_c[k].shape == sd_t[k].shape for k in sd_t)


def test_default_backend_follows_the_device():
    from yolov9c.cli.train import parse_opt
    from yolov9c.engine.train.errors import TrainError
    from yolov9c.engine.train.state import resolve_backend as _resolve_backend

    said = []
    opt = parse_opt([])
    assert opt.backend is None  # resolved by the trainer once the device is known
    assert _resolve_backend(opt, torch.device("cpu"), 1, said.append) == "torch"
    assert _resolve_backend(opt, torch.device("cuda", 0), 1, said.append) == "c"
    assert _resolve_backend(parse_opt(["--backend", "c"]), torch.device("cpu"), 1, said.append) == "c"
    assert _resolve_backend(parse_opt(["--backend", "torch"]), torch.device("cuda", 0), 1, said.append) == "torch"
    assert not said
    # c computes BatchNorm statistics per process: --sync-bn under DDP keeps torch, or refuses an explicit c
    assert _resolve_backend(parse_opt(["--sync-bn"]), torch.device("cuda", 0), 2, said.append) == "torch"
    assert "--sync-bn" in said[0]
    with pytest.raises(TrainError, match="--sync-bn"):
        _resolve_backend(parse_opt(["--sync-bn", "--backend", "c"]), torch.device("cuda", 0), 2, said.append)


@pytest.mark.parametrize("backend", ["c", "torch"])  # torch: validation's NMS would stop the run after an epoch
def test_either_backend_without_the_extension_says_how_to_build(backend, data, tmp_path, monkeypatch, capsys):
    import yolov9c.ops.extension as ext

    def not_built():
        raise ImportError(ext._BUILD_HINT + " (No module named 'yolov9c._C')")

    monkeypatch.setattr(ext, "load", not_built)
    monkeypatch.setenv("YOLOV9C_FUSED", "1")
    argv = ["--data", data, "--cfg", "yolov9-t.yaml", "--img", "64", "--batch", "4", "--epochs", "1",
            "--workers", "0", "--device", "cpu", "--project", str(tmp_path / "runs"), "--backend", backend]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert ("--backend c" if backend == "c" else "NMS") in err and "not built" in err
    assert "setup.py build_ext --inplace" in err and "YOLOV9C_FUSED=0" in err
    assert not (tmp_path / "runs").exists()  # refused before a run folder is made


@pytest.mark.parametrize("backend", ["c", "torch"])
def test_each_backend_trains_with_its_own_loss(backend, data, gelan_mini, tmp_path, monkeypatch):
    """YOLOV9C_LOSS_BACKEND (a removed developer switch) set to the other backend changes nothing: the trainer
    builds the loss on the run's --backend only. (The wiring, not the model: gelan_mini, tests/conftest.py.)"""
    real, used = train_state.make_loss, []

    def recording(model, hyp=None, backend="torch"):
        used.append(backend)
        return real(model, hyp, backend)

    monkeypatch.setattr(train_state, "make_loss", recording)
    monkeypatch.setenv("YOLOV9C_LOSS_BACKEND", "torch" if backend == "c" else "c")
    argv = ["--data", data, "--cfg", gelan_mini, "--img", "64", "--batch", "4", "--epochs", "1",
            "--workers", "0", "--noplots", "--noval", "--device", "cpu", "--project", str(tmp_path),
            "--backend", backend]
    assert main(argv) == 0
    assert used and set(used) == {backend}
