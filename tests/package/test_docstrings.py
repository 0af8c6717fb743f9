"""Docstrings state the contract (what, inputs/outputs, invariants, which test) in at most MAX_LINES lines.

Every module, class and function docstring under yolov9c/ is read with ast (nothing is imported). A docstring
longer than MAX_LINES (after ast's cleaning: leading/trailing blank lines and common indentation dropped)
fails, naming file, line and object; so does one that holds a date or an issue number (history: it belongs in
a commit message; measurements belong in benchmarks/RESULTS.md). EXCEPTIONS may name a docstring that mirrors
a published signature, each with its reason; it is empty today.
Test: python -m pytest -q tests/package/test_docstrings.py
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "yolov9c"
MAX_LINES = 15

# "path/relative/to/yolov9c.py:qualname" -> why it may be longer than MAX_LINES
EXCEPTIONS: dict[str, str] = {}

# history words: a date (2026-12-05) or an issue/PR number ("issue 13", "issue #13")
HISTORY = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bissue #?\d+", re.IGNORECASE)


def docstrings(source: str):
    """(qualname, line, cleaned docstring) of the module and of every class and function in `source`."""
    tree = ast.parse(source)
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                doc = ast.get_docstring(child)
                if doc is not None:
                    out.append((name, child.body[0].lineno, doc))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    doc = ast.get_docstring(tree)
    if doc is not None:
        out.append(("<module>", tree.body[0].lineno, doc))
    visit(tree, "")
    return out


def too_long(source: str, rel: str) -> list[str]:
    """Problems of one file: 'rel:line qualname: N lines' for each docstring over MAX_LINES not in EXCEPTIONS."""
    return [f"{rel}:{line} {name}: {len(doc.splitlines())} lines (at most {MAX_LINES})"
            for name, line, doc in docstrings(source)
            if len(doc.splitlines()) > MAX_LINES and f"{rel}:{name}" not in EXCEPTIONS]


def with_history(source: str, rel: str) -> list[str]:
    """'rel:line qualname: 'match'' for each docstring that holds a date or an issue number."""
    return [f"{rel}:{line} {name}: {m.group(0)!r}"
            for name, line, doc in docstrings(source) for m in [HISTORY.search(doc)] if m]


def _files():
    files = sorted(PKG.rglob("*.py"))
    assert len(files) > 50, f"expected the package's modules under {PKG}, found {len(files)}"
    return [(p, str(p.relative_to(PKG))) for p in files]


def test_scanner_flags_a_long_docstring_and_history():
    ok = "\n".join(f"line {i}" for i in range(MAX_LINES))
    long = ok + "\none more"
    src = (f'"""{ok}"""\n\nclass A:\n    def f(self):\n        """{long}"""\n\n\n'
           'def g():\n    """Seen 2026-12-05."""\n')
    lines = src.splitlines()
    f_line, g_line = lines.index("    def f(self):") + 2, lines.index("def g():") + 2
    assert too_long(src, "x.py") == [f"x.py:{f_line} A.f: {MAX_LINES + 1} lines (at most {MAX_LINES})"]
    assert with_history(src, "x.py") == [f"x.py:{g_line} g: '2026-12-05'"]
    assert with_history('"""Fixed in issue 13."""', "y.py") == ["y.py:1 <module>: 'issue 13'"]


def test_exceptions_name_existing_docstrings_with_a_reason():
    found = {f"{rel}:{name}": doc for p, rel in _files() for name, _, doc in docstrings(p.read_text())}
    for key, why in EXCEPTIONS.items():
        assert key in found, f"EXCEPTIONS names {key}, which has no docstring any more: remove it"
        assert len(found[key].splitlines()) > MAX_LINES, f"{key} fits in {MAX_LINES} lines now: remove it"
        assert why.strip(), f"EXCEPTIONS[{key!r}] needs its reason"


def test_docstrings_fit_in_max_lines():
    problems = [msg for p, rel in _files() for msg in too_long(p.read_text(), rel)]
    assert not problems, ("docstrings longer than the contract needs (keep what, inputs/outputs, invariants and "
                          "the test; measurements go to benchmarks/RESULTS.md):\n" + "\n".join(problems))


def test_docstrings_hold_no_history():
    problems = [msg for p, rel in _files() for msg in with_history(p.read_text(), rel)]
    assert not problems, ("docstrings with dates or issue numbers (history belongs in the commit message, "
                          "measurements in benchmarks/RESULTS.md):\n" + "\n".join(problems))
