"""Host synchronisations of one c-backend training step (model forward, c loss, backward).

On the CPU every scalar read is free, so the step is instrumented instead: every Tensor method that makes
the host wait for a device (item, bool/int/float/index, tolist, cpu, nonzero; not .numpy(), which
only the CPU kernels' NumPy bridge calls) is counted with the
function that called it. The c step needs none: the loss packs the targets on the host
(pack_targets_host: the data loader's targets are CPU tensors, M comes from them, one non-blocking copy
to the device), target_scores_sum stays a device tensor, and the backend's layers and autograd Functions
never read a device value. Reads inside pack_targets_host read host memory and are therefore allowed.
On a GPU the same step runs under torch.cuda.set_sync_debug_mode("error").
Test: python -m pytest -q tests/ops/test_c_syncs.py
"""

import traceback

import pytest
import torch

from seeded_models import seeded_model
from yolov9c.api import make_loss
from yolov9c.backends import apply

_READS = ("item", "__bool__", "__int__", "__float__", "__index__", "tolist", "cpu", "nonzero")
_TARGETS = [[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 2, 0.3, 0.6, 0.2, 0.25], [0, 0, 0.7, 0.3, 0.2, 0.3]]


def _model(device="cpu"):
    m = apply(seeded_model("yolov9-t").train().to(device), "c")
    return m, make_loss(m, backend="c")


def _step(model, loss_fn, x, targets):
    loss, _ = loss_fn(model(x), targets)
    loss.backward()
    return loss


def test_c_step_reads_no_device_value(monkeypatch):
    model, loss_fn = _model()
    x, targets = torch.rand(2, 3, 64, 64), torch.tensor(_TARGETS)
    reads = []

    def counted(name, f):
        def g(self, *args, **kwargs):
            stack = traceback.extract_stack()
            if not any(fr.name == "pack_targets_host" for fr in stack):
                reads.append(f"{name} from {stack[-2].filename}:{stack[-2].lineno}")
            return f(self, *args, **kwargs)
        return g

    host_reads_before = len(reads)
    for name in _READS:
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    loss = _step(model, loss_fn, x, targets)
    monkeypatch.undo()
    assert host_reads_before == 0
    assert reads == []
    assert torch.isfinite(loss).all()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_c_step_still_checks_targets():
    """The checks moved to the host still refuse what pack_targets refuses."""
    model, loss_fn = _model()
    out = model(torch.rand(2, 3, 64, 64))
    with pytest.raises(ValueError, match="image index"):
        loss_fn(out, torch.tensor([[2, 0, 0.5, 0.5, 0.2, 0.2]]))
    with pytest.raises(ValueError, match="outside the model's classes"):
        loss_fn(out, torch.tensor([[0, 3, 0.5, 0.5, 0.2, 0.2]]))


@pytest.mark.cuda
def test_cuda_c_step_does_not_synchronise():
    model, loss_fn = _model("cuda")
    x, targets = torch.rand(2, 3, 128, 128, device="cuda"), torch.tensor(_TARGETS)
    _step(model, loss_fn, x, targets)  # first step: lazy initialisation outside the check
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(x)
            loss, _ = loss_fn(out, targets)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(loss).all()
