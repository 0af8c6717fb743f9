"""benchmarks/bench_published_step.py without the published code: a missing or wrong --published exits 2 with one
`error:` line that says how to get the checkout; the tool and the two helpers it borrows import no yolov9c module
(it runs in the published code's interpreter); the markdown table's ratios refer to the nchw row.
The timed run itself needs the published checkout (CPU smoke command in the tool's docstring).
Run: python -m pytest -q tests/benchmarks/test_bench_published_step.py
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "benchmarks" / "bench_published_step.py"
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_published_step  # noqa: E402

CLONE = "git clone https://github.com/WongKinYiu/yolov9"


def _run(*argv):
    return subprocess.run([sys.executable, str(TOOL), *argv], capture_output=True, text=True, timeout=60)


def _one_error_line(r):
    lines = [s for s in r.stderr.splitlines() if s.strip()]
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""  # no row was started
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def test_without_published_says_how_to_get_it():
    line = _one_error_line(_run("--device", "cpu"))
    assert "--published" in line and CLONE in line


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_wrong_published_path(tmp_path, kind):
    path = tmp_path / "nowhere" if kind == "missing" else tmp_path
    line = _one_error_line(_run("--published", str(path), "--device", "cpu"))
    assert str(path) in line and "train_dual.py" in line and CLONE in line


def test_published_without_the_model_yaml(tmp_path):
    (tmp_path / "train_dual.py").write_text("")
    (tmp_path / "models" / "detect").mkdir(parents=True)
    (tmp_path / "models" / "detect" / "yolov9-s.yaml").write_text("")
    line = _one_error_line(_run("--published", str(tmp_path), "--models", "yolov9-s", "yolov9-q"))
    assert "models/detect/yolov9-q.yaml" in line and "yolov9-s" in line  # names what is there


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.module or ""


def test_imports_no_yolov9c_module():
    tool = ast.parse(TOOL.read_text())
    names = list(_imports(tool))
    assert "bench_step" in names and "memory_plan.py" in TOOL.read_text()
    # what the tool runs of our files: memory_plan.py loaded from its file (every top-level statement runs, then
    # random_targets) and bench_step's _gpu_ms (imported: bench_step's top-level imports run too)
    borrowed = {"yolov9c/engine/train/memory_plan.py": "random_targets", "benchmarks/bench_step.py": "_gpu_ms"}
    for file, fn in borrowed.items():
        tree = ast.parse((REPO / file).read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn]
        assert len(body) == 1, f"{file} has no {fn}"
        names += list(_imports(ast.Module(body=top + body, type_ignores=[])))
    assert not [n for n in names if n.split(".")[0] == "yolov9c"], names


def test_markdown_ratios_against_nchw():
    rows = [{"model": "yolov9-s", "backend": "published", "mode": "nchw", "status": "ok", "step_ms": 300.0,
             "min_ms": 290.0, "gpu_ms": 250.0, "peak_alloc_gib": 20.0, "peak_reserved_gib": 22.0},
            {"model": "yolov9-s", "backend": "published", "mode": "channels_last", "status": "ok", "step_ms": 210.0,
             "min_ms": 200.0, "gpu_ms": 180.0, "peak_alloc_gib": 19.0, "peak_reserved_gib": 21.0},
            {"model": "yolov9-c", "backend": "published", "mode": "channels_last", "status": "oom"}]
    table = bench_published_step.markdown(rows).splitlines()
    assert len(table) == 2 + len(rows)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]
    assert cells[0][6] == "1.00" and cells[1][6] == "0.70"
    assert cells[2][3] == "oom" and cells[2][4] == "—" and cells[2][6] == "—"


def test_a_failing_configuration_is_a_row(tmp_path):
    """A checkout whose code cannot be imported: each mode's subprocess fails, each becomes an error row
    (the run goes on), and the exit status says a row failed."""
    pub = tmp_path / "pub"
    (pub / "models" / "detect").mkdir(parents=True)
    (pub / "train_dual.py").write_text("")
    (pub / "models" / "detect" / "yolov9-t.yaml").write_text("")
    env_home = {"YOLOV5_CONFIG_DIR": str(tmp_path / "cfg")}  # published_side's font copy goes here
    r = subprocess.run([sys.executable, str(TOOL), "--published", str(pub), "--device", "cpu", "--models",
                        "yolov9-t", "--batch", "1", "--img", "32", "--steps", "1", "--warmup", "0"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, **env_home})
    assert r.returncode == 1, r.stderr
    rows = [json.loads(s) for s in r.stdout.splitlines()]
    assert [(x["mode"], x["status"], x["backend"]) for x in rows] == [
        ("nchw", "error", "published"), ("channels_last", "error", "published")]
    assert all("No module named 'models" in x["error"] for x in rows), rows
