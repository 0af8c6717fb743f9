"""dev/accuracy/train_unfused.py, bench_accuracy.py's `unfused` runner: a one-epoch train_dual.py run with
validation (yolov9-t at 64 px on a synthetic set, the CPU, YOLOV9C_FUSED=0) trains on the ops' references but
validates with the extension's NMS, says so and puts nms's switch back; the same run without it validates with the
reference NMS (what made the unfused runs too slow); a multi-GPU --device is refused with one error line.
Run: OMP_NUM_THREADS=1 python -m pytest -q dev/tests/test_train_unfused.py
"""

import sys
from pathlib import Path

import pytest

import yolov9c.ops.bn_silu as bn_silu
import yolov9c.ops.nms as nms
from yolov9c.cli.train import main as train_main
from yolov9c.data.synthetic import synthetic_dataset

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "dev" / "accuracy"))
import train_unfused  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=6, root=tmp_path_factory.mktemp("syn"), n_train=4, n_val=2, imgsz=64))


def _argv(data, project):
    return ["--data", data, "--cfg", "yolov9-t.yaml", "--img", "64", "--batch", "4", "--epochs", "1", "--workers",
            "0", "--noplots", "--device", "cpu", "--project", str(project), "--backend", "c"]


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
    assert run(_argv(data, tmp_path)) in (0, None)
    assert ref_stats  # training: the BN statistics on their torch reference
    assert nms.extension is real  # put back
    assert (tmp_path / "exp" / "results.csv").is_file()
    if wrapped:
        assert not ref_nms  # validation: the extension's NMS
        assert "train_unfused.py: validation's NMS on the extension" in capsys.readouterr().out
    else:
        assert ref_nms


def test_a_multi_gpu_device_is_refused_before_training(data, tmp_path, capsys):
    argv = _argv(data, tmp_path / "runs")
    argv[argv.index("--device") + 1] = "0,1"
    assert train_unfused.main(argv) == 2
    assert capsys.readouterr().err == ("train_unfused.py: error: one process only: DDP workers would validate with "
                                       "the reference NMS\n")
    assert not (tmp_path / "runs").exists()
