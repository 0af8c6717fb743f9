"""--resume: continue a run exactly where its last.pt stopped.

    resumed = read_resume(cfg, log)    # before set-up: which last.pt, its options, hyp, weights, nominal batch
    restore(state, resumed)            # after set-up: optimizer, EMA, GradScaler, counters, RNG

`Resumed` is made before anything is built and applied once at the end of set-up; nothing else reads a
checkpoint. read_resume picks the given last.pt or (bare --resume) the newest not-done last*.pt under --project;
options: opt.yaml (or last.pt's when it is missing/broken) and the typed RESUME_OVERRIDES, checked by options.py's
rules before anything is written. Another checkpoint (weights/epochN.pt; weights.N/*.pt, moved aside by a later
--exist-ok run) continues in a new folder <run>-from-epochN (<run>-from-weights.N-last), never over the run.
Action (run_folder.resume_action): "train", "finish" (strip and validate), "done" (TrainError). restore: optimizer,
EMA (+ updates), GradScaler, epoch, best fitness, last metrics, the OOM micro-batch, RNG states; opt.yaml is
rewritten. Another --batch-size keeps the nominal batch unless --accumulate is given.
Invariant: an interrupted then resumed CPU run ends with the same weights as an uninterrupted one.
Test: python -m pytest -q tests/engine/train/test_resume.py
"""

from __future__ import annotations

import dataclasses
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from yolov9c.data.dataset_yaml import DataConfigError, is_synthetic, load_data_config
from yolov9c.engine.run_dir import increment_path
from yolov9c.engine.train.config import RESUME_OVERRIDES, RunConfig, opt_dict
from yolov9c.engine.train.errors import TrainError
from yolov9c.engine.train.options import OptionError
from yolov9c.engine.train.run_folder import RunFolderError, read_opt, read_state, resume_action
from yolov9c.models.atomic_io import atomic_copy, atomic_write
from yolov9c.models.checkpoint import CheckpointError, read_checkpoint


@dataclass
class Resumed:
    cfg: RunConfig  # the run's stored options with the command line's overrides applied
    ckpt: dict  # last.pt as read (float32 model/EMA, optimizer, scaler, rng, counters)
    last: Path  # the last.pt resumed from
    save_dir: Path  # its run folder (last.pt's grandparent)
    action: str = "train"  # "train": continue at epoch ckpt['epoch'] + 1; "finish": only strip and validate

    @property
    def hyp(self):
        """The run's own hyperparameters as read (older versions stored weight_decay scaled to the nominal batch:
        a record only, the optimizer state carries the value used), or None in an old checkpoint."""
        h = self.ckpt.get("hyp")
        return dict(h) if isinstance(h, dict) else None

    @property
    def model_state(self):
        return {k: v.float() if v.is_floating_point() else v for k, v in self.ckpt["model"].items()}

    @property
    def nominal_batch(self):
        return self.ckpt.get("nominal_batch")

    @property
    def old_batch(self):
        return (self.ckpt.get("opt") or {}).get("batch_size")


