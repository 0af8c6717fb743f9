"""train_dual.py's argparse (yolov9c/cli/train.py): every published flag of spec §1.1 is accepted with its
published default and bare-flag value, the aliases and prefixes work, the additions parse, and bad values are
argparse errors (exit 2) that say what is allowed.

Run: python -m pytest -q tests/cli/test_train_cli.py
"""

import os
import signal
import subprocess
import sys

import pytest

from yolov9c.cli.train import build_parser, main, parse_opt
from yolov9c.resources import resolve_hyp

# (flag, value tokens, destination, expected parsed value) for every published flag
PUBLISHED = [
    ("--weights", ["w.pt"], "weights", "w.pt"),
    ("--cfg", ["gelan-s.yaml"], "cfg", "gelan-s.yaml"),
    ("--data", ["d.yaml"], "data", "d.yaml"),
    ("--hyp", ["h.yaml"], "hyp", "h.yaml"),
    ("--epochs", ["7"], "epochs", 7),
    ("--batch-size", ["32"], "batch_size", 32),
    ("--imgsz", ["320"], "imgsz", 320),
    ("--rect", [], "rect", True),
    ("--resume", [], "resume", True),
    ("--nosave", [], "nosave", True),
    ("--noval", [], "noval", True),
    ("--noautoanchor", [], "noautoanchor", True),
    ("--noplots", [], "noplots", True),
    ("--evolve", [], "evolve", 300),
    ("--bucket", ["b"], "bucket", "b"),
    ("--cache", [], "cache", "ram"),
    ("--image-weights", [], "image_weights", True),
    ("--device", ["0,1"], "device", "0,1"),
    ("--multi-scale", [], "multi_scale", True),
    ("--single-cls", [], "single_cls", True),
    ("--optimizer", ["AdamW"], "optimizer", "AdamW"),
    ("--sync-bn", [], "sync_bn", True),
    ("--workers", ["3"], "workers", 3),
    ("--project", ["p"], "project", "p"),
    ("--name", ["n"], "name", "n"),
    ("--exist-ok", [], "exist_ok", True),
    ("--quad", [], "quad", True),
    ("--cos-lr", [], "cos_lr", True),
    ("--flat-cos-lr", [], "flat_cos_lr", True),
    ("--fixed-lr", [], "fixed_lr", True),
    ("--label-smoothing", ["0.1"], "label_smoothing", 0.1),
    ("--patience", ["5"], "patience", 5),
    ("--freeze", ["0", "1", "2"], "freeze", [0, 1, 2]),
    ("--save-period", ["2"], "save_period", 2),
    ("--seed", ["3"], "seed", 3),
    ("--local_rank", ["1"], "local_rank", 1),
    ("--min-items", ["1"], "min_items", 1),
    ("--close-mosaic", ["15"], "close_mosaic", 15),
    ("--entity", ["e"], "entity", "e"),
    ("--upload_dataset", [], "upload_dataset", True),
    ("--bbox_interval", ["4"], "bbox_interval", 4),
    ("--artifact_alias", ["v1"], "artifact_alias", "v1"),
]

PUBLISHED_DEFAULTS = dict(weights="", epochs=100, batch_size=16, imgsz=640, rect=False, resume=False, nosave=False,
                          noval=False, noautoanchor=False, noplots=False, evolve=None, bucket="", cache=None,
                          image_weights=False, device="", multi_scale=False, single_cls=False, optimizer="SGD",
                          sync_bn=False, workers=8, project="runs/train", name="exp", exist_ok=False, quad=False,
                          cos_lr=False, flat_cos_lr=False, fixed_lr=False, label_smoothing=0.0, patience=100,
                          freeze=[0], save_period=-1, seed=0, local_rank=-1, min_items=0, close_mosaic=0,
                          entity=None, upload_dataset=False, bbox_interval=-1, artifact_alias="latest")


