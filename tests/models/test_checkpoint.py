"""Checkpoints and model summaries: yolov9c/models/{checkpoint,ckpt_data,atomic_io,published,weights}.py and
yolov9c/models/info.py.

- our format: plain data (torch.load weights_only=True), atomic writes (a write that fails midway leaves the old
  file and no temp file), round trips of model/EMA/optimizer;
- published YOLOv9 .pt files: built here in the published layout (a throw-away `models` package whose classes
  carry the published module names, pickled with torch.save, then removed from sys.path/sys.modules) and read
  back through the restricted unpickler: every tensor and the model outputs must match, fp16 and fp32,
  yolov9-t and gelan-t;
- hostile pickles (os.system, builtins.eval, subprocess.Popen, unknown models.foo.Bar, a non-class name in
  models.common) are refused and never run (a marker file they would write must not exist);
- GFLOPs/parameters/layers against figures printed by the published code.

Run: python -m pytest -q tests/models/test_checkpoint.py
"""

import argparse
import collections
import copy
import datetime
import importlib
import math
import os
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from inprocess import call
from yolov9c.cli.main import main as cli_main
from yolov9c.models import atomic_io, published, weights
from yolov9c.models import checkpoint as ck
from yolov9c.models.common import Conv
from yolov9c.models.info import count_flops, count_ops, layer_table, model_summary
from yolov9c.models.model import DetectionModel

# ---------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------

_MODELS = {}


def fresh_model(cfg, nc=None, seed=0):
    """A DetectionModel with random weights and BN statistics (every tensor distinct, so swaps show)."""
    key = (cfg, nc)
    if key not in _MODELS:  # building runs a stride probe; build once per config and copy
        _MODELS[key] = DetectionModel(cfg, nc=nc)
    m = copy.deepcopy(_MODELS[key])
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k, v in m.state_dict().items():
            if not v.is_floating_point() or ".dfl" in k:
                continue
            r = torch.rand(v.shape, generator=g)
            v.copy_(0.5 + r if k.endswith("running_var") else (r - 0.5) * 0.2)
    return m


def assert_same(got, expect, via=None):
    """Same keys, and every tensor of `got` equals `expect`'s (after a round trip through dtype `via` for
    floating tensors: the rounding a fp16 file applies)."""
    assert list(got) == list(expect)
    for k, v in expect.items():
        if via is not None and v.is_floating_point():
            v = v.to(via).to(v.dtype)
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def eval_output(model, x):
    """Main-head eval output (B, 4+nc, A) for DDetect and DualDDetect models."""
    model.eval()
    with torch.no_grad():
        y = model(x)[0]
    return y[1] if isinstance(y, (list, tuple)) else y


PUBLISHED_COMMON = ("Conv", "AConv", "ADown", "ELAN1", "RepNCSPELAN4", "RepNCSP", "RepNBottleneck", "RepConvN",
                    "SPPELAN", "SP", "CBLinear", "CBFuse", "Silence", "Concat", "DFL")
PUBLISHED_YOLO = ("DDetect", "DualDDetect", "DetectionModel")


