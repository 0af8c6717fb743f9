"""--mem-budget auto (yolov9c/engine/train/memory_auto.py), on the CPU with the card stood in.

- The budget: the card's free memory (torch.cuda.mem_get_info stood in) plus what the process reserves, the cap
  when smaller, less MARGIN_GIB.
- The choice order on given budgets, with a toy step whose --main-recompute 16 / 32 save a known share: the
  default when it fits; a bit short, the switches only; shorter, switches and a micro-batch; a switch the user
  fixed stays and the plan picks only the micro-batch; --no-graph-shapes typed leaves a split batch eager; one
  halving of the micro-batch is worth one tier (pool kept / given back / eager). Each choice is checked against
  memory_phases.phases directly: the cheaper settings it passed over do not fit.
- Which options are free (typed, a YOLOV9C_* variable, a value the user chose, an earlier plan's).
- apply() on a stood-in CUDA set-up: the resolved config, micro-batch, the one log line, opt.yaml rewritten;
  the cap; a resume re-plans what the earlier plan set and keeps what the user set; nothing fits: TrainError.
- On the CPU: typed auto says in one line that nothing is planned; the default flipped to auto says nothing.
- resume.restore_micro_batch tells the plan's micro-batch from the out-of-memory back-off's.
- The CLIs: --mem-budget auto parses (bad text and --dynamic-img with it: one error line); `python -m yolov9c
  memory --budget auto` prints one choice per card, the same as choose().
Run: python -m pytest -q tests/engine/train/test_memory_auto.py
"""

import dataclasses
import re
import types

import pytest
import torch
import yaml

from yolov9c.backends.c.switches import Switches
from yolov9c.cli.main import main as cli_main
from yolov9c.cli.train import parse_opt
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.train import memory_auto as ma
from yolov9c.engine.train import memory_phases as mph
from yolov9c.engine.train import memory_plan as mp
from yolov9c.engine.train import resume
from yolov9c.engine.train import state as train_state
from yolov9c.engine.train.config import SWITCH_ENV, RunConfig
from yolov9c.engine.train.errors import TrainError

pytestmark = pytest.mark.usefixtures("one_thread")

# a toy c step: --main-recompute 16 saves 10 % of the per-image memory, 32 another 5 %; 4 stores 10 % more, and
# the auxiliary branch stored twice as much
PER_IMAGE = {4: 0.11, 8: 0.10, 16: 0.09, 32: 0.085}
VC = mph.ValCost("toy", fwd_gib=0.02, params=10_000_000)


def toy_cost(sw):
    return mp.Cost("toy", "c", 0.5, PER_IMAGE[sw.main_recompute] if sw.aux_recompute else 0.2)


def pick(budget, **kw):
    return ma.choose(toy_cost, VC, budget, 64, switches=kw.pop("switches", Switches()), **kw)


def graphed_run(budget, main, micro):
    """memory_phases' run of (main, micro) graphed keyed by shape within `budget`, its graphs counted
    (memory_plan.graphs_held: 2, the micro-batch's and the last partial batch's) (the oracle)."""
    return mph.phases(toy_cost(Switches(main_recompute=main)), VC, micro, 128, limit_gib=budget, chunks="auto",
                      graphs=True, graph_count=mp.graphs_held(64, micro))


def kept_pool(budget, main, micro):
    """Whether (main, micro) runs graphed with the pool kept through validation within `budget` (the oracle)."""
    run = graphed_run(budget, main, micro)
    return run.whole_gib <= budget and run.val_batch == 128 and run.graphs_kept


def given_back(budget, main, micro):
    """Whether (main, micro) runs graphed within `budget` only with the pool given back before validation."""
    run = graphed_run(budget, main, micro)
    return run.whole_gib <= budget and run.val_batch == 128 and not run.graphs_kept


@pytest.fixture(autouse=True)
def _no_switch_env(monkeypatch):
    for var in SWITCH_ENV.values():  # a developer's shell must not decide these tests
        monkeypatch.delenv(var, raising=False)


# --- the budget --------------------------------------------------------------------------------------------

