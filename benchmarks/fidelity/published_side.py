"""The published side of the fidelity harness: runs pieces of the published YOLOv9 code and writes plain data.

Run by compare_published.py as a separate process, with the published checkout as working directory and first
on sys.path, in a Python that has torch and torchvision (never imported into yolov9c; this file imports no
yolov9c module). Three modes, each writing one JSON (and npz) file:

    python published_side.py data  --data D.yaml --img 640 --n 400 --seed 0 --out data.json
        augmented samples from the published LoadImagesAndLabels (mosaic on, then off), their statistics
        (stats.py) and the mosaic / mixup / copy-paste rates (counted by wrapping those functions)
    python published_side.py train --record train.json -- <train_dual.py arguments>
        the published train_dual.main() itself, its ComputeLoss wrapped by probe.wrap_loss: per-iteration
        learning rates, momentum, weight decay, accumulation, EMA updates and decay, mosaic flag, batch stats
    python published_side.py loss  --cfg yolov9-t --nc 80 --weights w.npz --batch b.npz --out loss.npz
        the published model with the given weights (state_dict arrays) on the given batch: loss items, every
        parameter's gradient norm, BatchNorm running statistics after the forward, the optimizer groups of
        smart_optimizer and the parameters after one clipped SGD step with the given per-group lr

Optional packages the published code imports but these modes do not use (IPython, pkg_resources, tensorboard) get small
stand-ins when they are missing (and np.trapz, gone from NumPy 2.4, is np.trapezoid), and the font they would download is a local copy; albumentations is used if
installed (the data result says whether its transforms are active).
"""

import argparse
import json
import os
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # stats.py, probe.py
sys.path.insert(0, os.getcwd())  # the published checkout (the working directory)


def _stand_ins():
    # the published utils download Arial.ttf at import when it is not in their config folder: give them a
    # folder of their own holding a local font under that name (no network here)
    cfg = Path(os.environ.setdefault("YOLOV5_CONFIG_DIR", str(Path.home() / ".cache" / "yolov9c-fidelity")))
    cfg.mkdir(parents=True, exist_ok=True)
    for name in ("Arial.ttf", "Arial.Unicode.ttf"):
        if not (cfg / name).exists():
            import matplotlib

            font = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
            (cfg / name).write_bytes(font.read_bytes())
    try:
        import IPython  # noqa: F401
    except ImportError:
        ip = types.ModuleType("IPython")
        ip.get_ipython = lambda: None
        ip.version_info = (9, 0, 0)  # matplotlib asks; a recent one needs nothing more from it
        disp = types.ModuleType("IPython.display")
        disp.display = lambda *a, **k: None
        disp.clear_output = lambda *a, **k: None
        ip.display = disp
        sys.modules["IPython"], sys.modules["IPython.display"] = ip, disp
    try:
        import tensorboard  # noqa: F401
    except ImportError:  # the published loggers import SummaryWriter at module level
        tb = types.ModuleType("torch.utils.tensorboard")
        tb.SummaryWriter = type("SummaryWriter", (), {"__init__": lambda self, *a, **k: None,
                                                      "__getattr__": lambda self, name: (lambda *a, **k: None)})
        sys.modules["torch.utils.tensorboard"] = tb
    try:
        import pkg_resources  # noqa: F401
    except ImportError:
        from packaging.version import parse
        pk = types.ModuleType("pkg_resources")
        pk.parse_version = parse
        pk.VersionConflict = pk.DistributionNotFound = type("PkgError", (Exception,), {})
        pk.parse_requirements = lambda f: []
        pk.require = lambda r: None
        sys.modules["pkg_resources"] = pk
    import numpy
    if not hasattr(numpy, "trapz"):  # NumPy 2.4 removed it; the published compute_ap integrates with it
        numpy.trapz = numpy.trapezoid


_stand_ins()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from probe import json_ready, wrap_loss  # noqa: E402
from stats import item_stats, summarize  # noqa: E402


def _hyp(path):
    with open(path) as f:
        return yaml.safe_load(f)


# ------------------------------------------------------------------------------------------------ data ------

