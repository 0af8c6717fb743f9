"""`python -m yolov9c memory`: the predicted peak GPU memory of training a model, per backend, and the cards
it fits (yolov9c/engine/train/memory_plan.py, memory_phases.py, memory_auto.py).
    python -m yolov9c memory --cfg yolov9-s.yaml --batch 64 --img 640
    python -m yolov9c memory --cfg yolov9-s.yaml --budget 7.5G [--dynamic-img --min-img 384]   # + the plan
    python -m yolov9c memory --cfg yolov9-c.yaml --aux-recompute 0         # c under other switches (as in training)
    python -m yolov9c memory --cfg yolov9-e.yaml --budget 22G --val-chunks auto   # the run's phases, chunked
    python -m yolov9c memory --cfg yolov9-c.yaml --budget auto            # what --mem-budget auto picks per card

Prints, per backend, the predicted peak reserved memory of one AMP training step and the common cards (CARDS, less
the CUDA context) it fits; with --budget, the plan that keeps the nominal batch; then the whole run's phases (train,
capture pool, validation at --val-batch, saving, final validation; the budget as the cap); both count a fixed-shape
run's CUDA graphs (memory_plan.graphs_held). --budget auto: what --mem-budget auto picks per card (CARD_SIZES).
Costs: the tables, else an estimate (marked); --measure profiles this GPU. --img, --min-img as training takes them.
Wiring: add_parser / run(args); budget_type (7.5G), budget_or_auto_type (also auto), add_switch_args serve train too.
Test: python -m pytest -q tests/engine/train/test_memory_plan.py tests/engine/train/test_memory_auto.py
"""

import argparse
import os
import sys

BACKENDS = ("c", "torch")


