"""benchmarks/bench_train.py's card reading (the training runs themselves need a GPU: `bash dev/gpu_run.sh capped`):
CardSampler keeps the largest memory.used its query answered while the block ran, None when the query is missing or
answers nothing usable; the markdown table shows it. The prediction of a --mem-budget auto row is the plan's
phases as the run logs them under its cap (validation chunks sized to the cap, not the budget); a row without
--val-chunks predicts the run's default (chunks beside the graphs).
Run: python -m pytest -q tests/benchmarks/test_bench_train.py
"""

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_train  # noqa: E402


def test_card_sampler_keeps_the_largest_reading(tmp_path):
    # a stand-in for nvidia-smi that answers 100, 700, 300, 300, ... MiB on successive calls (each call appends a
    # line to `calls`: the count)
    calls = tmp_path / "calls"
    calls.touch()
    script = tmp_path / "smi.py"
    script.write_text("import pathlib\n"
                      f"p = pathlib.Path({str(calls)!r})\n"
                      "n = len(p.read_text().split())\n"
                      "print([100, 700][n] if n < 2 else 300)\n"
                      "with open(p, 'a') as f:\n"
                      "    f.write('x\\n')\n")

    def answered():
        return len(calls.read_text().split())

    with bench_train.CardSampler(period=0.01, command=[sys.executable, str(script)]) as card:
        deadline = time.time() + 20
        while answered() < 4 and time.time() < deadline:
            time.sleep(0.01)
    assert answered() >= 4 and card.max_mib == 700


def test_card_sampler_without_an_answer_is_none(tmp_path):
    with bench_train.CardSampler(period=0.01, command=[str(tmp_path / "no-such-command")]) as card:
        time.sleep(0.05)
    assert card.max_mib is None
    with bench_train.CardSampler(period=0.01, command=[sys.executable, "-c", "print('N/A')"]) as card:
        time.sleep(0.05)
    assert card.max_mib is None


def test_the_table_shows_the_card_reading():
    row = {"model": "yolov9-c", "backend": "c", "mem_cap_gib": 14.5, "status": "ok", "train_peak_alloc_gib": 9.9,
           "train_peak_reserved_gib": 10.9, "card_max_mib": 15012, "epoch_s": 9.8, "img_per_s": 223.3, "val_batch": 128}
    table = bench_train.markdown([row, dict(row, card_max_mib=None)]).splitlines()
    assert "card max MiB" in table[0] and "| 15012 |" in table[2] and "| — |" in table[3]


def test_an_auto_rows_prediction_sizes_validation_to_the_cap():
    import argparse

    from yolov9c.backends.c.switches import Switches
    from yolov9c.engine.train import memory_auto as ma
    from yolov9c.engine.train import memory_phases as mph
    from yolov9c.engine.train import memory_plan as mp

    args = argparse.Namespace(batch=64, img=640, val_images=128, mem_budget="auto", val_chunks=None)
    got = bench_train.predicted("yolov9-s", "c", args, 5.0, {"budget_gib": 4.5, "card_free_gib": 78.6})
    vc, cost_of = mph.val_cost_for("yolov9-s"), (lambda sw: mp.cost_for("yolov9-s", "c", sw))
    plan = ma.choose(cost_of, vc, 4.5, 64, switches=Switches())
    assert got["choice"] == plan.describe() and got["val_batch"] == 128 and got["graphs_kept"]
    assert got["chunk"] > plan.run.chunk  # the cap leaves 0.5 GiB more than the budget the plan fitted in
    assert got["phases_gib"]["train"] == [round(v, 3) for v in plan.run.logged["train"]]
    assert plan.run.logged["validation"][1] < got["phases_gib"]["validation"][1] <= 5.0



def test_a_default_rows_prediction_chunks_validation_as_the_run_does():
    import argparse

    # no --val-chunks, no --mem-budget: the run's default validation (in chunks beside the graphs) under its cap
    args = argparse.Namespace(batch=64, img=640, val_images=128, mem_budget=None, val_chunks=None)
    got = bench_train.predicted("yolov9-s", "c", args, 7.0, None)
    assert got["graphs_kept"] and 8 <= got["chunk"] < 128 and got["phases_gib"]["validation"][1] <= 7.0
    off = bench_train.predicted("yolov9-s", "c", argparse.Namespace(**{**vars(args), "val_chunks": "off"}), 7.0, None)
    assert off["chunk"] == 128 and not off["graphs_kept"]
