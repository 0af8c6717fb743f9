"""The op layer sits at the bottom (STYLE.md: cli -> engine -> backends -> models/loss/data -> ops -> _C, geometry
under all): every yolov9c/ops module imports only yolov9c._C, yolov9c.geometry, other ops modules and
torch/numpy, and importing all of them (after `import yolov9c`, whose api imports lazily) loads no other
yolov9c package (no loss, models, data, engine).
Run: python -m pytest -q tests/test_ops_imports.py
"""

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPS = sorted((REPO / "yolov9c" / "ops").glob("*.py"))
ALLOWED = ("yolov9c._C", "yolov9c.geometry", "yolov9c.ops")


def imported(path):
    """Every module name a file imports (also inside functions), with the module of a `from X import y`."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "yolov9c":   # from yolov9c import _C
            names += [f"yolov9c.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_ops_modules_import_only_the_layers_below():
    assert len(OPS) >= 6
    for path in OPS:
        for name in imported(path):
            if name == "yolov9c" or name.startswith("yolov9c."):
                assert name.startswith(ALLOWED), f"{path.name} imports {name}"
            else:
                assert name.split(".")[0] in ("torch", "numpy", "cv2", "typing", "os", "math", "numbers"), \
                    f"{path.name} imports {name}"


def test_importing_the_ops_loads_no_upper_layer():
    mods = ", ".join(f"yolov9c.ops.{p.stem}" for p in OPS if p.stem != "__init__")
    code = (f"import sys, yolov9c\nbefore = set(sys.modules)\nimport {mods}\n"   # the package's own init aside
            "up = sorted(m for m in set(sys.modules) - before if m.startswith('yolov9c.') and not m.startswith("
            f"{ALLOWED!r}))\nprint(up)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
