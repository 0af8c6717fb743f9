"""Side-by-side fidelity harness: our training pipeline against the published YOLOv9 code (issue 13).

A developer tool, not a CI test. It needs a checkout of the published code (fetched, never committed) and a
Python that can run it (torch + torchvision):

    git clone https://github.com/WongKinYiu/yolov9 /work/published-yolov9      # or any copy of it
    python -m venv /work/venv-pub && /work/venv-pub/bin/pip install torch torchvision numpy \\
        opencv-python-headless pyyaml tqdm matplotlib pandas seaborn scipy requests psutil
    python dev/fidelity/compare_published.py --published /work/published-yolov9 \\
        --python /work/venv-pub/bin/python --data ../shared/data/coco128/data.yaml --out /tmp/fidelity

Without --published (or with a path that is not the published checkout) it prints these lines and exits 0.
Both sides run as separate processes (ours_side.py from this checkout, published_side.py inside the published
one) on the same dataset and seed and exchange JSON/npz files; nothing of the published code is imported here.
Both sides load modes.py (their common command line, the data mode's counters and sampling loop, the loss
mode's record and SGD step), stats.py and probe.py from this folder: plain torch + numpy, neither package.

Steps (--steps, default all):
  data   augmented samples of both pipelines, mosaic on and off (--n each): boxes per image, box side / aspect /
         class histograms, pixel mean/std, grey padding share, sharpness, mosaic / mixup / copy-paste rates,
         dataset sizes after the label checks. With --rects N: N synthetic images of bright rectangles drawn at their labels,
         and each visible box's edge offsets (measured in the augmented pixels − labelled) compared as well. Random draws differ, so means are compared with their standard
         errors (|z| > 4 flagged) and histograms by total-variation distance (flagged above 1.5 x the distance
         between two halves of the same sample, i.e. about twice the sampling noise).
  init   (only when named) each code's freshly built --cfg model, three seeds: per tensor the mean and std of
         its initial values, every BatchNorm's eps and momentum.
  loss   identical weights (ours, seeded) and an identical augmented batch (our --backend, default torch):
         loss items, every gradient norm, BatchNorm running statistics, the optimizer's three groups by
         parameter name, the parameters after one clipped SGD step with the given per-group lr (agreement to
         float32 rounding expected).
  train  both training loops (train_dual) for a few epochs on the CPU, probed once per iteration at the loss
         call (probe.py): lr and momentum per group through the warm-up, weight decay, accumulation, optimizer
         steps, EMA updates and decay, the epoch mosaic closes, batch statistics, the fp16 rounding of the model
         at start, the val loader's batch size. These are deterministic given the set-up: compared exactly.

--upscale K first writes a copy of the training images K times larger (JPEG, quality 95): images whose long
side is at least twice --img take other decoding paths (libjpeg reduced decoding), which coco128's 640-pixel
images never reach. The report goes to stdout and OUT/report.json.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from stats import compare_summaries  # noqa: E402

HOW_TO = """the published YOLOv9 code is needed (it is never committed here). Get it and a Python to run it:
    git clone https://github.com/WongKinYiu/yolov9 /work/published-yolov9
    python -m venv /work/venv-pub && /work/venv-pub/bin/pip install torch torchvision numpy \\
        opencv-python-headless pyyaml tqdm matplotlib pandas seaborn scipy requests psutil
