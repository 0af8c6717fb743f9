"""Model yaml (published schema) → layers: config loading, safe argument parsing, channel rules.

Schema: `nc`, `depth_multiple`, `width_multiple`, `anchors`, optional `activation` (e.g. `nn.ReLU()`),
optional `ch` (input channels, default 3), and `backbone:` + `head:` lists of rows
`[from, number, module, args]`; layer indices run on across both lists. Nothing in a yaml is ever
`eval`-ed: module names come from a fixed table, string arguments are resolved as `nc`/`anchors` or by
`ast.literal_eval`, and the activation is parsed as a whitelisted `nn.X(literal args)` call.

Channel rule (published parse_model): for the conv-like modules the output channel args[0] becomes
ceil(args[0]·width_multiple/8)·8; no other argument is scaled; `number` n > 1 becomes
max(round(n·depth_multiple), 1). A row that cannot work raises ValueError naming it, e.g.
`yolov9-x.yaml row 12 ([-1, 1, Foo, [64]]): unknown module 'Foo'`; a published module this package does not
implement (Segment, TripleDDetect, YOLOv7's MP, ...) is named as such.
Tests: tests/models/test_models.py (`pytest tests/models/test_models.py -k yaml`).
"""

import ast
import copy
from pathlib import Path

import torch.nn as nn
import yaml

from yolov9c.models.common import (ADown, AConv, CBFuse, CBLinear, Concat, Conv, ELAN1, RepConvN,
                                   RepNBottleneck, RepNCSP, RepNCSPELAN4, SP, SPPELAN, Silence)
from yolov9c.models.head import DDetect, DualDDetect, make_divisible
from yolov9c.resources import MODEL_CONFIG_DIR as CONFIG_DIR, bundled_file, bundled_names, yaml_error_line

# Every module name a yaml row may use (the published YOLOv9 set that this package implements, plus
# parameter-free torch.nn layers that keep the channel count).
MODULES = {
    "Conv": Conv, "AConv": AConv, "ADown": ADown, "ELAN1": ELAN1, "RepNCSPELAN4": RepNCSPELAN4,
    "RepNCSP": RepNCSP, "RepNBottleneck": RepNBottleneck, "RepConvN": RepConvN, "SPPELAN": SPPELAN,
    "SP": SP, "CBLinear": CBLinear, "CBFuse": CBFuse, "Silence": Silence, "Concat": Concat,
    "DDetect": DDetect, "DualDDetect": DualDDetect,
    "nn.Upsample": nn.Upsample, "nn.Identity": nn.Identity, "nn.MaxPool2d": nn.MaxPool2d,
    "nn.AvgPool2d": nn.AvgPool2d, "nn.ZeroPad2d": nn.ZeroPad2d, "nn.Dropout": nn.Dropout,
}
# Module names of the published repository's other yamls (segment/, panoptic/, yolov9-cf, yolov7-af, hub/) that
# this package does not implement: said so, instead of 'unknown module' (which reads as a typo).
PUBLISHED_MODULES_NOT_IMPLEMENTED = {
    "Segment": "segmentation head", "DSegment": "segmentation head", "DualDSegment": "segmentation head",
    "Panoptic": "panoptic segmentation head", "TripleDDetect": "triple detection head of yolov9-cf",
    **dict.fromkeys(("MP", "SPPCSPC", "SPP", "Bottleneck", "Detect"), "YOLOv3-v7 module"),
}
# published model yamls that are not bundled (models/detect, segment, panoptic): named as such, not 'not found'
PUBLISHED_NOT_SUPPORTED = {"yolov9-cf": "TripleDDetect head; yolov9-c.yaml is its dual-head form",
                           "yolov7-af": "YOLOv7 modules",
                           **dict.fromkeys(("gelan-c-seg", "gelan-c-dseg", "yolov9-c-dseg", "yolov7-af-seg"),
                                           "segmentation head; yolov9c trains detection models"),
                           **dict.fromkeys(("gelan-c-pan", "yolov7-af-pan"),
                                           "panoptic segmentation head; yolov9c trains detection models")}
# (c1, c2, ...) modules whose output channel args[0] is width-scaled.
CONV_LIKE = {Conv, AConv, ADown, ELAN1, RepNCSPELAN4, SPPELAN, RepNCSP, RepNBottleneck, RepConvN}
HEADS = {DDetect, DualDDetect}

