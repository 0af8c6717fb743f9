"""The trainer's set-up wiring: uint8 input for the c backend, --mem-budget / --dynamic-img (the memory planner),
the validation batch (twice the training batch, as published), the DFL convolutions staying frozen, the CPU
thread choice and the model summary line (train.py's own name in its usage and error lines:
tests/cli/test_entry_points.py). Set-ups and trainings whose checks do not depend on the model use gelan_mini
(tests/conftest.py: a tiny run costs per tensor); the planner's and the summary line's cases keep their named configs.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/engine/train/test_train_wiring.py
"""

import numpy as np
import pytest
import torch

from yolov9c.cli.train import parse_opt
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train import memory_plan as mp
from yolov9c.engine.train.errors import TrainError
from yolov9c.engine.train.state import NBS, cpu_threads, setup
from yolov9c.engine.train.trainer import train_one_epoch


def _setup(tmp_path, *args, n_train=4, n_val=2, img=64, logs=None):
    data = synthetic_dataset(seed=3, root=tmp_path / "syn", n_train=n_train, n_val=n_val, imgsz=img)
    cfg = parse_opt(["--data", str(data), "--img", str(img), "--workers", "0", "--noplots", "--device", "cpu",
                     "--project", str(tmp_path / "runs"), *args])
    log = (lambda *a, **k: logs.append(" ".join(map(str, a)))) if logs is not None else (lambda *a, **k: None)
    return setup(cfg, log=log)


def test_hyp_stays_as_read_and_the_optimizer_gets_the_scaled_weight_decay(tmp_path, gelan_mini):
    """The hyp dict is configuration: set-up never rewrites it. Batch 48: accumulate round(64 / 48) = 1, so the
    decayed group's weight decay is hyp's × 48 / 64 (the published scaling), in the optimizer only."""
    from yolov9c.data.hyp import augment_hyp
    from yolov9c.resources import resolve_hyp

    state = _setup(tmp_path, "--cfg", gelan_mini, "--batch", "48", "--backend", "torch")
    read = augment_hyp(resolve_hyp("hyp.scratch-high.yaml"))
    assert state.hyp["weight_decay"] == read["weight_decay"] == 0.0005
    assert state.batching.accumulate == 1
    assert [g["weight_decay"] for g in state.optimizer.param_groups] == [0.0, 0.0005 * 48 / 64, 0.0]


def test_the_step_clips_the_listed_parameters_as_the_model_walks_them(tmp_path, gelan_mini, monkeypatch):
    """Set-up lists the model's parameters once (state.params, in model.parameters() order: the gradient norm
    sums in that order); the eager step's clip reads that list, not a walk of the model's modules per step."""
    import yolov9c.engine.train.step as step_mod

    state = _setup(tmp_path, "--cfg", gelan_mini, "--batch", "2", "--epochs", "1", "--backend", "torch")
    assert [id(p) for p in state.params] == [id(p) for p in state.model.parameters()]
    clipped = []
    real = step_mod.torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(step_mod.torch.nn.utils, "clip_grad_norm_",
                        lambda ps, **kw: clipped.append(ps) or real(ps, **kw))
    train_one_epoch(state, 0)
    assert clipped and all(ps is state.params for ps in clipped)


def _record_inputs(model):
    seen = []
    model.register_forward_pre_hook(lambda m, inputs: seen.append((inputs[0].dtype, inputs[0].shape[0])))
    return seen


@pytest.mark.parametrize("backend, extra, dtype", [("c", [], torch.uint8), ("torch", [], torch.float32),
                                                   ("c", ["--multi-scale"], torch.float32)])
def test_uint8_input_only_where_the_model_reads_it(tmp_path, gelan_mini, backend, extra, dtype):
    """One epoch trains; the model receives the uint8 batch with --backend c (it reads x / 255 itself) and the
    float batch with --backend torch or --multi-scale (which resizes floats)."""
    state = _setup(tmp_path, "--cfg", gelan_mini, "--batch", "2", "--epochs", "1", "--backend", backend, *extra)
    assert state.uint8_input == (dtype == torch.uint8)
    seen = _record_inputs(state.model)
    before = [p.detach().clone() for p in state.model.parameters()]
    stats = train_one_epoch(state, 0)
    assert seen and {d for d, _ in seen} == {dtype}
    assert torch.isfinite(stats.mloss).all() and stats.images == 4
    assert any(not torch.equal(a, p) for a, p in zip(before, state.model.parameters()))


