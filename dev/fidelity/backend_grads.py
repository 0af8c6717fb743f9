"""Where do --backend c and --backend torch differ in one training step? (issue 13: c trains below torch)

A developer tool (GPU; runs on the CPU too, where both backends are float32). On identical weights and
identical augmented batches of a real dataset it computes the step's gradients four ways under fp16 autocast —
model torch or c × loss torch or c — and once in float32 (TF32 off, torch model and loss: the reference), each
with the loss multiplied by --scale as GradScaler does and divided out again. Per parameter tensor it reports
the relative error of each fp16 way against the reference (|g − g32| / |g32|) and their cosine, then per
parameter kind (conv weights, BN weights, BN biases, the heads' conv biases) the median error of each way; and the tensors where c's error most exceeds torch's. The loss items of each way come first.

    python dev/fidelity/backend_grads.py --data ../shared/data/coco128/data.yaml --cfg yolov9-s \\
        --img 320 --batch 16 --batches 3 --warm-steps 20 [--device 0] [--json out.jsonl]

--warm-steps N first trains the reference model N float32 SGD steps (lr 0.01, the same batches' augmentation
stream) so the weights are off their initialisation, where train-mode BatchNorm amplifies any rounding.
--weights RUN/weights/last.pt starts from a trained checkpoint instead (late training: sharp predictions, other
assignments, BatchNorm scales far from 1), e.g. the runs of bench_accuracy.py.
An fp16 path whose gradients are biased (not merely rounded) shows as a kind, or a few tensors, whose error is
many times torch's; rounding alone leaves c's and torch's errors alike. A bias smaller than the fp16 rounding
of one batch (~8 % per tensor for yolov9-s in train mode) shows in the "bias" figure: the error of the gradients
summed over --batches batches, which rounding shrinks about as 1/sqrt(batches) while a bias stays. --fp32 runs
the four ways in float32 (on CUDA: the c kernels' float32 paths), where rounding is ~1e-4 and a bias plain.

--assign compares, instead of gradients, the targets the two losses assign on identical predictions (each
model's fp16 maps under autocast, DetectionLoss.assignments): the c loss and the torch loss on the same maps,
and the torch loss on the maps cast to float32 (no fp16 decode) against it; per batch and head branch the
foreground counts, their overlap (Jaccard), the share of common foreground anchors assigned another box, and the
relative difference of the soft scores and of their sum (the loss's divisor). Issue 13: the loss swap put the
c − torch training gap on the loss while one step's gradients agree; a difference of assignment on fp16 maps
is what it would take.
"""

import argparse
import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402


def batches(a, nc):
    from yolov9c.data.dataset import DatasetConfig, YoloDataset
    from yolov9c.data.dataset_yaml import load_data_config
    from yolov9c.data.hyp import augment_hyp
    from yolov9c.data.loader import collate

    data = load_data_config(a.data)
    ds = YoloDataset(data["train"], DatasetConfig(img_size=a.img, augment=True, hyp=augment_hyp(a.hyp),
                                                  prefix="train: ", nc=nc, seed=a.seed, label_cache=False))
    n, k = len(ds), 0
    while True:
        items = [ds[((k + j) % n, (a.seed, k + j, 0, 0), True)] for j in range(a.batch)]
        k += a.batch
        imgs, targets, _, _ = collate(items)
        yield imgs, targets


def kind_of(name):
    """Parameter kind for the summary: bn weight / bn bias (every Conv's BatchNorm), conv weight, head bias (the
    only plain conv biases: the detection heads' last convs)."""
    tail = name.rsplit(".", 1)[-1]
    if ".bn." in name:
        return "bn weight" if tail == "weight" else "bn bias"
    return "conv weight" if tail == "weight" else "head bias"


def grads(model, loss_fn, imgs, targets, amp, scale, device, dtype=torch.float32):
    for p in model.parameters():
        p.grad = None
    x = imgs.to(device).to(dtype) / 255
    if getattr(model, "_fmt", None) is not None:
        x = x.contiguous(memory_format=model._fmt)
    with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
        preds = model(x)
        loss, items = loss_fn(preds, targets.to(device, dtype))
    (loss * scale).backward()
    g = {n: (p.grad.double() / scale if p.grad is not None else None) for n, p in model.named_parameters()}
    return g, items.float().cpu().numpy(), bool(all(v is None or torch.isfinite(v).all() for v in g.values()))


def assign_diff(a, b):
    """How far assignment a is from b (DetectionLoss.assignments entries of one branch)."""
    fa, fb = a["fg"], b["fg"]
    both = fa & fb
    moved = (a["boxes"] - b["boxes"]).abs().amax(-1) > 1e-3
    na, nb = a["norm"].double(), b["norm"].double()
    return {"fg_a": int(fa.sum()), "fg_b": int(fb.sum()),
            "jaccard": float(both.sum() / (fa | fb).sum().clamp_min(1)),
            "other_box": float((moved & both).sum() / both.sum().clamp_min(1)),
            "norm_rel": float((na - nb).abs().sum() / nb.abs().sum().clamp_min(1e-30)),
            "tss_rel": float(na.sum() / nb.sum().clamp_min(1e-30) - 1.0)}


