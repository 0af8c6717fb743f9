"""train_dual.py --evolve (yolov9c/engine/train/evolve.py): two real generations of 1 epoch on tiny synthetic data write
runs/evolve/exp/evolve.csv (header + 2 rows: 7 results then every hyperparameter), hyp_evolve.yaml (the best row)
and no checkpoints; with a stand-in training function (fast): 25 generations stay inside META's bounds, the same
--seed repeats the same mutations and another seed does not, the fittest row becomes hyp_evolve.yaml, and an
evolution continues an existing evolve.csv (--resume). META bounds every key of a hyp file (resources.HYP_KEYS),
inside the values a run accepts (resources.HYP_RANGES).

Run: python -m pytest -q tests/engine/train/test_evolve.py
"""

import os

import numpy as np
import pytest
import yaml

from yolov9c.cli.train import main, parse_opt
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train.evolve import META, RESULT_KEYS, evolve, mutate, read_evolve_csv, row_fitness
from yolov9c.resources import HYP_KEYS, HYP_RANGES, load_hyp

QUIET = dict(log=lambda *a, **k: None)


def test_meta_bounds_every_hyp_key_within_its_range():
    """Every key a hyp file holds is searched (label_smoothing comes from --label-smoothing, not the file), and
    each key's search range lies inside the values resources.check_hyp lets a run use."""
    assert set(META) == set(HYP_KEYS) - {"label_smoothing"}
    assert set(load_hyp()) <= set(META)
    for k, (gain, lo, hi) in META.items():
        assert gain >= 0 and lo <= hi, k
        if k in HYP_RANGES:
            _, ok, rule = HYP_RANGES[k]
            assert ok(lo) and ok(hi), f"{k}: META's [{lo}, {hi}] is not {rule}"


def test_two_real_generations(tmp_path, gelan_mini, monkeypatch):
    data = synthetic_dataset(seed=4, root=tmp_path / "syn", n_train=4, n_val=2, imgsz=64)
    monkeypatch.chdir(tmp_path)  # the default --project runs/train becomes runs/evolve under the cwd
    assert main(["--data", str(data), "--cfg", gelan_mini, "--img", "64", "--batch", "4", "--epochs", "1",
                 "--workers", "0", "--evolve", "2", "--seed", "1"]) == 0
    run = tmp_path / "runs" / "evolve" / "exp"
    keys, rows = read_evolve_csv(run / "evolve.csv")
    header = (run / "evolve.csv").read_text().splitlines()[0]
    assert [c.strip() for c in header.split(",")][:7] == list(RESULT_KEYS)
    assert rows.shape == (2, 7 + len(keys)) and "lr0" in keys and "mosaic" in keys
    assert (rows[:, 4:7] > 0).all()  # validation losses of each generation's final epoch
    gen0, gen1 = rows[0, 7:], rows[1, 7:]
    assert not np.array_equal(gen0, gen1)  # generation 1 is a mutation of generation 0
    assert gen0[keys.index("lr0")] == pytest.approx(0.01)  # generation 0: the hyp file as it is
    best = yaml.safe_load((run / "hyp_evolve.yaml").read_text())
    assert list(best) == keys
    text = (run / "hyp_evolve.yaml").read_text()
    assert "# Best generation: " in text and "# Last generation: 1" in text
    assert (run / "hyp_evolve.png").is_file()
    assert not (run / "weights").exists() and not (run / "opt.yaml").exists()  # --nosave as published


def _fake_train(calls):
    """A stand-in for train(): fitness rises as lr0 approaches 0.02 and mosaic approaches 0.5."""
    def fit(opt):
        h = opt.hyp
        assert opt.noval and opt.nosave and not opt.resume
        calls.append(dict(h))
        score = 1 / (1 + abs(h["lr0"] - 0.02) * 50 + abs(h["mosaic"] - 0.5))
        return {"metrics": dict(mp=0.5, mr=0.5, map50=score, map=score * 0.6, box_loss=1.0, cls_loss=1.0,
                                dfl_loss=1.0)}
    return fit