def test_quad_trains_on_quarter_batches_of_twice_the_size(tmp_path, gelan_mini):
    """--quad (published: the loader's collate_fn4): every 4 images become one image of twice the side, so batch 4 at
    64 px reaches the model as 1 image of 128 px (and the loss is x 4), not as 4 images of 64 px."""
    state = _setup(tmp_path, "--cfg", gelan_mini, "--batch", "4", "--epochs", "1", "--backend", "torch", "--quad",
                   n_train=8)
    shapes = []
    state.model.register_forward_pre_hook(lambda m, inputs: shapes.append(tuple(inputs[0].shape)))
    stats = train_one_epoch(state, 0)
    assert shapes and set(shapes) == {(1, 3, 128, 128)}, shapes
    assert torch.isfinite(stats.mloss).all()


def test_val_batch_is_twice_the_training_batch_and_dfl_stays_frozen(tmp_path):
    logs = []
    state = _setup(tmp_path, "--cfg", "yolov9-t.yaml", "--batch", "4", n_val=8, logs=logs)
    assert state.val_loader.batch_size == 2 * state.train_loader.batch_size == 8
    frozen = sorted(n for n, p in state.model.named_parameters() if not p.requires_grad)
    assert frozen and all(n.endswith((".dfl.conv.weight", ".dfl2.conv.weight")) for n in frozen)
    assert {n.rsplit(".", 3)[-3] for n in frozen} == {"dfl", "dfl2"}
    # the summary line of the build: parameters, and gradients without the DFL weights
    n_p = sum(p.numel() for p in state.model.parameters())
    n_g = sum(p.numel() for p in state.model.parameters() if p.requires_grad)
    line = next(s for s in logs if " summary: " in s)
    assert line.startswith("yolov9-t summary: ") and f"{n_p} parameters, {n_g} gradients" in line
    assert n_g < n_p and line.endswith("GFLOPs")


def test_a_test_split_not_on_disk_does_not_stop_training(tmp_path, gelan_mini):
    # published: training never reads test (coco.yaml names test-dev2017.txt, often not downloaded)
    import yaml

    data = synthetic_dataset(seed=3, root=tmp_path / "syn", n_train=4, n_val=2, imgsz=64)
    cfg = yaml.safe_load(open(data))
    cfg.update(path=str(data.parent), test="test-dev2017.txt")
    y = tmp_path / "with_test.yaml"
    y.write_text(yaml.safe_dump(cfg))
    state = setup(parse_opt(["--data", str(y), "--cfg", gelan_mini, "--img", "64", "--batch", "2", "--workers",
                             "0", "--noplots", "--device", "cpu", "--project", str(tmp_path / "runs")]),
                  log=lambda *a, **k: None)
    assert len(state.train_loader.dataset) == 4


def test_freeze_turns_off_only_the_named_layers(tmp_path, gelan_mini):
    state = _setup(tmp_path, "--cfg", gelan_mini, "--batch", "2", "--freeze", "0", "2")
    frozen = {n for n, p in state.model.named_parameters() if not p.requires_grad}
    layers = {n for n in frozen if n.startswith(("model.0.", "model.2."))}
    assert layers and frozen - layers == {n for n in frozen if ".dfl" in n} != set()
    assert not any(n.startswith("model.1.") for n in frozen)


def test_freeze_logs_the_layers_it_freezes(tmp_path, gelan_mini):
    # --freeze 3 freezes layers 0, 1, 2: the line says so (it said "layers [3]")
    logs = []
    state = _setup(tmp_path, "--cfg", gelan_mini, "--batch", "2", "--freeze", "3", logs=logs)
    frozen = {n.split(".")[1] for n, p in state.model.named_parameters() if not p.requires_grad and ".dfl" not in n}
    assert frozen == {"0", "1", "2"}
    line = next(s for s in logs if s.startswith("freezing "))
    assert line.endswith("parameter tensors of layers 0-2"), line
    from yolov9c.engine.train.state import frozen_layers_text
    assert frozen_layers_text([1]) == "layer 0" and frozen_layers_text([0, 2]) == "layers 0, 2"


def test_close_mosaic_says_when_mosaic_closes(tmp_path, gelan_mini):
    logs = []
    state = _setup(tmp_path, "--cfg", gelan_mini, "--batch", "2", "--epochs", "2", "--close-mosaic", "1",
                   logs=logs)
    train_one_epoch(state, 0)
    assert state.dataset.mosaic and not [s for s in logs if "Closing dataloader mosaic" in s]
    train_one_epoch(state, 1)
    assert not state.dataset.mosaic
    assert [s for s in logs if "Closing dataloader mosaic" in s] == [
        "Closing dataloader mosaic (--close-mosaic 1: no mosaic or mixup from epoch 1)"]


