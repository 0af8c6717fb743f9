"""Run a command-line entry point inside the test process: what `python SCRIPT ARGS` or `python -m yolov9c ARGS`
does, without starting another Python. A start costs ~2-3 s of CPU (importing torch and the package) on the
2-core CI machine; each entry point keeps at least one test that really starts it as a subprocess
(tests/cli/test_entry_points.py says which), the other cases of its command line run here.

An exception that escapes the entry point fails the calling test, as a traceback would in a subprocess.
"""

import io
import runpy
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import NamedTuple


class Ran(NamedTuple):
    """What a finished command left: its exit code and what it printed (like subprocess.CompletedProcess)."""
    returncode: int
    stdout: str
    stderr: str


def call(fn, *args) -> Ran:
    """fn(*args) with stdout and stderr captured; its return value, or the code of a SystemExit it raises
    (argparse's usage errors and --help), is the exit code."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = fn(*args)
        except SystemExit as e:
            code = e.code
    code = 0 if code is None else code if isinstance(code, int) else 1
    return Ran(code, out.getvalue(), err.getvalue())


def run_script(script: Path, *args) -> Ran:
    """`python SCRIPT ARGS...` in this process: the script runs as __main__ with sys.argv set as Python sets it."""
    def run():
        old = sys.argv
        sys.argv = [str(script), *map(str, args)]
        try:
            runpy.run_path(str(script), run_name="__main__")
        finally:
            sys.argv = old
    return call(run)
