"""Tests of the C/Python boundary's shape (DESIGN.md "The C/Python boundary", issue 12 item 4): every binding of
yolov9c._C has a text signature with positional-only parameters and at most 12 of them; errors come from the one
place that checks (C), named by the C op and the argument; the CUDA device guard lives in C only. A torch tensor
goes to a binding as it is (csrc/tensor.c reads it): the same bits as its NumPy form, strided views read in
place, and a tensor on another device, of another dtype or not a tensor refused with the op and argument named.

Run: python -m pytest -q tests/ops/test_bindings.py
"""

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

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


# ------------------------------------------------------------------------------- torch tensors, read in C


def bn_operand(z, seed=0):
    """A BN operand for z (B, C, H, W): mean, invstd float32 (C,), weight an nn.Parameter, bias requiring grad."""
    g = torch.Generator().manual_seed(seed)
    c = z.shape[1]
    mean, invstd = torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5
    weight = torch.nn.Parameter(torch.randn(c, generator=g))
    bias = torch.randn(c, generator=g).requires_grad_()
    return z, mean, invstd, weight, bias


def numpy_form(bn):
    return tuple(t.detach().numpy() for t in bn)


def bits(t):
    """t's bits as integers (torch.equal on floats calls NaN unequal and -0.0 equal to 0.0)."""
    return t.view({torch.float16: torch.int16, torch.float32: torch.int32}[t.dtype])


def test_tensor_gives_the_bits_of_its_numpy_form():
    """bn_silu_forward, bn_silu_backward and bn_stats_forward on torch tensors (a Parameter and tensors that
    require grad among them) write what they write on the NumPy arrays sharing the same memory."""
    z = torch.randn(2, 5, 6, 7, generator=torch.Generator().manual_seed(1)).half()
    bn = bn_operand(z)
    res = torch.randn(z.shape).half()
    got, want = torch.empty_like(z), torch.empty_like(z)
    C.bn_silu_forward(bn, None, res, "silu", got, 0)
    C.bn_silu_forward(numpy_form(bn), None, res.numpy(), "silu", want.numpy(), 0)
    assert torch.equal(bits(got), bits(want))

    g = torch.randn(z.shape).half()
    got = (torch.empty_like(z), torch.empty(5), torch.empty(5))
    want = (torch.empty_like(z), torch.empty(5), torch.empty(5))
    C.bn_silu_backward(bn, None, g, "silu", True, got, None, False, None, 0)
    C.bn_silu_backward(numpy_form(bn), None, g.numpy(), "silu", True, tuple(t.numpy() for t in want), None,
                       False, None, 0)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(got, want))

    zf = z.float()
    got = [torch.zeros(5), torch.ones(5), torch.empty(5), torch.empty(5)]
    want = [t.clone() for t in got]
    C.bn_stats_forward(zf, got[0], got[1], 0.1, 1e-3, got[2], got[3], None, 0)
    C.bn_stats_forward(zf.numpy(), *(t.numpy() for t in want[:2]), 0.1, 1e-3, *(t.numpy() for t in want[2:]),
                       None, 0)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(got, want))


@pytest.mark.parametrize("layout", ["nchw_slice", "cl_slice"])
def test_strided_views_are_read_and_written_in_place(layout):
    """A channel slice of a bigger buffer (NCHW: a strided block; channels-last: channel stride 1, pixel stride
    the buffer's channels) is read through its own strides, and an output slice written only where it lies."""
    base = torch.randn(2, 12, 5, 6, generator=torch.Generator().manual_seed(2))
    if layout == "cl_slice":
        base = base.contiguous(memory_format=torch.channels_last)
    x = base[:, 3:10]
    assert not x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last)
    out_buf = torch.full((2, 9, 4, 5), 7.0)
    out = out_buf[:, 1:8]
    C.avg_pool2x2_forward(x, out, 0)
    assert torch.equal(out, F.avg_pool2d(x.contiguous(), 2, 1, 0, False, True))
    assert (out_buf[:, 0] == 7.0).all() and (out_buf[:, 8] == 7.0).all()
    want = np.empty((2, 7, 4, 5), np.float32)
    C.avg_pool2x2_forward(x.numpy(), want, 0)   # the NumPy view of the same slice
    assert np.array_equal(out.numpy(), want)

    bn = bn_operand(x, seed=3)
    y = torch.empty(2, 7, 5, 6)
    C.bn_silu_forward(bn, None, None, "identity", y, 0)
    want = (x - bn[1].view(1, -1, 1, 1)) * bn[2].view(1, -1, 1, 1) * bn[3].detach().view(1, -1, 1, 1) \
        + bn[4].detach().view(1, -1, 1, 1)
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)