@pytest.mark.parametrize("mosaic", ["hyp", "--mosaic 0", "hyp mosaic 0"])
def test_close_mosaic_beyond_the_epochs_keeps_mosaic_as_published(tmp_path, gelan_mini, mosaic):
    """The published loop closes mosaic at epoch == epochs - close_mosaic: with --close-mosaic > --epochs never, said
    once; with mosaic probability 0 (--mosaic 0 or the hyp file's) there is no mosaic to stay on: not said."""
    from yolov9c.resources import DEFAULT_HYP

    hyp = tmp_path / "hyp.yaml"
    hyp.write_text(DEFAULT_HYP.read_text().replace("mosaic: 1.0", "mosaic: 0.0"))
    extra = {"hyp": [], "--mosaic 0": ["--mosaic", "0"], "hyp mosaic 0": ["--hyp", str(hyp)]}[mosaic]
    logs = []
    state = _setup(tmp_path, "--cfg", gelan_mini, "--batch", "2", "--epochs", "2", "--close-mosaic", "5", *extra,
                   logs=logs)
    train_one_epoch(state, 0)
    train_one_epoch(state, 1)
    assert state.dataset.mosaic and not [s for s in logs if "Closing dataloader mosaic" in s]
    assert sum("mosaic stays on for the whole run" in s for s in logs) == (mosaic == "hyp"), logs


def test_patience_stops_early_with_the_published_lines_and_keeps_the_best_epoch(tmp_path, gelan_mini, monkeypatch):
    """--patience 1 with a fitness that falls after epoch 0 (validation's metrics replaced): the run stops after
    epoch 1 of 4 with the published message (and its --patience 0 hint), its epoch line estimates no time left,
    results.csv has the two epochs, and best.pt (epoch 0) and last.pt are stripped and validated as at a normal end."""
    import yolov9c.engine.train.trainer as trainer
    from yolov9c.engine.train.results import read_results

    real, maps = trainer._validate, iter([0.5, 0.4, 0.3, 0.2])

    def falling(state, model, plots=False, verbose=False, **kw):
        if plots or verbose:  # the final validation of best.pt runs for real
            return real(state, model, plots=plots, verbose=verbose, **kw)
        m = next(maps)
        return dict(mp=m, mr=m, map50=m, map=m, box_loss=1.0, cls_loss=1.0, dfl_loss=1.0, maps=np.zeros(state.nc))
    monkeypatch.setattr(trainer, "_validate", falling)
    data = synthetic_dataset(seed=3, root=tmp_path / "syn", n_train=4, n_val=2, imgsz=64)
    logs = []
    out = trainer.train(parse_opt(["--data", str(data), "--cfg", gelan_mini, "--img", "64", "--batch", "2",
                                   "--epochs", "4", "--patience", "1", "--workers", "0", "--noplots", "--device", "cpu",
                                   "--project", str(tmp_path / "runs")]),
                        log=lambda *a, **k: logs.append(" ".join(map(str, a))))
    text = "\n".join(logs)
    assert out["epochs_done"] == 2
    assert ("Stopping training early as no improvement observed in last 1 epochs. Best results observed at epoch 0, "
            "best model saved as best.pt.") in text
    assert "--patience 0" in text  # how to change or turn off early stopping, as the published message says
    epoch_line = next(s for s in logs if s.startswith("epoch 1/3 took "))
    assert "left for" not in epoch_line, epoch_line  # the run is stopping: no time-left estimate
    assert "2 epochs completed in" in text and "Validating " in text
    run = tmp_path / "runs" / "exp"
    assert read_results(run / "results.csv")["metrics/mAP_0.5"].tolist() == pytest.approx([0.5, 0.4])
    for name in ("last.pt", "best.pt"):
        assert torch.load(run / "weights" / name, map_location="cpu", weights_only=True)["epoch"] == -1


