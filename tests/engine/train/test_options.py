"""Each training option's check (yolov9c/engine/train/options.py) is the one rule of that option: every RunConfig
field has one; the command line refuses a bad word with the same words a stored opt.yaml value gets; stored
values must have the option's yaml type (5 for an integer, true/false for a flag); RunConfig.from_dict (what
--resume reads) refuses a tampered mapping naming the file and the key, and options that exclude each other.
No training here: tests/engine/train/test_resume.py resumes tampered runs.
Run: python -m pytest -q tests/engine/train/test_options.py
"""

import dataclasses

import pytest

from yolov9c.cli.train import parse_opt
from yolov9c.engine.train.config import RunConfig, opt_dict
from yolov9c.engine.train.options import CHECKS, OptionError, checked


def test_every_option_has_one_check():
    fields = {f.name for f in dataclasses.fields(RunConfig)} - {"given"}
    assert set(CHECKS) == fields, (sorted(fields - set(CHECKS)), sorted(set(CHECKS) - fields))


def test_the_defaults_and_a_written_opt_yaml_pass_their_checks():
    cfg = parse_opt(["--freeze", "1", "2", "--cache", "--mem-budget", "7.5G", "--dynamic-img", "--backend", "c",
                     "--no-amp", "--main-recompute", "4", "--keep-inputs", "1", "--mosaic", "0.5"])
    for c in (RunConfig(), cfg):
        d = opt_dict(c, {"lr0": 0.01, "mosaic": 1.0})
        assert checked(d, "opt.yaml") == d
        assert RunConfig.from_dict(d, log=print) == dataclasses.replace(c, hyp=d["hyp"], given=())


# (flag, word, field): a word the command line refuses; the same value stored is refused in the same words
REFUSED = [
    ("--epochs", "0", "epochs"), ("--batch-size", "0", "batch_size"), ("--img", "16", "imgsz"),
    ("--workers", "-1", "workers"), ("--label-smoothing", "5", "label_smoothing"), ("--patience", "-3", "patience"),
    ("--min-items", "-1", "min_items"), ("--close-mosaic", "-2", "close_mosaic"), ("--accumulate", "0", "accumulate"),
    ("--val-period", "0", "val_period"), ("--mosaic", "1.5", "mosaic"), ("--mixup", "-0.5", "mixup"),
    ("--max-nonfinite", "-1", "max_nonfinite"), ("--min-img", "16", "min_img"), ("--keep-inputs", "7", "keep_inputs"),
    ("--aux-recompute", "2", "aux_recompute"), ("--main-recompute", "-8", "main_recompute"),
    ("--mem-cap", "0", "mem_cap"),
]


@pytest.mark.parametrize("flag,word,field", REFUSED, ids=[r[0] for r in REFUSED])
def test_the_command_line_and_a_stored_value_are_refused_in_the_same_words(flag, word, field, capsys):
    with pytest.raises(SystemExit) as e:
        parse_opt([flag, word])
    assert e.value.code == 2
    err = capsys.readouterr().err
    with pytest.raises(ValueError) as why:
        CHECKS[field].value(float(word) if "." in word else int(word))
    said = str(why.value).split(" (or null: ")[0]  # a stored optional value may also be null
    assert f"error: argument {flag}" in err and said in err, (said, err)


@pytest.mark.parametrize("field,value", [
    ("epochs", 5.0), ("epochs", "5"), ("epochs", True), ("epochs", None), ("batch_size", [8]),
    ("rect", 1), ("rect", "true"), ("amp", None), ("optimizer", "sgd"), ("cache", "gpu"), ("backend", "cuda"),
    ("label_smoothing", "0.1"), ("label_smoothing", float("nan")), ("mosaic", True), ("freeze", ["a"]),
    ("freeze", []), ("keep_inputs", 1.0), ("main_recompute", True), ("main_recompute", 8.0), ("mem_budget", True),
    ("mem_budget", "lots"), ("hyp", 5), ("hyp", {"lr0": "abc"}), ("hyp", {"momentum": 1.5}), ("data", 7),
    ("device", [0]), ("device", -1), ("resume", 1), ("evolve", 0), ("world_size", 0), ("global_rank", -2),
])
def test_a_stored_value_of_the_wrong_type_or_range_is_refused(field, value):
    with pytest.raises(ValueError, match=r"must|not a number|memory size"):
        CHECKS[field].value(value)


@pytest.mark.parametrize("field,value,taken", [
    ("label_smoothing", 0, 0.0), ("mosaic", None, None), ("accumulate", None, None), ("device", 0, "0"),
    ("device", "0,1", "0,1"), ("freeze", 3, [3]), ("keep_inputs", 1, True), ("aux_recompute", False, False),
    ("main_recompute", 16, 16), ("mem_budget", "7.5G", "7.5G"), ("mem_cap", "512M", 0.5), ("mem_cap", 7, 7.0),
    ("resume", "runs/train/exp/weights/last.pt", "runs/train/exp/weights/last.pt"), ("batch_size", -1, -1),
])
def test_a_stored_value_is_taken_as_the_option_means_it(field, value, taken):
    got = CHECKS[field].value(value)
    assert got == taken and type(got) is type(taken)


def test_from_dict_names_the_file_and_the_first_refused_key():
    d = opt_dict(RunConfig())
    with pytest.raises(OptionError) as e:
        RunConfig.from_dict({**d, "val_period": 0, "keep_inputs": 7}, source="runs/train/exp/opt.yaml")
    # keep_inputs comes first in opt.yaml's order
    assert str(e.value) == "runs/train/exp/opt.yaml: keep_inputs: must be 0 or 1, got '7'" and \
        e.value.key == "keep_inputs"
    with pytest.raises(OptionError, match=r"^opt.yaml: cos_lr, flat_cos_lr and fixed_lr are alternatives: at most "
                                          r"one may be on, got cos_lr and fixed_lr$"):
        RunConfig.from_dict({**d, "cos_lr": True, "fixed_lr": True})
    with pytest.raises(OptionError, match=r"^opt.yaml: dynamic_img needs mem_budget SIZE"):
        RunConfig.from_dict({**d, "dynamic_img": True})
