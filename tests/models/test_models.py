"""Model construction tests: published layout, parameter counts, head set-up, forward contract, and
user yamls (nc / width / depth / activation overrides, dicts, bad rows).

Layout and counts are checked against the recorded keys.txt and summary.json (tests/assets/goldens/) for all ten
configs; forward tests use small float32 inputs. Run: pytest tests/models/test_models.py (≈10-20 s on 2 cores).
"""

import json
import math

import pytest
import torch
import torch.nn as nn
import yaml

from golden_weights import CONFIGS, GOLDEN_DIR, golden_lines
from yolov9c.models.common import Conv, RepConvN
from yolov9c.models.head import DDetect, DFL, DualDDetect
from yolov9c.models.info import layer_table
from yolov9c.models.model import DetectionModel
from yolov9c.models.parse import CONFIG_DIR, parse_activation, resolve_config, row_text

SUMMARY = json.loads((GOLDEN_DIR / "summary.json").read_text())


def _keys_file(cfg):
    """[(name, shape tuple, is_integer)] from a golden keys file: `name (d0, d1) dtype` per line."""
    out = []
    for line in golden_lines(cfg, "keys"):
        name, rest = line.split(" ", 1)
        shape, dtype = rest.rsplit(" ", 1)
        out.append((name, tuple(int(s) for s in shape.strip("()").split(",") if s.strip()), dtype == "int64"))
    return out


def _cfg(name):
    return resolve_config(name)[0]


def _build_error(d):
    with pytest.raises(ValueError) as e:
        DetectionModel(d)
    return str(e.value)


# ---------------------------------------------------------------- published layout, all ten configs

@pytest.mark.parametrize("cfg", CONFIGS)
def test_layout_and_params(cfg):
    model = DetectionModel(cfg)
    ref = _keys_file(cfg)
    got = [(k, tuple(v.shape), not v.is_floating_point()) for k, v in model.state_dict().items()]
    assert [k for k, *_ in got] == [k for k, *_ in ref]  # names and registration order
    assert got == ref  # shapes and integer/float kind
    assert all(v.dtype in (torch.float32, torch.int64) for v in model.state_dict().values())
    assert sum(p.numel() for p in model.parameters()) == SUMMARY[cfg]["params"]
    # layer bookkeeping of the shared interface
    assert [m.i for m in model.model] == list(range(len(model.model)))
    assert sum(m.np for m in model.model) == SUMMARY[cfg]["params"]
    assert model.save == sorted(set(model.save)) and all(0 <= i < len(model.model) for i in model.save)
    head = model.model[-1]
    assert isinstance(head, DualDDetect if cfg.startswith("yolov9") else DDetect)
    assert head.type == type(head).__name__ and head.nc == model.nc == 80 and head.reg_max == 16
    assert head.no == 80 + 64 and head.nl == 3
    assert model.stride.tolist() == head.stride.tolist() == [8.0, 16.0, 32.0]
    assert model.names == [str(i) for i in range(80)] and model.hyp is None
    assert model.yaml_file == f"{cfg}.yaml" and model.training


def test_batchnorm_and_head_init():
    model = DetectionModel("yolov9-t")
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(bn.eps == 1e-3 and bn.momentum == 0.03 for bn in bns)
    head = model.model[-1]
    for box, cls in ((head.cv2, head.cv3), (head.cv4, head.cv5)):
        for b, c, s in zip(box, cls, (8, 16, 32)):
            assert torch.all(b[-1].bias == 1.0)
            assert torch.allclose(c[-1].bias, torch.full((80,), math.log(5 / 80 / (640 / s) ** 2)))
    for dfl in (head.dfl, head.dfl2):
        assert torch.equal(dfl.conv.weight.view(-1), torch.arange(16.0)) and not dfl.conv.weight.requires_grad
    # head widths: box c2 = roundup4(max(ch0/4, 64, 16)), cls c3 = max(ch0, min(2·nc, 128)); aux P3 has 64 ch
    assert head.cv2[0][0].conv.out_channels == 64 and head.cv3[0][0].conv.out_channels == 128
    assert head.cv2[0][1].conv.groups == 4 and head.cv2[0][2].groups == 4


def test_construction_is_seeded():
    torch.manual_seed(0)
    a = DetectionModel("gelan-t").state_dict()
    torch.manual_seed(0)
    b = DetectionModel("gelan-t").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- forward contract

