"""Build of yolov9c's one extension module, yolov9c._C (metadata lives in pyproject.toml).

gcc compiles csrc/*.c as C11 against the CPython and NumPy C APIs (no C++, no torch headers). When nvcc is
found (on PATH or under $CUDA_HOME / $CUDA_PATH) and a GPU is visible, or YOLOV9C_CUDA=1 or
YOLOV9C_CUDA_ARCHS is set, nvcc also compiles kernels/*.cu and the objects are linked into the same module
with the static CUDA runtime, so the .so needs no libcudart at run time (only the NVIDIA driver).

Which GPU architectures (PTX is added for the highest one):
    YOLOV9C_CUDA_ARCHS given   exactly those (when nvcc is found)
    GPUs visible               theirs (`nvidia-smi --query-gpu=compute_cap`): the quick build for this machine
    no GPU, YOLOV9C_CUDA=1     the portable list 75,80,86,89,90 (about 2 min on 2 cores)
    no GPU, YOLOV9C_CUDA unset CPU only, with a message saying so and how to ask for the kernels: compiling
                               five architectures nobody here can run costs minutes (CI asks with YOLOV9C_CUDA=1)
Switches (environment):
    YOLOV9C_CUDA=0|1         0: CPU only; 1: CUDA or fail; unset: CUDA when nvcc is found and a GPU is visible
    YOLOV9C_CUDA_ARCHS=90    the GPU architectures to build for (e.g. 90, 8.6, sm_80;sm_90)
    YOLOV9C_WERROR=1         C (and CUDA host) warnings are errors (CI sets it)
    YOLOV9C_JOBS=N           parallel nvcc processes (default: CPU count)

Test: `pip install -e . --no-build-isolation --no-deps` (or `python setup.py build_ext --inplace`), then
`python -m pytest -q tests/ops/test_build.py`.
"""

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop
from setuptools.errors import PlatformError

ROOT = Path(__file__).resolve().parent
DEFAULT_ARCHS = ["75", "80", "86", "89", "90"]


def read_version():
    text = (ROOT / "yolov9c" / "__init__.py").read_text()
    m = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M)
    if not m:
        raise RuntimeError("yolov9c: no __version__ in yolov9c/__init__.py")
    return m.group(1)


def find_nvcc():
    """Path of nvcc: on PATH first, then $CUDA_HOME/bin, $CUDA_PATH/bin; None when absent."""
    found = shutil.which("nvcc")
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


