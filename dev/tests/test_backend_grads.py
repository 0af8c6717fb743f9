"""dev/fidelity/backend_grads.py on the CPU: on real COCO batches (tests/assets/coco24), the c backend's gradients
(model and loss) are as close to the float64 reference as the torch backend's — no parameter kind, and no single
tensor, far off — and the tool's JSON summary carries every way and kind."""

import json
import sys
from pathlib import Path

from repo_assets import COCO24

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "dev" / "fidelity"))
import backend_grads  # noqa: E402

WAYS = ("float32 torch", "model torch, loss torch", "model torch, loss c", "model c, loss torch", "model c, loss c")


def test_c_gradients_as_close_to_float64_as_torch(tmp_path, capsys):
    out = tmp_path / "grads.jsonl"
    assert backend_grads.main(["--data", str(COCO24 / "data.yaml"), "--cfg", "yolov9-t", "--img", "96",
                               "--batch", "2", "--batches", "2", "--warm-steps", "1", "--device", "cpu",
                               "--top", "40", "--json", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    kinds = {r["kind"]: r for r in rows}
    assert {"conv weight", "bn weight", "bn bias", "all"} <= set(kinds)
    for k, r in kinds.items():
        assert set(r["err"]) == set(r["bias"]) == set(r["norm"]) == set(WAYS) and r["tensors"] > 0
        torch_err, c_err = r["err"]["model torch, loss torch"], r["err"]["model c, loss c"]
        assert 0 < torch_err < 1e-2, (k, torch_err)  # float32 rounding, amplified by train-mode BatchNorm
        assert c_err <= 2 * torch_err + 1e-6, (k, c_err, torch_err)
        assert r["bias"]["model c, loss c"] <= 2 * r["bias"]["model torch, loss torch"] + 1e-6, (k, r["bias"])
    # the table of the tensors where c's error most exceeds torch's: none by more than 10x, up to float32
    # rounding (5e-5: a ratio alone is noise where torch's error happens to be 1e-6, e.g. a head bias summed
    # over every anchor, and it varies with the thread count)
    table = capsys.readouterr().out.split("err(c, c) / err(torch, torch):")[1]
    errs = [(float(line.split("|")[2]), float(line.split("|")[3])) for line in table.splitlines()
            if line.startswith("| model.")]
    assert len(errs) == 40 and all(ec <= 10 * et + 5e-5 for et, ec in errs), errs[:3]


def test_trained_weights_replace_the_warm_steps(tmp_path, capsys):
    """--weights starts every way from a checkpoint (late training) instead of --cfg and --warm-steps, and a
    checkpoint of another class count is refused before anything runs."""
    import pytest
    import torch

    from yolov9c.api import build_model
    from yolov9c.models.checkpoint import save_checkpoint
    torch.manual_seed(1)
    m = build_model("yolov9-t", nc=80)
    with torch.no_grad():  # trained-looking: BatchNorm scales away from 1
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.weight.uniform_(0.2, 2.0)
    w = save_checkpoint(tmp_path / "last.pt", m, half=False)
    out = tmp_path / "g.jsonl"
    args = ["--data", str(COCO24 / "data.yaml"), "--img", "96", "--batch", "2", "--batches", "1",
            "--device", "cpu", "--json", str(out)]
    assert backend_grads.main(args + ["--weights", str(w)]) == 0
    text = capsys.readouterr().out
    assert f"weights: {w}" in text
    rows = {r["kind"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["all"]["tensors"] > 0 and rows["all"]["err"]["model c, loss c"] < 1e-2
    w2 = save_checkpoint(tmp_path / "nc3.pt", build_model("yolov9-t", nc=3), half=False)
    with pytest.raises(SystemExit, match="3 classes"):
        backend_grads.main(args + ["--weights", str(w2)])


def test_assign_compares_the_two_losses_assignments(tmp_path):
    """--assign: on identical float32 maps (CPU) the c loss assigns what the torch loss assigns — the same
    foreground (Jaccard 1), no anchor on another box, soft scores equal to rounding — for both models and both
    branches; the float32 cast of float32 maps changes nothing."""
    out = tmp_path / "assign.jsonl"
    assert backend_grads.main(["--data", str(COCO24 / "data.yaml"), "--cfg", "yolov9-t", "--img", "96",
                               "--batch", "2", "--batches", "1", "--warm-steps", "1", "--device", "cpu", "--assign",
                               "--json", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert {(r["model"], r["branch"], tuple(r["pair"])) for r in rows} == {
        (m, b, p) for m in ("torch", "c") for b in ("aux", "main") for p in (("c", "torch"), ("torch fp32", "torch"))}
    for r in rows:
        assert r["fg_a"] == r["fg_b"] > 0 and r["jaccard"] == 1.0 and r["other_box"] == 0.0, r
        assert r["norm_rel"] < 1e-5 and abs(r["tss_rel"]) < 1e-5, r
