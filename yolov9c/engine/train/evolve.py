"""Hyper-parameter evolution, `train_dual.py --evolve [N]` (the published genetic search, default 300 generations).

    python train_dual.py --data D.yaml --cfg gelan-t.yaml --epochs 10 --evolve 30      # → runs/evolve/exp

Each generation trains from scratch (`--noval --nosave` implied: no checkpoint, plots or yaml) and appends one
row to `evolve.csv`: P, R, mAP@0.5, mAP@0.5:0.95, val box/cls/dfl loss, then every hyperparameter. Generation 0
trains --hyp as is; later ones pick a parent among the 5 fittest rows (fitness 0.1·mAP@0.5 + 0.9·mAP@0.5:0.95,
weights fitness − min + 1e-6) and mutate it (p 0.8 per key: × (1 + gain·N(0,1)·U(0,1)·0.2), clipped to
[0.3, 3], redrawn until a key changed), clamp to META and round to 5 decimals. `hyp_evolve.yaml` holds the
best row, `hyp_evolve.png` each key against fitness; `--resume` extends an existing folder's evolve.csv.
Differences from the published code (which fails with KeyError 'dfl' on its own hyp file): META has `dfl`;
box/cls/dfl have gain 0 and bounds that hold the YOLOv9 values (the loss hard-codes 7.5, 0.5, 1.5); mutations
draw from a generator seeded by (--seed, generation), so an evolution repeats exactly; `--bucket` is ignored.
Test: python -m pytest -q tests/engine/train/test_evolve.py
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import yaml

from yolov9c.data.hyp import augment_hyp
from yolov9c.engine.run_dir import increment_path
from yolov9c.engine.train.config import RunConfig
from yolov9c.engine.train.errors import TrainError
from yolov9c.engine.train.run_folder import check_writable
from yolov9c.engine.train.trainer import train
from yolov9c.resources import resolve_hyp

# key: (mutation gain 0-1, lower bound, upper bound) — the published table plus dfl (see the header)
META = {
    "lr0": (1, 1e-5, 1e-1),  # initial learning rate
    "lrf": (1, 0.01, 1.0),  # final LR factor
    "momentum": (0.3, 0.6, 0.98),  # SGD momentum / Adam beta1
    "weight_decay": (1, 0.0, 0.001),
    "warmup_epochs": (1, 0.0, 5.0),
    "warmup_momentum": (1, 0.0, 0.95),
    "warmup_bias_lr": (1, 0.0, 0.2),
    "box": (0, 0.02, 20.0),  # loss gains: not read by the YOLOv9 loss (published gain 1, bounds 0.02-0.2)
    "cls": (0, 0.2, 4.0),
    "dfl": (0, 0.1, 10.0),
    "cls_pw": (1, 0.5, 2.0),  # BCE positive weight
    "obj": (1, 0.2, 4.0),  # anchor-based leftovers, mutated as published though unused
    "obj_pw": (1, 0.5, 2.0),
    "iou_t": (0, 0.1, 0.7),
    "anchor_t": (1, 2.0, 8.0),
    "anchors": (2, 2.0, 10.0),
    "fl_gamma": (0, 0.0, 2.0),  # focal loss gamma
    "hsv_h": (1, 0.0, 0.1),  # augmentation
    "hsv_s": (1, 0.0, 0.9),
    "hsv_v": (1, 0.0, 0.9),
    "degrees": (1, 0.0, 45.0),
    "translate": (1, 0.0, 0.9),
    "scale": (1, 0.0, 0.9),
    "shear": (1, 0.0, 10.0),
    "perspective": (0, 0.0, 0.001),
    "flipud": (1, 0.0, 1.0),
    "fliplr": (0, 0.0, 1.0),
    "mosaic": (1, 0.0, 1.0),
    "mixup": (1, 0.0, 1.0),
    "copy_paste": (1, 0.0, 1.0),
}
RESULT_KEYS = ("metrics/precision", "metrics/recall", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95", "val/box_loss",
               "val/cls_loss", "val/dfl_loss")
N_PARENTS = 5  # the fittest rows a parent is drawn from
MUTATION_P, SIGMA = 0.8, 0.2


def row_fitness(rows):
    """Fitness of evolve.csv rows (n, 7 + keys): 0.1 · mAP@0.5 + 0.9 · mAP@0.5:0.95."""
    rows = np.atleast_2d(np.asarray(rows, np.float64))
    return rows[:, 2] * 0.1 + rows[:, 3] * 0.9


def constrain(hyp, meta=META):
    """Clamp every META key of hyp to its bounds and round to 5 decimals (in place; returns hyp)."""
    for k, (_, lo, hi) in meta.items():
        if k in hyp:
            hyp[k] = round(min(max(float(hyp[k]), lo), hi), 5)
    return hyp


def mutate(rows, keys, rng, meta=META):
    """A child hyp dict from evolve.csv rows (n, 7 + len(keys)) as published: weighted choice of a parent
    among the N_PARENTS fittest, then multiplicative Gaussian mutation of the keys with gain > 0. rng: a
    numpy Generator. Not yet constrained (constrain() does that)."""
    rows = np.atleast_2d(np.asarray(rows, np.float64))
    fit = row_fitness(rows)
    n = min(N_PARENTS, len(rows))
    top = rows[np.argsort(-fit, kind="stable")][:n]
    w = row_fitness(top) - row_fitness(top).min() + 1e-6
    parent = top[rng.choice(n, p=w / w.sum())]
    gains = np.array([meta.get(k, (0, 0, 0))[0] for k in keys], np.float64)
    v = np.ones(len(keys))
    while np.all(v == 1) and gains.any():  # redraw until a key changes (no duplicate generations)
        v = (gains * (rng.random(len(keys)) < MUTATION_P) * rng.standard_normal(len(keys)) * rng.random() * SIGMA
             + 1).clip(0.3, 3.0)
    return {k: float(parent[7 + i] * v[i]) for i, k in enumerate(keys)}


def read_evolve_csv(path):
    """(keys: hyperparameter names in column order, rows (n, 7 + len(keys)) float64) of an evolve.csv."""
    lines = Path(path).read_text().splitlines()
    header = [c.strip() for c in lines[0].split(",")]
    rows = np.array([[float(c) for c in line.split(",")] for line in lines[1:] if line.strip()], np.float64)
    return header[len(RESULT_KEYS):], rows.reshape(-1, len(header))


def append_generation(save_dir, results, hyp, log=print):
    """Append one row to save_dir/evolve.csv and rewrite hyp_evolve.yaml from the best row so far."""
    csv = Path(save_dir) / "evolve.csv"
    keys = list(RESULT_KEYS) + list(hyp)
    vals = [float(v) for v in results] + [float(v) for v in hyp.values()]
    head = "" if csv.exists() else ",".join("%20s" % k for k in keys) + "\n"
    with open(csv, "a") as f:
        f.write(head + ",".join("%20.5g" % v for v in vals) + "\n")
    hyp_keys, rows = read_evolve_csv(csv)
    best = int(np.argmax(row_fitness(rows)))
    text = ("# YOLOv9 hyperparameter evolution results (yolov9c)\n"
            f"# Best generation: {best}\n# Last generation: {len(rows) - 1}\n"
            "# " + ", ".join("%20s" % k for k in RESULT_KEYS) + "\n"
            "# " + ", ".join("%20.5g" % v for v in rows[best, :len(RESULT_KEYS)]) + "\n\n")
    best_hyp = {k: float(v) for k, v in zip(hyp_keys, rows[best, len(RESULT_KEYS):])}
    (Path(save_dir) / "hyp_evolve.yaml").write_text(text + yaml.safe_dump(best_hyp, sort_keys=False))
    log(f"evolve: {len(rows)} generations finished, current result:\n"
        "evolve: " + ", ".join("%20s" % k for k in keys) + "\n"
        "evolve: " + ", ".join("%20.5g" % v for v in vals) + "\n")
    return len(rows)


def plot_evolve(csv, log=print):
    """hyp_evolve.png beside evolve.csv: every evolved key against fitness (colour: fitness; +: the best)."""
    import matplotlib  # here, as in results.py: every training start imports this module (~0.9 s for pyplot)
    import matplotlib.pyplot as plt

    try:
        matplotlib.use("Agg")
        keys, rows = read_evolve_csv(csv)
        fit = row_fitness(rows)
        best = int(np.argmax(fit))
        cols = 6
        nrow = -(-len(keys) // cols)
        fig, axes = plt.subplots(nrow, cols, figsize=(3 * cols, 2.6 * nrow), squeeze=False)
        for i, ax in enumerate(axes.ravel()):
            if i >= len(keys):
                ax.axis("off")
                continue
            x = rows[:, len(RESULT_KEYS) + i]
            ax.scatter(x, fit, c=fit, cmap="viridis", s=12, alpha=0.8)
            ax.plot(x[best], fit[best], "k+", markersize=14)
            ax.set_title(f"{keys[i]} = {x[best]:.3g}", fontsize=9)
            ax.tick_params(labelsize=7)
        fig.tight_layout()
        out = Path(csv).with_name("hyp_evolve.png")
        fig.savefig(out, dpi=100)
        plt.close(fig)
        log(f"Saved {out}")
    except Exception as e:  # noqa: BLE001 - a plot must not end an evolution
        log(f"WARNING: hyp_evolve.png not written: {e}")


def evolve(cfg: RunConfig, *, train_fn=None, log=print, prog="train_dual.py"):
    """Run cfg.evolve generations; returns the run folder (Path). cfg: a RunConfig with .evolve set; each
    generation trains dataclasses.replace(cfg, hyp=child, ...). train_fn(cfg) → dict with "metrics" (mp, mr,
    map50, map, box_loss, cls_loss, dfl_loss), default yolov9c.engine.train.trainer.train (tests pass a
    stand-in). prog: the script, for the options line (trainer.train)."""
    train_fn = train_fn or (lambda c: train(c, log=log, prog=prog))
    if int(os.getenv("WORLD_SIZE", "1")) > 1:
        raise TrainError("--evolve is not compatible with DDP (as published): run it in one process")
    generations = int(cfg.evolve)
    if generations < 1:
        raise TrainError(f"--evolve {cfg.evolve}: the number of generations must be >= 1")
    if cfg.bucket:
        log(f"WARNING: --bucket {cfg.bucket}: gsutil upload/download is not supported; evolve.csv stays local")
    try:
        hyp = augment_hyp(resolve_hyp(cfg.hyp) if isinstance(cfg.hyp, str) else cfg.hyp,
                          mosaic=cfg.mosaic, mixup=cfg.mixup, log=log)
    except (FileNotFoundError, KeyError, ValueError) as e:
        raise TrainError(f"--hyp: {e}") from None
    hyp.setdefault("anchors", 3)  # commented out in the hyp files; evolved as published
    meta = dict(META)
    if cfg.noautoanchor:
        hyp.pop("anchors", None)
        meta.pop("anchors")
    unknown = [k for k in hyp if k not in meta]
    if unknown:
        log(f"evolve: keys without META bounds are kept fixed: {', '.join(unknown)}")
    project = "runs/evolve" if str(cfg.project) == "runs/train" else cfg.project
    name = Path(cfg.cfg).stem if cfg.name == "cfg" else cfg.name
    exist_ok = bool(cfg.resume) or cfg.exist_ok
    check_writable(increment_path(Path(project) / name, exist_ok=exist_ok))  # one error line, before generation 0
    save_dir = increment_path(Path(project) / name, exist_ok=exist_ok, mkdir=True)
    csv = save_dir / "evolve.csv"
    done = 0
    if csv.exists():
        keys, rows = read_evolve_csv(csv)
        if set(keys) != set(hyp):
            raise TrainError(f"--evolve: {csv} holds other hyperparameters ({', '.join(sorted(set(keys) ^ set(hyp)))})"
                             f"; use another --name")
        hyp = {k: hyp[k] for k in keys}  # the csv's column order
        done = len(rows)
        log(f"evolve: continuing {csv} after {done} generations")
    log(f"evolve: {generations} generations into {save_dir}")

    for g in range(done, done + generations):
        if csv.exists():
            keys, rows = read_evolve_csv(csv)
            rng = np.random.default_rng([int(cfg.seed) & 0xFFFFFFFF, g, 0xE7017E])
            child = mutate(rows, keys, rng, meta)
            hyp.update({k: child[k] for k in keys if k in meta})
        constrain(hyp, meta)
        gen = dataclasses.replace(
            cfg, hyp=dict(hyp), mosaic=None, mixup=None,  # mosaic/mixup already in hyp (and evolved)
            noval=True, nosave=True, noplots=True, resume=False,
            project=str(save_dir.parent), name=save_dir.name, exist_ok=True,
            given=tuple(k for k in cfg.given if k != "resume"))
        log(f"\nevolve: generation {g} of {done + generations - 1}")
        res = train_fn(gen)
        m = res["metrics"]
        results = [m["mp"], m["mr"], m["map50"], m["map"], m["box_loss"], m["cls_loss"], m["dfl_loss"]]
        append_generation(save_dir, results, hyp, log=log)

    if not cfg.noplots:
        plot_evolve(csv, log=log)
    log(f"Hyperparameter evolution finished {generations} generations\nResults saved to {save_dir}\n"
        f"Usage example: $ python train_dual.py --hyp {save_dir / 'hyp_evolve.yaml'}")
    return save_dir
