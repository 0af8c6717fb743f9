"""Tests of the extension build: yolov9c._C's build_info, KernelError and dtype codes, and setup.py's CUDA
switches (CPU-only build, YOLOV9C_CUDA=1 without nvcc, a failing CUDA compile), run in a temporary copy of
the sources so the installed module is not touched.

Conventions: the build tests compile C for real (about 5 s on 2 cores); the CUDA-compile case runs only
where nvcc is installed. When nvcc is present and the kernels were asked for (YOLOV9C_CUDA=1, as .ci/run
sets it, YOLOV9C_CUDA_ARCHS, or a visible GPU), the installed module must have been built with CUDA (a
silent CPU fallback is a failure). Which architectures setup.py picks (the GPUs present; without a GPU CPU
only unless asked) is checked with a stand-in nvidia-smi and `setup.py --version`, which only plans.
Run: python -m pytest -q tests/ops/test_build.py
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import yolov9c
from yolov9c.ops import extension, pool

REPO = Path(__file__).resolve().parents[2]


def find_nvcc():
    if shutil.which("nvcc"):
        return shutil.which("nvcc")
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


def test_build_info_keys_and_types():
    C = extension.load()
    info = C.build_info()
    assert set(info) >= {"version", "cuda", "cuda_version", "archs", "ptx"}
    assert info["version"] == yolov9c.__version__ == C.__version__
    assert isinstance(info["cuda"], bool)
    assert isinstance(info["archs"], list) and all(isinstance(a, str) for a in info["archs"])
    if info["cuda"]:
        assert re.fullmatch(r"\d+\.\d+", info["cuda_version"])
        assert info["archs"] and all(re.fullmatch(r"sm_\d+", a) for a in info["archs"])
        assert info["ptx"] == "compute_" + info["archs"][-1][3:]
    else:
        assert info["cuda_version"] is None and info["archs"] == [] and info["ptx"] is None


def test_kernel_error_is_an_exception():
    C = extension.load()
    assert issubclass(C.KernelError, RuntimeError) and issubclass(C.KernelError, Exception)
    assert C.KernelError.__module__ == "yolov9c._C"
    with pytest.raises(C.KernelError, match="boom"):
        raise C.KernelError("nms_forward: boom")


def test_dtype_codes_are_distinct_and_mapped():
    import torch

    C = extension.load()
    names = [n for n in dir(C) if n.startswith("DTYPE_")]
    codes = [getattr(C, n) for n in names]
    assert len(names) == 10 and sorted(codes) == list(range(10))
    assert extension.dtype_code(torch.float16) == C.DTYPE_FLOAT16
    assert extension.dtype_code(torch.bfloat16) == C.DTYPE_BFLOAT16
    with pytest.raises(TypeError, match="complex64"):
        extension.dtype_code(torch.complex64)


def test_fused_enabled_follows_the_environment_at_every_call(monkeypatch):
    """fused_enabled() reads os.environ's own storage: setenv, delenv and mock.patch.dict switch it both ways."""
    from unittest import mock

    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    assert extension.fused_enabled() is False
    monkeypatch.setenv("YOLOV9C_FUSED", "1")
    assert extension.fused_enabled() is True
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    monkeypatch.delenv("YOLOV9C_FUSED")
    assert extension.fused_enabled() is True   # unset: the fused ops
    with mock.patch.dict(os.environ, {"YOLOV9C_FUSED": "0"}):
        assert extension.fused_enabled() is False
        with mock.patch.dict(os.environ, {"YOLOV9C_FUSED": "yes"}):
            assert extension.fused_enabled() is True   # anything but "0" keeps them on
        assert extension.fused_enabled() is False
    assert extension.fused_enabled() is True


def test_stream_of_cpu_is_zero():
    assert extension.stream_of(torch.device("cpu")) == 0


@pytest.mark.cuda
def test_stream_on_cuda():
    dev = torch.device("cuda", torch.cuda.current_device())
    # the raw handle is the current stream's, also inside a stream context
    assert extension.stream_of(dev) == torch.cuda.current_stream(dev).cuda_stream
    s = torch.cuda.Stream(dev)
    with torch.cuda.stream(s):
        assert extension.stream_of(dev) == s.cuda_stream != torch.cuda.default_stream(dev).cuda_stream
    assert extension.stream_of(torch.device("cuda")) == torch.cuda.current_stream().cuda_stream
    x = torch.zeros(1, device=dev)
    with torch.cuda.stream(s):
        assert extension.enter("op", x) == (extension.load(), s.cuda_stream)


