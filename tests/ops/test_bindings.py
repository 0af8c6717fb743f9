"""Tests of the C/Python boundary's shape (DESIGN.md "The C/Python boundary", issue 12 item 4): every binding of
yolov9c._C has a text signature with positional-only parameters and at most 12 of them; errors come from the one
place that checks (C), named by the C op and the argument; the CUDA device guard lives in C only.

Run: python -m pytest -q tests/ops/test_bindings.py
"""

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

from yolov9c.ops import bn_silu as bn_ops
from yolov9c.ops import extension

C = extension.load()
MAX_PARAMS = 12
OPS_DIR = Path(__file__).resolve().parents[2] / "yolov9c" / "ops"


def bindings():
    return [name for name in dir(C) if callable(getattr(C, name)) and not isinstance(getattr(C, name), type)]


def test_there_are_bindings():
    names = bindings()
    assert {"bn_silu_forward", "bn_silu_backward", "bn_stats_forward", "det_loss_forward", "tal_assign_forward",
            "nms_forward", "build_info"} <= set(names)


@pytest.mark.parametrize("name", bindings())
def test_every_binding_has_a_text_signature(name):
    fn = getattr(C, name)
    assert fn.__text_signature__, f"{name} has no __text_signature__ (its doc must start 'name($module, ...)')"
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    assert len(params) <= MAX_PARAMS, f"{name} takes {len(params)} parameters, at most {MAX_PARAMS} allowed"
    assert all(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in params), f"{name}: {sig}"
    # the doc after the signature says what the op does
    assert len(fn.__doc__.strip()) > 20


@pytest.mark.parametrize("name", [n for n in bindings() if n != "build_info"])
def test_arity_is_checked(name):
    fn = getattr(C, name)
    n = len(inspect.signature(fn).parameters)
    with pytest.raises(TypeError, match=f"{name}\\(\\) takes exactly {n} positional argument"):
        fn(*([None] * (n + 1)))


def test_bn_operand_is_one_tuple_named_in_errors():
    z = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    v = np.ones(3, np.float32)
    out = np.empty_like(z)
    with pytest.raises(TypeError, match="bn_silu_forward: bn must be a tuple .*z, mean, invstd, weight, bias"):
        C.bn_silu_forward(z, None, None, "silu", out, 0)
    with pytest.raises(TypeError, match="bn_silu_forward: weight1 must be float32, got float64"):
        C.bn_silu_forward((z, v, v, v.astype(np.float64), v), (z, v, v, v, v), None, "silu", out, 0)
    C.bn_silu_forward((z, v, v, v, v), (z, v, v, v, v), None, "silu", out, 0)
    assert np.isfinite(out).all()


def test_wrapper_errors_come_from_c():
    """The public op does not check again in Python: the message is C's (op name of the binding)."""
    z = torch.randn(2, 3, 4, 4)
    v = torch.ones(3)
    with pytest.raises(ValueError, match=r"^bn_silu_forward: bias must have size 3"):
        bn_ops.forward(bn_ops.BN(z, v, v, v, torch.ones(4)))
    with pytest.raises(ValueError, match=r"^bn_silu_forward: out must have the shape of z \(2, 3, 4, 4\)"):
        bn_ops.forward(bn_ops.BN(z, v, v, v, v), out=torch.empty(2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"^bn_stats_forward: momentum must be in \[0, 1\], got 1.5$"):
        bn_ops.stats(z, momentum=1.5)   # the double printed (PyErr_Format has no %g: SystemError on 3.12)
    with pytest.raises(ValueError, match=r"^bn_stats_forward: eps must be > 0, got -0.25$"):
        bn_ops.stats(z, eps=-0.25)


def test_cpu_stream_must_be_zero_in_every_op():
    z = np.ones((2, 3, 4, 4), np.float32)
    v = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="bn_stats_forward: stream must be 0 for CPU tensors"):
        C.bn_stats_forward(z, None, None, 0.1, 1e-3, v.copy(), v.copy(), None, 7)
    boxes = np.zeros((3, 4), np.float32)
    ws = np.zeros(C.nms_workspace_size(3, False), np.uint8)
    with pytest.raises(ValueError, match="nms_forward: stream must be 0 for CPU tensors"):
        C.nms_forward(boxes, np.zeros(3, np.float32), None, 0.5, ws, np.zeros(3, np.int64), np.zeros(1, np.int64), 7)


def test_no_device_guard_in_python():
    """C makes the tensor's device current around a launch (csrc/launch.c); Python must not do it again."""
    for path in OPS_DIR.glob("*.py"):
        text = path.read_text()
        assert "torch.cuda.device(" not in text and "device_guard" not in text, path.name


@pytest.mark.cuda
def test_cuda_op_on_another_device_restores_the_current_one():
    last = torch.device("cuda", torch.cuda.device_count() - 1)
    torch.cuda.set_device(0)
    z = torch.randn(2, 8, 5, 5, device=last)
    w, b = torch.ones(8, device=last), torch.zeros(8, device=last)
    mean, invstd = bn_ops.stats(z)
    y = bn_ops.forward(bn_ops.BN(z, mean, invstd, w, b))
    assert torch.cuda.current_device() == 0
    want = bn_ops.reference(bn_ops.BN(z, mean, invstd, w, b))
    assert (y - want).abs().max().item() <= 1e-5 * want.abs().max().item()
