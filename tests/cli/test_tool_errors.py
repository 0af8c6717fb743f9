"""`python -m yolov9c memory / info / convert / export` as a user meets them: each bad input is one `error:` line
naming what is wrong (and what to type instead), and the memory report says nothing it cannot stand behind.
Cases from a walkthrough of the tools; each one failed before its fix. Through main(argv) in this process.

Run: python -m pytest -q tests/cli/test_tool_errors.py
"""

import re

from yolov9c.cli.main import main


def test_memory_bad_batch_names_only_the_flag_given_wrong(capsys):
    """Before: `--batch 0` said '--batch and --val-batch must be ≥ 1 and --img ≥ 32, got 0, None and 640'."""
    assert main(["memory", "--cfg", "yolov9-s.yaml", "--batch", "0"]) == 2
    assert capsys.readouterr().err == "python -m yolov9c memory: error: --batch must be ≥ 1, got 0\n"
    assert main(["memory", "--cfg", "yolov9-s.yaml", "--img", "31", "--val-batch", "0"]) == 2
    assert capsys.readouterr().err == ("python -m yolov9c memory: error: --val-batch must be ≥ 1, got 0; "
                                       "--img must be ≥ 32, got 31\n")


def test_memory_phases_of_a_backend_that_does_not_fit_are_not_printed(capsys):
    """Before: with a budget below one image's step the phase line was still printed at batch 1, reading as a
    plan (`torch train 0.53/0.58, ... validation 0.26/0.10 ...; whole run 0.58 reserved` under 0.10 GiB)."""
    assert main(["memory", "--cfg", "yolov9-s.yaml", "--budget", "0.1G"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^torch +does not fit: even one image of 640² is predicted to need 0\.\d\d GiB$", out, re.M)
    assert re.search(r"^torch +not predicted: the training step does not fit the budget \(above\)$", out, re.M), out
    assert not re.search(r"^(c|torch) +train ", out, re.M), out
    # a budget the step fits still gets its phases
    assert main(["memory", "--cfg", "yolov9-s.yaml", "--budget", "7.5G"]) == 0
    assert re.search(r"^torch +train 6\.21/6\.77, ", capsys.readouterr().out, re.M)


def test_published_yolov9_cf_is_named_unsupported_not_missing(capsys):
    """Before: `--cfg yolov9-cf.yaml` (a published config) said "model config 'yolov9-cf.yaml' not found"."""
    says = ("model config 'yolov9-cf.yaml' is a published config that yolov9c does not support: TripleDDetect "
            "head; yolov9-c.yaml is its dual-head form (docs/api.md, Models)")
    assert main(["info", "--cfg", "yolov9-cf.yaml"]) == 2
    assert capsys.readouterr().err == f"python -m yolov9c info: error: {says}\n"
    assert main(["memory", "--cfg", "yolov9-cf.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert main(["info", "--cfg", "yolov9-nope.yaml"]) == 2  # an unknown name still lists the known ones
    assert "not found: not a file and not one of gelan-c" in capsys.readouterr().err


def test_info_weights_folder_or_published_name_says_so(tmp_path, capsys):
    """Before: `info --weights FOLDER` said 'checkpoint not found: FOLDER', and `info --weights yolov9-c.pt` (the
    documented example) did not say where the file comes from; export and convert already did both."""
    (tmp_path / "best.pt").write_bytes(b"")
    assert main(["info", "--weights", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"python -m yolov9c info: error: --weights {tmp_path}: a folder, not a "
                                       f"checkpoint file: give a .pt file, e.g. {tmp_path / 'best.pt'}\n")
    assert main(["info", "--weights", str(tmp_path / "yolov9-c.pt")]) == 2
    assert "download it from https://github.com/WongKinYiu/yolov9/releases" in capsys.readouterr().err


def test_convert_says_nothing_to_convert_and_which_gelan_fits(tmp_path, capsys):
    """Before: a gelan checkpoint gave 'cannot re-parameterise ...: reparameterize: the source model's head is
    DDetect, not DualDDetect', and yolov9-t into gelan-s 'target row 0 ([-1, 1, Conv, [32, 3, 2]]) does not
    match source row 0 (...)'; now each says what to do. No output file either way."""
    from yolov9c.models.checkpoint import save_checkpoint
    from yolov9c.models.model import DetectionModel

    gelan = save_checkpoint(tmp_path / "g.pt", DetectionModel("gelan-t", nc=2))
    yolo = save_checkpoint(tmp_path / "y.pt", DetectionModel("yolov9-t", nc=2))
    out = tmp_path / "out.pt"
    assert main(["convert", "--weights", str(gelan), "--cfg", "gelan-t.yaml", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"python -m yolov9c convert: error: {gelan} holds a gelan-t model (DDetect head, no auxiliary branch): "
        "nothing to convert; use it as it is (val.py, detect.py, export)")
    assert main(["convert", "--weights", str(yolo), "--cfg", "gelan-s.yaml", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m yolov9c convert: error: --cfg gelan-s.yaml does not match the checkpoint's yolov9-t: "
        "use gelan-t.yaml")
    assert not out.exists()


def test_export_opset_too_low_and_a_failed_export_are_one_line(tmp_path, capsys, monkeypatch):
    """Before: `--opset 5` printed torch's whole traced graph (about 1000 lines on stdout, 45 more in the error
    'line'); now it is refused up front, and any failed export's message is cut to torch's first line."""
    import pytest
    import torch

    from yolov9c.models import export as ex
    from yolov9c.models.model import DetectionModel

    pytest.importorskip("onnx")
    weights = tmp_path / "best.pt"
    weights.write_bytes(b"not read: the opset is checked first")
    assert main(["export", "--weights", str(weights), "--opset", "5"]) == 2
    assert capsys.readouterr().err == ("python -m yolov9c export: error: --opset 5: the model exports at opset 9 "
                                       "or later (default 17)\n")

    def fails(*a, **k):
        raise RuntimeError("Unsupported: ONNX export of operator X\nTorch IR graph:\n  %1 : Float(...)\n")
    monkeypatch.setattr(torch.onnx, "export", fails)
    with pytest.raises(ex.ExportError) as e:
        ex.export_onnx(DetectionModel("gelan-t", nc=1).eval(), tmp_path / "m.onnx", imgsz=(64, 64))
    assert str(e.value) == "ONNX export failed: Unsupported: ONNX export of operator X"
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]  # no .onnx, no temp file
