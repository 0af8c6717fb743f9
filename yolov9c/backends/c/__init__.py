"""The c backend: lazy activations and concat-free blocks on a built model, with the same parameters.

    from yolov9c.backends import c
    c.install(model, sw) # every top-level layer of model.model gets the c forward (layers.layer_forward),
                         # the model the c model forward (pgi.model_forward: recomputed auxiliary branch,
                         # uint8 input; model.accepts_uint8 is True); sw: switches.Switches (default: DEFAULT)
    c.uninstall(model)   # back to the classes' own forwards

Only per-instance `forward` attributes are set (no class, parameter, buffer or state_dict change), so a
checkpoint moves freely between backends, and copy.deepcopy of an installed model is an installed model
(the bound forwards are re-bound to the copies). In eval mode every layer runs its own torch forward, so
an EMA copy (deep-copied, always in eval mode) computes exactly as the torch backend.
Design: docs/train.md "What `--backend c` keeps for backward"; lazy/ (values), conv.py (the autograd Function),
layers.py (per layer type), segment.py + pgi.py (the recomputed auxiliary branch, uint8 input), switches.py
(what is recomputed and kept: the run's --aux-recompute, --main-recompute, --keep-inputs). Test: python -m pytest -q tests/backends/test_backend_c.py
"""

import types

from yolov9c.backends.c.layers import layer_forward
from yolov9c.backends.c.pgi import model_forward
from yolov9c.backends.c.switches import DEFAULT, Switches


def install(model, switches=DEFAULT):
    if not isinstance(switches, Switches):
        raise TypeError(f"c.install: switches must be a Switches, got {type(switches).__name__}")
    for layer in model.model:
        layer.forward = types.MethodType(layer_forward, layer)
    model.forward = types.MethodType(model_forward, model)
    model.__dict__["accepts_uint8"] = True
    model.__dict__["c_switches"] = switches


def _uninstall_forward(module, fn):
    fwd = module.__dict__.get("forward")
    if isinstance(fwd, types.MethodType) and fwd.__func__ is fn:
        del module.__dict__["forward"]


def uninstall(model):
    for layer in model.model:
        _uninstall_forward(layer, layer_forward)
    _uninstall_forward(model, model_forward)
    model.__dict__.pop("accepts_uint8", None)
    model.__dict__.pop("c_switches", None)
    model.__dict__.pop("_c_graph", None)
