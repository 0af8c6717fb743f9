"""--resume is exact: a CPU run interrupted after epoch 0 and resumed ends epoch 1 with the same model, EMA and
optimizer state as a run that was never interrupted (float32 checkpoints carry optimizer, EMA, RNG states and
loop counters). Also: a resumed run keeps its folder and options, and a finished (stripped) run refuses.

Tiny on purpose: 16 synthetic training images of 96 px, gelan-mini (tests/conftest.py: gelan-t's module kinds at
a fifth of its tensors) at --img 64, batch 8 (2 steps per epoch).
Run: python -m pytest -q tests/engine/train/test_resume.py
"""

import dataclasses
from pathlib import Path

import pytest
import torch

from yolov9c.cli.train import parse_opt
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train.trainer import TrainError, train


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=1, root=tmp_path_factory.mktemp("syn"), n_train=16, n_val=4, imgsz=96))


@pytest.fixture(scope="module")
def opt(data, gelan_mini):
    """opt(project, *extra): the RunConfig of a tiny 3-epoch training into `project`."""
    def make(project, *extra):
        return parse_opt(["--data", data, "--cfg", gelan_mini, "--img", "64", "--batch", "8", "--epochs", "3",
                          "--workers", "0", "--noval", "--noplots", "--project", str(project), *extra])
    return make


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def test_resume_equals_uninterrupted(opt, tmp_path):
    quiet = dict(log=lambda *a, **k: None)
    a = train(opt(tmp_path / "a"), stop_after_epoch=1, **quiet)
    b = train(opt(tmp_path / "b"), stop_after_epoch=0, **quiet)
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


def test_resume_of_a_stripped_checkpoint_refuses(tmp_path, gelan_mini):
    import yaml

    from yolov9c import build_model
    from yolov9c.models.checkpoint import save_checkpoint

    run = tmp_path / "exp"
    (run / "weights").mkdir(parents=True)
    (run / "opt.yaml").write_text(yaml.safe_dump({k: v for k, v in vars(parse_opt([])).items() if k != "given"}))
    save_checkpoint(run / "weights" / "last.pt", build_model(gelan_mini, nc=2), epoch=-1)  # as after the strip
    with pytest.raises(TrainError, match="nothing to resume: this run finished"):
        train(parse_opt(["--resume", str(run / "weights" / "last.pt")]), log=lambda *a, **k: None)
    # a plain state_dict (torch.save(model.state_dict())) never was a run: said so, not "this run finished"
    torch.save(build_model(gelan_mini, nc=2).state_dict(), tmp_path / "sd.pt")
    with pytest.raises(TrainError, match=r"sd.pt: a plain state_dict, not a training checkpoint: .* --weights "
                                         r".*sd.pt --cfg") as e:
        train(parse_opt(["--resume", str(tmp_path / "sd.pt")]), log=lambda *a, **k: None)
    assert "finished" not in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainError, match="no last.pt") as e:
        train(parse_opt(["--resume", "--project", str(tmp_path / "empty")]), log=lambda *a, **k: None)
    assert str(e.value).endswith("nothing to resume: start the run without --resume"), str(e.value)
    # the run folder (or its weights/) instead of the file: the error names the last.pt to give
    for given in (run, run / "weights"):
        with pytest.raises(TrainError) as e:
            train(parse_opt(["--resume", str(given)]), log=lambda *a, **k: None)
        assert str(e.value) == (f"--resume {given}: a folder, not a checkpoint; give the file: --resume "
                                f"{run / 'weights' / 'last.pt'}")


