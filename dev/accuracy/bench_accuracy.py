r"""Real-data accuracy benchmark: ours (--backend torch, c) and, given --published, the published train_dual.py,
trained from scratch with one recipe and several seeds; best.pt mAP@0.5 and mAP@0.5:0.95 per run and compared.

    python dev/accuracy/bench_accuracy.py --data DIR/data.yaml --cfg yolov9-s --img 640 --batch 32 --epochs 60 \
        --close-mosaic 15 --seeds 0,1,2 --backends torch,c --jobs 9 [--published CHECKOUT --python PY] --out OUT

Runs: one train_dual.py process each (the published one through dev/fidelity/published_side.py), the same
flags, --jobs at once; every best.pt validated by our val_dual.py. Data: a YOLO data.yaml (accuracy_datasets.py),
or coco128 with --single-cls, --classes or --derive. --backends takes variants BACKEND+VARIANT (VARIANTS,
LOSS_VARIANTS, unfused: dev/accuracy/train_unfused.py, microN: dev/accuracy/train_micro.py).
Output (stdout and OUT/results.jsonl): {"kind": "run"} per run, {"kind": "summary"} per runner, {"kind":
"compare"} (paired by-seed differences), a report on stderr and the per-epoch val mAP plot (--plot). `--rows
FILES` only summarizes earlier run lines. A second call with the same --out keeps finished runs; --time-limit S
stops runs at a quiet moment ({"kind": "unfinished"}) and the next call resumes them. A published run resumed
after epoch − close_mosaic keeps mosaic (its own rule) and is marked "published_mosaic_not_closed".
Runs share the card: a run starts only when its estimate (RUN_GIB, --run-gib) fits beside the running ones in
--card-gib (default: the card's total), so no run is split by our out-of-memory guard because of the others; a
run the guard split anyway (its BatchNorm saw micro-batches, not the batch) is marked "split_micro_batch" and
left out of the summaries and comparisons (the report names it).
Tests: dev/tests/test_bench_accuracy.py. Results: benchmarks/RESULTS.md.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SWAP_LOADER = ROOT / "dev" / "fidelity" / "swap_loader.py"  # the arms that exchange the two codes' loaders

from accuracy_data import class_subset, crop_dataset, dataset_counts  # noqa: E402


def _emit(line, out):
    s = json.dumps(line)
    print(s, flush=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(s + "\n")


# runner variants: BACKEND+VARIANT... (e.g. c+no-cuda-graph): what each adds to our train_dual.py run. In
# dev/results/accuracy_person_crops.jsonl the runner "c" rows (and torch+loss-c) predate 5f87da9: their
# assigner read the float32 decode (a variant since removed); today's c default is recorded there as c+pub-decode.
VARIANTS = {"no-cuda-graph": (["--no-cuda-graph"], {}),  # the eager step (isolates the CUDA-graph step)
            "deterministic": (["--deterministic"], {}),  # deterministic algorithms, as the published code always
            "no-channels-last": (["--no-channels-last"], {}),  # contiguous model and batches
            "no-cudnn-benchmark": (["--no-cudnn-benchmark"], {}),
            "no-amp": (["--no-amp"], {}),  # float32 training (isolates fp16)
            "no-graph-shapes": (["--no-graph-shapes"], {})}  # the fixed-shape graph step of runs before ceed9cd
# variants that train through dev/accuracy/train_other_loss.py: one backend's model with the other's loss
LOSS_VARIANTS = {"loss-torch": "torch",  # c's model, torch's loss (isolates the loss)
                 "loss-c": "c"}  # torch's model, c's loss
# the c structure on torch ops (isolates the kernels), through dev/accuracy/train_unfused.py: validation's NMS stays
# on the extension (its reference made an epoch's validation take minutes)
UNFUSED = ([str(Path("dev") / "accuracy" / "train_unfused.py")], {"YOLOV9C_FUSED": "0"})
# microN: every batch split into micro-batches of N images, as our out-of-memory guard splits one (train_micro.py)
MICRO = [str(Path("dev") / "accuracy" / "train_micro.py")]
TRAIN = ["train_dual.py"]
PUB_LOADER = ["<pub-loader>"]  # variant pub-loader: the published training loader feeding our loop (swap_loader.py)


def _entry(a, entry):
    """The script and leading arguments of runner_spec, the published checkout filled in for pub-loader."""
    if entry == PUB_LOADER:
        return [str(SWAP_LOADER), "ours-loop", "--published", str(a.published), "--"]
    return entry


PUBLISHED_RUNNERS = ("published", "published+ours-loader")  # the published loop (the second on our loader)

# GiB of the card one run holds at yolov9-s, batch 32, 640 (allocator peak, validation included, plus the CUDA
# context; H100 fruit runs of 2026-12-07: c 5.6 + 0.8; torch above 14.5 + 0.8, where its first epoch ran out
# beside nine others; published: half its batch-64 peak of 50.3 + 0.8), scaled by batch × img² for other
# recipes; --run-gib RUNNER=GIB overrides (per runner name or backend)
RUN_GIB = {"published": 26.0, "torch": 17.0, "c": 6.5}
# the out-of-memory guard's line (engine/train/guards.back_off) and the micro-batch it chose
SPLIT = re.compile(r"CUDA out of memory at iteration \d+ with a micro-batch of \d+ images: retrying the same "
                   r"batch as \d+ micro-batches of (\d+)")


def run_gib(a, runner):
    """The card GiB `runner` is expected to hold: --run-gib's figure for the runner (or its backend), else
    RUN_GIB's for its backend scaled by (batch / 32) · (img / 640)²."""
    backend = "published" if runner in PUBLISHED_RUNNERS else runner.split("+")[0]
    given = a.run_gib or {}
    if runner in given or backend in given:
        return given.get(runner, given.get(backend))
    return RUN_GIB[backend] * (a.batch / 32) * (a.img / 640) ** 2