def test_forward_train_and_eval_gelan():
    model = DetectionModel("gelan-t", nc=5)
    x = torch.rand(2, 3, 64, 96)
    maps = model(x)
    assert [tuple(m.shape) for m in maps] == [(2, 69, 8, 12), (2, 69, 4, 6), (2, 69, 2, 3)]
    model.eval()
    with torch.no_grad():
        y, maps2 = model(x)
    a = 8 * 12 + 4 * 6 + 2 * 3
    assert y.shape == (2, 4 + 5, a) and len(maps2) == 3
    assert torch.all((y[:, 4:] >= 0) & (y[:, 4:] <= 1))
    # decode by hand for one anchor of the P4 level: DFL expectation, ltrb around the cell centre, × stride
    head, k = model.model[-1], 8 * 12 + 6 + 1  # level 1, row 1, column 1
    box = maps2[1][0, :64, 1, 1].view(4, 16).softmax(1) @ torch.arange(16.0)
    cx, cy = 1.5, 1.5
    x1, y1, x2, y2 = cx - box[0], cy - box[1], cx + box[2], cy + box[3]
    want = torch.stack(((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1)) * 16
    assert torch.allclose(y[0, :4, k], want, rtol=1e-5, atol=1e-4)
    assert torch.allclose(y[0, 4:, k], maps2[1][0, 64:, 1, 1].sigmoid())
    # the anchor cache follows the input shape
    with torch.no_grad():
        y2, _ = model(torch.rand(1, 3, 32, 32))
    assert y2.shape == (1, 9, 16 + 4 + 1) and head.anchors.shape == (2, 21)


def test_forward_dual_head_eval_and_dtype_moves():
    model = DetectionModel("yolov9-t", nc=3).eval()
    with torch.no_grad():
        (y_aux, y_main), (d_aux, d_main) = model(torch.rand(1, 3, 64, 64))
    assert y_aux.shape == y_main.shape == (1, 7, 64 + 16 + 4) and len(d_aux) == len(d_main) == 3
    assert not torch.equal(y_aux, y_main)
    model.double()  # the head's stride and anchor cache move with the weights
    assert model.stride.dtype == model.model[-1].stride.dtype == model.model[-1].anchors.dtype == torch.float64
    with torch.no_grad():
        (y_aux64, y_main64), _ = model(torch.rand(1, 3, 64, 64, dtype=torch.float64))
    assert y_main64.dtype == torch.float64


def test_dfl_module_is_the_expected_bin():
    """(make_anchors and dist2bbox: tests/package/test_geometry.py)"""
    logits = torch.full((1, 64, 1), -1e4)
    for side, bin_ in enumerate((0, 3, 7, 15)):
        logits[0, side * 16 + bin_, 0] = 0.0
    assert DFL(16)(logits).view(-1).tolist() == [0.0, 3.0, 7.0, 15.0]


# ---------------------------------------------------------------- user yamls

def test_config_sources(tmp_path):
    d = _cfg("gelan-t")
    m1 = DetectionModel(d)
    assert m1.yaml_file == "" and m1.yaml is not d and m1.yaml == dict(d, ch=3)  # deep copy (+ ch, as published)
    m1.yaml["nc"] = 1
    assert d["nc"] == 80
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump(d))
    m2 = DetectionModel(str(p))
    assert m2.yaml_file == "mine.yaml"
    assert DetectionModel("gelan-t.yaml").yaml_file == "gelan-t.yaml"
    assert (CONFIG_DIR / "gelan-t.yaml").is_file()
    with pytest.raises(FileNotFoundError, match="yolov9-x"):
        DetectionModel("yolov9-x")


@pytest.mark.parametrize("name,says", [("models/segment/gelan-c-seg.yaml", "segmentation"),
                                       ("models/panoptic/gelan-c-pan.yaml", "panoptic segmentation"),
                                       ("yolov9-c-dseg", "segmentation")])
def test_published_segmentation_configs_are_named_unsupported(name, says):
    """The published segment/ and panoptic/ yamls, named as its README does, are not 'not found'."""
    with pytest.raises(FileNotFoundError, match=f"is a published config that yolov9c does not support: {says}"):
        DetectionModel(name)