def test_count_calls_counts_real_data_in_every_open_block(monkeypatch):
    """extension.count_calls(), the ops' test hook: calls and elements per op name in every open block (nested
    ones too), meta tensors (the c backend's shape probe) and calls after the block not counted."""
    monkeypatch.setenv("YOLOV9C_FUSED", "1")
    x, g = torch.randn(1, 2, 4, 4), torch.randn(1, 2, 3, 3)
    with extension.count_calls() as outer:
        pool.avg_pool2x2(x)
        with extension.count_calls() as inner:
            pool.avg_pool2x2_backward(g)
            pool.avg_pool2x2(x.to("meta"))
    pool.avg_pool2x2(x)
    assert outer.calls == {"avg_pool2x2_forward": 1, "avg_pool2x2_backward": 1}
    assert outer.elements == {"avg_pool2x2_forward": 32, "avg_pool2x2_backward": 18}
    assert inner.calls == {"avg_pool2x2_backward": 1}


def test_enter_counts_and_gives_the_module_unless_fused_is_off(monkeypatch):
    """extension.enter(op, t, *more), the hot ops' way in: the loaded module and t's stream handle (0 on the CPU),
    the call counted as note_call counts it; None and nothing counted under YOLOV9C_FUSED=0."""
    x, y = torch.randn(1, 2, 4, 4), torch.randn(3)
    monkeypatch.setenv("YOLOV9C_FUSED", "1")
    with extension.count_calls() as n:
        assert extension.enter("op_a", x, None, y) == (extension.load(), 0)
        monkeypatch.setenv("YOLOV9C_FUSED", "0")
        assert extension.enter("op_b", x) is None
    assert n.calls == {"op_a": 1} and n.elements == {"op_a": 35}


def gpu_visible():
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def cuda_asked_for():
    """setup.py builds the kernels when nvcc is found and YOLOV9C_CUDA=1, YOLOV9C_CUDA_ARCHS or a GPU says so
    (CI's .ci/run sets YOLOV9C_CUDA=1 when nvcc is there)."""
    if find_nvcc() is None or os.environ.get("YOLOV9C_CUDA") == "0":
        return False
    return os.environ.get("YOLOV9C_CUDA") == "1" or bool(os.environ.get("YOLOV9C_CUDA_ARCHS")) or gpu_visible()


@pytest.mark.skipif(not cuda_asked_for(), reason="nvcc absent, or no GPU and neither YOLOV9C_CUDA=1 nor "
                                                 "YOLOV9C_CUDA_ARCHS set")
def test_cuda_built_when_asked_for():
    assert extension.load().build_info()["cuda"] is True


def test_missing_extension_says_how_to_build():
    # a fresh process (extension.load() caches the module once loaded); a None entry in sys.modules makes the
    # import of yolov9c._C fail as if it were not built
    code = ("import sys; sys.modules['yolov9c._C'] = None\n"
            "from yolov9c.ops import extension\n"
            "try:\n    extension.load()\nexcept ImportError as e:\n    print('ImportError:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("ImportError: ") and "pip install -e ." in r.stdout, r.stdout


# ------------------------------------------------------------------------- setup.py in a scratch copy


def scratch_copy(tmp_path, cu_files):
    """Copy what setup.py needs into tmp_path; kernels/ gets the headers plus `cu_files` {name: text}."""
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "csrc", tmp_path / "csrc")
    shutil.copytree(REPO / "yolov9c", tmp_path / "yolov9c", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (tmp_path / "kernels").mkdir()
    for header in list((REPO / "kernels").glob("*.h")) + list((REPO / "kernels").glob("*.cuh")):
        shutil.copy(header, tmp_path / "kernels" / header.name)
    for name, text in cu_files.items():
        (tmp_path / "kernels" / name).write_text(text)
    return tmp_path


def run_setup(cwd, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "YOLOV9C_CUDA")}
    full.update(env)
    return subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=600)


