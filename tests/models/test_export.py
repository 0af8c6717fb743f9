"""ONNX export (yolov9c/models/export.py, `python -m yolov9c export`): the file's output equals the torch
model's on real images, the auxiliary branch of a yolov9 model is not in the graph, a wrong file is caught,
and without onnx the error names the pip command.

The export cases need onnx and onnxruntime (the [test] and [export] extras) and skip without them; the
missing-dependency cases always run.
Run: python -m pytest -q tests/models/test_export.py
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import yolov9c
from yolov9c.cli.export import check_images
from yolov9c.cli.main import main
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.models import export as ex
from yolov9c.models.checkpoint import save_checkpoint

IMG = 64


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    return synthetic_dataset(seed=3, root=root, n_train=1, n_val=3, imgsz=96).parent / "images" / "val"


def _model(cfg, seed=0):
    torch.manual_seed(seed)
    return yolov9c.build_model(cfg, nc=3).eval().fuse()


def _cli(capsys, *args):
    """`python -m yolov9c export ARGS` in this process: (exit code, stdout, stderr)."""
    code = main(["export", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_missing_onnx_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)  # a None entry makes `import onnx` fail
    with pytest.raises(ex.ExportDependencyError, match=r'pip install "yolov9c\[export\]"'):
        ex.export_onnx(_model("gelan-t"), tmp_path / "m.onnx", imgsz=(IMG, IMG))
    assert not list(tmp_path.iterdir())


def test_cli_without_onnx_is_one_error_line(tmp_path, monkeypatch, capsys):
    weights = tmp_path / "w.pt"
    save_checkpoint(weights, yolov9c.build_model("gelan-t", nc=3))
    monkeypatch.setitem(sys.modules, "onnx", None)
    code, _, err = _cli(capsys, "--weights", weights, "--img", IMG, "--check", "0")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("python -m yolov9c export: error: onnx is not installed")
    assert 'pip install "yolov9c[export]"' in err
    assert not (tmp_path / "w.onnx").exists()


def test_export_matches_torch_and_drops_the_aux_branch(tmp_path, images_dir):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    images = check_images(str(images_dir), 3, (IMG, IMG))
    assert images.shape == (3, 3, IMG, IMG) and 0.0 <= float(images.min()) < float(images.max()) <= 1.0
    sizes = {}
    for cfg in ("gelan-t", "yolov9-t"):
        model = _model(cfg)
        path = ex.export_onnx(model, tmp_path / f"{cfg}.onnx", imgsz=(IMG, IMG), dynamic=True)
        report = ex.check_onnx(model, path, images)
        assert report["images"] == 3 and report["box_px"] < ex.BOX_ATOL_PX and report["score"] < ex.SCORE_ATOL, report
        graph = onnx.load(str(path))
        assert [i.name for i in graph.graph.input] == ["images"]
        assert [o.name for o in graph.graph.output] == ["output0"]
        meta = {p.key: p.value for p in graph.metadata_props}
        assert meta["stride"] == "32" and meta["names"].startswith("{0: ")
        sizes[cfg] = sum(int(np.prod(t.dims)) for t in graph.graph.initializer)
    # fused yolov9-t without its auxiliary branch is fused gelan-t: the same parameters in the graph
    assert sizes["yolov9-t"] == sizes["gelan-t"]
    assert sizes["yolov9-t"] < 0.8 * sum(p.numel() for p in _model("yolov9-t").parameters())


def test_check_images_skip_a_bad_file_and_name_it(tmp_path, images_dir, capsys):
    # a corrupt image in --source: skipped with a line naming it (detect's way), not the export refused by a
    # message without the file name
    import shutil

    src = tmp_path / "src"
    shutil.copytree(images_dir, src)
    (src / "000000_bad.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    images = check_images(str(src), 3, (IMG, IMG))
    assert images.shape == (3, 3, IMG, IMG)
    assert f"WARNING: --check: {src / '000000_bad.jpg'}: corrupt image" in capsys.readouterr().out
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    (only_bad / "a.jpg").write_bytes(b"")
    with pytest.raises(ValueError, match="no readable image files"):
        check_images(str(only_bad), 1, (IMG, IMG))


def test_cli_unwritable_target_is_one_error_line(tmp_path, capsys):
    # best.onnx cannot be written (here a folder of that name; a read-only weights folder alike): one line,
    # not the OSError traceback, and no temp file left
    pytest.importorskip("onnx")
    weights = tmp_path / "best.pt"
    save_checkpoint(weights, yolov9c.build_model("gelan-t", nc=3))
    (tmp_path / "best.onnx").mkdir()
    code, _, err = _cli(capsys, "--weights", weights, "--img", IMG, "--check", 0)
    assert code == 2 and f"error: cannot write {tmp_path / 'best.onnx'}: " in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.onnx", "best.pt"]


def test_check_catches_a_wrong_file(tmp_path, images_dir):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    images = check_images(str(images_dir), 2, (IMG, IMG))
    path = ex.export_onnx(_model("gelan-t", seed=0), tmp_path / "a.onnx", imgsz=(IMG, IMG))
    other = _model("gelan-t", seed=1)  # other weights: the file is not this model
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.1)
    with pytest.raises(ex.ExportError, match="differs from the torch model"):
        ex.check_onnx(other, path, images)


class _Shifted(torch.nn.Module):
    """`model`'s exported output with `box_px` added to every box coordinate and `score` to every class score:
    the size of difference float32 rounding leaves in a trained model (or a wrong one, when large)."""

    def __init__(self, model, box_px, score):
        super().__init__()
        self.model, self.box_px, self.score = model, box_px, score

    def forward(self, x):
        y = ex.MainHeadOutput(self.model)(x).clone()
        y[:, :4] += self.box_px
        y[:, 4:] += self.score
        return y


def test_check_tolerance_is_per_part(tmp_path, images_dir):
    # a trained gelan-t's file differed from torch by 0.021 px on boxes and 3.6e-5 on scores: rounding, which
    # the check accepts (one share of the output's scale refused it); pixels or tenths of a score it refuses
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    images = check_images(str(images_dir), 2, (IMG, IMG))
    model = _model("gelan-t")
    path = ex.export_onnx(model, tmp_path / "a.onnx", imgsz=(IMG, IMG))
    report = ex.check_onnx(_Shifted(model, 0.021, 3.6e-5), path, images)
    assert 0.02 < report["box_px"] < 0.022 and 3e-5 < report["score"] < 4e-5, report
    with pytest.raises(ex.ExportError, match=r"boxes by up to 0\.5.* px"):
        ex.check_onnx(_Shifted(model, 0.5, 0.0), path, images)
    with pytest.raises(ex.ExportError, match=r"class scores by up to 0\.002"):
        ex.check_onnx(_Shifted(model, 0.0, 2e-3), path, images)


def test_cli_failed_check_removes_the_file(tmp_path, images_dir, capsys, monkeypatch):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    weights = tmp_path / "best.pt"
    save_checkpoint(weights, yolov9c.build_model("gelan-t", nc=3))
    monkeypatch.setattr(ex, "SCORE_ATOL", -1.0)  # every file fails its check
    code, _, err = _cli(capsys, "--weights", weights, "--img", IMG, "--check", 1, "--source", images_dir)
    assert code == 2 and "differs from the torch model" in err and "removed" in err, err
    assert not (tmp_path / "best.onnx").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]


def test_cli_export_writes_and_checks(tmp_path, images_dir, capsys):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    weights = tmp_path / "best.pt"
    save_checkpoint(weights, yolov9c.build_model("yolov9-t", nc=3))
    code, out, err = _cli(capsys, "--weights", weights, "--format", "onnx", "--img", IMG, "--check", 2,
                          "--source", images_dir)
    assert code == 0, err
    onnx_file = tmp_path / "best.onnx"
    assert onnx_file.is_file() and f"exported {onnx_file}" in out
    umask = os.umask(0)
    os.umask(umask)
    assert onnx_file.stat().st_mode & 0o777 == 0o666 & ~umask  # a normal written file's mode, not mkstemp's 0600
    a = sum((IMG // s) ** 2 for s in (8, 16, 32))
    assert f"output0 (1, 7, {a})" in out and "checked on 2 image(s)" in out
    y = ort.InferenceSession(str(onnx_file)).run(None, {"images": np.zeros((1, 3, IMG, IMG), np.float32)})[0]
    assert y.shape == (1, 7, a)
    # a bad --source fails before anything is written; a missing file is one error line
    onnx_file.unlink()
    code, _, err = _cli(capsys, "--weights", weights, "--img", IMG, "--source", tmp_path / "nowhere")
    assert code == 2 and "nowhere" in err and not onnx_file.exists()
    code, _, err = _cli(capsys, "--weights", tmp_path / "missing.pt")
    assert code == 2 and "missing.pt: file not found" in err
    code, _, err = _cli(capsys, "--weights", weights, "--img", 50, "--check", 0)
    assert code == 2 and "multiple of the model stride 32" in err and not onnx_file.exists()
