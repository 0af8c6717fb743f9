"""detect_dual.py's command line (yolov9c/cli/detect.py): every published flag parses with the published
defaults, a run through the root script (a real subprocess) writes the run folder, and bad input (no weights,
missing weights file, missing source, webcam, refused flags, bad values) exits with code 2 and one clear `error:`
line.

Run: python -m pytest -q tests/cli/test_detect_cli.py
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inprocess import run_script
from yolov9c.cli.detect import build_parser, main

REPO = Path(__file__).resolve().parents[2]

PUBLISHED_FLAGS = [  # spec §8, with a value where the flag takes one
    "--weights w.pt", "--source s", "--data d.yaml", "--imgsz 320", "--img 320 256", "--img-size 320",
    "--conf-thres 0.3", "--iou-thres 0.5", "--max-det 10", "--device cpu", "--view-img", "--save-txt",
    "--save-conf", "--save-crop", "--nosave", "--classes 0 2", "--agnostic-nms", "--augment", "--visualize",
    "--update", "--project p", "--name n", "--exist-ok", "--line-thickness 2", "--hide-labels", "--hide-conf",
    "--half", "--dnn", "--vid-stride 2",
]


def test_every_published_flag_parses_and_defaults_match():
    p = build_parser()
    for flag in PUBLISHED_FLAGS:
        p.parse_args(flag.split())
    d = p.parse_args([])
    assert (d.imgsz, d.conf_thres, d.iou_thres, d.max_det, d.line_thickness, d.vid_stride) == \
        ([640], 0.25, 0.45, 1000, 3, 1)
    assert (d.project, d.name, d.device, d.classes) == ("runs/detect", "exp", "", None)
    assert p.parse_args(["--img", "320", "256"]).imgsz == [320, 256]


def test_every_detect_option_is_a_flag_with_the_same_default():
    """The CLI fills DetectConfig by field name: each field is a parser destination with the same default
    (weights, source and imgsz, which the CLI converts, aside), so no option is silently dropped."""
    import dataclasses

    from yolov9c.engine.detect.predictor import DetectConfig
    d = vars(build_parser().parse_args([]))
    for f in dataclasses.fields(DetectConfig):
        if f.name in ("weights", "source", "imgsz"):
            continue
        assert f.name in d, f"DetectConfig.{f.name} has no detect_dual.py flag"
        assert d[f.name] == f.default, f.name


@pytest.mark.parametrize("argv, words", [
    ([], "--weights is required"),
    (["--weights", "a.pt", "b.pt"], "one file expected"),
    (["--weights", "w.pt", "--view-img"], "needs a display"),
    (["--weights", "w.pt", "--dnn"], "PyTorch weights"),
    (["--weights", "w.pt", "--conf-thres", "1.5"], "--conf-thres must be in"),
    (["--weights", "w.pt", "--vid-stride", "0"], "--vid-stride must be"),
    (["--weights", "w.pt", "--img", "1", "2", "3"], "one or two"),
])
def test_usage_errors_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("extra, words", [
    (["--source", "/no/such/dir"], "no such file or folder"),
    (["--source", "0"], "webcam input is not supported"),
])
def test_input_errors_exit_2_and_write_nothing(gelan_t, tmp_path, extra, words, capsys):
    assert main(["--weights", str(gelan_t), "--project", str(tmp_path / "runs"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("detect_dual.py: error: ") and words in err
    assert not (tmp_path / "runs").exists()


def test_script_runs_and_reports_a_missing_weights_file(gelan_t, tmp_path):
    env = {**os.environ, "YOLOV9C_CACHE": str(tmp_path / "cache")}
    bad = run_script(REPO / "detect_dual.py", "--weights", tmp_path / "none.pt")  # in this process: no start
    assert bad.returncode == 2 and "file not found" in bad.stderr and "Traceback" not in bad.stderr
    # default --source: the built-in synthetic val images (32), generated into YOLOV9C_CACHE
    ok = subprocess.run([sys.executable, str(REPO / "detect_dual.py"), "--weights", str(gelan_t), "--img", "64",
                         "--conf-thres", "0.001", "--max-det", "2", "--save-txt", "--save-conf", "--nosave"],
                        check=False, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr
    run = tmp_path / "runs" / "detect" / "exp"
    assert len(list((run / "labels").glob("*.txt"))) == 32 and not list(run.glob("*.jpg"))
    assert "image 32/32 " in ok.stdout and "Speed: " in ok.stdout and "32 labels saved to" in ok.stdout


def test_unbuilt_extension_is_one_error_line_before_anything_is_written(gelan_t, tmp_path, monkeypatch, capsys):
    # a source checkout without `pip install -e .`: NMS needs yolov9c._C unless YOLOV9C_FUSED=0
    from yolov9c.ops import extension

    def unbuilt():
        raise ImportError("yolov9c._C (the C/CUDA extension) is not built. Build it ... YOLOV9C_FUSED=0 ...")

    monkeypatch.setattr(extension, "load", unbuilt)
    monkeypatch.delenv("YOLOV9C_FUSED", raising=False)
    assert main(["--weights", str(gelan_t), "--project", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("detect_dual.py: error: ")
    assert err.count("\n") == 1 and "not built" in err and "YOLOV9C_FUSED=0" in err
    assert not (tmp_path / "runs").exists()
    monkeypatch.setenv("YOLOV9C_FUSED", "0")  # the plain-torch reference ops need no extension
    from yolov9c.cli.weights_args import missing_extension

    assert missing_extension() is None