def run_data(a):
    import random

    import utils.dataloaders as D
    from utils.general import check_dataset

    data = check_dataset(a.data)
    hyp = _hyp(a.hyp)
    ds = D.LoadImagesAndLabels(data["train"], a.img, 16, augment=True, hyp=hyp, rect=False, cache_images=None,
                               stride=32, min_items=a.min_items, prefix="train: ")
    counts = {"mosaic": 0, "mixup": 0, "copy_paste_calls": 0, "copy_paste_pasted": 0}
    load_mosaic, mixup, copy_paste = ds.load_mosaic, D.mixup, D.copy_paste

    def count_mosaic(*args, **kw):
        counts["mosaic"] += 1
        return load_mosaic(*args, **kw)

    def count_mixup(*args, **kw):
        counts["mixup"] += 1
        return mixup(*args, **kw)

    def count_copy_paste(im, labels, segments, p=0.5):
        n0 = len(labels)
        out = copy_paste(im, labels, segments, p=p)
        counts["copy_paste_calls"] += 1
        counts["copy_paste_pasted"] += len(out[1]) - n0
        return out

    ds.load_mosaic, D.mixup, D.copy_paste = count_mosaic, count_mixup, count_copy_paste
    random.seed(a.seed)
    np.random.seed(a.seed)
    nc = len(data["names"])
    result = {"albumentations": bool(ds.albumentations is not None and ds.albumentations.transform is not None),
              "n_images": len(ds), "n_labels": int(sum(len(x) for x in ds.labels)),
              "n_backgrounds": int(sum(len(x) == 0 for x in ds.labels))}
    for phase, on in (("on", True), ("off", False)):
        ds.mosaic = on
        for k in counts:
            counts[k] = 0
        items = []
        for k in range(a.n):
            img, labels, _, _ = ds[k % len(ds)]
            items.append(item_stats(img.numpy(), labels.numpy()))
        result[phase] = summarize(items, nc)
        m = counts["mosaic"] - counts["mixup"]  # the primary mosaics (mixup builds a second one)
        result[phase]["rates"] = {
            "mosaic": m / a.n, "mixup_given_mosaic": counts["mixup"] / max(m, 1),
            "copy_paste_objects_per_mosaic": counts["copy_paste_pasted"] / max(counts["mosaic"], 1)}
    Path(a.out).write_text(json.dumps(json_ready(result)))


# ----------------------------------------------------------------------------------------------- train ------

def run_train(a):
    import train_dual

    records = []
    inner = train_dual.ComputeLoss
    train_dual.ComputeLoss = lambda model, *args, **kw: wrap_loss(inner(model, *args, **kw), records)
    # its strip_optimizer re-reads the checkpoints it just wrote with torch.load, which torch >= 2.6 refuses
    # for pickled modules unless told that these (our own, fresh) files are trusted
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    sys.argv = ["train_dual.py"] + a.rest
    opt = train_dual.parse_opt(True)
    try:
        train_dual.main(opt)
    finally:
        Path(a.record).write_text(json.dumps(json_ready(records)))


# ------------------------------------------------------------------------------------------------ loss ------

def run_loss(a):
    from models.yolo import Model
    from utils.loss_tal_dual import ComputeLoss
    from utils.torch_utils import smart_optimizer

    torch.use_deterministic_algorithms(True)
    cfg = Path("models/detect") / f"{Path(a.cfg).stem}.yaml"
    model = Model(str(cfg), ch=3, nc=a.nc)
    w = np.load(a.weights)
    sd = {k: torch.from_numpy(w[k]) for k in w.files}
    missing = model.load_state_dict(sd, strict=True)
    del missing
    hyp = _hyp(a.hyp)
    hyp["label_smoothing"] = 0.0
    model.hyp = hyp
    model.train()
    loss_fn = ComputeLoss(model)
    b = np.load(a.batch)
    imgs = torch.from_numpy(b["imgs"]).float() / 255
    targets = torch.from_numpy(b["targets"]).float()
    pred = model(imgs)
    loss, items = loss_fn(pred, targets)
    loss.backward()

    out = {"loss": loss.detach().double().numpy().reshape(-1), "items": items.detach().double().numpy()}
    names = [n for n, _ in model.named_parameters()]
    out["grad_names"] = np.array(names)
    out["grad_norms"] = np.array([p.grad.double().norm().item() if p.grad is not None else -1.0
                                  for _, p in model.named_parameters()])
    for k, v in model.state_dict().items():
        if "running_" in k:
            out[f"bn::{k}"] = v.double().numpy()
    lrs = [float(x) for x in a.lr.split(",")]
    opt = smart_optimizer(model, "SGD", lrs[1], a.momentum, a.weight_decay)
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
    d.add_argument("--hyp", default="data/hyps/hyp.scratch-high.yaml")
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
    lo.add_argument("--hyp", default="data/hyps/hyp.scratch-high.yaml")
    lo.add_argument("--weights", required=True)
    lo.add_argument("--batch", required=True)
    lo.add_argument("--lr", default="0.1,0.01,0.01", help="lr of groups 0 (biases), 1 (decayed), 2 (BN)")
    lo.add_argument("--momentum", type=float, default=0.937)
    lo.add_argument("--weight-decay", type=float, default=0.0005)
    lo.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.mode == "train" and a.rest and a.rest[0] == "--":
        a.rest = a.rest[1:]
    {"data": run_data, "train": run_train, "loss": run_loss}[a.mode](a)


if __name__ == "__main__":
    main()