def test_budget_from_card():
    assert ma.budget_from_card(15.4) == pytest.approx(15.4 - ma.MARGIN_GIB)
    assert ma.budget_from_card(79.0, cap_gib=10.5) == pytest.approx(10.5 - ma.MARGIN_GIB)  # the cap is smaller
    assert ma.budget_from_card(6.0, cap_gib=10.5) == pytest.approx(6.0 - ma.MARGIN_GIB)  # the card is smaller
    assert ma.budget_from_card(0.2) == 0.0


def test_read_card_counts_free_and_own_reserved_memory(monkeypatch):
    gib = 2 ** 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(12.25 * gib), 16 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: int(1.5 * gib))
    assert ma.read_card(torch.device("cuda", 0)) == pytest.approx(13.75)


# --- the choice order ----------------------------------------------------------------------------------------

def test_fits_as_is_changes_nothing():
    c = pick(9.1)
    assert c.fits and (c.switches, c.micro_batch, c.graph_shapes, c.graphed) == (Switches(), 64, True, True)
    assert c.run.graphs_kept and c.run.whole_gib <= 9.1 and c.val_chunks == "auto"
    assert not kept_pool(9.0, 8, 64)  # the second graph's 3 % (0.19 GiB here) counted


def test_a_bit_short_takes_the_switches_only():
    c = pick(8.5)
    assert (c.switches.main_recompute, c.micro_batch, c.graph_shapes) == (16, 64, True)
    assert not kept_pool(8.5, 8, 64) and kept_pool(8.5, 16, 64)  # the default does not fit, 16 is enough


def test_shorter_takes_switches_and_a_micro_batch():
    c = pick(5.2)
    assert (c.switches.main_recompute, c.micro_batch, c.accumulate, c.graph_shapes, c.graphed) == (16, 32, 2, True,
                                                                                                    True)
    assert not any(kept_pool(5.2, main, 64) for main in (8, 16, 32))  # no switch keeps the whole batch
    assert not kept_pool(5.2, 8, 32) and kept_pool(5.2, 16, 32)
    assert c.run.peaks["train"][0] == pytest.approx(mp.predict(toy_cost(c.switches), 32, graphs=2))  # 2 counted
    assert c.describe() == ("--main-recompute 16, micro-batch 32 of 64 (x2 accumulated, --graph-shapes), validation "
                            f"in chunks of {c.run.chunk} of 128 beside the CUDA-graph pool; predicted peak "
                            f"{c.run.whole_gib:.2f} GiB reserved")


def test_a_fixed_switch_is_kept_and_only_the_micro_batch_is_chosen():
    c = pick(8.3, free=("graph_shapes", "val_chunks"))
    assert (c.switches.main_recompute, c.micro_batch) == (8, 32)
    assert c.describe().startswith("--main-recompute 8 (kept), micro-batch 32 of 64")
    c = pick(8.3, switches=Switches(main_recompute=4), free=("graph_shapes", "val_chunks"))
    assert c.switches.main_recompute == 4
    c = pick(8.3, switches=Switches(aux_recompute=False))  # no backbone block is re-run with the branch stored
    assert c.switches == Switches(aux_recompute=False)


def test_a_typed_no_graph_shapes_leaves_the_split_batch_eager():
    c = pick(6.0, free=("main_recompute", "val_chunks"), graph_shapes=False)
    assert (c.micro_batch, c.graph_shapes, c.graphed) == (32, False, False)
    assert c.switches.main_recompute == 8  # eager: the cheapest switches at the largest micro-batch that fits
    assert "(x2 accumulated, eager step)" in c.describe()


def test_without_the_graph_step_the_largest_micro_batch_and_cheapest_switches_win():
    # DDP, --no-cuda-graph, --rect with --no-graph-shapes: everything eager; --graph-shapes stays at its default
    c = pick(6.0, graphable=False)
    assert (c.micro_batch, c.switches.main_recompute, c.graphed, c.graph_shapes) == (32, 8, False, True)
    assert c.describe().startswith("--main-recompute 8, micro-batch 32 of 64 (x2 accumulated, eager step), "
                                   "validation ")


