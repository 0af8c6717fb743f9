"""Imports flow down: cli -> package face -> engine -> backends -> models/loss/data -> ops -> _C, with geometry
and resources at the bottom (docs/design.md draws the graph).

Every module under yolov9c/ is parsed (ast; imports inside functions count too). A module may import modules
of its own layer or below (LAYERS); an import of a higher layer fails, naming the file and line. Folders
(packages; a top-level module is its own) must form no circle. Every top-level name must be in LAYERS, so a
new folder is placed on purpose. KNOWN lists the folder pairs still allowed against the rule, each with why.
The op layer at the bottom (last section): every yolov9c/ops module imports only yolov9c._C, yolov9c.geometry,
other ops modules and torch/numpy (and a few stdlib modules), and importing all of them (after `import yolov9c`,
whose api imports lazily) loads no other yolov9c package (no loss, models, data, engine). Last, the suite stands
without dev/ (the developers' tools sit above it): no code under tests/ names a path in dev/ or imports its modules.
Test: python -m pytest -q tests/package/test_import_direction.py
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "yolov9c"

# rank of each top-level part of the package: a module may import only ranks <= its own
LAYERS = {
    "__main__": 7, "cli": 7,
    "": 6, "api": 6,  # the package face: yolov9c/__init__.py and api.py (for users and the CLI, never below)
    "engine": 5,
    "backends": 4,
    "models": 3, "loss": 3, "data": 3,
    "ops": 2,
    "_C": 1,
    "geometry": 0, "resources": 0, "units": 0,
}

# (importing folder, imported folder) still allowed against the rule
KNOWN = set()


def _module_name(path, root):
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_module(name, root):
    """Whether yolov9c.<...> `name` is a module or package of `root` (or the extension yolov9c._C)."""
    rel = name.split(".")[1:]
    if rel == ["_C"]:
        return True
    base = root.joinpath(*rel) if rel else root
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path, root):
    """[(line, imported module)] of the yolov9c modules `path` imports. `from yolov9c import X` is the module
    yolov9c.X when X is one (X = _C included), else the package face (yolov9c)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "yolov9c"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                pkg = _module_name(path, root).split(".")
                pkg = pkg if path.name == "__init__.py" else pkg[:-1]
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "yolov9c":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((node.lineno, sub if _is_module(sub, root) else base))
    return out


def _folder(name, root):
    """The folder (package) a module belongs to; a top-level module is its own folder."""
    rel = name.split(".")[1:]
    if len(rel) <= 1:
        return name
    base = root.joinpath(*rel)
    return name if (base / "__init__.py").is_file() else name.rsplit(".", 1)[0]


def _rank(name):
    rel = name.split(".")[1:]
    return LAYERS.get(rel[0] if rel else "")


def import_violations(root=PKG, known=KNOWN):
    """(upward imports and unplaced modules, folder circles) of the package at `root`, as readable lines."""
    bad, edges = [], {}
    for path in sorted(root.rglob("*.py")):
        me = _module_name(path, root)
        if _rank(me) is None:
            bad.append(f"{path}: {me.split('.')[1]!r} has no layer in LAYERS")
            continue
        for line, other in imports_of(path, root):
            pair = (_folder(me, root), _folder(other, root))
            if pair in known:
                continue
            if pair[0] != pair[1]:
                edges.setdefault(pair[0], set()).add(pair[1])
            if _rank(other) is None:
                bad.append(f"{path}:{line}: imports {other}, which has no layer in LAYERS")
            elif _rank(other) > _rank(me):
                bad.append(f"{path}:{line}: {me} (layer {_rank(me)}) imports {other} (layer {_rank(other)}): upward")
    return bad, _circles(edges)


