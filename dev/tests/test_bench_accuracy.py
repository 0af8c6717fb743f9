"""dev/accuracy/accuracy_data.py, the datasets bench_accuracy.py derives from coco128 (no training here; the tests
derive them from tests/assets/coco24, the same kind of dataset): the crops
of --derive crops are valid YOLO labels of large boxes, held out by source image and deterministic; the class
subset of --classes keeps and renumbers only the chosen classes; a SIGTERM to the benchmark stops the training
processes it started (real processes, no training).
Run: OMP_NUM_THREADS=1 python -m pytest -q dev/tests/test_bench_accuracy.py
"""

import csv
import hashlib
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "dev" / "accuracy"))
import accuracy_data  # noqa: E402
from repo_assets import COCO24  # noqa: E402

COCO = COCO24 / "data.yaml"


@pytest.fixture(scope="module")
def crops(tmp_path_factory):
    return accuracy_data.crop_dataset(COCO, tmp_path_factory.mktemp("a"), seed=0)


def _labels(data_yaml, split):
    d = Path(data_yaml).parent
    return {f.stem: accuracy_data.read_labels(f) for f in sorted((d / "labels" / split).glob("*.txt"))}


def _digest(root):
    h = hashlib.sha256()
    for f in sorted(p for p in Path(root).rglob("*") if p.is_file() and p.name != "data.yaml"):
        h.update(f.relative_to(root).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


def _anchor_count(split, classes):
    """Boxes of `classes` in the source split with a longer side >= 96 px and a shorter one >= 32 px."""
    n = 0
    for f in (COCO.parent / "labels" / split).glob("*.txt"):
        h, w = cv2.imread(str(COCO.parent / "images" / split / f"{f.stem}.jpg")).shape[:2]
        for c, _, _, bw, bh in (map(float, r.split()) for r in f.read_text().splitlines() if r.strip()):
            n += int(c) in classes and max(bw * w, bh * h) >= 96 and min(bw * w, bh * h) >= 32
    return n


def test_crops_have_images_and_valid_labels(crops):
    cfg = yaml.safe_load(crops.read_text())
    assert Path(cfg["path"]).is_absolute() and cfg["nc"] == 3 and cfg["names"][0] == "person"
    coco_names = yaml.safe_load(COCO.read_text())["names"]
    classes = {k for k, v in coco_names.items() if v in cfg["names"].values()}
    for split in ("train", "val"):
        images = sorted((crops.parent / "images" / split).glob("*.jpg"))
        labels = _labels(crops, split)
        per_anchor = accuracy_data.CROPS_PER_ANCHOR[split]  # 3 training crops of an anchor box, 1 held-out
        assert len(images) == per_anchor * _anchor_count(split, classes) > 0
        assert sorted(p.stem for p in images) == sorted(labels)
        for im in images[::7]:
            h, w = cv2.imread(str(im)).shape[:2]
            assert min(h, w) >= 32
        rows = np.concatenate(list(labels.values()))
        assert all(len(r) for r in labels.values()), "every crop holds its anchor box"
        c, x, y, bw, bh = rows.T
        assert np.all(c == np.round(c)) and c.min() >= 0 and c.max() < cfg["nc"]
        assert np.all((bw > 0) & (bw <= 1) & (bh > 0) & (bh <= 1))
        eps = 1e-6  # the labels are written with 6 decimals
        assert np.all(x - bw / 2 >= -eps) and np.all(x + bw / 2 <= 1 + eps)
        assert np.all(y - bh / 2 >= -eps) and np.all(y + bh / 2 <= 1 + eps)
        assert set(np.unique(c).astype(int)) == {0, 1, 2}, f"{split}: every class present"


def test_crop_boxes_are_large(crops):
    for split in ("train", "val"):
        rows = np.concatenate(list(_labels(crops, split).values()))
        assert np.median(np.maximum(rows[:, 3], rows[:, 4])) >= 0.3
        # the anchor of each crop fills at least FILL[0] of its longer side (when not cut to the image)
        anchors = [r[:, 3:].max(1).max() for r in _labels(crops, split).values()]
        assert np.median(anchors) >= accuracy_data.FILL[0]


def test_val_crops_come_only_from_val_images(crops):
    rows = list(csv.DictReader(open(crops.parent / "sources.csv")))
    src = {s: {r["source"] for r in rows if r["split"] == s} for s in ("train", "val")}
    coco = COCO.parent / "images"
    assert src["train"] <= {p.name for p in (coco / "train").iterdir()}
    assert src["val"] <= {p.name for p in (coco / "val").iterdir()}
    assert not src["train"] & src["val"]
    for split in ("train", "val"):
        names = {p.stem for p in (crops.parent / "images" / split).glob("*.jpg")}
        assert names == {r["name"] for r in rows if r["split"] == split}
        assert all(r["name"].startswith(Path(r["source"]).stem + "_") for r in rows if r["split"] == split)


def test_crops_are_deterministic(crops, tmp_path):
    again = accuracy_data.crop_dataset(COCO, tmp_path / "same", seed=0)
    assert _digest(again.parent) == _digest(crops.parent)
    other = accuracy_data.crop_dataset(COCO, tmp_path / "other", classes=[0, 60, 45], seed=1)
    assert _digest(other.parent) != _digest(crops.parent)


def test_crops_per_anchor_multiplies_train_only(crops, tmp_path):
    more = accuracy_data.crop_dataset(COCO, tmp_path / "more", seed=0, train_per_anchor=5)
    n = {d.parent: {s: len(list((d.parent / "images" / s).glob("*.jpg"))) for s in ("train", "val")}
         for d in (crops, more)}
    assert n[more.parent]["train"] == 5 * n[crops.parent]["train"] // 3
    assert n[more.parent]["val"] == n[crops.parent]["val"]


def test_crop_window_keeps_the_anchor_whole():
    rng = np.random.default_rng(0)
    for _ in range(500):
        w, h = int(rng.integers(100, 900)), int(rng.integers(100, 900))
        x1, y1 = rng.uniform(0, w - 40), rng.uniform(0, h - 40)
        box = (x1, y1, rng.uniform(x1 + 30, w), rng.uniform(y1 + 30, h))
        x0, y0, cw, ch = accuracy_data.crop_window(box, w, h, rng)
        assert 0 <= x0 and x0 + cw <= w and 0 <= y0 and y0 + ch <= h
        assert x0 <= box[0] + 1 and box[2] <= x0 + cw + 1 and y0 <= box[1] + 1 and box[3] <= y0 + ch + 1
        assert max(cw, ch) >= max(box[2] - box[0], box[3] - box[1])


def test_crop_labels_drop_boxes_mostly_outside():
    boxes = np.array([[0, 10, 10, 50, 50],      # inside
                      [1, 90, 10, 130, 50],     # 25 % inside: dropped
                      [2, 70, 10, 110, 50]])    # 75 % inside: clipped and kept
    rows = accuracy_data.crop_labels(boxes, 0, 0, 100, 100)
    assert rows[:, 0].tolist() == [0, 2]
    np.testing.assert_allclose(rows[1, 1:], [0.85, 0.3, 0.3, 0.4])


def test_class_subset_keeps_and_renumbers(tmp_path):
    f = accuracy_data.class_subset(COCO, [60, 0], tmp_path)
    cfg = yaml.safe_load(f.read_text())
    assert cfg["names"] == {0: "dining table", 1: "person"}
    coco_val = COCO.parent / "labels" / "val"
    n_person = sum(int((accuracy_data.read_labels(p)[:, 0] == 0).sum()) for p in coco_val.glob("*.txt"))
    rows = np.concatenate([r for r in _labels(f, "val").values() if len(r)])
    assert set(rows[:, 0].astype(int)) == {0, 1} and int((rows[:, 0] == 1).sum()) == n_person


def test_derive_needs_image_folders(tmp_path):
    (tmp_path / "list.txt").write_text("")
    data = tmp_path / "d.yaml"
    data.write_text(yaml.safe_dump({"path": str(tmp_path), "train": "list.txt", "val": "list.txt", "nc": 1,
                                    "names": ["a"]}))
    with pytest.raises(SystemExit, match=r"^error: .*train: must be an image folder"):
        accuracy_data.crop_dataset(data, tmp_path / "out")
    assert not (tmp_path / "out" / "data-crops").exists()


def test_train_command_gives_every_runner_the_same_flags(tmp_path):
    """bench_accuracy.train_command: ours and the published train_dual.py get the same training flags, each with
    its own entry point and run folder name."""
    import argparse
    import bench_accuracy
    a = argparse.Namespace(img=320, batch=32, epochs=25, close_mosaic=8, device="0", workers=2, single_cls=True,
                           cache="ram", cfg="yolov9-s", python="python3", published=tmp_path, save_period=-1)
    ours, _, env = bench_accuracy.train_command(a, "c", 1, tmp_path, tmp_path / "d.yaml")
    pub, pub_cwd, pub_env = bench_accuracy.train_command(a, "published", 1, tmp_path, tmp_path / "d.yaml")
    assert env == pub_env == {}
    flags, tail = ours[ours.index("--data"):], pub[-len(ours[ours.index("--data"):]):]
    i = flags.index("--name") + 1
    assert flags[i] == "c-s1" and tail[i] == "published-s1"
    assert tail[:i] + tail[i + 1:] == flags[:i] + flags[i + 1:] and "--single-cls" in flags
    assert "--save-period" not in flags
    a.save_period = 15  # checkpoints of the learning phase, the same flag for both codes
    ours, _, _ = bench_accuracy.train_command(a, "c", 1, tmp_path, tmp_path / "d.yaml")
    pub, _, _ = bench_accuracy.train_command(a, "published", 1, tmp_path, tmp_path / "d.yaml")
    for argv in (ours, pub):
        assert argv[argv.index("--save-period") + 1] == "15"
    assert ours[1] == "train_dual.py" and ours[ours.index("--backend") + 1] == "c" and pub_cwd == tmp_path


def test_swap_arms_run_each_loop_on_the_other_codes_loader(tmp_path):
    """published+ours-loader: the published loop through fidelity/swap_loader.py published-loop, in the published
    checkout, with the published flags; BACKEND+pub-loader: our train_dual flags through swap_loader.py ours-loop.
    Both need --published (refused with one error line otherwise); their resume goes through the same script."""
    import argparse
    import bench_accuracy
    a = argparse.Namespace(img=320, batch=32, epochs=25, close_mosaic=8, device="0", workers=2, single_cls=False,
                           cache="ram", cfg="yolov9-s", python="python3", published=tmp_path / "pub",
                           save_period=-1)
    pub, _, _ = bench_accuracy.train_command(a, "published", 0, tmp_path, tmp_path / "d.yaml")
    swap, cwd, _ = bench_accuracy.train_command(a, "published+ours-loader", 0, tmp_path, tmp_path / "d.yaml")
    assert swap[1].endswith("swap_loader.py") and swap[2] == "published-loop" and cwd == a.published
    tail = swap[swap.index("--") + 1:]
    assert tail[tail.index("--name") + 1] == "published+ours-loader-s0"
    assert tail[:tail.index("--name")] == pub[pub.index("--") + 1:][:tail.index("--name")]
    plain, _, _ = bench_accuracy.train_command(a, "torch+deterministic", 0, tmp_path, tmp_path / "d.yaml")
    ours, cwd, _ = bench_accuracy.train_command(a, "torch+deterministic+pub-loader", 0, tmp_path, tmp_path / "d.yaml")
    assert ours[1].endswith("swap_loader.py") and ours[2:5] == ["ours-loop", "--published", str(a.published)]
    rest = ours[ours.index("--") + 1:]
    assert "--deterministic" in rest and rest[rest.index("--backend") + 1] == "torch"
    assert [x for x in rest if "pub-loader" not in x] == [x for x in plain[2:] if "deterministic-s0" not in x]
    back, _, _ = bench_accuracy.resume_command(a, "torch+deterministic+pub-loader", 0, tmp_path)
    assert back[2] == "ours-loop" and back[-2] == "--resume"
    assert bench_accuracy.main(["--data", str(tmp_path / "d.yaml"), "--backends", "torch+pub-loader",
                                "--out", str(tmp_path / "o")]) == 2


def test_runner_variants_add_their_flag_or_environment(tmp_path):
    """BACKEND+VARIANT runners (c+no-cuda-graph, c+unfused, ...): the same run with one thing changed, named by
    the runner; unknown backends or variants are refused before anything trains; compare() puts a c variant
    against c, torch and published."""
    import argparse
    import bench_accuracy
    import pytest
    a = argparse.Namespace(img=320, batch=32, epochs=25, close_mosaic=8, device="0", workers=2, single_cls=False,
                           cache="ram", cfg="yolov9-s", python="python3", published=None, save_period=-1)
    base, _, _ = bench_accuracy.train_command(a, "c", 0, tmp_path, tmp_path / "d.yaml")
    argv, _, env = bench_accuracy.train_command(a, "c+no-cuda-graph", 0, tmp_path, tmp_path / "d.yaml")
    assert "--no-cuda-graph" in argv and "--no-cuda-graph" not in base and env == {}
    assert argv[argv.index("--backend") + 1] == "c" and argv[argv.index("--name") + 1] == "c+no-cuda-graph-s0"
    argv, _, env = bench_accuracy.train_command(a, "c+unfused+no-amp", 0, tmp_path, tmp_path / "d.yaml")
    assert env == {"YOLOV9C_FUSED": "0"} and "--no-amp" in argv  # through train_unfused.py (NMS on the extension)
    assert argv[1] == "dev/accuracy/train_unfused.py" and argv[argv.index("--backend") + 1] == "c"
    for runner, loss in (("c+loss-torch", "torch"), ("torch+loss-c", "c")):  # through train_other_loss.py
        argv, _, env = bench_accuracy.train_command(a, runner, 0, tmp_path, tmp_path / "d.yaml")
        assert argv[1:3] == ["dev/accuracy/train_other_loss.py", loss] and env == {}
        assert argv[argv.index("--backend") + 1] == runner.split("+")[0]
        argv, _, _ = bench_accuracy.resume_command(a, runner, 0, tmp_path)
        assert argv[1:4] == ["dev/accuracy/train_other_loss.py", loss, "--resume"]
    assert base[1] == "train_dual.py"
    argv, _, _ = bench_accuracy.train_command(a, "torch+no-cuda-graph", 0, tmp_path, tmp_path / "d.yaml")
    assert argv[argv.index("--backend") + 1] == "torch" and "--channels-last" in argv
    for bad in ("c+fast", "cuda", "torch+", "c+unfused+loss-torch"):
        with pytest.raises(ValueError, match="runner"):
            bench_accuracy.runner_spec(bad)
    assert bench_accuracy.main(["--backends", "c+fast", "--out", str(tmp_path / "o")]) == 2
    s = [{"runner": r, "map_mean": m} for r, m in (("published", 0.07), ("torch", 0.08), ("c", 0.06),
                                                   ("c+no-cuda-graph", 0.075))]
    line = bench_accuracy.compare(s)
    assert line["c_minus_torch_map"] == -2.0 and line["c+no-cuda-graph_minus_c_map"] == 1.5
    assert line["torch_minus_published_map"] == 1.0 and "torch_minus_c_map" not in line


def test_paired_differences_and_rows_summary(tmp_path, capsys):
    """compare() pairs runners by seed (mean, standard error, t and count of lower seeds of the per-seed
    difference, points × 100) on the seeds both have; --rows summarizes earlier calls' results.jsonl files
    without training, the later line of a (runner, seed) winning; a missing file is an error."""
    import json
    import bench_accuracy
    rows = [("torch", 0, 0.080), ("c", 0, 0.070), ("torch", 1, 0.070), ("c", 1, 0.072), ("torch", 2, 0.060),
            ("c", 2, 0.050), ("c", 3, 0.090)]
    runs = [{"kind": "run", "runner": r, "seed": s, "map50": 3 * m, "map": m} for r, s, m in rows]
    pair = bench_accuracy.paired(runs, "c", "torch")
    d = np.array([-1.0, 0.2, -1.0])  # seed 3 has no torch run: not paired
    assert pair["n"] == 3 and pair["lower"] == 2 and pair["mean"] == round(d.mean(), 3)
    assert pair["se"] == round(d.std(ddof=1) / np.sqrt(3), 3) and pair["t"] < 0
    assert bench_accuracy.paired(runs[:2], "c", "torch") is None  # one common seed: no spread
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(json.dumps(r) for r in runs[:4]) + "\n{\"kind\": \"summary\", \"runner\": \"c\"}\n")
    stale = dict(runs[5], map=0.5)  # an earlier line of (c, 2), replaced by the later file's
    b.write_text("\n".join(json.dumps(r) for r in [stale] + runs[4:]) + "\n")
    assert bench_accuracy.main(["--rows", str(a), str(b)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    summary = {x["runner"]: x for x in lines if x["kind"] == "summary"}
    assert summary["c"]["n"] == 4 and abs(summary["c"]["map_mean"] - 0.0705) < 1e-9
    assert lines[-1]["c_minus_torch_paired"] == pair
    assert bench_accuracy.main(["--rows", str(tmp_path / "none.jsonl")]) == 2


def _results_csv(run_dir, box, dfl, maps, skipped=None):
    """A results.csv in the published code's column layout, padded names included; with `skipped` (per epoch)
    the trainer's skipped_steps column too."""
    run_dir.mkdir(parents=True)
    head = ["epoch", "train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision", "metrics/recall",
            "metrics/mAP_0.5", "metrics/mAP_0.5:0.95", "val/box_loss", "val/cls_loss", "val/dfl_loss"]
    with open(run_dir / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"{h:>20s}" for h in head + (["skipped_steps"] if skipped else [])])
        for e, (b, d, m) in enumerate(zip(box, dfl, maps)):
            w.writerow([e, b, 1.0, d, 0.1, 0.2, 2 * m, m, 1, 1, 1] + ([skipped[e]] if skipped else []))


def test_curves_pair_the_runners_epoch_by_epoch(tmp_path):
    """Each run's per-epoch curve from its results.csv; the paired per-epoch differences of the training loss and
    of the own validation mAP (points × 100), in compare's line."""
    import bench_accuracy
    runs = []
    for seed, extra in ((0, 0.1), (1, 0.3), (2, -0.1)):
        for runner, add in (("torch", 0.0), ("c", extra)):
            d = tmp_path / f"{runner}-s{seed}"
            _results_csv(d, [3.0, 2.0 + add], [4.0, 3.0], [0.01, 0.05 - add / 10])
            runs.append({"kind": "run", "runner": runner, "seed": seed, "map50": 0.1, "map": 0.05,
                         "curve": bench_accuracy.curve(d)})
    assert runs[1]["curve"] == {"box": [3.0, 2.1], "cls": [1.0, 1.0], "dfl": [4.0, 3.0], "map": [0.01, 0.04]}
    got = bench_accuracy.paired_curves(runs, "c", "torch")
    assert got["n"] == 3 and got["loss_by_epoch"] == [0.0, 0.1] and got["loss_last_higher"] == 2
    assert got["map_by_epoch"] == [0.0, -1.0]
    # the last epochs' mean (both of 2 here) per seed: -0.5, -1.5, +0.5 points
    assert got["map_tail"] == {"n": 3, "epochs": 2, "mean": -0.5, "se": round(1.0 / np.sqrt(3), 3)}
    line = bench_accuracy.compare(bench_accuracy.summarize(runs), runs)
    assert line["c_minus_torch_curve"] == got
    # rows without curves (earlier calls) or of other lengths are left out
    old = [dict(r, curve=None) if r["seed"] else r for r in runs]
    assert bench_accuracy.paired_curves(old, "c", "torch") is None
    assert "skipped" not in got  # the published layout has no skipped_steps


def test_curves_count_the_skipped_optimizer_steps(tmp_path):
    """With our results.csv's skipped_steps column the pair reports each runner's mean skipped steps per run."""
    import bench_accuracy
    runs = []
    for seed, (st, sc) in enumerate((([2, 0], [3, 1]), ([1, 0], [5, 0]))):
        for runner, sk in (("torch", st), ("c", sc)):
            d = tmp_path / f"{runner}-s{seed}"
            _results_csv(d, [3.0, 2.0], [4.0, 3.0], [0.01, 0.05], skipped=sk)
            runs.append({"kind": "run", "runner": runner, "seed": seed, "curve": bench_accuracy.curve(d)})
    assert runs[1]["curve"]["skipped"] == [3.0, 1.0]
    assert bench_accuracy.paired_curves(runs, "c", "torch")["skipped"] == {"c": 4.5, "torch": 1.5}


def test_loss_swap_splits_the_gap_into_loss_and_model_effects():
    """With torch, c, c+loss-torch and torch+loss-c on common seeds, compare's loss_swap gives the torch loss's
    gain over the c loss and the c model's over the torch model, averaged over the other factor, by seed."""
    import bench_accuracy
    maps = {"torch": (0.070, 0.080), "c": (0.060, 0.062), "c+loss-torch": (0.072, 0.078),
            "torch+loss-c": (0.058, 0.064)}
    runs = [{"kind": "run", "runner": r, "seed": s, "map50": 0.2, "map": v[s]} for r, v in maps.items()
            for s in (0, 1)]
    got = bench_accuracy.swap_effects(runs)
    # seed 0: loss ((7.0 + 7.2) - (6.0 + 5.8)) / 2 = 1.2, model ((6.0 + 7.2) - (7.0 + 5.8)) / 2 = 0.2;
    # seed 1: loss ((8.0 + 7.8) - (6.2 + 6.4)) / 2 = 1.6, model ((6.2 + 7.8) - (8.0 + 6.4)) / 2 = -0.2
    assert got["n"] == 2 and got["loss"] == {"mean": 1.4, "se": 0.2} and got["model"] == {"mean": 0.0, "se": 0.2}
    assert bench_accuracy.compare(bench_accuracy.summarize(runs), runs)["loss_swap"] == got
    assert bench_accuracy.swap_effects([r for r in runs if r["runner"] != "torch+loss-c"]) is None


def test_sigterm_stops_the_training_processes_with_the_benchmark(tmp_path):
    """A SIGTERM to bench_accuracy.py (a `timeout` around it) ends the training processes it runs, and no
    queued run starts: two runs at once, a third queued; after the signal the driver exits with 143 within
    seconds, both children are gone and the third never wrote its log."""
    import os
    import signal
    import subprocess
    import textwrap
    import time

    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        import signal, sys
        from concurrent.futures import ThreadPoolExecutor
        sys.path.insert(0, {str(REPO / "dev" / "accuracy")!r})
        import bench_accuracy as b
        signal.signal(signal.SIGTERM, b.on_sigterm)
        child = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(120)"]
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda i: b.run_child(child, ".", {str(tmp_path)!r} + f"/c{{i}}.log", None), range(3)))
    """))
    proc = subprocess.Popen([sys.executable, str(driver)])
    logs = [tmp_path / f"c{i}.log" for i in range(3)]
    deadline = time.time() + 60
    while time.time() < deadline and not all(f.is_file() and f.read_text().strip() for f in logs[:2]):
        time.sleep(0.1)
    pids = [int(f.read_text()) for f in logs[:2]]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not logs[2].exists()


def test_children_share_the_cores_between_the_jobs():
    import bench_accuracy
    assert bench_accuracy.child_threads(9, cores=16) == 1
    assert bench_accuracy.child_threads(2, cores=16) == 8
    assert bench_accuracy.child_threads(4, cores=2) == 1


def test_report_gives_mean_standard_error_and_paired_differences(tmp_path):
    """summarize: mean, std (ddof 1) and standard error std/√n per runner; report_lines: those in points and
    the paired differences by seed of each of ours − published and c − torch; plot_curves: a PNG of the
    per-epoch curves."""
    import bench_accuracy
    maps = {"published": (0.50, 0.54, 0.46), "torch": (0.52, 0.55, 0.49), "c": (0.51, 0.53, 0.50)}
    runs = [{"kind": "run", "runner": r, "seed": s, "map50": v[s] + 0.3, "map": v[s],
             "curve": {"map": [0.1 * v[s], 0.5 * v[s], v[s]]}} for r, v in maps.items() for s in range(3)]
    summary = {x["runner"]: x for x in bench_accuracy.summarize(runs)}
    assert summary["published"]["n"] == 3 and abs(summary["published"]["map_mean"] - 0.50) < 1e-12
    assert abs(summary["published"]["map_std"] - 0.04) < 1e-12   # deviations -0.04 ... 0.04: std 0.04
    assert abs(summary["published"]["map_se"] - 0.04 / np.sqrt(3)) < 1e-12
    assert abs(summary["torch"]["map50_mean"] - (0.82 + 0.85 + 0.79) / 3) < 1e-12
    # c − published by seed: +1, -1, +4 points; c − torch: -1, -2, +1
    d = np.array([1.0, -1.0, 4.0])
    got = bench_accuracy.paired(runs, "c", "published")
    assert got["mean"] == round(d.mean(), 3) and got["se"] == round(d.std(ddof=1) / np.sqrt(3), 3) and got["lower"] == 1
    assert bench_accuracy.paired(runs, "c", "torch")["mean"] == round(-2 / 3, 3)
    lines = bench_accuracy.report_lines(bench_accuracy.summarize(runs), runs)
    assert lines[1].split() == ["published", "3", "80.00", "±", "2.31", "50.00", "±", "2.31"]
    text = "\n".join(lines)
    assert "c − published: +1.33 ± 1.45 points" in text and "torch − published: +2.00 ± 0.58" in text
    assert "c − torch: -0.67 ± 0.88 points" in text and "published − " not in text
    # the last epochs' own validation: the curve's mean, (0.1 + 0.5 + 1) / 3 of the final map here
    tail = bench_accuracy.paired_tail(runs, "c", "torch")
    assert tail["epochs"] == 3 and tail["mean"] == round(-2 / 3 * 1.6 / 3, 3)
    assert f"c − torch: {tail['mean']:+.2f} ± {tail['se']:.2f} points, own validation" in text
    png = bench_accuracy.plot_curves(runs, tmp_path / "curves.png")
    assert cv2.imread(str(png)).shape[0] > 100


def test_quiet_means_no_recent_write_in_the_run_folder(tmp_path):
    """--time-limit stops a run only when its results.csv and weights/ have not been written for QUIET_S
    (between the end-of-epoch saves); a folder without them (before the first epoch) is quiet."""
    import os
    import bench_accuracy
    run = tmp_path / "run"
    (run / "weights").mkdir(parents=True)
    assert bench_accuracy.quiet(run, 2.0, now=1000.0)
    for f, t in ((run / "results.csv", 990.0), (run / "weights" / "last.pt", 995.0)):
        f.write_text("x")
        os.utime(f, (t, t))
    assert bench_accuracy.quiet(run, 2.0, now=1000.0)
    assert not bench_accuracy.quiet(run, 2.0, now=996.0)   # last.pt written 1 s before
    os.utime(run / "results.csv", (999.5, 999.5))
    assert not bench_accuracy.quiet(run, 2.0, now=1000.0)


def test_time_limit_stops_running_children_and_no_queued_one_starts(tmp_path):
    """stop_at: at the deadline the running training processes are terminated (their folders are quiet), after
    printing their stacks to their logs (SIGUSR1, registered as both trainers do), and a queued run does not
    start (run_child returns -15 without a process)."""
    import signal
    import threading
    import bench_accuracy
    bench_accuracy._STOPPING.clear()
    child = [sys.executable, "-c", "import faulthandler, signal, time; faulthandler.register(signal.SIGUSR1); "
             "print('up', flush=True); time.sleep(120)"]
    log = tmp_path / "c.log"
    rc = {}
    t = threading.Thread(target=lambda: rc.update(a=bench_accuracy.run_child(child, ".", log, None, tmp_path)))
    t.start()
    while not (log.is_file() and "up" in log.read_text()):
        t.join(0.05)
    stopper = threading.Thread(target=bench_accuracy.stop_at, args=(0.0,))
    stopper.start()
    t.join(60)
    stopper.join(60)
    try:
        assert rc["a"] == -signal.SIGTERM and not bench_accuracy._LIVE
        assert "<module>" in log.read_text()  # the stack it printed on SIGUSR1, before the SIGTERM
        assert bench_accuracy.run_child(child, ".", tmp_path / "late.log", None) == -signal.SIGTERM
        assert not (tmp_path / "late.log").exists()
    finally:
        bench_accuracy._STOPPING.clear()


def test_a_stopped_run_is_resumed_from_its_last_checkpoint(tmp_path):
    """A run stopped by --time-limit gives an "unfinished" line with its finished epochs; the next call resumes
    it with train_dual.py --resume LAST (ours: the variant's environment again; the published code through its
    side script, in its checkout)."""
    import argparse
    import bench_accuracy
    a = argparse.Namespace(out=tmp_path, epochs=60, close_mosaic=15, python="py", published=tmp_path / "pub")
    _results_csv(tmp_path / "train" / "c-s1", [3.0, 2.5, 2.0], [4.0, 3.5, 3.0], [0.01, 0.02, 0.03])
    line = bench_accuracy.run_line(a, "c", 1, None, {"stopped": True, "train_s": 50.0, "rc": -15})
    curve = line.pop("curve")  # its curve so far, for the call's plot
    assert line == {"kind": "unfinished", "runner": "c", "seed": 1, "epochs_done": 3, "train_s": 50.0}
    assert curve["map"] == [0.01, 0.02, 0.03] and len(curve["box"]) == 3
    png = bench_accuracy.plot_curves([{"runner": "c", "seed": 1, "curve": curve}], tmp_path / "c.png")
    assert png.stat().st_size > 1000
    last = str(tmp_path / "train" / "c+unfused-s1" / "weights" / "last.pt")
    argv, cwd, env = bench_accuracy.resume_command(a, "c+unfused", 1, tmp_path / "train")
    assert argv[1:] == ["dev/accuracy/train_unfused.py", "--resume", last] and env == {"YOLOV9C_FUSED": "0"}
    argv, cwd, env = bench_accuracy.resume_command(a, "published", 1, tmp_path / "train")
    assert argv[0] == "py" and argv[2] == "train" and argv[-2:] == ["--resume", last.replace("c+unfused", "published")]
    assert cwd == a.published


def test_matrix_runs_on_a_converted_dataset(tmp_path, capsys):
    """The whole chain on the CPU: a VOC source converted by accuracy_datasets.py, then bench_accuracy.py's
    matrix (torch and c, one seed, 2 epochs at 64 px, two runs at once, real train_dual.py processes): a run
    line per runner with its best.pt validated and its 2-epoch curve, the summaries, the compare line, the
    report on stderr and the curves PNG."""
    import json
    import accuracy_datasets
    import bench_accuracy
    src = tmp_path / "src"
    (src / "images").mkdir(parents=True)
    (src / "annotations").mkdir()
    rng = np.random.default_rng(0)
    for i in range(12):
        im = np.full((64, 80, 3), 30, np.uint8)
        x1, y1 = int(rng.integers(0, 40)), int(rng.integers(0, 30))
        im[y1:y1 + 24, x1:x1 + 32] = 220
        cv2.imwrite(str(src / "images" / f"img{i:03d}.jpg"), im)
        (src / "annotations" / f"img{i:03d}.xml").write_text(
            f"<annotation><object><name>box</name><bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin><xmax>{x1 + 32}</xmax>"
            f"<ymax>{y1 + 24}</ymax></bndbox></object></annotation>")
    accuracy_datasets.convert(src / "images", src / "annotations", ["box"], tmp_path / "data")
    out = tmp_path / "acc"
    rc = bench_accuracy.main(["--data", str(tmp_path / "data" / "data.yaml"), "--cfg", "yolov9-t", "--img", "64",
                              "--batch", "4", "--epochs", "2", "--close-mosaic", "1", "--seeds", "0",
                              "--backends", "torch,c", "--device", "cpu", "--workers", "0", "--val-batch", "4",
                              "--cache", "none", "--jobs", "2", "--out", str(out)])
    err = capsys.readouterr().err
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    runs = {x["runner"]: x for x in lines if x["kind"] == "run"}
    assert rc == 0 and set(runs) == {"torch", "c"}, err[-2000:]
    for r in runs.values():
        assert 0 <= r["map"] <= r["map50"] <= 1 and len(r["curve"]["map"]) == 2 and r["best_epoch"] in (0, 1)
    assert [x["runner"] for x in lines if x["kind"] == "summary"] == ["torch", "c"]
    assert "c_minus_torch_map" in lines[-1] and "mAP@0.5:0.95" in err
    assert cv2.imread(str(out / "curves.png")) is not None


def test_the_published_runs_start_first_each_group_in_seed_order():
    import bench_accuracy

    todo = [(r, s, None) for s in (0, 1, 2) for r in ("torch", "c", "published")]
    order = [(r, s) for r, s, _ in bench_accuracy.queue_order(todo)]
    assert order[:3] == [("published", 0), ("published", 1), ("published", 2)]
    assert order[3:] == [("torch", 0), ("c", 0), ("torch", 1), ("c", 1), ("torch", 2), ("c", 2)]


def test_a_run_starts_only_when_it_fits_beside_the_running_ones():
    """CardShare: a second 16 GiB run waits on a 20 GiB card until the first gives its share back; a run alone
    starts whatever its estimate; no card (None) never waits."""
    import threading
    import bench_accuracy

    share = bench_accuracy.CardShare(20.0)
    share.take(16.0)
    started = threading.Event()
    t = threading.Thread(target=lambda: (share.take(16.0), started.set()))
    t.start()
    assert not started.wait(0.5)  # 32 > 20: waits
    share.give(16.0)
    assert started.wait(5.0)
    t.join(5)
    share.give(16.0)
    share.take(30.0)  # alone on the card: starts
    bench_accuracy.CardShare(None).take(1e9)


def test_a_runs_share_scales_with_the_recipe_and_can_be_given():
    import argparse
    import bench_accuracy

    a = argparse.Namespace(batch=16, img=320, run_gib=None)
    assert bench_accuracy.run_gib(a, "torch+loss-c") == bench_accuracy.RUN_GIB["torch"] / 8
    a = argparse.Namespace(batch=32, img=640, run_gib={"c": 5.0, "c+unfused": 9.0})
    assert bench_accuracy.run_gib(a, "c+loss-torch") == 5.0 and bench_accuracy.run_gib(a, "c+unfused") == 9.0
    assert bench_accuracy.run_gib(a, "published") == bench_accuracy.RUN_GIB["published"]


def test_a_run_our_memory_guard_split_is_marked_and_left_out(tmp_path, capsys):
    """The guard's console line gives the micro-batch; --rows leaves such a run out of the summary and names it."""
    import json
    import bench_accuracy

    log = tmp_path / "torch-s1.log"
    log.write_text("WARNING: CUDA out of memory at iteration 0 with a micro-batch of 32 images: retrying the same "
                   "batch as 2 micro-batches of 16 (accumulation x2; nominal batch 64 images per optimizer step "
                   "unchanged)\nWARNING: CUDA out of memory at iteration 7 with a micro-batch of 16 images: retrying "
                   "the same batch as 2 micro-batches of 8 (accumulation x2; ...)\n")
    assert bench_accuracy.split_micro_batch(log) == 8
    assert bench_accuracy.split_micro_batch(tmp_path / "none.log") is None
    rows = tmp_path / "r.jsonl"
    base = {"kind": "run", "map50": 0.6, "curve": {}}
    rows.write_text("\n".join(json.dumps({**base, "runner": r, "seed": s, "map": m, **extra}) for r, s, m, extra in [
        ("torch", 0, 0.40, {}), ("torch", 1, 0.50, {"split_micro_batch": 8}), ("torch", 2, 0.42, {})]))
    assert bench_accuracy.main(["--rows", str(rows)]) == 0
    out, err = capsys.readouterr()
    summary = [json.loads(x) for x in out.splitlines() if '"summary"' in x][0]
    assert summary["n"] == 2 and abs(summary["map_mean"] - 0.41) < 1e-9
    assert "left out" in err and "torch-s1 (8)" in err


def test_a_micro_runner_trains_through_train_micro_with_its_micro_batch():
    import bench_accuracy

    backend, flags, env, entry = bench_accuracy.runner_spec("c+micro8")
    assert (backend, flags, env) == ("c", [], {"YOLOV9C_MICRO_BATCH": "8"})
    assert entry == ["dev/accuracy/train_micro.py"]
    for bad in ("c+micro", "c+micro0", "c+micro8+loss-torch"):
        with pytest.raises(ValueError):
            bench_accuracy.runner_spec(bad)
