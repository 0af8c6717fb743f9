"""Execution backends of a built model: "torch" (the plain PyTorch reference) and "c" (yolov9c/backends/c).

    model = apply(model, "c")      # after building and moving the model, before DDP wrapping
    apply(model, "c", Switches(aux_recompute=False))   # c with other memory/time switches (c/switches.py)
    backend_of(model)              # "c"
    accepts_uint8(model)           # True: pass the uint8 batch itself (c reads it as x / 255 on the fly)
    apply(model, "torch")          # plain execution again

Invariants: apply() changes how layers execute, never parameters, buffers, state_dict keys or module names, so
a checkpoint saved under one backend loads under the other; idempotent; returns the model; a DataParallel/DDP
wrapper is unwrapped first. The c backend runs in training mode only (eval runs every layer's torch forward);
YOLOV9C_FUSED=0 keeps its structure but sends every op to the torch reference. On the CPU it works but is slower
than torch (it exists to save GPU memory): the first apply(model, "c") of a CPU model logs that once.
Test: python -m pytest -q tests/backends/test_backend_c.py
"""

import logging

from torch import nn

BACKENDS = ("torch", "c")
_ATTR = "_yolov9c_backend"
LOGGER = logging.getLogger("yolov9c")
# benchmarks/RESULTS.md ("c backend on the CPU"): training step 2.6x (yolov9-t) and 2.9x (gelan-t) the torch step
CPU_NOTE = ("--backend c on the CPU: about 2.6-2.9x slower per training step than --backend torch here "
            "(measured); the c backend exists to save GPU memory: use --backend torch on the CPU")
_cpu_note_said = False


def _bare(model):
    while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        model = model.module
    return model


def apply(model, name, switches=None):
    """Switch `model` (a DetectionModel, possibly wrapped) to backend `name` ("torch" or "c"); returns model.
    `switches`: the c backend's c.switches.Switches (None: the defaults); refused with "torch"."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    bare = _bare(model)
    layers = getattr(bare, "model", None)
    if not isinstance(layers, nn.Sequential) or not all(hasattr(m, "f") and hasattr(m, "i") for m in layers):
        raise TypeError(f"backend {name!r}: expected a DetectionModel (layers in .model with .i/.f), "
                        f"got {type(bare).__name__}")
    from yolov9c.backends import c

    if name == "c":
        _note_cpu(bare)
        c.install(bare, c.DEFAULT if switches is None else switches)
    elif switches is not None:
        raise ValueError("apply: switches are the c backend's; got them with 'torch'")
    else:
        c.uninstall(bare)
    bare.__dict__[_ATTR] = name
    return model


def _note_cpu(model):
    """Say once per process that the c backend is slow on the CPU (model's parameters on the CPU)."""
    global _cpu_note_said
    param = next(model.parameters(), None)
    if _cpu_note_said or param is None or param.device.type != "cpu":
        return
    _cpu_note_said = True
    LOGGER.warning(CPU_NOTE)


def accepts_uint8(model):
    """True when `model` (possibly wrapped) takes the uint8 image batch itself and reads it as x / 255 (the c
    backend: the float image is then never stored); the trainer passes `imgs` unconverted then."""
    return bool(_bare(model).__dict__.get("accepts_uint8", False))


def backend_of(model):
    """"torch" or "c": the backend `model` (possibly wrapped) executes with."""
    return _bare(model).__dict__.get(_ATTR, "torch")
