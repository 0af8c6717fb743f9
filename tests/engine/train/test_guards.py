"""The trainer's guards (yolov9c/engine/train/guards.py) on the CPU, both backends, AMP off:

- non-finite steps: a NaN injected into one gradient skips exactly that optimizer step (weights, BatchNorm
  statistics, optimizer state and EMA unchanged by it), the run goes on and results.csv counts it in
  skipped_steps; a run on all-black images with lr0: 100 (every step non-finite) stops after --max-nonfinite
  skipped steps in a row with one `error:` line naming lr0 and exit code 2, and never writes a non-finite
  last.pt / best.pt; weights that are not finite at a checkpoint are never saved; the counter's rules;
- divergence at an epoch's end (guards.divergence): non-finite weights or exploding training losses stop the run
  naming them, a validation loss alone (the BatchNorm lag) only warns and a run once stopped for it resumes;
  --no-divergence-stop trains on with a warning;
- out of memory (an injected torch.cuda.OutOfMemoryError, raised after the micro-batch's backward so that its
  partial gradients are there to be dropped): the same batch runs again as two micro-batches, the nominal batch
  stays 8 images per optimizer step, the run ends bit-identical to one that used micro-batches of 4 from the
  start, a second OOM halves again, an OOM at one image is one `error:` line; the micro-batch is in last.pt and
  --resume keeps it; an OOM in validation validates again with a smaller batch.
Tiny on purpose: 16 synthetic images, gelan_mini (tests/conftest.py: gelan-t's module kinds at 247 tensors;
what is checked here is the run, not the model) at --img 64, batch 8 (2 batches per epoch). Runs whose end is not
under test stop after the epochs they need (train(stop_after_epoch=...), as an interruption: last.pt stays the
float32 checkpoint with EMA and optimizer; no strip, no final validation of best.pt). Shared where the tests
only read a run: one out-of-memory run per backend (oom_run) and one --resume of a copy of it (resumed_oom_run,
read by the micro-batch and the validation-loss tests).
On a CUDA GPU (marked `cuda`, skipped without one; last section): a real out-of-memory error (a per-process
memory limit below what the full batch needs) halves the micro-batch and the step completes; an allocation the GPU
cannot hold inside a real training run is survived by both backends; an injected NaN gradient is skipped on CUDA
with AMP on and off, both backends; the guard counts device flags without a host synchronisation.
Run: python -m pytest -q tests/engine/train/test_guards.py
(GPU cases: python -m pytest -q -m cuda tests/engine/train/test_guards.py)
"""

import math
import shutil

import cv2
import numpy as np
import pytest
import torch
import yaml

import yolov9c.engine.train.step as S
import yolov9c.engine.train.trainer as T
from inprocess import call
from yolov9c.cli.train import main, parse_opt
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train.guards import NonFiniteCounter, NonFiniteError, OutOfMemory, divergence
from yolov9c.engine.train.results import read_results
from yolov9c.engine.train.state import setup
from yolov9c.engine.train.step import prepare_batch
from yolov9c.engine.train.trainer import train
from yolov9c.resources import load_hyp

BACKENDS = ["torch", "c"]


@pytest.fixture(scope="module")
def data(tmp_path_factory, gelan_mini):
    """(data yaml, model yaml) of the CPU runs: 16 synthetic images, gelan_mini (tests/conftest.py)."""
    syn = synthetic_dataset(seed=1, root=tmp_path_factory.mktemp("syn"), n_train=16, n_val=4, imgsz=96)
    return str(syn), gelan_mini


def _args(data, project, backend, *extra):
    data, cfg = data
    return ["--data", data, "--cfg", cfg, "--img", "64", "--batch", "8", "--epochs", "2",
            "--accumulate", "1", "--workers", "0", "--noval", "--noplots", "--device", "cpu", "--backend", backend,
            "--project", str(project), *extra]


def _logger():
    lines = []
    return lines, lambda *a, **k: lines.append(" ".join(map(str, a)))


