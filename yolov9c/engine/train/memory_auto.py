"""--mem-budget auto: the card's free memory is the budget, and the plan picks the settings that fit the whole run.

    gib = budget_from_card(15.4, cap_gib=None)      # 14.9: what the process may reserve, less MARGIN_GIB
    c = choose(cost_of, vc, gib, batch=64)          # Choice: c switches, micro-batch, graph shapes, validation chunks
    apply(state, default=False)                     # set-up (state.plan_memory): reads the card, resolves state.cfg
Budget: min(--mem-cap, the card's free memory + what this process reserves) − MARGIN_GIB (DDP: the smallest card).
choose() fits memory_phases' whole run (step or graph pool, validation at 2× the batch, saving, final validation)
in it: at the loader batch the run's c switches, then --main-recompute 16, 32; only when none fits, the next smaller
micro-batch dividing the batch. Graphs with their pool kept beside validation first, then given back before
validation, then eager, each step down worth one halving of the micro-batch. A fit keeps validation's batch; a split
batch is graphed through --graph-shapes; validation runs with --val-chunks auto; typed options (or a YOLOV9C_*
variable) stay. opt.yaml records the plan (record); a resume re-plans what the plan set. Without --mem-budget
(DEFAULT_MEM_BUDGET, c on CUDA: default=True) the plan steps in only where the run as set does not train in the
budget (as_set_trains); elsewhere nothing changes.
Test: python -m pytest -q tests/engine/train/test_memory_auto.py
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

from yolov9c.engine.train import memory_phases as mph
from yolov9c.engine.train import memory_plan as mp
from yolov9c.engine.train.config import SWITCH_ENV, RunConfig, opt_dict
from yolov9c.engine.train.config import switches as switches_of

from yolov9c.units import GIB
# The budget of a c run without --mem-budget: "auto" read as apply(default=True) (the module docstring); None: no
# plan (the out-of-memory guard alone). Proven by dev/gpu_run.sh capped (benchmarks/RESULTS.md §1): under the
# 6 / 12 / 16 GB caps the plan keeps batch 64 and the graphs; under the 8 / 16 / 24 GB caps nothing changes.
DEFAULT_MEM_BUDGET = "auto"
# Device memory outside PyTorch's allocator that arrives after set-up reads the card: the cuDNN and cuBLAS handles,
# kernels loaded lazily at their first launch, the CUDA graphs' executables. Taken off the cap too, so a rehearsal
# under --mem-cap is no more generous than the card it stands for (a cap already leaves the CUDA context out).
# Assumed until the GPU run measures it (the card's used memory against the allocator's reserved peak).
MARGIN_GIB = 0.5
# --main-recompute strides the plan may raise the default 8 to, cheapest first (each re-runs a superset).
MAIN_RECOMPUTE_STEPS = (16, 32)
# The options the plan sets when the user did not: RunConfig fields (graph_shapes: kept at its default, on; an
# earlier plan's value, a resume of a run planned while it was off by default, back to it).
PLANNED = ("main_recompute", "graph_shapes", "val_chunks")
# What the process may reserve on common small cards (the card less its CUDA context, ~0.83 GiB; 16 GB: a T4's
# 15360 MiB leaves 14.17; dev/gpu_run.sh's caps):
# python -m yolov9c memory --budget auto shows the plan on each.
CARD_SIZES = (("6 GB", 5.0), ("8 GB", 7.0), ("12 GB", 10.5), ("16 GB", 14.0), ("24 GB", 22.0))


def budget_from_card(available_gib, cap_gib=None, margin_gib=MARGIN_GIB):
    """GiB the plan may fill: the smaller of `available_gib` (the card's free memory plus what this process
    already reserves) and `cap_gib` (--mem-cap; None: none), less `margin_gib`; at least 0."""
    limit = available_gib if cap_gib is None else min(available_gib, float(cap_gib))
    return max(limit - margin_gib, 0.0)


def read_card(device, world=1):
    """GiB this process could reserve on CUDA `device` now: the card's free memory (torch.cuda.mem_get_info) plus
    what its allocator already reserves (its cached blocks are the run's to reuse); under DDP (`world` > 1, the
    process group up) the smallest over the ranks, so every rank makes the same plan."""
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    available = (free + torch.cuda.memory_reserved(device)) / GIB
    if world > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            t = torch.tensor([available], dtype=torch.float64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            available = float(t.item())
    return available


def default_of(name):
    """RunConfig's default value of field `name`."""
    return RunConfig.__dataclass_fields__[name].default


