"""The pieces of the training loop: parameter groups and optimizers (LION against its formula), LR lambdas and
warm-up (spec §1.4 values), the accumulation ramp, EMA decay and update, run-folder increments, results.csv.

Run: python -m pytest -q tests/engine/train/test_train_parts.py
"""

import dataclasses
import math
import re

import numpy as np
import pytest
import torch
from torch import nn

from yolov9c.engine.train import results as R
from yolov9c.engine.train.ema import ModelEMA
from yolov9c.engine.train.errors import TrainError
from yolov9c.engine.train.optim import Lion, build_optimizer, param_groups
from yolov9c.engine.run_dir import RunDirError, increment_path, latest_last_pt
from yolov9c.engine.train.schedule import lr_lambda, warmup, warmup_accumulate, warmup_iterations

HYP = dict(lr0=0.01, lrf=0.01, momentum=0.937, weight_decay=5e-4, warmup_bias_lr=0.1, warmup_momentum=0.8)


def _net():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1, bias=True))


def test_optim_groups_cover_each_parameter_once():
    net = _net()
    bias, decay, norm = param_groups(net)
    assert [id(p) for p in bias] == [id(net[0].bias), id(net[1].bias), id(net[2].bias)]
    assert [id(p) for p in decay] == [id(net[0].weight), id(net[2].weight)]
    assert [id(p) for p in norm] == [id(net[1].weight)]


@pytest.mark.parametrize("name,cls", [("SGD", torch.optim.SGD), ("Adam", torch.optim.Adam),
                                      ("AdamW", torch.optim.AdamW), ("LION", Lion)])
def test_optim_settings(name, cls):
    lines = []
    opt = build_optimizer(_net(), name, lr=0.01, momentum=0.937, decay=5e-4, log=lines.append)
    assert isinstance(opt, cls)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.0, 5e-4, 0.0]
    assert [len(g["params"]) for g in opt.param_groups] == [3, 2, 1]
    g0 = opt.param_groups[0]
    if name == "SGD":
        assert g0["nesterov"] and g0["momentum"] == 0.937
    elif name == "LION":
        assert g0["betas"] == (0.937, 0.99)
    else:
        assert g0["betas"] == (0.937, 0.999)
        assert g0.get("amsgrad", False) == (name == "AdamW")
    assert lines == [f"optimizer: {cls.__name__}(lr=0.01) with parameter groups 1 weight(decay=0.0), "
                     f"2 weight(decay=0.0005), 3 bias"]


def test_optim_lion_step_matches_the_formula():
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(5, dtype=torch.float64))
    opt = Lion([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.01)
    p0, m = p.detach().clone(), torch.zeros(5, dtype=torch.float64)
    for _ in range(3):
        g = torch.randn(5, dtype=torch.float64)
        p.grad = g.clone()
        opt.step()
        upd = torch.sign(0.9 * m + 0.1 * g)
        p0 = p0 * (1 - 0.1 * 0.01) - 0.1 * upd
        m = 0.99 * m + 0.01 * g
        torch.testing.assert_close(p.detach(), p0, rtol=0, atol=1e-15)


def test_schedule_lambdas():
    lin = lr_lambda("linear", 100, 0.01)
    assert lin(0) == 1.0 and math.isclose(lin(50), 0.505) and math.isclose(lin(100), 0.01)
    cos = lr_lambda("cos", 100, 0.01)
    assert cos(0) == 1.0 and math.isclose(cos(50), 0.505) and math.isclose(cos(100), 0.01)
    flat = lr_lambda("flat-cos", 100, 0.01)
    assert flat(0) == flat(49) == flat(50) == 1.0
    assert math.isclose(flat(75), 0.505) and math.isclose(flat(100), 0.01)
    assert lr_lambda("fixed", 100, 0.01)(77) == 1.0
    with pytest.raises(ValueError):
        lr_lambda("step", 10, 0.1)


def test_schedule_warmup_ramps():
    assert warmup_iterations(3, 8) == 100 and warmup_iterations(3, 1000) == 3000
    opt = build_optimizer(_net(), "SGD", lr=0.01, momentum=0.937, decay=5e-4, log=lambda s: None)
    for g in opt.param_groups:
        g["initial_lr"] = 0.01
    lf = lr_lambda("linear", 10, 0.01)
    warmup(opt, 0, 100, 0, lf, HYP)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.0, 0.0]
    assert opt.param_groups[0]["momentum"] == 0.8
    warmup(opt, 50, 100, 0, lf, HYP)
    assert math.isclose(opt.param_groups[0]["lr"], 0.055) and math.isclose(opt.param_groups[1]["lr"], 0.005)
    assert math.isclose(opt.param_groups[2]["momentum"], 0.8685)
    warmup(opt, 100, 100, 1, lf, HYP)
    assert all(math.isclose(g["lr"], 0.01 * lf(1)) for g in opt.param_groups)
    # accumulation: 1 at the start, round(64 / batch) at the end of warm-up
    assert warmup_accumulate(0, 100, 64, 16) == 1 and warmup_accumulate(100, 100, 64, 16) == 4
    assert warmup_accumulate(50, 100, 64, 16) == 2 and warmup_accumulate(100, 100, 64, 128) == 1