def cuda_home_of(nvcc):
    """The toolkit root that holds include/cuda_runtime_api.h and the static runtime, found from nvcc
    (which may be a wrapper script on PATH, so ask nvcc itself rather than trusting its location)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "include" / "cuda_runtime_api.h").is_file():
            return Path(home)
    out = subprocess.run([nvcc, "--dryrun", "-c", "x.cu"], capture_output=True, text=True)
    m = re.search(r"TOP=(\S+)", out.stdout + out.stderr)
    if m and (Path(m.group(1)) / "include" / "cuda_runtime_api.h").is_file():
        return Path(m.group(1))
    home = Path(os.path.realpath(nvcc)).parent.parent
    if (home / "include" / "cuda_runtime_api.h").is_file():
        return home
    raise RuntimeError(f"yolov9c: found {nvcc} but not the CUDA toolkit's include/cuda_runtime_api.h; "
                       "set CUDA_HOME to the toolkit root")


def nvcc_version(nvcc):
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    if not m:
        raise RuntimeError(f"yolov9c: cannot read the CUDA version from `{nvcc} --version`:\n{out}")
    return f"{m.group(1)}.{m.group(2)}"


def parse_archs(text):
    """'90' / '8.6,9.0' / 'sm_80;sm_90' -> ['86', '90'] (sorted, unique)."""
    archs = set()
    for tok in re.split(r"[,;\s]+", text.strip()):
        tok = tok.lower().removeprefix("sm_").removeprefix("compute_").replace(".", "")
        if not tok:
            continue
        if not tok.isdigit():
            raise RuntimeError(f"yolov9c: bad YOLOV9C_CUDA_ARCHS entry {tok!r} (want e.g. 90 or 8.6)")
        archs.add(tok)
    if not archs:
        raise RuntimeError("yolov9c: YOLOV9C_CUDA_ARCHS is empty")
    return sorted(archs, key=int)


def gpu_archs():
    """Compute capabilities of the GPUs that nvidia-smi lists, as ['86', '90'] (sorted, unique); [] when
    there is no nvidia-smi, no GPU or no answer."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return []
    try:
        out = subprocess.run([nvidia_smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    caps = [line.strip() for line in out.stdout.splitlines() if re.fullmatch(r"\d+\.\d+", line.strip())]
    return parse_archs(",".join(caps)) if caps else []


def nvcc_archs(nvcc):
    """The real architectures this nvcc compiles for (`nvcc --list-gpu-arch`), None when it cannot say."""
    out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True)
    found = re.findall(r"compute_(\d+)", out.stdout) if out.returncode == 0 else []
    return sorted(set(found), key=int) or None


def fit_to_nvcc(archs, supported):
    """GPUs newer than this nvcc: build its highest architecture with PTX (the driver JIT-compiles PTX for
    newer GPUs). Returns (archs, note)."""
    if not supported:
        return archs, ""
    top = supported[-1]
    newer = [a for a in archs if int(a) > int(top)]
    if not newer:
        return archs, ""
    kept = sorted({a for a in archs if int(a) <= int(top)} | {top}, key=int)
    return kept, f" (sm_{','.join(newer)} is newer than this nvcc: PTX compute_{top} runs there)"


def choose_archs(want, env_archs, visible):
    """The architectures to build for, or None for a CPU-only build, and why (for the build message).
    want: YOLOV9C_CUDA ('', '0', '1'); env_archs: YOLOV9C_CUDA_ARCHS ('' when unset); visible: gpu_archs()."""
    if env_archs.strip():
        return parse_archs(env_archs), "YOLOV9C_CUDA_ARCHS"
    if visible:
        return visible, "the GPUs of this machine (nvidia-smi)"
    if want == "1":
        return list(DEFAULT_ARCHS), "YOLOV9C_CUDA=1 and no GPU visible: the portable list"
    return None, "no GPU visible"


def cuda_plan():
    """Decide the build: None for CPU only, else a dict (nvcc, home, version, archs)."""
    want = os.environ.get("YOLOV9C_CUDA", "").strip()
    if want not in ("", "0", "1"):
        raise RuntimeError(f"yolov9c: YOLOV9C_CUDA must be 0 or 1, not {want!r}")
    if want == "0":
        print("yolov9c: building CPU only (YOLOV9C_CUDA=0)", flush=True)
        return None
    nvcc = find_nvcc()
    env_archs = os.environ.get("YOLOV9C_CUDA_ARCHS", "")
    if nvcc is None:
        if want == "1":
            raise RuntimeError("yolov9c: YOLOV9C_CUDA=1 but nvcc was not found on PATH, in $CUDA_HOME/bin or "
                               "in $CUDA_PATH/bin; install the CUDA toolkit or set CUDA_HOME")
        print("yolov9c: building CPU only (nvcc not found)", flush=True)
        return None
    archs, why = choose_archs(want, env_archs, gpu_archs())
    if archs is None:
        print(f"yolov9c: building CPU only: nvcc found ({nvcc}) but no GPU visible (nvidia-smi), so the CUDA "
              f"kernels would be compiled for GPUs this machine does not have. To build them anyway: "
              f"YOLOV9C_CUDA=1 (sm_{', sm_'.join(DEFAULT_ARCHS)}: a few minutes) or YOLOV9C_CUDA_ARCHS=90 "
              f"(one architecture: quicker); YOLOV9C_CUDA=0 silences this.", flush=True)
        return None
    archs, note = fit_to_nvcc(archs, nvcc_archs(nvcc)) if why != "YOLOV9C_CUDA_ARCHS" else (archs, "")
    plan = dict(nvcc=nvcc, home=cuda_home_of(nvcc), version=nvcc_version(nvcc), archs=archs)
    print(f"yolov9c: building with CUDA {plan['version']} for "
          f"{','.join('sm_' + a for a in archs)} + PTX compute_{archs[-1]} ({why}{note}; {nvcc}). "
          f"YOLOV9C_CUDA_ARCHS=90 picks the architectures, YOLOV9C_CUDA=0 builds CPU only.", flush=True)
    return plan


def werror():
    return os.environ.get("YOLOV9C_WERROR", "") == "1"


class BuildExt(build_ext):
    """build_ext that first compiles kernels/*.cu with nvcc (in parallel) and links the objects in."""

    def build_extensions(self):
        self.check_compiler()
        plan = PLAN
        ext = self.extensions[0]
        # A changed plan (CPU <-> CUDA, other arches) changes macros in the C files: rebuild them all.
        stamp = Path(self.build_temp).resolve() / "yolov9c_plan.txt"
        stamp.parent.mkdir(parents=True, exist_ok=True)
        plan_text = repr(sorted((k, str(v)) for k, v in (plan or {}).items())) + repr(werror())
        if not stamp.exists() or stamp.read_text() != plan_text:
            self.force = True
        if plan is not None:
            objects = self.compile_cuda(plan)
            ext.extra_objects = objects + list(ext.extra_objects or [])
            ext.depends = list(ext.depends) + objects   # relink when a kernel object was rebuilt
        super().build_extensions()
        stamp.write_text(plan_text)

    def check_compiler(self):
        """One `error:` line naming the missing C compiler, instead of distutils' `[Errno 2] No such file or
        directory: 'gcc'` after a compile command line."""
        cc = (getattr(self.compiler, "compiler_so", None) or [None])[0]
        if cc and shutil.which(cc) is None:
            where = "$CC" if os.environ.get("CC") else "Python's build configuration"
            raise PlatformError(f"yolov9c: no C compiler: {cc!r} (from {where}) was not found, and yolov9c._C is "
                                f"C. Install one (Debian/Ubuntu: apt-get install gcc; Fedora: dnf install gcc) "
                                f"or set CC to its path, then install again.")

    def compile_cuda(self, plan):
        sources = sorted((ROOT / "kernels").glob("*.cu"))
        headers = sorted((ROOT / "kernels").glob("*.cuh")) + sorted((ROOT / "kernels").glob("*.h"))
        out_dir = Path(self.build_temp).resolve() / "kernels"
        out_dir.mkdir(parents=True, exist_ok=True)
        gencode = []
        for a in plan["archs"]:
            gencode += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
        top = plan["archs"][-1]
        gencode += ["-gencode", f"arch=compute_{top},code=compute_{top}"]
        # -lineinfo for profilers; no --use_fast_math: results must match the C references.
        host_flags = "-fPIC,-fno-exceptions,-fno-rtti,-Wall,-Wextra" + (",-Werror" if werror() else "")
        flags = (["-O3", "-lineinfo", "-std=c++17", "-Xcompiler", host_flags, "-I", str(ROOT / "kernels")]
                 + (["-Werror", "all-warnings"] if werror() else []) + gencode)
        stamp_text = " ".join([plan["nvcc"], plan["version"]] + flags)
        newest_header = max((h.stat().st_mtime for h in headers), default=0.0)

        def needs_build(src, obj):
            stamp = obj.with_suffix(".flags")
            if not obj.exists() or not stamp.exists() or stamp.read_text() != stamp_text:
                return True
            return obj.stat().st_mtime < max(src.stat().st_mtime, newest_header)

        def compile_one(src):
            obj = out_dir / (src.stem + ".o")
            if not needs_build(src, obj):
                return obj, None
            cmd = [plan["nvcc"], "-c", str(src), "-o", str(obj)] + flags
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                return obj, f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
            if proc.stderr.strip():
                print(proc.stderr, file=sys.stderr, flush=True)
            obj.with_suffix(".flags").write_text(stamp_text)
            return obj, None

        jobs = int(os.environ.get("YOLOV9C_JOBS", "0")) or os.cpu_count() or 1
        print(f"yolov9c: nvcc {len(sources)} file(s), {jobs} at a time", flush=True)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(compile_one, sources))
        failures = [err for _, err in results if err]
        if failures:
            # Fail the whole build with the compiler's own message; never fall back to CPU silently.
            raise RuntimeError("yolov9c: CUDA compile failed\n" + "\n".join(failures))
        return [str(obj) for obj, _ in results]


