"""cuDNN fused-convolution graphs (csrc/cudnn_fusion.c), timed on torch tensors: the one Python entry point of
`yolov9c._C.cudnn_fusion_time`, used by benchmarks/probe_cudnn_fusion.py and tests/test_cudnn_fusion.py.
Not used by training (issue 12: only the conv + statistics epilogue measured faster; not adopted yet).
"""

from __future__ import annotations

import torch

from . import extension


def time_pattern(conv, pattern, tensors, iters):
    """Plan `pattern` for conv = (N, C, H, W, K, R, S, stride), bind `tensors` (CUDA, channels-last, the
    pattern's order), run it `iters` times on the current stream: the binding's result dict (status, ms,
    plan, workspace, mode, seconds). The workspace comes from torch's allocator, grown once when the plan
    asks for more than it was given."""
    C = extension.load()
    device = tensors[0].device
    args = tuple(extension.arg(t) for t in tensors)
    stream, code = extension.stream_of(device), extension.dtype_code(tensors[0].dtype)
    ws = torch.empty(0, dtype=torch.uint8, device=device)
    out = C.cudnn_fusion_time(conv, code, pattern, args, extension.arg(ws), stream, iters)
    if out["status"].startswith("workspace:"):
        ws = torch.empty(out["workspace"], dtype=torch.uint8, device=device)
        out = C.cudnn_fusion_time(conv, code, pattern, args, extension.arg(ws), stream, iters)
    return out