def read_resume(cfg: RunConfig, log=print) -> Resumed:
    """The Resumed record of `cfg.resume` (True: the newest resumable last*.pt under cfg.project, else that
    path). Its `action` (run_folder.resume_action): "train" or "finish"; a run with nothing left ("done": it
    finished) is a TrainError. The run folder's lock confirms the action when set-up opens the folder. Before
    anything is written (a branch folder included), the stored options are checked (_stored_options) and a
    run that trains must be set to more epochs than last.pt has trained: a TrainError leaves the run as it was."""
    if cfg.resume is True:
        last, ckpt = pick_latest(cfg.project, log)
    else:
        last = Path(cfg.resume)
        if last.is_dir():  # the run folder (or its weights/) for the file in it
            inside = next((p for p in (last / "weights" / "last.pt", last / "last.pt") if p.is_file()), None)
            raise TrainError(f"--resume {last}: a folder, not a checkpoint; " + (
                f"give the file: --resume {inside}" if inside else "it holds no weights/last.pt to give"))
        if not last.is_file():
            raise TrainError(f"--resume: no last.pt found ({cfg.resume})")
        ckpt = _read(last)
        if ckpt.get("source") == "state_dict":  # no epoch, optimizer or options: it never was a run to continue
            raise TrainError(f"--resume {last}: a plain state_dict, not a training checkpoint: it holds no epoch, "
                             f"optimizer or options to continue; start a run from it with --weights {last} --cfg "
                             f"MODEL.yaml")
    run = last.parent.parent  # the run whose options (opt.yaml) are resumed
    aside = moved_aside(last)  # weights.N/: the run's folder and opt.yaml now belong to a later run
    branching = (last.name != "last.pt" or aside) and resumable(ckpt)  # also weights/epochN.pt, a best.pt
    action = resume_action(None if branching else run, ckpt)  # a branch's folder is new: the checkpoint decides
    if action == "done":
        raise TrainError(f"--resume {last}: nothing to resume: this run finished (stripped weights, final "
                         f"validation done); resume from one of its weights/epochN.pt (--save-period; it continues "
                         f"in a new run folder) or start a new run with --weights {last} to train it further")
    stored, source = _stored_options(None if aside else run, ckpt, last, cfg, log)
    unused = [k for k in cfg.given if k not in RESUME_OVERRIDES and k not in ("resume", "project", "local_rank")]
    if unused:  # as published these come from opt.yaml; say so rather than drop what was typed silently
        log(f"WARNING: --resume continues with the options in {source}: "
            f"{', '.join('--' + k.replace('_', '-') for k in unused)} typed here not used (the options --resume "
            f"takes from the command line: docs/train.md, \"Checkpoints and resume\")")
    reached = int(ckpt.get("epoch", -1)) + 1  # epochs trained (0 to reached - 1)
    if action == "train" and stored.epochs <= reached:  # the loop would train nothing, then strip last.pt
        raise TrainError(f"{source}: epochs: must be more than the {reached} epochs {last} has trained, got "
                         f"{stored.epochs}; {UNCHANGED}")
    if stored.evolve is not None:  # set-up would run it as an --evolve generation: no checkpoints
        raise TrainError(f"{source}: evolve: must be null in a training run's options, got {stored.evolve} (an "
                         f"--evolve search resumes with --evolve --resume); {UNCHANGED}")
    if branching:
        last = branch(last, ckpt, log)
    stored = dataclasses.replace(stored, given=cfg.given, resume=str(last), weights=str(last), cfg="")
    return Resumed(cfg=stored, ckpt=ckpt, last=last, save_dir=last.parent.parent, action=action)


def moved_aside(ckpt_path: Path) -> bool:
    """Whether a checkpoint lies in RUN/weights.N/, where a later run into RUN (--exist-ok) moved the earlier
    run's weights/ (run_folder.py); that run's results are RUN/results.N.csv, its options in the checkpoint."""
    name = ckpt_path.parent.name
    return name.startswith("weights.") and name[len("weights."):].isdigit()


def resumable(ckpt):
    """Whether a checkpoint holds what a resume needs (optimizer, epoch): not a stripped last.pt / best.pt."""
    return ckpt.get("optimizer") is not None and int(ckpt.get("epoch", -1)) >= 0


