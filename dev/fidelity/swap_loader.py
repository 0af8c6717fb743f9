"""Exchange the training data pipelines of the two codes: a bisection arm of docs/fidelity.md.

    python swap_loader.py published-loop --published CHECKOUT -- <published train_dual.py arguments>
        the published train_dual.main() trained on our training loader (yolov9c.data.loader); run with the
        published checkout as working directory, as published_side.py is
    python swap_loader.py ours-loop --published CHECKOUT -- <our train_dual.py arguments>
        our trainer trained on the published training loader (utils.dataloaders.create_dataloader); run with
        this repository as working directory

Only the training loader is exchanged: each loop keeps its own validation loader, model, loss and optimizer.
Both loaders yield the same batch format (uint8 (B, 3, H, W) RGB, (N, 6) [image, class, x, y, w, h], paths,
shapes) and their datasets have the attributes each loop reads (labels, mosaic, augment, rect). The published
loader is seeded by its own constant (its generator), ours by --seed. bench_accuracy.py runs these as the runners
`published+ours-loader` and `torch+pub-loader` / `c+pub-loader`. Test: dev/tests/test_bench_accuracy.py (the
commands); the arms themselves need the published checkout and a GPU.
"""

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def published_loop(checkout, rest):
    """The published train_dual.main with our loader as its training loader (its validation loader unchanged)."""
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(checkout))
    sys.path.append(str(ROOT))  # yolov9c, after the published checkout (both have a train_dual.py)
    import published_side  # noqa: F401  (the stand-ins for the published code's optional imports)
    import train_dual

    from yolov9c.data.dataset import DatasetConfig
    from yolov9c.data.loader import LoaderConfig, create_dataloader

    pub_create = train_dual.create_dataloader
    seed = _arg(rest, "--seed", 0)

    def create(path, imgsz, batch_size, stride, single_cls=False, hyp=None, augment=False, cache=False,
               rect=False, rank=-1, workers=8, min_items=0, prefix="", shuffle=False, **kw):
        if not augment:  # the validation loader stays the published one
            return pub_create(path, imgsz, batch_size, stride, single_cls, hyp=hyp, augment=augment, cache=cache,
                              rect=rect, rank=rank, workers=workers, min_items=min_items, prefix=prefix,
                              shuffle=shuffle, **kw)
        data = DatasetConfig(augment=True, hyp=dict(hyp), rect=rect, cache=cache or None, single_cls=single_cls,
                             stride=int(stride), min_items=min_items, prefix="train: ", seed=seed)
        return create_dataloader(path, imgsz, batch_size, LoaderConfig(data, workers=workers, shuffle=shuffle))

    train_dual.create_dataloader = create
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # its strip_optimizer (published_side.py)
    sys.argv = ["train_dual.py"] + rest
    train_dual.main(train_dual.parse_opt(True))


def ours_loop(checkout, rest):
    """Our train_dual.py with the published create_dataloader as its training loader."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE))
    cwd = os.getcwd()
    os.chdir(checkout)  # the published utils read files relative to their checkout at import
    try:
        import published_side  # noqa: F401
        sys.path.append(str(checkout))
        from utils.dataloaders import create_dataloader as pub_create
    finally:
        os.chdir(cwd)

    import yolov9c.engine.train.state as S

    ours_create = S.create_dataloader

    def create(path, imgsz, batch_size, cfg, log=print):
        d = cfg.data
        if not d.augment:
            return ours_create(path, imgsz, batch_size, cfg, log=log)
        loader, dataset = pub_create(path, imgsz, batch_size, d.stride, d.single_cls, hyp=d.hyp, augment=True,
                                     cache=d.cache, rect=d.rect, rank=-1, workers=cfg.workers,
                                     close_mosaic=True, prefix="train: ", shuffle=True, min_items=d.min_items)
        loader.sampler.set_epoch = lambda epoch: None  # a RandomSampler: the published loop never sets one
        return loader, dataset

    S.create_dataloader = create
    from yolov9c.cli.train import main as ours_main

    sys.exit(ours_main(rest))


def _arg(argv, name, default):
    return int(argv[argv.index(name) + 1]) if name in argv else default


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("published-loop", "ours-loop"))
    p.add_argument("--published", required=True, help="the published YOLOv9 checkout")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: the train_dual.py arguments
    a = p.parse_args(argv[:cut])
    rest = argv[cut + 1:]
    checkout = Path(a.published).resolve()
    (published_loop if a.mode == "published-loop" else ours_loop)(checkout, rest)


if __name__ == "__main__":
    main()