# Activations a yaml `activation:` may name, as `nn.Name(literal args)`.
ACTIVATIONS = {"ReLU", "ReLU6", "SiLU", "LeakyReLU", "Hardswish", "Hardsigmoid", "Mish", "GELU", "ELU",
               "CELU", "SELU", "Sigmoid", "Tanh", "Softplus", "Identity"}


def resolve_config(cfg):
    """Load a model config. cfg: dict (deep-copied), a yaml path, or a bundled config named as the published
    commands do: "yolov9-s", "yolov9-s.yaml" or "models/detect/yolov9-s.yaml" (yolov9c.resources.bundled_file;
    an existing file of that path wins). Returns (dict, label, yaml_file) where label names the source in
    error messages and yaml_file is the file name ('' for a dict)."""
    if isinstance(cfg, dict):
        return copy.deepcopy(cfg), "model config", ""
    if not isinstance(cfg, (str, Path)):
        raise TypeError(f"model config must be a dict, a yaml path or a config name, not {type(cfg).__name__}")
    path = Path(cfg)
    if not path.is_file():
        path = bundled_file(cfg, "model")
        if path is None:
            stem = Path(str(cfg)).stem
            if stem in PUBLISHED_NOT_SUPPORTED:
                raise FileNotFoundError(f"model config '{cfg}' is a published config that yolov9c does not "
                                        f"support: {PUBLISHED_NOT_SUPPORTED[stem]} (docs/api.md, Models)")
            known = ", ".join(Path(n).stem for n in bundled_names("model"))
            raise FileNotFoundError(f"model config '{cfg}' not found: not a file and not one of {known} "
                                    "(a bare name or models/detect/NAME.yaml)")
    try:
        with open(path, encoding="utf-8", errors="ignore") as f:
            d = yaml.safe_load(f)
    except yaml.YAMLError as e:
        at, problem = yaml_error_line(e, path.name)
        raise ValueError(f"{at}: not valid yaml ({problem})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path.name}: not a model yaml (top level is {type(d).__name__}, expected a mapping)")
    return d, path.name, path.name


def parse_activation(text):
    """`nn.ReLU()`, `nn.LeakyReLU(0.1)`, `torch.nn.SiLU(inplace=True)` ... → a zero-argument factory of
    that activation module. Only whitelisted torch.nn activations with literal arguments are accepted."""
    if not isinstance(text, str):
        raise ValueError(f"activation must be a string such as 'nn.ReLU()', got {text!r}")
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"activation {text!r}: not a valid expression") from e
    call = node if isinstance(node, ast.Call) else None
    func = call.func if call else node
    parts = []
    while isinstance(func, ast.Attribute):
        parts.insert(0, func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.insert(0, func.id)
    name = parts[-1] if parts else ""
    if parts[:-1] not in (["nn"], ["torch", "nn"]) or name not in ACTIVATIONS:
        raise ValueError(f"activation {text!r}: expected nn.X(...) with X one of {', '.join(sorted(ACTIVATIONS))}")
    try:
        args = [ast.literal_eval(a) for a in call.args] if call else []
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords} if call else {}
    except ValueError as e:
        raise ValueError(f"activation {text!r}: arguments must be literals") from e
    if None in kwargs:
        raise ValueError(f"activation {text!r}: ** arguments are not allowed")
    cls = getattr(nn, name)
    try:
        cls(*args, **kwargs)
    except Exception as e:
        raise ValueError(f"activation {text!r}: {e}") from e
    return lambda: cls(*args, **kwargs)


def _resolve(a, names):
    """A string argument → a known name's value (nc, anchors) or a Python literal; else kept as is."""
    if isinstance(a, list):
        return [_resolve(x, names) for x in a]
    if isinstance(a, str):
        if a in names:
            return names[a]
        try:
            return ast.literal_eval(a)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return a
    return a


def row_text(row):
    """A yaml row as the yaml writes it: [-1, 1, nn.Upsample, [None, 2, 'nearest']]."""
    def fmt(v):
        if isinstance(v, list):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        if isinstance(v, str) and v in ("None", "True", "False", "nc", "anchors"):
            return v
        return repr(v)
    if isinstance(row, list) and len(row) == 4:
        f, n, m, args = row
        return f"[{fmt(f)}, {fmt(n)}, {m}, {fmt(args)}]"
    return repr(row)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


class _Rows:
    """Error helper: raise ValueError('<label> row i (<row>): why')."""

    def __init__(self, label):
        self.label = label

    def error(self, i, row, why):
        return ValueError(f"{self.label} row {i} ({row_text(row)}): {why}")