then: python dev/fidelity/compare_published.py --published /work/published-yolov9 \\
          --python /work/venv-pub/bin/python"""

Z_FLAG = 4.0


# ----------------------------------------------------------------------------------------- data set copy ----

def mirror_dataset(data_yaml, out, upscale=0):
    """A copy of the dataset's train and val folders under `out` made of symbolic links to the files (so that
    neither side writes label caches into the original folders), or of K-times enlarged JPEGs (upscale = K).
    Returns the path of the new dataset yaml (absolute `path`, which the published check_dataset needs)."""
    import cv2

    data_yaml = Path(data_yaml).resolve()
    cfg = yaml.safe_load(data_yaml.read_text())
    root = Path(cfg.get("path") or ".")
    root = root if root.is_absolute() else (data_yaml.parent / root).resolve()
    new = {"path": str(out), "names": cfg["names"]}
    for split in ("train", "val"):
        src = root / cfg[split]
        if not src.is_dir():
            raise SystemExit(f"error: {data_yaml}: {split} must be a folder of images for the harness, got {src}")
        rel = Path(cfg[split])
        dst = out / rel
        dst.mkdir(parents=True, exist_ok=True)
        lab_src = Path(str(src).replace(f"{os.sep}images", f"{os.sep}labels", 1))
        lab_dst = Path(str(dst).replace(f"{os.sep}images", f"{os.sep}labels", 1))
        lab_dst.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.iterdir()):
            target = dst / f.name
            if target.exists() or target.is_symlink():
                continue
            if upscale and split == "train":
                img = cv2.imread(str(f))
                big = cv2.resize(img, None, fx=upscale, fy=upscale, interpolation=cv2.INTER_CUBIC)
                cv2.imwrite(str(target.with_suffix(".jpg")), big, [cv2.IMWRITE_JPEG_QUALITY, 95])
            else:
                target.symlink_to(f)
        if lab_src.is_dir():
            for f in sorted(lab_src.glob("*.txt")):
                t = lab_dst / f.name
                if not (t.exists() or t.is_symlink()):
                    t.symlink_to(f)
        new[split] = str(rel)
    path = out / "data.yaml"
    path.write_text(yaml.safe_dump(new, sort_keys=False))
    return path


# ------------------------------------------------------------------------------------------------ running ----

def run_side(side, args, a, log_name, product=None):
    """Run ours_side.py (this Python, from the repo root) or published_side.py (a.python, in the published
    checkout). Output goes to OUT/<log_name>.log; a failure stops the harness with the log's tail. With
    --reuse, a side whose `product` file exists already is not run again."""
    log = a.out / f"{log_name}.log"
    if a.reuse and product is not None and Path(product).exists():
        print(f"  {side:9s} {log_name:12s} reused {product}", flush=True)
        return
    if side == "ours":
        cmd, cwd = [sys.executable, str(HERE / "ours_side.py")] + args, ROOT
    else:
        cmd, cwd = [a.python, str(HERE / "published_side.py")] + args, a.published
    t = time.time()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    with open(log, "w") as f:
        rc = subprocess.call(cmd, cwd=str(cwd), stdout=f, stderr=subprocess.STDOUT, env=env)
    if rc != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"error: {side} side ({log_name}) exited with {rc}; log {log}:\n{tail}")
    print(f"  {side:9s} {log_name:12s} {time.time() - t:6.0f} s", flush=True)


def write_rects(out, n, seed=0):
    """A dataset of n PNG images (one split for train and val): a dark ground with 2-5 bright rectangles drawn
    exactly at their label boxes, apart from each other, so that an augmented sample shows where its boxes'
    edges really are (stats.edge_offsets). Returns its data.yaml."""
    import cv2

    rng = np.random.default_rng(seed)
    img_dir, lab_dir = out / "images" / "train", out / "labels" / "train"
    img_dir.mkdir(parents=True, exist_ok=True)
    lab_dir.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        w, h = int(rng.integers(400, 900)), int(rng.integers(300, 800))
        img = np.full((h, w, 3), 50, np.uint8)
        boxes = []
        for _ in range(200):
            if len(boxes) >= int(rng.integers(2, 6)):
                break
            bw, bh = int(rng.integers(40, w // 3)), int(rng.integers(40, h // 3))
            x0, y0 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            pad = 0.25 * max(bw, bh)
            if any(x0 < b[2] + pad and b[0] < x0 + bw + pad and y0 < b[3] + pad and b[1] < y0 + bh + pad
                   for b in boxes):
                continue
            boxes.append((x0, y0, x0 + bw, y0 + bh))
            img[y0:y0 + bh, x0:x0 + bw] = 220  # pixels x0 .. x0+bw-1: the box's edges at x0 and x0 + bw
        cv2.imwrite(str(img_dir / f"r{k:04d}.png"), img)
        (lab_dir / f"r{k:04d}.txt").write_text("".join(
            f"0 {(b[0] + b[2]) / 2 / w:.6f} {(b[1] + b[3]) / 2 / h:.6f} {(b[2] - b[0]) / w:.6f} {(b[3] - b[1]) / h:.6f}\n"
            for b in boxes))
    data = out / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(out), "train": "images/train", "val": "images/train", "nc": 1,
                                    "names": ["rect"]}))
    return data


# ------------------------------------------------------------------------------------------------- steps -----

def step_data(a, data_yaml):
    common = ["--data", str(data_yaml), "--img", str(a.img), "--n", str(a.n), "--seed", str(a.seed)]
    run_side("ours", ["data"] + common + ["--out", str(a.out / "ours_data.json")], a, "data_ours",
             a.out / "ours_data.json")
    run_side("published", ["data"] + common + ["--out", str(a.out / "pub_data.json")], a, "data_pub",
             a.out / "pub_data.json")
    ours = json.loads((a.out / "ours_data.json").read_text())
    pub = json.loads((a.out / "pub_data.json").read_text())
    rep = {"sizes": {k: (ours[k], pub[k]) for k in ("n_images", "n_labels", "n_backgrounds", "albumentations")}}
    flags = [f"dataset {k}: ours {o} published {p}" for k, (o, p) in rep["sizes"].items() if o != p]
    for phase in ("on", "off"):
        rows = compare_summaries(ours[phase], pub[phase])
        rep[phase] = {"rows": rows, "rates": (ours[phase]["rates"], pub[phase]["rates"]),
                      "shapes": (ours[phase]["shapes"], pub[phase]["shapes"])}
        for name, o, p, s, kind in rows:
            if kind == "z" and abs(s) > Z_FLAG:
                flags.append(f"mosaic {phase}: {name}: ours {_fmt(o)} published {_fmt(p)} (z {s:.3g})")
            elif kind == "tv" and s > p:  # p: the noise level of these two samples (stats.hist_flag_level)
                flags.append(f"mosaic {phase}: {name}: distance {s:.3f} above the sampling noise level {p:.3f}")
        for k, o in ours[phase]["rates"].items():
            p = pub[phase]["rates"][k]
            se = max(np.sqrt(max(p * (1 - p), 1e-12) / a.n), 1e-9) if k != "copy_paste_objects_per_mosaic" else 0.02
            if abs(o - p) > 4 * se:
                flags.append(f"mosaic {phase}: rate {k}: ours {o:.3f} published {p:.3f}")
    return rep, flags


def step_loss(a, data_yaml):
    b, w = a.out / "batch.npz", a.out / "weights.npz"
    lr = "0.1,0.01,0.01"
    run_side("ours", ["loss", "--cfg", a.cfg, "--nc", str(a.nc), "--batch", str(b), "--save-batch", "--data",
                      str(data_yaml), "--img", str(a.img), "--batch-size", str(a.loss_batch), "--seed", str(a.seed),
                      "--save-weights", str(w), "--lr", lr, "--backend", a.backend,
                      "--out", str(a.out / "ours_loss.npz")],
             a, "loss_ours",
             a.out / "ours_loss.npz")
    run_side("published", ["loss", "--cfg", a.cfg, "--nc", str(a.nc), "--weights", str(w), "--batch", str(b),
                           "--lr", lr, "--out", str(a.out / "pub_loss.npz")], a, "loss_pub", a.out / "pub_loss.npz")
    o, p = np.load(a.out / "ours_loss.npz"), np.load(a.out / "pub_loss.npz")
    rel = lambda x, y: float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-6)))  # noqa: E731
    rep = {"items_ours": o["items"].tolist(), "items_published": p["items"].tolist(),
           "items_rel": rel(o["items"], p["items"]), "loss_rel": rel(o["loss"], p["loss"])}
    flags = []
    if list(o["grad_names"]) != list(p["grad_names"]):
        flags.append("parameter names/order differ")
    else:
        no_grad_o = {n for n, g in zip(o["grad_names"], o["grad_norms"]) if g < 0}
        no_grad_p = {n for n, g in zip(p["grad_names"], p["grad_norms"]) if g < 0}
        rep["no_grad"] = (sorted(no_grad_o), sorted(no_grad_p))
        if no_grad_o != no_grad_p:
            flags.append(f"parameters without gradient differ: ours {sorted(no_grad_o ^ no_grad_p)[:5]}")
        ok = (o["grad_norms"] >= 0) & (p["grad_norms"] >= 0)
        rep["grad_rel"] = rel(o["grad_norms"][ok], p["grad_norms"][ok])
    for j in range(3):
        go, gp = set(o[f"group{j}"].tolist()), set(p[f"group{j}"].tolist())
        rep[f"group{j}"] = (len(go), len(gp))
        if go != gp:
            flags.append(f"optimizer group {j} differs: only ours {sorted(go - gp)[:4]}, only published "
                         f"{sorted(gp - go)[:4]}")
    diffs = {k: float(np.max(np.abs(o[k] - p[k]))) for k in o.files if k.startswith(("param::", "bn::"))}
    rep["max_param_diff_after_step"] = max(v for k, v in diffs.items() if k.startswith("param::"))
    rep["max_bn_stat_diff"] = max((v for k, v in diffs.items() if k.startswith("bn::")), default=0.0)
    if rep["items_rel"] > 1e-4:
        flags.append(f"loss items differ on the same batch and weights: {rep['items_ours']} vs "
                     f"{rep['items_published']}")
    if rep.get("grad_rel", 0) > 1e-3:
        flags.append(f"gradient norms differ (max relative {rep['grad_rel']:.2e})")
    if rep["max_param_diff_after_step"] > 1e-5:
        flags.append(f"parameters after one SGD step differ by up to {rep['max_param_diff_after_step']:.2e}")
    if rep["max_bn_stat_diff"] > 1e-5:
        flags.append(f"BatchNorm running statistics differ by up to {rep['max_bn_stat_diff']:.2e}")
    return rep, flags


def _train_args(a, data_yaml, project, published):
    cfg = f"models/detect/{a.cfg}.yaml" if published else f"{a.cfg}.yaml"
    hyp = "data/hyps/hyp.scratch-high.yaml" if published else "hyp.scratch-high.yaml"
    return ["--cfg", cfg, "--data", str(data_yaml), "--hyp", hyp, "--img", str(a.train_img), "--batch",
            str(a.train_batch), "--epochs", str(a.epochs), "--close-mosaic", str(a.close_mosaic), "--device", "cpu",
            "--workers", "0", "--project", str(project), "--name", "exp", "--exist-ok", "--noplots", "--noval",
            "--seed", str(a.seed), "--min-items", "0"]


def step_train(a, data_yaml):
    ro, rp = a.out / "ours_train.json", a.out / "pub_train.json"
    run_side("ours", ["train", "--record", str(ro), "--"] + _train_args(a, data_yaml, a.out / "ours_runs", False),
             a, "train_ours", ro)
    run_side("published", ["train", "--record", str(rp), "--"] + _train_args(a, data_yaml, a.out / "pub_runs", True),
             a, "train_pub", rp)
    o, p = json.loads(ro.read_text()), json.loads(rp.read_text())
    return compare_train(o, p)


def step_init(a, data_yaml):
    """Both codes' freshly built model (--cfg, --nc), three seeds each: per parameter tensor the mean and std of
    its initial values, and every BatchNorm's eps and momentum."""
    ro, rp = a.out / "ours_init.json", a.out / "pub_init.json"
    args = ["init", "--cfg", a.cfg, "--nc", str(a.nc), "--seeds", "0,1,2"]
    run_side("ours", args + ["--out", str(ro)], a, "init_ours", ro)
    run_side("published", args + ["--out", str(rp)], a, "init_pub", rp)
    return compare_init(json.loads(ro.read_text()), json.loads(rp.read_text()))


