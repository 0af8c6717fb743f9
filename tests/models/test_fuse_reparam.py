"""fuse() (BN folding, RepConvN merging) and reparameterize() (yolov9-X → gelan-X) tests.

Outputs are compared in float64 on the golden recipe's weights (non-trivial BN running statistics), eval
mode, on the recipe's input pattern at 64×64 (P5 2×2): fused vs unfused and gelan vs the yolov9 main head.
Fused parameter counts are the published ones (spec §11). Re-parameterisation end to end: t, c and e, one of
each layer mapping (s has t's, m has c's: test_layer_mapping_is_the_published_one checks all five).
Run: pytest tests/models/test_fuse_reparam.py (≈15-30 s on 2 cores).
"""

import pytest
import torch
import torch.nn as nn

from golden_weights import golden_init_, golden_input
from yolov9c.models.common import Conv, RepConvN
from yolov9c.models.model import DetectionModel
from yolov9c.models.parse import resolve_config
from yolov9c.models.reparam import layer_mapping, reparameterize

FUSED_PARAMS = {"gelan-t": 2_407_632, "gelan-s": 7_105_888, "gelan-m": 19_978_672, "gelan-c": 25_288_768,
                "gelan-e": 57_345_920, "yolov9-s": 9_659_168, "yolov9-c": 50_880_768}


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def _golden(cfg):
    model = DetectionModel(cfg).double()
    return golden_init_(model).eval()


def _main(out):
    """Eval output → the decoded tensor of the kept head."""
    y = out[0]
    return y[1] if isinstance(y, list) else y


# ---------------------------------------------------------------- fuse

def _random_bn_(bn):
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.3, 0.3)
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)


@pytest.mark.parametrize("stride", [1, 2])
def test_repconvn_fuse_unit(stride):
    torch.manual_seed(0)
    m = RepConvN(6, 10, 3, stride).double().eval()
    for bn in (m.conv1.bn, m.conv2.bn):
        _random_bn_(bn)
    x = torch.randn(2, 6, 9, 11, dtype=torch.float64)
    ref = m(x)
    m.fuse_convs()
    assert set(m._modules) == {"act", "conv"} and m.conv.kernel_size == (3, 3) and m.conv.bias is not None
    assert m.conv.stride == (stride, stride)
    assert _rel(m(x), ref) < 1e-12
    m.fuse_convs()  # idempotent
    assert _rel(m(x), ref) < 1e-12


def test_conv_fuse_unit():
    torch.manual_seed(0)
    m = Conv(4, 8, 3, 2, g=2).double().eval()
    _random_bn_(m.bn)
    x = torch.randn(1, 4, 8, 8, dtype=torch.float64)
    ref = m(x)
    m.fuse()
    assert not hasattr(m, "bn") and m.conv.bias is not None and m.conv.groups == 2
    assert _rel(m(x), ref) < 1e-12
    m.fuse()
    assert _rel(m(x), ref) < 1e-12


@pytest.mark.parametrize("cfg", ["gelan-s", "yolov9-s", "yolov9-c"])
def test_fused_model_equals_unfused(cfg):
    model = _golden(cfg)
    x = golden_input(1, 64)
    with torch.no_grad():
        ref = _main(model(x))
        model.fuse()
        out = _main(model(x))
    assert model.is_fused() and not any(isinstance(m, RepConvN) and hasattr(m, "conv1") for m in model.modules())
    assert not any(".bn." in k for k in model.state_dict())
    assert sum(p.numel() for p in model.parameters()) == FUSED_PARAMS[cfg]
    assert _rel(out, ref) < 1e-10, f"{cfg}: fused vs unfused {_rel(out, ref):.2e}"
    assert model.fuse() is model  # fusing again changes nothing
    with torch.no_grad():
        assert _rel(_main(model(x)), ref) < 1e-10