def branch(src: Path, ckpt: dict, log=print) -> Path:
    """--resume of a checkpoint other than its run's last.pt (weights/epochN.pt, an unstripped best.pt), e.g. to
    go back before a divergence, also of a finished run: the run is left as it is, and training continues in a
    new folder next to it, <run>-from-<stem> (…2, …3 when taken), set up as that run interrupted after the
    checkpoint's epoch: its opt.yaml and hyp.yaml, its results.csv (the resume keeps the rows up to that epoch)
    and the checkpoint as weights/last.pt (a hard link: a branch whose last.pt is still it, from a start that
    failed, is used again) and as weights/best.pt (the branch's only epoch so far: a branch of the final epoch,
    or one that never beats the run's best fitness, still ends by validating a best.pt). A checkpoint in
    weights.N/ (moved_aside) branches to <run>-from-weights.N-<stem> with the options and hyp it stores and
    results.N.csv. Returns that last.pt; only the main process (RANK -1 or 0) writes."""
    run = src.parent.parent
    aside = moved_aside(src)
    target = run.parent / f"{run.name}-from-{f'{src.parent.name}-' if aside else ''}{src.stem}"
    if int(os.getenv("RANK", -1)) > 0:  # other DDP ranks write nothing; the name is only for their records
        return increment_path(target) / "weights" / "last.pt"
    for n in range(1, 100):  # a branch of this checkpoint that has not saved an epoch yet (a start that failed)
        last = target.with_name(target.name + (str(n) if n > 1 else "")) / "weights" / "last.pt"
        if last.is_file() and os.path.samefile(last, src):
            log(f"--resume {src}: continuing in {last.parent.parent}, made for it earlier and not trained yet")
            return last
    new = increment_path(target, mkdir=True)
    (new / "weights").mkdir()
    if aside:  # RUN's own files are a later run's: the options and hyp the checkpoint holds, results.N.csv
        n = src.parent.name[len("weights."):]
        for name, data in (("opt.yaml", ckpt.get("opt")), ("hyp.yaml", ckpt.get("hyp"))):
            if isinstance(data, dict):
                atomic_write(new / name, yaml.safe_dump(data, sort_keys=False), what=name)
        sources = {"results.csv": run / f"results.{n}.csv"}
    else:
        sources = {name: run / name for name in ("opt.yaml", "hyp.yaml", "results.csv")}
    for name, path in sources.items():  # real copies: results.csv is appended to in place
        if path.is_file():
            atomic_write(new / name, path.read_bytes(), what=name)
    atomic_copy(src, new / "weights" / "best.pt", what="best.pt")
    last = atomic_copy(src, new / "weights" / "last.pt", what="last.pt")
    log(f"--resume {src}: epoch {int(ckpt['epoch'])} of {run}; continuing in a new run folder {new} ({run} is "
        f"left as it is)")
    return last


def pick_latest(project, log=print):
    """(path, checkpoint) of a bare --resume: the most recently modified last*.pt under `project` (else the
    current folder) whose run is not done; finished runs are skipped, and the pick is logged."""
    root = Path(project) if Path(project).exists() else Path(".")
    found = sorted((p for p in root.rglob("last*.pt") if p.is_file() and p.parent.name == "weights"),
                   key=lambda p: p.stat().st_mtime, reverse=True)  # not weights.N/: an earlier run moved aside
    skipped = []
    for last in found:
        if read_state(last.parent.parent).get("phase") == "done":
            skipped.append(last)
            continue
        ckpt = _read(last)
        if resume_action(last.parent.parent, ckpt) == "done":
            skipped.append(last)
            continue
        note = f"; skipped {len(skipped)} newer finished run(s): {', '.join(str(p) for p in skipped[:3])}" \
            if skipped else ""
        log(f"--resume: resuming {last}, the newest unfinished run under {root}{note}")
        return last, ckpt
    if skipped:
        raise TrainError(f"--resume: every run under {root} finished ({len(skipped)}, newest {skipped[0]}); "
                         f"nothing to resume")
    raise TrainError(f"--resume: no last.pt found (under {root}): nothing to resume: start the run without --resume")


def _read(last):
    try:
        return read_checkpoint(last)
    except (FileNotFoundError, CheckpointError) as e:
        raise TrainError(str(e)) from None


UNCHANGED = "nothing was trained or written"  # a refused resume: the run is as it was


def _stored_options(run, ckpt, last, cfg, log):
    """(RunConfig, source): the run's opt.yaml (else, missing, empty or broken, or run None for a checkpoint
    moved aside, the options stored in the checkpoint, the source then) with the command line's
    RESUME_OVERRIDES, every value checked as the command line checks it (RunConfig.from_dict, options.py), and
    its dataset yaml still there and readable (--data is not taken with --resume). A refused value is a
    TrainError "<source>: <key>: <why>"."""
    if run is None:  # moved aside (weights.N/): RUN/opt.yaml is a later run's
        opt, source = ckpt.get("opt"), last
        if not isinstance(opt, dict) or not opt:
            raise TrainError(f"--resume {last}: the checkpoint stores no options, and {last.parent.parent}/opt.yaml "
                             f"is a later run's; start a new run with --weights {last} instead")
        opt = dict(opt)
    else:
        try:
            opt, source = read_opt(run), run / "opt.yaml"
        except RunFolderError:  # read again with the fallback: it says so, or raises its own error
            opt, source = read_opt(run, fallback=ckpt.get("opt"), log=log), last
    typed = {k: getattr(cfg, k) for k in RESUME_OVERRIDES if k in cfg.given}  # checked by the command line
    try:
        stored = RunConfig.from_dict({**opt, **typed}, log=log, source=str(source))
    except OptionError as e:
        raise TrainError(f"{e}; {UNCHANGED}") from None
    if not is_synthetic(stored.data):  # moved or deleted since: --data typed with --resume is not taken
        try:
            load_data_config(stored.data)
        except (DataConfigError, OSError) as e:
            fix = "put the dataset back" + (", or correct data: in it" if source.name == "opt.yaml" else "")
            raise TrainError(f"{source}: data: {e} (--resume reads the dataset from this file, not from --data: "
                             f"{fix}); {UNCHANGED}") from None
    return stored, source


