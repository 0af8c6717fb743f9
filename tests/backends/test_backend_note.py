"""`--backend c` on the CPU says once per process that it is slower there (yolov9c/backends/__init__.py): in a
fresh Python process (the note is said once per process), three c applies log it once, a torch apply never.

Run: python -m pytest -q tests/backends/test_backend_note.py
"""

import os
import subprocess
import sys
from pathlib import Path

from yolov9c import backends

REPO = Path(__file__).resolve().parents[2]
CHILD = """
import logging
import yolov9c
from yolov9c import backends
notes = []
class Keep(logging.Handler):
    def emit(self, record):
        notes.append(record.getMessage())
logging.getLogger("yolov9c").addHandler(Keep(logging.WARNING))
a, b = yolov9c.build_model("gelan-t"), yolov9c.build_model("gelan-t")
backends.apply(a, "torch")
print("after torch:", sum("slower" in m for m in notes))
backends.apply(a, "c")
backends.apply(a, "c")
backends.apply(b, "c")
print("after c:", sum("slower" in m for m in notes), backends.backend_of(b))
print("note:", [m for m in notes if "slower" in m][0])
"""


def test_c_on_cpu_says_once_that_it_is_slower():
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "after torch: 0" and lines[1] == "after c: 1 c", lines
    assert lines[2] == "note: " + backends.CPU_NOTE
    assert "--backend torch" in lines[2] and "GPU memory" in lines[2]