@pytest.fixture(scope="module")
def interrupted(data, gelan_mini, tmp_path_factory):
    """A run interrupted after epoch 0 of 2 at --batch 8 --accumulate 1 (nominal 8: 2 optimizer steps of 8
    images per epoch), Adam, --save-period 1; its best fitness set to 0.5, a value it cannot beat."""
    first = parse_opt(["--data", data, "--cfg", gelan_mini, "--img", "64", "--batch", "8", "--accumulate", "1",
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


def test_weights_transfer_from_another_class_count(data, opt, gelan_mini, tmp_path, caplog):
    """--weights with a checkpoint of 80 classes on 8-class data: every tensor whose name and shape match is
    transferred (logged "Transferred X/Y items"), the class convolutions of the head are skipped."""
    import logging

    from yolov9c import build_model
    from yolov9c.data.dataset_yaml import load_data_config
    from yolov9c.models.checkpoint import save_checkpoint

    src = build_model(gelan_mini, nc=80)
    save_checkpoint(tmp_path / "src.pt", src)  # fp16, so the published half().float() keeps the values
    nc = load_data_config(data)["nc"]
    assert nc != 80
    dst = build_model(gelan_mini, nc=nc).state_dict()
    ssd = src.state_dict()
    same = [k for k, v in dst.items() if k in ssd and ssd[k].shape == v.shape]
    assert 0 < len(same) < len(dst)
    with caplog.at_level(logging.INFO):
        out = train(opt(tmp_path, "--weights", str(tmp_path / "src.pt"), "--epochs", "2", "--freeze", "10"),
                    stop_after_epoch=0, log=lambda *a, **k: None)  # epoch 0's last.pt (float32); no finish
    assert f"Transferred {len(same)}/{len(dst)} items from {tmp_path / 'src.pt'}" in caplog.text
    ck = _load(out["save_dir"] / "weights" / "last.pt")
    w = ck["model"]["model.0.conv.weight"]  # frozen: still the transferred weights
    assert torch.equal(w.float(), ssd["model.0.conv.weight"].half().float())
    head = [k for k in dst if k not in same]
    assert all(ck["model"][k].shape == dst[k].shape for k in head)


def test_weights_of_an_unstripped_checkpoint_are_its_model_not_its_ema(data, opt, gelan_mini, tmp_path):
    """--weights last.pt of an unfinished run (model and EMA both stored): training starts from ckpt['model'], the
    raw weights, as the published train_dual.py (`csd = ckpt['model'].float().state_dict()`), not from the EMA."""
    import copy

    from yolov9c import build_model
    from yolov9c.models.checkpoint import save_checkpoint

    src = build_model(gelan_mini, nc=8)
    ema = copy.deepcopy(src)
    with torch.no_grad():
        for p in ema.parameters():
            p.mul_(0.5)  # another set of weights: which one was read shows in a frozen layer
    save_checkpoint(tmp_path / "last.pt", src, ema=ema, epoch=3)
    out = train(opt(tmp_path, "--weights", str(tmp_path / "last.pt"), "--epochs", "2", "--freeze", "10"),
                stop_after_epoch=0, log=lambda *a, **k: None)
    w = _load(out["save_dir"] / "weights" / "last.pt")["model"]["model.0.conv.weight"].float()  # frozen
    assert torch.equal(w, src.state_dict()["model.0.conv.weight"].half().float())
    assert not torch.equal(w, ema.state_dict()["model.0.conv.weight"].half().float())


def test_data_nc_overriding_the_model_yaml_is_logged(data, opt, gelan_mini, tmp_path):
    """The data's nc wins over the yaml's (or the checkpoint's) nc, with the published line `Overriding model.yaml
    nc=80 with nc=8` before the model summary; an equal nc logs nothing. --freeze 99 stops set-up right after the
    model is built."""
    from yolov9c import build_model
    from yolov9c.data.dataset_yaml import load_data_config
    from yolov9c.models.checkpoint import save_checkpoint

    nc = load_data_config(data)["nc"]
    assert nc != 80
    save_checkpoint(tmp_path / "src.pt", build_model(gelan_mini, nc=80))
    for extra, expect in ((), True), (("--weights", str(tmp_path / "src.pt"), "--cfg", ""), True), \
                         (("--single-cls",), True):
        lines = []
        with pytest.raises(TrainError, match="--freeze 99"):
            train(opt(tmp_path / "runs", "--freeze", "99", *extra), log=lambda *a, **k: lines.append(" ".join(a)))
        want = f"Overriding model.yaml nc=80 with nc={1 if '--single-cls' in extra else nc}"
        assert want in lines, lines
        assert lines.index(want) < next(i for i, s in enumerate(lines) if " summary: " in s)
    same = tmp_path / "same.yaml"
    same.write_text(Path(gelan_mini).read_text().replace("nc: 80", f"nc: {nc}"))
    lines = []
    with pytest.raises(TrainError, match="--freeze 99"):
        train(opt(tmp_path / "runs", "--freeze", "99", "--cfg", str(same)), log=lambda *a, **k: lines.append(str(a[0])))
    assert not any("Overriding" in s for s in lines)


def test_weights_without_cfg_build_the_checkpoints_model(data, gelan_mini, tmp_path):
    """--weights best.pt with no --cfg: the model the checkpoint stores, every tensor transferred (as the published
    `--cfg '' --weights`), not the untyped default yolov9-t with a partial transfer; --cfg typed still wins;
    --name cfg then names the run after the weights file."""
    from yolov9c import build_model
    from yolov9c.models.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "src.pt", build_model(gelan_mini, nc=80))
    base = ["--data", data, "--img", "64", "--batch", "8", "--epochs", "1", "--workers", "0", "--noval", "--noplots"]
    assert parse_opt(base + ["--weights", "w.pt"]).cfg == ""
    assert parse_opt(base + ["--weights", "w.pt", "--cfg", "gelan-t"]).cfg == "gelan-t"
    assert parse_opt(base).cfg == "yolov9-t.yaml"
    lines = []
    out = train(parse_opt(base + ["--weights", str(tmp_path / "src.pt"), "--project", str(tmp_path / "runs"),
                                  "--name", "cfg"]),
                stop_after_epoch=0, log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert f"model: the one {tmp_path / 'src.pt'} stores (--cfg builds another)" in lines
    assert out["save_dir"] == tmp_path / "runs" / "src"  # --name cfg with no --cfg: named after the weights
    ck = _load(out["save_dir"] / "weights" / "last.pt")
    assert ck["model"].keys() == build_model(gelan_mini, nc=8).state_dict().keys()


def test_empty_cfg_without_weights_asks_for_one_of_them(opt, tmp_path):
    """--cfg '' and no --weights: the published "either --cfg or --weights must be specified", before any run
    folder is made; not an error about a checkpoint the user never gave."""
    with pytest.raises(TrainError) as e:
        train(opt(tmp_path / "runs", "--cfg", ""), log=lambda *a, **k: None)
    assert str(e.value).startswith("either --cfg or --weights must be given") and "stores no" not in str(e.value)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


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


# --- a tampered opt.yaml: one `error:` line naming the file and key, before anything is written ---

# (change to opt.yaml, the error's words after "<run>/opt.yaml: "): wrong types, values out of range, unknown
# choices, options that exclude each other, and epochs that leave nothing to train (the run has trained 1 of 2)
TAMPERED = [
    ("epochs: -1", "epochs: must be an integer >= 1, got -1"),
    ("epochs: 0", "epochs: must be an integer >= 1, got 0"),
    ("epochs: 1", "epochs: must be more than the 1 epochs"),
    ("epochs: x", "epochs: must be an integer >= 1, got 'x'"),
    ("epochs: 3.0", "epochs: must be an integer >= 1, got 3.0"),
    ("batch_size: '8'", "batch_size: must be a positive integer (or -1 for AutoBatch), got '8'"),
    ("batch_size: 0", "batch_size: must be a positive integer (or -1 for AutoBatch), got 0"),
    ("imgsz: true", "imgsz: must be an integer >= 32, got true"),
    ("val_period: 0", "val_period: must be an integer >= 1, got 0"),
    ("val_period: x", "val_period: must be an integer >= 1, got 'x'"),
    ("workers: 1.5", "workers: must be an integer >= 0, got 1.5"),
    ("label_smoothing: 5", "label_smoothing: must be a number in [0, 1), got 5"),
    ("patience: -3", "patience: must be an integer >= 0, got -3"),
    ("freeze: [a]", "freeze: must be a list of layer indices (integers >= 0), got ['a']"),
    ("close_mosaic: x", "close_mosaic: must be an integer >= 0, got 'x'"),
    ("accumulate: 0", "accumulate: must be an integer >= 1, got 0 (or null: the nominal-64 rule)"),
    ("max_nonfinite: -1", "max_nonfinite: must be an integer >= 0, got -1"),
    ("mosaic: 1.5", "mosaic: must be a probability in [0, 1], got 1.5"),
    ("optimizer: RMSprop", "optimizer: must be one of SGD, Adam, AdamW, LION, got 'RMSprop'"),
    ("cache: gpu", "cache: must be one of ram, disk, val, got 'gpu'"),
    ("backend: cuda", "backend: must be one of torch, c, got 'cuda'"),
    ("main_recompute: x", "main_recompute: must be a stride"),
    ("keep_inputs: 7", "keep_inputs: must be 0 or 1, got '7'"),
    ("aux_recompute: 2", "aux_recompute: must be 0 or 1, got '2'"),
    ("mem_cap: 0", "mem_cap: the memory size must be positive"),
    ("mem_budget: lots", "mem_budget: cannot read the memory size 'lots'"),
    ("amp: 'no'", "amp: must be true or false, got 'no'"),
    ("noval: null", "noval: must be true or false, got null"),
    ("channels_last: 3", "channels_last: must be true or false, got 3"),
    ("hyp: 5", "hyp: must be a hyp file name or a mapping of hyperparameters, got 5"),
    ("hyp: {lr0: abc}", "hyp: lr0: 'abc' is not a number"),
    ("data: 7", "data: must be a text, got 7"),
    ("data: gone/data.yaml", "data: data yaml not found: gone/data.yaml (--resume reads the dataset from this file"),
    ("device: [0]", "device: must be a device text"),
    ("seed: x", "seed: must be an integer, got 'x'"),
    ("evolve: 3", "evolve: must be null in a training run's options, got 3"),
    ("{cos_lr: true, fixed_lr: true}", "cos_lr, flat_cos_lr and fixed_lr are alternatives: at most one may be on"),
    ("dynamic_img: true", "dynamic_img needs mem_budget SIZE"),
]


def _linked_run(run, tmp_path):
    """A copy of `run` whose checkpoints are hard links (no 30 MB copies) and whose small files are real copies
    (a tampered opt.yaml must not reach the fixture's)."""
    import os
    import shutil

    def copy(src, dst):
        return os.link(src, dst) if src.endswith(".pt") else shutil.copy2(src, dst)
    return Path(shutil.copytree(run, tmp_path / run.name, copy_function=copy))


def _files(run):
    """What a refused resume must leave as it was: every small file's bytes, and each checkpoint's inode, size
    and mtime (a rewrite, atomic or in place, changes one of them)."""
    def state(p):
        if p.suffix == ".pt":
            st = p.stat()
            return st.st_ino, st.st_size, st.st_mtime_ns
        return p.read_bytes()
    return {p.relative_to(run).as_posix(): state(p) for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def interrupted_read(interrupted):
    """(checkpoint, Resumed) of the untouched `interrupted` run: last.pt as read once (torch.load of it takes
    about a second; the parametrized cases below check the file itself by its inode, size and mtime), and what a
    corrected copy must read again."""
    from yolov9c.engine.train.resume import read_resume
    from yolov9c.models.checkpoint import read_checkpoint

    last = interrupted / "weights" / "last.pt"
    return read_checkpoint(last), read_resume(parse_opt(["--resume", str(last)]), log=lambda *a: None)


@pytest.mark.parametrize("change,says", TAMPERED, ids=[c for c, _ in TAMPERED])
def test_a_tampered_opt_yaml_is_one_error_line_and_the_run_stays_resumable(interrupted, interrupted_read, tmp_path,
                                                                            monkeypatch, change, says):
    """A value the command line would refuse, in opt.yaml: exit code 2, one `error:` line naming opt.yaml and the
    key, nothing trained or written (every file of the run, last.pt and the tampered opt.yaml included, byte for
    byte as before); with opt.yaml put back, the same --resume reads the run as before the tampering."""
    import yaml

    import yolov9c.engine.train.resume as R
    from inprocess import call
    from yolov9c.cli.train import main

    run = _linked_run(interrupted, tmp_path)
    opt_yaml, last = run / "opt.yaml", run / "weights" / "last.pt"
    ckpt, before = interrupted_read
    monkeypatch.setattr(R, "_read", lambda path: ckpt if Path(path) == last else pytest.fail(f"read {path}"))
    argv = ["--resume", str(last)]
    good = opt_yaml.read_bytes()
    opt = yaml.safe_load(good)
    opt.update(yaml.safe_load(change if change.startswith("{") else "{" + change + "}"))
    opt_yaml.write_text(yaml.safe_dump(opt, sort_keys=False))
    files = _files(run)
    r = call(main, argv)
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert errors[0].startswith(f"train_dual.py: error: {opt_yaml}: {says}"), errors[0]
    assert errors[0].endswith("nothing was trained or written"), errors[0]
    assert _files(run) == files and sorted(p.name for p in tmp_path.iterdir()) == [run.name]
    opt_yaml.write_bytes(good)
    after = R.read_resume(parse_opt(argv), log=lambda *a: None)
    assert after.action == "train" and after.ckpt["epoch"] == 0
    assert after.cfg == dataclasses.replace(before.cfg, resume=str(last), weights=str(last))


def test_a_refused_resume_then_resumes_to_the_end_once_corrected(interrupted, tmp_path):
    """`epochs: -1` once finished a 2-epoch run after 1 epoch and stripped last.pt: now refused, last.pt kept as
    it was, and with the value put back the same command trains epoch 1 and finishes the run."""
    import yaml

    from inprocess import call
    from yolov9c.cli.train import main

    run = _linked_run(interrupted, tmp_path)
    opt_yaml, last = run / "opt.yaml", run / "weights" / "last.pt"
    good = opt_yaml.read_text()
    opt_yaml.write_text(yaml.safe_dump({**yaml.safe_load(good), "epochs": -1}, sort_keys=False))
    r = call(main, ["--resume", str(last)])
    assert r.returncode == 2 and f"error: {opt_yaml}: epochs: must be an integer >= 1, got -1" in r.stderr
    assert _load(last)["epoch"] == 0 and _load(last)["optimizer"] is not None  # not stripped
    opt_yaml.write_text(good)
    r = call(main, ["--resume", str(last)])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = (run / "results.csv").read_text().splitlines()
    assert [row.split(",")[0].strip() for row in rows[1:]] == ["0", "1"]
    assert _load(last)["epoch"] == -1 and "done" in (run / "run_state.yaml").read_text()


def test_a_bad_stored_value_the_command_line_replaces_is_no_error(interrupted, interrupted_read, tmp_path,
                                                                   monkeypatch):
    """`val_period: 0` in opt.yaml with --val-period 2 given (a RESUME_OVERRIDES knob): the typed value is used;
    without it, a branch from weights/epoch0.pt is refused before its folder (exp-from-epoch0) is made."""
    import yolov9c.engine.train.resume as R
    from inprocess import call
    from yolov9c.cli.train import main

    run = _linked_run(interrupted, tmp_path)
    opt_yaml, last = run / "opt.yaml", run / "weights" / "last.pt"
    monkeypatch.setattr(R, "_read", lambda path: interrupted_read[0])  # last.pt and epoch0.pt: the same epoch 0
    opt_yaml.write_text(opt_yaml.read_text().replace("val_period: 1\n", "val_period: 0\n"))
    resumed = R.read_resume(parse_opt(["--resume", str(last), "--val-period", "2"]), log=lambda *a: None)
    assert resumed.cfg.val_period == 2 and resumed.action == "train"
    r = call(main, ["--resume", str(run / "weights" / "epoch0.pt")])
    assert r.returncode == 2 and f"error: {opt_yaml}: val_period: must be an integer >= 1, got 0" in r.stderr, \
        r.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [run.name]  # no exp-from-epoch0


def test_options_resume_does_not_take_are_named_in_one_warning(interrupted, interrupted_read, tmp_path,
                                                               monkeypatch):
    """--resume with --epochs 5 --img 96 (opt.yaml's win, as published): one WARNING line names both, not the
    knobs it does take (--workers); nothing typed beyond those: no line."""
    import yolov9c.engine.train.resume as R

    run = _linked_run(interrupted, tmp_path)
    last = run / "weights" / "last.pt"
    monkeypatch.setattr(R, "_read", lambda path: interrupted_read[0])
    lines = []
    resumed = R.read_resume(parse_opt(["--resume", str(last), "--epochs", "5", "--img", "96", "--workers", "1"]),
                            log=lines.append)
    assert resumed.cfg.epochs == 2 and resumed.cfg.imgsz == 64 and resumed.cfg.workers == 1
    warn = [ln for ln in lines if ln.startswith("WARNING: --resume")]
    assert len(warn) == 1 and "--epochs, --imgsz typed here not used" in warn[0], lines
    lines.clear()
    R.read_resume(parse_opt(["--resume", str(last), "--workers", "1"]), log=lines.append)
    assert not [ln for ln in lines if ln.startswith("WARNING")], lines


def test_resume_restores_no_divergence_stop_and_the_command_line_overrides_it(interrupted, interrupted_read,
                                                                               tmp_path, monkeypatch):
    """A run started with --no-divergence-stop resumes with it (opt.yaml); --divergence-stop given on the
    --resume command line turns the check back on."""
    import yolov9c.engine.train.resume as R

    run = _linked_run(interrupted, tmp_path)
    opt_yaml, last = run / "opt.yaml", run / "weights" / "last.pt"
    monkeypatch.setattr(R, "_read", lambda path: interrupted_read[0])
    text = opt_yaml.read_text()
    assert "divergence_stop: true\n" in text
    opt_yaml.write_text(text.replace("divergence_stop: true\n", "divergence_stop: false\n"))
    quiet = dict(log=lambda *a: None)
    assert R.read_resume(parse_opt(["--resume", str(last)]), **quiet).cfg.divergence_stop is False
    assert R.read_resume(parse_opt(["--resume", str(last), "--divergence-stop"]), **quiet).cfg.divergence_stop is True


# the options of the published parse_opt (train_dual.py:438-487), the keys of its opt.yaml with 'save_dir'
PUBLISHED_OPT_KEYS = (
    "weights", "cfg", "data", "hyp", "epochs", "batch_size", "imgsz", "rect", "resume", "nosave", "noval",
    "noautoanchor", "noplots", "evolve", "bucket", "cache", "image_weights", "device", "multi_scale", "single_cls",
    "optimizer", "sync_bn", "workers", "project", "name", "exist_ok", "quad", "cos_lr", "flat_cos_lr", "fixed_lr",
    "label_smoothing", "patience", "freeze", "save_period", "seed", "local_rank", "min_items", "close_mosaic",
    "entity", "upload_dataset", "bbox_interval", "artifact_alias", "save_dir")


@pytest.mark.parametrize("hyp", ["dict", "file of another machine"])
def test_resume_of_a_published_run_folder(interrupted, gelan_mini, tmp_path, hyp):
    """A run folder of the published train_dual.py after epoch 0 of 2: last.pt with pickled model objects and a
    numpy best_fitness, an opt.yaml of the published keys only (hyp a dict, or the path of a hyp file that is
    not here: the checkpoint's hyp is used), a 14-column results.csv. `--resume last.pt` trains epoch 1 and
    finishes: results.csv keeps epoch 0's row and adds epoch 1's."""
    import shutil
    import sys

    import numpy as np
    import yaml

    from inprocess import call
    from yolov9c import build_model
    from yolov9c.cli.train import main
    from yolov9c.engine.train import results

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))  # tests/models/test_checkpoint.py
    from test_checkpoint import PublishedLayout

    ours = _load(interrupted / "weights" / "last.pt")
    model, ema = build_model(gelan_mini, nc=ours["nc"]), build_model(gelan_mini, nc=ours["nc"])
    model.load_state_dict({k: v.float() for k, v in ours["model"].items()})
    ema.load_state_dict({k: v.float() for k, v in ours["ema"].items()})
    for m in (model, ema):  # the published ModelEMA.update_attr copies these onto the EMA before each save
        m.names, m.hyp = ours["names"], ours["hyp"]
    run = tmp_path / "runs" / "train" / "exp"
    (run / "weights").mkdir(parents=True)
    stored = yaml.safe_load((interrupted / "opt.yaml").read_text())
    opt = {k: stored.get(k) for k in PUBLISHED_OPT_KEYS}
    opt.update(save_dir="/home/someone/yolov9/runs/train/exp", local_rank=-1, evolve=None, resume=False,
               hyp=ours["hyp"] if hyp == "dict" else "/home/someone/yolov9/data/hyps/hyp.custom.yaml")
    PublishedLayout(tmp_path / "layout").save(
        run / "weights" / "last.pt", model, ema=ema, half=True,
        extra={"epoch": 0, "best_fitness": np.array([0.5]), "updates": ours["updates"],
               "optimizer": ours["optimizer"], "opt": opt})
    (run / "opt.yaml").write_text(yaml.safe_dump(opt, sort_keys=False))
    shutil.copy(interrupted / "hyp.yaml", run / "hyp.yaml")
    head, row0 = (interrupted / "results.csv").read_text().splitlines()[:2]
    (run / "results.csv").write_text(",".join(head.split(",")[:14]) + "\n" + ",".join(row0.split(",")[:14]) + "\n")

    r = call(main, ["--resume", str(run / "weights" / "last.pt")])
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"Resuming training from {run / 'weights' / 'last.pt'} from epoch 1 to 2 total epochs" in r.stdout
    rows = (run / "results.csv").read_text().splitlines()
    assert [row.split(",")[0].strip() for row in rows[1:]] == ["0", "1"]
    assert results.epochs_in(run / "results.csv") == [0, 1]  # both rows parse under the (widened) header
    assert rows[1].split(",")[:14] == row0.split(",")[:14]
    assert _load(run / "weights" / "last.pt")["epoch"] == -1  # finished and stripped
