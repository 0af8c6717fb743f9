"""Bundled configs: found from the package in a checkout/editable install and inside a regular (non-editable)
wheel install; load_hyp errors name the file. The hyp keys: HYP_RANGES is their one list (every other list derives
from it, and no other module of the package spells one out), and what each part requires is missing-key checked.

Run: python -m pytest -q tests/package/test_resources.py
"""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import yolov9c.data.hyp as data_hyp
import yolov9c.data.mosaic as mosaic
import yolov9c.engine.train.state as train_state
from yolov9c.resources import (AUGMENT_KEYS, CONFIGS_DIR, DEFAULT_HYP, HYP_KEYS, HYP_RANGES, MODEL_CONFIG_DIR,
                               TRAIN_KEYS, WARP_KEYS, hyp_keys, load_hyp)

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "yolov9c"
# hyp key lists allowed outside resources.py ("file:name"), each with why
KEY_LISTS = {"engine/train/evolve.py:META": "the search's own gain and bounds per key; its keys are checked against "
                                            "HYP_KEYS in tests/engine/train/test_evolve.py"}


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


def test_sdist_carries_what_the_build_needs(tmp_path):
    """The sdist (MANIFEST.in) holds every C source and header, every CUDA kernel and every bundled config, and
    build_py run inside the unpacked sdist writes yolov9c/configs/ (a sdist without configs/ does not build);
    no tests/ or build/ files. setup.py sdist and build_py only: no compile, a few seconds."""
    import tarfile

    env = {**os.environ, "YOLOV9C_CUDA": "0"}
    r = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path), "sdist",
                        "--dist-dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (sdist,) = tmp_path.glob("yolov9c-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        tar.extractall(tmp_path / "src", filter="data")
    wanted = {p.relative_to(REPO).as_posix() for d, exts in (("csrc", ".c .h"), ("kernels", ".cu .cuh .h"),
                                                              ("configs", ".yaml"), ("yolov9c", ".py"))
              for p in (REPO / d).rglob("*") if p.suffix in exts.split()}
    assert {"kernels/nms.cu", "kernels/common.cuh", "configs/hyps/hyp.scratch-high.yaml"} <= wanted
    assert not wanted - names, f"missing from the sdist: {sorted(wanted - names)}"
    assert not [n for n in names if n.startswith(("tests/", "build/"))]
    (src,) = (tmp_path / "src").iterdir()
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path / "lib")], cwd=src,
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "lib" / "yolov9c" / "configs" / "models" / "detect" / "yolov9-s.yaml").is_file()

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


def test_every_hyp_key_list_derives_from_hyp_ranges():
    """The groups are HYP_RANGES' keys by reader, in its order; the lists the data pipeline, load_mosaic and a
    run's set-up require are those groups; the bundled file holds every key but two."""
    keys = list(HYP_RANGES)
    assert len(keys) == 30 and HYP_KEYS == (*keys, "anchors")
    for group in (TRAIN_KEYS, AUGMENT_KEYS, WARP_KEYS):
        assert group and list(group) == [k for k in keys if k in group]  # a subset, in the table's order
    assert TRAIN_KEYS == ("lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "warmup_momentum",
                          "warmup_bias_lr")
    assert WARP_KEYS == ("degrees", "translate", "scale", "shear", "perspective")
    assert set(WARP_KEYS) < set(AUGMENT_KEYS) and not set(TRAIN_KEYS) & set(AUGMENT_KEYS)
    assert set(hyp_keys("train", "augment", "warp", "loss", "unread")) == set(keys)  # every key has a reader
    assert data_hyp.AUGMENT_KEYS is AUGMENT_KEYS and train_state.TRAIN_KEYS is TRAIN_KEYS
    assert mosaic.HYP_KEYS == (*WARP_KEYS, "copy_paste") and set(mosaic.HYP_KEYS) <= set(AUGMENT_KEYS)
    # label_smoothing comes from --label-smoothing; anchors is commented out, as published
    assert set(load_hyp()) == set(HYP_KEYS) - {"label_smoothing", "anchors"}


def test_the_data_pipeline_requires_its_keys_only():
    """augment_hyp names each AUGMENT_KEYS key a hyp lacks, and needs no other key (a run's set-up requires
    TRAIN_KEYS: tests/cli/test_cli_errors.py -k hyp)."""
    full = load_hyp()
    for key in AUGMENT_KEYS:
        with pytest.raises(KeyError) as e:
            data_hyp.augment_hyp({k: v for k, v in full.items() if k != key})
        assert e.value.args[0] == f"hyp lacks augmentation keys: {key}"
    only = {k: full[k] for k in AUGMENT_KEYS}
    assert data_hyp.augment_hyp(only) == only


def _key_lists(path):
    """[(line, assigned name or "", keys)] of the tuple, list, set and dict (its keys) literals in `path` that
    spell two or more hyp keys (HYP_KEYS) and nothing else."""
    tree = ast.parse(path.read_text())
    names = {id(n.value): n.targets[0].id for n in ast.walk(tree)
             if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)}
    out = []
    for node in ast.walk(tree):
        items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(
            node, (ast.Tuple, ast.List, ast.Set)) else None
        if not items:
            continue
        texts = [x.value if isinstance(x, ast.Constant) and isinstance(x.value, str) else None for x in items]
        if len(texts) >= 2 and all(t in HYP_KEYS for t in texts):
            out.append((node.lineno, names.get(id(node), ""), texts))
    return sorted(out)


def hyp_key_lists(root=PKG, allowed=KEY_LISTS):
    """["file:line name: keys"] for every hyp key list spelt out in a module under `root` but resources.py,
    unless `allowed` names it ("file:name")."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "resources.py":
            continue
        out += [f"{rel}:{line} {name}: {keys}" for line, name, keys in _key_lists(path)
                if f"{rel}:{name}" not in allowed]
    return out


def test_no_other_module_spells_a_hyp_key_list():
    bad = hyp_key_lists()
    assert not bad, "hyp key lists outside resources.py (derive them from HYP_RANGES):\n" + "\n".join(bad)
    for entry in KEY_LISTS:  # each allowed list still exists
        file, name = entry.split(":")
        assert any(n == name for _, n, _ in _key_lists(PKG / file)), entry


def test_the_key_list_check_finds_a_spelt_out_list(tmp_path):
    """A module with the training keys spelt out, a set of two augmentation keys and a dict keyed by hyp keys is
    reported; an option table that mixes hyp keys with other names, and resources.py itself, are not."""
    (tmp_path / "resources.py").write_text('HYP = ("lr0", "lrf")\n')
    (tmp_path / "mine.py").write_text(
        f"KEYS = {TRAIN_KEYS!r}\n"
        "def f(hyp):\n    return {'mosaic', 'mixup'} <= set(hyp)\n"
        "BOUNDS = {'lr0': 1, 'lrf': 2}\n"
        "CHECKS = {'mosaic': 1, 'mixup': 2, 'epochs': 3}\n")
    bad = hyp_key_lists(tmp_path, allowed={})
    assert [b.split(":")[:2] for b in bad] == [["mine.py", "1 KEYS"], ["mine.py", "3 "], ["mine.py", "4 BOUNDS"]], bad
