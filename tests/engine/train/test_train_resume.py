"""--resume is exact: a CPU run interrupted after epoch 0 and resumed ends epoch 1 with the same model, EMA and
optimizer state as a run that was never interrupted (float32 checkpoints carry optimizer, EMA, RNG states and
loop counters). Also: a resumed run keeps its folder and options, and a finished (stripped) run refuses.

Tiny on purpose: 16 synthetic training images of 96 px, gelan-t at --img 64, batch 8 (2 steps per epoch).
Run: python -m pytest -q tests/engine/train/test_train_resume.py
"""

from pathlib import Path

import pytest
import torch

from yolov9c.cli.train import parse_opt
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train.trainer import TrainError, train


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
    with pytest.raises(TrainError, match="nothing to resume: this run finished"):
        train(parse_opt(["--resume", str(run / "weights" / "last.pt")]), log=lambda *a, **k: None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainError, match="no last.pt"):
        train(parse_opt(["--resume", "--project", str(tmp_path / "empty")]), log=lambda *a, **k: None)


@pytest.fixture(scope="module")
def interrupted(data, tmp_path_factory):
    """A run interrupted after epoch 0 of 2 at --batch 8 --accumulate 1 (nominal 8: 2 optimizer steps of 8
    images per epoch), Adam, --save-period 1; its best fitness set to 0.5, a value it cannot beat."""
    first = parse_opt(["--data", data, "--cfg", "gelan-t.yaml", "--img", "64", "--batch", "8", "--accumulate", "1",
                       "--epochs", "2", "--workers", "0", "--noplots", "--noval", "--optimizer", "Adam",
                       "--save-period", "1", "--project", str(tmp_path_factory.mktemp("interrupted"))])
    run = train(first, stop_after_epoch=0, log=lambda *a, **k: None)["save_dir"]
    last = run / "weights" / "last.pt"
    ck = _load(last)
    assert ck["epoch"] == 0 and ck["nominal_batch"] == 8 and ck["updates"] == 2
    assert {int(s["step"]) for s in ck["optimizer"]["state"].values()} == {2}
    ck["best_fitness"] = 0.5
    torch.save(ck, last)
    return run


def _copy_run(run, tmp_path):
    import shutil

    return Path(shutil.copytree(run, tmp_path / run.name))