def budget_type(text):
    """argparse type: '7.5G' / '8GB' / '7680M' → GiB (float)."""
    from yolov9c.engine.train.memory_plan import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def budget_or_auto_type(text):
    """argparse type of train_dual.py --mem-budget and this command's --budget: 'auto' (the card's free memory:
    engine/train/memory_auto.py), else budget_type's GiB."""
    if str(text).strip().lower() == "auto":
        return "auto"
    from yolov9c.engine.train.memory_plan import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}, or auto (the card's free memory)") from None


def val_chunks_type(text):
    """argparse type of --val-chunks: 'off', 'auto', or a number of images (memory CLI only) ≥ 1."""
    if text in ("off", "auto"):
        return text
    try:
        k = int(text)
    except ValueError:
        k = 0
    if k < 1:
        raise argparse.ArgumentTypeError(f"give off, auto or a number of images >= 1, got {text!r}")
    return k


def _switch_type(name):
    """argparse type of c backend switch `name` (backends/c/switches.py parse_switch: 0/1, or a stride)."""
    def parse(text):
        from yolov9c.backends.c.switches import parse_switch

        try:
            return parse_switch(name, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = name
    return parse


_MAIN_DEFAULT = 8  # backends/c/switches.DEFAULT.main_recompute (see add_switch_args)


def add_switch_args(p):
    """--aux-recompute, --main-recompute, --keep-inputs, --plain-stride: the c backend's memory/time switches
    (RunConfig fields of the same names; the YOLOV9C_* variables of docs/switches.md override them in a training
    run). Their defaults are backends/c/switches.DEFAULT's, written out so that this module imports no torch (a
    test pins them to DEFAULT)."""
    p.add_argument("--aux-recompute", type=_switch_type("aux_recompute"), nargs="?", const=True, default=True,
                   metavar="0|1", help="c backend: re-run the PGI auxiliary branch in backward instead of storing "
                                       "it (default 1; 0: stored, more memory, less time, and no backbone block "
                                       "is re-run either)")
    p.add_argument("--main-recompute", type=_switch_type("main_recompute"), default=_MAIN_DEFAULT, metavar="STRIDE",
                   help="c backend: re-run in backward the backbone blocks (RepNCSPELAN4, ELAN1) whose input is at "
                        "this stride or finer (default 8: strides 4 and 8; 4: stride 4; 0: none, more memory)")
    p.add_argument("--keep-inputs", type=_switch_type("keep_inputs"), nargs="?", const=True, default=False,
                   metavar="0|1", help="c backend: a re-run block keeps the conv inputs it rebuilt for their weight "
                                       "gradients (default 0; 1: one BN+SiLU pass less per re-run conv, a higher "
                                       "peak)")
    p.add_argument("--plain-stride", type=_switch_type("plain_stride"), default=0, metavar="STRIDE",
                   help="c backend: main layers whose input is at this stride or coarser run torch's own forward, "
                        "their activations stored (default 0: none; 16: strides 16 and 32, fewer host calls for "
                        "the eager step, more memory)")


def add_parser(subparsers):
    p = subparsers.add_parser("memory", help="predicted training memory per backend and the cards it fits",
                              description="Predicted peak reserved GPU memory of a training step (AMP) per "
                                          "backend, the common cards it fits, and with --budget the micro-batch "
                                          "and accumulation that fit while keeping the nominal batch.")
    p.add_argument("--cfg", required=True, help="model yaml: a name (yolov9-s) or a path")
    p.add_argument("--batch", "--batch-size", type=int, default=64, help="nominal batch (default 64)")
    p.add_argument("--img", "--imgsz", "--img-size", type=int, default=640, help="train image size (default 640)")
    p.add_argument("--backend", choices=BACKENDS, action="append", help="only this backend (repeatable)")
    p.add_argument("--budget", type=budget_or_auto_type,
                   help="memory budget, e.g. 7.5G (binary) or 8GB (decimal); auto: what train_dual.py --mem-budget "
                        "auto chooses on each common card size (6/8/12/16/24 GB)")
    p.add_argument("--dynamic-img", action="store_true",
                   help="with --budget: shrink the images instead of accumulating (changes the data distribution)")
    p.add_argument("--min-img", type=int, default=None,
                   help="--dynamic-img floor (default 320, as train_dual.py --min-img; rounded up to the stride)")
    p.add_argument("--measure", action="store_true", help="measure the costs on this machine's GPU first")
    p.add_argument("--device", default="cuda", help="GPU for --measure (default cuda)")
    p.add_argument("--val-batch", type=int, default=None,
                   help="validation batch of the run's phases (default 2 x --batch, as train_dual.py)")
    p.add_argument("--val-chunks", type=val_chunks_type, default=None, metavar="off|auto|N",
                   help="validation forward of the run's phases: off (whole batch), auto (train_dual.py "
                        "--val-chunks auto: chunks beside the CUDA-graph pool) or N images (default auto, as "
                        "train_dual.py)")
    add_switch_args(p)
    p.set_defaults(func=run)
    return p


def _costs(args):
    """({backend: Cost} of the backends with costs (measured or estimated), [backends without any]).
    ValueError when the model cannot be built for an estimate."""
    from yolov9c.engine.train import memory_plan as mp

    out, missing = {}, []
    for backend in args.backend or BACKENDS:
        sw = _switches(args) if backend == "c" else None
        if args.measure:
            out[backend] = mp.measure(args.cfg, backend, img=args.img, device=args.device, switches=sw)
            continue
        cost = mp.cost_for(args.cfg, backend, sw)
        if cost is None:
            missing.append(backend)
        else:
            out[backend] = cost
    return out, missing


def _switches(args):
    """The c backend's Switches of the flags; None for the defaults (nothing to count, and no torch import)."""
    if (args.aux_recompute, args.main_recompute, args.keep_inputs, args.plain_stride) == (True, 8, False, 0):
        return None
    from yolov9c.backends.c.switches import Switches

    return Switches(aux_recompute=args.aux_recompute, main_recompute=args.main_recompute,
                    keep_inputs=args.keep_inputs, plain_stride=args.plain_stride)


def _has_cuda():
    """Whether this machine has a CUDA GPU, without importing torch when it is not loaded yet (a table answer
    stays under a second): the NVIDIA driver's /proc entry."""
    if "torch" in sys.modules:
        return sys.modules["torch"].cuda.is_available()
    return os.path.exists("/proc/driver/nvidia/gpus") and bool(os.listdir("/proc/driver/nvidia/gpus"))


def run(args):
    """Print the prediction (and plan) for parsed args; returns the exit code (2: nothing to predict)."""
    from yolov9c.engine.train import memory_plan as mp

    def err(msg):
        print(f"python -m yolov9c memory: error: {msg}", file=sys.stderr)

    bad = [f"{flag} must be ≥ {low}, got {value}" for flag, value, low in
           (("--batch", args.batch, 1), ("--val-batch", args.val_batch, 1), ("--img", args.img, 32))
           if value is not None and value < low]  # only the flags given wrong: an unset --val-batch is no 'None'
    if bad:
        err("; ".join(bad))
        return 2
    if args.min_img is not None and args.min_img < 32:
        err(f"--min-img must be ≥ 32, got {args.min_img}")
        return 2
    why = mp.dynamic_img_error(args.dynamic_img, args.budget, args.min_img is not None, budget_flag="--budget")
    if why:
        err(why)
        return 2
    args.img = mp.train_img_size(args.img, log=print)  # training's size, and its warning when it changes
    min_img = mp.train_img_size(mp.MIN_IMG if args.min_img is None else args.min_img)
    if args.measure:
        import torch

        if not torch.cuda.is_available():
            err("--measure needs a CUDA GPU; without one the measured table is used (drop --measure)")
            return 2
    try:
        costs, missing = _costs(args)
    except ValueError as e:
        err(str(e))
        return 2
    if not costs:
        for backend in missing:
            err(f"{args.cfg}: no measured memory costs for --backend {backend} (run with --measure on a GPU)")
        return 2
    if args.measure:
        src = "measured on this GPU"
    elif all(not mp.is_estimate(c) for c in costs.values()):
        src = "measured table (H200, benchmarks/RESULTS.md)"
    else:
        src = "measured table (H200, benchmarks/RESULTS.md) where measured, else an estimate (marked)"
    print(f"{args.cfg}: batch {args.batch}, {args.img}x{args.img}, AMP on a GPU; costs: {src}")
    if "c" in costs:
        from yolov9c.engine.train import switch_cost

        sw = _switches(args)
        counted = not args.measure and sw is not None
        print(f"c backend: --aux-recompute {int(args.aux_recompute)} --main-recompute {args.main_recompute} "
              f"--keep-inputs {int(args.keep_inputs)}"
              + (f" --plain-stride {args.plain_stride}" if args.plain_stride else "") + (
                  f" ({switch_cost.per_image_gib(args.cfg, sw):+.4f} GiB per 640² image against the defaults, "
                  f"counted from the model graph)" if counted else ""))
    if not _has_cuda():
        print("note: this machine has no CUDA GPU: these are GPU figures (the planner plans GPU memory only); "
              "--mem-budget does not bound the memory of a CPU run")
    print(f"{'backend':<8} {'peak reserved':>14}  fits")
    for backend, cost in costs.items():
        need = mp.predict(cost, args.batch, args.img)
        cards = [name for name, ok in mp.fits_cards(cost, args.batch, args.img).items() if ok]
        print(f"{backend:<8} {need:>10.2f} GiB  {', '.join(cards) if cards else 'none of ' + ', '.join(mp.CARDS)}"
              + (f"  [{cost.source}]" if mp.is_estimate(cost) else ""))
    for backend in missing:
        print(f"{backend:<8} {'not measured':>14}  (--measure on a GPU measures it)")
    if args.budget == "auto":
        _print_auto(args, costs)
        return 0
    if args.budget is not None:
        print(f"budget {args.budget:.2f} GiB, nominal batch {args.batch}:")
        for backend, cost in costs.items():
            p = mp.plan(cost, args.budget, nominal=args.batch, img=args.img, dynamic_img=args.dynamic_img,
                        min_img=min_img, graphs=mp.graphs_held(args.batch))
            what = (f"--batch-size {p.batch} x {p.accumulate} accumulated at {p.img}, predicted "
                    f"{p.predicted_gib:.2f} GiB" + (" (estimate)" if mp.is_estimate(cost) else "")
                    ) if p.fits else f"does not fit: {p.note}"
            shrunk = p.fits and p.img != args.img
            print(f"{backend:<8} {what}" + (f" ({p.note})" if shrunk else ""))
    _print_phases(args, costs)
    return 0


def _print_phases(args, costs):
    """The whole run's phases per backend (memory_phases.phases): one line each, after a header with the
    assumptions (validation batch and chunks, the budget as the cap)."""
    from yolov9c.engine.train import memory_phases as mph
    from yolov9c.engine.train import memory_plan as mp

    try:
        vc = mph.val_cost_for(args.cfg)
    except ValueError as e:  # step costs from the table, but no model to count the validation forward of
        print(f"whole run by phase: not predicted ({e})")
        return
    val_batch = args.val_batch or 2 * args.batch
    chunks = args.val_chunks or "auto"
    limit = f"under --budget {args.budget:.2f} GiB as the cap" if args.budget is not None else "no cap"
    held = mp.graphs_held(args.batch)  # a fixed-shape run keyed by shape (--graph-shapes, the default)
    print(f"whole run by phase, GiB allocated/reserved (a model: memory_phases.py; validation batch {val_batch}, "
          f"--val-chunks {chunks}, {limit}; {held} CUDA graphs keyed by shape" + (
              f"; validation {vc.source}" if vc.source != "table" else "") + "):")
    for backend, cost in costs.items():
        batch = args.batch
        if args.budget is not None:
            p = mp.plan(cost, args.budget, nominal=args.batch, img=args.img, graphs=held)
            if not p.fits:  # phases at a batch that does not train would read as a plan (reserved < allocated)
                print(f"{backend:<8} not predicted: the training step does not fit the budget (above)")
                continue
            batch = p.batch
        run = mph.phases(cost, vc, batch, val_batch, img=args.img, limit_gib=args.budget, chunks=chunks,
                         graph_count=mp.graphs_held(args.batch, batch))
        (ta, tr), (va, vr) = run.peaks["train"], run.peaks["validation"]
        (sa, sr), (fa, fr) = run.peaks["saving"], run.peaks["final validation"]
        how = (f"{run.val_batch} in chunks of {run.chunk}" if run.chunk < run.val_batch else f"{run.val_batch} "
               f"whole") + ("" if not run.pool_gib else ", beside the pool" if run.graphs_kept else
                            ", pool given back")
        print(f"{backend:<8} train {ta:.2f}/{tr:.2f}, capture pool {run.pool_gib:.2f}, validation {va:.2f}/{vr:.2f} "
              f"({how}), saving {sa:.2f}/{sr:.2f}, final validation {fa:.2f}/{fr:.2f}; whole run "
              f"{run.whole_gib:.2f} reserved, {run.card_gib:.2f} on the card")
        if args.budget is None:  # the cards: each one the cap of the run
            cards = [n for n, ok in mph.fits_whole_run(cost, vc, batch, val_batch, img=args.img, chunks=chunks,
                                                         graph_count=held).items() if ok]
            print(f"{backend:<8} whole run with validation at {val_batch} fits: "
                  f"{', '.join(cards) if cards else 'none of ' + ', '.join(mp.CARDS)}")


def _print_auto(args, costs):
    """What train_dual.py --mem-budget auto chooses on each card of memory_auto.CARD_SIZES, per backend: one line
    each (memory_auto.choose on the whole run, the card's size less MARGIN_GIB as the budget, as a run on that
    card or under --mem-cap SIZE plans). A --main-recompute other than 8 and a --val-chunks given are kept, as
    typed options are in a run; the other planned options are free. For c, a second line says what a run without
    --mem-budget does there (memory_auto.as_set_trains: the run as set, or the plan above)."""
    from yolov9c.engine.train import memory_auto as ma
    from yolov9c.engine.train import memory_phases as mph

    try:
        vc = mph.val_cost_for(args.cfg)
    except ValueError as e:
        print(f"--mem-budget auto: not predicted ({e})")
        return
    val_batch = args.val_batch or 2 * args.batch
    free = tuple(n for n in ma.PLANNED if not (n == "main_recompute" and args.main_recompute != _MAIN_DEFAULT)
                 and not (n == "val_chunks" and args.val_chunks is not None))
    print(f"--mem-budget auto on each card (train_dual.py; the whole run planned in what the process may reserve "
          f"less the {ma.MARGIN_GIB:.2f} GiB margin, one CUDA-graph-capable GPU, validation batch {val_batch}; "
          f"engine/train/memory_auto.py):")
    for card, gib in ma.CARD_SIZES:
        for backend, cost in costs.items():
            sw = _run_switches(args) if backend == "c" else None
            c = ma.choose(_cost_of(args, cost, sw), vc, ma.budget_from_card(gib), args.batch, img=args.img,
                          val_batch=val_batch, switches=sw, free=free, val_chunks=args.val_chunks or "auto")
            what = c.describe() if c.fits else f"nothing fits (even {c.describe()})"
            print(f"{card + f' ({gib:.1f} GiB)':<16} {backend:<6} {what}")
            if backend == "c":
                train = ma.as_set_trains(_cost_of(args, cost, sw)(sw), vc, ma.budget_from_card(gib), args.batch,
                                         img=args.img)
                said = ("the run as set (predicted step peak " f"{train:.2f} GiB reserved)" if train is not None
                        else "as auto above")
                print(f"{'':<16} {'':<6} without --mem-budget: {said}")


def _run_switches(args):
    """The c backend's Switches of the flags (the defaults included)."""
    from yolov9c.backends.c.switches import Switches

    return Switches(aux_recompute=args.aux_recompute, main_recompute=args.main_recompute,
                    keep_inputs=args.keep_inputs, plain_stride=args.plain_stride)


def _cost_of(args, cost, base):
    """memory_auto.choose's cost_of: `cost` (under the flags' c switches `base`, measured or from the table) under
    other switches: plus the per-image difference switch_cost counts between the two."""
    def of(sw):
        if sw is None or sw == base:
            return cost
        from dataclasses import replace

        from yolov9c.engine.train import switch_cost

        d = switch_cost.per_image_gib(args.cfg, sw) - switch_cost.per_image_gib(args.cfg, base)
        return replace(cost, per_image_gib=cost.per_image_gib + d)
    return of


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m yolov9c")
    sub = p.add_subparsers(dest="command")
    add_parser(sub)
    return run(p.parse_args(["memory", *(argv or [])]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