def test_tensor_on_another_device_or_not_a_tensor_is_refused():
    x, out = torch.randn(1, 2, 3, 3), torch.empty(1, 2, 2, 2)
    with pytest.raises(ValueError, match=r"^avg_pool2x2_forward: x is on meta; yolov9c._C takes CPU or CUDA "
                                         r"tensors$"):
        C.avg_pool2x2_forward(x.to("meta"), out, 0)
    with pytest.raises(ValueError, match=r"^avg_pool2x2_forward: out is on meta; "):
        C.avg_pool2x2_forward(x, out.to("meta"), 0)
    with pytest.raises(ValueError, match=r"^bn_silu_forward: weight is on meta; "):
        bn = bn_operand(torch.randn(2, 3, 4, 4))
        C.bn_silu_forward(bn[:3] + (bn[3].to("meta"),) + bn[4:], None, None, "silu", torch.empty(2, 3, 4, 4), 0)
    for bad in ([[1.0]], 3.0, "x"):
        with pytest.raises(TypeError, match=r"^avg_pool2x2_forward: x must be a torch.Tensor .*, got "
                                            + type(bad).__name__):
            C.avg_pool2x2_forward(bad, out, 0)
    with pytest.raises(TypeError, match=r"^avg_pool2x2_forward: x has torch dtype torch.complex64, which no op"):
        C.avg_pool2x2_forward(torch.zeros(1, 2, 3, 3, dtype=torch.complex64), out, 0)


def test_misaligned_cpu_tensor_is_refused():
    x = torch.frombuffer(bytearray(4 * 18 + 2), dtype=torch.float32, count=18, offset=2).view(1, 2, 3, 3)
    with pytest.raises(ValueError, match="avg_pool2x2_forward: x data pointer is not aligned to 4 bytes"):
        C.avg_pool2x2_forward(x, torch.empty(1, 2, 2, 2), 0)


def test_cpu_bfloat16_is_refused_not_misread():
    """A bfloat16 CPU tensor (the Python ops upcast or route it to the reference first) reaching a binding is a
    TypeError naming the argument: no CPU implementation reads bfloat16 as another type."""
    x = torch.randn(2, 3, 4, 4).bfloat16()
    v = torch.ones(3)
    with pytest.raises(TypeError, match="avg_pool2x2_forward: x must be float32, float16, got bfloat16"):
        C.avg_pool2x2_forward(x, torch.empty(2, 3, 3, 3, dtype=torch.bfloat16), 0)
    with pytest.raises(TypeError, match="max_pool2d_forward: x must be float32, float16, got bfloat16"):
        C.max_pool2d_forward(x, torch.empty(2, 3, 2, 2, dtype=torch.bfloat16), 3, 2, 1, 0)
    with pytest.raises(TypeError, match="bn_silu_forward: z must be float32, float16, got bfloat16"):
        C.bn_silu_forward((x, v, v, v, v), None, None, "silu", torch.empty_like(x), 0)
    with pytest.raises(TypeError, match="bn_stats_forward: z must be float32, float16, got bfloat16"):
        C.bn_stats_forward(x, None, None, 0.1, 1e-3, v.clone(), v.clone(), None, 0)
    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0]]).bfloat16()
    with pytest.raises(TypeError, match="nms_forward: boxes must be float32, float16, got bfloat16"):
        C.nms_forward(boxes, boxes[:, 0], None, 0.5, torch.empty(C.nms_workspace_size(1, False), dtype=torch.uint8),
                      torch.empty(1, dtype=torch.int64), torch.empty(1, dtype=torch.int64), 0)
