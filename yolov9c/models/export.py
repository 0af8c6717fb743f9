"""Export a trained model to ONNX and check the exported file against the torch model.

    path = export_onnx(model, "best.onnx", imgsz=(640, 640))          # model: eval mode, fused, float32
    report = check_onnx(model, path, images)                          # images: (N, 3, H, W) float in [0, 1]

The graph takes `images` (B, 3, H, W) float32 RGB in [0, 1] (letterboxed, as detect_dual.py feeds it) and
returns `output0` (B, 4 + nc, A): the main head's decoded predictions (xywh input pixels, sigmoid class scores,
before NMS), what the published code takes from a forward (`pred[0][1]` of DualDDetect, `pred[0]` of DDetect).
The auxiliary PGI head has no path to it and is dropped. H and W are fixed (anchors are built for one size);
`dynamic=True` frees the batch. Metadata `stride` and `names`, as published.
Optional dependencies (`pip install "yolov9c[export]"`): onnx (the TorchScript-based torch.onnx exporter needs
nothing else) and onnxruntime (check_onnx); a missing one raises ExportDependencyError naming the pip command.
Test: python -m pytest -q tests/models/test_export.py
"""

from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

PIP_HINT = 'pip install "yolov9c[export]"  (or: pip install onnx onnxruntime)'
# check_onnx judges the output (B, 4 + nc, A) per part: boxes (rows 0-3, xywh in input pixels) absolutely in
# pixels plus a share of the coordinate, class scores (sigmoid, in [0, 1]) absolutely. float32 on the CPU
# reorders sums (convolution algorithms, fused ops in onnxruntime), and the rounding grows with the weights
# of a trained model: one share of the whole output's scale was too tight for trained models and meaningless
# for scores (a 640-pixel box scale makes any score error look small). A wrong graph (a missing layer, wrong
# anchors or strides, other weights) is off by pixels and by tenths of a score: far outside these bounds.
BOX_ATOL_PX = 0.05   # pixels
BOX_RTOL = 1e-4      # of |coordinate|: 0.064 px more at 640
SCORE_ATOL = 5e-4    # absolute, on scores in [0, 1]


class ExportDependencyError(ImportError):
    """onnx or onnxruntime is not installed; the message names the pip command."""


class ExportError(RuntimeError):
    """The export failed or its output does not match the torch model."""


def require(module: str):
    """Import optional dependency `module` or raise ExportDependencyError with the pip command."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ExportDependencyError(f"{module} is not installed ({e}); install it with: {PIP_HINT}") from None


class MainHeadOutput(nn.Module):
    """model's forward reduced to the main head's decoded predictions (B, 4 + nc, A): the exported graph."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        y = self.model(x)
        y = y[0] if isinstance(y, tuple) else y          # eval forward: (predictions, raw maps)
        return y[-1] if isinstance(y, (list, tuple)) else y  # DualDDetect: [aux, main]


def _names(model) -> list:
    names = getattr(model, "names", None)
    nc = int(getattr(model, "nc", 0) or 0)
    return list(names) if names is not None else [str(i) for i in range(nc)]


