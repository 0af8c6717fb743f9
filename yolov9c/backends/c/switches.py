"""The c backend's memory/time switches: what a training step recomputes in backward and what it keeps.

    apply(model, "c", Switches())   # the defaults; c.install: the model's forward reads model.c_switches
    parse_switch("main_recompute", "4")   # 4: a value as --main-recompute and YOLOV9C_MAIN_RECOMPUTE write it

- aux_recompute: the PGI auxiliary branch keeps only its inputs and segment outputs and is re-run in backward
  (pgi.py). Off: every auxiliary z is stored (more memory, less time), and the main blocks too.
- main_recompute: main backbone blocks (RepNCSPELAN4, ELAN1) whose input is at this stride or finer are one-layer
  recomputed segments (8: strides 4 and 8; 4: stride 4 only; 0: none).
- keep_inputs: a segment's backward recompute keeps each conv input it rebuilt for that conv's own backward
  (conv.inputs_kept): one BN+SiLU pass less per recomputed conv, a higher peak (benchmarks/RESULTS.md §16).
- plain_stride: layers and head levels not recomputed whose finest input is at this stride or coarser run their
  torch forward (activations stored) for fewer host calls (16: strides 16, 32; pgi.py).
The trainer passes them down from the run's options (RunConfig); nothing below reads the environment.
Test: python -m pytest -q tests/backends/test_backend_pgi.py tests/backends/test_plain_stride.py
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Switches:
    aux_recompute: bool = True
    main_recompute: int = 8  # a stride: blocks whose input is at this stride or finer; 0 = none
    keep_inputs: bool = False
    plain_stride: int = 0  # a stride: main layers whose input is at this stride or coarser run torch's forward


DEFAULT = Switches()
ON_OFF = {"0": False, "1": True}


def parse_switch(name, text):
    """The value of switch `name` (a Switches field) from its text: 0 or 1 for aux_recompute and keep_inputs, an
    integer >= 0 (a stride) for main_recompute. ValueError saying what is allowed otherwise."""
    text = str(text).strip()
    if name in ("main_recompute", "plain_stride"):
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise ValueError(f"must be a stride: an integer >= 0 such as 8 or 4 (0: none), got {text!r}")
        return value
    if name not in ("aux_recompute", "keep_inputs"):
        raise ValueError(f"unknown c backend switch {name!r}")
    if text not in ON_OFF:
        raise ValueError(f"must be 0 or 1, got {text!r}")
    return ON_OFF[text]
