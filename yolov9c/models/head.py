"""Detection heads (torch reference): DFL, DDetect (GELAN) and DualDDetect (YOLOv9 with PGI aux head).

Train mode returns raw per-level maps (B, 4·reg_max + nc, H, W); eval mode also decodes them into
(B, 4 + nc, A) = boxes xywh in input pixels then sigmoid class scores, A = Σ H·W over the levels.
Published attribute names are kept (DDetect: nc, nl, reg_max, no, inplace, stride, cv2, cv3, dfl;
DualDDetect adds cv4, cv5, dfl2) so that published pickles map onto these classes; the anchor cache
(shape, anchors, strides) has class-level defaults as in the published code.
Published counterpart: models/yolo.py. Tests: tests/models/test_models.py, tests/models/test_goldens.py.
"""

import math

import torch
import torch.nn as nn

from yolov9c.geometry import dist2bbox, make_anchors
from yolov9c.models.common import Conv


def make_divisible(x, divisor):
    """Smallest multiple of `divisor` that is ≥ x."""
    return math.ceil(x / divisor) * divisor


class DFL(nn.Module):
    """Distribution focal loss integral: (B, 4·c1, A) → softmax over c1 bins → expected bin index
    (B, 4, A), by a fixed, non-trainable 1×1 conv whose weights are 0 … c1−1."""

    def __init__(self, c1=16):
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1)
        self.c1 = c1

    def forward(self, x):
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


def _branches(nc, reg_max, ch):
    """Box (cv2-like) and class (cv3-like) branch lists for input channels `ch`.

    Widths come from the first input: box c2 = roundup4(max(ch0/4, 4·reg_max, 16)) with grouped
    (g=4) second and final convs; class c3 = max(ch0, min(2·nc, 128)).
    """
    c2 = make_divisible(max(ch[0] // 4, reg_max * 4, 16), 4)
    c3 = max(ch[0], min(nc * 2, 128))
    box = nn.ModuleList(
        nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3, g=4), nn.Conv2d(c2, 4 * reg_max, 1, groups=4)) for x in ch)
    cls = nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for x in ch)
    return box, cls


def _bias_init(box, cls, strides, nc):
    """Final box conv bias = 1; final class conv bias = ln(5 / nc / (640/s)²) for stride s."""
    for a, b, s in zip(box, cls, strides):
        a[-1].bias.data[:] = 1.0
        b[-1].bias.data[:nc] = math.log(5 / nc / (640 / float(s)) ** 2)


class DDetect(nn.Module):
    """Anchor-free decoupled head over nl levels (inputs ch, one per level)."""

    dynamic = False  # recompute anchors on every call
    export = False  # eval returns y only
    shape = None  # input shape the cached anchors belong to
    anchors = torch.empty(0)  # (2, A) cell centres in grid units, cached
    strides = torch.empty(0)  # (1, A) stride of each anchor, cached

    def __init__(self, nc=80, ch=(), inplace=True):
        super().__init__()
        self.nc = nc
        self.nl = len(ch)
        self.reg_max = 16
        self.no = nc + self.reg_max * 4
        self.inplace = inplace
        self.stride = torch.zeros(self.nl)  # set by DetectionModel from a probe forward
        self.cv2, self.cv3 = _branches(nc, self.reg_max, ch)
        self.dfl = DFL(self.reg_max)

    def _anchors_for(self, x):
        """Refresh the anchor cache when the input shape, dtype or device changed."""
        shape = x[0].shape
        stale = self.anchors.dtype != x[0].dtype or self.anchors.device != x[0].device
        if self.dynamic or self.shape != shape or stale:
            self.anchors, self.strides = (t.transpose(0, 1) for t in make_anchors(x, self.stride, 0.5))
            self.shape = shape

    def _decode(self, x, dfl):
        """Raw maps → (B, 4 + nc, A): DFL distances × stride around the cached anchors, xywh; sigmoid scores."""
        b = x[0].shape[0]
        box, cls = torch.cat([xi.view(b, self.no, -1) for xi in x], 2).split((self.reg_max * 4, self.nc), 1)
        dbox = dist2bbox(dfl(box), self.anchors.unsqueeze(0), xywh=True, dim=1) * self.strides
        return torch.cat((dbox, cls.sigmoid()), 1)

    def forward(self, x):
        """x: list of nl maps (B, ch_i, H_i, W_i). Train: list of (B, no, H_i, W_i). Eval: (y, maps)."""
        x = [torch.cat((self.cv2[i](x[i]), self.cv3[i](x[i])), 1) for i in range(self.nl)]
        if self.training:
            return x
        self._anchors_for(x)
        y = self._decode(x, self.dfl)
        return y if self.export else (y, x)

    def bias_init(self):
        _bias_init(self.cv2, self.cv3, self.stride, self.nc)


class DualDDetect(DDetect):
    """Two DDetects in one: cv2/cv3/dfl on the first half of the inputs (aux), cv4/cv5/dfl2 on the second
    half (main, the one kept for inference). Train: [d_aux, d_main]; eval: ([y_aux, y_main], [d_aux, d_main])."""

    def __init__(self, nc=80, ch=(), inplace=True):
        nn.Module.__init__(self)
        if len(ch) % 2:
            raise ValueError(f"DualDDetect needs an even number of inputs (aux + main), got {len(ch)}")
        self.nc = nc
        self.nl = len(ch) // 2
        self.reg_max = 16
        self.no = nc + self.reg_max * 4
        self.inplace = inplace
        self.stride = torch.zeros(self.nl)
        self.cv2, self.cv3 = _branches(nc, self.reg_max, ch[:self.nl])
        self.cv4, self.cv5 = _branches(nc, self.reg_max, ch[self.nl:])
        self.dfl = DFL(self.reg_max)
        self.dfl2 = DFL(self.reg_max)

    def forward(self, x):
        """x: 2·nl maps, aux levels first. Each half is decoded on its own anchors (same grid sizes)."""
        nl = self.nl
        d1 = [torch.cat((self.cv2[i](x[i]), self.cv3[i](x[i])), 1) for i in range(nl)]
        d2 = [torch.cat((self.cv4[i](x[nl + i]), self.cv5[i](x[nl + i])), 1) for i in range(nl)]
        if self.training:
            return [d1, d2]
        self._anchors_for(d1)
        y = [self._decode(d1, self.dfl), self._decode(d2, self.dfl2)]
        return y if self.export else (y, [d1, d2])

    def bias_init(self):
        _bias_init(self.cv2, self.cv3, self.stride, self.nc)
        _bias_init(self.cv4, self.cv5, self.stride, self.nc)
