"""--ckpt: per-layer activation checkpointing of the torch backend (torch.utils.checkpoint around each layer).

    model.forward = types.MethodType(checkpointed_forward, model)
    buffers = bn_buffers(model)   # saved before and restored after backward: the recomputed forward updates BN twice

Used by the trainer (yolov9c/engine/train/state.py, step.py) and benchmarks/bench_memory.py (torch-ckpt row).
Test: python -m pytest -q tests/engine/train/test_train_e2e.py -k rare
"""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpointed_forward(self, x):
    """DetectionModel.forward with each layer wrapped in torch.utils.checkpoint (--ckpt): a layer's inner
    activations are recomputed in backward instead of stored."""
    y = []
    for m in self.model:
        if m.f != -1:
            x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
        if self.training and torch.is_grad_enabled() and m is not self.model[-1]:
            x = checkpoint(m, x, use_reentrant=False)
        else:
            x = m(x)
        y.append(x if m.i in self.save else None)
    return x


def bn_buffers(model):
    """The BatchNorm running statistics of `model` (running_mean, running_var, num_batches_tracked)."""
    return [b for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
            for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]
