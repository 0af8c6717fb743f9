"""End-to-end training on the built-in synthetic data (CPU, tiny): `python train_dual.py ...` writes the
published run folder (hyp.yaml, opt.yaml, weights/last.pt + best.pt stripped + epochN.pt, results.csv with the
published and added columns and really computed validation losses, results.png, labels.jpg,
train_batch0-2.jpg, final validation plots), and the rarely used switches run together without error (the same
script in this process, tests/inprocess.py: the first run already starts train_dual.py as a real subprocess).
Both runs test the run, not the model: they train tests/conftest.py's gelan_mini (gelan-t's module kinds at 247
tensors instead of 1339; a tiny CPU run's cost is per tensor).

test_map_rises: a short from-scratch CPU run whose final validation mAP@0.5 rises clearly above zero and whose
training losses fall. Configuration (halved for the suite's 10-minute budget on 2 cores: 120 steps instead of
240, an easier task instead of 30 epochs): synthetic data seed 0, 64 training / 16 validation images of 96 px
with 1-2 shapes of 25-50 % of the image; gelan-t, --img 96, --batch 8, --epochs 15, --accumulate 1 (a step per
batch), --mosaic 0 --mixup 0, hyp.scratch-high with warmup_epochs 0 (the published floor keeps 100 warm-up
iterations of the 120) and scale 0.5, --noval (the last epoch is still validated), --nosave (only the last
epoch writes last.pt/best.pt: the training is the same, measured seed 0: mAP@0.5 0.286 and the loss ratios below
either way), --workers 0. Equivalent command:
    python train_dual.py --data <synthetic_dataset(seed=0, n_train=64, n_val=16, imgsz=96, boxes=(1, 2),
        size=(0.25, 0.5))> --cfg gelan-t.yaml --hyp <scratch-high, warmup_epochs 0, scale 0.5> --img 96 --batch 8
        --epochs 15 --accumulate 1 --mosaic 0 --mixup 0 --noval --nosave --noplots --workers 0 --seed S
Measured (this 2-core machine under other jobs' load, one thread, the trainer API): final
mAP@0.5 seed 0: 0.286, seed 1: 0.290, seed 2: 0.185; last/first epoch training loss (box, cls, dfl) seed 0:
0.51, 0.50, 0.57; seed 1: 0.40, 0.44, 0.56; seed 2: 0.68, 0.68, 0.72. Deliberately broken runs (seed 0): class
loss zeroed: mAP@0.5 0.000; box (CIoU) and DFL losses zeroed: 0.000. Asserted: mAP@0.5 > 0.09 (half the worst
seed) and each training loss of the last epoch < 0.75 x epoch 0's. Smaller sizes measured and rejected: 32
images x 30 epochs (mAP 0.002 / 0.032 / 0.000), 64 x 15 epochs of the old 1-4 shapes of 15-45 % (0.125 / 0.162
/ 0.067, losses to only 0.55-0.70 x), --img 64 (0.100 for seed 0). The earlier 30-epoch configuration measured
0.620 / 0.825 / 0.403 and took 84 s to 13 min (25 min seen) depending on load.
Runtime: 102-118 s per run under a load average of ~6-10 (the three seeds above); pytest of this test at a load
average of 2.7: 69 s.

Run: python -m pytest -q tests/engine/train/test_train_e2e.py
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from inprocess import run_script
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train.results import COLUMNS, read_results

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=2, root=tmp_path_factory.mktemp("syn"), n_train=16, n_val=8, imgsz=96))


def _args(data, cfg, project, *extra):
    return ["--data", data, "--cfg", cfg, "--img", "64", "--batch", "8", "--epochs", "2", "--workers",
            "0", "--project", str(project), *extra]


def _train(data, cfg, project, *extra):
    r = subprocess.run([sys.executable, str(REPO / "train_dual.py"), *_args(data, cfg, project, *extra)],
                       capture_output=True, text=True, cwd=project.parent, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def _train_here(data, cfg, project, monkeypatch, *extra):
    monkeypatch.chdir(project.parent)
    r = run_script(REPO / "train_dual.py", *_args(data, cfg, project, *extra))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def test_run_folder_files_and_results(data, gelan_mini, tmp_path):
    r = _train(data, gelan_mini, tmp_path / "runs", "--save-period", "1")
    run = tmp_path / "runs" / "exp"
    out = r.stdout + r.stderr
    for col in ("Epoch", "GPU_mem", "box_loss", "cls_loss", "dfl_loss", "Instances", "Size", "peak_mem"):
        assert col in out
    assert "Class     Images  Instances          P          R      mAP50   mAP50-95" in out
    assert "optimizer: SGD(lr=0.01) with parameter groups" in out and f"Results saved to {run}" in out
    for f in ("hyp.yaml", "opt.yaml", "results.csv", "results.png", "labels.jpg", "train_batch0.jpg",
              "train_batch1.jpg", "train_batch2.jpg", "confusion_matrix.png", "weights/last.pt", "weights/best.pt",
              "weights/epoch0.pt", "weights/epoch1.pt"):
        assert (run / f).is_file(), f
    res = read_results(run / "results.csv")
    assert list(res) == list(COLUMNS)
    assert res["epoch"].tolist() == [0.0, 1.0]
    assert (res["val/box_loss"] > 0).all() and (res["val/cls_loss"] > 0).all()  # really computed
    assert (res["train/box_loss"] > 0).all() and (res["epoch_seconds"] > 0).all() and (res["images_per_s"] > 0).all()
    assert (res["x/lr0"] > res["x/lr1"]).all()  # warm-up: bias lr comes down from 0.1, the others up from 0
    last = torch.load(run / "weights" / "last.pt", map_location="cpu", weights_only=True)
    assert last["epoch"] == -1 and last["optimizer"] is None and last["ema"] is None  # stripped
    assert all(v.dtype == torch.float16 for v in last["model"].values() if v.is_floating_point())
    mid = torch.load(run / "weights" / "epoch0.pt", map_location="cpu", weights_only=True)
    assert mid["epoch"] == 0 and mid["optimizer"] is not None and mid["nominal_batch"] == 64
    assert mid["model"]["model.0.conv.weight"].dtype == torch.float32  # resumable exactly


def test_rare_switches_together(data, gelan_mini, tmp_path, monkeypatch):
    _train_here(data, gelan_mini, tmp_path / "runs", monkeypatch, "--multi-scale", "--close-mosaic", "1", "--quad",
                "--image-weights", "--ckpt", "--freeze", "2", "--flat-cos-lr", "--optimizer", "LION", "--single-cls",
                "--noval", "--nosave", "--accumulate", "2", "--mosaic", "0.5", "--mixup", "0", "--name", "cfg",
                "--seed", "3")
    run = tmp_path / "runs" / Path(gelan_mini).stem  # --name cfg: the run is named after the model yaml
    assert sorted(p.name for p in (run / "weights").iterdir()) == ["best.pt", "last.pt"]
    res = read_results(run / "results.csv")
    assert len(res["epoch"]) == 2


MAP_MIN = 0.09  # measured 0.286 / 0.290 / 0.185 (seeds 0-2), broken losses 0.0: see the docstring
LOSS_FALL = 0.75  # last epoch / epoch 0, measured at most 0.72 (seed 2; seed 0: 0.57)


def test_map_rises(tmp_path):
    from yolov9c.cli.train import parse_opt
    from yolov9c.engine.train.trainer import train
    from yolov9c.resources import load_hyp

    data = synthetic_dataset(seed=0, root=tmp_path / "syn", n_train=64, n_val=16, imgsz=96, boxes=(1, 2),
                             size=(0.25, 0.5))
    hyp = load_hyp(None)
    hyp.update(warmup_epochs=0.0, scale=0.5)
    hyp_file = tmp_path / "hyp.yaml"
    hyp_file.write_text(yaml.safe_dump(hyp))
    opt = parse_opt(["--data", str(data), "--cfg", "gelan-t.yaml", "--hyp", str(hyp_file), "--img", "96", "--batch",
                     "8", "--epochs", "15", "--accumulate", "1", "--mosaic", "0", "--mixup", "0", "--noval",
                     "--nosave", "--noplots", "--workers", "0", "--seed", "0", "--project", str(tmp_path / "runs")])
    out = train(opt, log=lambda *a, **k: None)
    res = read_results(out["save_dir"] / "results.csv")
    assert res["epoch"].tolist() == [float(e) for e in range(15)]
    for k in ("train/box_loss", "train/cls_loss", "train/dfl_loss"):
        assert res[k][-1] < LOSS_FALL * res[k][0], (k, res[k][0], res[k][-1])
    map50 = float(res["metrics/mAP_0.5"][-1])
    assert out["metrics"]["map50"] == pytest.approx(map50, abs=1e-4)
    assert map50 > MAP_MIN, f"mAP@0.5 {map50:.3f} after 15 epochs (measured 0.286 with seed 0)"
