"""The whole run's memory by phase (yolov9c/engine/train/memory_phases.py) and its line in `python -m yolov9c memory`.

- calibration: the model against the phase peaks that real capped runs logged (H100, batch 64, 640, the c
  backend, validation at 128, --val-chunks off; MEASURED below): every allocated and reserved figure of the
  phase-peak line and the card's peak (nvidia-smi, with the CUDA context) within 10 %, and the validation batch
  the run fell back to. The validation figures themselves calibrate the model (VAL_CALIBRATION); the train,
  saving and final-validation figures and the cards' peaks are predictions;
- the chunk's contract: 1 <= chunk <= batch, non-decreasing in the memory left, the largest that fits;
- consistency: validation grows with the validation batch and shrinks with chunking; --val-chunks auto keeps
  the graphs where MIN_CHUNK images fit beside them and gives them back where not; the whole run is the largest
  phase, the card that plus the context;
- estimates: scaled from another calibrated model by the eval forward's live tensors, within 15 % of the
  calibrated figure (s and e from c);
- the CLI prints one phase line per backend with phases()'s figures;
- --graph-shapes' graphs counted in the train phase (graph_count), the final validation's own batch.
Run: python -m pytest -q tests/engine/train/test_memory_phases.py
"""

import re

import pytest

from yolov9c.cli.main import main as cli_main
from yolov9c.engine.train import memory_phases as mph
from yolov9c.engine.train import memory_plan as mp

MIB = 1 / 1024
# model: (cap GiB, {phase: (allocated, reserved) GiB as logged}, card peak MiB (nvidia-smi), validation batch)
MEASURED = {
    "yolov9-s": (7.0, {"first epoch": (4.85, 5.23), "train": (4.79, 5.25), "validation": (4.07, 5.23),
                       "saving": (0.29, 4.65), "final validation": (4.11, 4.68)}, 6461, 128),
    "yolov9-c": (14.5, {"train": (10.45, None), "validation": (13.78, None)}, 15355, 128),
    "yolov9-e": (22.0, {}, 23043, 64),
}
UNCAPPED_E = {"train": 16.8, "validation": 36.7}  # allocated GiB, validation at 128


def _run(model, limit, chunks="off", val_batch=128, img=640):
    return mph.phases(mp.cost_for(model, "c"), mph.val_cost_for(model), 64, val_batch, img=img, limit_gib=limit,
                      chunks=chunks)


@pytest.mark.parametrize("model", sorted(MEASURED))
def test_the_model_predicts_the_logged_phase_peaks_within_10_percent(model):
    cap, logged, card_mib, val_batch = MEASURED[model]
    run = _run(model, cap)
    for phase, (alloc, reserved) in logged.items():
        a, r = run.logged["train" if phase == "first epoch" else phase]
        assert a == pytest.approx(alloc, rel=0.10), (phase, a, alloc)
        if reserved is not None:
            assert r == pytest.approx(reserved, rel=0.10), (phase, r, reserved)
    assert run.card_gib == pytest.approx(card_mib * MIB, rel=0.10), (run.card_gib, card_mib * MIB)
    assert run.val_batch == val_batch and not run.graphs_kept  # tight: the pool was given back (the logs' line)


def test_graphs_keyed_by_shape_and_the_final_validation_batch():
    """graph_count: the train phase counts memory_plan.graphs_gib of that many graphs (--graph-shapes);
    final_val_batch: the final validation's batch after its own halving (best.pt loaded beside the run)."""
    cost, vc = mp.cost_for("yolov9-c", "c"), mph.val_cost_for("yolov9-c")
    one, twelve = (mph.phases(cost, vc, 32, 128, limit_gib=14.5, chunks="auto", graph_count=n) for n in (1, 12))
    assert one.peaks["train"][0] == pytest.approx(mp.predict(cost, 32))
    assert twelve.peaks["train"][0] == pytest.approx(mp.predict(cost, 32, graphs=12))
    assert twelve.peaks["train"][0] > one.peaks["train"][0]
    assert twelve.pool_gib > one.pool_gib
    run = _run("yolov9-e", 36.0)  # validation halves to 64; the final validation, with best.pt loaded, to 32
    assert (run.val_batch, run.final_val_batch) == (64, 32)
    run = _run("yolov9-e", None)
    assert (run.val_batch, run.final_val_batch) == (128, 128)


