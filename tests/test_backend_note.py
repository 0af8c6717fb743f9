"""`--backend c` on the CPU says once per process that it is slower there (yolov9c/backends/__init__.py).

Run: python -m pytest -q tests/test_backend_note.py
"""

import logging

import yolov9c
from yolov9c import backends


def test_c_on_cpu_says_once_that_it_is_slower(monkeypatch, caplog):
    monkeypatch.setattr(backends, "_cpu_note_said", False)
    caplog.set_level(logging.WARNING, logger="yolov9c")
    a, b = yolov9c.build_model("gelan-t"), yolov9c.build_model("gelan-t")
    backends.apply(a, "torch")
    assert not [r for r in caplog.records if "slower" in r.getMessage()]  # torch: nothing to say
    backends.apply(a, "c")
    backends.apply(a, "c")
    backends.apply(b, "c")
    notes = [r.getMessage() for r in caplog.records if "slower" in r.getMessage()]
    assert notes == [backends.CPU_NOTE]
    assert "--backend torch" in notes[0] and "GPU memory" in notes[0]
    assert backends.backend_of(b) == "c"