def test_unwritable_project_is_refused_before_generation_0(tmp_path):
    """--evolve into a read-only --project (no write bit: for root too): the run-folder error the CLI prints as
    one line, before any generation (before, for a user: a PermissionError traceback)."""
    from yolov9c.engine.train.run_folder import USER_ERRORS

    calls = []
    os.chmod(tmp_path, 0o555)
    try:
        with pytest.raises(USER_ERRORS) as e:
            evolve(parse_opt(["--evolve", "3", "--project", str(tmp_path / "evo")]), train_fn=_fake_train(calls),
                   **QUIET)
    finally:
        os.chmod(tmp_path, 0o755)
    assert str(e.value) == (f"cannot make {tmp_path / 'evo' / 'exp'}: {tmp_path} is not writable (read-only): give "
                            f"a --project you can write to")
    assert list(tmp_path.iterdir()) == [] and calls == []


def _evolve(tmp_path, name, *extra):
    calls = []
    opt = parse_opt(["--evolve", "25", "--project", str(tmp_path), "--name", name, "--noplots", *extra])
    run = evolve(opt, train_fn=_fake_train(calls), **QUIET)
    return run, calls


def test_bounds_seed_and_best(tmp_path):
    run, calls = _evolve(tmp_path, "a", "--seed", "7")
    keys, rows = read_evolve_csv(run / "evolve.csv")
    assert len(calls) == len(rows) == 25
    for h in calls:
        for k, (_, lo, hi) in META.items():
            assert lo <= h[k] <= hi, (k, h[k])
    changed = {k for k in keys if len({h[k] for h in calls}) > 1}
    assert {"lr0", "momentum", "hsv_s", "mosaic"} <= changed
    assert not changed & {k for k, m in META.items() if m[0] == 0}  # gain 0: never mutated
    best = yaml.safe_load((run / "hyp_evolve.yaml").read_text())
    i = int(np.argmax(row_fitness(rows)))
    assert best["lr0"] == pytest.approx(rows[i, 7 + keys.index("lr0")])
    assert f"# Best generation: {i}" in (run / "hyp_evolve.yaml").read_text()
    _, again = _evolve(tmp_path, "b", "--seed", "7")
    assert again == calls  # seeded: the same mutations
    _, other = _evolve(tmp_path, "c", "--seed", "8")
    assert other[0] == calls[0] and other[1:] != calls[1:]


def test_mutate_picks_among_the_fittest_and_changes_something():
    keys = ["lr0", "momentum", "degrees"]
    rows = np.array([[0, 0, 0.1, 0.1, 0, 0, 0, 0.01, 0.9, 0.0],
                     [0, 0, 0.9, 0.9, 0, 0, 0, 0.05, 0.8, 0.0]])
    rng = np.random.default_rng(0)
    kids = [mutate(rows, keys, rng) for _ in range(50)]
    assert all(k["degrees"] == 0.0 for k in kids)  # multiplicative: a zero stays zero (as published)
    assert all(k != {"lr0": 0.01, "momentum": 0.9, "degrees": 0.0} for k in kids)
    # the fitter parent (lr0 0.05) is drawn far more often; factors are clipped to [0.3, 3]
    near = sum(0.015 <= k["lr0"] <= 0.15 for k in kids)
    assert near >= 40 and all(0.003 <= k["lr0"] <= 0.15 for k in kids)


def test_resume_continues_the_csv(tmp_path):
    run, _ = _evolve(tmp_path, "r", "--seed", "3")
    calls = []
    opt = parse_opt(["--evolve", "3", "--project", str(tmp_path), "--name", "r", "--noplots", "--resume"])
    assert evolve(opt, train_fn=_fake_train(calls), **QUIET) == run
    _, rows = read_evolve_csv(run / "evolve.csv")
    assert len(rows) == 28 and len(calls) == 3
    assert "# Last generation: 27" in (run / "hyp_evolve.yaml").read_text()
