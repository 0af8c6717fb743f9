"""Model summaries in the published layout: the layer table and `<name> summary: L layers, P parameters,
G gradients, F GFLOPs`.

    print(layer_table(model)); print(model_summary(model, imgsz=640))

GFLOPs are counted by hand by thop 0.1.1's rules (what the published code calls), so the figures are the
published ones: forward hooks record each layer's output size in one pass; an nn.Conv2d output element costs
(c_in / groups)·k_h·k_w MACs (no bias), a BatchNorm2d element 4, a nearest nn.Upsample element 1; SiLU, pools,
concatenation and functional ops cost nothing; GFLOPs = 2·sum/1e9. As published, the pass runs on a small
probe image and is scaled to `imgsz` by area (exact for sides that are multiples of the largest stride).
The published printouts it reproduces are the test's expected values.
Test: python -m pytest -q tests/models/test_checkpoint.py -k "flops or summary or table"
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def _pair(imgsz) -> tuple[int, int]:
    """(h, w) from an int or a 1-/2-sequence."""
    if isinstance(imgsz, int):
        return imgsz, imgsz
    imgsz = list(imgsz)
    return (imgsz[0], imgsz[0]) if len(imgsz) == 1 else (imgsz[0], imgsz[1])


def _max_stride(model: nn.Module) -> int:
    stride = getattr(model, "stride", None)
    if isinstance(stride, torch.Tensor) and stride.numel():
        return max(int(stride.max()), 32)
    return 32


# Operations per output element of the non-convolution layers, as the published code counts them (it calls
# thop 0.1.1): BatchNorm normalises (2) and applies the affine transform (x2); nearest upsampling and average
# pooling cost 1, ReLU-type activations 1; SiLU, max-pooling, concatenation and functional ops cost nothing.
_UPSAMPLE_OPS = {"nearest": 1, "linear": 5, "bilinear": 11, "bicubic": 259, "trilinear": 31}
_ELEMENTWISE_OPS = {nn.BatchNorm2d: 4, nn.SyncBatchNorm: 4, nn.AvgPool2d: 1, nn.ReLU: 1, nn.ReLU6: 1,
                    nn.LeakyReLU: 1}


def count_ops(model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(conv multiply-accumulates, other ops) of one forward of `model` on `x` (B, C, H, W), per image.

    Conv2d: (c_in/groups)·k_h·k_w per output element (bias not counted); other layers per _ELEMENTWISE_OPS /
    _UPSAMPLE_OPS. Layers are matched by exact type, as thop does. Runs under no_grad in eval mode (BatchNorm
    statistics untouched) and restores the training flag."""
    macs = other = 0

    def conv_hook(m, inputs, out):
        nonlocal macs
        kh, kw = m.kernel_size
        macs += (out.numel() // out.shape[0]) * (m.in_channels // m.groups) * kh * kw

    def elementwise_hook(m, inputs, out):
        nonlocal other
        if type(m) is nn.Upsample:
            per = _UPSAMPLE_OPS.get(m.mode, 0)
        else:
            per = _ELEMENTWISE_OPS[type(m)]
        other += per * (out.numel() // out.shape[0])

    handles = []
    for m in model.modules():
        if type(m) is nn.Conv2d:
            handles.append(m.register_forward_hook(conv_hook))
        elif type(m) in _ELEMENTWISE_OPS or type(m) is nn.Upsample:
            handles.append(m.register_forward_hook(elementwise_hook))
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return macs, other


def count_flops(model: nn.Module, imgsz=640, *, probe: int | None = None, published: bool = True) -> float:
    """GFLOPs of one `imgsz` image (int or (h, w)): 2 × (conv MACs + the other layers' ops) / 1e9, the other
    layers counted as the published summary does (published=True; BatchNorm is most of it) or not at all
    (published=False: convolutions only). Fused models have no BatchNorm, so both agree closely there.

    The forward runs on a `probe`×`probe` image (default: twice the largest stride, 64 for these models) and
    is scaled by (h·w)/probe²; with probe equal to a square imgsz the count is direct, with no scaling."""
    h, w = _pair(imgsz)
    p = probe if probe is not None else 2 * _max_stride(model)
    try:
        ref = next(model.parameters())
        dtype, device = ref.dtype, ref.device
    except StopIteration:
        dtype, device = torch.float32, torch.device("cpu")
    ch = 3
    yaml_dict = getattr(model, "yaml", None)
    if isinstance(yaml_dict, dict):
        ch = int(yaml_dict.get("ch", 3))
    macs, other = count_ops(model, torch.zeros(1, ch, p, p, dtype=dtype, device=device))
    return 2.0 * (macs + (other if published else 0)) * (h / p) * (w / p) / 1e9


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(all parameters, parameters that require grad): the published "parameters" and "gradients" columns.
    The DFL convolutions' 16 fixed weights count as parameters but not as gradients."""
    n_p = sum(p.numel() for p in model.parameters())
    n_g = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return n_p, n_g


def model_name(model: nn.Module) -> str:
    """The summary line's name: the yaml file stem (yolov9-s), else 'Model'."""
    yaml_file = getattr(model, "yaml_file", "") or ""
    return Path(str(yaml_file)).stem if yaml_file else "Model"


def model_summary(model: nn.Module, imgsz=640, *, gflops: float | None = None) -> str:
    """`<name> summary: L layers, P parameters, G gradients, F GFLOPs` (L = number of distinct sub-modules,
    as published). `gflops` skips the count when already known."""
    n_p, n_g = count_parameters(model)
    n_layers = len(list(model.modules()))
    if gflops is None:
        gflops = count_flops(model, imgsz)
    return f"{model_name(model)} summary: {n_layers} layers, {n_p} parameters, {n_g} gradients, {gflops:.1f} GFLOPs"


def _yaml_rows(model: nn.Module) -> list:
    yaml_dict = getattr(model, "yaml", None)
    if not isinstance(yaml_dict, dict):
        return []
    return list(yaml_dict.get("backbone") or []) + list(yaml_dict.get("head") or [])


def layer_table(model: nn.Module) -> str:
    """The published parse table: one row per yaml layer with index, from, n, params, module and arguments.

    Parameters are counted from the built layer. The arguments are the ones the layer was built with, as the
    published table prints them: channel modules `[c1, c2, ...]` (input channels first, c2 width-scaled),
    `nc` resolved, the head `[nc, [input channels]]`, `[None, 2, 'nearest']` for nn.Upsample (parse_model
    records them as `args`; a layer without that attribute shows its yaml row's arguments). n is the yaml
    row's number. A yaml `activation:` key is printed under the header (`activation: nn.ReLU()`), as published."""
    rows = _yaml_rows(model)
    lines = [f"{'':>3}{'from':>18}{'n':>3}{'params':>10}  {'module':<40}{'arguments':<30}"]
    yaml_dict = getattr(model, "yaml", None)
    act = yaml_dict.get("activation") if isinstance(yaml_dict, dict) else None
    if act:
        lines.append(f"activation: {act}")
    layers = getattr(model, "model", None)
    if layers is None:
        return lines[0]
    for idx, m in enumerate(layers):
        i = getattr(m, "i", idx)
        row = rows[i] if i < len(rows) else None
        f = getattr(m, "f", row[0] if row else -1)
        n = getattr(m, "n", row[1] if row else 1)
        t = getattr(m, "type", row[2] if row else type(m).__name__)
        args = getattr(m, "args", row[3] if row else [])
        n_params = sum(p.numel() for p in m.parameters())
        lines.append(f"{i:>3}{str(f):>18}{n:>3}{n_params:10.0f}  {str(t):<40}{str(args):<30}")
    return "\n".join(lines)
