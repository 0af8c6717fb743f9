"""The Python side of the C boundary: loading yolov9c._C, the run-time switches, the stream handle.

Ops hand torch tensors to yolov9c._C as they are: csrc/tensor.c reads a CPU or CUDA tensor's dtype, shape,
strides, data pointer and device itself, and checks everything about it (errors name the op and the argument).
A CUDA op also gets the handle of `torch.cuda.current_stream(device)` as a separate argument (stream_of).
The raw bindings also take NumPy arrays (CPU) and CUDA descriptor tuples (tests use them); see csrc/tensor.h.
Switches read at call time: YOLOV9C_FUSED=0 sends every op to its torch reference; YOLOV9C_SYNC=1 makes the
C side synchronise after every CUDA op.

Test: python -m pytest -q tests/ops/test_build.py tests/ops/test_bindings.py
"""

import collections
import contextlib
import importlib.machinery
import os
import sys
from pathlib import Path

import torch

_BUILD_HINT = (
    "yolov9c._C (the C/CUDA extension) is not built. Build it from the repository root with "
    "`pip install -e .` (or `python setup.py build_ext --inplace`); set YOLOV9C_FUSED=0 to use the "
    "plain-torch reference ops instead."
)

_module = None
_dtype_codes = None
_counters = []  # the CallCounts of the count_calls() blocks now open


def load():
    """Return the yolov9c._C module, or raise ImportError saying how to build it."""
    global _module
    if _module is None:
        try:
            from yolov9c import _C
        except ImportError as e:
            raise ImportError(_not_built_message(e)) from e
        _module = _C
    return _module


def _not_built_message(e):
    """The build hint; when the yolov9c imported is a source tree without _C that shadows another yolov9c on
    sys.path that has one (`pip install .`, then a script run from the clone: Python puts the script's or the
    current directory first), say that instead, since building is then not what is missing."""
    here = Path(__file__).resolve().parents[1]
    for entry in sys.path:
        pkg = Path(entry or os.getcwd()).resolve() / "yolov9c"
        if pkg != here and any((pkg / f"_C{suffix}").is_file() for suffix in importlib.machinery.EXTENSION_SUFFIXES):
            return (f"yolov9c is imported from {here}, a source tree without a built yolov9c._C, which hides the "
                    f"yolov9c installed at {pkg}: run from another directory (the installed entry points are "
                    f"`python -m yolov9c.cli.train`, `.val`, `.detect`), or build this tree with `pip install -e .`")
    return f"{_BUILD_HINT} ({e})"


# os.environ (CPython's os._Environ) stores its entries in the dict os.environ._data, keys and values encoded
# by its encodekey/encodevalue; every write through os.environ (monkeypatch.setenv, mock.patch.dict, a user's
# os.environ[...] = ...) updates that dict. One dict lookup there reads what os.environ.get would, without
# its five Python-level calls (fused_enabled runs ~1500 times a training step). Other os.environ
# implementations fall back to the mapping itself.
try:
    _ENVIRON, _FUSED_KEY, _FUSED_OFF = os.environ._data, os.environ.encodekey("YOLOV9C_FUSED"), \
        os.environ.encodevalue("0")
except AttributeError:
    _ENVIRON, _FUSED_KEY, _FUSED_OFF = os.environ, "YOLOV9C_FUSED", "0"


def fused_enabled():
    """False when YOLOV9C_FUSED=0 (read at every call, so tests and users can switch it at run time)."""
    return _ENVIRON.get(_FUSED_KEY) != _FUSED_OFF


try:
    _LEAN_KEY, _LEAN_OFF = os.environ.encodekey("YOLOV9C_LEAN_HOST"), os.environ.encodevalue("0")
except AttributeError:
    _LEAN_KEY, _LEAN_OFF = "YOLOV9C_LEAN_HOST", "0"


