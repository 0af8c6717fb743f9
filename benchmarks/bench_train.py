"""The real train_dual.py at the published batch: peak memory, img/s and epoch time per model and backend.

    python benchmarks/bench_train.py                                   # yolov9-s/c/e, c and torch, batch 64, 640
    python benchmarks/bench_train.py --models yolov9-s --backends c --images 1024 --workers 8
    python benchmarks/bench_train.py --table rows.jsonl                # the markdown table of saved lines
    python benchmarks/bench_train.py --models yolov9-s yolov9-c yolov9-e --backends c --epochs 2 \
        --mem-cap yolov9-s=7.0,yolov9-c=14.0,yolov9-e=22.0               # the whole run under 8/16/24 GB cards
    python benchmarks/bench_train.py --models yolov9-s yolov9-c yolov9-e --backends c --epochs 2 \
        --mem-cap yolov9-s=5.0,yolov9-c=10.5,yolov9-e=14.0 --mem-budget auto   # 6/12/16 GB, the plan's choices

Data: the built-in synthetic generator at --img, --images train and 16 val images, written into --root (reused
when present). Each configuration runs `train_dual.py --data D --cfg M.yaml --batch-size B --img I --epochs 1
--workers W --backend K --noplots --exist-ok` in its own process (out of memory is a row; its console goes to
ROOT/logs/MODEL-BACKEND-bB-I.log). One JSON line per configuration: peak allocated / reserved GiB of the training
epoch (read before its validation), epoch seconds and img/s from results.csv (cuDNN tuning included). With
--mem-cap the run's own --mem-cap (the whole process capped as that card would be) and --epochs N (validation after
each): the cap, the validation batch the run ended with, img/s of the last epoch and the peaks of every phase
(start-up, first epoch with the warm-up and capture, train, validation, saving, final validation), and the
planner's prediction of them (memory_phases.py). Every row: the card's largest memory.used while the process ran
(nvidia-smi every 0.2 s: its CUDA context and whatever else the card holds). --val-chunks auto: the run's
validation in chunks beside the CUDA-graph pool. --mem-budget auto: the run plans from the card (under --mem-cap:
the cap); the row adds what it chose (its opt.yaml) and the prediction is the plan's.
PYTORCH_CUDA_ALLOC_CONF is the trainer's default (expandable_segments:True) unless set.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import runpy
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the dataset writer imports yolov9c in this process too
from yolov9c.units import GIB  # noqa: E402


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["yolov9-s", "yolov9-c", "yolov9-e"])
    p.add_argument("--backends", nargs="+", default=["c", "torch"], choices=("c", "torch"))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--img", type=int, default=640)
    p.add_argument("--images", type=int, default=1536, help="train images (batch 64: 24 steps)")
    p.add_argument("--val-images", type=int, default=16,
                   help="validation images (128: the published validation batch of 2 x 64 is filled)")
    p.add_argument("--boxes", type=int, default=40, help="at most this many shapes per image (at least half)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--gpu-augment", action="store_true", help="train with --gpu-augment (the augment op)")
    p.add_argument("--cache", choices=("ram", "disk"), default=None, help="train with --cache ram|disk")
    p.add_argument("--procs", type=int, default=os.cpu_count() or 1, help="processes writing the dataset")
    p.add_argument("--root", default="/tmp/yolov9c_bench_train", help="dataset and run folders")
    p.add_argument("--timeout", type=float, default=300, help="seconds per configuration")
    p.add_argument("--epochs", type=int, default=1, help="epochs per run (each validated)")
    p.add_argument("--mem-cap", default=None, metavar="SPEC",
                   help="the run's --mem-cap in GiB: one number, or MODEL=GIB,... per model (others uncapped)")
    p.add_argument("--val-chunks", choices=("off", "auto"), default=None,
                   help="the run's --val-chunks (auto: validation in chunks beside the CUDA-graph pool); not given: "
                        "the run's default (auto), or what the memory plan chooses")
    p.add_argument("--mem-budget", default=None, metavar="SIZE|auto",
                   help="the run's --mem-budget (auto: the plan from the card, or from --mem-cap's cap)")
    p.add_argument("--data-only", action="store_true", help="only write the dataset")
    p.add_argument("--table", metavar="JSONL", help="only print the markdown table of saved JSON lines")
    p.add_argument("--one", nargs=3, metavar=("MODEL", "BACKEND", "DATA"), help=argparse.SUPPRESS)
    return p


# ---------------------------------------------------------------------------------------------------------
# dataset

def _write(args):
    folder, split, sid, i, imgsz, boxes = args
    import cv2
    import numpy as np

    from yolov9c.data.synthetic import make_image

    cv2.setNumThreads(1)
    rng = np.random.default_rng([0, sid, i])
    img, rows = make_image(rng, imgsz, boxes)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    (Path(folder) / "images" / split / f"{i:06d}.jpg").write_bytes(buf.tobytes())
    (Path(folder) / "labels" / split / f"{i:06d}.txt").write_text("".join(r + "\n" for r in rows))


def make_dataset(root, n_train, imgsz, max_boxes, procs, n_val=16):
    """data.yaml of the benchmark set under root (written once, in parallel; complete folders only)."""
    from yolov9c.data.synthetic import NAMES

    out = Path(root) / (f"synthetic-{n_train}-{imgsz}-b{max_boxes}" + (f"-v{n_val}" if n_val != 16 else ""))
    if (out / "data.yaml").is_file():
        return out / "data.yaml"
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    jobs = []
    for split, n, sid in (("train", n_train, 0), ("val", n_val, 1)):
        (tmp / "images" / split).mkdir(parents=True, exist_ok=True)
        (tmp / "labels" / split).mkdir(parents=True, exist_ok=True)
        jobs += [(str(tmp), split, sid, i, imgsz, (max(1, max_boxes // 2), max_boxes)) for i in range(n)]
    with ProcessPoolExecutor(max_workers=max(1, procs)) as pool:
        list(pool.map(_write, jobs, chunksize=16))
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(NAMES))
    (tmp / "data.yaml").write_text(f"path: .\ntrain: images/train\nval: images/val\nnc: {len(NAMES)}\n"
                                   f"names:\n{names}\n")
    os.rename(tmp, out)
    return out / "data.yaml"


# ---------------------------------------------------------------------------------------------------------
# one configuration (its own process)

def run_one(model, backend, data, args):
    import torch
    import yaml

    from yolov9c.engine.train import trainer

    import yolov9c.cli.train as cli_train

    peaks, result = {}, {}
    validate = trainer._validate
    inner_train = cli_train.train

    def keep_result(*a, **k):  # train()'s dict: the phase peaks and the validation batch
        out = inner_train(*a, **k)
        result.update(out)
        return out

    cli_train.train = keep_result

    def first_validate(*a, **k):  # the training epoch's peaks, before validation allocates anything
        if not peaks and torch.cuda.is_available():
            torch.cuda.synchronize()
            peaks.update(train_peak_alloc_gib=round(torch.cuda.max_memory_allocated() / GIB, 3),
                         train_peak_reserved_gib=round(torch.cuda.max_memory_reserved() / GIB, 3))
        return validate(*a, **k)

    trainer._validate = first_validate
    cap = cap_for(args.mem_cap, model)
    name = f"{model}-{backend}" + (f"-cap{cap:g}" if cap else "") + ("-chunks" if args.val_chunks == "auto" else "") \
        + (f"-budget{args.mem_budget}" if args.mem_budget else "")
    sys.argv = ["train_dual.py", "--data", data, "--cfg", f"{model}.yaml", "--batch-size", str(args.batch),
                "--img", str(args.img), "--epochs", "1", "--workers", str(args.workers), "--backend", backend,
                "--noplots", "--exist-ok", "--project", str(Path(args.root) / "runs"), "--name", name]
    sys.argv += ["--gpu-augment"] if args.gpu_augment else []
    sys.argv += ["--cache", args.cache] if args.cache else []
    sys.argv[sys.argv.index("--epochs") + 1] = str(args.epochs)
    sys.argv += ["--mem-cap", str(cap)] if cap else []
    sys.argv += ["--val-chunks", args.val_chunks] if args.val_chunks else []
    sys.argv += ["--mem-budget", args.mem_budget] if args.mem_budget else []
    t0 = time.time()
    try:
        runpy.run_path(str(REPO / "train_dual.py"), run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    phases = result.get("memory_peaks", {})
    trained = [phases[k] for k in ("first epoch", "train") if k in phases]
    if trained:  # the trainer's own phase peaks (it resets the peak counters between phases)
        peaks.update(train_peak_alloc_gib=round(max(a for a, _ in trained), 3),
                     train_peak_reserved_gib=round(max(r for _, r in trained), 3))
    row = {"model": model, "backend": backend, "batch": args.batch, "img": args.img, "images": args.images,
           "workers": args.workers, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
           "status": "ok", "run_s": round(time.time() - t0, 1), **peaks,
           "run_peak_reserved_gib": round(max((r for _, r in phases.values()), default=0.0), 3) if phases else None,
           "epochs": args.epochs, "mem_cap_gib": cap, "val_batch": result.get("val_batch"),
           "phase_peaks_gib": {k: [round(a, 3), round(r, 3)] for k, (a, r) in result.get("memory_peaks", {}).items()},
           "val_chunks": args.val_chunks, "mem_budget": args.mem_budget}
    opt = Path(args.root) / "runs" / name / "opt.yaml"
    chosen = yaml.safe_load(opt.read_text()) if opt.is_file() else {}
    plan = chosen.get("mem_plan")  # --mem-budget auto's plan, or the default's where the step did not fit as set
    if plan and args.mem_budget in (None, "auto"):  # what the plan chose (opt.yaml)
        row["chosen"] = {k: chosen.get(k) for k in ("main_recompute", "graph_shapes", "val_chunks", "mem_plan")}
    row["predicted"] = predicted(model, backend, args, cap, plan)
    res = Path(args.root) / "runs" / name / "results.csv"
    if res.is_file():
        lines = [s for s in res.read_text().splitlines() if s.strip()]
        head = [h.strip() for h in lines[0].split(",")]
        vals = dict(zip(head, (float(v) for v in lines[-1].split(","))))
        row.update(epoch_s=round(vals["epoch_seconds"], 2), img_per_s=round(vals["images_per_s"], 1),
                   train_box_loss=vals["train/box_loss"])
    return row


def predicted(model, backend, args, cap, mem_plan=None):
    """The planner's figures for this run (engine/train/memory_phases.py): each phase as the run's phase-peak
    line logs it [allocated, reserved] GiB, the card with the CUDA context, the validation batch and chunk,
    whether the graphs stayed beside validation; where the run planned (--mem-budget auto, or without --mem-budget
    where the step did not fit as set: `mem_plan`, its opt.yaml's), memory_auto.choose's in the budget it planned
    in, its phases as the run logs them under the cap (memory_auto.as_run) and the choice in words. --val-chunks not
    given: the run's default (RunConfig.val_chunks). None when the model has no costs."""
    from yolov9c.backends.c.switches import Switches
    from yolov9c.engine.train import memory_auto as ma
    from yolov9c.engine.train import memory_phases as mph
    from yolov9c.engine.train import memory_plan as mp
    from yolov9c.engine.train.config import RunConfig

    cost = mp.cost_for(model, backend)
    if cost is None:
        return None
    vc, val_batch, choice = mph.val_cost_for(model), min(2 * args.batch, args.val_images), None
    chunks = args.val_chunks or RunConfig.val_chunks
    if args.mem_budget in (None, "auto") and mem_plan:
        free = tuple(n for n in ma.PLANNED if n != "val_chunks" or not args.val_chunks)
        cost_of = (lambda sw: mp.cost_for(model, backend, sw))
        choice = ma.choose(cost_of, vc, mem_plan["budget_gib"], args.batch, img=args.img,
                           switches=Switches() if backend == "c" else None, free=free,
                           val_chunks=chunks)  # the run's plan: validation at 2 × the batch
        run = ma.as_run(choice, cost_of, vc, cap if cap is not None else mem_plan["card_free_gib"], img=args.img)
    else:
        run = mph.phases(cost, vc, args.batch, val_batch, img=args.img, limit_gib=cap, chunks=chunks)
    return {"phases_gib": {k: [round(a, 3), round(r, 3)] for k, (a, r) in run.logged.items()},
            "card_gib": round(run.card_gib, 3), "val_batch": run.val_batch, "chunk": run.chunk,
            "graphs_kept": run.graphs_kept, **({"choice": choice.describe()} if choice else {})}


def _copy_timed(pipe, f, t0):
    """Copy the child's output to f, one line per console line (tqdm's carriage returns split too), each
    prefixed with its time in seconds since t0."""
    buf = b""
    while chunk := pipe.read1(65536):
        *lines, buf = (buf + chunk).replace(b"\r", b"\n").split(b"\n")
        for line in lines:
            if line.strip():
                f.write(f"{time.time() - t0:8.2f} {line.decode(errors='replace')}\n")
        f.flush()


class CardSampler:
    """The card's largest memory.used in MiB while a run lasts (nvidia-smi: the CUDA contexts and every process on
    the card included, what a user of that card sees), sampled every `period` s in a thread:
    `with CardSampler() as card: ...` then card.max_mib (None when the command is missing or never answered).
    The card: the first of CUDA_VISIBLE_DEVICES, else 0. `command`: the query's argv (tests give their own)."""

    def __init__(self, period=0.2, command=None):
        card = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
        self.command = command or ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                   "-i", card]
        self.period, self.max_mib = period, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _read(self):
        try:
            out = subprocess.run(self.command, capture_output=True, text=True, timeout=5).stdout.split()
            return int(float(out[0])) if out else None
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return None

    def _poll(self):
        while True:
            mib = self._read()
            if mib is not None:
                self.max_mib = mib if self.max_mib is None else max(self.max_mib, mib)
            if self._stop.wait(self.period):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)
        return False


