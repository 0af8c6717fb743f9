"""The YOLOv9 / GELAN building blocks (torch reference), with the published attribute names.

Every class here has the name and the sub-module names of its published counterpart, so that the
state_dict keys equal the published ones (tests/models/test_goldens.py) and a restricted unpickler can
map a published `models.common.X` object onto `yolov9c.models.common.X`. Such an object is restored
from its `__dict__` without running `__init__`, so `forward` only reads attributes that the published
objects also carry; anything new gets a class-level default.

Shapes: feature maps are (B, C, H, W); "c1" is the input and "c2" the output channel count.
Published counterpart: models/common.py. Tests: tests/models/test_models.py, tests/models/test_goldens.py,
tests/models/test_fuse_reparam.py (`pytest tests/models/test_models.py`).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

# Every BatchNorm of the published models ends up with these (initialize_weights sets them after the
# stride probe, see model.py); standalone blocks built here start with them too.
BN_EPS = 1e-3
BN_MOMENTUM = 0.03


def autopad(k, p=None, d=1):
    """'Same' padding for kernel k (int or list) at dilation d when p is None."""
    if d > 1:
        k = d * (k - 1) + 1 if isinstance(k, int) else [d * (x - 1) + 1 for x in k]
    if p is None:
        p = k // 2 if isinstance(k, int) else [x // 2 for x in k]
    return p


def fuse_conv_and_bn(conv, bn):
    """Fold BatchNorm `bn` (eval statistics) into `conv`; returns a new biased nn.Conv2d.

    w' = w·γ/σ, b' = β + (b − μ)·γ/σ with σ = sqrt(running_var + eps). Computed in float64 and cast
    back, so that the fold itself adds no float32 rounding beyond the final cast.
    """
    fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                      conv.padding, conv.dilation, conv.groups, bias=True).requires_grad_(False)
    fused = fused.to(device=conv.weight.device, dtype=conv.weight.dtype)
    w = conv.weight.detach().double()
    b = conv.bias.detach().double() if conv.bias is not None else torch.zeros_like(bn.running_mean, dtype=torch.float64)
    scale = bn.weight.detach().double() / torch.sqrt(bn.running_var.double() + bn.eps)
    fused.weight.copy_(w * scale.view(-1, 1, 1, 1))
    fused.bias.copy_(bn.bias.detach().double() + (b - bn.running_mean.double()) * scale)
    return fused


class Conv(nn.Module):
    """Conv2d (no bias, autopad) → BatchNorm2d → activation (SiLU unless `act` says otherwise).

    (B, c1, H, W) → (B, c2, H/s, W/s). After fuse() the BN is folded into a biased conv and removed.
    """

    default_act = nn.SiLU()  # shared, parameter-free; a yaml `activation:` replaces it per model

    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, d=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p, d), groups=g, dilation=d, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act = self.default_act if act is True else act if isinstance(act, nn.Module) else nn.Identity()

    def forward(self, x):
        bn = getattr(self, "bn", None)  # absent once fuse() folded it into conv
        x = self.conv(x)
        return self.act(x if bn is None else bn(x))

    def fuse(self):
        """Fold the BN into the conv (in place)."""
        if getattr(self, "bn", None) is not None:
            self.conv = fuse_conv_and_bn(self.conv, self.bn)
            del self.bn


class AConv(nn.Module):
    """Down-sampling: avg-pool 2×2 stride 1 (pad 0, count_include_pad) → Conv 3×3 stride 2 pad 1.

    (B, c1, H, W) → (B, c2, H/2, W/2) for even H, W.
    """

    def __init__(self, c1, c2):
        super().__init__()
        self.cv1 = Conv(c1, c2, 3, 2, 1)

    def forward(self, x):
        return self.cv1(F.avg_pool2d(x, 2, 1, 0, False, True))


class ADown(nn.Module):
    """Down-sampling in two channel halves: avg-pool 2×2 s1, then half 1 → Conv 3×3 s2, half 2 →
    max-pool 3×3 s2 p1 → Conv 1×1; concat. (B, c1, H, W) → (B, 2·(c2//2), H/2, W/2); c1 must be even."""

    def __init__(self, c1, c2):
        super().__init__()
        self.c = c2 // 2
        self.cv1 = Conv(c1 // 2, self.c, 3, 2, 1)
        self.cv2 = Conv(c1 // 2, self.c, 1, 1, 0)

    def forward(self, x):
        x1, x2 = F.avg_pool2d(x, 2, 1, 0, False, True).chunk(2, 1)
        return torch.cat((self.cv1(x1), self.cv2(F.max_pool2d(x2, 3, 2, 1))), 1)


class RepConvN(nn.Module):
    """Re-parameterisable conv: act(Conv3×3+BN(x) + Conv1×1+BN(x)), no identity branch (`bn` is None).

    fuse_convs() merges both branches into one biased 3×3 conv stored as `conv`.
    """

    default_act = nn.SiLU()  # its own default; a yaml `activation:` replaces it per model, as Conv's

    def __init__(self, c1, c2, k=3, s=1, p=1, g=1, d=1, act=True, bn=False, deploy=False):
        super().__init__()
        if k != 3 or p != 1:
            raise ValueError(f"RepConvN supports k=3, p=1 only (got k={k}, p={p})")
        self.g, self.c1, self.c2 = g, c1, c2
        self.act = self.default_act if act is True else act if isinstance(act, nn.Module) else nn.Identity()
        self.bn = None  # the published identity-branch BN; never used by RepNBottleneck
        self.conv1 = Conv(c1, c2, k, s, p=p, g=g, act=False)
        self.conv2 = Conv(c1, c2, 1, s, p=(p - k // 2), g=g, act=False)

    def forward(self, x):
        conv = self._modules.get("conv")  # present once fuse_convs() ran
        if conv is not None:
            return self.act(conv(x))
        return self.act(self.conv1(x) + self.conv2(x))

    def fuse_convs(self):
        """Replace conv1/conv2 by one biased 3×3 conv: both BNs folded, the 1×1 kernel zero-padded to
        3×3 (its centre tap), kernels and biases summed."""
        if self._modules.get("conv") is not None:
            return
        c3 = fuse_conv_and_bn(self.conv1.conv, self.conv1.bn)
        c1 = fuse_conv_and_bn(self.conv2.conv, self.conv2.bn)
        c3.weight.add_(F.pad(c1.weight, [1, 1, 1, 1]))
        c3.bias.add_(c1.bias)
        self.conv = c3
        del self.conv1, self.conv2
        self.bn = None


class RepNBottleneck(nn.Module):
    """RepConvN(c1→c_) → Conv 3×3 (c_→c2), c_ = int(c2·e); residual add when shortcut and c1 == c2."""

    def __init__(self, c1, c2, shortcut=True, g=1, k=(3, 3), e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = RepConvN(c1, c_, k[0], 1)
        self.cv2 = Conv(c_, c2, k[1], 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class RepNCSP(nn.Module):
    """CSP block: [Conv1×1(c1→c_) → n × RepNBottleneck(c_, c_, e=1)] ‖ Conv1×1(c1→c_) → Conv1×1(2c_→c2),
    c_ = int(c2·e)."""

    def __init__(self, c1, c2, n=1, shortcut=True, g=1, e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(RepNBottleneck(c_, c_, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class RepNCSPELAN4(nn.Module):
    """GELAN block: Conv1×1(c1→c3) split in halves y1, y2 (c3/2 each); y3 = [RepNCSP(c3/2→c4, n=c5) →
    Conv3×3](y2); y4 = [RepNCSP(c4→c4, n=c5) → Conv3×3](y3); Conv1×1(concat(y1..y4): c3+2·c4 → c2)."""

    def __init__(self, c1, c2, c3, c4, c5=1):
        super().__init__()
        self.c = c3 // 2
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2 = nn.Sequential(RepNCSP(c3 // 2, c4, c5), Conv(c4, c4, 3, 1))
        self.cv3 = nn.Sequential(RepNCSP(c4, c4, c5), Conv(c4, c4, 3, 1))
        self.cv4 = Conv(c3 + 2 * c4, c2, 1, 1)

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.append(self.cv2(y[-1]))
        y.append(self.cv3(y[-1]))
        return self.cv4(torch.cat(y, 1))


class ELAN1(nn.Module):
    """Like RepNCSPELAN4 with plain Conv3×3 stages: c3/2→c4 and c4→c4; concat (c3+2·c4) → Conv1×1 → c2."""

    def __init__(self, c1, c2, c3, c4):
        super().__init__()
        self.c = c3 // 2
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2 = Conv(c3 // 2, c4, 3, 1)
        self.cv3 = Conv(c4, c4, 3, 1)
        self.cv4 = Conv(c3 + 2 * c4, c2, 1, 1)

    forward = RepNCSPELAN4.forward  # same dataflow; only the two stages differ


class SP(nn.Module):
    """MaxPool2d(k, stride s, padding k//2): 'same' size at s = 1."""

    def __init__(self, k=3, s=1):
        super().__init__()
        self.m = nn.MaxPool2d(kernel_size=k, stride=s, padding=k // 2)

    def forward(self, x):
        return self.m(x)


class SPPELAN(nn.Module):
    """Conv1×1(c1→c3), three successive 5×5 max-pools, concat of the 4 maps (4·c3) → Conv1×1 → c2."""

    def __init__(self, c1, c2, c3, k=5):
        super().__init__()
        self.c = c3
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2 = SP(k)
        self.cv3 = SP(k)
        self.cv4 = SP(k)
        self.cv5 = Conv(4 * c3, c2, 1, 1)

    def forward(self, x):
        y = [self.cv1(x)]
        for m in (self.cv2, self.cv3, self.cv4):
            y.append(m(y[-1]))
        return self.cv5(torch.cat(y, 1))


class CBLinear(nn.Module):
    """One biased Conv2d c1 → sum(c2s) (no BN, no activation), returned as a tuple of channel chunks of
    sizes c2s: (B, c1, H, W) → ((B, c2s[0], H, W), (B, c2s[1], H, W), ...)."""

    def __init__(self, c1, c2s, k=1, s=1, p=None, g=1):
        super().__init__()
        self.c2s = list(c2s)
        self.conv = nn.Conv2d(c1, sum(self.c2s), k, s, autopad(k, p), groups=g, bias=True)

    def forward(self, x):
        return self.conv(x).split(self.c2s, dim=1)


class CBFuse(nn.Module):
    """Sum of the current map (last input) and, for each CBLinear output i, its chunk idx[i]
    nearest-resized to the current map's H×W. Output shape = last input's shape."""

    def __init__(self, idx):
        super().__init__()
        self.idx = list(idx)

    def forward(self, xs):
        size = xs[-1].shape[2:]
        picked = [F.interpolate(x[self.idx[i]], size=size, mode="nearest") for i, x in enumerate(xs[:-1])]
        return torch.sum(torch.stack(picked + [xs[-1]]), dim=0)


class Silence(nn.Module):
    """Identity; lets later rows re-read the input image as layer 0's output."""

    def forward(self, x):
        return x


class Concat(nn.Module):
    """Concatenation of a list of maps along dimension `d` (channels)."""

    def __init__(self, dimension=1):
        super().__init__()
        self.d = dimension

    def forward(self, x):
        return torch.cat(x, self.d)