@pytest.mark.parametrize("name,base", [("gelan", "gelan-c"), ("yolov9", "yolov9-c")])
def test_published_relu_variants_are_bundled(name, base):
    """The published models/detect/ also has gelan.yaml and yolov9.yaml: gelan-c / yolov9-c with ReLU activations
    and every ADown [c] replaced by a stride-2 Conv [c, 3, 2]. `--cfg yolov9.yaml` and `--cfg
    models/detect/gelan.yaml` find them, as published."""
    d, b = _cfg(name), _cfg(base)
    assert d["activation"] == "nn.ReLU()" and "activation" not in b
    swap = [[f, n, "Conv", [a[0], 3, 2]] if m == "ADown" else [f, n, m, a] for f, n, m, a in b["backbone"] + b["head"]]
    assert d["backbone"] + d["head"] == swap and any(r[2] == "ADown" for r in b["backbone"])
    for spec in (name, f"{name}.yaml", f"models/detect/{name}.yaml"):
        assert DetectionModel(spec).yaml_file == f"{name}.yaml", spec
    model = DetectionModel(name)
    assert isinstance(model.model[1 if name == "yolov9" else 0].act, nn.ReLU)


def test_nc_override_changes_head():
    model = DetectionModel("yolov9-t", nc=3)
    head = model.model[-1]
    assert model.nc == head.nc == model.yaml["nc"] == 3 and head.no == 67 and model.names == ["0", "1", "2"]
    for cls in (head.cv3, head.cv5):
        assert cls[0][-1].weight.shape == (3, cls[0][-1].in_channels, 1, 1)
    # cls width c3 = max(ch0, min(2·nc, 128)): aux P3 of yolov9-t has 64 channels, so 64 (not 128 as for nc=80)
    assert head.cv3[0][0].conv.out_channels == 64
    with pytest.raises(ValueError, match="nc"):
        DetectionModel("gelan-t", nc=0)


def test_width_rounding_published_quirk():
    model = DetectionModel("yolov9-m")  # AConv [180] → ceil(180/8)·8 = 184 channels, as published
    assert model.model[17].type == "AConv" and model.model[17].cv1.conv.out_channels == 184
    assert model.model[18].type == "Concat"
    assert model.model[19].cv1.conv.in_channels == 184 + 360


def test_width_and_depth_multiples():
    d = _cfg("gelan-s")
    d["width_multiple"], d["depth_multiple"] = 0.5, 0.5
    d["backbone"][4] = [-1, 3, "RepNCSPELAN4", [128, 128, 64, 3]]  # n = 3 → round(1.5) = 2 repeats
    model = DetectionModel(d)
    m = model.model
    assert m[0].conv.out_channels == 16 and m[3].cv1.conv.out_channels == 64  # 32·0.5, 128·0.5
    # RepNCSPELAN4 [128, 128, 64, 3]: only c2 scales (→ 64); hidden c3 = 128, c4 = 64 and the inner depth 3 stay
    blk = m[4][0]
    assert isinstance(m[4], nn.Sequential) and len(m[4]) == 2
    assert blk.cv1.conv.out_channels == 128 and blk.cv4.conv.out_channels == 64 and len(blk.cv2[0].m) == 3
    assert m[4][1].cv1.conv.in_channels == 64
    assert m[9].cv5.conv.out_channels == 128 and m[9].cv1.conv.out_channels == 128  # SPPELAN [256, 128]
    d2 = _cfg("gelan-t")
    d2["width_multiple"] = 0.3  # 16·0.3 = 4.8 → 8; 32·0.3 = 9.6 → 16
    m2 = DetectionModel(d2).model
    assert m2[0].conv.out_channels == 8 and m2[1].conv.out_channels == 16