def cap_for(spec, model):
    """--mem-cap SPEC → this model's cap in GiB (None: uncapped). '7' caps every model; 'yolov9-s=7,yolov9-c=14.5'
    caps those models only."""
    if not spec:
        return None
    if "=" not in spec:
        return float(spec)
    caps = dict(item.split("=", 1) for item in spec.split(","))
    return float(caps[model]) if model in caps else None


def run_config(args, model, backend, data):
    base = {"model": model, "backend": backend, "batch": args.batch, "img": args.img, "images": args.images,
            "workers": args.workers, "gpu_augment": args.gpu_augment, "cache": args.cache}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    argv = [sys.executable, str(Path(__file__).resolve()), "--one", model, backend, data, "--batch",
            str(args.batch), "--img", str(args.img), "--images", str(args.images), "--workers", str(args.workers),
            "--root", args.root, "--epochs", str(args.epochs), "--val-images", str(args.val_images)] \
        + (["--gpu-augment"] if args.gpu_augment else []) + (["--mem-cap", args.mem_cap] if args.mem_cap else []) \
        + (["--cache", args.cache] if args.cache else []) \
        + (["--val-chunks", args.val_chunks] if args.val_chunks else []) \
        + (["--mem-budget", args.mem_budget] if args.mem_budget else [])
    cap = cap_for(args.mem_cap, model)
    log = Path(args.root) / "logs" / f"{model}-{backend}-b{args.batch}-{args.img}-w{args.workers}" \
        f"{'-gpuaug' if args.gpu_augment else ''}{'-' + args.cache if args.cache else ''}" \
        f"{'-cap%g' % cap if cap else ''}" \
        f"{'-chunks' if args.val_chunks == 'auto' else ''}" \
        f"{'-budget' + args.mem_budget if args.mem_budget else ''}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(log, "w") as f, CardSampler() as card:  # the child's console, each line timed, kept
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
        reader = threading.Thread(target=_copy_timed, args=(p.stdout, f, t0), daemon=True)
        reader.start()
        try:
            p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        reader.join(timeout=10)
    r = None if p.returncode == -9 else p
    process_s = round(time.time() - t0, 1)  # the whole process: start-up and exit included
    text = log.read_text(errors="replace")
    for line in reversed(text.splitlines()):
        line = line.lstrip().split(" ", 1)[-1]
        if line.startswith("{"):
            return {**json.loads(line), "process_s": process_s, "card_max_mib": card.max_mib}
    tail = [s.lstrip().split(" ", 1)[-1].strip() for s in text.splitlines() if s.strip()]
    last = (tail[-1] if tail else "no output")[:300]
    if r is None:
        return {**base, "status": "timeout", "error": f"no result within {args.timeout:g} s; last line: {last}",
                "log": str(log)}
    oom = "out of memory" in text.lower()
    return {**base, "status": "oom" if oom else "error", "returncode": r.returncode, "error": last, "log": str(log),
            "card_max_mib": card.max_mib}