def test_one_halving_of_the_micro_batch_is_worth_one_tier():
    # 2.4 GiB: graphed with the pool kept only at 4 images, with the pool given back at 16: 16 wins (two halvings
    # against one tier); 2.62 GiB: the pool kept at 8, given back at 16 but not at 32: 8 with the pool kept beats
    # 16 with it given back (a tie)
    c = pick(2.4)
    assert (c.micro_batch, c.run.graphs_kept) == (16, False) and not kept_pool(2.4, 32, 8)
    assert kept_pool(2.4, 32, 4) and given_back(2.4, 8, 16)
    c = pick(2.62)
    assert (c.micro_batch, c.run.graphs_kept) == (8, True)
    assert given_back(2.62, 8, 16) and not any(kept_pool(2.62, main, 16) or given_back(2.62, main, 32)
                                               for main in (8, 16, 32))


def test_as_run_is_the_plan_at_the_budget_and_sizes_validation_to_a_larger_limit():
    """memory_auto.as_run: under the budget itself the phases choose() fitted; under the cap (0.5 GiB more) the same
    step and saving, validation in larger chunks up to the cap, the batch of record kept."""
    vc, cost_of = mph.val_cost_for("yolov9-s"), (lambda sw: mp.cost_for("yolov9-s", "c", sw))
    c = ma.choose(cost_of, vc, 4.5, 64, switches=Switches())
    same = ma.as_run(c, cost_of, vc, 4.5)
    assert same.logged == c.run.logged and same.chunk == c.run.chunk and same.whole_gib == c.run.whole_gib
    wider = ma.as_run(c, cost_of, vc, 5.0)
    assert wider.logged["train"] == c.run.logged["train"] and wider.logged["saving"] == c.run.logged["saving"]
    assert wider.chunk > c.run.chunk and wider.val_batch == c.run.val_batch == 128
    assert c.run.whole_gib < wider.whole_gib <= 5.0


def test_nothing_fits():
    c = pick(1.0)
    assert not c.fits and c.micro_batch == 1 and c.switches.main_recompute == 32


def test_free_options():
    cfg = RunConfig()
    assert ma.free_options(cfg, env={}) == ma.PLANNED
    assert ma.free_options(RunConfig(given=("main_recompute",)), env={}) == ("graph_shapes", "val_chunks")
    assert ma.free_options(cfg, env={"YOLOV9C_MAIN_RECOMPUTE": "16"}) == ("graph_shapes", "val_chunks")
    assert ma.free_options(cfg, env={"YOLOV9C_MAIN_RECOMPUTE": " "}) == ma.PLANNED  # empty: unset
    chosen = RunConfig(main_recompute=4, val_chunks="off")  # a resumed run's values the user chose
    assert ma.free_options(chosen, env={}) == ("graph_shapes",)
    planned = RunConfig(main_recompute=16, val_chunks="auto", mem_plan={"planned": ["main_recompute", "val_chunks"]})
    assert ma.free_options(planned, env={}) == ma.PLANNED


# --- apply() on a stood-in CUDA set-up ---------------------------------------------------------------------------

class Folder:
    def __init__(self):
        self.written = {}

    def write_yaml(self, name, data):
        self.written[name] = yaml.safe_load(yaml.safe_dump(data))  # as it reads back


def fake_state(cfg, device="cuda", resumed=None):
    """What memory_auto.apply and state.plan_memory read of a set-up run (the model built), on a stood-in device;
    and the list its log lines go to."""
    lines = []
    where = torch.device(device, 0) if device == "cuda" else torch.device(device)
    state = types.SimpleNamespace(cfg=cfg, device=where, log=lines.append, world=1, amp=True, imgsz=640, model=None,
                                  resumed=resumed, progress=train_state.Progress(), folder=Folder(), main=True,
                                  hyp={"lr0": 0.01}, plan=None)
    return state, lines


def auto(*extra, **kw):
    return parse_opt(["--cfg", "yolov9-s.yaml", "--batch", "64", "--backend", "c", "--mem-budget", "auto", *extra])