def lean_host():
    """False when YOLOV9C_LEAN_HOST=0 (on by default; read at every call). On, the c backend's eager step reuses
    its BatchNorm statistics vectors and kernel workspaces across steps, counts num_batches_tracked and casts the
    conv weights to the autocast dtype once a forward (backends/c/casts.py): fewer allocations and launches a
    step, bit-identical results. Test: tests/backends/test_lean_host.py."""
    return _ENVIRON.get(_LEAN_KEY) != _LEAN_OFF


def dtype_code(dtype):
    """The module's code for a torch dtype (TypeError for a dtype no op accepts)."""
    codes = _dtype_codes if _dtype_codes is not None else _load_codes()
    try:
        return codes[dtype]
    except KeyError:
        raise TypeError(f"yolov9c._C has no dtype code for {dtype}") from None


def _load_codes():
    global _dtype_codes
    if _dtype_codes is None:
        C = load()
        _dtype_codes = {
            torch.float32: C.DTYPE_FLOAT32, torch.float16: C.DTYPE_FLOAT16, torch.bfloat16: C.DTYPE_BFLOAT16,
            torch.float64: C.DTYPE_FLOAT64, torch.int8: C.DTYPE_INT8, torch.int16: C.DTYPE_INT16,
            torch.int32: C.DTYPE_INT32, torch.int64: C.DTYPE_INT64, torch.uint8: C.DTYPE_UINT8,
            torch.bool: C.DTYPE_BOOL,
        }
    return _dtype_codes


# the raw cudaStream_t of the current stream of a device index (CUDA builds of torch; the same value as
# torch.cuda.current_stream(i).cuda_stream without building a Stream object: ~1500 calls per training step)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_of(device):
    """The handle of the current CUDA stream on `device` (0 for CPU), as the C launchers expect."""
    if device.type == "cuda":
        if _raw_stream is not None and device.index is not None:
            return _raw_stream(device.index)
        return torch.cuda.current_stream(device).cuda_stream
    return 0


def enter(op, t, *more):
    """An op implementation's way in: (the yolov9c._C module, the handle of the current stream on t's device as
    stream_of gives it), the call counted as note_call(op, t, *more) counts it; None under YOLOV9C_FUSED=0 (the
    op's torch reference serves; not counted). t: a tensor (the caller has checked). One call where the hot ops
    would make four (fused_enabled, note_call, load, stream_of)."""
    if _ENVIRON.get(_FUSED_KEY) == _FUSED_OFF:
        return None
    if _counters:
        note_call(op, t, *more)
    module = _module if _module is not None else load()
    if not t.is_cuda:
        return module, 0
    return module, (_raw_stream(t.get_device()) if _raw_stream is not None else stream_of(t.device))


class CallCounts:
    """What count_calls() yields: calls[op] (op implementations run on real data: meta-tensor shape probes are
    not counted) and elements[op] (the elements of their main input), keyed by op name ("avg_pool2x2_forward",
    "max_pool2d_backward", "bn_silu_forward", ...; the names the ops' errors use)."""

    def __init__(self):
        self.calls, self.elements = collections.Counter(), collections.Counter()


@contextlib.contextmanager
def count_calls():
    """Test hook: count the implementations of the ops of pool.py and bn_silu.py (the ops that call note_call or
    enter) that run inside the block:
    `with extension.count_calls() as n: ...; n.calls["avg_pool2x2_backward"]`. Nested blocks each count.
    YOLOV9C_FUSED=0 sends some ops' functions straight to their references (not counted). Outside a block
    counting costs one list check per op call. Test: tests/ops/test_build.py -k count_calls."""
    counts = CallCounts()
    _counters.append(counts)
    try:
        yield counts
    finally:
        _counters.remove(counts)


def note_call(op, t, *more):
    """Called by each op implementation on entry (t: its main input; more: other inputs it reads whole, None
    allowed): counted in every open count_calls() block unless t is a meta tensor; elements: the numel of t
    and of the tensors in more. Arguments are looked at only inside a block (bad ones are the op's to refuse)."""
    if not _counters or not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return
    n = t.numel() + sum(m.numel() for m in more if isinstance(m, torch.Tensor))
    for c in _counters:
        c.calls[op] += 1
        c.elements[op] += n
