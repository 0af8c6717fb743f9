"""The c backend: lazy activations and concat-free blocks on a built model, with the same parameters.

    from yolov9c.backends import c
    c.install(model)     # every top-level layer of model.model gets the c forward (layers.layer_forward)
    c.uninstall(model)   # back to the classes' own forwards

Only per-instance `forward` attributes are set (no class, parameter, buffer or state_dict change), so a
checkpoint moves freely between backends, and copy.deepcopy of an installed model is an installed model
(the bound forwards are re-bound to the copies). In eval mode every layer runs its own torch forward, so
an EMA copy (deep-copied, always in eval mode) computes exactly as the torch backend.
Design: ../shared/DESIGN.md "Memory design" 1-2; lazy.py (values), conv.py (the autograd Function),
layers.py (per layer type). Test: python -m pytest -q tests/test_backend_c.py
"""

import types

from yolov9c.backends.c.layers import layer_forward


def install(model):
    for layer in model.model:
        layer.forward = types.MethodType(layer_forward, layer)


def uninstall(model):
    for layer in model.model:
        fwd = layer.__dict__.get("forward")
        if isinstance(fwd, types.MethodType) and fwd.__func__ is layer_forward:
            del layer.__dict__["forward"]
