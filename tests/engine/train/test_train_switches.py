"""The c backend's switches as run options (yolov9c/engine/train/config.py, cli/memory.py add_switch_args, state.py):
--aux-recompute, --main-recompute, --keep-inputs → RunConfig → opt.yaml → the Switches the model runs with.

- The flags parse to RunConfig fields; a bad value is one `error:` line and exit 2 (no traceback, no run folder).
- A CPU run with the three flags records them in opt.yaml and installs exactly those Switches on the model.
- --resume restores them from opt.yaml (not the defaults); a flag typed with --resume replaces one (a memory
  knob, as --batch-size). A YOLOV9C_* variable set at resume wins, says so in one log line naming the option it
  replaces, and the resumed opt.yaml records the value used; a bad value of one is one `error:` line, exit 2.
- switch_overrides alone: unset or empty variables change nothing; each set one is logged; an option typed on
  the command line wins over its variable (one line says the variable went unused), in a run too.
The run that trains (and its resumes) is yolov9-t (dual head: the switches matter) at 64 px, 4 images, batch 4, one
CPU thread, as is the planner's case (its measured costs); fresh set-ups stopped before their first step (the
switches installed, nothing run) build gelan_mini (tests/conftest.py).
Run: python -m pytest -q tests/engine/train/test_train_switches.py
"""

import pytest
import yaml

import yolov9c.engine.train.state as train_state
from yolov9c.backends.c import pgi
from yolov9c.backends.c.switches import Switches
from yolov9c.cli.train import main, parse_opt
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train.config import SWITCH_ENV, ConfigError, RunConfig, switch_overrides
from yolov9c.engine.train.trainer import train

pytestmark = pytest.mark.usefixtures("one_thread")
FLAGS = ["--aux-recompute", "1", "--main-recompute", "4", "--keep-inputs", "1"]
GIVEN = Switches(aux_recompute=True, main_recompute=4, keep_inputs=True)


@pytest.fixture(autouse=True)
def _no_switch_env(monkeypatch):
    for var in SWITCH_ENV.values():  # a developer's shell must not decide these tests
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(synthetic_dataset(seed=5, root=tmp_path_factory.mktemp("syn"), n_train=4, n_val=2, imgsz=64))


def _argv(data, project, *extra, cfg="yolov9-t.yaml"):
    return ["--data", data, "--cfg", cfg, "--img", "64", "--batch", "4", "--epochs", "2",
            "--workers", "0", "--noplots", "--noval", "--device", "cpu", "--backend", "c", "--project",
            str(project), *extra]


@pytest.fixture
def installed(monkeypatch):
    """The Switches the trainer's model runs with, recorded from each backend installation of a run."""
    seen = []
    real = train_state.apply_backend

    def recording(model, name, switches=None):
        out = real(model, name, switches)
        seen.append(pgi.switches_of(model))
        return out

    monkeypatch.setattr(train_state, "apply_backend", recording)
    return seen


class _Stop(Exception):
    pass


def _until_step_line(lines):
    """A log that stops set-up at its `step:` line (after the backend and its switches are installed)."""
    def log(*a, **k):
        lines.append(" ".join(map(str, a)))
        if lines[-1].startswith("step:"):
            raise _Stop
    return log


def test_flags_parse_to_the_config():
    cfg = parse_opt(["--aux-recompute", "0", "--main-recompute", "16", "--keep-inputs", "--plain-stride", "16"])
    assert (cfg.aux_recompute, cfg.main_recompute, cfg.keep_inputs, cfg.plain_stride) == (False, 16, True, 16)
    d = parse_opt([])
    assert (d.aux_recompute, d.main_recompute, d.keep_inputs, d.plain_stride) == (True, 8, False, 0) == \
        tuple(vars(Switches()).values())
    assert parse_opt(["--keep-inputs", "0", "--aux-recompute"]).keep_inputs is False