def compare_init(o, p, tol=0.1):
    """Flags: parameter names or counts that differ, BatchNorm settings that differ, a tensor of 64+ values whose
    std (mean over the seeds) differs by more than `tol` relative, a constant tensor (std 0: the heads' bias
    init, BN's weight and bias) whose value differs."""
    flags = []
    if set(o["params"]) != set(p["params"]):
        flags.append(f"parameter names differ: {sorted(set(o['params']) ^ set(p['params']))[:6]}")
    if o["bn"] != p["bn"]:
        flags.append("BatchNorm eps / momentum differ")
    checked = 0
    for n in sorted(set(o["params"]) & set(p["params"])):
        so, sp = np.array(o["params"][n]), np.array(p["params"][n])
        if so[0, 2] != sp[0, 2]:
            flags.append(f"{n}: {int(so[0, 2])} values against {int(sp[0, 2])}")
            continue
        if sp[:, 1].max() == 0 and so[:, 1].max() == 0:
            if abs(so[0, 0] - sp[0, 0]) > 1e-6:
                flags.append(f"{n}: constant {so[0, 0]:.6g} against {sp[0, 0]:.6g}")
        elif so[0, 2] >= 64 and abs(so[:, 1].mean() / max(sp[:, 1].mean(), 1e-12) - 1) > tol:
            flags.append(f"{n}: std {so[:, 1].mean():.4g} against {sp[:, 1].mean():.4g}")
        checked += 1
    return {"tensors_compared": checked, "bn_layers": len(o["bn"])}, flags