def free_options(cfg, env=None):
    """The options of PLANNED the plan may set for `cfg`: those not typed on this command line (cfg.given), not
    set by a YOLOV9C_* variable (SWITCH_ENV, in `env`, default os.environ), and either at their default or set by
    this run's earlier plan (cfg.mem_plan['planned'], a resume): a value the user chose is never re-planned."""
    env = os.environ if env is None else env
    before = set((cfg.mem_plan or {}).get("planned", ()))
    free = []
    for name in PLANNED:
        if name in cfg.given or (env.get(SWITCH_ENV.get(name, ""), "") or "").strip():
            continue
        if getattr(cfg, name) != default_of(name) and name not in before:
            continue
        free.append(name)
    return tuple(free)


def forget(cfg, env=None):
    """cfg without an earlier --mem-budget auto plan (a resume that plans otherwise now: a size, or none): the
    options that plan set back at their defaults (free_options), mem_plan None; cfg itself without one."""
    if not cfg.mem_plan:
        return cfg
    return dataclasses.replace(cfg, **{n: default_of(n) for n in free_options(cfg, env)}, mem_plan=None)


@dataclass(frozen=True)
class Choice:
    """choose()'s answer: `micro_batch` images per forward of each loader batch of `batch` (accumulated), the c
    `switches` (backends/c/switches.Switches; None for another backend), `graph_shapes` and `val_chunks` as the
    run's options, whether the CUDA-graph step runs (`graphed`), the predicted whole run (`run`:
    memory_phases.RunMemory), `budget_gib`, `fits`, and `free`: the options the plan was free to set."""

    budget_gib: float
    batch: int
    micro_batch: int
    switches: Any
    graph_shapes: bool
    val_chunks: str
    graphed: bool
    run: Any
    fits: bool
    free: tuple = ()

    @property
    def accumulate(self):
        return self.batch // self.micro_batch

    def describe(self):
        """The choice in one phrase: '--main-recompute 16, micro-batch 64, validation in chunks of 16 of 128
        beside the CUDA-graph pool; predicted peak 14.10 GiB reserved'."""
        parts = []
        if self.switches is not None:
            kept = "" if "main_recompute" in self.free else " (kept)"
            parts.append(f"--main-recompute {self.switches.main_recompute}{kept}")
        if self.micro_batch < self.batch:
            how = "--graph-shapes" if self.graphed else "eager step"
            parts.append(f"micro-batch {self.micro_batch} of {self.batch} (x{self.accumulate} accumulated, {how})")
        else:
            parts.append(f"micro-batch {self.batch}" + ("" if self.graphed else " (eager step)"))
        run = self.run
        val = (f"validation in chunks of {run.chunk} of {run.val_batch}" if run.chunk < run.val_batch
               else f"validation whole ({run.val_batch})")
        if self.graphed:
            val += " beside the CUDA-graph pool" if run.graphs_kept else " with the CUDA-graph pool given back"
        parts.append(val)
        return ", ".join(parts) + f"; predicted peak {run.whole_gib:.2f} GiB reserved"


def _switch_steps(switches, free):
    """The c switches to try, cheapest first: the run's, then --main-recompute raised (when free and the
    auxiliary branch is recomputed: with it stored no backbone block is re-run either)."""
    if switches is None:
        return [None]
    steps = [switches]
    if "main_recompute" in free and switches.aux_recompute:
        steps += [dataclasses.replace(switches, main_recompute=s) for s in MAIN_RECOMPUTE_STEPS
                  if s > switches.main_recompute]
    return steps


def _tier(run, graphed):
    """0: graphed, the pool kept beside validation; 1: graphed, the pool given back; 2: eager."""
    return 2 if not graphed else 0 if run.graphs_kept else 1


def _graphs(batch, micro, graphed, shapes, varying):
    """The CUDA graphs a run holds (memory_plan.graphs_held) when it is graphed keyed by shape, else 1."""
    return mp.graphs_held(batch, micro, varying) if graphed and shapes else 1


def _fits(run, budget_gib, val_batch):
    return run.whole_gib <= budget_gib and run.val_batch == val_batch and run.final_val_batch == val_batch