def _circles(edges):
    """Folder circles: every strongly connected set of more than one folder (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_imports_flow_down():
    bad, circles = import_violations()
    assert not bad, "upward imports:\n" + "\n".join(bad)
    assert not circles, f"folder circles: {circles}"


def test_the_check_finds_upward_imports_and_circles(tmp_path):
    """A copy of the package with an engine module importing the package face, a model importing the engine
    (a circle with engine -> models) and a new unplaced folder: each is reported."""
    root = tmp_path / "yolov9c"
    shutil.copytree(PKG, root, ignore=shutil.ignore_patterns("*.so", "__pycache__", "configs"))
    (root / "engine" / "face_user.py").write_text("def f():\n    from yolov9c import load_model\n")
    (root / "models" / "upward.py").write_text("from yolov9c.engine.train import trainer\n")
    (root / "extras").mkdir()
    (root / "extras" / "__init__.py").write_text("")
    bad, circles = import_violations(root)
    assert any("face_user.py:2: yolov9c.engine.face_user (layer 5) imports yolov9c (layer 6)" in b for b in bad)
    assert any("upward.py:1:" in b and "upward" in b for b in bad)
    assert any("'extras' has no layer" in b for b in bad)
    assert any({"yolov9c.models", "yolov9c.engine.train"} <= set(c) for c in circles)


def test_known_exceptions_are_still_needed():
    """Each KNOWN pair still occurs (else delete it from KNOWN): without it the check reports it."""
    bad, circles = import_violations(known=set())
    for a, b in KNOWN:
        upward = [line for line in bad if f" {a}." in line and f"imports {b}." in line]
        assert upward or any({a, b} <= set(c) for c in circles), (a, b)


# ---------------------------------------------------------------------------------------------------------
# the op layer at the bottom
# ---------------------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
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
                assert name.split(".")[0] in ("torch", "numpy", "cv2", "typing", "os", "math", "numbers",
                                              "collections", "contextlib", "importlib", "pathlib", "sys"), \
                    f"{path.name} imports {name}"


def test_importing_the_ops_loads_no_upper_layer():
    mods = ", ".join(f"yolov9c.ops.{p.stem}" for p in OPS if p.stem != "__init__")
    code = (f"import sys, yolov9c\nbefore = set(sys.modules)\nimport {mods}\n"   # the package's own init aside
            "up = sorted(m for m in set(sys.modules) - before if m.startswith('yolov9c.') and not m.startswith("
            f"{ALLOWED!r}))\nprint(up)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


# ---------------------------------------------------------------------------------------------------------
# tests/ stand without dev/ (dev/tests/ hold the tools' tests; dev/README.md lists what still reaches in)
# ---------------------------------------------------------------------------------------------------------

TESTS, DEV = REPO / "tests", REPO / "dev"
# "dev", "dev/x", "{}/dev/x", "a/dev"; not the system's "/dev/zero", alone or after a space
_DEV_PATH = re.compile(r"(^|[^\s/\\'\"(][/\\])dev([/\\]|$)")
# files under tests/ allowed to name dev/, each with why
DEV_NAMED = {"package/test_import_direction.py": "this check: it names dev/ to look for it",
             "package/test_units.py": "reads dev/'s files as text (one GiB definition everywhere), runs none"}


def _texts(node):
    """The strings an expression node spells: a constant; an f-string or a `x + "..."` with {} for what is computed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.right, ast.Constant) \
            and isinstance(node.right.value, str) and not isinstance(node.left, ast.Constant):
        return ["{}" + node.right.value]
    return []


def dev_reaches(root=TESTS, dev=DEV):
    """["file:line: why"] for each place in a .py file under `root` that names a path in dev/ (a string outside a
    docstring or bare string statement: sys.path entries, files loaded or run) or imports a module of dev/ by name
    (`import augment_stats`, `from dev.fidelity import stats`, importlib.import_module("train_other_loss"))."""
    modules = {p.stem for p in dev.rglob("*.py") if p.parent != dev / "tests"} | {"dev"}
    out = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() in DEV_NAMED:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # docstrings and the like
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(node.lineno, f"imports {a.name}") for a in node.names if a.name.split(".")[0] in modules]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] in modules:
                found.append((node.lineno, f"imports from {node.module}"))
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                    "import_module", "__import__") and node.args and any(
                    t.split(".")[0] in modules for t in _texts(node.args[0])):
                found.append((node.lineno, f"imports {_texts(node.args[0])[0]}"))
            elif id(node) not in bare:
                found += [(node.lineno, f"names the path {t!r}") for t in _texts(node) if _DEV_PATH.search(t)]
        out += [f"{path.relative_to(root.parent)}:{line}: {why}" for line, why in sorted(found)]
    return out


def test_tests_do_not_reach_into_dev():
    bad = dev_reaches()
    assert not bad, "tests/ reach into dev/ (move the case to dev/tests/, or copy the value it needs):\n" + \
        "\n".join(bad)


def test_the_dev_check_finds_each_way_in(tmp_path):
    """Each way a test could reach dev/ is reported once, on its line; the system's /dev/zero, the repository root
    on sys.path, a module of another package named like a dev tool and docstrings are not."""
    (tmp_path / "tests").mkdir()
    lines = ['"""Uses dev/fidelity/augment_stats.py."""',
             "import sys, importlib",
             "from pathlib import Path",
             "from scipy import stats",
             "REPO = Path(__file__).parents[1]",
             "sys.path.insert(0, str(REPO))",
             "open('/dev/zero')",
             'sys.path.insert(0, str(REPO / "dev" / "fidelity"))',
             "import augment_stats",
             "from dev.accuracy import train_other_loss",
             'sys.path.append(f"{REPO}/dev/accuracy")',
             'spec = importlib.util.spec_from_file_location("x", str(REPO) + "/dev/probes/bn_passes.py")',
             'importlib.import_module("train_other_loss")',
             'run = ["python", "dev/gpu_run.sh"]']
    (tmp_path / "tests" / "test_x.py").write_text("\n".join(lines) + "\n")
    bad = dev_reaches(tmp_path / "tests")
    assert [int(b.split(":")[1]) for b in bad] == list(range(8, 15)), bad
    assert all(b.startswith("tests/test_x.py:") for b in bad)


def test_no_two_modules_import_each_other():
    """Within a folder too, imports flow one way: no pair of modules imports each other (imports inside functions
    count), e.g. graph_shapes builds on graph_step, so graph_step names nothing of graph_shapes."""
    edges = {}
    for path in sorted(PKG.rglob("*.py")):
        name = _module_name(path, PKG)
        edges[name] = {m for _, m in imports_of(path, PKG)} - {name}
    pairs = sorted({tuple(sorted((a, b))) for a, deps in edges.items() for b in deps if a in edges.get(b, ())})
    assert not pairs, "modules that import each other: " + ", ".join(f"{a} <-> {b}" for a, b in pairs)