def test_apply_resolves_the_run_and_records_it():
    state, lines = fake_state(auto())
    ma.apply(state, env={}, read=lambda device, world: 4.5)  # budget 4.0 GiB
    cfg = state.cfg
    assert (cfg.main_recompute, cfg.graph_shapes, cfg.val_chunks, cfg.mem_budget) == (16, True, "auto", "auto")
    assert state.progress.micro_batch == 32 and (state.plan.batch, state.plan.accumulate) == (32, 2)
    assert cfg.mem_plan == {"card_free_gib": 4.5, "cap_gib": None, "margin_gib": ma.MARGIN_GIB, "budget_gib": 4.0,
                            "planned": list(ma.PLANNED), "micro_batch": 32,
                            "predicted_gib": round(state.plan.predicted_gib, 3)}
    assert state.plan.predicted_gib <= 4.0
    assert len(lines) == 1 and lines[0].startswith(
        "memory plan: card 4.50 GiB free -> budget 4.00 GiB (--mem-budget auto, less a 0.50 GiB margin): "
        "--main-recompute 16, micro-batch 32 of 64 (x2 accumulated, --graph-shapes), validation in chunks of "), lines
    stored = state.folder.written["opt.yaml"]  # a fresh run's opt.yaml, written again with the choices
    assert (stored["mem_budget"], stored["main_recompute"], stored["graph_shapes"], stored["val_chunks"]) == \
        ("auto", 16, True, "auto")
    back = RunConfig.from_dict(stored)  # what a resume reads back
    assert dataclasses.replace(back, hyp=cfg.hyp, given=cfg.given) == cfg


def test_apply_counts_the_graphs_of_rect_and_multi_scale():
    """--rect / --multi-scale are graphed keyed by shape (the default): the plan counts memory_plan.MAX_GRAPHS
    graphs, more than a fixed-shape run's; with --no-graph-shapes typed they run eagerly."""
    vc, cost_of = mph.val_cost_for("yolov9-s"), (lambda sw: mp.cost_for("yolov9-s", "c", sw))
    fixed = ma.choose(cost_of, vc, 19.5, 64, switches=Switches())
    for flag in ("--rect", "--multi-scale"):
        state, lines = fake_state(auto(flag))
        ma.apply(state, env={}, read=lambda device, world: 20.0)
        c = ma.choose(cost_of, vc, 19.5, 64, switches=Switches(), varying=True)
        assert c.graphed and state.cfg.mem_plan["predicted_gib"] == round(c.run.whole_gib, 3)
        assert c.run.peaks["train"][0] == pytest.approx(mp.predict(cost_of(c.switches), 64, graphs=mp.MAX_GRAPHS))
        assert c.run.peaks["train"][0] > fixed.run.peaks["train"][0]
        state, lines = fake_state(auto(flag, "--no-graph-shapes"))
        ma.apply(state, env={}, read=lambda device, world: 20.0)
        assert state.cfg.graph_shapes is False and "(eager step)" in lines[0], lines


def test_apply_under_a_cap_plans_in_the_cap():
    state, lines = fake_state(auto("--mem-cap", "7.0"))
    ma.apply(state, env={}, read=lambda device, world: 79.0)
    assert state.cfg.mem_plan["budget_gib"] == 6.5 and state.cfg.mem_plan["cap_gib"] == 7.0
    assert lines[0].startswith("memory plan: card 79.00 GiB free, --mem-cap 7.00 GiB -> budget 6.50 GiB")
    assert state.progress.micro_batch is None and state.cfg.main_recompute == 16  # the 8 GB class: switches only


def test_a_typed_or_environment_switch_is_kept():
    state, _ = fake_state(auto("--main-recompute", "8"))
    ma.apply(state, env={}, read=lambda device, world: 5.0)
    assert state.cfg.main_recompute == 8 and state.cfg.mem_plan["planned"] == ["graph_shapes", "val_chunks"]
    assert state.progress.micro_batch is not None
    state, lines = fake_state(auto())
    ma.apply(state, env={"YOLOV9C_MAIN_RECOMPUTE": "8"}, read=lambda device, world: 5.0)
    assert state.cfg.main_recompute == 8 and "--main-recompute 8 (kept)" in lines[0]