def choose(cost_of: Callable, vc, budget_gib, batch, img=mp.REF_IMG, val_batch=None, switches=None, free=PLANNED,
           graphable=True, graph_shapes=True, varying=False, val_chunks="off", half=True) -> Choice:
    """The settings of a run with loader batch `batch` (per rank) at img² that fit `budget_gib`: of each tier's
    first fit (largest micro-batch, then cheapest switches), the one with the highest log2(micro-batch) − tier
    (the module docstring). cost_of(switches) → the step's memory_plan.Cost under those c switches (`switches`: the
    run's; None for another backend, then cost_of(None)); vc: memory_phases.ValCost; val_batch: validation's batch
    (default 2 × batch); free: the options of PLANNED the plan may set (else the given `switches`, `graph_shapes`,
    `val_chunks` stay); graphable: the CUDA-graph step can run at all (CUDA, one process, --cuda-graph, a capturable
    optimizer; --rect, --multi-scale and the torch backend's --ckpt only with --graph-shapes); varying: --rect or
    --multi-scale (a shape per batch); half: fp16 validation. Nothing fits: the smallest micro-batch with the
    strongest switches, fits False. --graph-shapes, when free, stays at its default (on); a split batch is graphed
    only with it, and its graphs are counted (memory_plan.graphs_held: the cap when `varying`, else the micro-batch
    sizes of a fixed-shape run; memory_plan.graphs_gib)."""
    val_batch = val_batch or 2 * batch
    chunks = "auto" if "val_chunks" in free else val_chunks
    steps = _switch_steps(switches, free)
    costs = {}

    def cost(sw):
        if sw not in costs:
            costs[sw] = cost_of(sw)
        return costs[sw]

    def candidate(m, sw):
        shapes = default_of("graph_shapes") if "graph_shapes" in free else graph_shapes
        graphed = graphable and (m == batch or shapes)
        count = _graphs(batch, m, graphed, shapes, varying)
        run = mph.phases(cost(sw), vc, m, val_batch, img=img, limit_gib=budget_gib, chunks=chunks, half=half,
                         graphs=graphed, graph_count=count)
        return Choice(budget_gib, batch, m, sw, shapes, chunks, graphed, run, _fits(run, budget_gib, val_batch),
                      tuple(free))

    best = {}  # tier -> its first fit in the order largest micro-batch, cheapest switches
    for m in mp._divisors_desc(batch):
        seen = None
        for sw in steps:
            if seen is not None and cost(sw) == seen:  # this model has no block the stronger switch adds
                continue
            seen = cost(sw)
            c = candidate(m, sw)
            if c.fits:
                best.setdefault(_tier(c.run, c.graphed), c)
        if 0 in best:  # a smaller micro-batch scores lower in every tier
            break
    if not best:
        return dataclasses.replace(candidate(1, steps[-1]), fits=False)
    return max(best.values(), key=lambda c: (math.log2(c.micro_batch) - _tier(c.run, c.graphed),
                                             -_tier(c.run, c.graphed)))


def as_set_trains(cost, vc, budget_gib, batch, img=mp.REF_IMG, graphed=True, graph_shapes=True, varying=False,
                  half=True):
    """The predicted reserved peak of the training phase (memory_phases.phases: the step at loader batch `batch`
    under cost `cost`, with its graphs' pool when `graphed`, counted as choose() counts them) when it is within
    `budget_gib`, else None. Validation is not asked: --val-chunks auto sizes it to what is left."""
    count = _graphs(batch, batch, graphed, graph_shapes, varying)
    run = mph.phases(cost, vc, batch, 2 * batch, img=img, limit_gib=budget_gib, chunks="auto", half=half,
                     graphs=graphed, graph_count=count)
    train = run.peaks["train"][1]
    return train if train <= budget_gib else None


def as_run(c, cost_of, vc, limit_gib, img=mp.REF_IMG, half=True, varying=False):
    """The phases of choice `c` as its run logs them (memory_phases.RunMemory): the same step, graphs and batch of
    record, but validation's chunks sized to what `limit_gib` leaves, the limit the run sizes them to at each
    pass (the cap, else the card: val_chunks.left_gib), where choose() fitted them in the budget below it."""
    count = _graphs(c.batch, c.micro_batch, c.graphed, c.graph_shapes, varying)
    return mph.phases(cost_of(c.switches), vc, c.micro_batch, c.run.val_batch, img=img, limit_gib=limit_gib,
                      chunks=c.val_chunks, half=half, graphs=c.graphed, graph_count=count)


def record(c, available_gib, cap_gib):
    """opt.yaml's mem_plan: what the card gave (available_gib, the cap, MARGIN_GIB, the budget), the options the
    plan was free to set (a resume re-plans those), the micro-batch and the predicted peak (GiB, 3 decimals)."""
    return {"card_free_gib": round(available_gib, 3), "cap_gib": cap_gib, "margin_gib": MARGIN_GIB,
            "budget_gib": round(c.budget_gib, 3), "planned": list(c.free), "micro_batch": c.micro_batch,
            "predicted_gib": round(c.run.whole_gib, 3)}