class PublishedLayout:
    """A throw-away `models` package whose classes have the published names and modules (models.common.Conv,
    models.yolo.DetectionModel, ...) and subclass ours. `save()` pickles one of our models as the published
    code would (every module's class swapped to its published-named twin) and leaves nothing imported."""

    def __init__(self, root):
        self.root = root
        pkg = root / "models"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text("")
        common = ["import yolov9c.models.common as _c", "import yolov9c.models.head as _h", ""]
        for name in PUBLISHED_COMMON:
            base = "_h" if name == "DFL" else "_c"
            common.append(f"class {name}({base}.{name}):\n    pass\n")
        (pkg / "common.py").write_text("\n".join(common))
        yolo = ["import yolov9c.models.head as _h", "import yolov9c.models.model as _m", ""]
        for name in PUBLISHED_YOLO:
            base = "_m" if name == "DetectionModel" else "_h"
            yolo.append(f"class {name}({base}.{name}):\n    pass\n")
        (pkg / "yolo.py").write_text("\n".join(yolo))

    def _imported(self):
        sys.path.insert(0, str(self.root))
        return importlib.import_module("models.common"), importlib.import_module("models.yolo")

    def _forget(self):
        sys.path.remove(str(self.root))
        for name in [n for n in sys.modules if n == "models" or n.startswith("models.")]:
            del sys.modules[name]

    def save(self, path, model, *, ema=None, half=True, extra=None, bare=False):
        """torch.save a published-layout checkpoint dict of `model` (and `ema`) to `path`; bare: the model
        object alone."""
        common, yolo = self._imported()
        try:
            twins = {name: getattr(common, name) for name in PUBLISHED_COMMON}
            twins.update({name: getattr(yolo, name) for name in PUBLISHED_YOLO})

            def published(m):
                if m is None:
                    return None
                m = copy.deepcopy(m)
                for sub in m.modules():
                    twin = twins.get(type(sub).__name__)
                    if twin is not None and type(sub).__module__.startswith("yolov9c."):
                        sub.__class__ = twin
                return m.half() if half else m

            ckpt = {"epoch": -1, "best_fitness": None, "model": published(model), "ema": published(ema),
                    "updates": None if ema is None else 1234, "optimizer": None,
                    "opt": {"weights": "", "cfg": "models/detect/x.yaml", "batch_size": 16, "imgsz": 640},
                    "git": None, "date": datetime.datetime.now().isoformat()}
            ckpt.update(extra or {})
            assert type(ckpt["model"]).__module__ == "models.yolo"  # really the published class path
            torch.save(ckpt["model"] if bare else ckpt, path)
        finally:
            self._forget()
        assert "models" not in sys.modules


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    return PublishedLayout(tmp_path_factory.mktemp("published"))


# ---------------------------------------------------------------------------------------------------------
# our format
# ---------------------------------------------------------------------------------------------------------

def test_our_checkpoint_is_plain_data_and_round_trips(tmp_path):
    model = fresh_model("gelan-t", seed=1)
    ema = fresh_model("gelan-t", seed=2)
    model.hyp = {"lr0": 0.01, "momentum": 0.937}
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    model.train()
    model(torch.rand(1, 3, 64, 64))[0].sum().backward()
    opt.step()
    args = argparse.Namespace(weights="", save_dir=tmp_path / "runs", freeze=[0], device="")
    path = ck.save_checkpoint(tmp_path / "last.pt", model, ema=ema, optimizer=opt, epoch=7, opt=args,
                              best_fitness=np.array([0.25]), updates=321, half=False)

    raw = torch.load(path, weights_only=True)  # plain data only
    assert raw["format"] == "yolov9c" and raw["version"] == ck.VERSION
    assert raw["epoch"] == 7 and raw["updates"] == 321 and raw["best_fitness"] == [0.25]
    assert raw["opt"]["save_dir"] == str(tmp_path / "runs") and raw["opt"]["freeze"] == [0]
    assert raw["hyp"] == {"lr0": 0.01, "momentum": 0.937}
    assert raw["nc"] == 80 and raw["names"] == model.names and raw["stride"] == [8.0, 16.0, 32.0]
    assert raw["yaml"]["nc"] == 80 and raw["yaml"]["head"][-1][2] == "DDetect"
    assert list(raw["model"]) == list(model.state_dict())
    assert_same(raw["model"], model.state_dict())
    assert_same(raw["ema"], ema.state_dict())

    # optimizer state resumes in a fresh optimizer
    opt2 = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.1)
    opt2.load_state_dict(raw["optimizer"])
    assert opt2.param_groups[0]["lr"] == 0.01 and opt2.param_groups[0]["nesterov"]
    p0 = next(iter(model.parameters()))
    assert torch.equal(opt2.state[p0]["momentum_buffer"], opt.state[p0]["momentum_buffer"])

    # load_model prefers the EMA, returns float32 in eval mode, restores names and hyp
    loaded = weights.load_model(path)
    assert not loaded.training and next(loaded.parameters()).dtype == torch.float32
    assert loaded.hyp == model.hyp and loaded.names == model.names
    assert_same(loaded.state_dict(), ema.state_dict())
    x = torch.rand(1, 3, 64, 64)
    assert torch.equal(eval_output(loaded, x), eval_output(ema, x))
    assert_same(weights.load_model(path, prefer_ema=False).state_dict(), model.state_dict())


