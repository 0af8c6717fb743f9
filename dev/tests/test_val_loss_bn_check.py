"""dev/probes/val_loss_bn_check.py (docs/train.md FAQ on val/cls_loss): its eval-mode line is the validation loss
that training records (validate() with the training loss on the same checkpoint and loader settings), and the
batch-statistics line leaves the checkpoint's BatchNorm running statistics alone.
Run: python -m pytest -q dev/tests/test_val_loss_bn_check.py
"""

import json
from pathlib import Path

import pytest
import torch

import yolov9c
from inprocess import run_script
from yolov9c.data.dataset import DatasetConfig
from yolov9c.data.dataset_yaml import load_data_config
from yolov9c.data.loader import LoaderConfig, create_dataloader
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.val.validator import ValConfig, validate
from yolov9c.loss.detection import make_loss
from yolov9c.models.checkpoint import save_checkpoint
from yolov9c.models.weights import load_model

SCRIPT = Path(__file__).resolve().parents[2] / "dev" / "probes" / "val_loss_bn_check.py"


@pytest.mark.parametrize("cfg_name", ["gelan-t", "yolov9-t"])
def test_eval_line_is_the_recorded_validation_loss(tmp_path, cfg_name):
    data = synthetic_dataset(seed=4, root=tmp_path / "syn", n_train=2, n_val=4, imgsz=64)
    torch.manual_seed(0)
    weights, nc = tmp_path / "w.pt", load_data_config(str(data))["nc"]
    save_checkpoint(weights, yolov9c.build_model(cfg_name, nc=nc))
    ran = run_script(SCRIPT, "--weights", weights, "--data", data, "--img", 64, "--batch", 2)
    assert ran.returncode == 0, ran.stderr
    rows = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    assert [r["bn"] for r in rows] == ["eval (running statistics)", "batch statistics"]
    model = load_model(weights).eval()
    cfg = DatasetConfig(augment=False, rect=True, stride=32, pad=0.5, nc=nc)
    loader, _ = create_dataloader(load_data_config(str(data))["val"], 64, 2, LoaderConfig(cfg, workers=0),
                                  log=lambda *a: None)
    res = validate(model, loader, nc=nc, names=None, cfg=ValConfig(training=True), compute_loss=make_loss(model),
                   log=lambda *a: None)
    for k in ("box_loss", "cls_loss", "dfl_loss"):
        assert rows[0][k] == pytest.approx(res[k], abs=1e-4), (k, rows[0], res[k])
    assert rows[1]["cls_loss"] != rows[0]["cls_loss"]  # batch statistics: another forward
