"""Probe of cuDNN's fused convolution graphs at the yolov9-s GELAN shapes (issue 12, deliverable 3, first step):
for each pattern of yolov9c._C.cudnn_fusion_probe (listed in csrc/cudnn_fusion.c: conv + batch statistics,
scale-bias-SiLU prologue + conv / wgrad, dgrad + dSiLU [+ BN-backward sums], and their plain baselines) and
each shape, whether cuDNN's heuristics (mode A, then FALLBACK) give an engine config whose execution plan
finalizes. Nothing is executed or timed yet; `seconds` is the host time to build and plan (runtime-fusion
engines compile their kernels then).

Prints one JSON line per (shape, pattern): N C H W K R S stride dtype pattern supported status engines tried
mode workspace seconds, plus cudnn (the library version torch reports) and device. Exits 0 with a message when
there is no CUDA device; exits 1 with an `error:` line when yolov9c._C was built without cuDNN.

Run (GPU machine, after `python setup.py build_ext --inplace`, which finds the nvidia-cudnn wheel's headers):
    python benchmarks/probe_cudnn_fusion.py
    python benchmarks/probe_cudnn_fusion.py --batch 16 --dtype bfloat16 --shapes 64,160,160,64,3,1
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # runs from a checkout without installing
from yolov9c.ops import extension  # noqa: E402

# (C, H, W, K, R, stride) of GELAN convolutions of yolov9-s at 640x640 (R x R filters, padding R//2)
DEFAULT_SHAPES = [
    (64, 160, 160, 64, 3, 1),    # ELAN1 at stride 4
    (64, 160, 160, 128, 3, 2),   # the downsampling conv into stride 8
    (128, 80, 80, 128, 3, 1),    # RepNCSPELAN4 bottleneck convs at stride 8
    (64, 80, 80, 64, 3, 1),      # a RepNCSP inner conv
    (256, 40, 40, 256, 1, 1),    # RepNCSPELAN4 1x1 convs at stride 16
]


def parse_shape(text):
    parts = [int(p) for p in text.split(",")]
    if len(parts) != 6:
        raise argparse.ArgumentTypeError(f"shape {text!r}: want C,H,W,K,R,stride")
    return tuple(parts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    ap.add_argument("--shapes", type=parse_shape, nargs="+", default=DEFAULT_SHAPES, help="C,H,W,K,R,stride ...")
    args = ap.parse_args(argv)

    if not torch.cuda.is_available():
        print("probe_cudnn_fusion: no CUDA device: nothing to probe", file=sys.stderr)
        return 0
    C = extension.load()
    if C.build_info()["cudnn"] == "absent":
        print("error: yolov9c._C was built without cuDNN (build_info()['cudnn'] is 'absent'); rebuild with CUDA "
              "where the nvidia-cudnn wheel is installed, or with CUDNN_INCLUDE_DIR set: "
              "python setup.py build_ext --inplace", file=sys.stderr)
        return 1
    device = torch.cuda.current_device()
    torch.zeros(1, device=device)   # torch's context first: cuDNN then shares it
    common = dict(cudnn=torch.backends.cudnn.version(), device=torch.cuda.get_device_name(device),
                  built_against=C.build_info()["cudnn"])
    code = extension.dtype_code(getattr(torch, args.dtype))
    for c, h, w, k, r, stride in args.shapes:
        results = C.cudnn_fusion_probe((args.batch, c, h, w, k, r, r, stride), code, device)
        for pattern, res in results.items():
            row = dict(N=args.batch, C=c, H=h, W=w, K=k, R=r, S=r, stride=stride, dtype=args.dtype,
                       pattern=pattern, **res, **common)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