def make_extension(plan):
    version = read_version()
    c_args = ["-std=c11", "-Wall", "-Wextra", "-O3",
              # No fused multiply-add contraction: the C references must round exactly like the torch
              # references and the CUDA kernels (which use explicit __f*_rn intrinsics where it matters).
              "-ffp-contract=off",
              "-fvisibility=hidden"]
    if werror():
        c_args.append("-Werror")
    macros = [("YV_VERSION", f'"{version}"'), ("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
    try:
        import numpy
    except ImportError:
        raise RuntimeError("yolov9c: building yolov9c._C needs NumPy's C headers (numpy>=2.0, pyproject.toml's build "
                           "requirement) and this Python has no numpy: `pip install 'numpy>=2.0'` first, or install "
                           "without --no-build-isolation (pip then brings numpy itself)") from None

    # kernels/ holds yv_dtype.h (shared with the .cu files) and yv_kernels.h (the launcher prototypes).
    include_dirs = [str(ROOT / "csrc"), str(ROOT / "kernels"), numpy.get_include()]
    libraries, library_dirs, link_args = [], [], []
    if plan is not None:
        archs = ",".join(plan["archs"])
        macros += [("YV_WITH_CUDA", "1"), ("YV_CUDA_ARCHS", f'"{archs}"')]
        include_dirs.append(str(plan["home"] / "include"))
        lib_dir = plan["home"] / "lib64"
        if not (lib_dir / "libcudart_static.a").exists():
            cands = list(plan["home"].glob("targets/*/lib/libcudart_static.a"))
            if not cands:
                raise RuntimeError(f"yolov9c: libcudart_static.a not found under {plan['home']}")
            lib_dir = cands[0].parent
        library_dirs.append(str(lib_dir))
        # Static CUDA runtime: the module then depends only on the driver (libcuda.so, opened at run time),
        # whatever libcudart torch ships. The static runtime is C++ inside, so it needs libstdc++ (which
        # torch loads anyway), librt, libpthread and libdl.
        libraries += ["cudart_static", "stdc++", "rt", "pthread", "dl"]
    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.c"))
    return Extension("yolov9c._C", sources=sources, include_dirs=include_dirs, define_macros=macros,
                     extra_compile_args=c_args, libraries=libraries, library_dirs=library_dirs,
                     extra_link_args=link_args,
                     depends=[str(p.relative_to(ROOT)) for d in ("csrc", "kernels") for p in (ROOT / d).glob("*.h")])


PLAN = cuda_plan()
class BuildPy(build_py):
    """build_py that also copies the repo's configs/ (model yamls, hyps) into the wheel as yolov9c/configs/, so a
    regular (non-editable) install finds them; yolov9c/resources.py looks there first."""

    def run(self):
        super().run()
        if not self.dry_run:
            shutil.copytree(ROOT / "configs", Path(self.build_lib) / "yolov9c" / "configs", dirs_exist_ok=True)


class Develop(develop):
    """`setup.py develop`, which pip < 21.3 runs for `pip install -e .`: setuptools hands it back to `pip install -e .
    --use-pep517`, which fails inside old pip's build environment (`No module named pip`, a traceback); say so."""

    def run(self):
        out = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True).stdout
        m = re.match(r"pip (\d+)\.(\d+)", out)
        if m is None or (int(m[1]), int(m[2])) < (21, 3):
            raise PlatformError("yolov9c: `pip install -e .` needs pip >= 21.3 (editable installs of a pyproject.toml "
                                "project) and this pip is older: python -m pip install -U pip, then install again")
        super().run()


setup(ext_modules=[make_extension(PLAN)], cmdclass={"build_ext": BuildExt, "build_py": BuildPy, "develop": Develop})
