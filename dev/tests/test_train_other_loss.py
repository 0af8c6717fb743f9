"""dev/accuracy/train_other_loss.py, bench_accuracy.py's loss-* runners: a one-epoch train_dual.py run (yolov9-t at
64 px on a synthetic set, the CPU) with one backend's model and the other backend's loss builds the loss on the
named backend only, says so, records the model's --backend in opt.yaml and leaves the trainer's loss factory as it
was; a loss that is no backend and a multi-GPU --device are refused with one error line, before any training.
(The product trains each backend with its own loss: tests/engine/train/test_train_backend.py.)
Run: OMP_NUM_THREADS=1 python -m pytest -q dev/tests/test_train_other_loss.py
"""

import sys
from pathlib import Path

import pytest
import yaml

import yolov9c.engine.train.state as train_state
from yolov9c.data.synthetic import synthetic_dataset

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "dev" / "accuracy"))
import train_other_loss  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=5, root=tmp_path_factory.mktemp("syn"), n_train=4, n_val=2, imgsz=64))


def _argv(data, project, backend):
    return ["--data", data, "--cfg", "yolov9-t.yaml", "--img", "64", "--batch", "4", "--epochs", "1", "--workers",
            "0", "--noplots", "--noval", "--device", "cpu", "--project", str(project), "--backend", backend]


@pytest.mark.parametrize("model, loss", [("c", "torch"), ("torch", "c")])
def test_the_model_of_one_backend_trains_with_the_loss_of_the_other(model, loss, data, tmp_path, monkeypatch,
                                                                    capsys):
    real, used = train_state.make_loss, []

    def recording(m, hyp=None, backend="torch"):
        used.append(backend)
        return real(m, hyp, backend)

    monkeypatch.setattr(train_state, "make_loss", recording)
    assert train_other_loss.main([loss, *_argv(data, tmp_path, model)]) == 0
    assert used and set(used) == {loss}
    assert train_state.make_loss is recording  # put back
    assert f"train_other_loss.py: the loss runs on the {loss} backend" in capsys.readouterr().out
    assert yaml.safe_load((tmp_path / "exp" / "opt.yaml").read_text())["backend"] == model


@pytest.mark.parametrize("first, device, why", [
    ("cuda", "cpu", "the first argument is the loss's backend (torch or c), then train_dual.py's flags"),
    ("torch", "0,1", "one process only: DDP workers would train with their own loss"),
])
def test_refusals_are_one_error_line_before_training(first, device, why, data, tmp_path, capsys):
    argv = _argv(data, tmp_path / "runs", "c")
    argv[argv.index("--device") + 1] = device
    assert train_other_loss.main([first, *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"train_other_loss.py: error: {why}\n"
    assert not (tmp_path / "runs").exists()
