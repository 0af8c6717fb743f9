"""DetectionModel: a YOLOv9 / GELAN detector built from a model yaml (torch reference).

    model = DetectionModel("yolov9-s", nc=80)        # or a yaml path, or a dict in the published schema
    maps = model(images)                            # train mode: [aux maps, main maps] / list of maps
    (y, maps) = model.eval()(images)                 # eval: y = [y_aux, y_main] (B, 4+nc, A) / y

The forward runs the layer graph row by row, keeping only the outputs that later rows read (`save`).
State-dict keys and shapes are the published ones. Construction follows the published order (so a
given torch seed gives the published initial weights): build the layers, run a 1×3×256×256 zero probe
in train mode to learn the head strides, initialise the head biases, then set every BatchNorm to
eps 1e-3 / momentum 0.03.
Tests: tests/models/test_models.py, tests/models/test_goldens.py, tests/models/test_fuse_reparam.py.
"""

import torch
import torch.nn as nn

from yolov9c.models.common import Conv, RepConvN, BN_EPS, BN_MOMENTUM
from yolov9c.models.head import DDetect, DualDDetect
from yolov9c.models.parse import row_text, parse_activation, parse_model, resolve_config

PROBE_SIZE = 256


class DetectionModel(nn.Module):
    """Layers in `model` (nn.Sequential; each layer has i, f, type, np), `save`, `yaml` (the config dict,
    nc updated when overridden), `yaml_file`, `yaml_nc` (the config's own nc, before an override), `nc`, `names`, `stride` (tensor, e.g. [8., 16., 32.]),
    `inplace`, `hyp` (None until a trainer sets it). `model[-1]` is the DDetect / DualDDetect head."""

    hyp = None

    def __init__(self, cfg="yolov9-c", *, nc=None, ch=None):
        super().__init__()
        d, label, self.yaml_file = resolve_config(cfg)
        self.yaml = d
        self.yaml_nc = d.get("nc")
        if nc is not None:
            if not isinstance(nc, int) or isinstance(nc, bool) or nc < 1:
                raise ValueError(f"nc must be a positive integer, got {nc!r}")
            d["nc"] = nc
        ch = d["ch"] = ch if ch is not None else d.get("ch", 3)
        self.model, self.save = parse_model(d, ch, label)
        self.names = [str(i) for i in range(d["nc"])]
        self.nc = d["nc"]
        self.inplace = d.get("inplace", True)

        act = d.get("activation")
        if act is not None:
            try:
                make_act = parse_activation(act)
            except ValueError as e:
                raise ValueError(f"{label}: {e}") from e
            # as published parse_model's Conv.default_act and RepConvN.default_act swap: every layer built
            # with act=True takes it, one shared instance per class (so the summary's layer count is unchanged)
            shared = {Conv: make_act(), RepConvN: make_act()}
            for m in self.model.modules():
                if type(m) in shared and m.act is type(m).default_act:
                    m.act = shared[type(m)]

        # Strides from a zero probe (train mode, before the BN settings below, as published: the probe
        # therefore updates the running statistics with PyTorch's default BN momentum 0.1).
        head = self.model[-1]
        head.inplace = self.inplace
        bns = [m for m in self.modules() if isinstance(m, nn.BatchNorm2d)]
        for bn in bns:
            bn.eps, bn.momentum = 1e-5, 0.1
        p = next(self.parameters())
        with torch.no_grad():
            out = self._probe(torch.zeros(1, ch, PROBE_SIZE, PROBE_SIZE, dtype=p.dtype, device=p.device), label)
        maps = out[0] if isinstance(head, DualDDetect) else out
        head.stride = torch.tensor([PROBE_SIZE / x.shape[-2] for x in maps])
        self.stride = head.stride
        head.bias_init()
        for bn in bns:
            bn.eps, bn.momentum = BN_EPS, BN_MOMENTUM

    def forward(self, x):
        """x: (B, ch, H, W) with H, W multiples of the largest stride. See DDetect / DualDDetect."""
        y = []
        for m in self.model:
            if m.f != -1:
                x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
            x = m(x)
            y.append(x if m.i in self.save else None)
        return x

    def _probe(self, x, label):
        """forward() that turns a failing layer into a ValueError naming its yaml row."""
        rows = self.yaml["backbone"] + self.yaml["head"]
        y = []
        for m in self.model:
            if m.f != -1:
                x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
            try:
                x = m(x)
            except (RuntimeError, ValueError, TypeError, IndexError) as e:
                raise ValueError(f"{label} row {m.i} ({row_text(rows[m.i])}): fails on a "
                                 f"{PROBE_SIZE}×{PROBE_SIZE} probe: {e}") from e
            y.append(x if m.i in self.save else None)
        return x

    def _apply(self, fn, *args, **kwargs):
        """Move/cast the head's plain-tensor attributes (stride, anchor cache) along with the weights."""
        self = super()._apply(fn, *args, **kwargs)
        head = self.model[-1]
        if isinstance(head, DDetect):
            head.stride = fn(head.stride)
            head.anchors = fn(head.anchors)
            head.strides = fn(head.strides)
            self.stride = head.stride
        return self

    def fuse(self):
        """Inference form, in place: every RepConvN becomes one biased 3×3 conv, every Conv folds its
        BatchNorm into a biased conv (eval statistics). Returns self."""
        for m in list(self.model.modules()):
            if isinstance(m, RepConvN):
                m.fuse_convs()
        for m in list(self.model.modules()):
            if isinstance(m, Conv):
                m.fuse()
        for m in self.model:
            m.np = sum(p.numel() for p in m.parameters())
        return self

    def is_fused(self):
        """True once no BatchNorm is left."""
        return not any(isinstance(m, nn.BatchNorm2d) for m in self.modules())
