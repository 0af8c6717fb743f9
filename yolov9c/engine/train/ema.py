"""Exponential moving average of the model's weights (published ModelEMA, utils/torch_utils.py).

decay(updates) = 0.9999 · (1 − exp(−updates / 2000)); after each optimizer step every floating-point
state_dict entry (parameters and BN buffers) becomes d·ema + (1 − d)·model, as two foreach calls over the pairs
found once per model (the tensors are assumed stable for the run, as the CUDA-graph step's capture assumes). The
EMA copy is float32, in eval mode, without gradients; it is what validation sees and what the stripped checkpoint
keeps.

Test: python -m pytest -q tests/engine/train/test_train_parts.py -k ema
"""

import copy
import math

import torch
from torch import nn


def _bare(model):
    while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        model = model.module
    return model


class ModelEMA:
    def __init__(self, model, decay=0.9999, tau=2000, updates=0):
        self.ema = copy.deepcopy(_bare(model)).float().eval()
        self.updates = int(updates)
        self.decay_max, self.tau = decay, tau
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self._pairs = None  # (the model, its EMA tensors, its matching tensors): see pairs()

    def decay(self, updates=None):
        u = self.updates if updates is None else updates
        return self.decay_max * (1 - math.exp(-u / self.tau))

    def pairs(self, model):
        """(EMA tensors, the model's matching tensors): every floating-point state_dict entry, in its order; found
        on the first call for a model and kept (a state_dict walk per step costs host time on every eager step)."""
        bare = _bare(model)
        if self._pairs is None or self._pairs[0] is not bare:  # the module, not its id: ids are reused
            msd = bare.state_dict()
            pairs = [(v, msd[k]) for k, v in self.ema.state_dict().items() if v.dtype.is_floating_point]
            self._pairs = (bare, [v for v, _ in pairs], [m for _, m in pairs])
        return self._pairs[1], self._pairs[2]

    @torch.no_grad()
    def update(self, model):
        self.updates += 1
        d = self.decay()
        ema, live = self.pairs(model)
        live = [m if m.dtype == v.dtype else m.to(v.dtype) for v, m in zip(ema, live)]
        torch._foreach_mul_(ema, d)
        torch._foreach_add_(ema, live, alpha=1 - d)

    def update_attr(self, model, names=("yaml", "nc", "hyp", "names", "stride", "class_weights")):
        m = _bare(model)
        for k in names:
            if hasattr(m, k):
                setattr(self.ema, k, getattr(m, k))