def _stepped(recs):
    """ni of each optimizer step, read from last_opt_step as the next iteration sees it."""
    return sorted({r["last_opt_step"] for r in recs if r["last_opt_step"] >= 0})


def compare_train(o, p):
    flags = []
    so, sp = o[0]["setup"], p[0]["setup"]
    rep = {"setup_ours": {k: v for k, v in so.items() if k not in ("groups", "trainable")},
           "setup_published": {k: v for k, v in sp.items() if k not in ("groups", "trainable")}}
    for k in ("nw", "nb", "model_fp16_exact", "ema_fp16_exact", "ema_dtype", "optimizer", "nesterov",
              "val_batch_size"):
        if so.get(k) != sp.get(k):
            flags.append(f"set-up {k}: ours {so.get(k)} published {sp.get(k)}")
    for j, (go, gp) in enumerate(zip(so["groups"], sp["groups"])):
        if set(go) != set(gp):
            flags.append(f"optimizer group {j}: only ours {sorted(set(go) - set(gp))[:4]}, only published "
                         f"{sorted(set(gp) - set(go))[:4]}")
    if set(so["trainable"]) != set(sp["trainable"]):
        flags.append(f"trainable parameters differ: {sorted(set(so['trainable']) ^ set(sp['trainable']))[:6]}")
    n = min(len(o), len(p))
    if len(o) != len(p):
        flags.append(f"iterations recorded: ours {len(o)} published {len(p)}")
    first = {}
    for key in ("lr", "momentum", "weight_decay"):
        for r, q in zip(o[:n], p[:n]):
            if not np.allclose(r[key], q[key], rtol=1e-9, atol=1e-12):
                first[key] = (r["ni"], r[key], q[key])
                break
    for key in ("accumulate", "epoch", "mosaic", "ema_updates", "ema_next_decay"):
        for r, q in zip(o[:n], p[:n]):
            if not np.isclose(float(r.get(key, np.nan)), float(q.get(key, np.nan)), rtol=1e-9, atol=0, equal_nan=True):
                first[key] = (r["ni"], r.get(key), q.get(key))
                break
    for key, (ni, vo, vp) in first.items():
        flags.append(f"{key} first differs at iteration {ni}: ours {vo} published {vp}")
    steps_o, steps_p = _stepped(o[:n]), _stepped(p[:n])
    if steps_o != steps_p:
        flags.append(f"optimizer steps differ: ours {steps_o[:12]}… published {steps_p[:12]}…")
    close = lambda recs: next((r["epoch"] for r in recs if not r.get("mosaic", True)), None)  # noqa: E731
    rep["mosaic_closes_at_epoch"] = (close(o), close(p))
    if close(o) != close(p):
        flags.append(f"mosaic closes at epoch ours {close(o)} published {close(p)}")
    rep["optimizer_steps"] = (len(steps_o), len(steps_p))
    rep["lr_end"] = (o[n - 1]["lr"], p[n - 1]["lr"])
    rep["per_epoch"] = []
    for e in sorted({r["epoch"] for r in o[:n]}):
        row = {"epoch": e}
        for side, recs in (("ours", o), ("published", p)):
            rs = [r for r in recs if r["epoch"] == e and "batch" in r]
            row[side] = {"boxes_per_image": float(np.mean([r["batch"]["boxes_per_image"] for r in rs])),
                         "box_side_px": float(np.nanmean([r["batch"]["box_side_px"] for r in rs])),
                         "loss_items": np.mean([r["loss_items"] for r in rs], 0).round(4).tolist(),
                         "mosaic": rs[0].get("mosaic") if rs else None}
        rep["per_epoch"].append(row)
    return rep, flags