def test_half_checkpoint_stores_fp16_and_loads_rounded(tmp_path):
    model = fresh_model("gelan-t", seed=3)
    path = ck.save_checkpoint(tmp_path / "a.pt", model)  # default: fp16 like the published files
    raw = torch.load(path, weights_only=True)
    w = "model.0.conv.weight"
    assert raw["model"][w].dtype == torch.float16
    assert raw["model"]["model.0.bn.num_batches_tracked"].dtype == torch.int64
    assert_same(weights.load_model(path).state_dict(), model.state_dict(), via=torch.float16)


def test_atomic_save_keeps_old_file_when_the_write_fails(tmp_path, monkeypatch):
    model = fresh_model("gelan-t", seed=4)
    path = tmp_path / "last.pt"
    ck.save_checkpoint(path, model, epoch=1)
    before = path.read_bytes()
    real_save = torch.save

    def partial_then_fail(obj, f, *a, **k):
        import io
        buf = io.BytesIO()
        real_save(obj, buf)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])  # half a file reaches the disk...
        raise OSError(28, "No space left on device")  # ...then the write dies

    monkeypatch.setattr(torch, "save", partial_then_fail)
    with pytest.raises(OSError, match="No space left"):
        ck.save_checkpoint(path, fresh_model("gelan-t", seed=5), epoch=2)

    def interrupted(obj, f, *a, **k):
        f.write(b"PK\x03\x04 torso")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ck.save_checkpoint(path, model, epoch=3)
    monkeypatch.setattr(torch, "save", real_save)

    assert path.read_bytes() == before  # the old checkpoint is intact...
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # ...and no temp file is left
    assert torch.load(path, weights_only=True)["epoch"] == 1
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # like a plain open(), not mkstemp's 0600


def test_full_disk_is_one_line_and_atomic_copy_without_hard_links(tmp_path, monkeypatch):
    """atomic_write / atomic_copy: ENOSPC becomes DiskFullError (file, size, free; old file kept); without hard
    links atomic_copy writes a real copy, and replacing the source later leaves the copy alone."""
    import errno
    src, dst = tmp_path / "last.pt", tmp_path / "best.pt"
    atomic_io.atomic_write(src, b"epoch 1" * 1000)
    atomic_io.atomic_write(dst, b"old best")
    monkeypatch.setattr(os, "link", lambda a, b: (_ for _ in ()).throw(OSError(errno.EPERM, "no hard links")))
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(atomic_io.DiskFullError) as e:
        atomic_io.atomic_copy(src, dst, what="best.pt of epoch 1")
    assert str(e.value).startswith(f"No space left on device writing {dst} (best.pt of epoch 1): about "
                                   f"0.0 MB did not fit") and "the previous best.pt is intact" in str(e.value)
    assert e.value.needed == 7000 and e.value.errno == errno.ENOSPC and isinstance(e.value, OSError)
    assert dst.read_bytes() == b"old best" and sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]
    monkeypatch.setattr(os, "fsync", real_fsync)
    atomic_io.atomic_copy(src, dst)
    atomic_io.atomic_write(src, b"epoch 2")
    assert dst.read_bytes() == b"epoch 1" * 1000 and os.stat(src).st_ino != os.stat(dst).st_ino
    assert atomic_io.is_temp_name(".last.pt.k2j4x9_a.tmp") and not atomic_io.is_temp_name("last.pt")


def test_save_refuses_non_plain_data_and_writes_nothing(tmp_path):
    model = fresh_model("gelan-t")
    with pytest.raises(TypeError, match=r"opt\['callback'\]"):
        ck.save_checkpoint(tmp_path / "x.pt", model, opt={"callback": lambda: None})
    assert list(tmp_path.iterdir()) == []


def test_strip_checkpoint_keeps_ema_as_fp16_model(tmp_path):
    model, ema = fresh_model("gelan-t", seed=6), fresh_model("gelan-t", seed=7)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = ck.save_checkpoint(tmp_path / "best.pt", model, ema=ema, optimizer=opt, epoch=9, half=False,
                              best_fitness=0.5)
    ck.strip_checkpoint(path)
    raw = torch.load(path, weights_only=True)
    assert raw["ema"] is None and raw["optimizer"] is None and raw["best_fitness"] is None
    assert raw["epoch"] == -1 and raw["updates"] is None
    for k, v in ema.state_dict().items():
        expect = v.half() if v.is_floating_point() else v
        assert torch.equal(raw["model"][k], expect), k