def _snapshot(state):
    opt = [{k: v.clone() for k, v in s.items() if torch.is_tensor(v)} for s in state.optimizer.state.values()]
    return ({k: v.clone() for k, v in state.model.state_dict().items()},
            {k: v.clone() for k, v in state.ema.ema.state_dict().items()}, state.ema.updates, opt)


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _load(path):
    """A checkpoint this module's runs wrote. weights_only=False: these are the tests' own files, and the
    weights-only unpickler costs ~0.5 s of CPU more per training checkpoint (8000 tensors); that the trainer's
    files load weights-only is checked by tests/models/test_checkpoint.py and by every --resume here."""
    return torch.load(path, map_location="cpu", weights_only=False)


def _finite(ck):
    return all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())


def _finite_weights(path):
    return _finite(_load(path))


# ---------------------------------------------------------------------------------------------------------
# non-finite steps
# ---------------------------------------------------------------------------------------------------------

def test_counter_counts_warns_once_and_stops_after_n_in_a_row():
    lines, log = _logger()
    c = NonFiniteCounter(3, log)
    causes = lambda: "likely causes: x"  # noqa: E731
    for ni, ok in enumerate([True, False, None, False, True, False, torch.tensor(False)]):
        c.observe(ok, 0, ni, causes)
    assert (c.epoch_skipped, c.in_a_row) == (4, 2) and sum("WARNING" in s for s in lines) == 1
    with pytest.raises(NonFiniteError, match="3 optimizer steps in a row.*likely causes: x"):
        c.observe(False, 0, 9, causes)
    never = NonFiniteCounter(0, log)
    for ni in range(50):
        never.observe(False, 0, ni, causes)
    assert never.total_skipped == 50


def test_amp_loss_scale_calibration_is_counted_but_does_not_stop_the_run():
    lines, log = _logger()
    scale = [65536.0]
    c = NonFiniteCounter(3, log, loss_scale=lambda: scale[0])
    causes = lambda: "likely causes: x"  # noqa: E731
    for ni in range(9):  # the GradScaler halves its scale at every overflow: 9 skips, none toward the limit
        scale[0] /= 2
        c.observe(False, 0, ni, causes)
    assert (c.epoch_skipped, c.epoch_calibration, c.in_a_row) == (9, 9, 0)
    assert sum(s.lstrip().startswith("AMP: fp16 gradient overflow") for s in lines) == 1
    assert not any("WARNING" in s for s in lines)
    scale[0] = 1.0  # the scale came down and the gradients still overflow: a real non-finite run
    c.observe(False, 0, 9, causes)
    c.observe(False, 0, 10, causes)
    with pytest.raises(NonFiniteError, match="3 optimizer steps in a row"):
        c.observe(False, 0, 11, causes)
    assert sum("WARNING: non-finite" in s for s in lines) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_injected_nan_gradient_skips_that_step_only(data, tmp_path, backend, monkeypatch):
    fb, opt_step = S.forward_backward, S.optimizer_step
    calls, seen = [], {}

    def forward_backward(state, imgs, targets):
        calls.append(len(calls))
        if len(calls) == 2:  # the second batch (ni 1): NaN in one gradient after its backward
            seen["before"] = _snapshot(state)
        out = fb(state, imgs, targets)
        if len(calls) == 2:
            next(p for p in state.model.parameters() if p.grad is not None).grad.view(-1)[0] = math.nan
        return out

    def optimizer_step(state):
        ok = opt_step(state)
        seen.setdefault("oks", []).append(ok)
        if len(calls) == 2:
            seen["after"] = _snapshot(state)
        return ok

    monkeypatch.setattr(S, "forward_backward", forward_backward)
    monkeypatch.setattr(S, "optimizer_step", optimizer_step)
    lines, log = _logger()
    out = train(parse_opt(_args(data, tmp_path, backend, "--epochs", "3")), stop_after_epoch=1, log=log)
    assert seen["oks"] == [True, False, True, True]
    (m0, e0, u0, o0), (m1, e1, u1, o1) = seen["before"], seen["after"]
    assert _same(m0, m1), "the skipped step changed the model (weights or BN statistics)"
    assert _same(e0, e1) and u0 == u1, "the skipped step changed the EMA"
    assert len(o0) == len(o1) and all(_same(a, b) for a, b in zip(o0, o1)), "the skipped step moved the optimizer"
    res = read_results(out["save_dir"] / "results.csv")
    assert res["skipped_steps"].tolist() == [1.0, 0.0]
    assert all(math.isfinite(v) for v in res["train/box_loss"])  # the means leave the NaN batch out
    assert sum("WARNING: non-finite loss or gradients at epoch 0, iteration 1" in s for s in lines) == 1
    assert any("WARNING: epoch 0: 1 optimizer steps skipped" in s for s in lines)
    assert _finite_weights(out["save_dir"] / "weights" / "last.pt") and out["epochs_done"] == 2


