"""Console progress of training and validation: the tqdm bars and the per-epoch time-left line.

Both bars use tqdm's right part: `n/total [elapsed<remaining, rate]` (batches per second, or seconds per batch
when slower than one). The published bar shows `n/total elapsed` only; the columns in front (the bar's
description) stay the published ones. The run's time left is measured, never guessed: after each epoch,
the mean wall time of the epochs this process ran (training, validation and saving) × the epochs left.

    from yolov9c.engine.progress import bar, EpochClock
    for batch in bar(loader, desc=HEADER): ...
    clock = EpochClock(epochs=100); clock.start(); ...; log(clock.lap(epoch, train_seconds))

Test: python -m pytest -q tests/engine/test_progress.py
"""

import time

from tqdm import tqdm

BAR_FORMAT = "{l_bar}{bar:10}{r_bar}"


def bar(iterable, *, desc=None, total=None, leave=True):
    """A tqdm bar over `iterable` in the project's layout (desc: the column header or values in front)."""
    return tqdm(iterable, desc=desc, total=total, bar_format=BAR_FORMAT, leave=leave)


def duration(seconds):
    """Seconds → a short human figure: '4.2 s', '54 s', '7.5 min', '42 min', '1.5 h'."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class EpochClock:
    """Wall time of each epoch (from start() or the previous lap to lap()) and the run's time left.
    epochs: the run's --epochs; now: the clock (time.time; tests pass their own)."""

    def __init__(self, epochs, now=time.time):
        self.epochs, self.now, self.seconds, self.t = epochs, now, [], None

    def start(self):
        self.t = self.now()

    def lap(self, epoch, train_seconds, last=False):
        """Close epoch `epoch` (0-based, as the Epoch column) whose training pass took train_seconds; returns its
        line: how long it took (training / the rest: validation, checkpoints) and, unless it was the last (or
        `last`: the run stops early), the time left for the epochs after it at the mean epoch time so far."""
        now = self.now()
        took, self.t = now - self.t, now
        self.seconds.append(took)
        line = (f"epoch {epoch}/{self.epochs - 1} took {duration(took)} ({duration(train_seconds)} training, "
                f"{duration(max(took - train_seconds, 0.0))} validation and saving)")
        left = 0 if last else self.epochs - epoch - 1
        if left > 0:
            line += f"; about {duration(self.left_seconds(epoch))} left for {left} epoch{'s' * (left > 1)}"
        return line

    def left_seconds(self, epoch):
        """Estimated seconds for the epochs after `epoch`: the mean of the laps so far × the epochs left."""
        return sum(self.seconds) / len(self.seconds) * (self.epochs - epoch - 1)
