"""--resume is exact: a CPU run interrupted after epoch 0 and resumed ends epoch 1 with the same model, EMA and
optimizer state as a run that was never interrupted (float32 checkpoints carry optimizer, EMA, RNG states and
loop counters). Also: a resumed run keeps its folder and options, and a finished (stripped) run refuses.

Tiny on purpose: 16 synthetic training images of 96 px, gelan-t at --img 64, batch 8 (2 steps per epoch).
Run: python -m pytest -q tests/test_train_resume.py
"""

import pytest
import torch

from yolov9c.cli.train import parse_opt
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.trainer import TrainError, train


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=1, root=tmp_path_factory.mktemp("syn"), n_train=16, n_val=4, imgsz=96))


def _opt(data, project, *extra):
    return parse_opt(["--data", data, "--cfg", "gelan-t.yaml", "--img", "64", "--batch", "8", "--epochs", "3",
                      "--workers", "0", "--noval", "--noplots", "--project", str(project), *extra])


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def test_resume_equals_uninterrupted(data, tmp_path):
    quiet = dict(log=lambda *a, **k: None)
    a = train(_opt(data, tmp_path / "a"), stop_after_epoch=1, **quiet)
    b = train(_opt(data, tmp_path / "b"), stop_after_epoch=0, **quiet)
    last_b = b["save_dir"] / "weights" / "last.pt"
    assert _load(last_b)["epoch"] == 0
    r = train(parse_opt(["--resume", str(last_b)]), stop_after_epoch=1, **quiet)
    assert r["save_dir"] == b["save_dir"]
    ca, cb = _load(a["save_dir"] / "weights" / "last.pt"), _load(last_b)
    assert ca["epoch"] == cb["epoch"] == 1 and ca["updates"] == cb["updates"] > 0
    for key in ("model", "ema"):
        assert ca[key].keys() == cb[key].keys()
        for k in ca[key]:
            assert ca[key][k].dtype == cb[key][k].dtype
            assert torch.equal(ca[key][k], cb[key][k]), f"{key}.{k} differs after resume"
    sa, sb = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert sa.keys() == sb.keys() and len(sa) > 0
    for k in sa:
        assert torch.equal(sa[k]["momentum_buffer"], sb[k]["momentum_buffer"])
    assert [g["lr"] for g in ca["optimizer"]["param_groups"]] == [g["lr"] for g in cb["optimizer"]["param_groups"]]
    assert any(bool(s["momentum_buffer"].abs().sum() > 0) for s in sa.values())  # training really moved
    # results.csv of the resumed run has one row per epoch (0 and 1)
    rows = (b["save_dir"] / "results.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[2].split(",")[0].strip() == "1"


def test_resume_of_a_stripped_checkpoint_refuses(tmp_path):
    import yaml

    from yolov9c import build_model
    from yolov9c.models.checkpoint import save_checkpoint

    run = tmp_path / "exp"
    (run / "weights").mkdir(parents=True)
    (run / "opt.yaml").write_text(yaml.safe_dump({k: v for k, v in vars(parse_opt([])).items() if k != "given"}))
    save_checkpoint(run / "weights" / "last.pt", build_model("gelan-t", nc=2), epoch=-1)  # as after the strip
    with pytest.raises(TrainError, match="stripped"):
        train(parse_opt(["--resume", str(run / "weights" / "last.pt")]), log=lambda *a, **k: None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainError, match="no last.pt"):
        train(parse_opt(["--resume", "--project", str(tmp_path / "empty")]), log=lambda *a, **k: None)