# ------------------------------------------------------------------------------------------------ report -----

def _fmt(x):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, list):
        return "[" + ", ".join(_fmt(v) for v in x) + "]"
    return str(x)


def print_report(report):
    for step, (rep, flags) in report.items():
        print(f"\n== {step} ==")
        if step == "data":
            print("dataset (ours, published):", rep["sizes"])
            for phase in ("on", "off"):
                print(f"-- mosaic {phase}: rates ours {rep[phase]['rates'][0]}  published {rep[phase]['rates'][1]}")
                print(f"   shapes ours {rep[phase]['shapes'][0][:4]} published {rep[phase]['shapes'][1][:4]}")
                for name, o, p, s, kind in rep[phase]["rows"]:
                    if kind == "z":
                        print(f"   {name:22s} ours {o:10.4g}  published {p:10.4g}  z {s:7.2f}")
                    else:
                        print(f"   {name:22s} {kind} distance {s:.3f} (flagged above {p:.3f})")
        else:
            for k, v in rep.items():
                if k != "per_epoch":
                    print(f"{k}: {_fmt(v) if not isinstance(v, dict) else v}")
            for row in rep.get("per_epoch", []):
                print(f"   epoch {row['epoch']:3d}  ours {row['ours']}  published {row['published']}")
        print(f"{len(flags)} difference(s) flagged" + (":" if flags else ""))
        for f in flags:
            print(f"  * {f}")