def test_activation_key():
    d = _cfg("gelan-t")
    d["activation"] = "nn.ReLU()"
    model = DetectionModel(d)
    convs = [m for m in model.modules() if type(m) is Conv]
    acts = [m.act for m in convs if not isinstance(m.act, nn.Identity)]
    assert len(acts) > 50 and all(type(a) is nn.ReLU for a in acts)
    # act=False convs (inside RepConvN) stay linear; RepConvN takes the yaml's activation too (published
    # parse_model sets Conv.default_act and RepConvN.default_act), one shared instance per class as there,
    # so the summary's layer count (distinct modules) is the SiLU model's
    assert any(isinstance(m.act, nn.Identity) for m in convs)
    reps = [m.act for m in model.modules() if isinstance(m, RepConvN)]
    assert reps and all(type(a) is nn.ReLU for a in reps)
    assert len({id(a) for a in acts}) == 1 and len({id(a) for a in reps}) == 1 and acts[0] is not reps[0]
    assert len(list(model.modules())) == len(list(DetectionModel("gelan-t").modules()))
    # the published parse table's second line says which activation the yaml set (none without the key)
    assert layer_table(model).splitlines()[1] == "activation: nn.ReLU()"
    assert not layer_table(DetectionModel("gelan-t")).splitlines()[1].startswith("activation")
    d["activation"] = "nn.LeakyReLU(0.1)"
    leaky = [m.act for m in DetectionModel(d).modules() if type(m) is Conv and not isinstance(m.act, nn.Identity)]
    assert all(type(a) is nn.LeakyReLU and a.negative_slope == 0.1 for a in leaky)
    # and the activation really changes the output
    torch.manual_seed(1)
    relu_out = DetectionModel(dict(_cfg("gelan-t"), activation="nn.ReLU()"))(torch.rand(1, 3, 64, 64))
    torch.manual_seed(1)
    silu_out = DetectionModel("gelan-t")(torch.rand(1, 3, 64, 64))
    assert not torch.allclose(relu_out[0], silu_out[0])


@pytest.mark.parametrize("text", ['__import__("os").system("echo hi")', "os.system('x')", "nn.Linear(3, 4)",
                                  "nn.LeakyReLU(x)", "nn.ReLU(**{})", "nn.ReLU()[0]", "lambda: 1"])
def test_activation_rejects_code(text):
    with pytest.raises(ValueError, match="activation"):
        parse_activation(text)
    d = _cfg("gelan-t")
    d["activation"] = text
    assert "activation" in _build_error(d)


def test_activation_parse_forms():
    assert type(parse_activation("torch.nn.SiLU()")()) is nn.SiLU
    assert parse_activation("nn.LeakyReLU(negative_slope=0.2)")().negative_slope == 0.2
    assert type(parse_activation("nn.Hardswish")()) is nn.Hardswish


def _with_row(cfg, i, row):
    d = _cfg(cfg)
    nb = len(d["backbone"])
    part, k = ("backbone", i) if i < nb else ("head", i - nb)
    d[part][k] = row
    return d


@pytest.mark.parametrize("cfg,i,row,why", [
    ("gelan-t", 12, [-1, 1, "Foo", [64]], "unknown module 'Foo'"),
    ("gelan-t", 12, [-1, 1, "eval", ["1"]], "unknown module 'eval'"),
    ("gelan-t", 12, [13, 1, "RepNCSPELAN4", [96, 96, 48, 3]], "from index 13"),
    ("gelan-t", 12, [-13, 1, "RepNCSPELAN4", [96, 96, 48, 3]], "from index -13"),
    ("gelan-t", 0, [0, 1, "Conv", [16, 3, 2]], "from index 0"),
    ("gelan-t", 12, [-1, 1, "RepNCSPELAN4", [96, 95, 48, 3]], "odd"),
    ("gelan-t", 2, [-1, 1, "ELAN1", [32, 33, 16]], "odd"),
    ("gelan-t", 11, [[-1, 4], 1, "Concat", [1]], "different strides"),
    ("gelan-t", 12, [[-1, 6], 1, "RepNCSPELAN4", [96, 96, 48, 3]], "takes one input"),
    ("gelan-t", 22, [[15, 18, 21], 2, "DDetect", ["nc"]], "repeated"),
    ("gelan-t", 9, [-1, 1, "SPPELAN", ["x", 64]], "output channel"),
    ("yolov9-t", 29, [[28, 25, 22, 15, 18], 1, "DualDDetect", ["nc"]], "even number"),
    ("yolov9-c", 30, [[23, 24, 25, -1], 1, "CBFuse", [[0, 1, 0]]], "channel mismatch"),
    ("yolov9-c", 23, [5, 1, "CBLinear", [[128]]],
     "row 30 ([[23, 24, 25, -1], 1, CBFuse, [[0, 0, 0]]]): channel mismatch"),
    ("yolov9-c", 30, [[23, 24, 25, -1], 1, "CBFuse", [[0, 0, 5]]], "out of range"),
    ("yolov9-c", 26, [23, 1, "Conv", [64, 3, 2]], "CBLinear output"),
    ("gelan-t", 4, [-1, 1, "RepNCSPELAN4", [64, 64, 32, "__import__('os')"]], "cannot build"),
])
def test_bad_rows_name_the_row(cfg, i, row, why):
    msg = _build_error(_with_row(cfg, i, row))
    assert why in msg, msg
    if "row " not in why:  # otherwise `why` names the row that detects the problem (a later consumer)
        assert f"row {i} (" in msg and str(row[2]) in msg, msg


