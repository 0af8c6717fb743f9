"""Per-iteration probe of a running training loop, shared by both sides of the fidelity harness.

The loss function is the one call both training loops make once per iteration, after the warm-up has set the
learning rates and the accumulation count and before backward. `wrap_loss(loss_fn, records)` returns a callable
that, on every call, finds the training loop's frame up the stack and records what the loop holds at that point:

    ni, epoch, mosaic (dataset.mosaic), accumulate, last_opt_step, per group lr / momentum / weight_decay /
    parameter count, ema updates and the EMA decay that its next update would use, the loss items, and the
    batch's statistics (stats.batch_items).

The first record also holds the set-up: the parameter names of each optimizer group, whether the model's
weights are fp16-representable (the published half().float() at start) and the EMA's, the warm-up length nw,
batches per epoch nb and the val loader's batch size.

The loop's variables are looked up by name in the locals of the frames up the stack (ni, epoch, accumulate,
last_opt_step, optimizer, ema, dataset, imgs, targets, nw, nb, val_loader, model), or as attributes of a local
run-state object that has them (a trainer whose step lives in its own function). Plain torch + numpy: no yolov9c, no published import.
"""

import sys

import numpy as np
import torch

from stats import batch_items, summarize

NAMES = ("ni", "epoch", "accumulate", "last_opt_step", "optimizer", "ema", "dataset", "imgs", "targets", "nw",
         "nb", "val_loader", "model")


def _find_loop(max_depth=16):
    """The training loop's variables, gathered from the frames up the stack (the nearest frame's value wins):
    each frame's locals and the attributes of a run-state object among them (one with an optimizer and an
    EMA). None unless an `optimizer` and the iteration `ni` were found."""
    f = sys._getframe(2)
    names = {}
    for _ in range(max_depth):
        if f is None:
            break
        loc = f.f_locals
        for k in NAMES:
            if k not in names and k in loc:
                names[k] = loc[k]
        for v in loc.values():
            if hasattr(v, "optimizer") and hasattr(v, "ema") and not isinstance(v, type):
                for k in NAMES:
                    if k not in names and hasattr(v, k):
                        names[k] = getattr(v, k)
        f = f.f_back
    return names if "optimizer" in names and "ni" in names else None


def _bare(model):
    while hasattr(model, "module"):
        model = model.module
    return model


def _fp16_exact(module):
    ps = [p.detach() for p in module.parameters() if p.is_floating_point()]
    return bool(all(torch.equal(p, p.half().float()) for p in ps))


def setup_record(loop):
    """What the loop was set up with (first iteration only)."""
    model = _bare(loop["model"])
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [[names.get(id(p), "?") for p in g["params"]] for g in loop["optimizer"].param_groups]
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    out = {"groups": groups, "trainable": trainable, "model_fp16_exact": _fp16_exact(model),
           "optimizer": type(loop["optimizer"]).__name__,
           "nesterov": [bool(g.get("nesterov", False)) for g in loop["optimizer"].param_groups]}
    ema = loop.get("ema")
    if ema is not None:
        out["ema_fp16_exact"] = _fp16_exact(ema.ema)
        out["ema_dtype"] = str(next(ema.ema.parameters()).dtype)
    for k in ("nw", "nb"):
        if k in loop:
            out[k] = int(loop[k])
    vl = loop.get("val_loader")
    if vl is not None:
        out["val_batch_size"] = int(getattr(vl, "batch_size", 0) or 0)
    return out


def iteration_record(loop, items):
    opt = loop["optimizer"]
    rec = {"ni": int(loop["ni"]), "epoch": int(loop.get("epoch", -1)),
           "accumulate": float(loop.get("accumulate", float("nan"))),
           "last_opt_step": int(loop.get("last_opt_step", -2)),
           "lr": [float(g["lr"]) for g in opt.param_groups],
           "momentum": [float(g.get("momentum", g.get("betas", (float("nan"),))[0])) for g in opt.param_groups],
           "weight_decay": [float(g.get("weight_decay", 0.0)) for g in opt.param_groups],
           "loss_items": [float(x) for x in torch.as_tensor(items).detach().float().cpu().view(-1)[:3]]}
    ds = loop.get("dataset")
    if ds is not None:
        rec["mosaic"] = bool(getattr(ds, "mosaic", False))
    ema = loop.get("ema")
    if ema is not None:
        rec["ema_updates"] = int(ema.updates)
        rec["ema_next_decay"] = float(ema.decay(ema.updates + 1))
    imgs, targets = loop.get("imgs"), loop.get("targets")
    if imgs is not None and targets is not None:
        b = summarize(batch_items(imgs.detach().float().cpu().numpy(), targets.detach().cpu().numpy()))
        rec["batch"] = {k: b[k][0] for k in ("boxes_per_image", "box_side_px", "pixel_mean_R", "grey_share")}
        rec["batch"]["size"] = int(imgs.shape[0])
        rec["batch"]["hw"] = [int(imgs.shape[2]), int(imgs.shape[3])]
    return rec


def wrap_loss(loss_fn, records):
    """A callable with loss_fn's signature that appends one record per call to `records` (a list)."""
    def probed(*args, **kwargs):
        out = loss_fn(*args, **kwargs)
        loop = _find_loop()
        # validation may call the same loss from inside the loop's frame: one record per iteration ni
        if loop is not None and not (records and records[-1]["ni"] == int(loop["ni"])):
            rec = iteration_record(loop, out[1])
            if not records:
                rec["setup"] = setup_record(loop)
            records.append(rec)
        return out
    probed.inner = loss_fn
    return probed


def json_ready(x):
    """numpy scalars/arrays -> plain Python, recursively."""
    if isinstance(x, dict):
        return {str(k): json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_ready(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x
