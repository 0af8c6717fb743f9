"""CPU smoke run of benchmarks/bench_memory.py: each configuration runs in its own process and prints one JSON
line with the documented fields; ratios refer to the torch-nchw row; --markdown and --table print the table; a
configuration that fails becomes an error row instead of stopping the run. A tiny dual-head yaml keeps it fast
(the GPU figures come from `bash dev/gpu_run.sh build memory`).
Run: python -m pytest -q tests/benchmarks/test_bench_memory.py
"""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_memory  # noqa: E402
from inprocess import call, run_script  # noqa: E402

TINY_DUAL = """\
nc: 3
depth_multiple: 1.0
width_multiple: 1.0
backbone:
  [[-1, 1, Conv, [16, 3, 2]],
   [-1, 1, Conv, [16, 3, 2]],
   [-1, 1, AConv, [16]],
   [-1, 1, RepNCSPELAN4, [16, 16, 8, 1]],
   [-1, 1, ADown, [16]],
   [-1, 1, ADown, [16]],
  ]
head:
  [[3, 1, Conv, [16, 1, 1]],
   [4, 1, Conv, [16, 1, 1]],
   [5, 1, Conv, [16, 1, 1]],
   [[6, 7, 8, 3, 4, 5], 1, DualDDetect, [nc]],
  ]
"""
FIELDS = ("model", "config", "backend", "layout", "ckpt", "device", "batch", "img", "boxes", "status", "step_ms",
          "img_per_s", "peak_alloc_gib", "peak_reserved_gib", "static_alloc_gib", "alloc_ratio", "reserved_ratio",
          "step_ratio", "first_loss")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("bench") / "tiny-dual.yaml"
    p.write_text(TINY_DUAL)
    return p


def test_cpu_smoke_run(tiny, tmp_path, monkeypatch):
    # the parent here (tests/inprocess.py), each configuration in its own real `bench_memory.py --one` process
    monkeypatch.chdir(tmp_path)
    r = run_script(REPO / "benchmarks" / "bench_memory.py", "--device", "cpu", "--batch", "2", "--img", "64",
                   "--steps", "2", "--warmup", "1", "--models", tiny, "--nc", "3", "--configs", "c-cl",
                   "torch-ckpt", "torch-nchw", "--markdown", "--threads", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(s) for s in r.stdout.splitlines() if s.startswith("{")]
    assert [x["config"] for x in rows] == ["torch-nchw", "c-cl", "torch-ckpt"]  # the reference row first
    for row in rows:
        assert row["status"] == "ok", row
        assert set(FIELDS) <= set(row), set(FIELDS) - set(row)
        assert (row["device"], row["batch"], row["img"], row["boxes"]) == ("cpu", 2, 64, 20)
        assert row["step_ms"] > 0 and row["img_per_s"] > 0 and row["first_loss"] > 0
        assert row["peak_alloc_gib"] is None and row["alloc_ratio"] is None  # no allocator figures on the CPU
        assert row["step_ratio"] == pytest.approx(row["step_ms"] / rows[0]["step_ms"], rel=1e-2)
    assert [(x["backend"], x["layout"], x["ckpt"]) for x in rows] == \
        [("torch", "nchw", False), ("c", "channels_last", False), ("torch", "nchw", True)]
    # same seed, same weights and data: the backends and layouts agree on the first loss (float32)
    assert rows[1]["first_loss"] == pytest.approx(rows[0]["first_loss"], rel=1e-4)
    assert rows[2]["first_loss"] == pytest.approx(rows[0]["first_loss"], rel=1e-6)
    table = r.stdout[r.stdout.index("| model |"):].strip().splitlines()
    assert len(table) == 2 + len(rows) and "| torch-ckpt | ok |" in table[-1]

    saved = tmp_path / "rows.jsonl"
    saved.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    t = call(bench_memory.main, ["--table", str(saved)])
    assert t.returncode == 0 and t.stdout.strip().splitlines() == table


def test_failing_configuration_is_a_row(tmp_path):
    args = bench_memory.build_parser().parse_args(["--device", "cpu", "--batch", "1", "--img", "64", "--steps", "1",
                                                   "--warmup", "0"])
    row = bench_memory.run_config(args, str(tmp_path / "missing.yaml"), "torch-nchw")
    assert row["status"] == "error" and "missing.yaml" in row["error"]
    assert (row["model"], row["config"], row["backend"]) == (str(tmp_path / "missing.yaml"), "torch-nchw", "torch")


def test_ratios_and_table():
    rows = [{"model": "m", "config": "torch-nchw", "status": "ok", "peak_alloc_gib": 10.0, "peak_reserved_gib": 12.0,
             "step_ms": 100.0},
            {"model": "m", "config": "c-cl", "status": "ok", "peak_alloc_gib": 4.0, "peak_reserved_gib": 6.0,
             "step_ms": 80.0},
            {"model": "m", "config": "torch-cl", "status": "oom"}]
    bench_memory.add_ratios(rows)
    assert (rows[1]["alloc_ratio"], rows[1]["reserved_ratio"], rows[1]["step_ratio"]) == (0.4, 0.5, 0.8)
    assert rows[2]["alloc_ratio"] is None and rows[2]["step_ratio"] is None
    table = bench_memory.markdown(rows).splitlines()
    assert table[3].startswith("| m | c-cl | ok | 4.00 | 0.40 | 6.00 | 0.50 |")
    assert table[4].startswith("| m | torch-cl | oom | — |")


def test_graph_configuration_needs_cuda():
    """The -graph rows run the trainer's graphed step (bench_step.py); on a CPU device they are an error row that
    says why, not a crash or an eager measurement under the graph row's name."""
    args = bench_memory.build_parser().parse_args(["--device", "cpu", "--configs", "c-cl-graph"])
    row = bench_memory.run_one("yolov9-t", "c-cl-graph", args)
    assert row["status"] == "error" and "needs a CUDA device" in row["error"]
    assert (row["config"], row["backend"], row["layout"]) == ("c-cl-graph", "c", "channels_last")
    assert bench_memory.CONFIGS["torch-cl-graph"] == ("torch", True, False, True)


def test_graph_rows_pass_what_bench_step_reads():
    """The -graph rows hand bench_memory's parsed arguments to bench_step.run_one: every argument it reads is
    there (a missing one failed every graph row on the H200), and --cudnn-benchmark reaches the subprocess."""
    import re

    import bench_step
    src = Path(bench_step.__file__).read_text()
    body = src[src.index("def _state("):src.index("def main(")]
    read = set(re.findall(r"args\.([a-z_]+)", body))
    args = bench_memory.build_parser().parse_args(["--cudnn-benchmark"])
    assert read and not read - set(vars(args)), f"bench_step reads {sorted(read - set(vars(args)))}"
    assert "--cudnn-benchmark" in bench_memory.child_argv(args, "yolov9-s", "c-cl-graph")