@pytest.mark.parametrize("cfg", ["gelan-t", "gelan-m", "gelan-c", "gelan-e"])
def test_fused_param_counts(cfg):
    model = DetectionModel(cfg).fuse()
    assert sum(p.numel() for p in model.parameters()) == FUSED_PARAMS[cfg]
    assert sum(m.np for m in model.model) == FUSED_PARAMS[cfg]


def test_fused_model_float32_close():
    torch.manual_seed(0)
    model = DetectionModel("gelan-t").eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            _random_bn_(m)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        ref = model(x)[0]
        out = model.fuse()(x)[0]
    assert _rel(out, ref) < 1e-5


# ---------------------------------------------------------------- re-parameterisation

SPEC_MAPPINGS = {  # spec §3 "Re-parameterisation to GELAN", written out: gelan index → yolov9 index
    "t": {**{i: i for i in range(22)}, 22: 29},
    "s": {**{i: i for i in range(22)}, 22: 29},
    "m": {**{i: i + 1 for i in range(22)}, 22: 38},
    "c": {**{i: i + 1 for i in range(22)}, 22: 38},
    "e": {**{i: i for i in range(29)}, **{i: i + 7 for i in range(29, 42)}, 42: 49},
}


@pytest.mark.parametrize("size", "tsmce")
def test_layer_mapping_is_the_published_one(size):
    y, g = resolve_config(f"yolov9-{size}")[0], resolve_config(f"gelan-{size}")[0]
    assert layer_mapping(y, g) == SPEC_MAPPINGS[size]


@pytest.mark.parametrize("size", "tce")  # one size of each mapping (the module docstring)
def test_reparameterized_equals_main_head(size):
    model = _golden(f"yolov9-{size}")
    gelan = reparameterize(model, f"gelan-{size}")
    assert not gelan.training and next(gelan.parameters()).dtype == torch.float64
    assert isinstance(gelan.model[-1], type(model.model[-1]).__mro__[1])  # DDetect
    x = golden_input(1, 64)
    with torch.no_grad():
        ref = model(x)[0][1]
        out = gelan(x)[0]
    assert _rel(out, ref) < 1e-12, f"{size}: {_rel(out, ref):.2e}"
    # the kept weights are the yolov9 main-branch weights (not just close outputs)
    src = SPEC_MAPPINGS[size]
    head_i = len(gelan.model) - 1
    assert torch.equal(gelan.model[head_i].cv3[0][-1].weight, model.model[src[head_i]].cv5[0][-1].weight)
    assert torch.equal(gelan.model[5].state_dict()[next(iter(gelan.model[5].state_dict()))],
                       model.model[src[5]].state_dict()[next(iter(gelan.model[5].state_dict()))])


def test_reparameterize_keeps_nc_names_mode():
    model = DetectionModel("yolov9-t", nc=3)
    model.names = ["a", "b", "c"]
    gelan = reparameterize(model.train(), "gelan-t")
    assert gelan.nc == 3 and gelan.names == ["a", "b", "c"] and gelan.training
    assert gelan.model[-1].cv3[0][-1].weight.shape[0] == 3


def test_reparameterize_errors():
    model = DetectionModel("yolov9-t")
    with pytest.raises(ValueError, match="does not match"):
        reparameterize(model, "gelan-s")
    with pytest.raises(ValueError, match="not the same model family"):
        reparameterize(model, "gelan-e")
    with pytest.raises(ValueError, match="DualDDetect"):
        reparameterize(DetectionModel("gelan-t"), "gelan-t")
    with pytest.raises(ValueError, match="fused"):
        reparameterize(DetectionModel("yolov9-t").fuse(), "gelan-t")
    # a tensor-shape check as a last line of defence: same yaml rows, different weights in the source
    with torch.no_grad():
        head = model.model[-1]
        head.cv4[0][-1].weight = nn.Parameter(torch.zeros(64, 8, 1, 1))  # was (64, 16, 1, 1)
    with pytest.raises(ValueError, match="shape mismatch"):
        reparameterize(model, "gelan-t")