def parse_model(d, ch_in=3, label="model config"):
    """Build the layers of model dict `d` for `ch_in` input channels.

    Returns (layers, save): an nn.Sequential whose layers carry i (index), f (from), type (module name
    as in the yaml), args (the arguments the module was built with: input channels first, nc and the head's
    input channels resolved, as the published table prints them) and np (parameter count), and the sorted indices of layers whose outputs later rows
    read. Raises ValueError naming the row for unknown modules, bad `from` indices, and channel or
    stride mismatches that are visible from the config alone.
    """
    rows = _Rows(label)
    nc, gd, gw = d.get("nc"), d.get("depth_multiple", 1.0), d.get("width_multiple", 1.0)
    anchors = d.get("anchors", 3)
    if not _is_int(nc) or nc < 1:
        raise ValueError(f"{label}: nc must be a positive integer, got {nc!r}")
    for key, v in (("depth_multiple", gd), ("width_multiple", gw)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{label}: {key} must be a positive number, got {v!r}")
    na = len(anchors[0]) // 2 if isinstance(anchors, list) else anchors
    no = na * (nc + 5) if _is_int(na) else None  # published quirk: a conv-like args[0] equal to this is not scaled
    names = {"nc": nc, "anchors": anchors}
    body = d.get("backbone"), d.get("head")
    if not all(isinstance(part, list) for part in body):
        raise ValueError(f"{label}: 'backbone' and 'head' must both be lists of [from, number, module, args] rows")
    all_rows = body[0] + body[1]
    if not all_rows:
        raise ValueError(f"{label}: no layers")

    layers, save, chs, strides = [], [], [], []  # chs/strides: per layer output channels and total stride
    for i, row in enumerate(all_rows):
        if not isinstance(row, list) or len(row) != 4:
            raise rows.error(i, row, "a row must be [from, number, module, args]")
        f, n, mname, args = row
        # --- module name and arguments
        if isinstance(mname, str) and mname in PUBLISHED_MODULES_NOT_IMPLEMENTED:
            raise rows.error(i, row, f"module {mname!r} ({PUBLISHED_MODULES_NOT_IMPLEMENTED[mname]}) of the "
                                     "published repository: yolov9c does not implement it (YOLOv9/GELAN "
                                     "detection only)")
        if not isinstance(mname, str) or mname not in MODULES:
            raise rows.error(i, row, f"unknown module {mname!r}")
        m = MODULES[mname]
        if args is None:
            args = []
        if not isinstance(args, list):
            raise rows.error(i, row, "args must be a list")
        args = [_resolve(a, names) for a in args]
        if not _is_int(n) or n < 1:
            raise rows.error(i, row, f"number must be a positive integer, got {n!r}")
        n = max(round(n * gd), 1) if n > 1 else n

        # --- inputs: -1 = previous layer (the image for row 0), otherwise an earlier layer's index
        srcs = [f] if _is_int(f) else f
        if not isinstance(srcs, list) or not srcs or not all(_is_int(j) for j in srcs):
            raise rows.error(i, row, f"from must be an integer or a list of integers, got {f!r}")
        for j in srcs:
            ok = (j == -1) if i == 0 else (-i <= j < i)
            if not ok:
                raise rows.error(i, row, f"from index {j} does not name an earlier layer (this is layer {i})")
        multi = m in HEADS or m in (Concat, CBFuse)
        if multi and not isinstance(f, list):
            raise rows.error(i, row, f"{mname} takes a list of inputs")
        if not multi and isinstance(f, list):
            raise rows.error(i, row, f"{mname} takes one input, got {len(f)}")

        def ch_of(j):
            return ch_in if i == 0 else chs[j]

        def stride_of(j):
            return 1 if i == 0 else strides[j]

        c_in = [ch_of(j) for j in srcs]
        s_in = [stride_of(j) for j in srcs]
        if m not in (CBFuse,) and any(isinstance(c, list) for c in c_in):
            raise rows.error(i, row, f"{mname} cannot read a CBLinear output (a list of chunks); use CBFuse")
        stride = s_in[-1]

        # --- channel rule and per-module checks
        if m in CONV_LIKE:
            if not args or not _is_int(args[0]):
                raise rows.error(i, row, f"{mname} needs the output channel count as its first argument")
            c1, c2 = c_in[0], args[0]
            if c2 != no:
                c2 = make_divisible(c2 * gw, 8)
            args = [c1, c2, *args[1:]]
            if m is RepNCSP:
                args.insert(2, n)
                n = 1
            if m in (RepNCSPELAN4, ELAN1) and len(args) > 2 and _is_int(args[2]) and args[2] % 2:
                raise rows.error(i, row, f"hidden width c3={args[2]} is odd: it cannot be split in two halves")
            if m is ADown and c1 % 2:
                raise rows.error(i, row, f"ADown splits its input in two halves, but it has {c1} channels")
            if m is ADown and c2 % 2:
                raise rows.error(i, row, f"ADown outputs 2·(c2//2) channels, so c2={c2} must be even")
            if m in (Conv, RepConvN):
                s = args[3] if len(args) > 3 else 1
                stride = stride * s if _is_int(s) and stride is not None else None
            elif m in (AConv, ADown):
                stride = stride * 2 if stride is not None else None
        elif m is CBLinear:
            if not args or not isinstance(args[0], list) or not all(_is_int(c) and c > 0 for c in args[0]):
                raise rows.error(i, row, "CBLinear needs a list of output chunk widths, e.g. [[256, 512]]")
            c2 = list(args[0])
            args = [c_in[0], c2, *args[1:]]
        elif m is CBFuse:
            if len(args) != 1 or not isinstance(args[0], list) or not all(_is_int(k) for k in args[0]):
                raise rows.error(i, row, "CBFuse needs one list of chunk indices, e.g. [[0, 0, 0]]")
            idx = args[0]
            c2 = c_in[-1]
            if isinstance(c2, list):
                raise rows.error(i, row, "the last input of CBFuse must be a feature map, not a CBLinear output")
            if len(idx) != len(srcs) - 1:
                raise rows.error(i, row, f"{len(srcs) - 1} CBLinear inputs but {len(idx)} chunk indices")
            for j, k, c in zip(srcs, idx, c_in):
                if not isinstance(c, list):
                    raise rows.error(i, row, f"input {j} is not a CBLinear output")
                if not 0 <= k < len(c):
                    raise rows.error(i, row, f"chunk index {k} out of range for input {j} ({len(c)} chunks)")
                if c[k] != c2:
                    raise rows.error(i, row, f"channel mismatch: chunk {k} of layer {j} has {c[k]} channels, "
                                             f"the fused map has {c2}")
        elif m is Concat:
            c2 = sum(c_in)
            if len({s for s in s_in if s is not None}) > 1:
                raise rows.error(i, row, "Concat of maps at different strides "
                                         f"({', '.join(f'layer {j}: /{s}' for j, s in zip(srcs, s_in))})")
        elif m in HEADS:
            if n != 1:
                raise rows.error(i, row, f"{mname} cannot be repeated (number must be 1)")
            if m is DualDDetect and len(srcs) % 2:
                raise rows.error(i, row, f"DualDDetect needs an even number of inputs (aux + main), got {len(srcs)}")
            if i != len(all_rows) - 1:
                raise rows.error(i, row, f"{mname} must be the last row")
            args.append(c_in)
            c2 = None
        else:
            c2 = c_in[0]
            if m is nn.Upsample:
                scale = args[1] if len(args) > 1 else None
                known = stride is not None and isinstance(scale, (int, float)) and scale > 0
                stride = stride / scale if known else None
            elif m is SP:
                s = args[1] if len(args) > 1 else 1
                stride = stride * s if stride is not None and _is_int(s) else None
            elif m in (nn.MaxPool2d, nn.AvgPool2d, nn.ZeroPad2d):
                stride = None  # not tracked; skips the Concat stride check downstream
        if isinstance(stride, float) and stride.is_integer():
            stride = int(stride)

        # --- build
        try:
            module = nn.Sequential(*(m(*args) for _ in range(n))) if n > 1 else m(*args)
        except Exception as e:
            raise rows.error(i, row, f"cannot build {mname}{tuple(args)}: {e}") from e
        module.i, module.f, module.type, module.args = i, f, mname, args  # args as built (the published table)
        module.np = sum(p.numel() for p in module.parameters())
        layers.append(module)
        save.extend(j % i for j in srcs if j != -1)
        chs.append(c2)
        strides.append(stride)

    if type(layers[-1]) not in HEADS:
        raise ValueError(f"{label}: the last row must be a DDetect or DualDDetect head, "
                         f"not {layers[-1].type}")
    return nn.Sequential(*layers), sorted(set(save))