class CardShare:
    """The card's GiB among the runs training at once: take(gib) waits until gib fits beside the runs holding
    memory (a run alone on the card always starts), give(gib) returns it. card_gib None: no waiting."""

    def __init__(self, card_gib):
        self.card, self.held, self.runs = card_gib, 0.0, 0
        self.cond = threading.Condition()

    def take(self, gib):
        with self.cond:
            while self.card is not None and self.runs and self.held + gib > self.card and not _STOPPING.is_set():
                self.cond.wait(timeout=1.0)
            self.held, self.runs = self.held + gib, self.runs + 1

    def give(self, gib):
        with self.cond:
            self.held, self.runs = self.held - gib, self.runs - 1
            self.cond.notify_all()


def card_total_gib(device):
    """The total memory of CUDA `device` (the first id of a list) in GiB from nvidia-smi, None without one."""
    dev = str(device).split(",")[0].strip()
    if not dev.isdigit():
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", dev],
                             capture_output=True, text=True, timeout=10).stdout.split()
        return float(out[0]) / 1024 if out else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def _gib_spec(text):
    """'torch=16,c=6.5' → {'torch': 16.0, 'c': 6.5} (argparse type)."""
    try:
        return {k.strip(): float(v) for k, v in (item.split("=") for item in text.split(",") if item.strip())}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give RUNNER=GIB pairs, e.g. torch=16,c=6.5") from None


def split_micro_batch(log):
    """The micro-batch our out-of-memory guard last split the run's batch into (its console `log`), None when
    it never did (or the file is missing)."""
    try:
        found = SPLIT.findall(Path(log).read_text(errors="replace"))
    except OSError:
        return None
    return int(found[-1]) if found else None


