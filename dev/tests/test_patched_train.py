"""The accuracy benchmark's swap runners, each a one-epoch train_dual.py run (yolov9-t at 64 px on a synthetic
set, the CPU) through dev/accuracy/patched_train.py:
- train_other_loss.py (the loss-* runners): one backend's model with the other backend's loss builds the loss on
  the named backend only, says so, records the model's --backend in opt.yaml and leaves the trainer's loss factory
  as it was; a loss that is no backend is refused with one error line. (The product trains each backend with its
  own loss: tests/engine/train/test_train_backend.py.)
- train_unfused.py (the unfused runner, YOLOV9C_FUSED=0): trains on the ops' references but validates with the
  extension's NMS, says so and puts nms's switch back; the same run without it validates with the reference NMS
  (what made the unfused runs too slow).
- train_micro.py (the microN runners, YOLOV9C_MICRO_BATCH=N): every forward/backward of the run sees N images of
  the loader batch, as after our out-of-memory guard's split; set-up's memory plan is put back; a variable that is
  no whole number is refused with one error line.
Each refuses a multi-GPU --device with one error line, before any training.
Run: OMP_NUM_THREADS=1 python -m pytest -q dev/tests/test_patched_train.py
"""

import sys
from pathlib import Path

import pytest
import yaml

import yolov9c.engine.train.state as train_state
import yolov9c.ops.bn_silu as bn_silu
import yolov9c.ops.nms as nms
from yolov9c.cli.train import main as train_main
from yolov9c.data.synthetic import synthetic_dataset

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "dev" / "accuracy"))
import train_micro  # noqa: E402
import train_other_loss  # noqa: E402
import train_unfused  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=5, root=tmp_path_factory.mktemp("syn"), n_train=4, n_val=2, imgsz=64))


def _argv(data, project, backend, val=False):
    return ["--data", data, "--cfg", "yolov9-t.yaml", "--img", "64", "--batch", "4", "--epochs", "1", "--workers",
            "0", "--noplots", "--device", "cpu", "--project", str(project), "--backend", backend] \
        + ([] if val else ["--noval"])


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


def _counting(monkeypatch, module, name):
    calls, real = [], getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("wrapped", [True, False])
def test_training_ops_on_references_validation_nms_on_the_extension(wrapped, data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    ref_nms = _counting(monkeypatch, nms, "nms_reference")
    ref_stats = _counting(monkeypatch, bn_silu, "_stats_reference")
    real = nms.extension
    run = train_unfused.main if wrapped else train_main
    assert run(_argv(data, tmp_path, "c", val=True)) in (0, None)
    assert ref_stats  # training: the BN statistics on their torch reference
    assert nms.extension is real  # put back
    assert (tmp_path / "exp" / "results.csv").is_file()
    if wrapped:
        assert not ref_nms  # validation: the extension's NMS
        assert "train_unfused.py: validation's NMS on the extension" in capsys.readouterr().out
    else:
        assert ref_nms


def test_unfused_refuses_a_multi_gpu_device_before_training(data, tmp_path, capsys):
    argv = _argv(data, tmp_path / "runs", "c")
    argv[argv.index("--device") + 1] = "0,1"
    assert train_unfused.main(argv) == 2
    assert capsys.readouterr().err == ("train_unfused.py: error: one process only: DDP workers would validate with "
                                       "the reference NMS\n")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("backend", ["c", "torch"])
def test_every_forward_sees_the_micro_batch(backend, data, tmp_path, monkeypatch, capsys):
    import yolov9c.engine.train.step as step

    seen, real = [], step.forward_backward

    def recording(state, imgs, targets):
        seen.append(imgs.shape[0])
        return real(state, imgs, targets)

    monkeypatch.setattr(step, "forward_backward", recording)
    monkeypatch.setenv("YOLOV9C_MICRO_BATCH", "2")
    plan = train_state.plan_memory
    assert train_micro.main(_argv(data, tmp_path, backend)) == 0
    assert seen and set(seen) == {2}  # batches of 4 images, each as two forwards of 2
    assert train_state.plan_memory is plan  # put back
    assert "train_micro.py: each loader batch runs as micro-batches of 2 images" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["", "0", "eight"])
def test_micro_refuses_a_variable_that_is_no_micro_batch(value, data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("YOLOV9C_MICRO_BATCH", value)
    assert train_micro.main(_argv(data, tmp_path / "runs", "c")) == 2
    assert capsys.readouterr().err.startswith("train_micro.py: error: YOLOV9C_MICRO_BATCH=")
    assert not (tmp_path / "runs").exists()