@pytest.mark.parametrize("argv, says", [
    (["--aux-recompute", "2"], "argument --aux-recompute: must be 0 or 1, got '2'"),
    (["--keep-inputs", "yes"], "argument --keep-inputs: must be 0 or 1, got 'yes'"),
    (["--main-recompute", "-1"], "argument --main-recompute: must be a stride"),
    (["--main-recompute", "eight"], "argument --main-recompute: must be a stride"),
    (["--plain-stride", "-16"], "argument --plain-stride: must be a stride"),
])
def test_a_bad_flag_value_is_one_error_line(argv, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--project", str(tmp_path / "runs")])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert e.value.code == 2 and len(errors) == 1 and errors[0].startswith(f"train_dual.py: error: {says}"), errors
    assert not (tmp_path / "runs").exists()


def test_switch_overrides():
    cfg = RunConfig(main_recompute=4)
    said = []
    assert switch_overrides(cfg, env={"YOLOV9C_KEEP_INPUTS": " "}, log=said.append) is cfg and said == []
    got = switch_overrides(cfg, env={"YOLOV9C_MAIN_RECOMPUTE": "0", "YOLOV9C_AUX_RECOMPUTE": "1"}, log=said.append)
    assert (got.aux_recompute, got.main_recompute, got.keep_inputs) == (True, 0, False)
    assert said == ["YOLOV9C_AUX_RECOMPUTE=1 is set: the same as --aux-recompute 1",
                    "YOLOV9C_MAIN_RECOMPUTE=0 overrides --main-recompute 4: the run uses (and opt.yaml records) "
                    "--main-recompute 0"]
    with pytest.raises(ConfigError, match=r"YOLOV9C_KEEP_INPUTS='true': must be 0 or 1"):
        switch_overrides(cfg, env={"YOLOV9C_KEEP_INPUTS": "true"})


def test_a_typed_option_wins_over_its_variable():
    """A YOLOV9C_* variable never silently beats an option typed on this command line: the typed value stays and
    one line says the variable went unused; an untyped switch is still taken from its variable."""
    cfg = parse_opt(["--main-recompute", "4"])
    said = []
    got = switch_overrides(cfg, env={"YOLOV9C_MAIN_RECOMPUTE": "0", "YOLOV9C_KEEP_INPUTS": "1"}, log=said.append)
    assert (got.main_recompute, got.keep_inputs) == (4, True)
    assert said == ["YOLOV9C_MAIN_RECOMPUTE=0 is set, but --main-recompute 4 was typed: the typed value is used",
                    "YOLOV9C_KEEP_INPUTS=1 overrides --keep-inputs 0: the run uses (and opt.yaml records) "
                    "--keep-inputs 1"]
    said.clear()
    assert switch_overrides(cfg, env={"YOLOV9C_MAIN_RECOMPUTE": "4"}, log=said.append) == cfg and said == []
    with pytest.raises(ConfigError, match=r"YOLOV9C_MAIN_RECOMPUTE='x': must be a stride"):  # still checked
        switch_overrides(cfg, env={"YOLOV9C_MAIN_RECOMPUTE": "x"})


def test_a_typed_option_wins_over_its_variable_in_a_run(data, gelan_mini, tmp_path, installed, monkeypatch):
    monkeypatch.setenv("YOLOV9C_MAIN_RECOMPUTE", "0")
    lines = []
    with pytest.raises(_Stop):
        train(parse_opt(_argv(data, tmp_path / "runs", *FLAGS, cfg=gelan_mini)), log=_until_step_line(lines))
    assert installed == [GIVEN]
    assert "YOLOV9C_MAIN_RECOMPUTE=0 is set, but --main-recompute 4 was typed: the typed value is used" in lines


@pytest.fixture(scope="module")
def stopped(data, tmp_path_factory):
    """A c run with FLAGS stopped after epoch 0 of 2 (its last.pt resumable), and the Switches it installed."""
    mp = pytest.MonkeyPatch()
    for var in SWITCH_ENV.values():
        mp.delenv(var, raising=False)
    seen = []
    real = train_state.apply_backend
    mp.setattr(train_state, "apply_backend",
               lambda model, name, switches=None: seen.append(switches) or real(model, name, switches))
    try:
        out = train(parse_opt(_argv(data, tmp_path_factory.mktemp("runs"), *FLAGS)), stop_after_epoch=0,
                    log=lambda *a, **k: None)
    finally:
        mp.undo()
    return out["save_dir"], seen


def test_opt_yaml_records_the_switches_the_model_ran_with(stopped):
    run, seen = stopped
    stored = yaml.safe_load((run / "opt.yaml").read_text())
    assert (stored["aux_recompute"], stored["main_recompute"], stored["keep_inputs"]) == (True, 4, True)
    assert seen == [GIVEN]


def _copy(run, tmp_path):
    import shutil

    return train_state.Path(shutil.copytree(run, tmp_path / run.name))


def test_resume_restores_the_switches(stopped, tmp_path, installed):
    run = _copy(stopped[0], tmp_path)
    lines = []
    with pytest.raises(_Stop):
        train(parse_opt(["--resume", str(run / "weights" / "last.pt")]), log=_until_step_line(lines))
    assert installed == [GIVEN]  # opt.yaml's, not the defaults of a bare --resume
    assert [line for line in lines if line.startswith("backend:")] == \
        ["backend: c; --aux-recompute 1 --main-recompute 4 --keep-inputs 1"]
    assert not any("YOLOV9C_" in line for line in lines)
    with pytest.raises(_Stop):  # typed with --resume: a memory knob the command line may change
        train(parse_opt(["--resume", str(run / "weights" / "last.pt"), "--keep-inputs", "0"]),
              log=_until_step_line(lines))
    assert installed[-1] == Switches(aux_recompute=True, main_recompute=4, keep_inputs=False)


def test_resume_under_an_environment_override_logs_and_records_it(stopped, tmp_path, installed, monkeypatch):
    run = _copy(stopped[0], tmp_path)
    monkeypatch.setenv("YOLOV9C_MAIN_RECOMPUTE", "0")
    lines = []
    out = train(parse_opt(["--resume", str(run / "weights" / "last.pt")]),
                log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert out["epochs_done"] == 2
    assert ("YOLOV9C_MAIN_RECOMPUTE=0 overrides --main-recompute 4: the run uses (and opt.yaml records) "
            "--main-recompute 0") in lines
    assert installed == [Switches(aux_recompute=True, main_recompute=0, keep_inputs=True)]
    stored = yaml.safe_load((run / "opt.yaml").read_text())
    assert (stored["aux_recompute"], stored["main_recompute"], stored["keep_inputs"]) == (True, 0, True)


def test_a_bad_environment_value_is_one_error_line(data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("YOLOV9C_AUX_RECOMPUTE", "off")
    assert main(_argv(data, tmp_path / "runs")) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert errors == ["train_dual.py: error: YOLOV9C_AUX_RECOMPUTE='off': must be 0 or 1, got 'off' (or unset it; "
                      "the option is --aux-recompute)"]
    assert not (tmp_path / "runs").exists()  # refused before a run folder is made


def test_torch_backend_says_the_switches_do_not_apply(data, gelan_mini, tmp_path, installed):
    argv = _argv(data, tmp_path / "runs", "--main-recompute", "0", cfg=gelan_mini)
    argv[argv.index("--backend") + 1] = "torch"
    lines = []

    def log(*a, **k):
        lines.append(" ".join(map(str, a)))
        if lines[-1].startswith("WARNING: --aux-recompute"):
            raise _Stop

    with pytest.raises(_Stop):
        train(parse_opt(argv), log=log)
    assert lines[-2] == "backend: torch"
    assert lines[-1].endswith("are the c backend's switches; ignored with --backend torch") and installed == []


def test_mem_budget_plans_with_the_switches(data, tmp_path):
    """--mem-budget hands the run's switches to the planner: storing the auxiliary branch raises the predicted
    per-image cost (switch_cost.py), so the same budget plans a smaller micro-batch."""
    plans = {}
    for aux in ("1", "0"):
        lines = []

        def log(*a, **k):
            lines.append(" ".join(map(str, a)))
            if lines[-1].startswith("memory plan: --mem-budget"):
                raise _Stop

        argv = _argv(data, tmp_path / aux, "--mem-budget", "0.08G", "--aux-recompute", aux)
        argv[argv.index("--batch") + 1] = "64"
        with pytest.raises(_Stop):
            train(parse_opt(argv), log=log)
        plans[aux] = lines[-1]
        said = [line for line in lines if "the c backend's switches change the step by" in line]
        assert len(said) == (aux == "0"), lines
    assert "1 micro-batch(es) of 64 per batch of 64" in plans["1"], plans
    assert "2 micro-batch(es) of 32 per batch of 64" in plans["0"], plans