def test_a_resume_re_plans_what_the_plan_set_and_keeps_what_the_user_set():
    first, _ = fake_state(auto())
    ma.apply(first, env={}, read=lambda device, world: 4.5)
    stored = RunConfig.from_dict(first.folder.written["opt.yaml"])  # main 16, graph shapes, micro-batch 32
    resumed = types.SimpleNamespace(ckpt={"yaml_file": "yolov9-s.yaml"}, cfg=stored)
    state, _ = fake_state(dataclasses.replace(stored, cfg="", given=()), resumed=resumed)
    ma.apply(state, env={}, read=lambda device, world: 20.0)  # a bigger card: the defaults fit
    assert (state.cfg.main_recompute, state.cfg.graph_shapes, state.progress.micro_batch) == (8, True, None)
    assert "opt.yaml" not in state.folder.written  # a resume's opt.yaml is rewritten by resume.restore
    users = dataclasses.replace(stored, cfg="", given=(), main_recompute=4, graph_shapes=False,
                              mem_plan={**stored.mem_plan, "planned": ["val_chunks"]})
    state, _ = fake_state(users, resumed=resumed)
    ma.apply(state, env={}, read=lambda device, world: 20.0)
    assert (state.cfg.main_recompute, state.cfg.graph_shapes) == (4, False)  # the user's, kept
    # a plan made while --graph-shapes was off by default set it off: re-planned, back to the default
    old = dataclasses.replace(stored, cfg="", given=(), graph_shapes=False)
    state, _ = fake_state(old, resumed=resumed)
    ma.apply(state, env={}, read=lambda device, world: 4.5)
    assert (state.cfg.graph_shapes, state.progress.micro_batch) == (True, 32)


def test_a_resume_with_a_size_forgets_the_auto_plan(monkeypatch):
    first, _ = fake_state(auto())
    ma.apply(first, env={}, read=lambda device, world: 4.5)
    stored = RunConfig.from_dict(first.folder.written["opt.yaml"])
    assert stored.main_recompute == 16 and stored.mem_plan
    monkeypatch.setattr(train_state, "apply_memory_plan", lambda state: None)
    state, _ = fake_state(dataclasses.replace(stored, mem_budget=7.0, given=("mem_budget",)))
    train_state.plan_memory(state)  # --resume --mem-budget 7G: the step's plan only
    assert (state.cfg.main_recompute, state.cfg.graph_shapes, state.cfg.val_chunks, state.cfg.mem_plan) == \
        (8, True, "auto", None)
    kept = dataclasses.replace(stored, mem_budget=7.0, main_recompute=4, mem_plan={**stored.mem_plan,
                                                                                  "planned": ["graph_shapes"]})
    state, _ = fake_state(kept)
    train_state.plan_memory(state)
    assert (state.cfg.main_recompute, state.cfg.graph_shapes, state.cfg.val_chunks) == (4, True, "auto")


def test_nothing_fits_the_card_is_an_error():
    state, _ = fake_state(auto())
    with pytest.raises(TrainError, match=r"^--mem-budget auto: card 0\.60 GiB free -> budget 0\.10 GiB \(less a "
                                         r"0\.50 GiB margin\): nothing fits, even "):
        ma.apply(state, env={}, read=lambda device, world: 0.6)


def test_on_the_cpu_auto_plans_nothing(monkeypatch):
    state, lines = fake_state(auto(), device="cpu")
    train_state.plan_memory(state)
    assert lines == ["memory plan: --mem-budget auto reads a CUDA card's free memory; this run is on the cpu: "
                     "nothing is planned"]
    assert state.cfg == auto() and state.progress.micro_batch is None and not state.folder.written
    state, lines = fake_state(parse_opt(["--cfg", "yolov9-s.yaml", "--backend", "c"]), device="cpu")  # the default
    train_state.plan_memory(state)
    assert lines == [] and state.progress.micro_batch is None


def test_a_c_run_without_the_option_reads_the_card_by_default(monkeypatch):
    """DEFAULT_MEM_BUDGET ('auto'): a c run without --mem-budget plans as the default (apply(default=True)); a torch
    run, an AutoBatch run (--batch -1) and a run with the option typed do not take the default."""
    assert ma.DEFAULT_MEM_BUDGET == "auto"
    called = []
    monkeypatch.setattr(ma, "apply", lambda state, default=False: called.append((state.cfg.batch_size, default)))
    for argv in (["--backend", "torch"], ["--backend", "c", "--batch", "-1"]):
        state, _ = fake_state(parse_opt(["--cfg", "yolov9-s.yaml", "--batch", "64", *argv]))
        train_state.plan_memory(state)
    assert called == []
    state, _ = fake_state(parse_opt(["--cfg", "yolov9-s.yaml", "--batch", "64", "--backend", "c"]))
    train_state.plan_memory(state)
    state, _ = fake_state(auto())
    train_state.plan_memory(state)
    assert called == [(64, True), (64, False)]
    monkeypatch.setattr(ma, "DEFAULT_MEM_BUDGET", None)  # the out-of-memory guard alone
    state, _ = fake_state(parse_opt(["--cfg", "yolov9-s.yaml", "--batch", "64", "--backend", "c"]))
    train_state.plan_memory(state)
    assert len(called) == 2


