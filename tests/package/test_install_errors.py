"""What `pip install` says when the machine lacks what the build needs: no C compiler is one `error:` line naming
the compiler it looked for and saying a C compiler is needed (not distutils' `[Errno 2] No such file or directory:
'gcc'` after a command line); no NumPy under --no-build-isolation names numpy>=2.0 and how to get it; pip < 21.3's
`pip install -e .` (setup.py develop) says to upgrade pip. setup.py run directly, nothing compiled: a second or two
each.

Run: python -m pytest -q tests/package/test_install_errors.py
"""

import os
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
