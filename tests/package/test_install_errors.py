"""What `pip install` says when the machine lacks what the build needs: no C compiler is one `error:` line naming
the compiler it looked for and saying a C compiler is needed (not distutils' `[Errno 2] No such file or directory:
'gcc'` after a command line); no NumPy under --no-build-isolation names numpy>=2.0 and how to get it; pip < 21.3's
`pip install -e .` (setup.py develop) says to upgrade pip. setup.py run directly, nothing compiled: a second or two
each. After `pip install .`, a script run inside the clone imports the clone's unbuilt yolov9c/: the error says so.
A torch older than the declared minimum is refused by train_dual.py before training (about 5 s).

Run: python -m pytest -q tests/package/test_install_errors.py
"""

import importlib.machinery
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def setup_py(args, tmp_path, **env):
    return subprocess.run([sys.executable, "setup.py", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "YOLOV9C_CUDA": "0", **env}, timeout=120)


def test_no_c_compiler_is_one_clear_error(tmp_path):
    r = setup_py(["-q", "build_ext", "--force", "--build-temp", str(tmp_path / "t"), "--build-lib",
                  str(tmp_path / "l")], tmp_path, CC=str(tmp_path / "no-such-cc"))
    assert r.returncode != 0
    assert f"error: yolov9c: no C compiler: '{tmp_path / 'no-such-cc'}' (from $CC) was not found" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not list(tmp_path.rglob("*.so"))


def test_no_numpy_names_the_build_requirement(tmp_path):
    shim = tmp_path / "shim" / "numpy"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named numpy (test shim)')\n")
    r = setup_py(["--version"], tmp_path, PYTHONPATH=str(shim.parent))
    assert r.returncode != 0
    assert "yolov9c: building yolov9c._C needs NumPy's C headers (numpy>=2.0" in r.stderr, r.stderr
    assert "pip install 'numpy>=2.0'" in r.stderr


def test_old_pip_editable_says_upgrade_pip(tmp_path):
    """pip < 21.3 runs `setup.py develop` for `pip install -e .`; a pip that says 21.2.4 gets the upgrade line."""
    shim = tmp_path / "shim" / "pip"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("")
    (shim / "__main__.py").write_text("print('pip 21.2.4 from /old/pip (python 3.11)')\n")
    r = setup_py(["-q", "develop", "--no-deps"], tmp_path, PYTHONPATH=str(shim.parent))
    assert r.returncode != 0
    assert "error: yolov9c: `pip install -e .` needs pip >= 21.3" in r.stderr, r.stderr


def test_source_tree_hiding_an_installed_build_says_so(tmp_path):
    """`pip install .`, then `python train_dual.py` in the clone: the clone's yolov9c/ (no _C) comes first on sys.path
    and hides the installed one, so "build it" is the wrong advice; the error names both paths and the way out."""
    tree, site = tmp_path.resolve() / "clone", tmp_path.resolve() / "site"
    shutil.copytree(REPO / "yolov9c", tree / "yolov9c", ignore=shutil.ignore_patterns("_C*", "__pycache__"))
    # an editable install of the repo (its finder maps yolov9c._C to the repo whatever yolov9c/ came first) is dropped
    code = ("import sys\nsys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in str(f)]\n"
            "from yolov9c.ops import extension\ntry:\n    extension.load()\nexcept ImportError as e:\n    print(e)\n")

    def load_error():
        r = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(site)})
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "yolov9c._C (the C/CUDA extension) is not built" in load_error()   # nothing installed: build it
    (site / "yolov9c").mkdir(parents=True)
    (site / "yolov9c" / "__init__.py").write_text("")
    (site / "yolov9c" / f"_C{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    out = load_error()
    assert f"imported from {tree / 'yolov9c'}, a source tree without a built yolov9c._C" in out, out
    assert f"hides the yolov9c installed at {site / 'yolov9c'}" in out and "python -m yolov9c.cli.train" in out


def test_torch_older_than_the_minimum_is_one_line_before_training(tmp_path):
    """Walked: torch 2.1.2 and 2.3.1 import yolov9c and run val and detect, but training died mid set-up with an
    AttributeError (torch.amp.GradScaler is 2.3's, Tensor._use_count, which --backend c uses, 2.4's); 2.4.1 trains
    both backends. train_dual.py refuses an older torch first, and pyproject.toml and the README say the same."""
    declared = re.search(r'"torch>=(\d+\.\d+)"', (REPO / "pyproject.toml").read_text())[1]
    assert declared == "2.4" and f"any ≥ {declared})" in (REPO / "README.md").read_text()
    args = ["--cfg", "gelan-t.yaml", "--img", "64", "--batch", "4", "--epochs", "1", "--device", "cpu", "--workers",
            "0", "--noplots", "--project", str(tmp_path / "runs")]
    code = ("import sys, torch\ntorch.__version__ = '2.3.1+cu121'\nfrom yolov9c.cli.train import main\n"
            f"sys.exit(main({args!r}))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip() == ("train_dual.py: error: training needs torch >= 2.4 and this is torch 2.3.1+cu121: "
                                "pip install -U 'torch>=2.4' (val and detect run on older torch)"), r.stderr
    assert not (tmp_path / "runs").exists()
