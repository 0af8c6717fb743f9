"""A block through the c backend against the same block in plain torch, channels-last (the training layout):
the helper of the pool tests (tests/test_pool.py, tests/test_maxpool.py)."""

import copy

import torch

from yolov9c.backends.c import layers
from yolov9c.backends.c.lazy import materialise_any

BLOCK_TOL = 1e-5


def rel_err(a, ref):
    """max |a - ref| / max |ref| in float64."""
    a, ref = a.detach().double(), ref.detach().double()
    return ((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def assert_c_block_matches_torch(block, x, tol=BLOCK_TOL):
    """block (in train mode) on x as plain torch and through layers.run on a copy: output, input gradient,
    parameter gradients and floating-point buffers (BN running statistics) within tol (relative)."""
    b1 = block.to(memory_format=torch.channels_last)
    b2 = copy.deepcopy(b1)
    x1 = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    x2 = x1.detach().clone(memory_format=torch.channels_last).requires_grad_()
    y1 = b1(x1)
    y2 = materialise_any(layers.run(b2, x2))
    assert rel_err(y2, y1) < tol
    g = torch.randn_like(y1)
    (y1 * g).sum().backward()
    (y2 * g).sum().backward()
    assert rel_err(x2.grad, x1.grad) < tol, "input gradient"
    for (n, p1), p2 in zip(b1.named_parameters(), b2.parameters()):
        assert rel_err(p2.grad, p1.grad) < tol, n
    for (n, t1), t2 in zip(b1.named_buffers(), b2.buffers()):
        if t1.dtype.is_floating_point:
            assert rel_err(t2, t1) < tol, n
