"""detect_dual.py on sources holding files that cannot be read (yolov9c/engine/detect/predictor.py, sources.py,
yolov9c/cli/detect.py): an empty image, a garbage .jpg, a PNG cut in half and a broken .mp4 placed first,
between and last among good images. Each gives one `WARNING: … path: reason, skipped` line, the run goes on,
the good files' outputs (annotated images, label files, crops) are all written, a last line counts the
skipped files, and the exit code is 1 (0 when every file was read; 2 stays the usage/input error).

Run: python -m pytest -q tests/engine/detect/test_detect_bad_inputs.py
"""

import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from test_detect_predictor import FixedBoxes
from yolov9c.cli.detect import main
from yolov9c.engine.detect.predictor import DetectConfig, detect

REPO = Path(__file__).resolve().parents[3]

BAD = ("a_empty.jpg", "c_garbage.jpg", "e_half.png", "f_broken.mp4")
GOOD = ("b_good.png", "d_good.jpg", "g_good.png")


def _mixed_folder(d):
    """Sorted: a_empty.jpg (0 bytes), b_good.png, c_garbage.jpg, d_good.jpg, e_half.png (truncated),
    f_broken.mp4 (no movie atom), g_good.png — bad first, between, and after the last good one but one."""
    d.mkdir(parents=True)
    (d / "a_empty.jpg").write_bytes(b"")
    (d / "c_garbage.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg" * 20)
    ok, buf = cv2.imencode(".png", np.random.default_rng(0).integers(0, 255, (60, 80, 3), dtype=np.uint8))
    (d / "e_half.png").write_bytes(buf.tobytes()[:len(buf) // 2])
    (d / "f_broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(300))
    for name in GOOD:
        img = np.full((240, 320, 3), 60, np.uint8)
        img[:, :160] = (0, 0, 255)
        cv2.imwrite(str(d / name), img)
    return d


def _assert_good_outputs(save_dir):
    for name in GOOD:
        assert (save_dir / name).is_file(), name
        assert (save_dir / "labels" / f"{Path(name).stem}.txt").is_file(), name
    assert sorted(p.name for p in (save_dir / "labels").iterdir()) == sorted(f"{Path(n).stem}.txt" for n in GOOD)
    assert not any((save_dir / n).exists() for n in BAD) and not list(save_dir.glob("*.mp4"))


@pytest.mark.parametrize("kind", ["folder", "glob", "list"])
def test_bad_files_are_skipped_and_every_good_file_is_written(tmp_path, kind):
    d = _mixed_folder(tmp_path / "src")
    if kind == "folder":
        source = d
    elif kind == "glob":
        source = str(d / "*")
    else:  # a .txt list, a bad file on its first line
        source = tmp_path / "list.txt"
        source.write_text("\n".join(["src/a_empty.jpg", "src/b_good.png", "src/c_garbage.jpg", "src/d_good.jpg",
                                     "src/e_half.png", "src/f_broken.mp4", "src/g_good.png"]) + "\n")
    logs = []
    r = detect(DetectConfig(source=source, imgsz=160, project=tmp_path / "runs", save_txt=True, save_crop=True),
               model=FixedBoxes(), log=logs.append)
    assert r["frames"] == 3 and r["files"] == 7 and r["detections"] == 3 * 3
    assert [Path(p).name for p, _ in r["failed"]] == list(BAD)
    _assert_good_outputs(r["save_dir"])
    assert len(list((r["save_dir"] / "crops" / "one").glob("*.jpg"))) == 3
    # one line per file in source order: a detection line or a single warning naming path and reason
    per_file = [ln for ln in logs if ln.startswith(("image ", "WARNING: image ", "WARNING: video "))]
    assert len(per_file) == 7
    want = {"a_empty.jpg": "empty file", "c_garbage.jpg": "corrupt image (does not decode)",
            "e_half.png": "corrupt image (does not decode)", "f_broken.mp4": "cannot open video"}
    for k, name in enumerate(["a_empty.jpg", "b_good.png", "c_garbage.jpg", "d_good.jpg", "e_half.png",
                              "f_broken.mp4", "g_good.png"]):
        line = per_file[k]
        path = next(p for p in r["failed"] + [(str(d / n), "") for n in GOOD] if Path(p[0]).name == name)[0]
        if name in want:
            kind_word = "video" if name.endswith(".mp4") else "image"
            assert line.startswith(f"WARNING: {kind_word} {k + 1}/7 {path}: {want[name]}"), line
            assert line.endswith(", skipped")
        else:
            assert line.startswith(f"image {k + 1}/7 {path}: 128x160 "), line
    assert logs[-1] == "WARNING: 4 of 7 files could not be read and were skipped (the WARNING lines above say why)"


def test_cli_exit_code_1_when_files_were_skipped_0_when_none(gelan_t, tmp_path, capsys):
    d = _mixed_folder(tmp_path / "src")
    argv = ["--weights", str(gelan_t), "--img", "64", "--conf-thres", "0.001", "--max-det", "2", "--save-txt",
            "--project", str(tmp_path / "runs")]
    assert main(argv + ["--source", str(d)]) == 1
    out = capsys.readouterr().out
    assert out.count("WARNING: ") == 5 and "4 of 7 files could not be read" in out.splitlines()[-1]
    _assert_good_outputs(tmp_path / "runs" / "exp")
    for name in BAD:
        (d / name).unlink()
    assert main(argv + ["--source", str(d)]) == 0
    assert "WARNING" not in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "runs" / "exp2").glob("*.*g")) == sorted(GOOD)


def test_script_exit_code_and_one_line_per_bad_file_only(gelan_t, tmp_path):
    d = _mixed_folder(tmp_path / "src")
    r = subprocess.run([sys.executable, str(REPO / "detect_dual.py"), "--weights", str(gelan_t), "--source", str(d),
                        "--img", "64", "--nosave", "--save-txt", "--conf-thres", "0.001", "--max-det", "1"],
                       check=False, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={**os.environ, "YOLOV9C_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 1, r.stderr
    for name in BAD:
        assert sum(name in ln for ln in r.stdout.splitlines()) == 1, name
    # the native decoders' own complaints (libpng, FFmpeg 'moov atom not found') do not reach the console
    assert "moov" not in r.stderr and "grfmt" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(list((tmp_path / "runs" / "detect" / "exp" / "labels").glob("*.txt"))) == 3
