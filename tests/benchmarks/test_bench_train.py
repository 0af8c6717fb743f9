"""benchmarks/bench_train.py's card reading (the training runs themselves need a GPU: `bash dev/gpu_run.sh capped`):
CardSampler keeps the largest memory.used its query answered while the block ran, None when the query is missing or
answers nothing usable; the markdown table shows it.
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