@pytest.mark.parametrize("row,why", [
    ([[15, 18, 21], 1, "Segment", ["nc", 32, 256]], "module 'Segment' (segmentation head) of the published"),
    ([[15, 18, 21], 1, "Panoptic", ["nc", 93, 32, 256]], "module 'Panoptic' (panoptic segmentation head)"),
    ([[15, 18, 21], 1, "TripleDDetect", ["nc"]], "module 'TripleDDetect' (triple detection head of yolov9-cf)"),
    ([[15, 18, 21], 1, "Detect", ["nc", "anchors"]], "module 'Detect' (YOLOv3-v7 module)"),
])
def test_published_modules_not_implemented_are_named_so(row, why):
    """A published yaml this package cannot build (segment/, panoptic/, yolov9-cf, yolov7-af, hub/) says that
    its module is a published one yolov9c does not implement, not that the name is unknown (a typo)."""
    msg = _build_error(_with_row("gelan-t", 22, row))
    assert msg.startswith(f"model config row 22 ({row_text(row)}): {why}") and "does not implement" in msg, msg


def test_bad_row_message_format_from_file(tmp_path):
    p = tmp_path / "yolov9-x.yaml"
    p.write_text(yaml.safe_dump(_with_row("gelan-t", 12, [-1, 1, "Foo", [64]])))
    with pytest.raises(ValueError) as e:
        DetectionModel(str(p))
    assert str(e.value) == "yolov9-x.yaml row 12 ([-1, 1, Foo, [64]]): unknown module 'Foo'"


def test_unparsable_yaml_is_one_line(tmp_path):
    # a flow list never closed: a ValueError the CLIs print as one `error:` line, not PyYAML's ParserError
    p = tmp_path / "mine.yaml"
    p.write_text("nc: 80\nbackbone: [[-1, 1, Conv, [16, 3, 2]]\n")
    with pytest.raises(ValueError) as e:
        DetectionModel(str(p))
    assert str(e.value) == ("mine.yaml: line 2: not valid yaml (while parsing a flow sequence; "
                            "expected ',' or ']', but got '<stream end>')")


def test_probe_failure_names_the_row():
    # a max-pool that halves the map is not stride-tracked; the Concat then fails on the probe forward
    d = _with_row("gelan-t", 10, [-1, 1, "nn.MaxPool2d", [2, 2]])
    msg = _build_error(d)
    assert "row 11 ([[-1, 6], 1, Concat, [1]])" in msg and "probe" in msg


def test_structure_errors():
    d = _cfg("gelan-t")
    d["head"] = d["head"][:-1]
    assert "last row must be a DDetect or DualDDetect" in _build_error(d)
    d = _cfg("gelan-t")
    d["backbone"][0] = [-1, 1, "Conv"]
    assert "row 0" in _build_error(d)
    d = _cfg("gelan-t")
    d["width_multiple"] = -1
    assert "width_multiple" in _build_error(d)
    assert "backbone" in _build_error({"nc": 80, "backbone": None, "head": []})


def test_string_args_resolved_safely():
    d = _cfg("gelan-t")
    up = d["head"][1]
    assert up[2] == "nn.Upsample" and up[3][0] == "None"  # yaml gives the string 'None'
    model = DetectionModel(d)
    assert model.model[10].scale_factor == 2 and model.model[10].size is None and model.model[10].mode == "nearest"
    d["head"][1] = [-1, 1, "nn.Upsample", ["None", 2, "__import__('os').system('echo pwned')"]]
    assert "row 10" in _build_error(d)


def test_pickle_roundtrip_restores_through_dict():
    # unpickling an nn.Module restores its __dict__ without running __init__, as for published objects
    import pickle

    model = DetectionModel("yolov9-t").eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        ref = model(x)[0][1]  # also fills the anchor cache, which travels with the pickle
        clone = pickle.loads(pickle.dumps(model))
        assert torch.equal(clone(x)[0][1], ref)
        assert clone(torch.rand(1, 3, 32, 32))[0][1].shape == (1, 84, 16 + 4 + 1)
        fused = pickle.loads(pickle.dumps(model.fuse()))
        assert torch.allclose(fused(x)[0][1], ref, rtol=1e-4, atol=1e-4)
