"""Bundled configs: found from the package in a checkout/editable install and inside a regular (non-editable)
wheel install; load_hyp errors name the file.

Run: python -m pytest -q tests/package/test_resources.py
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from yolov9c.resources import CONFIGS_DIR, DEFAULT_HYP, MODEL_CONFIG_DIR, load_hyp

REPO = Path(__file__).resolve().parents[2]


def test_bundled_configs_are_found():
    assert DEFAULT_HYP.is_file()
    names = {p.stem for p in MODEL_CONFIG_DIR.glob("*.yaml")}
    assert {f"{m}-{s}" for m in ("yolov9", "gelan") for s in "tsmce"} <= names
    assert load_hyp()["lr0"] == 0.01 and load_hyp()["mixup"] == 0.15
    assert CONFIGS_DIR.name == "configs"


def test_load_hyp_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_hyp(tmp_path / "nope.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="list.yaml"):
        load_hyp(bad)
    assert load_hyp({"lr0": 0.1}) == {"lr0": 0.1}


def test_hyp_file_numbers_keys_and_encoding(tmp_path):
    """YAML 1.2 floats are numbers (PyYAML leaves `1e-3` a string), a quoted one stays a string (an error); a key no
    one reads is one warning naming the key it resembles; a misspelling of a missing key and a file that is not
    UTF-8 are ValueErrors naming the file."""
    base = DEFAULT_HYP.read_text()
    f = tmp_path / "hyp.yaml"
    f.write_text(base.replace("lr0: 0.01", "lr0: 1e-3").replace("mixup: 0.15", "mixup: 15E-2"))
    hyp = load_hyp(f, log=pytest.fail)
    assert hyp["lr0"] == 0.001 and hyp["mixup"] == 0.15
    f.write_text(base.replace("lr0: 0.01", "lr0: '1e-3'"))
    with pytest.raises(ValueError, match="line 3: lr0: '1e-3' is not a number"):
        load_hyp(f)
    lines = []
    f.write_text(base + "weight_decy: 0.1\nmy_note: 3\n")
    assert load_hyp(f, log=lines.append)["weight_decay"] == 0.0005
    n = len(base.splitlines())
    assert lines == [f"WARNING: {f}: line {n + 1}: 'weight_decy' is not a hyperparameter training reads: ignored "
                     f"(did you mean 'weight_decay'? it is set on line 6)",
                     f"WARNING: {f}: line {n + 2}: 'my_note' is not a hyperparameter training reads: ignored"], lines
    f.write_text(base.replace("fliplr:", "flip-lr:"))
    with pytest.raises(ValueError, match=r"line 29: unknown key 'flip-lr': did you mean 'fliplr'\? \(the file has no "
                                         r"fliplr\)"):
        load_hyp(f)
    f.write_bytes(base.replace("lr0: 0.01", "lr0: 0.01  # \u00b5").encode("latin-1"))
    with pytest.raises(ValueError, match=re.escape(f"{f}: not a UTF-8 text file")):
        load_hyp(f)


def test_wheel_carries_the_configs(tmp_path):
    """setup.py's build_py copies configs/ into the package: a wheel built from this checkout holds
    yolov9c/configs/models/detect/yolov9-s.yaml and the hyp file, and none of tests/assets (CPU-only build to
    keep it quick)."""
    import zipfile

    env = {**os.environ, "YOLOV9C_CUDA": "0"}
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = tmp_path.glob("yolov9c-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "yolov9c/configs/models/detect/yolov9-s.yaml" in names
    assert "yolov9c/configs/hyps/hyp.scratch-high.yaml" in names
    assert any(n.startswith("yolov9c/_C") for n in names)
    assert not [n for n in names if "assets" in n or n.startswith("tests/")]  # the test data stays out


def test_published_paths_find_the_bundled_files(tmp_path, monkeypatch):
    """`--cfg models/detect/gelan-t.yaml` and `--hyp data/hyps/hyp.scratch-high.yaml` (the published forms)
    name the bundled files when no such file exists here; other missing paths stay errors."""
    from yolov9c.models.parse import resolve_config
    from yolov9c.resources import bundled_file, resolve_hyp

    monkeypatch.chdir(tmp_path)  # no models/ or data/ folder here
    for name in ("models/detect/gelan-t.yaml", "./models/detect/gelan-t.yaml", "gelan-t.yaml", "gelan-t"):
        assert bundled_file(name, "model") == MODEL_CONFIG_DIR / "gelan-t.yaml", name
        d, label, yaml_file = resolve_config(name)
        assert yaml_file == "gelan-t.yaml" and d["head"][-1][2] == "DDetect"
    for name in ("data/hyps/hyp.scratch-high.yaml", "hyp.scratch-high.yaml"):
        assert resolve_hyp(name) == DEFAULT_HYP
        assert load_hyp(name)["lr0"] == 0.01
    for name in ("mymodels/gelan-t.yaml", "models/gelan-t.yaml", "/models/detect/gelan-t.yaml",
                 "data/hyps/gelan-t.yaml", "models/detect/gelan-x.yaml"):
        assert bundled_file(name, "model") is None, name
        with pytest.raises(FileNotFoundError, match="gelan-t, gelan-m|not one of"):
            resolve_config(name)
    with pytest.raises(FileNotFoundError, match="hyp.scratch-high.yaml"):
        resolve_hyp("models/detect/hyp.scratch-high.yaml")
    # an existing file of the published path wins over the bundled one
    own = tmp_path / "models" / "detect"
    own.mkdir(parents=True)
    text = (MODEL_CONFIG_DIR / "gelan-t.yaml").read_text().replace("nc: 80", "nc: 7")
    (own / "gelan-t.yaml").write_text(text)
    assert resolve_config("models/detect/gelan-t.yaml")[0]["nc"] == 7
