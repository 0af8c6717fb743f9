"""Probe and timing of cuDNN's fused convolution graphs at the yolov9-s GELAN shapes (issue 12, deliverable 3).

Probe (default): for each pattern of yolov9c._C.cudnn_fusion_probe (listed in csrc/cudnn_fusion.c: conv + batch
statistics, scale-bias-SiLU prologue + conv / wgrad, dgrad + dSiLU [+ BN-backward sums], their plain baselines
and the documented ConvBNfprop/ConvBNwgrad controls) and each shape, whether cuDNN's heuristics (mode A, then
FALLBACK) give an engine config whose execution plan finalizes. `seconds` is the host time to build and plan
(runtime-fusion engines compile their kernels then). One JSON line per (shape, pattern): N C H W K R S stride
dtype pattern supported status engines tried mode workspace seconds, plus cudnn (the library version torch
reports) and device.

--time: for each shape, each fused pattern of TIMED (conv + BN statistics, dgrad + dSiLU + BN-backward sums,
SiLU prologue + conv [+ statistics]) is run through yolov9c._C.cudnn_fusion_time (workspace from
torch's allocator, torch's current stream, CUDA-event mean over --iters after one untimed run) against its
unfused equivalent made of what the c backend runs today: cuDNN convolutions through torch (F.conv2d,
aten.convolution_backward on channels-last tensors) and yolov9c's BN/SiLU kernels (bn_stats, bn_silu,
bn_silu_backward), timed the same way. Each fused result is checked once against the unfused one (max abs / max
rel error per output, `ok` when every error is within its fp16 tolerance). One JSON line per (shape, pattern):
pattern, status, fused_ms, unfused_ms, speedup (unfused / fused), covers (what the fused graph leaves out),
errors, ok; then a markdown table. A pattern that does not plan prints its status and no times.

Exits 0 with a message when there is no CUDA device; exits 1 with an `error:` line when yolov9c._C was built
without cuDNN.

Run (GPU machine, after `python setup.py build_ext --inplace`, which finds the nvidia-cudnn wheel's headers):
    python benchmarks/probe_cudnn_fusion.py
    python benchmarks/probe_cudnn_fusion.py --batch 16 --dtype bfloat16 --shapes 64,160,160,64,3,1
    python benchmarks/probe_cudnn_fusion.py --time --shapes 64,160,160,64,3,1 128,80,80,128,3,1
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # runs from a checkout without installing
from yolov9c.ops import extension  # noqa: E402
from yolov9c.ops.bn_silu import bn_silu, bn_silu_backward, bn_stats  # noqa: E402
from yolov9c.ops.cudnn_fusion import time_pattern  # noqa: E402
from gpu_timing import events_ms  # noqa: E402

EPS = 1e-3   # yolov9's BatchNorm2d eps

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


# ---------------------------------------------------------------- --time: fused against unfused

# fp16 tolerances of each checked output, as max |fused - unfused| / max |unfused| (a norm-wise relative error:
# element-wise it is meaningless near zero): one fp16 rounding of the outputs plus fp32 summation order
TOL = {"y": 1e-2, "dv": 1e-2, "mean": 1e-2, "invstd": 1e-2, "dbias": 1e-2, "dweight": 1e-2}


def cuda_ms(fn, iters):
    """Mean ms of fn() over `iters` calls on the current stream, after one untimed call."""
    fn()
    return events_ms(fn, iters) / iters


def error(got, want):
    """(max abs error, max abs error / max |want|) in float64."""
    d = (got.double() - want.double()).abs().max().item()
    scale = want.double().abs().max().item()
    return d, d / scale if scale > 0 else float("inf")


def cl(t):
    return t.contiguous(memory_format=torch.channels_last)


def make_case(n, c, h, w, k, r, stride, dtype):
    """Inputs of one shape: x (doubles as z, the producer's pre-BN output), w, dy, and z's BN folded into
    per-channel fp32 scale/bias from its batch statistics (yolov9c's bn_stats)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    pad = r // 2
    ho, wo = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - r) // stride + 1
    g = torch.Generator(device=dev).manual_seed(0)
    x = cl((torch.randn(n, c, h, w, device=dev, generator=g) * 2.0 + 0.5).to(dtype))
    wt = cl((torch.randn(k, c, r, r, device=dev, generator=g) / (c * r * r) ** 0.5).to(dtype))
    dy = cl((torch.randn(n, k, ho, wo, device=dev, generator=g) * 1e-2).to(dtype))
    mean, invstd = bn_stats(x, eps=EPS)
    weight = torch.rand(c, device=dev, generator=g) + 0.5
    bias = torch.randn(c, device=dev, generator=g) * 0.1
    scale = (weight * invstd).contiguous()
    shift = (bias - mean * scale).contiguous()
    return dict(conv=(n, c, h, w, k, r, r, stride), x=x, w=wt, dy=dy, mean=mean, invstd=invstd, weight=weight,
                bias=bias, scale=scale, shift=shift, stride=stride, pad=pad, ho=ho, wo=wo)


def torch_conv(cs, a):
    return F.conv2d(a, cs["w"], None, cs["stride"], cs["pad"])


def torch_dgrad(cs):
    return torch.ops.aten.convolution_backward(cs["dy"], cs["x"], cs["w"], None, [cs["stride"]] * 2, [cs["pad"]] * 2,
                                               [1, 1], False, [0, 0], 1, [True, False, False])[0]


def time_conv_stats(cs, pattern, iters):
    """conv_genstats / conv_reduction against F.conv2d + bn_stats; checks y, and mean/invstd from the sums."""
    x, k = cs["x"], cs["conv"][4]
    y = cl(torch.empty(cs["conv"][0], k, cs["ho"], cs["wo"], device=x.device, dtype=x.dtype))
    s, sq = torch.empty(k, device=x.device), torch.empty(k, device=x.device)
    out = time_pattern(cs["conv"], pattern, (x, cs["w"], y, s, sq), iters)
    row = dict(covers="y, sum(y), sum(y^2) (BN statistics in the conv epilogue)")
    conv_ms = cuda_ms(lambda: torch_conv(cs, x), iters)
    yr = torch_conv(cs, x)
    stats_ms = cuda_ms(lambda: bn_stats(yr, eps=EPS), iters)
    row.update(unfused_parts={"conv": conv_ms, "bn_stats": stats_ms})
    if out["status"] != "ok":
        return out, row
    mean_r, invstd_r = bn_stats(yr, eps=EPS)
    m = y.numel() // k
    mean = s / m
    invstd = torch.rsqrt((sq / m - mean * mean).clamp_min(0) + EPS)
    row["errors"] = {"y": error(y, yr), "mean": error(mean, mean_r), "invstd": error(invstd, invstd_r)}
    # a sum written n + 1 times instead of once (accumulated over the untimed and timed runs) shows as a ratio
    row["sum_ratio"] = (s.double() / yr.double().sum((0, 2, 3))).median().item()
    return out, row


def time_dgrad_dswish_stats(cs, pattern, iters):
    """dgrad + dSiLU + BN-backward sums against aten.convolution_backward + bn_silu_backward; checks dv and the
    dweight/dbias that follow from the sums."""
    x = cs["x"]
    dv = torch.empty_like(x)
    dv_sum, dvz_sum = torch.empty_like(cs["mean"]), torch.empty_like(cs["mean"])
    tensors = (cs["dy"], cs["w"], x, cs["scale"], cs["shift"], dv, dv_sum, dvz_sum)
    out = time_pattern(cs["conv"], pattern, tensors, iters)
    row = dict(covers="dv, sum(dv), sum(dv*z); not dz (the unfused bn_silu_backward also writes dz: one more "
                      "pass reading dv and z)")
    dgrad_ms = cuda_ms(lambda: torch_dgrad(cs), iters)
    dx = torch_dgrad(cs)
    bn_args = (x, cs["mean"], cs["invstd"], cs["weight"], cs["bias"], dx)
    bn_ms = cuda_ms(lambda: bn_silu_backward(*bn_args), iters)
    row.update(unfused_parts={"dgrad": dgrad_ms, "bn_silu_backward": bn_ms})
    if out["status"] != "ok":
        return out, row
    _, dweight, dbias = bn_silu_backward(*bn_args)
    u = x.float() * cs["scale"].view(1, -1, 1, 1) + cs["shift"].view(1, -1, 1, 1)
    sg = torch.sigmoid(u)
    dv_ref = dx.float() * sg * (1 + u * (1 - sg))
    dweight_f = cs["invstd"] * (dvz_sum - cs["mean"] * dv_sum)
    row["errors"] = {"dv": error(dv, dv_ref), "dbias": error(dv_sum, dbias), "dweight": error(dweight_f, dweight)}
    return out, row


def time_ssa_conv(cs, pattern, iters):
    """SiLU(scale*z + bias) prologue + conv [+ statistics of y] against bn_silu + F.conv2d [+ bn_stats];
    checks y [and mean/invstd from the sums]."""
    x, k = cs["x"], cs["conv"][4]
    stats = "genstats" in pattern
    y = cl(torch.empty(cs["conv"][0], k, cs["ho"], cs["wo"], device=x.device, dtype=x.dtype))
    s, sq = torch.empty(k, device=x.device), torch.empty(k, device=x.device)
    tensors = (x, cs["scale"], cs["shift"], cs["w"], y) + ((s, sq) if stats else ())
    out = time_pattern(cs["conv"], pattern, tensors, iters)
    row = dict(covers="y = conv(silu(scale*z + bias))" + (", sum(y), sum(y^2)" if stats else "")
               + "; the activation never stored")
    bn_args = (x, cs["mean"], cs["invstd"], cs["weight"], cs["bias"])
    bn_ms = cuda_ms(lambda: bn_silu(*bn_args), iters)
    a = bn_silu(*bn_args)
    conv_ms = cuda_ms(lambda: torch_conv(cs, a), iters)
    yr = torch_conv(cs, a)
    row.update(unfused_parts={"bn_silu": bn_ms, "conv": conv_ms})
    if stats:
        row["unfused_parts"]["bn_stats"] = cuda_ms(lambda: bn_stats(yr, eps=EPS), iters)
    if out["status"] != "ok":
        return out, row
    row["errors"] = {"y": error(y, yr)}
    if stats:
        mean_r, invstd_r = bn_stats(yr, eps=EPS)
        m = y.numel() // k
        mean = s / m
        invstd = torch.rsqrt((sq / m - mean * mean).clamp_min(0) + EPS)
        row["errors"].update(mean=error(mean, mean_r), invstd=error(invstd, invstd_r))
    return out, row


TIMED = {
    "conv_genstats": time_conv_stats,
    "conv_reduction": time_conv_stats,
    "dgrad_dswish_stats": time_dgrad_dswish_stats,
    "ssa_conv": time_ssa_conv,
    "ssa_conv_io": time_ssa_conv,
    "ssa_conv_genstats": time_ssa_conv,
    "ssa_conv_genstats_io": time_ssa_conv,
}


def time_shape(args, shape, dtype):
    """One JSON row per TIMED pattern at `shape`."""
    c, h, w, k, r, stride = shape
    cs = make_case(args.batch, c, h, w, k, r, stride, dtype)
    plain = {}
    for name, tensors in (("conv_fprop", (cs["x"], cs["w"], torch.empty_like(cs["dy"]))),
                          ("dgrad", (cs["dy"], cs["w"], torch.empty_like(cs["x"])))):
        res = time_pattern(cs["conv"], name, tensors, args.iters)
        plain[name] = res["ms"] if res["status"] == "ok" else res["status"]
    rows = []
    for pattern, fn in TIMED.items():
        with torch.no_grad():
            out, row = fn(cs, pattern, args.iters)
        unfused_ms = sum(row["unfused_parts"].values())
        errors = row.get("errors", {})
        ok = all(rel <= TOL[name] for name, (_, rel) in errors.items()) if errors else None
        full = dict(N=args.batch, C=c, H=h, W=w, K=k, R=r, stride=stride, dtype=args.dtype, pattern=pattern,
                    status=out["status"], fused_ms=out["ms"], unfused_ms=unfused_ms,
                    speedup=unfused_ms / out["ms"] if out["ms"] else None, ok=ok, workspace=out["workspace"],
                    mode=out["mode"], plan_seconds=out["seconds"],
                    plain_cudnn_ms=plain["dgrad" if pattern.startswith("dgrad") else "conv_fprop"], **row)
        print(json.dumps(full), flush=True)
        rows.append(full)
    return rows


def fmt(v, digits=3):
    return "—" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def markdown(rows):
    lines = ["| N×C×H×W → K, R, stride | pattern | status | fused ms | unfused ms (parts) | plain cuDNN ms | "
             "speedup | correct (max rel err) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        parts = " + ".join(f"{k} {v:.3f}" for k, v in r["unfused_parts"].items())
        worst = max((rel for _, rel in r.get("errors", {}).values()), default=None)
        correct = "—" if r["ok"] is None else f"{'yes' if r['ok'] else 'NO'} ({worst:.1e})"
        status = r["status"] if len(r["status"]) <= 40 else r["status"][:37] + "..."
        shape = f"{r['N']}×{r['C']}×{r['H']}×{r['W']} → {r['K']}, {r['R']}, {r['stride']}"
        lines.append(f"| {shape} | {r['pattern']} | {status} | {fmt(r['fused_ms'])} | {r['unfused_ms']:.3f} "
                     f"({parts}) | {fmt(r['plain_cudnn_ms'])} | {fmt(r['speedup'], 2)} | {correct} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    ap.add_argument("--shapes", type=parse_shape, nargs="+", default=DEFAULT_SHAPES, help="C,H,W,K,R,stride ...")
    ap.add_argument("--time", action="store_true", help="time the fused patterns against the unfused path")
    ap.add_argument("--iters", type=int, default=20, help="timed runs per pattern (--time)")
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
    if args.time:
        rows = [row for shape in args.shapes for row in time_shape(args, shape, getattr(torch, args.dtype))]
        print(markdown(rows), flush=True)
        return 0
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