def test_the_uncapped_yolov9_e_run():
    run = _run("yolov9-e", None)
    assert run.peaks["train"][0] == pytest.approx(UNCAPPED_E["train"], rel=0.10)
    assert run.peaks["validation"][0] == pytest.approx(UNCAPPED_E["validation"], rel=0.10)
    assert run.graphs_kept and run.val_batch == run.chunk == 128


def test_the_chunk_contract():
    vc = mph.val_cost_for("yolov9-c")
    for batch in (1, 7, 128):
        last = 0
        for left in [i * 0.05 for i in range(400)]:
            k = mph.chunk_for(left, vc, batch)
            assert 1 <= k <= batch and k >= last, (batch, left, k, last)
            if k > 1:
                assert mph.fits(left, vc, batch, k)
            if k < batch:
                assert not mph.fits(left, vc, batch, k + 1)  # the largest that fits
            last = k
        assert last == batch  # with room enough, the whole batch
    assert mph.chunk_for(0.0, vc, 128) == 1 and not mph.fits(0.0, vc, 128, 1)
    assert mph.chunk_for(float("inf"), vc, 128) == 128  # no limit
    free = _run("yolov9-e", None, "auto")  # uncapped: the whole batch beside the pool
    assert free.chunk == free.val_batch == 128 and free.graphs_kept


def test_validation_grows_with_its_batch_and_shrinks_with_chunks():
    vc = mph.val_cost_for("yolov9-s")
    needs = [mph.val_need_gib(vc, v, v) for v in (16, 32, 64, 128)]
    assert needs == sorted(needs) and len(set(needs)) == 4
    chunked = [mph.val_need_gib(vc, 128, k) for k in (128, 64, 8, 1)]
    assert chunked == sorted(chunked, reverse=True) and len(set(chunked)) == 4
    assert mph.val_need_gib(vc, 128, 128, img=320) < needs[-1]  # fewer pixels
    off, auto = _run("yolov9-s", 7.0), _run("yolov9-s", 7.0, "auto")
    assert auto.chunk < 128 and auto.graphs_kept and auto.val_batch == 128
    assert auto.peaks["validation"][0] < off.peaks["validation"][0]
    assert auto.peaks["validation"][1] <= 7.0
    smaller = _run("yolov9-s", 7.0, val_batch=64)
    assert smaller.peaks["validation"][0] < off.peaks["validation"][0]


def test_auto_keeps_the_graphs_only_where_min_chunk_images_fit_beside_them():
    for model, cap in (("yolov9-s", 7.0), ("yolov9-c", 14.5), ("yolov9-e", 22.0)):
        run = _run(model, cap, "auto")
        assert run.graphs_kept and mph.MIN_CHUNK <= run.chunk < 128, (model, run.chunk)
        assert run.val_batch == 128 and run.whole_gib <= cap  # the batch of record, inside the card
    tight = _run("yolov9-e", 19.0, "auto")  # 1 GiB beside the pool: the pool is given back
    assert not tight.graphs_kept and tight.peaks["validation"][1] < tight.peaks["train"][1]
    roomy = _run("yolov9-s", 40.0, "auto")  # room for the whole batch beside the pool
    assert roomy.graphs_kept and roomy.chunk == 128


def test_the_whole_run_is_its_largest_phase():
    for chunks in ("off", "auto", 16):
        run = _run("yolov9-c", 14.5, chunks)
        assert set(run.peaks) == {"train", "validation", "saving", "final validation"}
        assert run.whole_gib == max(r for _, r in run.peaks.values())
        assert run.card_gib == pytest.approx(run.whole_gib + mp.CONTEXT_GIB)
        assert all(a <= r + 1e-9 or r == 14.5 for a, r in run.peaks.values()), run.peaks
        assert run.pool_gib > 0 and run.peaks["saving"][0] < run.peaks["train"][0]