def default_run(*extra):
    return parse_opt(["--cfg", "yolov9-s.yaml", "--batch", "64", "--backend", "c", *extra])


def test_the_default_changes_nothing_where_the_run_as_set_trains():
    """The 8 GB class (--mem-cap 7.0, budget 6.5): explicit auto raises --main-recompute to 16 for validation's sake,
    the default keeps the run as set (its step trains in the budget; validation chunks itself) and says so."""
    state, lines = fake_state(default_run("--mem-cap", "7.0"))
    before = state.cfg
    ma.apply(state, env={}, read=lambda device, world: 79.0, default=True)
    assert state.cfg == before and state.progress.micro_batch is None and state.plan is None
    assert not state.folder.written
    train = ma.as_set_trains(mp.cost_for("yolov9-s", "c", Switches()), mph.val_cost_for("yolov9-s"), 6.5, 64)
    assert train is not None and train <= 6.5
    assert lines == ["memory plan: card 79.00 GiB free, --mem-cap 7.00 GiB -> budget 6.50 GiB (read by default, "
                     f"less a 0.50 GiB margin): the run as set trains in it (predicted step peak {train:.2f} GiB "
                     "reserved); nothing changed"]
    state, _ = fake_state(default_run("--mem-cap", "7.0"))
    ma.apply(state, env={}, read=lambda device, world: 79.0)  # typed auto: the whole run planned
    assert state.cfg.main_recompute == 16


def test_the_default_plans_where_the_run_as_set_does_not_train():
    """The 6 GB class (--mem-cap 5.0, budget 4.5): the step at 64 does not fit, so the default plans exactly what
    auto plans (the measured one-class-lower runs), recorded in mem_plan with mem_budget left unset."""
    assert ma.as_set_trains(mp.cost_for("yolov9-s", "c", Switches()), mph.val_cost_for("yolov9-s"), 4.5, 64) is None
    state, lines = fake_state(default_run("--mem-cap", "5.0"))
    ma.apply(state, env={}, read=lambda device, world: 79.0, default=True)
    typed, _ = fake_state(default_run("--mem-cap", "5.0", "--mem-budget", "auto"))
    ma.apply(typed, env={}, read=lambda device, world: 79.0)
    assert state.cfg.mem_budget is None and state.cfg.mem_plan == typed.cfg.mem_plan
    assert state.progress.micro_batch == typed.progress.micro_batch == 32
    assert state.cfg.main_recompute == typed.cfg.main_recompute
    assert lines[0].startswith("memory plan: card 79.00 GiB free, --mem-cap 5.00 GiB -> budget 4.50 GiB (read by "
                               "default, less a 0.50 GiB margin): --main-recompute "), lines
    assert state.folder.written["opt.yaml"]["mem_plan"]["micro_batch"] == 32
    # a resume on a bigger card: the run as set trains there, so what the plan set goes back to the defaults
    stored = RunConfig.from_dict(state.folder.written["opt.yaml"])
    resumed = types.SimpleNamespace(ckpt={"yaml_file": "yolov9-s.yaml"}, cfg=stored)
    again, lines = fake_state(dataclasses.replace(stored, cfg="", given=(), mem_cap=None), resumed=resumed)
    ma.apply(again, env={}, read=lambda device, world: 20.0, default=True)
    assert again.cfg.mem_plan is None and again.progress.micro_batch is None and "nothing changed" in lines[0]


def test_the_default_never_stops_a_run():
    """Where nothing fits, typed auto is an error; the default logs one line and leaves the run as set."""
    state, lines = fake_state(default_run())
    before = state.cfg
    ma.apply(state, env={}, read=lambda device, world: 0.6, default=True)
    assert state.cfg == before and len(lines) == 1 and "nothing fits" in lines[0] and "goes on as set" in lines[0]


