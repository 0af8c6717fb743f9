"""The published side of the fidelity harness: runs pieces of the published YOLOv9 code and writes plain data.

Run by compare_published.py as a separate process, with the published checkout as working directory and first
on sys.path, in a Python that has torch and torchvision (never imported into yolov9c; this file imports no
yolov9c module). Three modes, each writing one JSON (and npz) file:

    python published_side.py data  --data D.yaml --img 640 --n 400 --seed 0 --out data.json
        augmented samples from the published LoadImagesAndLabels (mosaic on, then off), their statistics
        (stats.py) and the mosaic / mixup / copy-paste rates (counted by wrapping those functions)
    python published_side.py train [--record train.json] -- <train_dual.py arguments>
        the published train_dual.main() itself; with --record its ComputeLoss wrapped by probe.wrap_loss: per-iteration
        learning rates, momentum, weight decay, accumulation, EMA updates and decay, mosaic flag, batch stats
    python published_side.py loss  --cfg yolov9-t --nc 80 --weights w.npz --batch b.npz --out loss.npz
        the published model with the given weights (state_dict arrays) on the given batch: loss items, every
        parameter's gradient norm, BatchNorm running statistics after the forward, the optimizer groups of
        smart_optimizer and the parameters after one clipped SGD step with the given per-group lr

Optional packages the published code imports but these modes do not use (IPython, pkg_resources, tensorboard) get small
stand-ins when they are missing (and np.trapz, gone from NumPy 2.4, is np.trapezoid), and the font they would download is a local copy; albumentations is used if
installed (the data result says whether its transforms are active).
"""

import faulthandler
import json
import os
import signal
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # stats.py, probe.py, modes.py
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

from modes import AugmentCounts, data_phases, init_stats, loss_step, parse, parser  # noqa: E402
from probe import json_ready, wrap_loss  # noqa: E402


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
    counts = AugmentCounts()
    ds.load_mosaic, D.mixup, D.copy_paste = (counts.mosaic(ds.load_mosaic), counts.mixup(D.mixup),
                                             counts.copy_paste(D.copy_paste))
    random.seed(a.seed)
    np.random.seed(a.seed)
    result = {"albumentations": bool(ds.albumentations is not None and ds.albumentations.transform is not None),
              "n_images": len(ds), "n_labels": int(sum(len(x) for x in ds.labels)),
              "n_backgrounds": int(sum(len(x) == 0 for x in ds.labels))}

    def sample(k, on):
        ds.mosaic = on
        img, labels, _, _ = ds[k % len(ds)]
        return img, labels

    result.update(data_phases(sample, a.n, len(data["names"]), counts))
    Path(a.out).write_text(json.dumps(json_ready(result)))


# ----------------------------------------------------------------------------------------------- train ------

def run_train(a):
    threads = os.environ.get("OMP_NUM_THREADS", "")
    import train_dual

    # its utils set OMP_NUM_THREADS to min(8, cores - 1) at import: the thread count given to this process wins
    # (bench_accuracy.py runs several trainings on one host), and SIGUSR1 prints the stacks (as train_dual.py does)
    if threads.isdigit():
        torch.set_num_threads(int(threads))
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    records = []
    inner = train_dual.ComputeLoss
    if a.record:  # the probe copies each batch to the host: only when its records are wanted
        train_dual.ComputeLoss = lambda model, *args, **kw: wrap_loss(inner(model, *args, **kw), records)
    # its strip_optimizer re-reads the checkpoints it just wrote with torch.load, which torch >= 2.6 refuses
    # for pickled modules unless told that these (our own, fresh) files are trusted
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    sys.argv = ["train_dual.py"] + a.rest
    opt = train_dual.parse_opt(True)
    try:
        train_dual.main(opt)
    finally:
        if a.record:
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
    loss_step(model, ComputeLoss(model), a, lambda lr: smart_optimizer(model, "SGD", lr, a.momentum, a.weight_decay))


def run_init(a):
    from models.yolo import Model

    cfg = Path("models/detect") / f"{Path(a.cfg).stem}.yaml"
    seeds = [int(x) for x in a.seeds.split(",")]
    Path(a.out).write_text(json.dumps(init_stats(lambda: Model(str(cfg), ch=3, nc=a.nc), seeds)))


def main(argv=None):
    p, _, _, lo = parser(__doc__.split("\n")[0], "data/hyps/hyp.scratch-high.yaml")
    lo.add_argument("--weights", required=True, help="npz of state_dict arrays (ours_side.py --save-weights)")
    a = parse(p, argv)
    {"data": run_data, "train": run_train, "loss": run_loss, "init": run_init}[a.mode](a)


if __name__ == "__main__":
    main()
