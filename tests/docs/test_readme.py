"""The README's Python API example runs as written (with its two file names pointed at files made here and its
640 x 640 images shrunk to 320 x 320: a quarter of the work, the same calls and shapes but the anchor count), and
the README's set-up commands are the ones .ci/run executes.

Run: python -m pytest -q tests/docs/test_readme.py
"""

import re
import shutil
from pathlib import Path

import torch

import yolov9c
from yolov9c.models.checkpoint import save_checkpoint
from yolov9c.resources import MODEL_CONFIG_DIR

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_python_api_example_runs(tmp_path, monkeypatch):
    code = re.search(r"## Python API\n\n```python\n(.*?)```", README, re.S).group(1)
    assert code.count("torch.rand(2, 3, 640, 640)") == 1
    code = code.replace("torch.rand(2, 3, 640, 640)", "torch.rand(2, 3, 320, 320)")
    shutil.copy(MODEL_CONFIG_DIR / "yolov9-t.yaml", tmp_path / "my-model.yaml")
    ckpt = tmp_path / "runs/train/exp/weights/best.pt"
    ckpt.parent.mkdir(parents=True)
    save_checkpoint(ckpt, yolov9c.build_model("yolov9-s"))
    monkeypatch.chdir(tmp_path)
    ns = {}
    exec(compile(code, "README.md", "exec"), ns)
    items, y = ns["items"], ns["y"]
    assert items.shape == (3,) and torch.isfinite(items).all() and (items > 0).all()
    assert isinstance(y, list) and y[1].shape == (2, 84, 40 * 40 + 20 * 20 + 10 * 10)  # 8400 at 640


def test_ci_runs_the_readme_test_command():
    block = re.search(r"<!-- ci:test -->\n```bash\n(.*?)\n```\n<!-- /ci:test -->", README, re.S)
    assert block and "pytest" in block.group(1)
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert "ci:test" in ci
