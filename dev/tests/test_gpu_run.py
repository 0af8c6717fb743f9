"""dev/gpu_run.sh, the one device-machine script: every part its header lists is a case of the script,
every case is listed, every benchmark it runs exists and takes the flags the script passes (checked against
the benchmark's own argparse source, so a renamed flag fails here rather than on the GPU machine), and the
script parses (`bash -n`). Run: python -m pytest -q dev/tests/test_gpu_run.py
"""

import ast
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "dev" / "gpu_run.sh"


def _text():
    return SCRIPT.read_text()


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_listed_parts_are_the_cases():
    text = _text()
    header = text.split("# Parts:")[1].split("# Test:")[0]
    listed = set(re.findall(r"^#\s{3}(\w+)\s", header, re.M))
    body = text.split('for part in "$@"; do')[1]
    cases = set(re.findall(r"^    (\w+)\)", body, re.M))
    assert listed == cases and {"build", "tests", "step", "memory", "train"} <= cases, (listed, cases)


def test_every_benchmark_exists_and_takes_its_flags():
    commands = re.sub(r"\\\n\s*", " ", _text())
    runs = re.findall(r"python3 ((?:benchmarks|dev)/\S+\.py)([^\n;|]*)", commands)
    assert len(runs) >= 9
    for path, args in runs:
        source = (REPO / path).read_text()
        for local in re.findall(r"^from (\w+) import", source, re.M):   # argparse helpers beside it
            if (REPO / path).with_name(local + ".py").is_file():
                source += (REPO / path).with_name(local + ".py").read_text()
        for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", args):
            assert f'"{flag}"' in source, f"{path} has no {flag}"


def _needs_cuda(node, names):
    """Whether a decorator (an ast node) skips without a GPU: a skipif that reads cuda.is_available, directly or
    through a module-level name bound to one."""
    text = ast.unparse(node)
    return ("skipif" in text and "cuda.is_available" in text) or (isinstance(node, ast.Name) and node.id in names)


def test_every_gpu_only_test_carries_the_cuda_marker():
    """The GPU run selects tests with `pytest -m cuda`: a test that skips without a GPU by a skipif alone would
    never run there (test_nms.py's CUDA cases were missed that way)."""
    missing = []
    for f in sorted([*(REPO / "tests").rglob("test_*.py"), *(REPO / "dev" / "tests").glob("test_*.py")]):
        tree = ast.parse(f.read_text())
        names = {t.id for n in tree.body if isinstance(n, ast.Assign) and _needs_cuda(n.value, ()) for t in n.targets
                 if isinstance(t, ast.Name)}
        marked_names = {t.id for n in tree.body if isinstance(n, ast.Assign) and "mark.cuda" in ast.unparse(n.value)
                        for t in n.targets if isinstance(t, ast.Name)}
        module_marked = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                            and "cuda" in ast.unparse(n.value) for n in tree.body)
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_"):
                decos = fn.decorator_list
                if any(_needs_cuda(d, names) for d in decos) and not module_marked and not any(
                        "mark.cuda" in ast.unparse(d) or (isinstance(d, ast.Name) and d.id in marked_names)
                        for d in decos):
                    missing.append(f"{f.name}::{fn.name}")
    assert not missing, missing