def apply(state, env=None, read=read_card, default=False):
    """--mem-budget auto at set-up (state.plan_memory: after the model is built, before the optimizer, the loaders,
    the backend and the step read the options). On CUDA: the budget from the card (read(device, world),
    budget_from_card with --mem-cap), choose() on the model's table or estimated costs, then state.cfg with the
    chosen options and mem_plan, state.progress.micro_batch, state.plan (memory_plan.Plan), one log line, and a
    fresh run's opt.yaml written again with them. Elsewhere nothing is planned (one line when the user asked for
    auto: typed, or in the resumed run's options). TrainError when nothing fits the card.
    default: the run has no --mem-budget (DEFAULT_MEM_BUDGET): where the run as set, its options the plan may set
    at their defaults, trains in the budget (as_set_trains), one line says so and the options stay (an earlier
    plan of a resumed run forgotten); otherwise as auto. Silent where nothing can be planned."""
    from yolov9c.engine.train.errors import TrainError

    cfg, log = state.cfg, state.log
    if state.device.type != "cuda":
        if cfg.mem_budget == "auto":
            log(f"memory plan: --mem-budget auto reads a CUDA card's free memory; this run is on the "
                f"{state.device.type}: nothing is planned")
        return
    resumed = str(state.resumed.ckpt.get("yaml_file") or "") if state.resumed is not None else ""
    name = cfg.cfg or getattr(state.model, "yaml_file", "") or resumed  # a resume builds from the stored dict
    free = free_options(cfg, env)
    base = dataclasses.replace(cfg, **{n: default_of(n) for n in free})
    sw = switches_of(base) if cfg.backend == "c" else None
    try:
        vc = mph.val_cost_for(name) if name else None
        if vc is None or mp.cost_for(name, cfg.backend, None) is None:
            raise ValueError("the model has no yaml file or measured costs to plan from")
    except ValueError as e:
        if not default:
            log(f"memory plan: --mem-budget auto: {e}; nothing is planned")
        return
    available = read(state.device, state.world)
    budget = budget_from_card(available, cfg.mem_cap)
    per_rank = cfg.batch_size // state.world
    varying = cfg.rect or cfg.multi_scale
    # graph_step.unsupported's rule on what set-up knows now (the torch backend's --ckpt: state.bn_buffers)
    graphable = (cfg.cuda_graph and state.world == 1 and cfg.optimizer in ("SGD", "Adam", "AdamW")
                 and (base.graph_shapes or not (varying or (cfg.ckpt and cfg.backend == "torch"))))
    cap = f", --mem-cap {cfg.mem_cap:.2f} GiB" if cfg.mem_cap is not None else ""
    said = f"card {available:.2f} GiB free{cap} -> budget {budget:.2f} GiB"
    margin = f"less a {MARGIN_GIB:.2f} GiB margin"
    why = "read by default" if default else "--mem-budget auto"
    if default:
        train = as_set_trains(mp.cost_for(name, cfg.backend, sw), vc, budget, per_rank, img=state.imgsz,
                              graphed=graphable, graph_shapes=base.graph_shapes, varying=varying, half=state.amp)
        if train is not None:
            state.cfg = dataclasses.replace(base, mem_plan=None)
            log(f"memory plan: {said} ({why}, {margin}): the run as set trains in it (predicted step peak "
                f"{train:.2f} GiB reserved); nothing changed")
            return
    c = choose(lambda s: mp.cost_for(name, cfg.backend, s), vc, budget, per_rank, img=state.imgsz, switches=sw,
               free=free, graphable=graphable, graph_shapes=base.graph_shapes, varying=varying,
               val_chunks=base.val_chunks, half=state.amp)
    if not c.fits:
        if default:  # the user asked for nothing: the run goes on as set, the out-of-memory guard behind it
            log(f"memory plan: {said} ({why}, {margin}): nothing fits, even {c.describe()}; the run goes on as "
                f"set")
            return
        raise TrainError(f"--mem-budget auto: {said} ({margin}): nothing fits, even {c.describe()}; free memory on "
                         f"the card (other processes) or train with a smaller --img")
    changed = dict(graph_shapes=c.graph_shapes, val_chunks=c.val_chunks, mem_plan=record(c, available, cfg.mem_cap))
    if sw is not None:
        changed["main_recompute"] = c.switches.main_recompute
    state.cfg = dataclasses.replace(base, **changed)
    state.progress.micro_batch = c.micro_batch if c.micro_batch < per_rank else None
    note = "" if c.accumulate == 1 else f"{c.accumulate} micro-batches of {c.micro_batch} per loader batch"
    state.plan = mp.Plan(c.micro_batch, c.accumulate, state.imgsz, c.run.whole_gib, budget, True, note)
    cost = mp.cost_for(name, cfg.backend, c.switches)
    log(f"memory plan: {said} ({why}, {margin}): {c.describe()}"
        + (f" [step costs: {cost.source}]" if mp.is_estimate(cost) else ""))
    if state.main and state.folder is not None and state.resumed is None:  # a resume rewrites it in restore()
        state.folder.write_yaml("opt.yaml", opt_dict(state.cfg, state.hyp))