@pytest.fixture(scope="module")
def black(tmp_path_factory):
    """(data yaml, model yaml): the synthetic dataset with every image all black (8 training images: 2 batches of
    4) and gelan-t; and a hyp file with lr0: 100 and no augmentation."""
    root = tmp_path_factory.mktemp("black")
    data = synthetic_dataset(seed=1, root=root, n_train=8, n_val=4, imgsz=64)
    for f in [*root.rglob("*.jpg"), *root.rglob("*.png")]:
        im = cv2.imread(str(f))
        cv2.imwrite(str(f), np.zeros_like(im))
    hyp = load_hyp(None)
    hyp.update(lr0=100.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, degrees=0.0, translate=0.0, scale=0.0, shear=0.0,
               perspective=0.0, flipud=0.0, fliplr=0.0, mosaic=0.0, mixup=0.0, copy_paste=0.0)
    f = root / "hyp.lr100.yaml"
    f.write_text(yaml.safe_dump(hyp))
    return (str(data), "gelan-t.yaml"), str(f)  # gelan-t: gelan_mini's steps here are finite


@pytest.mark.parametrize("backend", BACKENDS)
def test_lr0_100_on_black_images_stops_with_one_error_line(black, tmp_path, backend, capsys):
    """Every step of this run is non-finite (measured: from iteration 0, with lr0 0.01 as well): after
    --max-nonfinite 4 in a row (epochs 0-1, 2 batches each: the count goes on across epochs) the run stops with exit
    code 2 and one error line. The default N is 10."""
    assert parse_opt([]).max_nonfinite == 10
    data, hyp = black
    rc = main(_args(data, tmp_path, backend, "--hyp", hyp, "--epochs", "8", "--batch", "4", "--name", "black",
                    "--max-nonfinite", "4"))
    err = capsys.readouterr().err
    errors = [s for s in err.splitlines() if "error:" in s]
    assert rc == 2 and len(errors) == 1, err[-2000:]
    assert "4 optimizer steps in a row" in errors[0] and "lr0=100.0" in errors[0]
    assert "--no-amp" not in errors[0]  # a CPU run has no AMP to blame
    assert "all-black" in errors[0]
    run = tmp_path / "black"
    for f in ("last.pt", "best.pt"):  # only ever written with finite weights (here: the untouched initial ones)
        if (run / "weights" / f).exists():
            assert _finite_weights(run / "weights" / f), f
    assert read_results(run / "results.csv")["skipped_steps"].tolist() == [2.0]  # epoch 1 stopped: no row


def test_a_non_finite_checkpoint_is_never_written(data, tmp_path, monkeypatch):
    real = T.make_checkpoint
    monkeypatch.setattr(T, "make_checkpoint", lambda *a, **k: pytest.fail("make_checkpoint reached"))

    def poison(state, epoch, stats):
        next(state.ema.ema.parameters()).data.view(-1)[0] = math.inf
        return end_epoch(state, epoch, stats)

    end_epoch = T.end_epoch
    monkeypatch.setattr(T, "end_epoch", poison)
    with pytest.raises(NonFiniteError, match="weights are not finite .*EMA.*not written"):
        train(parse_opt(_args(data, tmp_path, "torch")), log=lambda *a, **k: None)
    assert not (tmp_path / "exp" / "weights" / "last.pt").exists()
    assert real is not None


