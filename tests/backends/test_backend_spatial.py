"""The c backend's nearest upsampling (nn.Upsample, CBFuse's resize) takes its input gradient from the output
gradient alone (yolov9c/backends/c/layers.py `nearest_backward`: aten.upsample_nearest2d_backward, what
autograd runs): the same gradients bit for bit as re-running the upsampling under autograd, and one
upsampling fewer per Spatial node in backward. The exact 2× ones run yolov9c.ops.pool.upsample_nearest2x
(tests/ops/test_pool.py); here they are routed back to torch's F.interpolate (_torch_up2) to test this path."""

import collections
import functools

import pytest
import torch
import torch.nn.functional as F

from seeded_models import seeded_model
from yolov9c.api import make_loss
from yolov9c.backends import apply
from yolov9c.backends.c import layers
from yolov9c.backends.c.lazy import Spatial

TARGETS = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 2, 0.3, 0.6, 0.2, 0.25]])


def _torch_up2(child):
    """A 2× nearest upsampling on torch's F.interpolate (read at call time: counted), its direct gradient from
    layers.nearest_backward (read at call time: replaceable)."""
    return Spatial(functools.partial(F.interpolate, scale_factor=2.0, mode="nearest"), child,
                   grad=layers.nearest_backward(child, (2.0, 2.0)))


def _step(name, monkeypatch, direct, channels_last):
    """One c-backend training step: (parameter gradients, interpolate calls in forward / in backward)."""
    fresh = seeded_model(name)  # built before counting: building runs a stride-probe forward (its upsamplings)
    calls = collections.Counter()
    phase = ["forward"]
    real = F.interpolate

    def counted(*args, **kwargs):
        calls[phase[0]] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "interpolate", counted)
    monkeypatch.setattr(layers, "up2", _torch_up2)
    if not direct:
        monkeypatch.setattr(layers, "nearest_backward", lambda child, scales=(None, None): None)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = apply(fresh.to(memory_format=fmt).train(), "c")
    x = torch.rand(2, 3, 64, 64).contiguous(memory_format=fmt)
    loss, _ = make_loss(model)(model(x), TARGETS)
    phase[0] = "backward"
    loss.backward()
    monkeypatch.undo()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, calls


@pytest.mark.parametrize("name, channels_last", [("yolov9-t", False), ("yolov9-t", True), ("yolov9-c", True)])
def test_direct_upsample_gradient_equals_autograd_path(name, channels_last, monkeypatch):
    """yolov9-t: the neck's nn.Upsample; yolov9-c: also CBFuse's resizes of the auxiliary branch."""
    direct, c_direct = _step(name, monkeypatch, True, channels_last)
    base, c_base = _step(name, monkeypatch, False, channels_last)
    assert direct.keys() == base.keys() and len(direct) > 0
    for n in direct:
        assert torch.equal(direct[n], base[n]), n
    assert c_direct["forward"] == c_base["forward"] > 0
    # backward: only the recomputed segments upsample again (none in yolov9-t's main branch)
    assert c_direct["backward"] < c_base["backward"], (c_direct, c_base)
    assert c_direct["backward"] <= c_direct["forward"]


def test_nearest_backward_scales():
    """scale_factor modules pass their scales to the backward as the forward passes them; size-based resizes
    pass none; other modes keep the autograd path (the gradient of the node layers.spatial builds; an exact 2×
    takes the pool op instead, tests/ops/test_pool.py)."""
    from yolov9c.backends.c.lazy import Plain

    child = Plain(torch.zeros(1, 2, 3, 5))
    g = layers.spatial(torch.nn.Upsample(scale_factor=3.0, mode="nearest"), child).grad
    assert g.args == ((3, 5), (3.0, 3.0))
    assert layers.spatial(torch.nn.Upsample(size=(6, 10), mode="nearest"), child).grad.args[1] == (None, None)
    assert layers.spatial(torch.nn.Upsample(scale_factor=2.0, mode="bilinear"), child).grad is None
    x = torch.randn(1, 2, 3, 5, requires_grad=True)
    up = torch.nn.Upsample(scale_factor=3.0, mode="nearest")
    gy = torch.randn(1, 2, 9, 15)
    (want,) = torch.autograd.grad(up(x), x, gy)
    assert torch.equal(g(gy), want)
