"""Helpers of the pool tests (test_pool.py, test_maxpool.py, test_upsample.py): test inputs and their layouts, ulps,
a block through the c backend against the same block in plain torch (channels-last, the training layout), the
op-call counter and the in-place check of a channel slice."""

import copy

import torch

from yolov9c.backends.c import layers
from yolov9c.backends.c.lazy import materialise_any
from yolov9c.ops import extension

BLOCK_TOL = 1e-5
LAYOUTS = ("nchw", "cl", "cl_slice", "nchw_slice")
CUDA_CASES = [  # (shape, layout) of the CUDA tests: each kernel path
    ((2, 64, 40, 40), "cl"),          # vectorised: 8 halves / 4 floats per load
    ((2, 16, 9, 7), "cl"),
    ((1, 13, 7, 9), "cl"),            # C % 8 != 0: scalar channels-last
    ((2, 16, 11, 10), "cl_slice"),    # pixel stride 21, offset 3: scalar
    ((3, 8, 6, 5), "nchw"),
    ((2, 13, 5, 12), "nchw_slice"),
]


def in_layout(base, C, layout, device="cpu"):
    """Channels of base (B, C + 5, H, W) as a test input: 'nchw' / 'cl' (channels-last) hold channels 0..C-1;
    'cl_slice' / 'nchw_slice' are channels 3..3+C of the whole buffer (pixel stride C + 5 in the channels-last
    one)."""
    if layout == "nchw":
        return base[:, :C].contiguous().to(device)
    if layout == "cl":
        return base[:, :C].contiguous(memory_format=torch.channels_last).to(device)
    if layout == "cl_slice":
        return base.contiguous(memory_format=torch.channels_last).to(device)[:, 3:3 + C]
    if layout == "nchw_slice":
        return base.to(device)[:, 3:3 + C]
    raise AssertionError(layout)


def ulps(a, b, dtype):
    """max |a - b| in ulps of dtype at the larger magnitude of each pair."""
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    m = torch.maximum(a.abs(), b.abs()).to(dtype)
    up = torch.nextafter(m, torch.full_like(m, float("inf"))).double() - m.double()
    return ((a - b).abs() / up).max().item() if a.numel() else 0.0


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


class OpCalls:
    """Calls of an op's forward and backward implementations (module.forward_name / backward_name, each of one
    tensor) on real data, split by phase (set .phase to "forward" or "backward": model forward / loss backward);
    the c backend's shape probe on meta tensors is not counted."""

    def __init__(self, monkeypatch, module, forward_name, backward_name):
        self.fwd, self.bwd, self.phase = {"forward": 0, "backward": 0}, {"forward": 0, "backward": 0}, "forward"
        real_f, real_b = getattr(module, forward_name), getattr(module, backward_name)

        def f(x):
            self.fwd[self.phase] += x.device.type != "meta"
            return real_f(x)

        def b(g):
            self.bwd[self.phase] += 1
            return real_b(g)

        monkeypatch.setattr(module, forward_name, f)
        monkeypatch.setattr(module, backward_name, b)


def make_x(shape, layout, dtype, device="cpu", seed=0):
    """x of `shape` (B, C, H, W), normal values, in a layout of pool_common.in_layout."""
    g = torch.Generator().manual_seed(seed)
    B, C, H, W = shape
    base = (torch.randn(B, C + 5, H, W, generator=g) * 3).to(dtype)
    return in_layout(base, C, layout, device)


def assert_slice_read_in_place(monkeypatch, op):
    """op(x) on a channel slice of a channels-last buffer hands C the slice itself (its data pointer and
    strides: a view of the buffer, no copy)."""
    x = make_x((2, 16, 6, 6), "cl_slice", torch.float32)
    seen = []
    real = extension.arg

    def spy(t, op_name="yolov9c._C", name="a tensor argument"):
        if name == "x":
            seen.append((t.data_ptr(), t.stride()))
        return real(t, op_name, name)

    monkeypatch.setattr(extension, "arg", spy)
    op(x)
    assert seen == [(x.data_ptr(), x.stride())] and x.stride(3) == 21