def test_resume_with_other_memory_knobs_keeps_the_nominal_batch(interrupted, tmp_path):
    """Resumed with --batch-size 4 --accumulate 2 --workers 1: the run finishes, opt.yaml shows the new knobs,
    epoch 1 still makes 2 optimizer steps of 8 images, and the optimizer (Adam's step counts), EMA, epoch and
    best fitness came back from the checkpoint."""
    import yaml

    run = _copy_run(interrupted, tmp_path)
    last = run / "weights" / "last.pt"
    hyp_before = yaml.safe_load((run / "opt.yaml").read_text())["hyp"]
    lines = []
    out = train(parse_opt(["--resume", str(last), "--batch-size", "4", "--accumulate", "2", "--workers", "1"]),
                log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert out["save_dir"] == run and out["epochs_done"] == 2
    text = "\n".join(lines)
    assert "Resuming training from" in text and "from epoch 1 to 2" in text
    assert "Resuming with --batch-size 4 (was 8) x accumulate 2 = nominal batch 8" in text
    assert "WARNING: the nominal batch changes" not in text
    stored = yaml.safe_load((run / "opt.yaml").read_text())
    assert (stored["batch_size"], stored["accumulate"], stored["workers"]) == (4, 2, 1)
    assert stored["hyp"] == hyp_before and stored["epochs"] == 2
    e1 = _load(run / "weights" / "epoch1.pt")  # --save-period 1 came back from opt.yaml; not stripped
    assert e1["epoch"] == 1 and e1["nominal_batch"] == 8
    assert e1["updates"] == 4  # EMA: 2 steps in epoch 0 (batch 8) + 2 steps of 2 x 4 images in epoch 1
    assert {int(s["step"]) for s in e1["optimizer"]["state"].values()} == {4}  # Adam state continued
    assert e1["best_fitness"] == 0.5 and e1["best_epoch"] == 0
    assert e1["opt"]["batch_size"] == 4
    rows = (run / "results.csv").read_text().splitlines()
    assert [r.split(",")[0].strip() for r in rows[1:]] == ["0", "1"]
    assert _load(last)["epoch"] == -1  # finished: stripped


class _Stop(Exception):
    pass


def test_resume_with_a_changed_nominal_batch_warns(interrupted, tmp_path):
    run = _copy_run(interrupted, tmp_path)
    lines = []

    def log(*a, **k):
        lines.append(" ".join(map(str, a)))
        if lines[-1].startswith("WARNING: the nominal batch"):
            raise _Stop  # the warning comes before any data is loaded: no need to train on

    with pytest.raises(_Stop):
        train(parse_opt(["--resume", str(run / "weights" / "last.pt"), "--batch-size", "4", "--accumulate", "1"]),
              log=log)
    assert "changes from 8 to 4 images per optimizer step" in lines[-1]
    assert "Resuming with --batch-size 4 (was 8) x accumulate 1 = nominal batch 4" in lines[-2]


def test_weights_transfer_from_another_class_count(data, tmp_path, caplog):
    """--weights with a checkpoint of 80 classes on 8-class data: every tensor whose name and shape match is
    transferred (logged "Transferred X/Y items"), the class convolutions of the head are skipped."""
    import logging

    from yolov9c import build_model
    from yolov9c.data.dataset_yaml import load_data_config
    from yolov9c.models.checkpoint import save_checkpoint

    src = build_model("gelan-t", nc=80)
    save_checkpoint(tmp_path / "src.pt", src)  # fp16, so the published half().float() keeps the values
    nc = load_data_config(data)["nc"]
    assert nc != 80
    dst = build_model("gelan-t", nc=nc).state_dict()
    ssd = src.state_dict()
    same = [k for k, v in dst.items() if k in ssd and ssd[k].shape == v.shape]
    assert 0 < len(same) < len(dst)
    with caplog.at_level(logging.INFO):
        out = train(_opt(data, tmp_path, "--weights", str(tmp_path / "src.pt"), "--epochs", "2", "--freeze", "10"),
                    stop_after_epoch=0, log=lambda *a, **k: None)  # epoch 0's last.pt (float32); no finish
    assert f"Transferred {len(same)}/{len(dst)} items from {tmp_path / 'src.pt'}" in caplog.text
    ck = _load(out["save_dir"] / "weights" / "last.pt")
    w = ck["model"]["model.0.conv.weight"]  # frozen: still the transferred weights
    assert torch.equal(w.float(), ssd["model.0.conv.weight"].half().float())
    head = [k for k in dst if k not in same]
    assert all(ck["model"][k].shape == dst[k].shape for k in head)


@pytest.mark.parametrize("damage", ["empty", "missing", "old"])
def test_resume_survives_a_damaged_or_old_opt_yaml(interrupted, tmp_path, damage):
    """A 0-byte or missing opt.yaml (a kill while it was written) resumes from the options stored in last.pt;
    an older opt.yaml with an option this version does not know resumes with a warning. Never a TypeError."""
    import yaml

    run = _copy_run(interrupted, tmp_path)
    opt_yaml = run / "opt.yaml"
    if damage == "empty":
        opt_yaml.write_text("")
    elif damage == "missing":
        opt_yaml.unlink()
    else:
        stored = yaml.safe_load(opt_yaml.read_text())
        stored["some_old_flag"] = True
        del stored["val_period"]
        opt_yaml.write_text(yaml.safe_dump(stored, sort_keys=False))
    lines = []

    def log(*a, **k):
        lines.append(" ".join(map(str, a)))
        if lines[-1].startswith("Resuming with"):
            raise _Stop  # the options are read and applied: enough

    with pytest.raises(_Stop):
        train(parse_opt(["--resume", str(run / "weights" / "last.pt")]), log=log)
    text = "\n".join(lines)
    if damage == "old":
        assert "unknown options ignored: some_old_flag" in text
    else:
        assert f"WARNING: {opt_yaml} is {damage}; using the options stored in the checkpoint" in text
    assert "Resuming with --batch-size 8 (was 8) x accumulate 1 = nominal batch 8" in text