def test_fp16_strip_never_turns_a_finite_value_into_inf(tmp_path):
    """A diverging run's EMA BatchNorm variance of 81177 is finite in float32 but beyond fp16 (65504): the strip
    (and save_checkpoint(half=True)) keep that tensor in float32, exact, and cast the others to fp16; the file
    loads finite. Before: inf in the stripped best.pt."""
    model, ema = fresh_model("gelan-t", seed=6), fresh_model("gelan-t", seed=7)
    big = "model.1.bn.running_var"
    with torch.no_grad():
        ema.state_dict()[big].view(-1)[0] = 81177.0
        model.state_dict()[big].view(-1)[0] = -1e6
    path = ck.save_checkpoint(tmp_path / "best.pt", model, ema=ema, epoch=3, half=False)
    ck.strip_checkpoint(path)
    sd = torch.load(path, weights_only=True)["model"]
    assert sd[big].dtype == torch.float32 and float(sd[big].view(-1)[0]) == 81177.0
    assert all(v.dtype == torch.float16 for k, v in sd.items() if v.is_floating_point() and k != big)
    assert all(torch.isfinite(v).all() for v in sd.values() if v.is_floating_point())
    assert float(weights.load_model(path).state_dict()[big].view(-1)[0]) == 81177.0
    half = torch.load(ck.save_checkpoint(tmp_path / "h.pt", model, ema=ema, half=True), weights_only=True)
    assert float(half["model"][big].view(-1)[0]) == -1e6 and float(half["ema"][big].view(-1)[0]) == 81177.0
    assert half["model"]["model.0.conv.weight"].dtype == torch.float16