@pytest.mark.parametrize("flag,tokens,dest,value", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_every_published_flag_is_accepted(flag, tokens, dest, value):
    opt = parse_opt([flag, *tokens])
    assert getattr(opt, dest) == value
    assert dest in opt.given


def test_published_flag_list_is_complete():
    # 42 live add_argument calls in the published train_dual.py (spec §1.1)
    assert len(PUBLISHED) == 42
    ours = {s for a in build_parser()._actions for s in a.option_strings}
    assert {f for f, *_ in PUBLISHED} <= ours


def test_published_defaults():
    opt = parse_opt([])
    for k, v in PUBLISHED_DEFAULTS.items():
        assert getattr(opt, k) == v, k
    # documented differences: files that exist here
    assert opt.cfg == "yolov9-t.yaml" and opt.data == "synthetic" and opt.hyp == "hyp.scratch-high.yaml"
    assert opt.given == ()


def test_aliases_prefixes_and_optional_values():
    assert parse_opt(["--img", "320"]).imgsz == 320
    assert parse_opt(["--img-size", "256"]).imgsz == 256
    assert parse_opt(["--batch", "8"]).batch_size == 8  # argparse prefix, as published
    assert parse_opt(["--local-rank", "2"]).local_rank == 2
    assert parse_opt(["--resume", "runs/train/exp/weights/last.pt"]).resume == "runs/train/exp/weights/last.pt"
    assert parse_opt(["--cache", "disk"]).cache == "disk"
    assert parse_opt(["--evolve", "10"]).evolve == 10
    assert parse_opt(["--freeze", "10"]).freeze == [10]


def test_additions():
    opt = parse_opt(["--backend", "torch", "--accumulate", "4", "--no-amp", "--ckpt", "--val-period", "5",
                     "--no-pin-memory", "--mosaic", "0.5", "--mixup", "0", "--deterministic"])
    assert (opt.backend, opt.accumulate, opt.amp, opt.ckpt, opt.val_period, opt.pin_memory, opt.mosaic,
            opt.mixup, opt.deterministic) == ("torch", 4, False, True, 5, False, 0.5, 0.0, True)
    d = parse_opt([])
    assert (d.backend, d.accumulate, d.amp, d.ckpt, d.val_period, d.pin_memory, d.mosaic, d.mixup) == \
        (None, None, True, False, 1, None, None, None)  # backend None: c on a CUDA GPU, torch on the CPU
    assert parse_opt(["--backend", "c"]).backend == "c"
    assert parse_opt(["--channels-last"]).channels_last is True and d.channels_last is None
    assert parse_opt(["--pin-memory"]).pin_memory is True


def test_divergence_stop_parses_and_round_trips_through_opt_yaml(tmp_path):
    """--no-divergence-stop (guards.py: weights or training losses that diverged only warn) is an option of the
    run: recorded in opt.yaml and read back from it (--resume restores it; given again, the typed one wins)."""
    import yaml

    from yolov9c.engine.train.config import RESUME_OVERRIDES, opt_dict, read_opt_yaml

    assert parse_opt([]).divergence_stop is True and parse_opt(["--divergence-stop"]).divergence_stop is True
    cfg = parse_opt(["--no-divergence-stop"])
    assert cfg.divergence_stop is False and "divergence_stop" in RESUME_OVERRIDES
    path = tmp_path / "opt.yaml"
    path.write_text(yaml.safe_dump(opt_dict(cfg), sort_keys=False))
    assert "divergence_stop: false\n" in path.read_text()
    assert read_opt_yaml(path).divergence_stop is False


@pytest.mark.parametrize("argv,says", [
    (["--optimizer", "RMSprop"], "choose from"),
    (["--cache", "gpu"], "choose from"),
    (["--backend", "cuda"], "choose from"),
    (["--batch-size", "0"], "positive integer (or -1 for AutoBatch)"),
    (["--batch-size", "x"], "positive integer"),
    (["--epochs", "0"], "argument --epochs: must be an integer >= 1, got 0"),
    (["--img", "16"], "must be an integer >= 32, got 16"),
    (["--accumulate", "0"], "argument --accumulate: must be an integer >= 1, got 0"),
    (["--val-period", "0"], "argument --val-period: must be an integer >= 1, got 0"),
    (["--workers", "-1"], "argument --workers: must be an integer >= 0, got -1"),
    (["--mosaic", "1.5"], "probability in [0, 1]"),
    (["--mixup", "abc"], "probability in [0, 1]"),
    (["--freeze", "-2"], "integers >= 0"),
    (["--label-smoothing", "1"], "[0, 1)"),
    (["--cos-lr", "--fixed-lr"], "at most one"),
    (["--quad", "--batch", "2"], "--quad makes one image of every 4: it needs --batch-size 4 or more, got 2"),
    (["--no-such-flag"], "unrecognized arguments"),
])
def test_bad_values_are_argparse_errors(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        parse_opt(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_refused_features_exit_2_with_a_reason(capsys):
    assert main(["--evolve", "0"]) == 2
    assert "--evolve 0: the number of generations must be >= 1" in capsys.readouterr().err


def test_bare_hyp_name_resolves_in_configs(tmp_path):
    p = resolve_hyp("hyp.scratch-high.yaml")
    assert p.is_file() and p.parent.name == "hyps"
    own = tmp_path / "my.yaml"
    own.write_text("lr0: 0.1\n")
    assert resolve_hyp(str(own)) == own
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        resolve_hyp("nope.yaml")


# --- RunConfig (yolov9c/engine/train/config.py): the one typed configuration the trainer runs on ---

def test_config_defaults_are_the_parser_defaults():
    """Every argparse destination is a RunConfig field, and an empty command line gives RunConfig()."""
    import dataclasses

    from yolov9c.engine.train.config import RunConfig

    dests = {a.dest for a in build_parser()._actions if a.dest != "help"}
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert dests <= fields, sorted(dests - fields)
    assert fields - dests == {"save_dir", "world_size", "global_rank", "mem_plan", "given"}
    assert parse_opt([]) == RunConfig()
    assert isinstance(parse_opt([]), RunConfig)


def test_config_opt_yaml_round_trip(tmp_path):
    import yaml

    from yolov9c.engine.train.config import opt_dict, read_opt_yaml

    cfg = parse_opt(["--epochs", "7", "--freeze", "1", "2", "--cache", "--resume", "x/last.pt", "--backend", "c"])
    hyp = {"lr0": 0.02, "mosaic": 1.0}
    d = opt_dict(cfg, hyp)
    assert list(d)[:4] == ["weights", "cfg", "data", "hyp"] and d["hyp"] == hyp  # the published order
    assert "given" not in d and {"save_dir", "world_size", "global_rank"} <= set(d)
    path = tmp_path / "opt.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    back = read_opt_yaml(path)
    assert back == type(cfg)(**{**{k: getattr(cfg, k) for k in d}, "hyp": hyp})
    assert back.given == ()


def test_config_old_or_broken_opt_yaml(tmp_path):
    """An opt.yaml with a key this version does not know, or without keys it added, still reads (warning,
    defaults); an empty or non-mapping one is a ConfigError naming the file, never a TypeError."""
    import yaml

    from yolov9c.engine.train.config import ConfigError, RunConfig, read_opt_yaml

    path = tmp_path / "opt.yaml"
    path.write_text(yaml.safe_dump({"epochs": 5, "batch_size": 4, "some_old_flag": 1, "given": ["epochs"]}))
    said = []
    cfg = read_opt_yaml(path, log=said.append)
    assert (cfg.epochs, cfg.batch_size, cfg.val_period, cfg.backend) == (5, 4, 1, None)  # missing: defaults
    assert said == [f"WARNING: {path}: unknown options ignored: some_old_flag"]
    assert cfg == RunConfig(epochs=5, batch_size=4)
    for text, says in (("", "is empty"), ("- a\n- b\n", "does not hold a mapping"), ("a: [", "not valid yaml")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=says):
            read_opt_yaml(path)


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_sigusr1_prints_the_stacks_and_the_process_goes_on():
    code = ("import os, signal; from yolov9c.cli.train import dump_stacks_on_signal; dump_stacks_on_signal()\n"
            "def waiting_here():\n    os.kill(os.getpid(), signal.SIGUSR1)\n    print('still running')\n"
            "waiting_here()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "still running"
    assert "waiting_here" in r.stderr and "File" in r.stderr  # the stack of the signalled thread


def test_sigterm_stops_a_run_as_ctrl_c_does():
    """stop_on_signals: SIGTERM raises KeyboardInterrupt in the main thread (the trainer's Ctrl-C path: the resume
    line), where it would otherwise end the process with no word."""
    code = ("import os, signal; from yolov9c.cli.train import stop_on_signals; stop_on_signals()\n"
            "try:\n    os.kill(os.getpid(), signal.SIGTERM)\n    import time; time.sleep(30)\n"
            "except KeyboardInterrupt:\n    print('interrupted')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0 and r.stdout.strip() == "interrupted", (r.returncode, r.stdout, r.stderr)


def test_a_second_ctrl_c_while_the_run_stops_is_one_line_and_a_third_quits():
    """A double Ctrl-C (or Ctrl-C then a scheduler's SIGTERM): the second signal came while the trainer closed
    its loader workers after the first, and its KeyboardInterrupt replaced the trainer's, so the run that had a
    last.pt ended with "interrupted before training started; nothing was saved". Now it does not interrupt the
    clean-up, one line says the run is stopping, and a third signal quits at once (exit code 128 + signal)."""
    code = ("import os, signal, time; from yolov9c.cli.train import stop_on_signals; stop_on_signals()\n"
            "try:\n    os.kill(os.getpid(), signal.SIGINT); time.sleep(30)\n"
            "except KeyboardInterrupt:\n    os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2)\n"
            "    print('cleaned up', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGINT); time.sleep(30); print('not reached')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.stdout.strip() == "cleaned up" and r.returncode == 128 + signal.SIGINT, (r.returncode, r.stdout,
                                                                                       r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("train_dual.py: stopping") and "once more" in lines[0], lines
    assert lines[1].startswith("train_dual.py: quit at once"), lines


def test_the_c_switch_defaults_are_defined_once():
    """backends/c/switches.DEFAULT is the one definition: RunConfig's fields take it, and the command line's
    defaults (cli/memory.add_switch_args, written out there so `python -m yolov9c memory` imports no torch) equal
    it, in train_dual.py and in `python -m yolov9c memory`."""
    import argparse

    from yolov9c.backends.c.switches import DEFAULT
    from yolov9c.cli.memory import add_switch_args
    from yolov9c.engine.train.config import RunConfig

    want = {"aux_recompute": DEFAULT.aux_recompute, "main_recompute": DEFAULT.main_recompute,
            "keep_inputs": DEFAULT.keep_inputs}
    assert {k: getattr(RunConfig(), k) for k in want} == want
    p = argparse.ArgumentParser()
    add_switch_args(p)
    assert {k: getattr(p.parse_args([]), k) for k in want} == want
    assert {k: getattr(parse_opt([]), k) for k in want} == want