# ---------------------------------------------------------------------------------------------------------
# out of memory
# ---------------------------------------------------------------------------------------------------------

def _oom_when(monkeypatch, sizes_that_fail, times=1):
    """forward_backward raises OutOfMemoryError (after its backward) on the first `times` calls whose
    micro-batch has one of `sizes_that_fail` images; records every call's (size, image checksum, raised)."""
    fb, calls, left = S.forward_backward, [], {s: times for s in sizes_that_fail}

    def forward_backward(state, imgs, targets):
        out = fb(state, imgs, targets)
        n = imgs.shape[0]
        raise_it = left.get(n, 0) > 0
        calls.append((n, imgs.double().sum(dim=(1, 2, 3)), raise_it))
        if raise_it:
            left[n] -= 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return out
    monkeypatch.setattr(S, "forward_backward", forward_backward)
    return calls


def _images_per_step(monkeypatch):
    fb, opt_step, per, n = S.forward_backward, S.optimizer_step, [], [0]

    def forward_backward(state, imgs, targets):
        out = fb(state, imgs, targets)
        n[0] += imgs.shape[0]
        return out

    def optimizer_step(state):
        per.append(n[0])
        n[0] = 0
        return opt_step(state)
    monkeypatch.setattr(S, "forward_backward", forward_backward)
    monkeypatch.setattr(S, "optimizer_step", optimizer_step)
    return per


@pytest.fixture(scope="module")
def oom_run(data, tmp_path_factory):
    """oom_run(backend) -> (calls, per_step, lines, out): a run whose first micro-batch of 8 ran out of memory
    (injected, _oom_when), stopped after epoch 0 (--epochs 2: last.pt stays the float32 checkpoint with EMA and
    optimizer). Made once per backend: test_oom_halves_... reads it, and `resumed_oom_run` resumes a copy of the
    torch one."""
    runs = {}

    def get(backend):
        if backend not in runs:
            with pytest.MonkeyPatch.context() as mp:
                calls = _oom_when(mp, {8})
                per_step = _images_per_step(mp)  # wraps the OOM wrapper: counts only the micro-batches that ran
                lines, log = _logger()
                project = tmp_path_factory.mktemp(f"oom-{backend}")
                out = train(parse_opt(_args(data, project, backend)), stop_after_epoch=0, log=log)
            runs[backend] = calls, per_step, lines, out
        return runs[backend]
    return get


@pytest.mark.parametrize("backend", BACKENDS)
def test_oom_halves_the_micro_batch_and_retries_the_same_batch(data, oom_run, tmp_path, backend, monkeypatch):
    calls, per_step, lines, out = oom_run(backend)
    assert [(n, r) for n, _, r in calls] == [(8, True), (4, False), (4, False), (4, False), (4, False)]
    assert torch.equal(torch.cat([calls[1][1], calls[2][1]]), calls[0][1])  # the same batch, in two halves
    assert per_step == [8, 8]  # the nominal batch: 8 images per optimizer step (accumulate 1) as before
    assert sum("CUDA out of memory at iteration 0 with a micro-batch of 8" in s for s in lines) == 1
    last = _load(out["save_dir"] / "weights" / "last.pt")
    assert _finite(last)

    # the run equals one that ran micro-batches of 4 from the start: the failed pass left nothing behind
    setup = T.setup

    def setup_micro4(cfg, log, prog):
        state = setup(cfg, log, prog)
        state.progress.micro_batch = 4
        return state
    monkeypatch.setattr(T, "setup", setup_micro4)
    ref = train(parse_opt(_args(data, tmp_path / "b", backend)), stop_after_epoch=0, log=lambda *a, **k: None)
    ref_last = _load(ref["save_dir"] / "weights" / "last.pt")
    assert _same(last["model"], ref_last["model"]) and _same(last["ema"], ref_last["ema"])  # float32, bit for bit