def num_anchors(model: nn.Module, imgsz) -> int:
    """A of the output (B, 4 + nc, A) at imgsz (h, w): one anchor per cell of every level."""
    return sum((int(imgsz[0]) // int(s)) * (int(imgsz[1]) // int(s)) for s in model.stride.tolist())


def export_onnx(model: nn.Module, path, imgsz=(640, 640), batch: int = 1, opset: int = 17,
                dynamic: bool = False) -> Path:
    """Write `model` (a DetectionModel in eval mode, on its device, fused or not) as ONNX to `path` and
    check the graph with onnx.checker. imgsz: (h, w), multiples of the model's largest stride. The file is
    written to a temporary name first and renamed, so a failed export leaves nothing behind; the file's mode
    is a normally written file's (0666 less the umask).
    Returns the path. Raises ExportDependencyError without onnx, ExportError when torch cannot export."""
    onnx = require("onnx")
    h, w = int(imgsz[0]), int(imgsz[1])
    stride = max(int(model.stride.max()), 32) if hasattr(model, "stride") else 32
    if h % stride or w % stride or h <= 0 or w <= 0:
        raise ExportError(f"image size {h}x{w} must be a positive multiple of the model stride {stride}")
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    sample = torch.zeros(batch, 3, h, w, device=device, dtype=dtype)
    wrapped = MainHeadOutput(model).eval()
    path = Path(path)
    # a fresh name that torch.onnx.export creates itself, so the file gets a normally written file's mode
    # (0666 less the umask; mkstemp would make it 0600)
    tmp = str(path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp")
    try:
        axes = {"images": {0: "batch"}, "output0": {0: "batch"}} if dynamic else None
        with torch.no_grad(), warnings.catch_warnings():
            # the TorchScript exporter warns that it is the legacy one, and the tracer that the head's
            # anchors are built from Python numbers: both expected (fixed H and W, see the module doc)
            warnings.simplefilter("ignore")
            # one forward first fills the head's anchor cache for this size: the traced graph then holds the
            # anchors as constants and nothing reads the auxiliary maps, so the aux branch is dropped
            wrapped(sample)
            torch.onnx.export(wrapped, (sample,), tmp, opset_version=opset, input_names=["images"],
                              output_names=["output0"], dynamic_axes=axes, do_constant_folding=True,
                              dynamo=False)
        graph = onnx.load(tmp)
        onnx.checker.check_model(graph)
        meta = {"stride": str(stride), "names": str(dict(enumerate(_names(model))))}
        for k, v in meta.items():
            entry = graph.metadata_props.add()
            entry.key, entry.value = k, v
        onnx.save(graph, tmp)
        os.replace(tmp, path)
    except (RuntimeError, ValueError, TypeError) as e:
        # torch's message can carry the traced graph (hundreds of lines): its first line says what failed
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ExportError(f"ONNX export failed: {first}") from e
    except OSError as e:  # a read-only weights folder, a full disk: its reason, not the temp file's traceback
        raise ExportError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def check_onnx(model: nn.Module, path, images: torch.Tensor) -> dict:
    """Run `images` (N, 3, H, W) float in [0, 1] through the torch model and the ONNX file (onnxruntime,
    CPU) one image at a time (a file exported without dynamic batch takes batch 1) and compare the outputs.

    Returns {"images": N, "box_px": max |diff| of the boxes in pixels, "score": max |diff| of the class
    scores, "box_bound_px": the largest allowed box difference}. Raises ExportError when a box element
    differs by more than BOX_ATOL_PX + BOX_RTOL·|torch| pixels or a score by more than SCORE_ATOL,
    ExportDependencyError without onnxruntime. Test: tests/models/test_export.py::test_check_tolerance_is_per_part."""
    ort = require("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    batch_dim = session.get_inputs()[0].shape[0]
    step = len(images) if not isinstance(batch_dim, int) else batch_dim
    device = next(model.parameters()).device
    wrapped = MainHeadOutput(model).eval()
    refs, outs = [], []
    with torch.no_grad():
        for i in range(0, len(images) - step + 1, step):
            x = images[i:i + step].float()
            refs.append(wrapped(x.to(device)).float().cpu().numpy())
            outs.append(session.run(["output0"], {"images": x.cpu().numpy()})[0])
    if not refs:
        raise ExportError(f"check_onnx: {len(images)} image(s) do not fill one batch of {step}")
    ref, out = np.concatenate(refs), np.concatenate(outs)
    if ref.shape != out.shape:
        raise ExportError(f"ONNX output shape {out.shape} differs from the torch model's {ref.shape}")
    return compare_outputs(ref, out)


def compare_outputs(ref: np.ndarray, out: np.ndarray) -> dict:
    """check_onnx's judgement of `out` against `ref`, both (N, 4 + nc, A): see check_onnx."""
    diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    box, score = diff[:, :4], diff[:, 4:]
    box_bound = BOX_ATOL_PX + BOX_RTOL * np.abs(ref[:, :4].astype(np.float64))
    report = {"images": int(ref.shape[0]), "box_px": float(box.max(initial=0.0)),
              "score": float(score.max(initial=0.0)), "box_bound_px": float(box_bound.max(initial=0.0))}
    bad_box, bad_score = bool((box > box_bound).any()), bool((score > SCORE_ATOL).any())
    if bad_box or bad_score:
        raise ExportError(f"ONNX output differs from the torch model: boxes by up to {report['box_px']:.3g} px "
                          f"(allowed {BOX_ATOL_PX:g} px + {BOX_RTOL:g}·|x|), class scores by up to "
                          f"{report['score']:.3g} (allowed {SCORE_ATOL:g})")
    return report