def test_ema_decay_and_update():
    torch.manual_seed(0)
    net = _net()
    ema = ModelEMA(net)
    assert ema.decay(0) == 0.0 and math.isclose(ema.decay(2000), 0.9999 * (1 - math.exp(-1)))
    assert not any(p.requires_grad for p in ema.ema.parameters())
    before = {k: v.clone() for k, v in ema.ema.state_dict().items()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
        net[1].running_mean.add_(2.0)
    ema.updates = 999
    ema.update(net)
    d = 0.9999 * (1 - math.exp(-1000 / 2000))
    msd = net.state_dict()
    for k, v in ema.ema.state_dict().items():
        if v.dtype.is_floating_point:
            torch.testing.assert_close(v, d * before[k] + (1 - d) * msd[k])
        else:
            assert torch.equal(v, before[k])  # num_batches_tracked is not averaged
    assert ema.updates == 1000


def test_ema_update_walks_the_state_dict_once_and_equals_the_per_tensor_formula():
    torch.manual_seed(0)
    net = _net()
    ema, ref = ModelEMA(net), ModelEMA(net)
    walks = []
    real = net.state_dict
    net.state_dict = lambda *a, **k: walks.append(1) or real(*a, **k)
    for step in range(3):
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.5 + step)
            net[1].running_var.mul_(1.5)
        ema.update(net)
        ref.updates += 1  # the published per-tensor update, written out
        d = ref.decay()
        for k, v in ref.ema.state_dict().items():
            if v.dtype.is_floating_point:
                v.mul_(d).add_(real()[k], alpha=1 - d)
    assert len(walks) == 1  # the pairs are found once, then reused
    for k, v in ema.ema.state_dict().items():
        assert torch.equal(v, ref.ema.state_dict()[k]), k
    ema.update(_net())  # another model: its own pairs
    assert len(walks) == 1 and ema._pairs[0] is not net


def test_run_dir_increment_and_latest(tmp_path):
    assert increment_path(tmp_path / "exp") == tmp_path / "exp"
    (tmp_path / "exp").mkdir()
    assert increment_path(tmp_path / "exp") == tmp_path / "exp2"
    (tmp_path / "exp2").mkdir()
    assert increment_path(tmp_path / "exp", mkdir=True) == tmp_path / "exp3" and (tmp_path / "exp3").is_dir()
    assert increment_path(tmp_path / "exp", exist_ok=True) == tmp_path / "exp"
    assert latest_last_pt(tmp_path) is None
    import os
    for i, d in enumerate(("exp", "exp2")):
        f = tmp_path / d / "weights" / "last.pt"
        f.parent.mkdir()
        f.write_bytes(b"x")
        os.utime(f, (1000 + i, 1000 + (1 - i) * 10))
    assert latest_last_pt(tmp_path) == tmp_path / "exp" / "weights" / "last.pt"