def test_second_oom_halves_again_and_one_image_is_an_error(data, tmp_path, monkeypatch, capsys):
    calls = _oom_when(monkeypatch, {8, 4})
    lines, log = _logger()
    train(parse_opt(_args(data, tmp_path / "a", "torch")), stop_after_epoch=0, log=log)
    assert [n for n, _, _ in calls] == [8, 4, 2, 2, 2, 2, 2, 2, 2, 2]
    assert sum("WARNING: CUDA out of memory" in s for s in lines) == 2
    monkeypatch.undo()
    _oom_when(monkeypatch, {8, 4, 2, 1})
    rc = main(_args(data, tmp_path / "b", "torch", "--epochs", "1"))
    err = [s for s in capsys.readouterr().err.splitlines() if "error:" in s]
    assert rc == 2 and len(err) == 1 and "micro-batch of 1 image" in err[0] and "--img" in err[0]


@pytest.fixture(scope="module")
def resumed_oom_run(oom_run, tmp_path_factory):
    """(exit code, stdout, stderr, micro-batch sizes, run folder): `train_dual.py --resume` (main, in this process)
    of a copy of the torch oom_run (stopped after epoch 0 with a micro-batch of 4), its validation returning
    cls_loss 1.48e6 (a validation loss beyond 1e6 with normal training losses and finite weights). One resumed
    run read by two tests: the micro-batch that --resume keeps, and the warning that a huge validation loss alone
    gives."""
    run = tmp_path_factory.mktemp("resumed") / "exp"
    shutil.copytree(oom_run("torch")[3]["save_dir"], run)
    sizes, fb, validate = [], S.forward_backward, T.validate

    def lagging(model, loader, **kw):
        res = validate(model, loader, **kw)
        return {**res, "cls_loss": 1.48e6}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(S, "forward_backward", lambda st, im, t: sizes.append(im.shape[0]) or fb(st, im, t))
        mp.setattr(T, "validate", lagging)
        r = call(main, ["--resume", str(run / "weights" / "last.pt")])
    return r.returncode, r.stdout, r.stderr, sizes, run


def test_resume_keeps_the_reduced_micro_batch(oom_run, resumed_oom_run):
    assert _load(oom_run("torch")[3]["save_dir"] / "weights" / "last.pt")["micro_batch"] == 4
    rc, out, err, sizes, _ = resumed_oom_run
    assert rc == 0, err[-2000:]
    assert sizes == [4, 4, 4, 4] and any("Resuming with a micro-batch of 4" in s for s in out.splitlines())


def test_oom_in_validation_validates_again_with_a_smaller_batch(data, tmp_path, monkeypatch):
    validate, batches = T.validate, []

    def small_only(model, loader, **kw):
        batches.append(loader.batch_size)
        if loader.batch_size > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return validate(model, loader, **kw)
    monkeypatch.setattr(T, "validate", small_only)
    lines, log = _logger()
    out = train(parse_opt(_args(data, tmp_path, "torch", "--epochs", "1")), log=log)
    # the loader's batch is min(8, 4 validation images); validated again with 2, which best.pt's final validation keeps
    assert batches == [4, 2, 2]
    assert sum("validation at a batch of 4 images ran out of GPU memory: validated with 2" in s for s in lines) == 1
    assert out["epochs_done"] == 1 and out["val_batch"] == 2 and out["metrics"]["box_loss"] > 0  # the validation (with its loss) ran


# ---------------------------------------------------------------------------------------------------------
# divergence at an epoch's end (guards.stop_if_diverged)
# ---------------------------------------------------------------------------------------------------------

NORMAL = {"box_loss": 1.2, "cls_loss": 0.8, "dfl_loss": 1.1}  # an epoch's mean training losses, healthy


@pytest.mark.parametrize("val", [{"box_loss": 2.0, "cls_loss": 1.48e6, "dfl_loss": 1.5},
                                 {"box_loss": math.nan, "cls_loss": math.inf, "dfl_loss": 0.0}])