def test_cpu_only_build_works(tmp_path):
    src = scratch_copy(tmp_path, {})
    proc = run_setup(src, YOLOV9C_CUDA="0", YOLOV9C_WERROR="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "yolov9c: building CPU only (YOLOV9C_CUDA=0)" in proc.stdout
    check = ("import torch, yolov9c._C as C; from yolov9c.ops.nms import nms; "
             "assert C.__file__.startswith(%r), C.__file__; assert C.build_info()['cuda'] is False; "
             "b = torch.tensor([[0., 0, 4, 4], [0, 0, 4, 3.9], [9, 9, 10, 10]]); "
             "print(nms(b, torch.tensor([.5, .9, .1]), 0.5).tolist())" % str(src))
    out = subprocess.run([sys.executable, "-c", check], cwd=src, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[1, 2]"


def test_cuda_required_without_nvcc_fails_clearly(tmp_path):
    path = "/usr/bin:/bin"
    if shutil.which("nvcc", path=path):
        pytest.skip("nvcc is on the minimal PATH")
    src = scratch_copy(tmp_path, {})
    proc = run_setup(src, YOLOV9C_CUDA="1", PATH=path)
    assert proc.returncode != 0
    assert "YOLOV9C_CUDA=1 but nvcc was not found" in proc.stdout + proc.stderr


@pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc")
def test_failed_cuda_compile_fails_the_build(tmp_path):
    src = scratch_copy(tmp_path, {"broken.cu": "__global__ void k(float *x) { x[0] = not_declared_here; }\n"})
    proc = run_setup(src, YOLOV9C_CUDA_ARCHS="75")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "yolov9c: CUDA compile failed" in out and "not_declared_here" in out   # the compiler's message
    assert not list(src.glob("yolov9c/_C*.so"))   # no CPU-only module left behind


# ------------------------------------------------------------------ which architectures setup.py picks


def plan_run(tmp_path, caps=None, path=None, **env):
    """`setup.py --version` (it only plans) with a stand-in nvidia-smi on PATH that lists GPUs of compute
    capability `caps` (e.g. ["8.6", "9.0"]) or, with caps None, finds no GPU (exit 9, as nvidia-smi does)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    body = "".join(f"echo {c}\n" for c in caps) if caps else "echo 'No devices were found'\nexit 9\n"
    smi.write_text("#!/bin/sh\n" + body)
    smi.chmod(0o755)
    full = {k: v for k, v in os.environ.items()
            if k not in ("CUDA_HOME", "CUDA_PATH", "YOLOV9C_CUDA", "YOLOV9C_CUDA_ARCHS")}
    full.update(env)
    full["PATH"] = f"{bin_dir}:{path if path is not None else os.environ['PATH']}"
    return subprocess.run([sys.executable, "setup.py", "--version"], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=120)


def plan_message(tmp_path, caps=None, path=None, **env):
    """setup.py's build-plan line (see plan_run)."""
    proc = plan_run(tmp_path, caps, path, **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return next(line for line in proc.stdout.splitlines() if line.startswith("yolov9c: building"))


needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc")


@needs_nvcc
def test_default_build_targets_the_gpus_present(tmp_path):
    line = plan_message(tmp_path, ["8.6", "9.0", "9.0"])
    assert "for sm_86,sm_90 + PTX compute_90 (the GPUs of this machine (nvidia-smi)" in line
    assert "YOLOV9C_CUDA=0 builds CPU only" in line


@needs_nvcc
def test_no_gpu_builds_cpu_only_and_says_how_to_get_the_kernels(tmp_path):
    line = plan_message(tmp_path, None)
    assert line.startswith("yolov9c: building CPU only: nvcc found")
    assert "no GPU visible" in line and "YOLOV9C_CUDA=1" in line and "YOLOV9C_CUDA_ARCHS=90" in line
    line = plan_message(tmp_path, None, YOLOV9C_CUDA="1")  # asked for: the portable list
    assert "for sm_75,sm_80,sm_86,sm_89,sm_90 + PTX compute_90 (YOLOV9C_CUDA=1 and no GPU visible" in line


@needs_nvcc
def test_cuda_archs_overrides_the_gpus(tmp_path):
    assert "for sm_80 + PTX compute_80 (YOLOV9C_CUDA_ARCHS" in plan_message(tmp_path, ["9.0"], YOLOV9C_CUDA_ARCHS="8.0")
    assert "for sm_75,sm_90 + PTX compute_90 (YOLOV9C_CUDA_ARCHS" in plan_message(tmp_path, None,
                                                                                  YOLOV9C_CUDA_ARCHS="sm_90;75")
    assert "building CPU only (YOLOV9C_CUDA=0)" in plan_message(tmp_path, ["9.0"], YOLOV9C_CUDA="0")


@needs_nvcc
def test_gpu_newer_than_nvcc_gets_ptx_of_the_newest_arch(tmp_path):
    out = subprocess.run([find_nvcc(), "--list-gpu-arch"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("this nvcc has no --list-gpu-arch")
    top = max(int(a) for a in re.findall(r"compute_(\d+)", out.stdout))
    line = plan_message(tmp_path, ["8.0", "99.0"])
    assert f"for sm_80,sm_{top} + PTX compute_{top}" in line and "sm_990 is newer than this nvcc" in line


def test_without_nvcc_a_gpu_still_means_cpu_only(tmp_path):
    path = "/usr/bin:/bin"
    if shutil.which("nvcc", path=path):
        pytest.skip("nvcc is on the minimal PATH")
    assert "building CPU only (nvcc not found)" in plan_message(tmp_path, ["9.0"], path=path)