@pytest.mark.parametrize("model", ["yolov9-s", "yolov9-e"])
def test_an_estimate_lands_near_the_calibrated_figure(model):
    est, cal = mph.val_cost_for(model, ref="yolov9-c"), mph.val_cost_for(model)
    assert cal.source == "table" and est.source.startswith("estimate (scaled from calibrated yolov9-c")
    assert est.fwd_gib == pytest.approx(cal.fwd_gib, rel=0.15) and est.params == cal.params


def test_the_cli_prints_the_phases(capsys):
    assert cli_main(["memory", "--cfg", "yolov9-e.yaml", "--backend", "c", "--budget", "22G", "--val-chunks",
                     "auto"]) == 0
    out = capsys.readouterr().out
    assert "validation batch 128, --val-chunks auto, under --budget 22.00 GiB as the cap" in out, out
    # a default run: its two CUDA graphs keyed by shape counted (memory_plan.graphs_held), the pool then given back
    assert "; 2 CUDA graphs keyed by shape):" in out
    run = mph.phases(mp.cost_for("yolov9-e", "c"), mph.val_cost_for("yolov9-e"), 64, 128, limit_gib=22.0,
                     chunks="auto", graph_count=mp.graphs_held(64))
    assert not run.graphs_kept
    row = re.search(r"^c +train ([\d.]+)/([\d.]+), capture pool ([\d.]+), validation ([\d.]+)/([\d.]+) \(128 in "
                    r"chunks of (\d+), pool given back\), saving ([\d.]+)/([\d.]+), final validation ([\d.]+)/([\d.]+);"
                    r" whole run ([\d.]+) reserved, ([\d.]+) on the card$", out, re.M)
    assert row, out
    want = [*run.peaks["train"], run.pool_gib, *run.peaks["validation"], run.chunk, *run.peaks["saving"],
            *run.peaks["final validation"], run.whole_gib, run.card_gib]
    assert [float(g) for g in row.groups()] == pytest.approx([round(w, 2) for w in want], abs=0.006)
    # the validation batch and chunks as given; a bad value is refused
    assert cli_main(["memory", "--cfg", "yolov9-s.yaml", "--backend", "c", "--val-batch", "32", "--val-chunks",
                     "8"]) == 0
    assert re.search(r"^c .*validation [\d.]+/[\d.]+ \(32 in chunks of 8, beside the pool\)", capsys.readouterr().out,
                     re.M)
    with pytest.raises(SystemExit):
        cli_main(["memory", "--cfg", "yolov9-s.yaml", "--val-chunks", "0"])


def test_the_cards_a_whole_run_fits_are_those_the_capped_runs_showed(capsys):
    """The capped H100 runs (benchmarks/RESULTS.md §1): yolov9-c kept validation at 128 under 14.5 GiB (16 GB) and
    halved it to 64 under 10.5 GiB (12 GB); yolov9-e halved it to 64 under 22.0 GiB (24 GB). fits_whole_run says
    so card by card, and `python -m yolov9c memory` lists those cards. With the context measured beside the runs
    (memory_plan.CONTEXT_GIB) the step alone no longer fits 12 GB either: the 10.5 GiB cap halved its batch."""
    c_cost, c_vc = mp.cost_for("yolov9-c", "c"), mph.val_cost_for("yolov9-c")
    fits = mph.fits_whole_run(c_cost, c_vc, 64, 128)
    assert not fits["12 GB"] and fits["16 GB"] and fits["80 GB"]
    step = mp.fits_cards(c_cost, 64)
    assert not step["12 GB"] and step["16 GB"]
    e = mph.fits_whole_run(mp.cost_for("yolov9-e", "c"), mph.val_cost_for("yolov9-e"), 64, 128)
    assert not e["24 GB"]
    assert cli_main(["memory", "--cfg", "yolov9-c.yaml", "--backend", "c"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^c +whole run with validation at 128 fits: 16 GB, 24 GB, 40 GB, 80 GB$", out, re.M), out