def test_a_validation_loss_alone_is_no_divergence(val):
    """The reported case: --fixed-lr at lr0 0.01, epoch 58, val cls_loss 1.48e6 with normal training losses and
    finite weights (the validation BatchNorm lag of docs/train.md's FAQ): training goes on, with one warning
    that names the loss, says the training losses and weights are fine and explains the lag."""
    stop, warning = divergence(NORMAL, "", val)
    assert stop is None
    assert "not a divergence, training goes on" in warning and "BatchNorm running statistics" in warning
    assert "cls_loss 0.8" in warning and ("cls_loss 1.48e+06" in warning or "box_loss nan, cls_loss inf" in warning)
    assert divergence(NORMAL, "", {"box_loss": 2.0, "cls_loss": 9e5, "dfl_loss": 1.5}) == (None, None)
    assert divergence(NORMAL, "", None) == (None, None)  # not validated this epoch


@pytest.mark.parametrize("train_losses,bad_weights,says", [
    (NORMAL, "EMA model.1.bn.running_var", "the weights are not finite (EMA model.1.bn.running_var)"),
    (None, "", "no training batch of the epoch had a finite loss"),
    ({**NORMAL, "cls_loss": 2.5e6}, "", "training losses not finite or beyond 1e+06 (cls_loss 2.5e+06)"),
    ({**NORMAL, "box_loss": math.inf}, "", "training losses not finite or beyond 1e+06 (box_loss inf)"),
])
def test_diverged_training_losses_or_weights_stop_naming_what_diverged(train_losses, bad_weights, says):
    stop, warning = divergence(train_losses, bad_weights, {"box_loss": 2.0, "cls_loss": 1.48e6, "dfl_loss": 1.5})
    assert stop == says and warning is None  # what diverged is named, not the validation loss


def test_exploding_training_losses_stop_the_run_and_keep_the_last_epoch(data, tmp_path, capsys, monkeypatch):
    """Training losses 1e7 times their value from epoch 1 on (the steps still finite, so the step guard lets them
    through): epoch 1 ends the run with exit code 2 and one `error:` line naming the training losses, lr0 and the
    option that would train on; last.pt and results.csv stay those of epoch 0."""
    fb, calls = S.forward_backward, [0]

    def exploding(state, imgs, targets):
        items, finite = fb(state, imgs, targets)
        calls[0] += 1
        return (items * 1e7 if calls[0] > 2 else items), finite  # 2 batches of 8 per epoch
    monkeypatch.setattr(S, "forward_backward", exploding)
    rc = main(_args(data, tmp_path, "torch", "--epochs", "3", "--name", "boom"))
    err = capsys.readouterr().err
    errors = [s for s in err.splitlines() if "error:" in s]
    assert rc == 2 and len(errors) == 1, err[-2000:]
    assert "error: epoch 1: training diverged: training losses not finite or beyond 1e+06 (box_loss " in errors[0]
    assert "lr0=0.01" in errors[0] and errors[0].endswith("--no-divergence-stop trains on regardless"), errors[0]
    run = tmp_path / "boom"
    assert _load(run / "weights" / "last.pt")["epoch"] == 0
    assert read_results(run / "results.csv")["epoch"].tolist() == [0.0]


def test_a_huge_validation_loss_warns_and_a_run_stopped_by_it_resumes(resumed_oom_run):
    """A run the old rule stopped at epoch 1 for a validation loss beyond 1e6 kept epoch 0 (as an interruption
    after epoch 0 does). --resume of it, validating to val cls_loss 1.48e6 with normal training: one WARNING
    line for epoch 1, the run finishes (exit code 0) and results.csv records the loss. (The run resumed is
    oom_run's: its micro-batch of 4 changes nothing here.)"""
    rc, out, err, _, run = resumed_oom_run
    assert rc == 0 and "error:" not in err, err[-2000:]
    warned = [s for s in out.splitlines() if s.startswith("WARNING: epoch ")]
    assert len(warned) == 1 and warned[0].startswith("WARNING: epoch 1: validation losses not finite or beyond "
                                                     "1e+06 (cls_loss 1.48e+06) with finite weights"), warned
    res = read_results(run / "results.csv")
    assert res["epoch"].tolist() == [0.0, 1.0] and res["val/cls_loss"].tolist()[1] == 1.48e6
    assert "done" in (run / "run_state.yaml").read_text()


