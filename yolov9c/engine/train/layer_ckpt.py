"""--ckpt: per-layer activation checkpointing of the torch backend (torch.utils.checkpoint around each layer).

    model.forward = types.MethodType(checkpointed_forward, model)
    buffers = bn_buffers(model)
    with bn_update_once(buffers):   # around backward: its recomputed forward updates BatchNorm a second time
        loss.backward()

Capturable in a CUDA graph (graph_step.py captures the forward, the recompute in backward and the undo) unless a
layer draws random numbers (draws_random: checkpointed_forward says why); the undo is device copies only.
Used by the trainer (yolov9c/engine/train/state.py, step.py, graph_step.py) and benchmarks/bench_memory.py.
Test: python -m pytest -q tests/engine/train/test_graph_step.py -k ckpt tests/engine/train/test_train_e2e.py -k rare
"""

from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpointed_forward(self, x):
    """DetectionModel.forward with each layer but the head wrapped in torch.utils.checkpoint (--ckpt, training
    with grad only): a layer's inner activations are recomputed in backward instead of stored.

    The generator state is saved and restored around a layer's recompute (preserve_rng_state) only for a layer
    that draws random numbers (draws_random): the recompute of any other layer equals its forward without it
    (tests/engine/train/test_graph_step.py: a training forward and backward of the bundled models leave the
    generator as they found it). Saving it is what a CUDA graph capture cannot hold: torch.utils.checkpoint reads
    the device generator at each checkpointed forward (get_device_states → torch.cuda.get_rng_state →
    CUDAGeneratorImpl::get_state → current_seed()) and sets it before each recompute (set_device_states, fork_rng
    → CUDAGeneratorImpl::set_state); both call at::cuda::assertNotCapturing, which raises during a capture
    ("Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture"), and torch has no capturable way to
    rewind the generator's in-graph offset for the recompute. So graph_step.py graphs --ckpt only without such a
    layer."""
    y = []
    for m in self.model:
        if m.f != -1:
            x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
        if self.training and torch.is_grad_enabled() and m is not self.model[-1]:
            x = checkpoint(m, x, use_reentrant=False, preserve_rng_state=draws_random(m))
        else:
            x = m(x)
        y.append(x if m.i in self.save else None)
    return x


def draws_random(module):
    """Whether `module` or one of its sub-modules draws random numbers in training: a dropout with p > 0
    (nn.Dropout is the one such module a model yaml can name: models/parse.py MODULES)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules())


def bn_buffers(model):
    """The BatchNorm running statistics of `model` (running_mean, running_var, num_batches_tracked)."""
    return [b for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
            for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]


@contextmanager
def bn_update_once(buffers):
    """Around the backward of a checkpointed forward: `buffers` (bn_buffers of the model; [] without --ckpt, then
    nothing is done) are put back on exit to their values on entry, undoing the BatchNorm update of the forward
    recomputed in backward, so the statistics move once per micro-batch as without --ckpt. Device operations
    only: a clone of each buffer on entry, one _foreach_copy_ on exit; no host read, and inside a CUDA graph
    capture the clones come from the graph's pool. Nothing is put back when the body raises."""
    if not buffers:
        yield
        return
    saved = [b.clone() for b in buffers]
    yield
    torch._foreach_copy_(buffers, saved)
