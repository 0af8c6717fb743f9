"""val_dual.py as a script: validates a checkpoint file on a small synthetic dataset (exit 0, table printed,
runs/val/exp then exp2, labels with --save-txt, predictions.json with --save-json), and bad input errors
(exit 2, one error line, no traceback). The first validation starts val_dual.py as a real subprocess; the
other script runs are the same script in this process (tests/inprocess.py), which saves a Python start each.

Run: python -m pytest -q tests/cli/test_val_cli.py
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import yolov9c
from inprocess import run_script
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.models.checkpoint import save_checkpoint

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, gelan_mini):
    """(root, data, weights): the checkpoint is a gelan_mini (tests/conftest.py) of 8 classes, untrained: these
    tests check the script, not the model (a checkpoint read costs per tensor)."""
    root = tmp_path_factory.mktemp("valcli")
    data = synthetic_dataset(seed=5, root=root, n_train=2, n_val=4, imgsz=128)
    weights = root / "mini.pt"
    save_checkpoint(weights, yolov9c.build_model(gelan_mini, nc=8))
    return root, data, weights


def run(args, cwd):
    return subprocess.run([sys.executable, str(REPO / "val_dual.py"), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300, check=False)


def run_here(args, cwd, monkeypatch):
    """`python val_dual.py args` started in `cwd`, run in this process."""
    monkeypatch.chdir(cwd)
    return run_script(REPO / "val_dual.py", *args)


def test_val_dual_on_checkpoint(setup, monkeypatch):
    root, data, weights = setup
    args = ["--weights", str(weights), "--data", str(data), "--img", "64", "--batch", "4", "--device", "cpu",
            "--workers", "0", "--save-txt", "--save-json", "--verbose"]
    r = run(args, root)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "mAP50-95" in out and "Speed:" in out
    assert any(line.split()[:2] == ["all", "4"] for line in out.splitlines())
    exp = root / "runs" / "val" / "exp"
    assert exp.is_dir() and (exp / "labels").is_dir()
    assert isinstance(json.loads((exp / "mini_predictions.json").read_text()), list)
    assert (exp / "confusion_matrix.png").is_file()
    r2 = run_here(args[:10], root, monkeypatch)
    assert r2.returncode == 0, r2.stderr
    assert (root / "runs" / "val" / "exp2").is_dir()


@pytest.mark.parametrize("extra, needle", [
    (["--dnn"], "--dnn"),
    (["--conf-thres", "2"], "--conf-thres"),
    (["--task", "bogus"], "invalid choice"),
    (["--data", "nowhere.yaml"], "nowhere.yaml"),
    ([], "--weights is required"),
])
def test_val_dual_bad_input(setup, extra, needle, capsys):
    from yolov9c.cli.val import main

    _, _, weights = setup
    args = ([] if not extra else ["--weights", str(weights)]) + extra + ["--device", "cpu", "--img", "64"]
    try:
        code = main(args)
    except SystemExit as e:  # argparse errors
        code = e.code
    assert code == 2
    assert needle in capsys.readouterr().err


def test_val_dual_task_test_without_a_test_split(setup, tmp_path, capsys):
    # the synthetic yaml has no test: an error, not the val split's metrics under --task test
    from yolov9c.cli.val import main

    _, data, weights = setup
    code = main(["--weights", str(weights), "--data", str(data), "--task", "test", "--device", "cpu",
                 "--img", "64", "--project", str(tmp_path)])
    assert code == 2 and "has no 'test' split" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_val_dual_without_the_train_images(setup, tmp_path, capsys):
    # published: only val must exist (a COCO user downloads val2017 alone to validate)
    import yaml

    from yolov9c.cli.val import main

    _, data, weights = setup
    cfg = yaml.safe_load(open(data))
    cfg.update(path=str(data.parent), train="images/not_downloaded")
    y = tmp_path / "val_only.yaml"
    y.write_text(yaml.safe_dump(cfg))
    code = main(["--weights", str(weights), "--data", str(y), "--device", "cpu", "--img", "64", "--workers", "0",
                 "--project", str(tmp_path / "runs")])
    assert code == 0, capsys.readouterr().err


def test_val_dual_missing_weights_script(setup, monkeypatch):
    root, _, _ = setup
    r = run_here(["--weights", "missing.pt", "--device", "cpu"], root, monkeypatch)
    assert r.returncode == 2 and "missing.pt" in r.stderr and "not found" in r.stderr
    assert "Traceback" not in r.stderr


def test_val_dual_wrong_class_count(setup, gelan_mini, tmp_path, capsys):
    _, data, _ = setup
    weights = tmp_path / "nc3.pt"
    save_checkpoint(weights, yolov9c.build_model(gelan_mini, nc=3))
    from yolov9c.cli.val import main

    code = main(["--weights", str(weights), "--data", str(data), "--device", "cpu", "--img", "64",
                 "--project", str(tmp_path)])
    assert code == 2 and "3 classes" in capsys.readouterr().err


def test_val_dual_without_data_uses_the_checkpoints_dataset(setup, gelan_mini, tmp_path, monkeypatch):
    """No --data: the dataset recorded in the checkpoint (its training --data) is validated on, and said; a
    recorded yaml that is missing here is one clear error; a checkpoint recording none means synthetic."""
    from yolov9c.cli.val import data_from_checkpoint

    root, data, _ = setup
    weights = tmp_path / "trained.pt"
    model = yolov9c.build_model(gelan_mini, nc=8)
    save_checkpoint(weights, model, opt={"data": str(data), "epochs": 1})
    r = run_here(["--weights", str(weights), "--img", "64", "--batch", "4", "--device", "cpu", "--workers", "0"],
                 tmp_path, monkeypatch)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert f"data: {data} (recorded in {weights}" in out
    assert any(line.split()[:2] == ["all", "4"] for line in out.splitlines())

    gone = tmp_path / "moved.pt"
    save_checkpoint(gone, model, opt={"data": "data/elsewhere.yaml"})
    r = run_here(["--weights", str(gone), "--img", "64", "--device", "cpu"], tmp_path, monkeypatch)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "data/elsewhere.yaml" in r.stderr and "pass --data" in r.stderr

    said = []
    assert data_from_checkpoint({"opt": None}, "w.pt", said.append) is None and "synthetic" in said[0]
    assert data_from_checkpoint({"opt": {"data": "synthetic:3"}}, "w.pt", said.append) == "synthetic:3"


@pytest.mark.parametrize("task, batch_hw", [("speed", {(64, 64)}), ("val", {(96, 96)})])
def test_val_dual_task_speed_times_square_batches(setup, tmp_path, capsys, monkeypatch, task, batch_hw):
    # published: --task speed loads imgsz x imgsz batches (rect off, pad 0); rect with pad 0.5 gives 96. The
    # speed line names (batch, 3, imgsz, imgsz) either way, as published, not the shape of the last batch.
    from yolov9c.cli.val import main
    from yolov9c.engine.val import validator

    seen, validate = set(), validator.validate

    def spy(model, loader, **kw):
        seen.update(tuple(imgs.shape[2:]) for imgs, *_ in loader)
        return validate(model, loader, **kw)

    monkeypatch.setattr(validator, "validate", spy)
    _, data, weights = setup
    code = main(["--weights", str(weights), "--data", str(data), "--task", task, "--device", "cpu",
                 "--img", "64", "--batch", "4", "--workers", "0", "--project", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and seen == batch_hw
    assert "per image at shape (4, 3, 64, 64)" in out, out[-300:]


@pytest.mark.parametrize("extra, warned", [
    (["--conf-thres", "0.01"], ["WARNING: confidence threshold 0.01 > 0.001 produces invalid results"]),
    (["--save-hybrid"], ["WARNING: --save-hybrid will return high mAP from hybrid labels, not from predictions "
                         "alone"]),
    (["--conf-thres", "0.001"], []),
    (["--conf-thres", "0.25", "--task", "speed"], []),  # published: speed sets 0.25 itself, no warning
])
def test_val_dual_warns_of_meaningless_metrics_as_published(setup, tmp_path, capsys, extra, warned):
    from yolov9c.cli.val import main

    _, data, weights = setup
    code = main(["--weights", str(weights), "--data", str(data), "--device", "cpu", "--img", "64", "--batch", "4",
                 "--workers", "0", "--project", str(tmp_path), *extra])
    out = capsys.readouterr().out
    assert code == 0
    assert [line for line in out.splitlines() if line.startswith("WARNING") and "no labels" not in line] == warned


def test_val_dual_task_study_names_each_size_and_writes_one_row_per_size(setup, tmp_path, capsys):
    # published: "Running study_<data>_<weights>.txt --imgsz N..." before each of 256, 384, ..., 1536
    from yolov9c.cli.val import main

    _, data, weights = setup
    code = main(["--weights", str(weights), "--data", str(data), "--task", "study", "--device", "cpu",
                 "--batch", "4", "--workers", "0", "--project", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    f = tmp_path / "exp" / f"study_{data.stem}_{weights.stem}.txt"
    sizes = list(range(256, 1536 + 128, 128))
    assert [line for line in out.splitlines() if line.startswith("Running ")] == \
        [f"Running {f.name} --imgsz {n}..." for n in sizes]
    rows = [line.split() for line in f.read_text().splitlines()]
    assert [int(float(r[0])) for r in rows] == sizes and all(len(r) == 8 for r in rows)


def test_val_dual_data_without_usable_images_leaves_no_empty_run_folder(setup, tmp_path, capsys):
    from yolov9c.cli.val import main

    _, _, weights = setup
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(b"")  # an image that does not decode: no usable image
    data = tmp_path / "d.yaml"
    data.write_text(f"path: {tmp_path}\ntrain: images\nval: images\nnc: 8\nnames: {list('abcdefgh')}\n")
    project = tmp_path / "runs"
    args = ["--weights", str(weights), "--data", str(data), "--device", "cpu", "--img", "64", "--workers", "0",
            "--project", str(project)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert not any(project.iterdir())  # no empty runs/val/exp: the corrected run gets exp
    (project / "keep").mkdir()
    assert main(args + ["--name", "keep", "--exist-ok"]) == 2
    assert (project / "keep").is_dir()  # a folder that was there before is never removed


def test_val_dual_unbuilt_extension_is_one_error_line(setup, tmp_path, monkeypatch, capsys):
    from yolov9c.cli.val import main
    from yolov9c.ops import extension

    def unbuilt():
        raise ImportError("yolov9c._C (the C/CUDA extension) is not built. Build it ...")

    monkeypatch.setattr(extension, "load", unbuilt)
    monkeypatch.delenv("YOLOV9C_FUSED", raising=False)
    _, data, weights = setup
    code = main(["--weights", str(weights), "--data", str(data), "--device", "cpu", "--img", "64",
                 "--project", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("val_dual.py: error: ") and "not built" in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()