def runner_spec(runner):
    """'c+no-cuda-graph' → ('c', ['--no-cuda-graph'], {}, TRAIN): the backend, the added flags and environment,
    and the script (with its leading arguments) that trains it; ValueError for an unknown backend or variant."""
    backend, *variants = runner.split("+")
    if runner in PUBLISHED_RUNNERS:
        return "published", [], {}, None
    if backend not in ("torch", "c"):
        raise ValueError(f"runner {runner!r}: the backend must be torch or c")
    flags, env, entries = [], {}, []
    for v in variants:
        if v == "pub-loader":
            entries.append(PUB_LOADER)
        elif v in LOSS_VARIANTS:
            entries.append([str(Path("dev") / "accuracy" / "train_other_loss.py"), LOSS_VARIANTS[v]])
        elif v == "unfused":
            entries.append(UNFUSED[0])
            env.update(UNFUSED[1])
        elif re.fullmatch(r"micro[1-9]\d*", v):
            entries.append(MICRO)
            env["YOLOV9C_MICRO_BATCH"] = v[len("micro"):]
        elif v in VARIANTS:
            flags += VARIANTS[v][0]
            env.update(VARIANTS[v][1])
        else:
            raise ValueError(f"runner {runner!r}: unknown variant {v!r} (known: "
                             f"{', '.join([*VARIANTS, *LOSS_VARIANTS, 'unfused', 'microN', 'pub-loader'])})")
    if len(entries) > 1:
        raise ValueError(f"runner {runner!r}: pub-loader, loss-*, unfused and microN each train through their own "
                         "script: one of them per runner")
    return backend, flags, env, entries[0] if entries else TRAIN


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
    if a.save_period > 0:
        flags += ["--save-period", str(a.save_period)]
    pub_flags = ["--cfg", f"models/detect/{a.cfg}.yaml", "--hyp", "hyp.scratch-high.yaml"] + flags
    if runner == "published":
        # through the harness's published side: its stand-ins for the optional imports the published code needs
        # (IPython, pkg_resources, tensorboard, a font it would download) and its checkpoint-reading setting
        side = ROOT / "dev" / "fidelity" / "published_side.py"
        return [a.python, str(side), "train", "--"] + pub_flags, a.published, {}
    if runner == "published+ours-loader":
        return [a.python, str(SWAP_LOADER), "published-loop", "--published", str(a.published), "--"] + pub_flags, \
            a.published, {}
    backend, extra, env, entry = runner_spec(runner)
    if backend == "torch" and a.device != "cpu" and "--no-channels-last" not in extra:
        extra = ["--channels-last"] + extra
    return ([sys.executable, *_entry(a, entry), "--cfg", f"{a.cfg}.yaml", "--hyp", "hyp.scratch-high.yaml",
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


def read_epochs(run_dir):
    """The run's results.csv (column → array), one row per epoch: an epoch written twice (a published run stopped
    between its row and its last.pt, then resumed) keeps its later row."""
    from yolov9c.engine.train.results import read_results

    r = read_results(run_dir / "results.csv")
    epochs = r["epoch"]
    keep = [i for i in range(len(epochs)) if epochs[i] not in epochs[i + 1:]]
    return {k: v[keep] for k, v in r.items()}


def best_epoch(run_dir):
    """Epoch of best.pt by the published rule (fitness 0.1·mAP50 + 0.9·mAP50-95, ties: the later epoch)."""
    r = read_epochs(run_dir)
    fi = 0.1 * r["metrics/mAP_0.5"] + 0.9 * r["metrics/mAP_0.5:0.95"]
    return int(r["epoch"][len(fi) - 1 - int(np.argmax(fi[::-1]))])


CURVE_KEYS = {"box": "train/box_loss", "cls": "train/cls_loss", "dfl": "train/dfl_loss", "map": "metrics/mAP_0.5:0.95",
              "skipped": "skipped_steps"}  # skipped: ours only (optimizer steps skipped, AMP overflow included)


def curve(run_dir):
    """The run's per-epoch training losses and own validation mAP@0.5:0.95 (results.csv, ours and the
    published code's alike): {"box": [...], "cls": [...], "dfl": [...], "map": [...]}, 5 digits; ours also
    "skipped": the optimizer steps skipped per epoch (non-finite windows, the AMP loss-scale overflows)."""
    r = read_epochs(run_dir)
    return {k: [round(float(v), 5) for v in r[col]] for k, col in CURVE_KEYS.items() if col in r}


TAIL_EPOCHS = 10  # paired_tail: the last epochs' own validation mAP, averaged


def paired_tail(runs, runner, base):
    """runner − base by seed of the mean own validation mAP@0.5:0.95 over the last TAIL_EPOCHS epochs (points ×
    100), on the seeds whose runs both have a map curve of the same length: {"n", "epochs", "mean", "se"};
    steadier than one best.pt on a set still rising at the end. None for fewer than two such seeds."""
    curves = {r: {x["seed"]: x["curve"]["map"] for x in runs if x["runner"] == r and (x.get("curve") or {}).get("map")}
              for r in (runner, base)}
    seeds = [s for s in sorted(set(curves[runner]) & set(curves[base]))
             if len(curves[runner][s]) == len(curves[base][s])]
    if len(seeds) < 2:
        return None
    maps = 100 * np.array([np.array(curves[runner][s]) - np.array(curves[base][s]) for s in seeds])
    tail = maps[:, -TAIL_EPOCHS:].mean(1)
    return {"n": len(seeds), "epochs": int(min(TAIL_EPOCHS, maps.shape[1])), "mean": round(float(tail.mean()), 3),
            "se": round(float(tail.std(ddof=1) / np.sqrt(len(tail))), 3)}


def paired_curves(runs, runner, base):
    """runner − base by seed, epoch by epoch, on the seeds whose runs both have a curve of the same length: the
    training loss (box + cls + dfl) and the run's own validation mAP@0.5:0.95 (points × 100), each the mean
    over seeds per epoch, and the seeds where runner's last-epoch training loss is above base's. The per-epoch
    losses average ~35 batches each, so they show a difference in how fast two runners learn with fewer seeds
    than the final mAP; `map_tail`: see paired_tail. None for fewer than two such seeds."""
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
    out["map_tail"] = paired_tail(runs, runner, base)
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


_LIVE = {}                  # the training processes running now → their run folders
_STOPPING = threading.Event()   # set by SIGTERM or --time-limit: no further run starts
QUIET_S = 2.0               # --time-limit stops a run once its folder has had no write for this long
QUIET_WAIT_S = 90.0         # ... or after this long anyway (an epoch that writes constantly)


def stop_child(p):
    """Terminate a training process, first asking it for its Python stacks (SIGUSR1: both trainers print them to
    their log, train_dual.py and published_side.py register it), so that a stopped run's log says where it was."""
    if p.poll() is None and hasattr(signal, "SIGUSR1"):
        p.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
    p.terminate()


def child_threads(jobs, cores=None):
    """CPU threads per training process when `jobs` share the host's cores: max(1, cores // jobs) (each
    process's loader workers come on top; more threads only spin at OpenMP barriers)."""
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    return max(1, cores // max(1, jobs))


def on_sigterm(signum, frame):
    """SIGTERM (a `timeout` around the benchmark, a job scheduler): the training processes stop with this one
    (they ran on, orphaned, into whatever the GPU did next), no queued run starts, exit status 128 + 15."""
    _STOPPING.set()
    for p in list(_LIVE):
        stop_child(p)
    raise SystemExit(128 + signum)


def quiet(run_dir, seconds=QUIET_S, now=None):
    """True when nothing in the run folder's results.csv or weights/ was written in the last `seconds`: the
    run is inside an epoch, not in the middle of its end-of-epoch saves (the published saves are not atomic)."""
    files = [run_dir / "results.csv"] + (sorted((run_dir / "weights").iterdir()) if (run_dir / "weights").is_dir()
                                         else [])
    times = [f.stat().st_mtime for f in files if f.exists()]
    return not times or (now if now is not None else time.time()) - max(times) > seconds


def stop_at(deadline):
    """--time-limit: at `deadline` (time.time()) no further run starts and each running one is terminated at
    its first quiet moment (see quiet; after QUIET_WAIT_S anyway). Runs in a daemon thread."""
    time.sleep(max(0.0, deadline - time.time()))
    _STOPPING.set()
    while _LIVE:
        for p, run_dir in list(_LIVE.items()):
            if run_dir is None or quiet(run_dir) or time.time() - deadline > QUIET_WAIT_S:
                stop_child(p)
        time.sleep(0.2)


def run_child(argv, cwd, log, env, run_dir=None):
    """Run one training process (writing `run_dir`), its console appended to `log`, to its end: its exit status
    (-15 without starting it once SIGTERM or the time limit has come)."""
    if _STOPPING.is_set():
        return -signal.SIGTERM
    with open(log, "a") as f:
        p = subprocess.Popen(argv, cwd=str(cwd), stdout=f, stderr=subprocess.STDOUT, env=env)
        _LIVE[p] = run_dir
        try:
            if _STOPPING.is_set():   # SIGTERM came while it started
                p.terminate()
            return p.wait()
        finally:
            _LIVE.pop(p, None)


def epochs_done(run_dir):
    """Epochs the run has finished (rows of its results.csv; 0 without one)."""
    return len(read_epochs(run_dir)["epoch"]) if (run_dir / "results.csv").is_file() else 0


def resume_command(a, runner, seed, project):
    """(argv, cwd, extra environment) continuing a stopped run from its last.pt: train_dual.py --resume (the run's
    own options come from its opt.yaml; a variant's environment is given again)."""
    name = f"{runner}-s{seed}"
    last = str(project / name / "weights" / "last.pt")
    if runner == "published":
        side = ROOT / "dev" / "fidelity" / "published_side.py"
        return [a.python, str(side), "train", "--", "--resume", last], a.published, {}
    if runner == "published+ours-loader":
        return [a.python, str(SWAP_LOADER), "published-loop", "--published", str(a.published), "--", "--resume", last], \
            a.published, {}
    _, _, env, entry = runner_spec(runner)
    return [sys.executable, *_entry(a, entry), "--resume", last], ROOT, env


def queue_order(todo):
    """The runs in the order they start: the published loop's first (its runs take about twice ours, so with fewer
    --jobs than runs a published run queued last would double the matrix's time), each group in seed order."""
    return sorted(todo, key=lambda t: t[0] not in PUBLISHED_RUNNERS)


def train_run(a, runner, seed, data):
    """Train one run (its own process, console in OUT/RUNNER-sSEED.log), or continue it from its last.pt when an
    earlier call's --time-limit stopped it, or only return it when its training is complete: (runner, seed,
    run_dir or None, info); info["stopped"] when the time limit or SIGTERM ended it."""
    project = a.out / "train"
    project.mkdir(parents=True, exist_ok=True)
    run_dir = project / f"{runner}-s{seed}"
    done_epochs = epochs_done(run_dir) if (run_dir / "weights" / "last.pt").is_file() else 0
    if done_epochs >= a.epochs and (run_dir / "weights" / "best.pt").is_file():
        return runner, seed, run_dir, {"train_s": 0.0, "rc": 0, "log": ""}   # trained; its validation is left
    resume = done_epochs > 0
    argv, cwd, extra_env = (resume_command(a, runner, seed, project) if resume
                            else train_command(a, runner, seed, project, data))
    log = a.out / f"{runner}-s{seed}.log"
    if not resume and log.exists():
        log.unlink()
    t = time.time()
    # the published strip_optimizer re-reads its own fresh checkpoints with torch.load: allowed explicitly
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", **extra_env)
    if not (env.get("OMP_NUM_THREADS") or env.get("MKL_NUM_THREADS")):  # --jobs processes share the cores
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(child_threads(a.jobs))
    gib = run_gib(a, runner)
    a.share.take(gib)
    try:
        rc = run_child(argv, cwd, log, env, run_dir)
    finally:
        a.share.give(gib)
    ok = rc == 0 and (run_dir / "weights" / "best.pt").is_file()
    info = {"train_s": round(time.time() - t, 1), "rc": rc, "log": str(log), "stopped": rc != 0 and _STOPPING.is_set()}
    if resume:
        info["resumed_at"] = done_epochs
    return runner, seed, run_dir if ok else None, info


def run_line(a, runner, seed, run_dir, info, history=()):
    """The run's JSON line: its best.pt validated by our val_dual.py (one validator for every runner); an
    {"kind": "unfinished"} line when the time limit stopped it. `history`: the earlier calls' unfinished lines
    of this run (their training time and resume epochs are added)."""
    project = a.out / "train"
    history = [h for h in history if h.get("epochs_done")]   # stopped before its first epoch: started afresh
    earlier_s = sum(h.get("train_s", 0.0) for h in history)
    resumed_at = [h["epochs_done"] for h in history]
    if info.get("stopped"):  # its curve so far too: a call's report and plot show where the runs stand
        stopped = project / f"{runner}-s{seed}"
        line = {"kind": "unfinished", "runner": runner, "seed": seed, "epochs_done": epochs_done(stopped),
                "train_s": info["train_s"]}
        if line["epochs_done"]:
            line["curve"] = curve(stopped)
        return line
    if run_dir is None:
        return {"kind": "run", "runner": runner, "seed": seed, "error": f"exit {info['rc']}, see {info['log']}"}
    map50, mapv = validate_best(a, run_dir / "weights" / "best.pt")
    line = {"kind": "run", "runner": runner, "seed": seed, "map50": map50, "map": mapv,
            "best_epoch": best_epoch(run_dir), "curve": curve(run_dir),
            "train_s": round(info["train_s"] + earlier_s, 1), "cfg": a.cfg, "img": a.img, "epochs": a.epochs,
            "batch": a.batch, "single_cls": a.single_cls, "classes": a.classes, "derive": a.derive, "jobs": a.jobs,
            "data": str(a.data)}
    split = split_micro_batch(info["log"]) if info.get("log") else None
    if split:
        line["split_micro_batch"] = split
    if resumed_at:
        line["resumed_at"] = resumed_at
        if runner in PUBLISHED_RUNNERS and max(resumed_at) > a.epochs - a.close_mosaic > 0:
            line["published_mosaic_not_closed"] = True   # its close-mosaic test is epoch == epochs − N only
    return line


def summarize(runs):
    """One line per runner: n, mean, sample standard deviation (ddof 1) and standard error of the mean (std /
    √n) of mAP@0.5 and mAP@0.5:0.95 over its runs (std and se 0 for one run)."""
    out = []
    for runner in dict.fromkeys(r["runner"] for r in runs):
        ok = [r for r in runs if r["runner"] == runner and "map" in r]
        if not ok:
            continue
        line = {"kind": "summary", "runner": runner, "n": len(ok)}
        for key in ("map50", "map"):
            v = np.array([r[key] for r in ok])
            std = float(v.std(ddof=1)) if len(v) > 1 else 0.0
            line.update({f"{key}_mean": float(v.mean()), f"{key}_std": std, f"{key}_se": std / np.sqrt(len(v))})
        out.append(line)
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


def report_lines(summaries, runs):
    """The human report: per runner n, mAP@0.5 and mAP@0.5:0.95 as mean ± standard error (points × 100), then
    the paired differences by seed (paired: best.pt; paired_tail: the last epochs' own validation) of each of
    ours − published, of c (and its variants) − torch and of each c variant − c."""
    lines = [f"{'runner':<16} {'n':>2}  {'mAP@0.5':>15}  {'mAP@0.5:0.95':>15}"]
    for x in summaries:
        lines.append(f"{x['runner']:<16} {x['n']:>2}  {100 * x['map50_mean']:7.2f} ± {100 * x['map50_se']:5.2f}"
                     f"  {100 * x['map_mean']:7.2f} ± {100 * x['map_se']:5.2f}")
    names = [x["runner"] for x in summaries]
    pairs = [(r, "published") for r in names if r != "published"] + [(r, "torch") for r in names
                                                                     if r.startswith("c")] \
        + [(r, "c") for r in names if r.startswith("c+")]
    for r, base in pairs:
        if base in names:
            d = paired(runs, r, base)
            if d is not None:
                lines.append(f"{r} − {base}: {d['mean']:+.2f} ± {d['se']:.2f} points mAP@0.5:0.95, paired by seed "
                             f"(n {d['n']}, t {d['t']}, lower in {d['lower']})")
            t = paired_tail(runs, r, base)
            if t is not None:
                lines.append(f"{r} − {base}: {t['mean']:+.2f} ± {t['se']:.2f} points, own validation mAP@0.5:0.95 "
                             f"of the last {t['epochs']} epochs, paired by seed (n {t['n']})")
    return lines


def report(summaries, runs, split=()):
    """report_lines on stderr, then the runs left out because the out-of-memory guard split their batch."""
    lines = report_lines(summaries, runs)
    if split:
        lines.append("left out (our out-of-memory guard split the batch: BatchNorm over micro-batches; runs shared "
                     "the card): " + ", ".join(f"{r['runner']}-s{r['seed']} ({r['split_micro_batch']})" for r in split))
    for line in lines:
        print(line, file=sys.stderr, flush=True)


def whole_batch(runs):
    """(runs trained at their batch, runs the out-of-memory guard split: "split_micro_batch")."""
    return [r for r in runs if not r.get("split_micro_batch")], [r for r in runs if r.get("split_micro_batch")]


def plot_curves(runs, png):
    """A PNG of every run's per-epoch validation mAP@0.5:0.95 (its results.csv: thin lines) and each runner's
    mean over its seeds (thick, on the epochs all its runs have), one colour per runner."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), tight_layout=True)
    for i, runner in enumerate(dict.fromkeys(r["runner"] for r in runs)):
        maps = [r["curve"]["map"] for r in runs if r["runner"] == runner and r.get("curve")]
        if not maps:
            continue
        colour = f"C{i}"
        for m in maps:
            ax.plot(range(len(m)), m, color=colour, linewidth=0.7, alpha=0.4)
        n = min(len(m) for m in maps)
        ax.plot(range(n), np.mean([m[:n] for m in maps], 0), color=colour, linewidth=2.2,
                label=f"{runner} (mean of {len(maps)})")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("epoch")
    ax.set_ylabel("val mAP@0.5:0.95 (per-epoch, own validation)")
    ax.grid(alpha=0.3)
    ax.legend()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return Path(png)


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
                   help="our runners: torch, c, or BACKEND+VARIANT (variants: "
                        + ", ".join([*VARIANTS, *LOSS_VARIANTS, "unfused", "microN"])
                        + "); with --published also published and "
                        "published+ours-loader (the published loop on our loader; when a published runner is "
                        "listed, the plain one is not added)")
    p.add_argument("--cache", default="ram", choices=("ram", "disk", "none"))
    p.add_argument("--save-period", type=int, default=-1,
                   help="every run keeps weights/epochN.pt every N epochs (both codes' --save-period): checkpoints "
                        "of the learning phase for dev/fidelity/backend_grads.py; off below 1")
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
    p.add_argument("--jobs", type=int, default=1,
                   help="runs trained at the same time at most (one GPU holds several; each starts when its share "
                        "fits: --card-gib, --run-gib)")
    p.add_argument("--card-gib", type=float, default=None,
                   help="GiB the runs share (default: the card's total from nvidia-smi; none read: no limit)")
    p.add_argument("--run-gib", type=_gib_spec, default=None, metavar="RUNNER=GIB,...",
                   help="a run's GiB on the card per runner or backend (default: RUN_GIB scaled to the recipe)")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="stop the runs still training after S seconds (resumed by the next call with this --out)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="per-epoch val mAP curves of every run (default after training: OUT/curves.png)")
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
        kept, split = whole_batch(runs)
        summaries = summarize(kept)
        for line in summaries + [compare(summaries, kept)]:
            print(json.dumps(line), flush=True)
        report(summaries, kept, split)
        if a.plot and any(r.get("curve") for r in runs):
            plot_curves(runs, Path(a.plot))
        return 0 if runs else 1
    if a.time_limit is not None and a.time_limit <= 0:
        print(f"error: --time-limit {a.time_limit:g}: give a number of seconds above 0", file=sys.stderr)
        return 2
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
        if not any(r in PUBLISHED_RUNNERS for r in runners):  # listed in --backends: only those published arms
            runners.append("published")
    elif any(r in PUBLISHED_RUNNERS or "pub-loader" in r.split("+") for r in runners):
        print("error: --backends: the published arms need --published CHECKOUT", file=sys.stderr)
        return 2
    pub_data = published_data_yaml(a, a.out) if a.published else None
    done, history = {}, {}  # runs finished by an earlier call with this --out: kept, not trained again
    if (a.out / "results.jsonl").exists():
        for line in (a.out / "results.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r.get("kind") == "run" and "map" in r:
                done[(r["runner"], r["seed"])] = r
            elif r.get("kind") == "unfinished":   # stopped by an earlier call's --time-limit: resumed below
                history.setdefault((r["runner"], r["seed"]), []).append(r)
    todo, runs = [], []
    for seed in [int(s) for s in a.seeds.split(",")]:
        for runner in runners:
            if (runner, seed) in done:
                runs.append(done[(runner, seed)])
                print(json.dumps(done[(runner, seed)]), flush=True)
            else:
                todo.append((runner, seed, pub_data if runner in PUBLISHED_RUNNERS else a.data))
    todo = queue_order(todo)
    # --jobs runs train at once (separate processes); their best.pt files are validated one after another
    signal.signal(signal.SIGTERM, on_sigterm)
    if a.time_limit:
        threading.Thread(target=stop_at, args=(time.time() + a.time_limit,), daemon=True).start()
    a.share = CardShare(a.card_gib if a.card_gib is not None else card_total_gib(a.device))
    unfinished = []
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for trained in pool.map(lambda t: train_run(a, *t), todo):
            r = run_line(a, *trained, history=history.get(trained[:2], ()))
            (runs if r["kind"] == "run" else unfinished).append(r)
            _emit(r, a.out)
    kept, split = whole_batch(runs)
    summaries = summarize(kept)
    for s in summaries:
        _emit(s, a.out)
    _emit(compare(summaries, kept), a.out)
    report(summaries, kept, split)
    for r in unfinished:  # where a stopped run stands: its own per-epoch validation so far
        best = max(r["curve"]["map"]) if r.get("curve") else float("nan")
        print(f"unfinished {r['runner']}-s{r['seed']}: {r['epochs_done']} epoch(s), best own-val mAP@0.5:0.95 so "
              f"far {best:.4f}")
    if any(r.get("curve") for r in runs + unfinished):  # unfinished runs drawn up to their last epoch
        plot_curves(runs + unfinished, Path(a.plot) if a.plot else a.out / "curves.png")
    if unfinished:
        print(f"{len(unfinished)} run(s) stopped by --time-limit: run the same command again (same --out) to "
              f"resume them", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