def restore(state, resumed: Resumed):
    """Put the checkpoint's training state into a set-up RunState (before DDP wraps nothing of it: the
    optimizer, EMA and scaler are plain objects) and rewrite opt.yaml with the resumed options."""
    ck = resumed.ckpt
    state.optimizer.load_state_dict(ck["optimizer"])
    if state.ema is not None and ck.get("ema"):
        state.ema.ema.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ck["ema"].items()})
        state.ema.updates = int(ck.get("updates") or 0)
    if ck.get("scaler"):
        state.scaler.load_state_dict(ck["scaler"])
    progress = state.progress
    progress.load_checkpoint(ck)
    state.scheduler.last_epoch = progress.start_epoch - 1
    batch = state.batching.batch_size
    if int(resumed.old_batch or batch) != batch:
        # iteration numbers ni count batches of the new size now; gradients are zeroed at every epoch start, so
        # the first step of the resumed epoch comes after `accumulate` micro-batches
        progress.last_opt_step = state.nb * progress.start_epoch - 1
    restore_micro_batch(state, ck.get("micro_batch"), planned=(resumed.cfg.mem_plan or {}).get("micro_batch"))
    if state.main and ck.get("rng"):  # the other ranks keep their own seeds (only rank 0's states are saved)
        set_rng_state(ck["rng"])
    if state.main:
        rewrite_opt_yaml(state)
    state.log(f"Resuming training from {resumed.last} from epoch {progress.start_epoch} to {state.cfg.epochs} "
              f"total epochs")


def rewrite_opt_yaml(state):
    """As published, opt.yaml is rewritten on resume (atomically, through the run folder): it shows the new
    memory knobs; its 'hyp' entry is kept."""
    try:
        old = yaml.safe_load((state.save_dir / "opt.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        old = {}
    hyp = old.get("hyp") if isinstance(old, dict) and isinstance(old.get("hyp"), dict) else state.hyp
    state.folder.write_yaml("opt.yaml", state.recorded_opt(hyp))


def restore_micro_batch(state, stored, planned=None):
    """Keep the micro-batch an out-of-memory back-off chose (last.pt's 'micro_batch', images per forward on a
    rank) when it is smaller than this start's (the loader batch, or the micro-batch set-up planned). `planned`:
    the micro-batch the run's earlier --mem-budget auto plan chose (opt.yaml's mem_plan): a stored one equal to
    it was that plan's, not the back-off's, and this start's plan (from the card it reads now) stands."""
    per_rank = state.batching.per_rank
    current = min(state.progress.micro_batch or per_rank, per_rank)
    if stored and int(stored) < current and int(stored) != planned:
        micro = state.progress.micro_batch = int(stored)
        state.log(f"Resuming with a micro-batch of {micro} images (lowered after a CUDA out-of-memory "
                  f"error): {-(-per_rank // micro)} forward/backward passes per batch of {per_rank}")


def rng_state():
    """The Python, NumPy, torch and CUDA RNG states, in plain types (a checkpoint's 'rng')."""
    py = random.getstate()
    npst = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": [py[0], list(py[1]), py[2]],
            "numpy": [npst[0], npst[1].tolist(), int(npst[2]), int(npst[3]), float(npst[4])],
            "cuda": list(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else []}


def set_rng_state(st):
    """Restore rng_state()'s states (CUDA only when the device count matches)."""
    torch.set_rng_state(st["torch"])
    random.setstate((st["python"][0], tuple(st["python"][1]), st["python"][2]))
    n = st["numpy"]
    np.random.set_state((n[0], np.array(n[1], np.uint32), n[2], n[3], n[4]))
    if torch.cuda.is_available() and st.get("cuda") and len(st["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(st["cuda"])
