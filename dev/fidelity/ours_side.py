"""Our side of the fidelity harness: the same three modes as published_side.py, on yolov9c.

Run by compare_published.py as a separate process from the repository root (so `yolov9c` is this checkout):

    python dev/fidelity/ours_side.py data  --data D.yaml --img 640 --n 400 --seed 0 --out data.json
    python dev/fidelity/ours_side.py train --record train.json -- <train_dual.py arguments>
    python dev/fidelity/ours_side.py loss  --cfg yolov9-t --nc 80 --batch b.npz --seed 0 \\
        --save-weights w.npz --out loss.npz
The loss mode also writes the initial weights (--save-weights) that published_side.py's loss mode loads, and,
with --save-batch, a batch of augmented training samples of ours (uint8 images, targets) for both to use.
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))  # stats.py, probe.py, modes.py
sys.path.insert(0, str(ROOT))  # this checkout's yolov9c

import numpy as np  # noqa: E402
import torch  # noqa: E402

from modes import AugmentCounts, data_phases, init_stats, loss_step, parse, parser  # noqa: E402
from probe import json_ready, wrap_loss  # noqa: E402


def run_data(a):
    import yolov9c.data.mixup as MX
    import yolov9c.data.mosaic as MO
    from yolov9c.data.dataset import DatasetConfig, YoloDataset
    from yolov9c.data.dataset_yaml import load_data_config
    from yolov9c.data.hyp import augment_hyp

    data = load_data_config(a.data)
    hyp = augment_hyp(a.hyp)
    ds = YoloDataset(data["train"], DatasetConfig(img_size=a.img, batch_size=16, augment=True, hyp=hyp,
                                                  min_items=a.min_items, prefix="train: ", nc=data["nc"], seed=a.seed,
                                                  label_cache=False))
    counts = AugmentCounts()
    MO.load_mosaic, MX.mixup, MO.copy_paste = (counts.mosaic(MO.load_mosaic), counts.mixup(MX.mixup),
                                               counts.copy_paste(MO.copy_paste))
    result = {"albumentations": False, "n_images": len(ds), "n_labels": int(sum(len(x) for x in ds.labels)),
              "n_backgrounds": int(sum(len(x) == 0 for x in ds.labels))}
    n = len(ds)

    def sample(k, on):
        # the loader's keys: (index, seed words (seed, epoch, 0, position), mosaic flag)
        img, labels, _, _ = ds[(k % n, (a.seed, k // n + (0 if on else 1000), 0, k % n), on)]
        return img, labels

    result.update(data_phases(sample, a.n, data["nc"], counts))
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
    if not a.record:
        raise SystemExit(train_main(a.rest) or 0)
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
    from yolov9c.data.dataset import DatasetConfig, YoloDataset
    from yolov9c.data.dataset_yaml import load_data_config
    from yolov9c.data.hyp import augment_hyp
    from yolov9c.data.loader import collate

    data = load_data_config(a.data)
    ds = YoloDataset(data["train"], DatasetConfig(img_size=a.img, augment=True, hyp=augment_hyp(a.hyp),
                                                  prefix="train: ", nc=data["nc"], seed=a.seed, label_cache=False))
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
    loss_step(model, loss_fn, a,
              lambda lr: build_optimizer(model, "SGD", lr, a.momentum, a.weight_decay, log=lambda *x: None))


def run_init(a):
    from yolov9c.api import build_model

    seeds = [int(x) for x in a.seeds.split(",")]
    Path(a.out).write_text(json.dumps(init_stats(lambda: build_model(a.cfg, nc=a.nc), seeds)))


def main(argv=None):
    p, _, _, lo = parser(__doc__.split("\n")[0], None)
    lo.add_argument("--seed", type=int, default=0)
    lo.add_argument("--backend", default="torch", choices=("torch", "c"))
    lo.add_argument("--save-batch", action="store_true", help="first write --batch from our training pipeline")
    lo.add_argument("--data", help="dataset yaml (for --save-batch)")
    lo.add_argument("--img", type=int, default=320)
    lo.add_argument("--batch-size", type=int, default=8)
    lo.add_argument("--mosaic", type=int, default=1)
    lo.add_argument("--save-weights", help="write the initial weights here (npz of state_dict arrays)")
    a = parse(p, argv)
    if a.mode == "loss":
        a.mosaic = bool(a.mosaic)
    {"data": run_data, "train": run_train, "loss": run_loss, "init": run_init}[a.mode](a)


if __name__ == "__main__":
    main()