def _nan_bn_variance_at_epoch_1(monkeypatch):
    """The EMA's model.1.bn.running_var[0] set to NaN at the end of epoch 1 (before its checks and saves)."""
    end_epoch = T.end_epoch

    def poison(state, epoch, stats):
        if epoch == 1:
            state.ema.ema.state_dict()["model.1.bn.running_var"].view(-1)[0] = math.nan
        return end_epoch(state, epoch, stats)

    monkeypatch.setattr(T, "end_epoch", poison)


def test_non_finite_bn_statistics_stop_the_run_and_keep_the_last_finite_epoch(data, tmp_path, capsys, monkeypatch):
    """A BatchNorm running variance of the EMA turned NaN at epoch 1 (weights otherwise fine, --noval: no
    validation loss sees it): exit code 2, one `error:` line naming epoch 1 and the tensor; last.pt, best.pt and
    results.csv stay those of epoch 0, finite."""
    _nan_bn_variance_at_epoch_1(monkeypatch)
    rc = main(_args(data, tmp_path, "torch", "--epochs", "3", "--name", "bn"))
    err = capsys.readouterr().err
    errors = [s for s in err.splitlines() if "error:" in s]
    assert rc == 2 and len(errors) == 1, err[-2000:]
    assert errors[0].split("error: ")[1].startswith("epoch 1: training diverged: the weights are not finite (EMA "
                                                     "model.1.bn.running_var)"), errors[0]
    run = tmp_path / "bn"
    for f in ("last.pt", "best.pt"):
        ck = _load(run / "weights" / f)
        assert ck["epoch"] == 0 and _finite(ck), f
    assert read_results(run / "results.csv")["epoch"].tolist() == [0.0]


def test_no_divergence_stop_trains_on_with_one_warning_line(data, tmp_path, capsys, monkeypatch):
    """The same NaN running variance under --no-divergence-stop: one WARNING line naming epoch 1 and the tensor
    instead of the error, and the run trains to its end (exit code 0, a results.csv row per epoch)."""
    _nan_bn_variance_at_epoch_1(monkeypatch)
    rc = main(_args(data, tmp_path, "torch", "--name", "on", "--no-divergence-stop"))
    out, err = capsys.readouterr()
    assert rc == 0 and "error:" not in err, err[-2000:]
    warned = [s for s in out.splitlines() if s.startswith("WARNING: epoch ")]
    assert warned == ["WARNING: epoch 1: training diverged: the weights are not finite (EMA model.1.bn.running_var); "
                      "training goes on (--no-divergence-stop)"], warned
    assert read_results(tmp_path / "on" / "results.csv")["epoch"].tolist() == [0.0, 1.0]


# ---------------------------------------------------------------------------------------------------------
# on a CUDA GPU (skipped without one): real OOM, AMP on and off, device flags without a host sync
# ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cuda_data(tmp_path_factory):
    return str(synthetic_dataset(seed=1, root=tmp_path_factory.mktemp("syn"), n_train=32, n_val=4, imgsz=160))


def _cuda_args(data, project, backend, *extra):
    return ["--data", data, "--cfg", "gelan-t.yaml", "--img", "64", "--batch", "8", "--epochs", "2",
            "--accumulate", "1", "--workers", "0", "--noval", "--noplots", "--device", "0", "--backend", backend,
            "--no-cuda-graph", "--project", str(project), *extra]  # the eager step: the faults are injected there


def _state_dicts(state):
    return ({k: v.clone() for k, v in state.model.state_dict().items()},
            {k: v.clone() for k, v in state.ema.ema.state_dict().items()}, state.ema.updates)