@torch.no_grad()
def assignments(model, losses, imgs, targets, amp, device):
    """{name: assignments} of one batch: the model's maps under autocast, assigned by each loss; 'torch fp32' is
    the torch loss on the maps cast to float32."""
    x = imgs.to(device).float() / 255
    if getattr(model, "_fmt", None) is not None:
        x = x.contiguous(memory_format=model._fmt)
    with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
        preds = model(x)
    t = targets.to(device)
    out = {name: fn.assignments(preds, t) for name, fn in losses.items()}
    maps = preds[1] if isinstance(preds, tuple) else preds
    up = [[m.float() for m in br] for br in maps] if isinstance(maps[0], (list, tuple)) else [m.float() for m in maps]
    out["torch fp32"] = losses["torch"].assignments(up, t)
    return out


def compare_assignments(a, models, losses, stream, amp, device, out):
    """--assign: per batch and branch, c against torch and torch fp32 against torch, on each model's maps."""
    print("| batch | model | branch | pair | fg (first / second) | Jaccard | other box | soft score diff | "
          "score sum diff |\n|---|---|---|---|---|---|---|---|---|")
    for bi in range(a.batches):
        imgs, targets = next(stream)
        for mname, model in models.items():
            got = assignments(model, losses, imgs, targets, amp, device)
            for k in range(len(got["torch"])):
                branch = ("aux", "main")[k] if len(got["torch"]) == 2 else "main"
                for pair in (("c", "torch"), ("torch fp32", "torch")):
                    d = assign_diff(got[pair[0]][k], got[pair[1]][k])
                    print(f"| {bi} | {mname} | {branch} | {pair[0]} vs {pair[1]} | {d['fg_a']} / {d['fg_b']} | "
                          f"{d['jaccard']:.4f} | {d['other_box']:.4f} | {d['norm_rel']:.2e} | {d['tss_rel']:+.2e} |")
                    if out:
                        out.write(json.dumps({"kind": "assign", "batch": bi, "model": mname, "branch": branch,
                                              "pair": list(pair), **d}) + "\n")


def rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def cos(a, b):
    return float((a.flatten() @ b.flatten()) / (a.norm() * b.norm()).clamp_min(1e-30))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "coco128" / "data.yaml"))
    p.add_argument("--cfg", default="yolov9-s")
    p.add_argument("--nc", type=int, default=None, help="classes (default: the dataset's)")
    p.add_argument("--hyp", default=None)
    p.add_argument("--img", type=int, default=320)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--warm-steps", type=int, default=20)
    p.add_argument("--weights", default=None,
                   help="start from this checkpoint (a trained run's last.pt) instead of --cfg and --warm-steps")
    p.add_argument("--scale", type=float, default=2.0 ** 13, help="loss scale of the fp16 ways (GradScaler's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="0")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--fp32", action="store_true", help="the four ways without autocast (float32 kernels of both)")
    p.add_argument("--assign", action="store_true",
                   help="compare the two losses' assignments on identical maps instead of the gradients")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)

    from yolov9c.api import build_model
    from yolov9c.backends import apply
    from yolov9c.data.dataset_yaml import load_data_config
    from yolov9c.loss.detection import make_loss
    from yolov9c.resources import load_hyp

    device = torch.device("cpu" if a.device == "cpu" else f"cuda:{a.device}")
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    nc = a.nc or load_data_config(a.data)["nc"]
    hyp = load_hyp(a.hyp)
    torch.manual_seed(a.seed)
    if a.weights:  # trained weights (e.g. a run's last.pt, EMA preferred): late training instead of warm steps
        from yolov9c.api import load_model

        ref = load_model(a.weights).to(device).train()
        if ref.nc != nc:
            raise SystemExit(f"--weights {a.weights}: a model of {ref.nc} classes, --data has {nc}")
        print(f"weights: {a.weights} (warm steps skipped)")
    else:
        ref = build_model(a.cfg, nc=nc).to(device).train()
    ref.hyp = hyp
    stream = batches(a, nc)
    loss_t = make_loss(ref, hyp, backend="torch")
    if a.warm_steps and not a.weights:
        opt = torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9, nesterov=True)
        for _ in range(a.warm_steps):
            imgs, targets = next(stream)
            grads(ref, loss_t, imgs, targets, False, 1.0, device)
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 10.0)
            opt.step()
    fmt = torch.channels_last if device.type == "cuda" else None
    models = {}
    for backend in ("torch", "c"):
        m = copy.deepcopy(ref)
        if fmt is not None:
            m = m.to(memory_format=fmt)
        m._fmt = fmt
        models[backend] = apply(m, backend)
    losses = {b: make_loss(models["torch"], hyp, backend=b) for b in ("torch", "c")}
    if a.assign:
        out = open(a.json, "a") if a.json else None
        compare_assignments(a, models, losses, stream, device.type == "cuda" and not a.fp32, device, out)
        if out:
            out.close()
        return 0
    ref64 = copy.deepcopy(ref).double()
    amp = device.type == "cuda" and not a.fp32
    # (name, model, loss, autocast): the float32 torch way shows what plain float32 rounding costs
    ways = [("float32 torch", ref, loss_t, False), ("model torch, loss torch", models["torch"], losses["torch"], amp),
            ("model torch, loss c", models["torch"], losses["c"], amp),
            ("model c, loss torch", models["c"], losses["torch"], amp),
            ("model c, loss c", models["c"], losses["c"], amp)]
    errs = {w[0]: {} for w in ways}
    coss = {w[0]: {} for w in ways}
    scale_err = {w[0]: {} for w in ways}  # |g| / |g64| − 1 per batch: a shrinking or growing path, signed
    drift = {w[0]: {} for w in ways}  # Σ over batches of (g − g64): rounding averages out, a bias does not
    ref_norm = {}  # Σ over batches of |g64|
    out = open(a.json, "a") if a.json else None
    for bi in range(a.batches):
        imgs, targets = next(stream)
        g64, items64, _ = grads(ref64, make_loss(ref64, hyp, backend="torch"), imgs, targets, False, 1.0, device,
                                torch.float64)
        print(f"batch {bi}: {targets.shape[0]} boxes; float64 loss items {np.round(items64, 6).tolist()}")
        for name, model, loss_fn, autocast in ways:
            scale = a.scale if autocast else 1.0
            while True:
                g, items, finite = grads(model, loss_fn, imgs, targets, autocast, scale, device)
                if finite or scale < 2:
                    break
                scale /= 2
            print(f"  {name}: loss items {np.round(items, 6).tolist()} (scale {scale:g}{'' if finite else ', inf'})")
            for n, v in g.items():
                if v is not None and g64[n] is not None and g64[n].norm() > 0:
                    errs[name].setdefault(n, []).append(rel(v, g64[n]))
                    coss[name].setdefault(n, []).append(cos(v, g64[n]))
                    drift[name][n] = drift[name].get(n, 0) + (v - g64[n])
                    scale_err[name].setdefault(n, []).append(float(v.norm() / g64[n].norm()) - 1.0)
        for n, v in g64.items():
            if v is not None:
                ref_norm[n] = ref_norm.get(n, 0.0) + float(v.norm())
    names = list(errs[ways[0][0]])
    kinds = sorted({kind_of(n) for n in names})
    bias = {w[0]: {n: float(drift[w[0]][n].norm()) / max(ref_norm[n], 1e-30) for n in names} for w in ways}
    print("\nmedian over the kind's tensors of the per-batch error (err) and of the error of the sum over the "
          f"{a.batches} batches (bias: |Σ(g − g64)| / Σ|g64|; rounding shrinks it ~1/√batches, a bias does not)")
    print("and the mean of |g| / |g64| − 1 (norm: rounding makes it ≈ +err²/2, a path that shrinks or grows its "
          "gradients shows a sign)")
    print("| parameter kind | tensors | " + " | ".join(f"err / bias / norm: {w[0]}" for w in ways) + " |")
    print("|---|---|" + "---|" * len(ways))
    for k in kinds + ["all"]:
        sel = [n for n in names if k == "all" or kind_of(n) == k]
        med = [float(np.median([np.mean(errs[w[0]][n]) for n in sel])) for w in ways]
        smean = [float(np.mean([np.mean(scale_err[w[0]][n]) for n in sel])) for w in ways]
        bmed = [float(np.median([bias[w[0]][n] for n in sel])) for w in ways]
        print(f"| {k} | {len(sel)} | " + " | ".join(f"{v:.2e} / {b:.2e} / {m:+.2e}"
                                                    for v, b, m in zip(med, bmed, smean)) + " |")
        if out:
            out.write(json.dumps({"kind": k, "tensors": len(sel), "err": {w[0]: v for w, v in zip(ways, med)},
                                  "bias": {w[0]: b for w, b in zip(ways, bmed)},
                                  "norm": {w[0]: m for w, m in zip(ways, smean)}}) + "\n")
    ratio = {n: np.mean(errs["model c, loss c"][n]) / max(np.mean(errs["model torch, loss torch"][n]), 1e-30)
             for n in names}
    print(f"\nthe {a.top} tensors with the largest err(c, c) / err(torch, torch):")
    print("| parameter | err torch | err c | ratio | cos torch | cos c |\n|---|---|---|---|---|---|")
    for n in sorted(names, key=lambda n: -ratio[n])[:a.top]:
        et, ec = np.mean(errs["model torch, loss torch"][n]), np.mean(errs["model c, loss c"][n])
        ct, cc = np.mean(coss["model torch, loss torch"][n]), np.mean(coss["model c, loss c"][n])
        print(f"| {n} | {et:.2e} | {ec:.2e} | {ratio[n]:.1f} | {ct:.5f} | {cc:.5f} |")
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
