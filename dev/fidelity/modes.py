"""What the two sides of the fidelity harness do alike in their modes, written once so that they measure alike.

ours_side.py runs in this checkout's Python and published_side.py inside the published checkout, in another
Python; both load this file (from this folder, as they load stats.py and probe.py). Plain torch + numpy (+
stats.py): no yolov9c and no published import, so that either side can load it.

    p, data, train, loss = parser(description, hyp_default)  # the arguments both sides take; a side adds its own
    a = parse(p, argv)                                       # (train: the `--` before the train_dual arguments)
    counts = AugmentCounts()                                 # wrap a pipeline's mosaic / mixup / copy_paste
    result.update(data_phases(sample, n, nc, counts))        # the data mode: mosaic on, then off
    loss_step(model, loss_fn, a, make_optimizer)             # the loss mode after the model and loss are built

Not a test: a developer tool (see dev/fidelity/compare_published.py).
"""

import argparse

import numpy as np
import torch

from stats import item_stats, summarize


def parser(description, hyp_default):
    """(parser, data, train, loss): the command line of both sides with the arguments they share; each side
    adds its own (ours: --save-batch and others, published: --weights) to the loss subparser."""
    hyp_help = "hyp yaml" + (" (default: the bundled hyp.scratch-high.yaml)" if hyp_default is None else "")
    p = argparse.ArgumentParser(description=description)
    sub = p.add_subparsers(dest="mode", required=True)
    d = sub.add_parser("data")
    d.add_argument("--data", required=True)
    d.add_argument("--hyp", default=hyp_default, help=hyp_help)
    d.add_argument("--img", type=int, default=640)
    d.add_argument("--n", type=int, default=400)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--min-items", type=int, default=0)
    d.add_argument("--out", required=True)
    t = sub.add_parser("train")
    t.add_argument("--record", default=None,
                   help="JSON of the per-iteration probe records (none: no probe, the loop runs unwrapped)")
    t.add_argument("rest", nargs=argparse.REMAINDER)
    i = sub.add_parser("init")
    i.add_argument("--cfg", required=True)
    i.add_argument("--nc", type=int, default=80)
    i.add_argument("--seeds", default="0,1,2")
    i.add_argument("--out", required=True)
    lo = sub.add_parser("loss")
    lo.add_argument("--cfg", required=True)
    lo.add_argument("--nc", type=int, default=80)
    lo.add_argument("--hyp", default=hyp_default, help=hyp_help)
    lo.add_argument("--batch", required=True, help="npz with imgs (B, 3, H, W) uint8 and targets (N, 6)")
    lo.add_argument("--lr", default="0.1,0.01,0.01", help="lr of groups 0 (biases), 1 (decayed), 2 (BN)")
    lo.add_argument("--momentum", type=float, default=0.937)
    lo.add_argument("--weight-decay", type=float, default=0.0005)
    lo.add_argument("--out", required=True)
    return p, d, t, lo


def parse(p, argv=None):
    """The parsed arguments; train's `rest` without the `--` that separates it."""
    a = p.parse_args(argv)
    if a.mode == "train" and a.rest and a.rest[0] == "--":
        a.rest = a.rest[1:]
    return a


def init_stats(build, seeds):
    """The initial weights of a freshly built model, per seed: {"params": {name: [[mean, std, numel], ...]},
    "bn": {name: [eps, momentum]}}. build() makes the model after torch.manual_seed(seed)."""
    import torch

    params, bn = {}, {}
    for seed in seeds:
        torch.manual_seed(seed)
        model = build()
        with torch.no_grad():
            for n, t in model.named_parameters():
                t = t.double()
                params.setdefault(n, []).append([float(t.mean()), float(t.std()) if t.numel() > 1 else 0.0,
                                                 t.numel()])
        bn = {n: [m.eps, m.momentum] for n, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)}
    return {"params": params, "bn": bn}