def test_mem_budget_sets_the_micro_batch_and_keeps_the_nominal_batch(tmp_path):
    """A budget between the predicted peaks of 2 and 4 images: micro-batches of 2 per loader batch of 4; the
    loader batch, accumulation, nominal batch and weight decay are those of the same run without a budget."""
    cost = mp.lookup("yolov9-s", "torch")
    budget = (mp.predict(cost, 2, 64) + mp.predict(cost, 3, 64)) / 2
    logs = []
    plain = _setup(tmp_path / "a", "--cfg", "yolov9-s.yaml", "--batch", "4", "--backend", "torch")
    state = _setup(tmp_path / "b", "--cfg", "yolov9-s.yaml", "--batch", "4", "--backend", "torch",
                   "--mem-budget", f"{budget * 1024:.3f}M", logs=logs)
    assert state.plan.batch == 2 and state.plan.accumulate == 2 and state.progress.micro_batch == 2
    assert plain.progress.micro_batch is None and plain.plan is None
    assert state.batching == plain.batching
    assert (state.batching.batch_size, state.batching.accumulate, state.batching.nominal) == (4, round(NBS / 4), NBS)
    assert state.hyp["weight_decay"] == plain.hyp["weight_decay"] != 0
    assert state.optimizer.param_groups[0]["weight_decay"] == plain.optimizer.param_groups[0]["weight_decay"]
    assert any(s.startswith("memory plan: ") and "2 micro-batch(es) of 2" in s for s in logs)
    # one loader batch runs as two forward passes of two images
    seen = _record_inputs(state.model)
    imgs, targets, _, _ = next(iter(state.train_loader))
    from yolov9c.engine.train.step import prepare_batch
    state.model.train()
    r = state.step(state, prepare_batch(state, imgs, np.random.default_rng(0)), targets, 0)
    assert [b for _, b in seen] == [2, 2] and r.images == 4


def test_dynamic_img_shrinks_the_images(tmp_path):
    cost = mp.lookup("yolov9-s", "torch")
    budget = (mp.predict(cost, 4, 96) + mp.predict(cost, 4, 128)) / 2
    state = _setup(tmp_path, "--cfg", "yolov9-s.yaml", "--batch", "4", "--backend", "torch", "--img", "128",
                   "--mem-budget", f"{budget:.6f}", "--dynamic-img", "--min-img", "64", img=128)
    assert state.imgsz == 96 and state.progress.micro_batch is None and state.batching.accumulate == round(NBS / 4)
    assert state.dataset.img_size == 96


def test_mem_budget_of_an_unmeasured_model_on_a_cpu(tmp_path):
    # gelan-t has no measured costs: an estimate, logged as one; on a CPU the log says the plan is a GPU's
    logs = []
    state = _setup(tmp_path, "--cfg", "gelan-t.yaml", "--batch", "2", "--mem-budget", "1G", logs=logs)
    assert state.plan is not None and state.plan.fits
    assert any(s.startswith(f"memory plan: gelan-t ({state.cfg.backend}) has no measured costs: estimate (scaled "
                            f"from measured yolov9-s") for s in logs), logs
    assert any("--mem-budget plans GPU memory; this run is on the cpu" in s for s in logs), logs


def test_mem_budget_errors(tmp_path):
    with pytest.raises(TrainError, match="give a larger budget"):
        _setup(tmp_path, "--cfg", "yolov9-s.yaml", "--batch", "2", "--backend", "torch", "--mem-budget", "1M")
    for argv in (["--mem-budget", "4G", "--batch-size", "-1"], ["--dynamic-img"], ["--mem-budget", "four"]):
        with pytest.raises(SystemExit) as e:
            parse_opt(argv)
        assert e.value.code == 2


def test_mem_budget_flags_parse_and_round_trip():
    from yolov9c.engine.train.config import RunConfig, opt_dict

    cfg = parse_opt(["--mem-budget", "7.5G", "--dynamic-img", "--min-img", "384"])
    assert (cfg.mem_budget, cfg.dynamic_img, cfg.min_img) == (7.5, True, 384)
    assert abs(parse_opt(["--mem-budget", "8GB"]).mem_budget - 8e9 / 2 ** 30) < 1e-9
    plain = parse_opt([])
    assert (plain.mem_budget, plain.dynamic_img, plain.min_img) == (None, False, 320)
    back = RunConfig.from_dict(opt_dict(cfg), log=lambda *a: None)
    assert (back.mem_budget, back.dynamic_img, back.min_img) == (7.5, True, 384)


def test_cpu_threads_choice():
    assert cpu_threads(8, cores=16, env={}) == 8
    assert cpu_threads(0, cores=16, env={}) == 16
    assert cpu_threads(4, cores=2, env={}) == 1
    assert cpu_threads(2, ranks=2, cores=16, env={}) == 6
    # a GPU run's main process keeps few threads, whatever the cores (several runs share them)
    assert cpu_threads(2, cores=16, env={}, cuda=True) == 2
    assert cpu_threads(0, cores=1, env={}, cuda=True) == 1
    assert cpu_threads(2, cores=16, env={"OMP_NUM_THREADS": "8"}, cuda=True) is None
    assert cpu_threads(0, ranks=4, cores=2, env={}) == 1
    assert cpu_threads(2, cores=16, env={"OMP_NUM_THREADS": "3"}) is None
    assert cpu_threads(2, cores=16, env={"MKL_NUM_THREADS": "3"}) is None
    assert 1 <= cpu_threads(0, env={}) <= (__import__("os").cpu_count() or 1)
