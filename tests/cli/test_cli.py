"""`python -m yolov9c` (yolov9c/cli/main.py): the info table once as a subprocess, the way users run it; every
other case through the same `main(argv)` in this process (what `python -m yolov9c` calls; an exception that
escapes fails the test, as a traceback would), which saves a Python start (~2-3 s of CPU) per case.

info: the layer table and the summary line for a config, a fused config and a checkpoint; convert: a yolov9-t
checkpoint becomes a gelan-t checkpoint whose outputs equal the yolov9-t main head's; bad input exits with
code 2, one `error:` line, no traceback and no output file. (Converting a published-layout .pt through the CLI
is tested in tests/models/test_checkpoint.py, next to the published-layout fixture.)

Run: python -m pytest -q tests/cli/test_cli.py
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inprocess import call
from yolov9c.cli.main import main
from yolov9c.models import checkpoint as ck
from yolov9c.models.weights import load_model
from yolov9c.models.model import DetectionModel

REPO = Path(__file__).resolve().parents[2]
from repo_assets import GOLDEN_DIR  # noqa: E402


def cli_process(*args):
    """Run `python -m yolov9c args...` as a subprocess; returns the CompletedProcess (text)."""
    return subprocess.run([sys.executable, "-m", "yolov9c", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=600)


def cli(*args):
    """`python -m yolov9c args...` in this process (tests/inprocess.py): exit code, stdout, stderr."""
    return call(main, [str(a) for a in args])


def assert_usage_error(r, *needles):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "error:" in r.stderr and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


def random_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if v.is_floating_point() and ".dfl" not in k:
                r = torch.rand(v.shape, generator=g)
                v.copy_(0.5 + r if k.endswith("running_var") else (r - 0.5) * 0.2)
    return model


def test_info_prints_table_and_published_parameter_count():
    r = cli_process("info", "--cfg", "gelan-t.yaml")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["from", "n", "params", "module", "arguments"]
    rows = lines[1:24]
    assert [int(x.split()[0]) for x in rows[:10]] == list(range(10)) and "DDetect" in rows[22]
    summary = next(x for x in lines if " summary: " in x)
    params = json.loads((GOLDEN_DIR / "summary.json").read_text())["gelan-t"]["params"]
    assert summary.startswith("gelan-t summary: ") and f" {params} parameters, {params - 16} gradients" in summary
    assert summary.endswith(" GFLOPs")


def test_info_fused_gives_the_published_inference_figures():
    r = cli("info", "--cfg", "gelan-s", "--fuse", "--imgsz", "640")
    assert r.returncode == 0, r.stderr
    # README / issue #505: converted yolov9-s = fused gelan-s, 7.1M parameters, 26.4 GFLOPs
    assert "gelan-s summary: 489 layers, 7105888 parameters," in r.stdout and "26.4 GFLOPs" in r.stdout


def test_info_nc_override_and_checkpoint(tmp_path):
    r = cli("info", "--cfg", "gelan-t", "--nc", "3", "--imgsz", "320")
    assert r.returncode == 0, r.stderr
    model = DetectionModel("gelan-t", nc=3)
    expect = sum(p.numel() for p in model.parameters())
    assert f" {expect} parameters" in r.stdout and "nc=3" in r.stdout

    random_weights(model, 1)
    ck.save_checkpoint(tmp_path / "g.pt", model)
    r = cli("info", "--weights", tmp_path / "g.pt")
    assert r.returncode == 0, r.stderr
    assert "gelan-t summary: " in r.stdout and f" {expect} parameters" in r.stdout


@pytest.mark.parametrize("args,needles", [
    (["info", "--cfg", "yolov9-nope"], ["yolov9-nope", "not found"]),
    (["info", "--cfg", "gelan-t", "--imgsz", "16"], ["--imgsz"]),
    (["info", "--cfg", "gelan-t", "--nc", "0"], ["--nc"]),
    (["info", "--weights", "missing.pt"], ["missing.pt"]),
    (["info"], []),
    ([], []),
])
def test_info_usage_errors(args, needles):
    assert_usage_error(cli(*args), *needles)


@pytest.fixture(scope="module")
def yolov9t_checkpoint(tmp_path_factory):
    """(path, model): an fp32 checkpoint of a yolov9-t (nc 4) with random weights, in our format."""
    model = random_weights(DetectionModel("yolov9-t", nc=4), 2)
    model.names = ["a", "b", "c", "d"]
    path = ck.save_checkpoint(tmp_path_factory.mktemp("yolov9t") / "yolov9-t.pt", model, half=False)
    return path, model


def test_convert_yolov9_to_gelan(yolov9t_checkpoint, tmp_path):
    src, model = yolov9t_checkpoint
    out = tmp_path / "sub" / "gelan.pt"
    r = cli("convert", "--weights", src, "--cfg", "gelan-t.yaml", "--out", out, "--fp32")
    assert r.returncode == 0, r.stderr
    assert "Saved" in r.stdout and "yolov9-t -> gelan-t" in r.stdout
    raw = torch.load(out, weights_only=True)  # our format, plain data
    assert raw["yaml"]["head"][-1][2] == "DDetect" and raw["nc"] == 4 and raw["names"] == ["a", "b", "c", "d"]
    assert raw["model"]["model.0.conv.weight"].dtype == torch.float32

    gelan = load_model(out)
    assert type(gelan.model[-1]).__name__ == "DDetect" and gelan.names == model.names
    # the main head of the training model and the converted model compute the same thing
    x = torch.rand(1, 3, 64, 64)
    model.eval()
    with torch.no_grad():
        main = model(x)[0][1]
        y = gelan(x)[0]
    torch.testing.assert_close(y, main, rtol=1e-6, atol=1e-6)
    n_gelan = sum(p.numel() for p in gelan.parameters())
    assert n_gelan < sum(p.numel() for p in model.parameters())
    assert f"-> {n_gelan} parameters" in r.stdout


def test_convert_default_is_fp16(yolov9t_checkpoint, tmp_path):
    src, model = yolov9t_checkpoint
    r = cli("convert", "--weights", src, "--cfg", "gelan-t", "--out", tmp_path / "g16.pt")
    assert r.returncode == 0, r.stderr
    raw = torch.load(tmp_path / "g16.pt", weights_only=True)
    assert raw["model"]["model.0.conv.weight"].dtype == torch.float16
    assert torch.equal(raw["model"]["model.0.conv.weight"], model.state_dict()["model.0.conv.weight"].half())


@pytest.mark.parametrize("case", ["missing", "unknown-cfg", "wrong-family", "not-yolov9", "garbage", "unwritable"])
def test_convert_bad_input_writes_nothing(yolov9t_checkpoint, gelan_mini, tmp_path, case):
    src, _ = yolov9t_checkpoint
    out = tmp_path / "out.pt"
    if case == "missing":
        r = cli("convert", "--weights", tmp_path / "none.pt", "--cfg", "gelan-t", "--out", out)
        assert_usage_error(r, "none.pt")
    elif case == "unknown-cfg":
        r = cli("convert", "--weights", src, "--cfg", "gelan-zz", "--out", out)
        assert_usage_error(r, "gelan-zz")
    elif case == "wrong-family":  # yolov9-t weights, gelan-s target: shapes differ
        r = cli("convert", "--weights", src, "--cfg", "gelan-s", "--out", out)
        assert_usage_error(r, "does not match the checkpoint's yolov9-t: use gelan-t.yaml")
    elif case == "not-yolov9":  # a gelan checkpoint (a small one: tests/conftest.py) has no auxiliary branch to drop
        gelan = tmp_path / "gelan.pt"
        ck.save_checkpoint(gelan, DetectionModel(gelan_mini))
        r = cli("convert", "--weights", gelan, "--cfg", "gelan-t", "--out", out)
        assert_usage_error(r, "no auxiliary branch): nothing to convert")
    elif case == "unwritable":  # --out under a file (as a read-only folder): one line, not the OSError traceback
        (tmp_path / "f").write_text("a file")
        out = tmp_path / "f" / "out.pt"
        r = cli("convert", "--weights", src, "--cfg", "gelan-t", "--out", out)
        assert_usage_error(r, f"cannot write {out}: ")
    else:
        bad = tmp_path / "bad.pt"
        bad.write_bytes(b"\x80\x02}q\x00garbage")
        r = cli("convert", "--weights", bad, "--cfg", "gelan-t", "--out", out)
        assert_usage_error(r, "bad.pt")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp files


def test_check_data_subcommand_scans_the_synthetic_default(tmp_path, monkeypatch):
    """`python -m yolov9c check-data` is wired into the package CLI; with no --data it scans the built-in
    synthetic dataset (generated into YOLOV9C_CACHE) and exits 0; a missing yaml exits 2.
    (`python -m yolov9c check-data` as a subprocess: tests/data/test_check.py.)"""
    monkeypatch.setenv("YOLOV9C_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    r = cli("check-data")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "train: 128 images, 0 backgrounds, 0 corrupt" in r.stdout + r.stderr
    assert (tmp_path / "cache" / "synthetic-v1-s0" / "data.yaml").is_file()
    r = cli("check-data", "--data", tmp_path / "nope.yaml")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "nope.yaml" in r.stdout + r.stderr