class AugmentCounts:
    """How often a pipeline makes a mosaic, a mixup and a copy-paste (and how many objects it pastes), counted
    by wrapping its functions: `D.mixup = counts.mixup(D.mixup)`. copy_paste takes (img, labels, ...) and
    returns (img, labels, segments) on both sides."""

    KEYS = ("mosaic", "mixup", "copy_paste_calls", "copy_paste_pasted")

    def __init__(self):
        self.n = dict.fromkeys(self.KEYS, 0)

    def reset(self):
        for k in self.KEYS:
            self.n[k] = 0

    def _calls(self, key, fn):
        def counted(*args, **kw):
            self.n[key] += 1
            return fn(*args, **kw)
        return counted

    def mosaic(self, fn):
        return self._calls("mosaic", fn)

    def mixup(self, fn):
        return self._calls("mixup", fn)

    def copy_paste(self, fn):
        def counted(img, labels, *args, **kw):
            n0 = len(labels)
            out = fn(img, labels, *args, **kw)
            self.n["copy_paste_calls"] += 1
            self.n["copy_paste_pasted"] += len(out[1]) - n0
            return out
        return counted

    def rates(self, samples):
        """Mosaics per sample, mixups per mosaic and pasted objects per mosaic since the last reset()."""
        n = self.n
        m = n["mosaic"] - n["mixup"]  # the primary mosaics (mixup builds a second one)
        return {"mosaic": m / samples, "mixup_given_mosaic": n["mixup"] / max(m, 1),
                "copy_paste_objects_per_mosaic": n["copy_paste_pasted"] / max(n["mosaic"], 1)}


def data_phases(sample, n, nc, counts):
    """{"on": ..., "off": ...}: summarize() of `n` augmented samples with mosaic on, then off, each with the
    augmentation rates of `counts` (an AugmentCounts wrapped around the pipeline). sample(k, on) -> the k-th
    sample's (img (3, H, W) uint8, labels (n, 6)) tensors with mosaic `on`."""
    result = {}
    for phase, on in (("on", True), ("off", False)):
        counts.reset()
        items = []
        for k in range(n):
            img, labels = sample(k, on)
            items.append(item_stats(img.numpy(), labels.numpy()))
        result[phase] = summarize(items, nc)
        result[phase]["rates"] = counts.rates(n)
    return result


def loss_step(model, loss_fn, a, make_optimizer):
    """The loss mode on a built train-mode `model` and its `loss_fn`: the loss of the batch a.batch (npz of
    uint8 imgs and targets), backward, then one SGD step of make_optimizer(lr of group 1) with a.lr per group
    after clipping the gradient norm to 10. Writes a.out (npz): loss and items, each parameter's gradient norm
    (-1: none), BatchNorm running statistics after the forward, the parameter names of each optimizer group
    and every parameter after the step (float64)."""
    b = np.load(a.batch)
    imgs = torch.from_numpy(b["imgs"]).float() / 255
    targets = torch.from_numpy(b["targets"]).float()
    pred = model(imgs)
    loss, items = loss_fn(pred, targets)
    loss.sum().backward()

    out = {"loss": loss.detach().double().numpy().reshape(-1), "items": items.detach().double().numpy()}
    out["grad_names"] = np.array([n for n, _ in model.named_parameters()])
    out["grad_norms"] = np.array([p.grad.double().norm().item() if p.grad is not None else -1.0
                                  for _, p in model.named_parameters()])
    for k, v in model.state_dict().items():
        if "running_" in k:
            out[f"bn::{k}"] = v.double().numpy()
    lrs = [float(x) for x in a.lr.split(",")]
    opt = make_optimizer(lrs[1])
    ids = {id(p): n for n, p in model.named_parameters()}
    for j, g in enumerate(opt.param_groups):
        g["lr"] = lrs[j]
        out[f"group{j}"] = np.array([ids[id(p)] for p in g["params"]])
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
    opt.step()
    for n, p in model.named_parameters():
        out[f"param::{n}"] = p.detach().double().numpy()
    np.savez(a.out, **out)