def test_a_cpu_run_records_auto_in_opt_yaml(tmp_path):
    data = synthetic_dataset(seed=3, root=tmp_path / "syn", n_train=4, n_val=2, imgsz=64)
    cfg = parse_opt(["--data", str(data), "--cfg", "yolov9-t.yaml", "--img", "64", "--batch", "4", "--workers", "0",
                     "--noplots", "--device", "cpu", "--project", str(tmp_path / "runs"), "--mem-budget", "auto"])
    logs = []
    state = train_state.setup(cfg, log=lambda *a, **k: logs.append(" ".join(map(str, a))))
    assert [s for s in logs if s.startswith("memory plan:")] == [
        "memory plan: --mem-budget auto reads a CUDA card's free memory; this run is on the cpu: nothing is planned"]
    stored = yaml.safe_load((state.save_dir / "opt.yaml").read_text())
    assert stored["mem_budget"] == "auto" and stored["mem_plan"] is None and state.progress.micro_batch is None


# --- resume's micro-batch ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("now, stored, planned, kept", [
    (None, 32, 32, None),  # the earlier plan's: this start (no split on the card it reads now) stands
    (None, 16, 32, 16),  # below the plan's: the out-of-memory back-off's, kept
    (32, 16, None, 16),  # no auto plan: a smaller stored one is the back-off's
    (16, 32, None, 16),  # this start's plan is smaller: it stands
])
def test_restore_micro_batch(now, stored, planned, kept):
    state = types.SimpleNamespace(batching=types.SimpleNamespace(per_rank=64), progress=train_state.Progress(),
                                  log=lambda *a: None)
    state.progress.micro_batch = now
    resume.restore_micro_batch(state, stored, planned=planned)
    assert state.progress.micro_batch == (kept if kept is not None else now)


# --- the command lines -------------------------------------------------------------------------------------------

def test_train_cli_takes_auto(capsys):
    assert parse_opt(["--mem-budget", "auto"]).mem_budget == "auto"
    assert parse_opt(["--mem-budget", "AUTO"]).mem_budget == "auto"
    for argv, says in ((["--mem-budget", "autox"], "argument --mem-budget: cannot read the memory size 'autox'"),
                       (["--mem-budget", "auto", "--dynamic-img"], "--dynamic-img needs --mem-budget SIZE"),
                       (["--mem-cap", "auto"], "argument --mem-cap: cannot read the memory size 'auto'")):
        with pytest.raises(SystemExit) as e:
            parse_opt(argv)
        errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert e.value.code == 2 and len(errors) == 1 and says in errors[0], errors


def test_memory_cli_shows_what_auto_chooses_per_card(capsys):
    assert cli_main(["memory", "--cfg", "yolov9-s", "--backend", "c", "--budget", "auto"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^(\d+ GB) \(([0-9.]+) GiB\) +c +(.*)$", out, re.M)
    assert [(card, float(gib)) for card, gib, _ in rows] == list(ma.CARD_SIZES)
    for card, gib, what in rows:
        c = ma.choose(lambda sw: mp.cost_for("yolov9-s", "c", sw), mph.val_cost_for("yolov9-s"),
                      ma.budget_from_card(float(gib)), 64, switches=Switches())
        assert what == c.describe(), (card, what)
    got = {card: what for card, _, what in rows}
    assert got["6 GB"].startswith("--main-recompute 8, micro-batch 32 of 64")  # a micro-batch
    assert got["8 GB"].startswith("--main-recompute 16, micro-batch 64,")  # switches only
    assert got["12 GB"].startswith("--main-recompute 8, micro-batch 64,")  # as is
    assert "whole run by phase" not in out and not re.search(r"^budget ", out, re.M)
    default = re.findall(r"^ +without --mem-budget: (.*)$", out, re.M)  # one line under each card's c row
    assert len(default) == len(rows) and default[0] == "as auto above"  # 6 GB: the step does not fit as set
    assert all(d.startswith("the run as set (predicted step peak ") for d in default[1:])  # 8 GB and up
    assert cli_main(["memory", "--cfg", "yolov9-s", "--backend", "c", "--budget", "auto", "--main-recompute", "4"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^6 GB \(5\.0 GiB\) +c +--main-recompute 4 \(kept\), micro-batch 16 of 64", out, re.M), out