def markdown(rows):
    def f(v, spec):
        return "—" if v is None else format(v, spec)

    out = ["| model | backend | cap GiB | status | peak allocated GiB | peak reserved GiB | card max MiB | epoch s "
           "| img/s | val batch | largest phase (reserved) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        phases = r.get("phase_peaks_gib") or {}
        big = max(phases.items(), key=lambda kv: kv[1][1]) if phases else None
        out.append(f"| {r['model']} | {r['backend']} | {f(r.get('mem_cap_gib'), '.1f')} | {r.get('status')} "
                   f"| {f(r.get('train_peak_alloc_gib'), '.2f')} | {f(r.get('train_peak_reserved_gib'), '.2f')} "
                   f"| {f(r.get('card_max_mib'), 'd')} "
                   f"| {f(r.get('epoch_s'), '.1f')} | {f(r.get('img_per_s'), '.1f')} | {r.get('val_batch') or '—'} "
                   f"| {f'{big[0]} {big[1][1]:.2f}' if big else '—'} |")
    return "\n".join(out)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.table:
        print(markdown([json.loads(s) for s in Path(args.table).read_text().splitlines() if s.startswith("{")]))
        return 0
    if args.one:
        model, backend, data = args.one
        print(json.dumps(run_one(model, backend, data, args)), flush=True)
        # a slow exit shows in the log: the live threads now, and every thread's stack if still here in 20 s
        print("threads at exit:", [(t.name, t.daemon) for t in threading.enumerate()], flush=True)
        faulthandler.dump_traceback_later(20, exit=False)
        return 0
    data = str(make_dataset(args.root, args.images, args.img, args.boxes, args.procs, n_val=args.val_images))
    if args.data_only:
        print(data)
        return 0
    rows = []
    for backend in args.backends:
        for model in args.models:
            row = run_config(args, model, backend, data)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