def test_run_dir_that_cannot_be_made_is_one_line(tmp_path, capsys):
    # --project under a file: RunDirError (one line from val_dual, detect_dual and train_dual), not
    # NotADirectoryError's traceback; the same from both mkdir paths (a fresh name, --exist-ok)
    from yolov9c.cli.train import main

    (tmp_path / "f").write_text("a file")
    for exist_ok in (False, True):
        with pytest.raises(RunDirError, match=r"cannot make the run folder .*f/runs/exp.*Not a directory"):
            increment_path(tmp_path / "f" / "runs" / "exp", exist_ok=exist_ok, mkdir=True)
    code = main(["--cfg", "gelan-t.yaml", "--img", "64", "--epochs", "1", "--project", str(tmp_path / "f" / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("train_dual.py: error: cannot make the run folder")


def test_select_device_refuses_what_is_not_a_gpu_index(monkeypatch):
    # on a CUDA machine `--device cuda` was int('cuda')'s ValueError traceback and `--device 3` of one GPU
    # CUDA's invalid-ordinal error later: now one TrainError each, as val_dual and detect_dual say
    from yolov9c.engine.train.state import select_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for spec, says in (("cuda", "expected cpu, a GPU index"), ("mps", "expected cpu, a GPU index"),
                       ("0,cpu", "expected cpu, a GPU index"), ("3", "GPU 3 does not exist (1 visible)")):
        with pytest.raises(TrainError, match=re.escape(f"--device {spec}: {says}")):
            select_device(spec, -1)
    assert select_device("cuda:0", -1) == torch.device("cuda", 0) == select_device("", -1)
    assert select_device("cpu", -1) == torch.device("cpu")


def test_results_csv_format(tmp_path):
    f = tmp_path / "results.csv"
    R.append_row(f, list(range(len(R.COLUMNS))))
    R.append_row(f, [x / 3 for x in range(len(R.COLUMNS))])
    lines = f.read_text().splitlines()
    assert len(lines) == 3
    assert lines[0].split(",")[0] == "%20s" % "epoch" and len(lines[0].split(",")) == len(R.COLUMNS)
    assert lines[2].split(",")[1] == "%20.5g" % (1 / 3)
    data = R.read_results(f)
    assert list(data) == list(R.COLUMNS)
    np.testing.assert_allclose(data["x/lr0"], [11, 11 / 3], rtol=1e-4)
    with pytest.raises(ValueError):
        R.append_row(f, [1, 2])
    out = R.plot_results(f)
    assert out.name == "results.png" and out.stat().st_size > 1000


def test_results_csv_of_the_published_14_columns_is_widened(tmp_path):
    """A published run's results.csv (14 columns) resumed here: its rows stay, padded with nan, next to ours."""
    f = tmp_path / "results.csv"
    published = R.COLUMNS[:14]
    f.write_text(",".join("%20s" % c for c in published) + "\n" + ",".join("%20.5g" % v for v in range(14)) + "\n")
    R.append_row(f, [1] + [0.5] * (len(R.COLUMNS) - 1))
    R.append_row(f, [2] + [0.25] * (len(R.COLUMNS) - 1))
    assert R.epochs_in(f) == [0, 1, 2]
    data = R.read_results(f)
    assert list(data) == list(R.COLUMNS)
    np.testing.assert_array_equal(data["x/lr2"], [13, 0.5, 0.25])
    assert np.isnan(data["epoch_seconds"][0]) and data["epoch_seconds"][2] == 0.25


def test_results_png_has_smoothed_lines_and_a_legend():
    # as published: every panel shows the values and a Gaussian-smoothed line; the second panel has a legend
    y = np.array([0.0, 0.0, 0.0, 10.0, 0.0, 0.0, 0.0, 0.0])
    sm = R.smooth(y, sigma=1.0)
    assert sm.shape == y.shape and abs(sm.sum() - y.sum()) < 1e-9  # mass kept (no edge loss here)
    assert sm[3] == pytest.approx(10 * 0.3990, abs=1e-3) and sm[2] == sm[4] == pytest.approx(10 * 0.2420, abs=1e-3)
    assert np.allclose(R.smooth(np.full(5, 2.0)), 2.0)  # the mirrored ends keep a constant constant
    data = {k: np.linspace(0, 1, 6) ** 2 for k in R.COLUMNS}
    data["epoch"] = np.arange(6.0)
    fig = R.results_figure(data)
    axes = fig.axes
    assert len(axes) == 10 and all(len(a.get_lines()) == 2 for a in axes)
    assert np.allclose(axes[0].get_lines()[1].get_ydata(), R.smooth(data["train/box_loss"]))
    legend = axes[1].get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == ["results", "smooth"]


def test_results_train_batch_and_labels_images(tmp_path):
    import cv2
    imgs = torch.full((3, 3, 64, 64), 114, dtype=torch.uint8)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.5, 0.5], [2, 0, 0.25, 0.25, 0.2, 0.2]])
    R.plot_train_batch(imgs, targets, tmp_path / "train_batch0.jpg", names=["a", "b"])
    im = cv2.imread(str(tmp_path / "train_batch0.jpg"))
    assert im.shape == (128, 128, 3)
    assert (np.abs(im[:64, :64].astype(int) - 114) > 40).any()  # a box was drawn on image 0
    R.plot_labels([np.array([[0, .5, .5, .2, .2], [1, .3, .3, .1, .1]]), np.zeros((0, 5))], ["a", "b"],
                  tmp_path / "labels.jpg")
    assert cv2.imread(str(tmp_path / "labels.jpg")) is not None
    # as published, labels_correlogram.jpg beside it, and a panel of the boxes overlaid at the centre
    assert cv2.imread(str(tmp_path / "labels_correlogram.jpg")).shape == (800, 800, 3)
    over = R.box_overlay(np.array([[0, .5, .5, .2, .4], [1, .1, .9, .6, .1]]), size=101)
    drawn = np.argwhere((over != 255).any(2))
    # (row, col): box 0 (0.2 wide, 0.4 tall) spans rows 30-70, box 1 (0.6 wide, 0.1 tall) columns 20-80: centred
    assert (drawn.min(0) == [30, 20]).all() and (drawn.max(0) == [70, 80]).all()
    assert (over[30, 40:61] != 255).any(1).all() and (over[50, 20] != 255).any() and (over[50, 50] == 255).all()


