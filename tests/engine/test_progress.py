"""Console progress (yolov9c/engine/progress.py): the training bar shows the batch rate and the epoch's time
left, every epoch ends with a line giving its measured time and the run's time left, and validation (during
training and in val_dual.py) shows a bar whose description is the table's header; progress=False is quiet.
Real runs on tiny synthetic data (gelan_mini of tests/conftest.py: the bars, not the model; 64 px, CPU), about a
second each.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/engine/test_progress.py
"""

import math
import re

import pytest

import yolov9c
from yolov9c.cli.train import parse_opt
from yolov9c.cli.val import main as val_main
from yolov9c.data.dataset import DatasetConfig
from yolov9c.data.dataset_yaml import load_data_config
from yolov9c.data.loader import LoaderConfig, create_dataloader
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.engine.progress import EpochClock, duration
from yolov9c.engine.train.trainer import train
from yolov9c.engine.val.validator import HEADER, ValConfig, validate
from yolov9c.models.checkpoint import save_checkpoint

# tqdm's right part after a batch: "n/total [mm:ss<mm:ss, 1.23it/s]" (or "s/it" when slower than 1 it/s)
RATE = r"(\d+)/(\d+) \[\d\d:\d\d<(\d\d:\d\d), +\d+(\.\d+)?(it/s|s/it)\]"
# the validation bar: the header, then the same right part; it is cleared at the end (the header line is
# logged instead), so a validation faster than tqdm's 0.1 s refresh shows only its first render "0/2 [00:00<?, ?it/s]"
VAL_BAR = re.escape(HEADER) + r": +\d+%\|.{10}\| (\d+)/(\d+) \[\d\d:\d\d<(\d\d:\d\d|\?), +(\d+(\.\d+)?|\?)(it/s|s/it)\]"
UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
LAP = re.compile(r"^epoch (\d+)/(\d+) took ([\d.]+) (s|min|h) \(([\d.]+) (s|min|h) training, ([\d.]+) (s|min|h) "
                 r"validation and saving\)(; about ([\d.]+) (s|min|h) left for (\d+) epochs?)?$")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synthetic_dataset(seed=4, root=tmp_path_factory.mktemp("syn"), n_train=4, n_val=2, imgsz=64)


def _seconds(value, unit):
    return float(value) * UNITS[unit]


def test_duration_figures():
    assert [duration(s) for s in (0.04, 4.24, 54.4, 450, 2520, 5400, 7 * 3600)] == [
        "0.0 s", "4.2 s", "54 s", "7.5 min", "42 min", "1.5 h", "7.0 h"]


def test_epoch_clock_time_left_is_the_mean_lap_times_epochs_left():
    ticks = iter([0.0, 50.0, 110.0, 5010.0])
    clock = EpochClock(100, now=lambda: next(ticks))
    clock.start()
    assert clock.lap(0, 40.0) == ("epoch 0/99 took 50 s (40 s training, 10 s validation and saving); "
                                  "about 82 min left for 99 epochs")  # 50 s x 99
    assert clock.left_seconds(0) == 50.0 * 99
    clock.lap(1, 55.0)
    assert clock.left_seconds(1) == 55.0 * 98  # mean of 50 and 60
    clock.epochs = 3  # the last epoch says only what it took
    assert clock.lap(2, 4000.0) == "epoch 2/2 took 82 min (67 min training, 15 min validation and saving)"


def test_training_bar_rate_and_time_left(data, gelan_mini, tmp_path, capsys):
    logs = []
    cfg = parse_opt(["--data", str(data), "--cfg", gelan_mini, "--img", "64", "--batch", "2", "--epochs", "2",
                     "--workers", "0", "--noplots", "--device", "cpu", "--project", str(tmp_path / "runs")])
    train(cfg, log=lambda *a, **k: logs.append(" ".join(map(str, a))))
    err = capsys.readouterr().err
    lines = "\n".join(logs).splitlines()
    # the training bar: the published columns (epoch 0/1 ...) then the batch rate and the epoch's time left
    renders = [r for r in re.split(r"[\r\n]", err) if r.strip().startswith("0/1 ") and re.search(RATE, r)]
    assert renders, err[-2000:]
    n, total, left = re.search(RATE, renders[-1]).group(1, 2, 3)
    assert (n, total, left) == ("2", "2", "00:00")  # the epoch's last render: all batches, nothing left
    # the validation bar during training: the table's header as its description, then the same right part
    assert re.search(VAL_BAR, err), err[-2000:]
    # one line per epoch after its validation table; epoch 0's says the run's time left, measured
    laps = [(i, LAP.match(line)) for i, line in enumerate(lines) if LAP.match(line)]
    assert [m.group(1, 2) for _, m in laps] == [("0", "1"), ("1", "1")], lines
    (i0, first), (_, last) = laps
    assert lines[i0 - 1].split()[0] == "all" and lines[i0 + 1].split()[0] == "Epoch"
    took, left = _seconds(*first.group(3, 4)), _seconds(*first.group(10, 11))
    assert first.group(12) == "1" and 0 < left < math.inf and left == took  # one lap: the mean is that lap
    assert _seconds(*first.group(5, 6)) <= took
    assert last.group(9) is None  # the last epoch has nothing left


def test_validation_bar_in_val_dual_and_quiet(data, gelan_mini, tmp_path, capsys):
    weights = tmp_path / "mini.pt"
    model = yolov9c.build_model(gelan_mini, nc=8)
    save_checkpoint(weights, model)
    code = val_main(["--weights", str(weights), "--data", str(data), "--img", "64", "--batch", "1", "--device",
                     "cpu", "--workers", "0", "--project", str(tmp_path / "val")])
    out, err = capsys.readouterr()
    assert code == 0
    bars = re.findall(VAL_BAR, err)
    assert bars and {b[1] for b in bars} == {"2"}, err[-2000:]  # two images, one per batch
    assert HEADER in out.splitlines()  # the table keeps its header line once the bar is cleared
    cfg = load_data_config(str(data))
    data = DatasetConfig(augment=False, rect=True, pad=0.5, prefix="val: ", nc=cfg["nc"])
    loader, _ = create_dataloader(cfg["val"], 64, 2, LoaderConfig(data, workers=0))
    validate(model, loader, nc=cfg["nc"], names=cfg["names"], cfg=ValConfig(progress=False), log=lambda *a: None)
    assert capsys.readouterr().err == ""
