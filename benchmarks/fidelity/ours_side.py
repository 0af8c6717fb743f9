"""Our side of the fidelity harness: the same three modes as published_side.py, on yolov9c.

Run by compare_published.py as a separate process from the repository root (so `yolov9c` is this checkout):

    python benchmarks/fidelity/ours_side.py data  --data D.yaml --img 640 --n 400 --seed 0 --out data.json
    python benchmarks/fidelity/ours_side.py train --record train.json -- <train_dual.py arguments>
    python benchmarks/fidelity/ours_side.py loss  --cfg yolov9-t --nc 80 --batch b.npz --seed 0 \\
        --save-weights w.npz --out loss.npz
The loss mode also writes the initial weights (--save-weights) that published_side.py's loss mode loads, and,
with --save-batch, a batch of augmented training samples of ours (uint8 images, targets) for both to use.
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))  # stats.py, probe.py
sys.path.insert(0, str(ROOT))  # this checkout's yolov9c

import numpy as np  # noqa: E402
import torch  # noqa: E402

from probe import json_ready, wrap_loss  # noqa: E402
from stats import item_stats, summarize  # noqa: E402


def run_data(a):
    import yolov9c.data.mixup as MX
    import yolov9c.data.mosaic as MO
    from yolov9c.data.dataset import YoloDataset
    from yolov9c.data.dataset_yaml import load_data_config
    from yolov9c.data.hyp import augment_hyp

    data = load_data_config(a.data)
    hyp = augment_hyp(a.hyp)
    ds = YoloDataset(data["train"], img_size=a.img, batch_size=16, augment=True, hyp=hyp, min_items=a.min_items,
                     nc=data["nc"], seed=a.seed, label_cache=False, prefix="train: ")
    counts = {"mosaic": 0, "mixup": 0, "copy_paste_calls": 0, "copy_paste_pasted": 0}
    load_mosaic, mixup, copy_paste = MO.load_mosaic, MX.mixup, MO.copy_paste

    def count_mosaic(*args, **kw):
        counts["mosaic"] += 1
        return load_mosaic(*args, **kw)

    def count_mixup(*args, **kw):
        counts["mixup"] += 1
        return mixup(*args, **kw)

    def count_copy_paste(img, labels, segments, rng, p=0.5):
        n0 = len(labels)
        out = copy_paste(img, labels, segments, rng, p=p)
        counts["copy_paste_calls"] += 1
        counts["copy_paste_pasted"] += len(out[1]) - n0
        return out

    MO.load_mosaic, MX.mixup, MO.copy_paste = count_mosaic, count_mixup, count_copy_paste
    result = {"albumentations": False, "n_images": len(ds), "n_labels": int(sum(len(x) for x in ds.labels)),
              "n_backgrounds": int(sum(len(x) == 0 for x in ds.labels))}
    n = len(ds)
    for phase, on in (("on", True), ("off", False)):
        for k in counts:
            counts[k] = 0
        items = []
        for k in range(a.n):
            # the loader's keys: (index, seed words (seed, epoch, 0, position), mosaic flag)
            img, labels, _, _ = ds[(k % n, (a.seed, k // n + (0 if on else 1000), 0, k % n), on)]
            items.append(item_stats(img.numpy(), labels.numpy()))
        result[phase] = summarize(items, data["nc"])
        m = counts["mosaic"] - counts["mixup"]
        result[phase]["rates"] = {
            "mosaic": m / a.n, "mixup_given_mosaic": counts["mixup"] / max(m, 1),
            "copy_paste_objects_per_mosaic": counts["copy_paste_pasted"] / max(counts["mosaic"], 1)}
    Path(a.out).write_text(json.dumps(json_ready(result)))


def run_train(a):
    import importlib
    import pkgutil

    import yolov9c.engine.train as E
    import yolov9c.loss.detection as L
    from yolov9c.cli.train import main as train_main

    for m in pkgutil.iter_modules(E.__path__):  # import the trainer's modules, so that the names they bound exist
        importlib.import_module(f"{E.__name__}.{m.name}")
    records = []
    inner = L.make_loss
    probed = lambda *args, **kw: wrap_loss(inner(*args, **kw), records)  # noqa: E731
    # every module that imported the name (the trainer's set-up) gets the probed one too
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("yolov9c") and getattr(mod, "make_loss", None) is inner:
            mod.make_loss = probed
    L.make_loss = probed
    try:
        rc = train_main(a.rest)
    finally:
        Path(a.record).write_text(json.dumps(json_ready(records)))
    if rc:
        raise SystemExit(rc)


def save_batch(a, path):
    """A batch of a.batch_size augmented training samples of ours (mosaic as the hyp says), as uint8 + targets."""
    from yolov9c.data.dataset import YoloDataset
    from yolov9c.data.dataset_yaml import load_data_config
    from yolov9c.data.hyp import augment_hyp
    from yolov9c.data.loader import collate

    data = load_data_config(a.data)
    ds = YoloDataset(data["train"], img_size=a.img, augment=True, hyp=augment_hyp(a.hyp), nc=data["nc"],
                     seed=a.seed, label_cache=False, prefix="train: ")
    items = [ds[(k, (a.seed, 0, 0, k), a.mosaic)] for k in range(a.batch_size)]
    imgs, targets, _, _ = collate(items)
    np.savez(path, imgs=imgs.numpy(), targets=targets.numpy())


def run_loss(a):
    from yolov9c.engine.train.optim import build_optimizer
    from yolov9c.loss.detection import make_loss
    from yolov9c.models.model import DetectionModel
    from yolov9c.resources import load_hyp

    torch.use_deterministic_algorithms(True)
    if a.save_batch:
        save_batch(a, a.batch)
    torch.manual_seed(a.seed)
    model = DetectionModel(a.cfg, nc=a.nc)
    if a.save_weights:
        np.savez(a.save_weights, **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    hyp = load_hyp(a.hyp)
    hyp["label_smoothing"] = 0.0
    model.hyp = hyp
    model.train()
    loss_fn = make_loss(model, hyp, backend=a.backend)
    if a.backend != "torch":
        from yolov9c.backends import apply
        model = apply(model, a.backend) or model
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
    opt = build_optimizer(model, "SGD", lrs[1], a.momentum, a.weight_decay, log=lambda *x: None)
    ids = {id(p): n for n, p in model.named_parameters()}
    for j, g in enumerate(opt.param_groups):
        g["lr"] = lrs[j]
        out[f"group{j}"] = np.array([ids[id(p)] for p in g["params"]])
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
    opt.step()
    for n, p in model.named_parameters():
        out[f"param::{n}"] = p.detach().double().numpy()
    np.savez(a.out, **out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    d = sub.add_parser("data")
    d.add_argument("--data", required=True)
    d.add_argument("--hyp", default=None, help="hyp yaml (default: the bundled hyp.scratch-high.yaml)")
    d.add_argument("--img", type=int, default=640)
    d.add_argument("--n", type=int, default=400)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--min-items", type=int, default=0)
    d.add_argument("--out", required=True)
    t = sub.add_parser("train")
    t.add_argument("--record", required=True)
    t.add_argument("rest", nargs=argparse.REMAINDER)
    lo = sub.add_parser("loss")
    lo.add_argument("--cfg", required=True)
    lo.add_argument("--nc", type=int, default=80)
    lo.add_argument("--hyp", default=None)
    lo.add_argument("--seed", type=int, default=0)
    lo.add_argument("--backend", default="torch", choices=("torch", "c"))
    lo.add_argument("--batch", required=True, help="npz with imgs (B, 3, H, W) uint8 and targets (N, 6)")
    lo.add_argument("--save-batch", action="store_true", help="first write --batch from our training pipeline")
    lo.add_argument("--data", help="dataset yaml (for --save-batch)")
    lo.add_argument("--img", type=int, default=320)
    lo.add_argument("--batch-size", type=int, default=8)
    lo.add_argument("--mosaic", type=int, default=1)
    lo.add_argument("--save-weights", help="write the initial weights here (npz of state_dict arrays)")
    lo.add_argument("--lr", default="0.1,0.01,0.01", help="lr of groups 0 (biases), 1 (decayed), 2 (BN)")
    lo.add_argument("--momentum", type=float, default=0.937)
    lo.add_argument("--weight-decay", type=float, default=0.0005)
    lo.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.mode == "train" and a.rest and a.rest[0] == "--":
        a.rest = a.rest[1:]
    if a.mode == "loss":
        a.mosaic = bool(a.mosaic)
    {"data": run_data, "train": run_train, "loss": run_loss}[a.mode](a)


if __name__ == "__main__":
    main()