def test_loaders_warn_in_one_line_about_non_finite_tensors(tmp_path, caplog):
    """A checkpoint whose weights hold NaN/inf loads (it may be inspected) but every loader says so in one WARNING
    line naming the tensors: read_checkpoint / load_model (val, detect, export, --weights) and `info`."""
    model = fresh_model("gelan-t", seed=3)
    with torch.no_grad():
        model.state_dict()["model.1.bn.running_var"].view(-1)[2] = math.nan
        model.state_dict()["model.0.conv.weight"].view(-1)[0] = math.inf
    path = ck.save_checkpoint(tmp_path / "bad.pt", model, half=False)
    good = ck.save_checkpoint(tmp_path / "good.pt", fresh_model("gelan-t", seed=4), half=False)
    with caplog.at_level("WARNING", logger="yolov9c"):
        weights.load_model(good)
        assert not [r for r in caplog.records if r.levelname == "WARNING"]
        weights.load_model(path)
    (rec,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "2 tensors hold inf/NaN (model.0.conv.weight, model.1.bn.running_var)" in rec.getMessage()
    assert "\n" not in rec.getMessage()
    r = subprocess.run([sys.executable, "-m", "yolov9c", "info", "--weights", str(path)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = [s for s in (r.stdout + r.stderr).splitlines() if "inf/NaN" in s]
    assert len(lines) == 1 and "model.1.bn.running_var" in lines[0] and str(path) in lines[0], r.stderr


def test_transfer_weights_intersects_by_name_and_shape(tmp_path, caplog):
    src = fresh_model("gelan-t", nc=3, seed=8)
    # nc = 20: the final class convs differ in shape; the class branch width max(64, min(2·nc, 128)) does not
    dst = DetectionModel("gelan-t", nc=20)
    msd = dst.state_dict()
    differ = {k for k, v in src.state_dict().items() if v.shape != msd[k].shape}
    assert differ == {f"model.22.cv3.{i}.2.{p}" for i in range(3) for p in ("weight", "bias")}
    with caplog.at_level("INFO", logger="yolov9c"):
        n, total = weights.transfer_weights(dst, src.state_dict(), source="src.pt")
    assert (n, total) == (len(msd) - 6, len(msd))
    assert f"Transferred {len(msd) - 6}/{len(msd)} items from src.pt" in caplog.text
    dsd = dst.state_dict()
    for k, v in src.state_dict().items():
        if k not in differ:
            assert torch.equal(dsd[k], v), k
    # strict loading names the mismatch instead of half-loading a model
    path = ck.save_checkpoint(tmp_path / "s.pt", src, half=False)
    with pytest.raises(ck.CheckpointError, match="shape differs"):
        weights.load_model(path, cfg="gelan-s")


def test_bare_state_dict_needs_cfg(tmp_path):
    model = fresh_model("gelan-t", seed=9)
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    with pytest.raises(ck.CheckpointError, match="no model yaml"):
        weights.load_model(tmp_path / "sd.pt")
    assert_same(weights.load_model(tmp_path / "sd.pt", cfg="gelan-t").state_dict(), model.state_dict())


def test_missing_and_garbage_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        ck.read_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "junk.pt").write_bytes(b"this is not a checkpoint")
    with pytest.raises(ck.CheckpointError):
        ck.read_checkpoint(tmp_path / "junk.pt")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(ck.CheckpointError, match="neither"):
        ck.read_checkpoint(tmp_path / "list.pt")


def test_a_truncated_checkpoint_is_named_in_our_words(tmp_path):
    """A checkpoint cut short (an interrupted copy or download): one line naming the file and what to do, not
    torch's "PytorchStreamReader failed ... internal miniz error" paragraph."""
    whole = tmp_path / "last.pt"
    torch.save({"format": "yolov9c", "version": 1, "model": {"w": torch.arange(20000.0)}}, whole)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ck.CheckpointError) as e:
        ck.read_checkpoint(cut)
    msg = str(e.value)
    assert msg.startswith(f"{cut}: incomplete or damaged checkpoint") and "\n" not in msg, msg
    assert "miniz" not in msg and "copy it again" in msg, msg


def test_text_and_torchscript_files_are_named_in_our_words(tmp_path, capsys):
    # torch says "KeyError: 101" for a text file, and for a TorchScript archive advises weights_only=False,
    # which would run the file's code: our message says what the file is and what to give instead
    (tmp_path / "notes.pt").write_text("epochs: 40\nmAP 0.31\n")
    with pytest.raises(ck.CheckpointError, match=r"notes.pt: not a torch checkpoint: the file is text \('epochs: 40"):
        ck.read_checkpoint(tmp_path / "notes.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ck.CheckpointError, match="the file is empty"):
        ck.read_checkpoint(tmp_path / "empty.pt")
    torch.jit.script(nn.Linear(2, 2)).save(str(tmp_path / "ts.pt"))
    with pytest.raises(ck.CheckpointError, match=r"a TorchScript archive \(torch.jit.save\)") as e:
        ck.read_checkpoint(tmp_path / "ts.pt")
    assert "weights_only" not in str(e.value) and "\n" not in str(e.value)
    assert cli_main(["info", "--weights", str(tmp_path / "notes.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m yolov9c info: error: ") and "KeyError" not in err[0]


# ---------------------------------------------------------------------------------------------------------
# published files
# ---------------------------------------------------------------------------------------------------------

# each model kind (dual and single head) and each file dtype once: the dtype handling does not depend on the
# head (the other published-file tests below read fp16 files of both kinds)
@pytest.mark.parametrize("cfg, half", [("yolov9-t", True), ("gelan-t", False)], ids=["fp16-yolov9-t", "fp32-gelan-t"])
def test_published_checkpoint_loads_exactly(layout, tmp_path, cfg, half):
    model, ema = fresh_model(cfg, nc=5, seed=10), fresh_model(cfg, nc=5, seed=11)
    model.names = ema.names = ["person", "car", "dog", "cat", "bus"]
    path = tmp_path / f"{cfg}.pt"
    layout.save(path, model, ema=ema, half=half,
                extra={"best_fitness": np.array([0.4321])})  # an unstripped last.pt holds a numpy array

    ckpt = ck.read_checkpoint(path)
    assert ckpt["source"] == "published" and ckpt["updates"] == 1234 and ckpt["nc"] == 5
    assert ckpt["names"] == model.names and ckpt["stride"] == [8.0, 16.0, 32.0]
    assert ckpt["opt"]["batch_size"] == 16
    assert type(ckpt["best_fitness"]) is float and ckpt["best_fitness"] == 0.4321  # a number, as in ours (resume)
    dtype = torch.float16 if half else torch.float32
    for k, v in ema.state_dict().items():
        stored = ckpt["ema"][k]
        assert stored.dtype == (dtype if v.is_floating_point() else v.dtype), k
        assert torch.equal(stored, v.to(stored.dtype)), k

    loaded = weights.load_model(path)
    assert type(loaded) is DetectionModel and type(loaded.model[-1]).__module__ == "yolov9c.models.head"
    assert not loaded.training and loaded.nc == 5 and loaded.names == model.names
    reference = copy.deepcopy(ema)
    with torch.no_grad():
        for k, v in reference.state_dict().items():
            if v.is_floating_point():
                v.copy_(v.to(dtype).float())  # the rounding the file applied
    assert_same(loaded.state_dict(), reference.state_dict())
    x = torch.rand(1, 3, 64, 64)
    assert torch.equal(eval_output(loaded, x), eval_output(reference, x))
    assert_same(weights.load_model(path, prefer_ema=False).state_dict(), model.state_dict(), via=dtype)


def test_stripped_published_checkpoint(layout, tmp_path):
    """strip_optimizer output: model = EMA (fp16), ema None, epoch -1."""
    ema = fresh_model("gelan-t", seed=12)
    layout.save(tmp_path / "best.pt", ema, ema=None)
    assert_same(weights.load_model(tmp_path / "best.pt").state_dict(), ema.state_dict(), via=torch.float16)


def test_published_whole_model_file(layout, tmp_path):
    """torch.save(model) without the checkpoint dict (a common user habit) loads too."""
    model = fresh_model("gelan-t", seed=16)
    layout.save(tmp_path / "dict.pt", model)
    whole = torch.load(tmp_path / "dict.pt", map_location="cpu", pickle_module=published.restricted_pickle,
                       weights_only=False)["model"]  # our classes now; save it bare in the published layout
    layout.save(tmp_path / "bare.pt", whole, half=True, bare=True)
    assert_same(weights.load_model(tmp_path / "bare.pt").state_dict(), model.state_dict(), via=torch.float16)


def test_published_checkpoint_with_trained_head_state(layout, tmp_path):
    """After an eval forward the published head carries anchors/strides tensors and a torch.Size shape."""
    model = fresh_model("gelan-t", seed=13)
    eval_output(model, torch.rand(1, 3, 64, 64))
    head = model.model[-1]
    head.shape, head.anchors = torch.Size([1, 144, 8, 8]), torch.zeros(2, 84)
    layout.save(tmp_path / "h.pt", model, ema=None)
    assert_same(weights.load_model(tmp_path / "h.pt").state_dict(), model.state_dict(), via=torch.float16)


def test_convert_published_file_via_cli(layout, tmp_path):
    """python -m yolov9c convert on a published-layout yolov9-t.pt (fp16, EMA) → gelan-t in our format."""
    model, ema = fresh_model("yolov9-t", seed=14), fresh_model("yolov9-t", seed=15)
    layout.save(tmp_path / "yolov9-t.pt", model, ema=ema)
    out = tmp_path / "yolov9-t-converted.pt"
    # `python -m yolov9c convert ...` in this process (tests/inprocess.py; tests/cli/test_cli.py starts it for real)
    r = call(cli_main, ["convert", "--weights", str(tmp_path / "yolov9-t.pt"), "--cfg", "gelan-t", "--out", str(out)])
    assert r.returncode == 0, r.stderr
    assert "published checkpoint" in r.stdout and "EMA weights" in r.stdout
    gelan = weights.load_model(out)
    reference = copy.deepcopy(ema).half().float()  # the file's fp16 rounding
    x = torch.rand(1, 3, 64, 64)
    torch.testing.assert_close(eval_output(gelan, x), eval_output(reference, x), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# hostile files: refused, never run
# ---------------------------------------------------------------------------------------------------------

HOSTILE = {"os.system": "system", "eval": "builtins.eval", "subprocess.Popen": "subprocess.Popen"}


class _Evil:
    """Unpickles as a call of `target` that creates `marker` (pickled as that call: the class is never named)."""

    def __init__(self, target, marker):
        self.target, self.marker = target, str(marker)

    def __reduce__(self):
        if self.target == "os.system":
            return (os.system, ("touch " + self.marker,))
        if self.target == "eval":
            return (eval, ("open(" + repr(self.marker) + ", 'w').close()",))
        return (subprocess.Popen, (["touch", self.marker],))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """{(target, legacy): path} of torch.save files whose 'model' entry, when unpickled, calls `target` so as to
    create the marker file."""
    root = tmp_path_factory.mktemp("hostile")
    marker = root / "PWNED"
    files = {}
    for target in HOSTILE:
        for legacy in (False, True):
            files[(target, legacy)] = path = root / f"{target}{'_legacy' if legacy else ''}.pt"
            torch.save({"model": _Evil(target, marker), "epoch": -1}, path, _use_new_zipfile_serialization=not legacy)
    assert not marker.exists()
    return files, marker


@pytest.mark.parametrize("target", list(HOSTILE))
@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_hostile_pickle_is_refused_and_not_run(hostile, target, legacy):
    files, marker = hostile
    path = files[(target, legacy)]
    with pytest.raises(ck.UnsafeCheckpointError, match=HOSTILE[target]) as e:
        weights.load_model(path)
    assert "not a known YOLOv9 checkpoint" in str(e.value)
    assert not marker.exists()
    # the raw restricted loader refuses too, not only the weights-only first attempt
    with pytest.raises(ck.UnsafeCheckpointError):
        torch.load(path, map_location="cpu", pickle_module=published.restricted_pickle, weights_only=False)
    assert not marker.exists()


def test_cli_refuses_hostile_file(hostile, tmp_path):
    files, marker = hostile
    # `python -m yolov9c info` in this process (tests/inprocess.py; tests/cli/test_cli.py starts it for real): an
    # exception escaping main() fails the test, as a traceback would
    r = call(cli_main, ["info", "--weights", str(files[("os.system", False)])])
    assert r.returncode == 2 and "not a known YOLOv9 checkpoint" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists()


def test_plain_pickle_file_is_refused(tmp_path):
    marker = tmp_path / "PWNED"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (tmp_path / "p.pt").write_bytes(pickle.dumps(Evil(), protocol=2))
    with pytest.raises(ck.UnsafeCheckpointError):
        ck.read_checkpoint(tmp_path / "p.pt")
    assert not marker.exists()


def test_unknown_published_names_are_refused(tmp_path):
    """models.foo.Bar (unknown module) and models.common.autopad (a name we define, but not a model class)."""
    root = tmp_path / "pkg"
    (root / "models").mkdir(parents=True)
    marker = tmp_path / "PWNED"
    (root / "models" / "__init__.py").write_text("")
    (root / "models" / "foo.py").write_text("import torch.nn as nn\nclass Bar(nn.Module):\n    pass\n")
    (root / "models" / "common.py").write_text(f"def autopad(*a):\n    open({str(marker)!r}, 'w').close()\n")
    bar, autopad = tmp_path / "bar.pt", tmp_path / "autopad.pt"
    sys.path.insert(0, str(root))  # pickled by reference: importable while saving, forgotten after
    try:
        foo, common = importlib.import_module("models.foo"), importlib.import_module("models.common")

        class CallAutopad:
            def __reduce__(self):
                return (common.autopad, (3,))
        torch.save({"model": foo.Bar()}, bar)
        torch.save({"model": CallAutopad()}, autopad)
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == "models" or n.startswith("models.")]:
            del sys.modules[name]
    with pytest.raises(ck.UnsafeCheckpointError, match=r"models\.foo\.Bar"):
        ck.read_checkpoint(bar)
    with pytest.raises(ck.UnsafeCheckpointError, match=r"models\.common\.autopad.*not a model class"):
        ck.read_checkpoint(autopad)
    assert not marker.exists()


def test_restricted_unpickler_allows_exactly_the_checkpoint_vocabulary():
    u = published.RestrictedUnpickler(__import__("io").BytesIO(b""))
    assert u.find_class("models.common", "RepNCSPELAN4").__module__ == "yolov9c.models.common"
    assert u.find_class("models.yolo", "DualDDetect").__module__ == "yolov9c.models.head"
    assert u.find_class("models.common", "DFL").__module__ == "yolov9c.models.head"
    assert u.find_class("__builtin__", "set") is set
    assert u.find_class("collections", "OrderedDict") is collections.OrderedDict
    assert u.find_class("torch.nn.modules.conv", "Conv2d") is nn.Conv2d
    for module, name in [("builtins", "getattr"), ("builtins", "__import__"), ("torch", "load"),
                         ("models.common", "torch"), ("models.common", "nn"), ("yolov9c.models.common", "Conv"),
                         ("torch.nn.modules.module", "Module"), ("posix", "system"), ("models.yolo", "yaml")]:
        with pytest.raises(ck.UnsafeCheckpointError):
            u.find_class(module, name)


# ---------------------------------------------------------------------------------------------------------
# model summary: GFLOPs, parameters, layers
# ---------------------------------------------------------------------------------------------------------

def test_flops_of_one_conv_by_hand():
    m = nn.Sequential(Conv(3, 16, 3, 2))
    macs, other = count_ops(m, torch.zeros(1, 3, 64, 64))
    assert macs == 16 * 32 * 32 * (3 * 3 * 3)  # output elements × (c_in·k·k)
    assert other == 4 * 16 * 32 * 32  # BatchNorm: 4 ops per element (normalise 2, affine ×2)
    assert count_flops(m, 64, probe=64, published=False) == pytest.approx(2 * macs / 1e9)
    g = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=4, bias=True), nn.Upsample(None, 2, "nearest"))
    macs, other = count_ops(g, torch.zeros(1, 8, 10, 10))
    assert macs == 8 * 10 * 10 * (2 * 3 * 3) and other == 8 * 20 * 20  # bias not counted; upsample 1/elt


def test_flops_probe_scaling_equals_direct_count():
    m = DetectionModel("gelan-t", nc=7)
    direct = count_flops(m, 256, probe=256)
    assert count_flops(m, 256) == pytest.approx(direct, rel=1e-12)
    assert count_flops(m, (256, 128)) == pytest.approx(direct / 2, rel=1e-12)
    assert m.training  # counting leaves the mode alone


@pytest.mark.parametrize("cfg,nc,fuse,line", [
    # the published code's own printouts (issues #505, #175) and README FLOPs of the converted models
    ("gelan-s", 80, True, "gelan-s summary: 489 layers, 7105888 parameters, {g} gradients, 26.4 GFLOPs"),
    ("gelan-c", 80, True, "gelan-c summary: 387 layers, 25288768 parameters, {g} gradients, 102.1 GFLOPs"),
    ("yolov9-c", 3, False, "yolov9-c summary: 962 layers, 51004210 parameters, 51004178 gradients, 238.9 GFLOPs"),
])
def test_summary_matches_published_printouts(cfg, nc, fuse, line):
    m = DetectionModel(cfg, nc=nc)
    if fuse:
        m.fuse()
    g = sum(p.numel() for p in m.parameters() if p.requires_grad)  # fused gradients: see report
    assert model_summary(m, 640) == line.format(g=g)


def test_layer_table_rows():
    m = DetectionModel("yolov9-s")
    lines = layer_table(m).splitlines()
    assert lines[0].split() == ["from", "n", "params", "module", "arguments"]
    assert len(lines) == 1 + len(m.model)
    # the published layout, including its overflow of long `from` lists into the index column
    assert re.match(r" 29\[28, 25, 22, 15, 18, 21\]  1   3003776  DualDDetect +\[", lines[-1])  # spec §2.1
    assert re.match(r"  0 +-1  1       928  Conv +\[", lines[1])
    # the published arguments column: the arguments the layer was built with (spec §2.1 rows resolved)
    assert lines[1].split("Conv", 1)[1].strip() == "[3, 32, 3, 2]"          # c1 first
    assert lines[3].rstrip().endswith("ELAN1                                   [64, 64, 64, 32]")
    upsample = next(x for x in lines if "nn.Upsample" in x)
    assert upsample.rstrip().endswith("[None, 2, 'nearest']")
    assert lines[-1].rstrip().endswith("DualDDetect                             [80, [128, 192, 256, 128, 192, 256]]")
    assert all(getattr(layer, "args", None) is not None for layer in m.model)
