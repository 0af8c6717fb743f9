"""The training loop of train_dual.py. train() reads top to bottom:

    state = setup(cfg)                          # state.py: RunConfig → RunState, sealed (resume.py restores)
    for epoch in range(state.progress.start_epoch, cfg.epochs):
        stats = train_one_epoch(state, epoch)   # each batch: warm-up LR, prepare_batch, state.guard.step around
                                                # state.step (OOM back-off, non-finite skips)
        stop = end_epoch(state, epoch, stats)   # validate, fitness, save_epoch (last.pt, best.pt, results.csv)
    finish(state)                               # strip last.pt/best.pt, validate best.pt, plots, run_state "done"

The run folder is held from set-up to the end of train() (released in a finally); Ctrl-C raises Interrupted naming
the last.pt to resume; a run stopped (Ctrl-C, an error) before its first save removes its folder (drop_unsaved_run).
Checkpoints hold float32 weights, optimizer, scaler, RNG states and state.progress: a resumed CPU run ends as one.

    train(parse_opt(["--cfg", "gelan-t.yaml", "--img", "160", "--epochs", "3"]))   # yolov9c.cli.train.parse_opt
Test: python -m pytest -q tests/engine/train/test_train_e2e.py tests/engine/train/test_resume.py
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from yolov9c.data.image_weights import class_weights, image_weights
from yolov9c.data.loader import close_loader
from yolov9c.data.quad import quad
from yolov9c.engine.progress import EpochClock, bar
from yolov9c.engine.train import results as R
from yolov9c.engine.train.config import RunConfig
from yolov9c.engine.train.errors import TrainError
from yolov9c.engine.train.guards import (LOSSES, free_cuda, raise_diverged, raise_if_peer_lost, stop_if_diverged,
                                         validate_with_backoff)
from yolov9c.engine.train.memory_cap import release_cap, tight
from yolov9c.engine.train.resume import rng_state
from yolov9c.engine.train.run_folder import USER_ERRORS
from yolov9c.engine.train.schedule import warmup
from yolov9c.engine.train.state import FIRST_EPOCH_FILES, RunState, abandon_run_folder, make_val_loader, setup
from yolov9c.engine.train.step import prepare_batch
from yolov9c.engine.val.coco import coco_layout
from yolov9c.engine.val.validator import ValConfig, validate
from yolov9c.models.checkpoint import make_checkpoint
from yolov9c.models.weights import load_model

__all__ = ["Interrupted", "TrainError", "train"]  # TrainError: raised by set-up and the loop, caught by the CLI

from yolov9c.units import GIB
METRIC_KEYS = ("mp", "mr", "map50", "map", "box_loss", "cls_loss", "dfl_loss")
HEADER = ("%11s" * 8) % ("Epoch", "GPU_mem", "box_loss", "cls_loss", "dfl_loss", "Instances", "Size", "peak_mem")


@dataclass
class EpochStats:
    """What train_one_epoch hands to end_epoch (the results.csv row's training columns)."""
    mloss: torch.Tensor  # (3,) mean box, cls, dfl loss over the epoch's batches
    seconds: float  # wall time of the pass
    images: int  # images this rank trained on
    lr: list  # the param groups' learning rates at the end of the pass
    skipped: int = 0  # optimizer steps skipped for a non-finite loss or gradient (guards.py)
    peak_gib: float = 0.0  # peak GPU memory allocated in the pass (0 on the CPU)
    finite_batches: int = 0  # batches whose losses were finite (the main process's; mloss averages those)

    def losses(self):
        """{box_loss, cls_loss, dfl_loss: the epoch's mean}, or None when no batch had finite losses."""
        return dict(zip(LOSSES, self.mloss.tolist())) if self.finite_batches else None


def fitness(mp, mr, map50, map5095):
    """Model fitness for best.pt and early stopping: 0.1 · mAP@0.5 + 0.9 · mAP@0.5:0.95 (published)."""
    return 0.1 * map50 + 0.9 * map5095


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during training: `last` is the checkpoint a --resume continues from (None: no epoch saved yet),
    `save_dir` the run folder."""

    def __init__(self, save_dir, last, removed=False):
        super().__init__(str(last or save_dir))
        self.save_dir, self.last, self.removed = save_dir, last, removed  # removed: no checkpoint, folder gone


def train(cfg: RunConfig, *, stop_after_epoch=None, log=print, prog="train_dual.py"):
    """Run a training as train_dual.py does. cfg: a RunConfig (yolov9c.cli.train.parse_opt builds one).
    stop_after_epoch: stop (as if interrupted) after saving that epoch's last.pt (tests of --resume).
    prog: the script that started the run (train.py or train_dual.py), the options line's prefix as published.
    Returns a dict: save_dir (Path), epochs_done, best_fitness, metrics (the last validation's), and final (the
    validation of best.pt) when the run finished with validation. Ctrl-C raises Interrupted (a
    KeyboardInterrupt naming the checkpoint to resume)."""
    state = setup(cfg, log, prog)
    try:
        return _train(state, stop_after_epoch)
    except KeyboardInterrupt as e:
        if state.evolving or not state.main or isinstance(e, Interrupted):
            raise
        last = state.wdir / "last.pt"
        if last.is_file():
            raise Interrupted(state.save_dir, last) from e
        raise Interrupted(state.save_dir, None, drop_unsaved_run(state)) from e
    except (TrainError, *USER_ERRORS):  # divergence, a full disk, ...: the CLI prints one `error:` line
        if drop_unsaved_run(state):
            state.log(f"{state.save_dir} removed: the run stopped before it saved anything (the same command "
                      f"starts it there again)")
        raise
    except RuntimeError as e:
        raise_if_peer_lost(state, e)  # guards.py: another DDP process died → one `error:` line
        raise
    finally:
        for loader in (state.train_loader, state.val_loader):  # workers stopped here, not at interpreter exit
            close_loader(loader)
        state.step.release()  # a graph step's memory pool given back here (evolve trains again)
        release_cap(state.device)  # --mem-cap / --mem-budget: this process is not capped after the run
        if state.folder is not None:
            state.folder.close()


def drop_unsaved_run(state) -> bool:
    """A run stopped (Ctrl-C, a user error) before it saved anything: remove the folder this run made
    (state.abandon_run_folder), so that the same command gets the same name again, not NAME2, and nothing is left
    that --resume could not use. A --nosave run's finished epochs (results.csv rows) keep their folder. Returns
    whether the folder was removed. Main process of a fresh run only."""
    if state.evolving or not state.main or (state.wdir / "last.pt").is_file():
        return False
    if state.tb is not None:
        state.tb.close()
        state.tb = None
    if R.epochs_in(state.save_dir / "results.csv"):
        return False
    return abandon_run_folder(state, also=FIRST_EPOCH_FILES)


def _train(state: RunState, stop_after_epoch):
    cfg, progress = state.cfg, state.progress
    if state.finish_only:
        out = {"save_dir": state.save_dir, "epochs_done": cfg.epochs, "best_fitness": None, "metrics": {}}
        if state.main:
            out.update(finish(state))
        return _end(state, out)
    state.log(f"Image sizes {state.imgsz} train, {state.imgsz} val\nUsing {state.train_loader.num_workers} "
              f"dataloader workers\nLogging results to {state.save_dir}\nStarting training for {cfg.epochs} "
              f"epochs...")
    state.tb = _tensorboard(state) if state.main and not state.evolving else None
    t_start, epoch, stop = time.time(), progress.start_epoch - 1, False
    clock = EpochClock(cfg.epochs)  # the measured time left, logged after each epoch (progress.py)
    clock.start()
    for epoch in range(progress.start_epoch, cfg.epochs):
        stats = train_one_epoch(state, epoch)
        stop = end_epoch(state, epoch, stats)
        state.log(clock.lap(epoch, stats.seconds, last=stop))  # an early stop: no time-left estimate
        if stop or (stop_after_epoch is not None and epoch >= stop_after_epoch):
            break
    out = {"save_dir": state.save_dir, "epochs_done": epoch + 1, "best_fitness": progress.best_fitness,
           "metrics": dict(zip(METRIC_KEYS, progress.metrics))}
    if stop_after_epoch is not None and epoch + 1 < cfg.epochs and not stop:
        return out  # simulated interruption: no strip, no final validation
    if state.main:
        state.log(f"\n{epoch - progress.start_epoch + 1} epochs completed in {(time.time() - t_start) / 3600:.3f} "
                  f"hours.")
        out.update(finish(state))
    return _end(state, out)


def _end(state, out):
    if state.world > 1:
        if dist.get_backend() == "gloo":
            # leave together: a gloo rank that tore its group down while rank 0 was still finishing (strip,
            # final validation) aborted once in CI ("terminate called without an active exception"); NCCL
            # ranks leave as published (rank 0's final validation can outlast a barrier's timeout)
            dist.barrier()
        dist.destroy_process_group()
    return out


def train_one_epoch(state: RunState, epoch):
    """One pass over the training loader (each batch: warm-up, prepare_batch, state.guard.step around
    state.step); the LR schedule steps at the end. Returns the EpochStats."""
    cfg, nb = state.cfg, state.nb
    state.model.train()
    _epoch_sampling(state, epoch)
    ms_rng = np.random.default_rng([cfg.seed & 0xFFFFFFFF, epoch, 0x5CA1E])
    quad_rng = np.random.default_rng([cfg.seed & 0xFFFFFFFF, epoch, 0x40AD]) if cfg.quad else None
    mloss = torch.zeros(3, device=state.device)
    n_finite = torch.zeros((), device=state.device)  # batches with finite losses (the means skip the others)
    state.optimizer.zero_grad()
    state.window.ok = None  # a window left open by the last epoch is dropped with its gradients
    state.guard.begin_epoch(epoch)
    cuda = state.device.type == "cuda"
    first = epoch == state.progress.start_epoch
    if first:
        state.peaks.mark("start-up")  # memory_cap.PhasePeaks: each phase's peaks (the pass's below)
    state.log(HEADER)
    pbar = enumerate(state.train_loader)
    if state.main:
        pbar = bar(pbar, total=nb)  # n/total [elapsed<epoch's time left, it/s]
    t0, images = time.time(), 0
    for i, (imgs, targets, _paths, _shapes) in pbar:
        ni = i + nb * epoch
        if cfg.quad:  # 4 images -> one of twice the side (the published collate_fn4); the step's loss x 4
            imgs, targets = quad(imgs, targets, quad_rng)
        if state.plots and ni < 3:
            R.plot_train_batch(imgs, targets, state.save_dir / f"train_batch{ni}.jpg", state.names)
        if ni <= state.nw:  # warm-up (the accumulation ramp: state.batching.accumulate_at, read by the step)
            warmup(state.optimizer, ni, state.nw, epoch, state.lf, state.hyp)
        imgs = prepare_batch(state, imgs, ms_rng)
        result = state.guard.step(state, imgs, targets, ni)  # state.step under the OOM and non-finite guards
        images += result.images
        if state.main:
            items = result.loss_items.to(state.device)
            ok = torch.isfinite(items).all()
            n_finite += ok
            mloss = torch.where(ok, (mloss * (n_finite - 1) + items) / n_finite.clamp(min=1), mloss)
            mem = torch.cuda.memory_reserved(state.device) / 1e9 if cuda else 0.0
            peak = torch.cuda.max_memory_allocated(state.device) / 1e9 if cuda else 0.0
            pbar.set_description(("%11s" * 2 + "%11.4g" * 5 + "%11s") % (
                f"{epoch}/{cfg.epochs - 1}", f"{mem:.3g}G", *mloss.tolist(), targets.shape[0], imgs.shape[-1],
                f"{peak:.3g}G"))
    seconds = time.time() - t0
    state.peaks.mark("first epoch" if first else "train")  # the first holds the warm-up and the graph capture
    peak = state.peaks.peaks.get("first epoch" if first else "train", (0.0, 0.0))[0]
    skipped = state.guard.end_epoch()
    state.step.end_epoch(state)  # a graph step's device-side counters (the EMA's update count) to the host
    if skipped:
        state.log(state.guard.summary(epoch))
    lr = [g["lr"] for g in state.optimizer.param_groups]
    with warnings.catch_warnings():  # an epoch whose every step was skipped (non-finite) never called optimizer.step
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
        state.scheduler.step()
    return EpochStats(mloss=mloss, seconds=seconds, images=images, lr=lr, skipped=skipped, peak_gib=peak,
                      finite_batches=int(n_finite))


def _epoch_sampling(state, epoch):
    """The epoch's draw of training images: mosaic off for the last --close-mosaic epochs, --image-weights'
    weights from the last per-class mAPs (state.progress.maps), the sampler's epoch (its shuffle seed)."""
    cfg, ds = state.cfg, state.dataset
    # as published (mosaic closes at epoch == epochs - close_mosaic): never when --close-mosaic > --epochs
    closed = bool(cfg.close_mosaic) and 0 <= cfg.epochs - cfg.close_mosaic <= epoch
    first = state.progress.start_epoch
    mosaic_used = ds.augment and not ds.rect and state.hyp["mosaic"] > 0  # --mosaic 0: nothing stays on
    if cfg.close_mosaic > cfg.epochs and epoch == first and mosaic_used:
        state.log(f"--close-mosaic {cfg.close_mosaic} is more than --epochs {cfg.epochs}: mosaic stays on for the "
                  f"whole run (as in the published loop, which closes it at epoch {cfg.epochs - cfg.close_mosaic})")
    if closed and ds.augment and not ds.rect and epoch in (cfg.epochs - cfg.close_mosaic, first):
        state.log(f"Closing dataloader mosaic (--close-mosaic {cfg.close_mosaic}: no mosaic or mixup from epoch "
                  f"{max(0, cfg.epochs - cfg.close_mosaic)})")  # the published loop's line, once (or at a resume past it)
    ds.mosaic = ds.augment and not ds.rect and not closed
    if cfg.image_weights:
        cw = class_weights(ds.labels, state.nc) * state.nc * (1 - state.progress.maps) ** 2 / state.nc
        state.train_loader.sampler.weights = image_weights(ds.labels, state.nc, cw)
    state.train_loader.sampler.set_epoch(epoch)


def end_epoch(state: RunState, epoch, stats: EpochStats) -> bool:
    """Main process: validate (every --val-period epochs and the last), fitness and best epoch, the results.csv
    row (and TensorBoard), checkpoints, the early-stop decision. Returns whether to stop (every rank agrees)."""
    stop, progress = False, state.progress
    if state.main:
        final = epoch + 1 == state.cfg.epochs
        state.ema.update_attr(state.model)
        res = None
        if (not state.cfg.noval and (epoch + 1) % state.cfg.val_period == 0) or final:
            res = _validate(state, state.ema.ema)
            state.peaks.mark("validation")
            progress.metrics = [res[k] for k in METRIC_KEYS]
            progress.maps = np.asarray(res["maps"], np.float64)
        stop_if_diverged(state, epoch, stats.losses(), res)  # guards.py: weights or training losses diverged
        fi = fitness(*progress.metrics[:4])
        if fi >= progress.best_fitness:
            progress.best_epoch = epoch
        stop = epoch - progress.best_epoch >= (state.cfg.patience or float("inf"))
        if fi > progress.best_fitness:
            progress.best_fitness = fi
        row = _epoch_row(state, epoch, stats)
        save_epoch(state, epoch, row, best=progress.best_fitness == fi, ckpt=not state.cfg.nosave or final)
        state.peaks.mark("saving")
        if (epoch == progress.start_epoch or final) and state.peaks.peaks:  # GPU runs only
            state.log(state.peaks.line())
        if state.tb is not None:
            for k, v in zip(R.COLUMNS[1:], row[1:]):
                state.tb.add_scalar(k, v, epoch)
        if stop:
            state.log(f"Stopping training early as no improvement observed in last {state.cfg.patience} epochs. "
                      f"Best results observed at epoch {progress.best_epoch}, best model saved as best.pt.\n"
                      f"To wait longer pass a larger --patience (e.g. --patience 300), or --patience 0 to never stop "
                      f"early.")
    if state.world > 1:  # every rank stops together
        flag = torch.tensor([int(stop)], device=state.device)
        dist.broadcast(flag, 0)
        stop = raise_diverged(state, flag.item())
    return stop


def _epoch_row(state, epoch, stats):
    """The epoch's results.csv row (R.COLUMNS)."""
    cuda = state.device.type == "cuda"
    peak = max(stats.peak_gib, state.peaks.peaks.get("validation", (0.0, 0.0))[0])  # the pass's and validation's
    reserved = torch.cuda.memory_reserved(state.device) / GIB if cuda else 0.0
    return [epoch, *stats.mloss.tolist(), *state.progress.metrics, *stats.lr, peak, reserved, stats.seconds,
            stats.images * state.world / max(stats.seconds, 1e-9), stats.skipped]


def save_epoch(state, epoch, row, best, ckpt=True):
    """The epoch's files through the run folder (run_folder.RunFolder.save_epoch: last.pt, then best.pt when
    `best` and epochN.pt every --save-period epochs as copies of it, then the results.csv row; ckpt False
    (--nosave): the row only). end_epoch has checked that the weights are finite (guards.stop_if_diverged). An
    --evolve generation (no run folder) only appends its row (atomically)."""
    if state.folder is None:
        R.append_row(state.save_dir / "results.csv", row)
        return
    if not ckpt:
        state.folder.save_epoch(epoch, row, None)
        return
    ck = make_checkpoint(state.model, ema=state.ema, optimizer=state.optimizer, epoch=epoch,
                         opt=state.recorded_opt(), hyp=state.hyp, best_fitness=state.progress.best_fitness,
                         half=False)
    ck.update(scaler=state.scaler.state_dict(), rng=rng_state(), nominal_batch=state.batching.nominal,
              **state.progress.checkpoint_fields())
    also = ["best.pt"] if best else []
    if state.cfg.save_period > 0 and epoch % state.cfg.save_period == 0:
        also.append(f"epoch{epoch}.pt")
    state.folder.save_epoch(epoch, row, ck, also=also)


def finish(state: RunState):
    """Main process, after the last epoch, and the whole of a --resume of a run killed while finishing (one
    function for both): run_state "finishing", strip last.pt and best.pt (harmless twice), validate best.pt
    (COCO JSON on COCO data, plots), results.png, run_state "done". Returns {'final': metrics of best.pt} when it
    was validated."""
    out = {}
    folder = state.folder  # None for an --evolve generation (no checkpoints)
    if folder is not None:
        folder.begin_finish()
        folder.strip_weights(state.log)
    best = state.wdir / "best.pt"
    if best.exists():  # also with --noval, as published (it validates only the final epoch and best.pt)
        state.log(f"\nValidating {best}...")
        is_coco, anno, class_map, ids = coco_layout(state.data, state.data["val"], state.val_loader.dataset.im_files)
        coco = dict(save_json=True, anno_json=anno, class_map=class_map, image_ids=ids,
                    json_name="_predictions.json") if is_coco else {}  # COCO data only, as published
        final = load_model(best).to(state.device)
        gib = sum(p.numel() * p.element_size() for p in final.parameters()) / GIB
        out["final"] = _validate(state, final, plots=state.plots, verbose=True, model_gib=gib, **coco)
        del final
        state.peaks.mark("final validation")
        if state.peaks.peaks:
            state.log(state.peaks.line())
            out["memory_peaks"] = dict(state.peaks.peaks)
    out["val_batch"] = state.val_loader.batch_size if state.val_loader is not None else None
    if state.plots and (state.save_dir / "results.csv").exists():
        R.plot_results(state.save_dir / "results.csv")
    if folder is not None:
        folder.mark_done()
    state.log(f"Results saved to {state.save_dir}")
    if state.tb is not None:
        state.tb.close()
    return out


def _validate(state, model, plots=False, verbose=False, model_gib=0.0, **coco):
    """Validate `model` on the validation loader; a CUDA OOM repeats it with smaller chunks (--val-chunks auto),
    else half the batch (guards.py). --val-chunks auto: each pass's forward in the chunk that fits beside the
    CUDA-graph pool (state.val_chunks, which gives the pool back only when too little fits; model_gib: a model
    loaded for this validation), the pass's cached blocks given back after. Off: on a card where the reserved
    memory is over half of what the run may use (memory_cap.tight: --mem-cap, or the card itself), the pool is
    given back first. Either way the next batch captures the graphs again, without eager warm-up batches."""
    chunks = state.val_chunks
    if chunks is None and tight(state.device) and state.step.suspend(state) and state.step.suspends == 1:
        state.log("validation: the CUDA-graph memory is given back while validating (over half of this card's "
                  "memory was reserved); the next training batch captures the graphs again")

    def run(loader):
        chunk = chunks.before_pass(state, loader.batch_size, model_gib) if chunks is not None else None
        cfg = ValConfig(half=state.amp, single_cls=state.cfg.single_cls, save_dir=state.save_dir, plots=plots,
                        verbose=verbose, training=True, chunk=chunk, **coco)
        return validate(model, loader, nc=state.nc, names=state.names, cfg=cfg, compute_loss=state.loss,
                        log=state.log)
    res = validate_with_backoff(state, run, lambda batch: make_val_loader(state, batch),
                                shrink=chunks.shrink if chunks is not None else None)
    if chunks is not None:
        free_cuda(state.device)  # the next phases start from the pool, not from validation's cache
    return res


def _tensorboard(state):
    """A SummaryWriter on the run folder when TensorBoard is installed (as published), else None."""
    try:  # optional dependency (not in the install list): imported only here, where its absence is handled
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    state.log(f"TensorBoard: Start with 'tensorboard --logdir {state.save_dir.parent}', view at "
              f"http://localhost:6006/")
    return SummaryWriter(str(state.save_dir))