@pytest.mark.cuda
def test_lazy_flags_are_counted_without_a_host_sync():
    c = NonFiniteCounter(0, lambda *a, **k: None)
    flags = [torch.tensor(v, device="cuda") for v in (True, False, False, True)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for ni, f in enumerate(flags):
            c.observe(f, 0, ni, lambda: "")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    c.drain(lambda: "", wait=True)
    assert c.epoch_skipped == 2 and not c.pending


@pytest.mark.cuda
@pytest.mark.parametrize("backend", BACKENDS)
def test_real_oom_under_a_memory_limit_halves_the_micro_batch(cuda_data, tmp_path, backend):
    lines, log = _logger()
    state = setup(parse_opt(_cuda_args(cuda_data, tmp_path, backend, "--img", "256", "--batch", "32", "--no-amp")),
                  log=log)  # fp32: no GradScaler skip of an early step (the assertion below needs an applied step)
    state.model.train()
    imgs, targets, _, _ = next(iter(state.train_loader))
    x = prepare_batch(state, imgs, np.random.default_rng(0))
    state.progress.micro_batch = 2
    state.guard.step(state, x, targets, 0)  # warm-up at micro-batches of 2: cuDNN's choices, lazy buffers
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    state.guard.step(state, x, targets, 1)  # calibrate: the activations and temporaries of 2 images
    torch.cuda.synchronize()
    per2 = torch.cuda.max_memory_allocated() - base
    state.progress.micro_batch = None
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((base + 4 * per2 + 2 ** 25) / total)
    try:
        result = state.guard.step(state, x, targets, 2)  # 32 images need ~16 x per2: over the limit
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert any("CUDA out of memory at iteration 2 with a micro-batch of 32" in s for s in lines), (per2, lines[-3:])
    assert 1 <= state.progress.micro_batch <= 16 and result.images == 32 and result.finite is True
    assert all(torch.isfinite(p).all() for p in state.model.parameters())


@pytest.mark.cuda
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_allocation_the_gpu_cannot_hold_is_survived(cuda_data, tmp_path, backend, monkeypatch):
    fb, sizes = S.forward_backward, []

    def forward_backward(state, imgs, targets):
        sizes.append(imgs.shape[0])
        if imgs.shape[0] > 4:  # a real allocator failure (1 TiB), inside the step
            torch.empty(2 ** 40, dtype=torch.uint8, device=state.device)
        return fb(state, imgs, targets)
    monkeypatch.setattr(S, "forward_backward", forward_backward)
    out = train(parse_opt(_cuda_args(cuda_data, tmp_path, backend)), log=lambda *a, **k: None)
    assert sizes[:3] == [8, 4, 4] and set(sizes[3:]) == {4}
    last = _load(out["save_dir"] / "weights" / "last.pt")
    assert _finite(last)


@pytest.mark.cuda
@pytest.mark.parametrize("amp", ["--amp", "--no-amp"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_nan_gradient_is_skipped(cuda_data, tmp_path, backend, amp, monkeypatch):
    fb, opt_step = S.forward_backward, S.optimizer_step
    calls, seen, oks = [], {}, []

    def forward_backward(state, imgs, targets):
        calls.append(1)
        if len(calls) == 3:
            seen["before"] = _state_dicts(state)
        out = fb(state, imgs, targets)
        if len(calls) == 3:
            g = next(p for p in state.model.parameters() if p.grad is not None).grad
            g[(0,) * g.dim()] = math.nan  # any layout (a channels-last gradient has no flat view)
        return out

    def optimizer_step(state):
        oks.append(opt_step(state))
        if len(calls) == 3:
            seen["after"] = _state_dicts(state)
        return oks[-1]
    monkeypatch.setattr(S, "forward_backward", forward_backward)
    monkeypatch.setattr(S, "optimizer_step", optimizer_step)
    out = train(parse_opt(_cuda_args(cuda_data, tmp_path, backend, amp)), log=lambda *a, **k: None)
    assert oks[2] is False  # the injected step (under AMP the GradScaler may skip early steps too)
    (m0, e0, u0), (m1, e1, u1) = seen["before"], seen["after"]
    assert all(torch.equal(m0[k], m1[k]) for k in m0) and all(torch.equal(e0[k], e1[k]) for k in e0) and u0 == u1
    res = read_results(out["save_dir"] / "results.csv")
    assert res["skipped_steps"].sum() == oks.count(False) and (amp == "--amp" or oks.count(False) == 1)
    last = _load(out["save_dir"] / "weights" / "last.pt")
    assert _finite(last)