def main(argv=None):
    p = argparse.ArgumentParser(description="Compare our training pipeline with the published YOLOv9 code.")
    p.add_argument("--published", help="the published YOLOv9 checkout (holds train_dual.py)")
    p.add_argument("--python", default=None, help="Python with torch + torchvision for the published side "
                                                  "(default /work/venv-pub/bin/python if present, else this one)")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "coco128" / "data.yaml"))
    p.add_argument("--out", default=None, help="output folder (default /tmp/fidelity-<time>)")
    p.add_argument("--steps", default="data,loss,train")
    p.add_argument("--reuse", action="store_true", help="keep the outputs already in --out, run what is missing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--img", type=int, default=320, help="image size of the data and loss steps")
    p.add_argument("--n", type=int, default=400, help="samples per phase in the data step")
    p.add_argument("--upscale", type=int, default=0, help="enlarge the training images K times first")
    p.add_argument("--rects", type=int, default=0, help="instead of --data: N synthetic images of bright "
                   "rectangles drawn at their labels; the data step also measures the boxes' edge offsets")
    p.add_argument("--cfg", default="yolov9-t")
    p.add_argument("--nc", type=int, default=80)
    p.add_argument("--loss-batch", type=int, default=4)
    p.add_argument("--backend", default="torch", choices=("torch", "c"), help="our backend in the loss step")
    p.add_argument("--train-img", type=int, default=160)
    p.add_argument("--train-batch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=7)
    p.add_argument("--close-mosaic", type=int, default=2)
    a = p.parse_args(argv)
    if not a.published or not (Path(a.published) / "train_dual.py").is_file():
        print(f"compare_published: {HOW_TO}")
        return 0
    a.published = Path(a.published).resolve()
    if a.python is None:
        a.python = "/work/venv-pub/bin/python" if Path("/work/venv-pub/bin/python").exists() else sys.executable
    if subprocess.call([a.python, "-c", "import torch, torchvision"], stderr=subprocess.DEVNULL) != 0:
        print(f"compare_published: {a.python} cannot import torch and torchvision.\n{HOW_TO}")
        return 0
    a.out = Path(a.out or f"/tmp/fidelity-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.rects:
        os.environ["FIDELITY_EDGES"] = "1"  # both sides' stats.py (the environment is passed on)
        a.data, a.nc = str(write_rects(a.out / "rects", a.rects, a.seed)), 1
    data_yaml = mirror_dataset(a.data, a.out / "data", a.upscale)
    report = {}
    for step in a.steps.split(","):
        print(f"{step}:", flush=True)
        report[step] = {"data": step_data, "loss": step_loss, "train": step_train, "init": step_init}[step](a, data_yaml)
    print_report(report)
    (a.out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\nreport: {a.out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