def test_a_plot_that_cannot_be_written_warns_and_keeps_the_old_file(tmp_path, monkeypatch):
    """A full disk while a plot is written (results.png at the finish, labels.jpg at the start): a warning, the
    run goes on, and the file is the old one or absent, never a torso (written atomically)."""
    import errno
    from matplotlib.figure import Figure

    f = tmp_path / "results.csv"
    for k in range(3):
        R.append_row(f, [k] * len(R.COLUMNS))
    old = R.plot_results(f).read_bytes()

    def full_disk(self, fname, *a, **k):  # part of the file, then ENOSPC, as a full disk does
        if hasattr(fname, "write"):
            fname.write(b"\x89PNG torso")
        else:
            with open(fname, "wb") as fh:
                fh.write(b"\x89PNG torso")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    with pytest.warns(UserWarning, match=r"results\.png.*(No space left on device|disk)") as w:
        assert R.plot_results(f) is None
    assert len(w) == 1 and (tmp_path / "results.png").read_bytes() == old
    with pytest.warns(UserWarning) as w:
        assert R.plot_labels([np.array([[0, .5, .5, .2, .2]])], ["a"], tmp_path / "labels.jpg") is None
    assert [str(x.message).split()[0] for x in w] == ["labels.jpg", "labels_correlogram.jpg"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv", "results.png"]  # no torso, no temp


def test_step_accumulates_then_steps(tmp_path):
    """setup() builds a RunState; train_step (the loop's state.step) accumulates gradients for `accumulate`
    micro-batches and only then takes one optimizer step and one EMA update (state.progress.last_opt_step = ni)."""
    from yolov9c.cli.train import parse_opt
    from yolov9c.data.synthetic import synthetic_dataset
    from yolov9c.engine.train.state import setup
    from yolov9c.engine.train.step import prepare_batch

    data = synthetic_dataset(seed=3, root=tmp_path / "syn", n_train=4, n_val=2, imgsz=64)
    cfg = parse_opt(["--data", str(data), "--cfg", "gelan-t.yaml", "--img", "64", "--batch", "2", "--accumulate",
                     "2", "--workers", "0", "--noplots", "--device", "cpu", "--project", str(tmp_path / "runs")])
    state = setup(cfg, log=lambda *a, **k: None)
    assert state.step.name == "eager" and state.nb == 2
    assert (state.batching.accumulate, state.batching.nominal) == (2, 4)
    assert cfg.backend is None and state.cfg.backend == "torch"  # set-up resolves a copy; the caller's stays
    with pytest.raises(dataclasses.FrozenInstanceError):  # resolved once, never rewritten
        state.cfg.batch_size = 4
    with pytest.raises(AttributeError, match="built once by set-up"):  # sealed: progress and window change
        state.model = None
    state.model.train()
    before = [p.detach().clone() for p in state.model.parameters()]
    rng = np.random.default_rng(0)
    seen = []
    for ni, (imgs, targets, _, _) in enumerate(state.train_loader):
        r = state.step(state, prepare_batch(state, imgs, rng), targets, ni)
        grads = [p.grad for p in state.model.parameters() if p.grad is not None]
        seen.append((r.stepped, r.images, state.ema.updates, state.progress.last_opt_step,
                     any(bool(g.abs().sum() > 0) for g in grads)))
        assert r.loss_items.shape == (3,) and torch.isfinite(r.loss_items).all()
    # ni 0: gradients held, nothing stepped; ni 1: one step (gradients zeroed), EMA updated once
    assert seen == [(False, 2, 0, -1, True), (True, 2, 1, 1, False)]
    assert any(not torch.equal(a, p) for a, p in zip(before, state.model.parameters()))


def test_batching_is_the_one_accumulation_rule():
    """batching.py: the accumulation count at every iteration equals the published loop's ramp (warm-up from 1
    to round(64 / batch), then held), --accumulate N fixes it, and step_due is `ni - last >= accumulate`; the
    batch checks the CLI and set-up share name each conflict."""
    from yolov9c.engine.train.batching import NBS, batch_error, plan_batching

    nw = 100
    for batch, acc in ((2, None), (4, None), (16, None), (64, None), (100, None), (8, 3)):
        b = plan_batching(batch, acc, 1)
        assert b.nominal == (batch * acc if acc else NBS)
        published = acc or max(round(NBS / batch), 1)
        for ni in range(2 * nw):
            if ni <= nw and not acc:
                published = warmup_accumulate(ni, nw, NBS, batch)
            assert b.accumulate_at(ni, nw) == published, (batch, acc, ni)
            assert b.step_due(ni, ni - published, nw) and not b.step_due(ni, ni - published + 1, nw)
    kept = plan_batching(8, 2, 1, resumed_nominal=64, keep_nominal=True)  # resume at another batch size
    assert (kept.nominal, kept.fixed_accumulate, kept.per_rank) == (64, 8, 8)
    assert "both choose the batch" in batch_error(-1, 1, "2G")
    assert "runs in one process only" in batch_error(-1, 2) and "GPU" not in batch_error(-1, 2)
    assert "multiple of WORLD_SIZE 4 (the number of processes)" in batch_error(6, 4)  # CPU processes
    assert "multiple of WORLD_SIZE 4 (the number of GPUs)" in batch_error(6, 4, cuda=True)
    assert batch_error(8, 4) is None and batch_error(-1, 1) is None


def test_progress_is_what_a_checkpoint_carries():
    """state.Progress: every field goes into a checkpoint (save_epoch: checkpoint_fields, best_fitness and the
    epoch) and comes back from it (resume: load_checkpoint; the micro-batch through restore_micro_batch)."""
    from yolov9c.engine.train.state import Progress

    p = Progress(start_epoch=0, best_fitness=0.25, best_epoch=3, last_opt_step=41, metrics=[0.5] * 7,
                 maps=np.array([0.1, 0.2]), micro_batch=4)
    ck = dict(epoch=5, best_fitness=p.best_fitness, **p.checkpoint_fields())
    saved = set(ck) - {"epoch"} | {"start_epoch"}  # the epoch is stored, the next start derived from it
    assert saved == {f.name for f in dataclasses.fields(Progress)}
    q = Progress()
    q.load_checkpoint(ck)
    assert (q.start_epoch, q.best_fitness, q.best_epoch, q.last_opt_step, q.metrics) == (6, 0.25, 3, 41, [0.5] * 7)
    assert q.maps.tolist() == [0.1, 0.2] and ck["micro_batch"] == 4
