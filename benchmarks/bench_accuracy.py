"""Real-data accuracy benchmark (issue 13): both backends and, given --published, the published train_dual.py,
trained from scratch on a small real dataset with several seeds; mean and spread of mAP@0.5 and mAP@0.5:0.95.

    python benchmarks/bench_accuracy.py --data ../shared/data/coco128/data.yaml --cfg yolov9-s --img 640 \\
        --batch 32 --epochs 60 --close-mosaic 15 --seeds 0,1,2 --backends torch,c \\
        [--published /work/published-yolov9 --python /work/venv-pub/bin/python] --out runs/bench-accuracy

Each run is a separate `train_dual.py` process (ours from this checkout with --backend B, or the published one
in its checkout, started through benchmarks/fidelity/published_side.py) with the same flags: --hyp
hyp.scratch-high.yaml --min-items 0 --cache ram (--cache none to turn it off) --seed S. Its best.pt is then
validated by our val_dual.py (conf 0.001, IoU 0.7, batch --val-batch, half on CUDA): one validator for every
run. --jobs N trains N runs at once (one GPU holds several small runs; validation stays one at a time);
--single-cls trains and validates every runner as one class (coco128's 80 classes in 128 images are too few
to learn from scratch); --classes 0 keeps only coco's person class (coco128: 254 of
the 929 training boxes, in 61 of the 128 images; 350 boxes in 73 val images), a relabelled copy in OUT. A tiny
CPU run to show it works: --cfg yolov9-t --img 160 --epochs 1 --batch 8 --device cpu.

--derive crops (benchmarks/accuracy_data.py `crop_dataset`) trains and validates on a dataset learnable from
scratch in a few dozen epochs, which coco128 itself is not (every runner stays at mAP@0.5:0.95 ≈ 0.001-0.003):
crops of coco128 in which a few classes' objects are large. Anchors are the boxes of the kept classes with a
longer side >= 96 px and a shorter >= 32 px; the classes are --classes, else the 3 with the most anchors in the
split that has fewer: on coco128 person (111 train / 174 val anchors), dining table (10 / 17) and bowl (16 / 9),
the next being chair (12 / 8). Each anchor gives 3 train crops (1 val crop): a square of side = its longer side
/ U(0.3, 0.8), cut to the image, at a random offset keeping it whole; labels are every kept-class box clipped to
the crop, kept when >= 40 % of its area is inside and both clipped sides are >= 4 px. Train crops come only from
images/train (train2017), val crops only from images/val (val2017): the val set is held out. JPEG quality 95,
OUT/data-crops/sources.csv names each crop's source; --derive-seed (default 0) seeds the crops, the same seed
writes the same files (4 s). --crops-per-anchor N writes N training crops per anchor instead of 3 (different
random windows of the same objects: more distinct images and steps per epoch at the same validation cost). Counts with seed 0: train 411 images, boxes person 1441 / dining table 77 / bowl
225; val 200 images, boxes 857 / 37 / 38; median longer box side 0.45 of the crop (anchors 0.3-0.8 of it, the
smaller neighbours of crowds below). The counts go to OUT/results.jsonl as a first {"kind": "dataset"} line.

--backends also takes variants of our runners, BACKEND+VARIANT[+VARIANT]: the same run with one thing changed,
to find which part of a backend makes a difference: c+no-cuda-graph (the eager step), c+no-cudnn-benchmark,
c+no-amp (float32), c+unfused (YOLOV9C_FUSED=0: the c structure on torch ops instead of the kernels),
c+loss-torch / torch+loss-c (YOLOV9C_LOSS_BACKEND: one backend's model with the other's loss).

Output: one JSON line per run ({"kind": "run", "runner", "seed", "map50", "map", "best_epoch", "train_s", ...}),
then one per runner ({"kind": "summary", "runner", "n", "map50_mean", "map50_std", "map_mean", "map_std"}), and
a last line comparing them ({"kind": "compare", "<runner>_minus_published_map", "<runner>_minus_torch_map", and
"<c variant>_minus_c_map"}, points of mAP@0.5:0.95 × 100, each with a `..._paired` entry on the seeds both
runners have: n, mean and standard error of the per-seed difference, t, and how many seeds are lower, and a
`..._curve` entry: the per-epoch differences of the training loss and of the run's own validation mAP, mean over
the seeds, from each run's "curve" (its results.csv per epoch: box, cls, dfl, map)). Lines
also go to OUT/results.jsonl; a second call with the same --out keeps the runs that finished there and trains
only the others. `--rows A.jsonl B.jsonl ...` trains nothing and summarizes the runs of earlier calls (seeds
measured in several device calls). Results: benchmarks/RESULTS.md.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from accuracy_data import class_subset, crop_dataset, dataset_counts  # noqa: E402


def _emit(line, out):
    s = json.dumps(line)
    print(s, flush=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(s + "\n")


# runner variants: BACKEND+VARIANT... (e.g. c+no-cuda-graph): what each adds to our train_dual.py run. In
# benchmarks/results/accuracy_person_crops.jsonl the runner "c" rows (and torch+loss-c) predate 5f87da9: their
# assigner read the float32 decode (a variant since removed); today's c default is recorded there as c+pub-decode.
VARIANTS = {"no-cuda-graph": (["--no-cuda-graph"], {}),  # the eager step (isolates the CUDA-graph step)
            "no-cudnn-benchmark": (["--no-cudnn-benchmark"], {}),
            "no-amp": (["--no-amp"], {}),  # float32 training (isolates fp16)
            "unfused": ([], {"YOLOV9C_FUSED": "0"}),  # the c structure on torch ops (isolates the kernels)
            "loss-torch": ([], {"YOLOV9C_LOSS_BACKEND": "torch"}),  # c's model, torch's loss (isolates the loss)
            "loss-c": ([], {"YOLOV9C_LOSS_BACKEND": "c"})}  # torch's model, c's loss


def runner_spec(runner):
    """'c+no-cuda-graph' → ('c', ['--no-cuda-graph'], {}); ValueError for an unknown backend or variant."""
    backend, *variants = runner.split("+")
    if backend not in ("torch", "c"):
        raise ValueError(f"runner {runner!r}: the backend must be torch or c")
    flags, env = [], {}
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"runner {runner!r}: unknown variant {v!r} (known: {', '.join(VARIANTS)})")
        flags += VARIANTS[v][0]
        env.update(VARIANTS[v][1])
    return backend, flags, env


def train_command(a, runner, seed, project, data):
    """(argv, cwd, extra environment) of one training run."""
    name = f"{runner}-s{seed}"
    flags = ["--data", str(data), "--img", str(a.img), "--batch", str(a.batch), "--epochs", str(a.epochs),
             "--close-mosaic", str(a.close_mosaic), "--min-items", "0", "--seed", str(seed), "--device", a.device,
             "--workers", str(a.workers), "--project", str(project), "--name", name, "--exist-ok", "--noplots"]
    if a.single_cls:
        flags.append("--single-cls")
    if a.cache != "none":
        flags += ["--cache", a.cache]
    if runner == "published":
        # through the harness's published side: its stand-ins for the optional imports the published code needs
        # (IPython, pkg_resources, tensorboard, a font it would download) and its checkpoint-reading setting
        side = ROOT / "benchmarks" / "fidelity" / "published_side.py"
        cfg = f"models/detect/{a.cfg}.yaml"
        return ([a.python, str(side), "train", "--record", str(project / f"{name}.probe.json"), "--",
                 "--cfg", cfg, "--hyp", "hyp.scratch-high.yaml"] + flags, a.published, {})
    backend, extra, env = runner_spec(runner)
    if backend == "torch" and a.device != "cpu":
        extra = ["--channels-last"] + extra
    return ([sys.executable, "train_dual.py", "--cfg", f"{a.cfg}.yaml", "--hyp", "hyp.scratch-high.yaml",
             "--backend", backend] + extra + flags, ROOT, env)


def published_data_yaml(a, out):
    """The dataset yaml with an absolute `path` (the published check_dataset resolves a relative one against its
    own checkout, not the yaml's folder)."""
    import yaml

    cfg = yaml.safe_load(Path(a.data).read_text())
    root = Path(cfg.get("path") or ".")
    cfg["path"] = str(root if root.is_absolute() else (Path(a.data).resolve().parent / root).resolve())
    f = out / "data_abs.yaml"
    f.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return f


def best_epoch(run_dir):
    """Epoch of best.pt by the published rule (fitness 0.1·mAP50 + 0.9·mAP50-95, ties: the later epoch)."""
    from yolov9c.engine.train.results import read_results

    r = read_results(run_dir / "results.csv")
    fi = 0.1 * r["metrics/mAP_0.5"] + 0.9 * r["metrics/mAP_0.5:0.95"]
    return int(r["epoch"][len(fi) - 1 - int(np.argmax(fi[::-1]))])


CURVE_KEYS = {"box": "train/box_loss", "cls": "train/cls_loss", "dfl": "train/dfl_loss", "map": "metrics/mAP_0.5:0.95",
              "skipped": "skipped_steps"}  # skipped: ours only (optimizer steps skipped, AMP overflow included)


def curve(run_dir):
    """The run's per-epoch training losses and own validation mAP@0.5:0.95 (results.csv, ours and the
    published code's alike): {"box": [...], "cls": [...], "dfl": [...], "map": [...]}, 5 digits; ours also
    "skipped": the optimizer steps skipped per epoch (non-finite windows, the AMP loss-scale overflows)."""
    from yolov9c.engine.train.results import read_results

    r = read_results(run_dir / "results.csv")
    return {k: [round(float(v), 5) for v in r[col]] for k, col in CURVE_KEYS.items() if col in r}


def paired_curves(runs, runner, base):
    """runner − base by seed, epoch by epoch, on the seeds whose runs both have a curve of the same length: the
    training loss (box + cls + dfl) and the run's own validation mAP@0.5:0.95 (points × 100), each the mean
    over seeds per epoch, and the seeds where runner's last-epoch training loss is above base's. The per-epoch
    losses average ~35 batches each, so they show a difference in how fast two runners learn with fewer seeds
    than the final mAP. None for fewer than two such seeds."""
    curves = {r: {x["seed"]: x["curve"] for x in runs if x["runner"] == r and x.get("curve")} for r in (runner, base)}
    seeds = [s for s in sorted(set(curves[runner]) & set(curves[base]))
             if len(curves[runner][s]["box"]) == len(curves[base][s]["box"])]
    if len(seeds) < 2:
        return None

    def total(c):
        return np.array(c["box"]) + np.array(c["cls"]) + np.array(c["dfl"])

    loss = np.array([total(curves[runner][s]) - total(curves[base][s]) for s in seeds])
    maps = 100 * np.array([np.array(curves[runner][s]["map"]) - np.array(curves[base][s]["map"]) for s in seeds])
    out = {"n": len(seeds), "loss_by_epoch": [round(float(v), 4) for v in loss.mean(0)],
           "loss_last_higher": int((loss[:, -1] > 0).sum()),
           "map_by_epoch": [round(float(v), 3) for v in maps.mean(0)]}
    if all("skipped" in curves[r][s] for r in (runner, base) for s in seeds):  # mean skipped steps per run
        out["skipped"] = {r: round(float(np.mean([sum(curves[r][s]["skipped"]) for s in seeds])), 2)
                          for r in (runner, base)}
    return out


def validate_best(a, weights):
    from yolov9c.cli.val import build_parser, run

    opt = build_parser().parse_args(["--weights", str(weights), "--data", str(a.data), "--img", str(a.img),
                                     "--batch", str(a.val_batch), "--device", a.device, "--workers", "2",
                                     "--project", str(a.out / "val"), "--name", weights.parent.parent.name,
                                     "--exist-ok"] + (["--half"] if a.device != "cpu" else [])
                                    + (["--single-cls"] if a.single_cls else []))
    res = run(opt, log=lambda *x: None)
    return float(res["map50"]), float(res["map"])


_LIVE = set()               # the training processes running now
_STOPPING = threading.Event()   # set by SIGTERM: no further run starts


def _on_term(signum, frame):
    """SIGTERM (a `timeout` around the benchmark, a job scheduler): the training processes stop with this one
    (they ran on, orphaned, into whatever the GPU did next), no queued run starts, exit status 128 + 15."""
    _STOPPING.set()
    for p in list(_LIVE):
        p.terminate()
    raise SystemExit(128 + signum)


def run_child(argv, cwd, log, env):
    """Run one training process, its console into `log`, to its end: its exit status (-15 without starting it
    once SIGTERM has come)."""
    if _STOPPING.is_set():
        return -signal.SIGTERM
    with open(log, "w") as f:
        p = subprocess.Popen(argv, cwd=str(cwd), stdout=f, stderr=subprocess.STDOUT, env=env)
        _LIVE.add(p)
        try:
            if _STOPPING.is_set():   # SIGTERM came while it started
                p.terminate()
            return p.wait()
        finally:
            _LIVE.discard(p)


def train_run(a, runner, seed, data):
    """Train one run (its own process, console in OUT/RUNNER-sSEED.log): (runner, seed, run_dir or None, info)."""
    project = a.out / "train"
    project.mkdir(parents=True, exist_ok=True)
    argv, cwd, extra_env = train_command(a, runner, seed, project, data)
    log = a.out / f"{runner}-s{seed}.log"
    t = time.time()
    # the published strip_optimizer re-reads its own fresh checkpoints with torch.load: allowed explicitly
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", **extra_env)
    rc = run_child(argv, cwd, log, env)
    run_dir = project / f"{runner}-s{seed}"
    ok = rc == 0 and (run_dir / "weights" / "best.pt").is_file()
    return runner, seed, run_dir if ok else None, {"train_s": round(time.time() - t, 1), "rc": rc, "log": str(log)}


def run_line(a, runner, seed, run_dir, info):
    """The run's JSON line: its best.pt validated by our val_dual.py (one validator for every runner)."""
    if run_dir is None:
        return {"kind": "run", "runner": runner, "seed": seed, "error": f"exit {info['rc']}, see {info['log']}"}
    map50, mapv = validate_best(a, run_dir / "weights" / "best.pt")
    return {"kind": "run", "runner": runner, "seed": seed, "map50": map50, "map": mapv,
            "best_epoch": best_epoch(run_dir), "curve": curve(run_dir), "train_s": info["train_s"], "cfg": a.cfg,
            "img": a.img, "epochs": a.epochs, "batch": a.batch, "single_cls": a.single_cls, "classes": a.classes,
            "derive": a.derive, "jobs": a.jobs, "data": str(a.data)}


def summarize(runs):
    out = []
    for runner in dict.fromkeys(r["runner"] for r in runs):
        ok = [r for r in runs if r["runner"] == runner and "map" in r]
        if not ok:
            continue
        m50, m = np.array([r["map50"] for r in ok]), np.array([r["map"] for r in ok])
        out.append({"kind": "summary", "runner": runner, "n": len(ok),
                    "map50_mean": float(m50.mean()), "map50_std": float(m50.std(ddof=1)) if len(ok) > 1 else 0.0,
                    "map_mean": float(m.mean()), "map_std": float(m.std(ddof=1)) if len(ok) > 1 else 0.0})
    return out


def paired(runs, runner, base):
    """runner − base by seed, on the seeds both have (points of mAP@0.5:0.95 × 100): {"n", "mean", "se", "t",
    "lower"} (se: standard error of the mean difference; lower: seeds where runner is below base); None for
    fewer than two common seeds. The seed fixes the initial weights and the augmentation draws, so pairing
    removes part of the seed-to-seed spread."""
    maps = {r: {x["seed"]: x["map"] for x in runs if x["runner"] == r and "map" in x} for r in (runner, base)}
    seeds = sorted(set(maps[runner]) & set(maps[base]))
    if len(seeds) < 2:
        return None
    d = 100 * np.array([maps[runner][s] - maps[base][s] for s in seeds])
    se = float(d.std(ddof=1) / np.sqrt(len(d)))
    return {"n": len(d), "mean": round(float(d.mean()), 3), "se": round(se, 3),
            "t": round(float(d.mean()) / se, 2) if se > 0 else None, "lower": int((d < 0).sum())}


def compare(summaries, runs=()):
    """Differences of the runners' mean mAP@0.5:0.95 (points × 100), and where `runs` share seeds, the paired
    difference by seed (`<r>_minus_<base>_paired`, see paired) and the loss swap's effects (`loss_swap`, see
    swap_effects)."""
    by = {s["runner"]: s for s in summaries}
    line = {"kind": "compare"}
    for r in by:  # each of ours against published and torch; a c variant (c+...) against c as well
        for base in ("published", "torch") + (("c",) if r.startswith("c+") else ()):
            if r != "published" and base in by and base != r:
                line[f"{r}_minus_{base}_map"] = round(100 * (by[r]["map_mean"] - by[base]["map_mean"]), 3)
                pair, curves = paired(runs, r, base), paired_curves(runs, r, base)
                if pair is not None:
                    line[f"{r}_minus_{base}_paired"] = pair
                if curves is not None:
                    line[f"{r}_minus_{base}_curve"] = curves
    swap = swap_effects(runs)
    if swap is not None:
        line["loss_swap"] = swap
    return line


SWAP = ("torch", "c", "c+loss-torch", "torch+loss-c")  # model × loss: the four runners of the loss swap


def swap_effects(runs):
    """The loss swap as a 2×2 (model torch/c × loss torch/c) on the seeds where all four runners of SWAP ran:
    per seed the loss effect ((torch + c+loss-torch) − (c + torch+loss-c)) / 2 (what the torch loss gains
    over the c loss, averaged over both models) and the model effect ((c + c+loss-torch) − (torch +
    torch+loss-c)) / 2, points × 100, as {"n", "loss": {"mean", "se"}, "model": {"mean", "se"}}; None for
    fewer than two such seeds."""
    maps = {r: {x["seed"]: x["map"] for x in runs if x["runner"] == r and "map" in x} for r in SWAP}
    seeds = sorted(set.intersection(*(set(v) for v in maps.values())))
    if len(seeds) < 2:
        return None
    tt, cc, ct, tc = (100 * np.array([maps[r][s] for s in seeds]) for r in SWAP)

    def stat(d):
        return {"mean": round(float(d.mean()), 3), "se": round(float(d.std(ddof=1) / np.sqrt(len(d))), 3)}

    return {"n": len(seeds), "loss": stat(((tt + ct) - (cc + tc)) / 2), "model": stat(((cc + ct) - (tt + tc)) / 2)}


def read_rows(files):
    """The run lines of earlier results.jsonl files (several device calls' runs of one benchmark), the last line
    of each (runner, seed) kept."""
    runs = {}
    for f in files:
        for text in Path(f).read_text().splitlines():
            r = json.loads(text) if text.startswith("{") else {}
            if r.get("kind") == "run" and "map" in r:
                runs[(r["runner"], r["seed"])] = r
    return list(runs.values())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "coco128" / "data.yaml"))
    p.add_argument("--cfg", default="yolov9-s")
    p.add_argument("--img", type=int, default=640)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--val-batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--close-mosaic", type=int, default=15)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--backends", default="torch,c",
                   help="our runners: torch, c, or BACKEND+VARIANT (variants: " + ", ".join(VARIANTS) + ")")
    p.add_argument("--cache", default="ram", choices=("ram", "disk", "none"))
    p.add_argument("--device", default="0")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--published", help="published YOLOv9 checkout: also train with its train_dual.py")
    p.add_argument("--python", default=None, help="Python for the published runs (torch + torchvision)")
    p.add_argument("--single-cls", action="store_true", help="train and validate as one class (both codes' flag)")
    p.add_argument("--classes", default=None,
                   help="train and validate on these classes only, e.g. 0 (coco's person): a relabelled copy")
    p.add_argument("--derive", choices=("crops",), default=None,
                   help="crops: train and validate on crops around the large objects of a few classes (--classes, "
                        "else the 3 with most large boxes), written to OUT/data-crops")
    p.add_argument("--derive-seed", type=int, default=0, help="seed of the --derive crops (not the training seed)")
    p.add_argument("--crops-per-anchor", type=int, default=3,
                   help="--derive crops: training crops per anchor object (more steps per epoch; val keeps 1)")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at the same time (one GPU can hold several)")
    p.add_argument("--out", default=None)
    p.add_argument("--rows", nargs="+", metavar="JSONL",
                   help="train nothing: summarize and compare the run lines of these results.jsonl files")
    a = p.parse_args(argv)
    if a.rows:
        missing = [f for f in a.rows if not Path(f).is_file()]
        if missing:
            print(f"error: --rows: no such file: {', '.join(missing)}", file=sys.stderr)
            return 2
        runs = read_rows(a.rows)
        summaries = summarize(runs)
        for line in summaries + [compare(summaries, runs)]:
            print(json.dumps(line), flush=True)
        return 0 if runs else 1
    for r in (b for b in a.backends.split(",") if b):
        try:
            runner_spec(r)
        except ValueError as e:
            print(f"error: --backends: {e}", file=sys.stderr)
            return 2
    a.data = Path(a.data).resolve()
    a.out = Path(a.out or f"runs/bench-accuracy-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.derive == "crops":
        classes = [int(c) for c in a.classes.split(",")] if a.classes else None
        if a.crops_per_anchor < 1:
            print(f"error: --crops-per-anchor {a.crops_per_anchor}: give 1 or more", file=sys.stderr)
            return 2
        a.data = crop_dataset(a.data, a.out, classes, a.derive_seed, a.crops_per_anchor)
        _emit({"kind": "dataset", "derive": a.derive, "derive_seed": a.derive_seed, "data": str(a.data),
               **dataset_counts(a.data)}, a.out)
    elif a.classes:
        a.data = class_subset(a.data, [int(c) for c in a.classes.split(",")], a.out)
    runners = [b for b in a.backends.split(",") if b]
    if a.published:
        a.published = Path(a.published).resolve()
        if not (a.published / "train_dual.py").is_file():
            print(f"error: --published {a.published}: no train_dual.py there (the published YOLOv9 checkout)",
                  file=sys.stderr)
            return 2
        a.python = a.python or sys.executable
        runners.append("published")
    pub_data = published_data_yaml(a, a.out) if a.published else None
    done = {}  # runs finished by an earlier call with this --out: kept, not trained again
    if (a.out / "results.jsonl").exists():
        for line in (a.out / "results.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r.get("kind") == "run" and "map" in r:
                done[(r["runner"], r["seed"])] = r
    todo, runs = [], []
    for seed in [int(s) for s in a.seeds.split(",")]:
        for runner in runners:
            if (runner, seed) in done:
                runs.append(done[(runner, seed)])
                print(json.dumps(done[(runner, seed)]), flush=True)
            else:
                todo.append((runner, seed, pub_data if runner == "published" else a.data))
    # --jobs runs train at once (separate processes); their best.pt files are validated one after another
    signal.signal(signal.SIGTERM, _on_term)
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for trained in pool.map(lambda t: train_run(a, *t), todo):
            r = run_line(a, *trained)
            runs.append(r)
            _emit(r, a.out)
    summaries = summarize(runs)
    for s in summaries:
        _emit(s, a.out)
    _emit(compare(summaries, runs), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
