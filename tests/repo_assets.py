"""The test data committed under tests/assets/ (tests/assets/README.md): where it is, and the reader of the packed
golden tensors. No test reads data from outside the repository.

    GOLDEN_DIR / "summary.json"          parameter counts and loss figures of the ten configs
    golden("yolov9-s")["train_map0"]     a stored tensor of the published code (tests/assets/goldens/README.md)
    golden_lines("yolov9-s", "keys")     the lines of <cfg>.keys.txt ("grad_names": <cfg>.grad_names.txt)
    COCO24 / "data.yaml"                 24 COCO 2017 images (13 train, 11 val) with their labels and licences

Packing: each <cfg>.tar.xz holds keys.txt, grad_names.txt and one NAME.planes.npy per tensor: the tensor's
little-endian bytes regrouped into byte planes, a uint8 array of shape (itemsize, *shape) (plane k holds byte k of
every element), so that xz finds the repeated sign/exponent bytes together. Lossless: `golden` returns the
recorded float32 / float64 values bit for bit. dev/make_test_assets.py writes these files (`pack_golden`) from
the developers' copy of the recordings and checks the round trip. Tests: tests/package/test_assets.py.
"""

import functools
import io
import lzma
import tarfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "tests" / "assets"
GOLDEN_DIR = ASSETS / "goldens"
COCO24 = ASSETS / "coco24"
PLANES = ".planes.npy"


def to_planes(a):
    """(itemsize, *shape) uint8 byte planes of a float array (little-endian)."""
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return np.ascontiguousarray(np.moveaxis(a.view(np.uint8).reshape(*a.shape, a.itemsize), -1, 0))


def from_planes(p):
    """Inverse of to_planes: the little-endian float array (float32 for 4 planes, float64 for 8), a new array."""
    if p.dtype != np.uint8 or p.shape[0] not in (4, 8):
        raise ValueError(f"byte planes must be uint8 of 4 or 8 planes, got {p.dtype} {p.shape}")
    return np.ascontiguousarray(np.moveaxis(p, 0, -1)).view(f"<f{p.shape[0]}").reshape(p.shape[1:])


def pack_golden(out, arrays, keys_text, grad_names_text):
    """Write out (a .tar.xz) from {name: float array} and the two text files' contents; reproducible bytes
    (sorted members, no times or owners)."""
    members = {"keys.txt": keys_text.encode(), "grad_names.txt": grad_names_text.encode()}
    for name, a in arrays.items():
        buf = io.BytesIO()
        np.save(buf, to_planes(np.asarray(a)), allow_pickle=False)
        members[name + PLANES] = buf.getvalue()
    with tarfile.open(out, "w:xz", preset=9 | lzma.PRESET_EXTREME,
                      format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(members[name]), 0o644
            tar.addfile(info, io.BytesIO(members[name]))


def read_archive(path):
    """{member name: bytes} of a packed golden file."""
    with tarfile.open(path, "r:xz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def arrays_of(members):
    """{name: array} of the NAME.planes.npy members, fresh writable arrays."""
    return {name[: -len(PLANES)]: from_planes(np.load(io.BytesIO(data), allow_pickle=False))
            for name, data in members.items() if name.endswith(PLANES)}


@functools.lru_cache(maxsize=None)
def _members(cfg):
    """cfg's members, decompressed once per process (bytes: no caller can alter them)."""
    path = GOLDEN_DIR / f"{cfg}.tar.xz"
    if not path.is_file():
        raise FileNotFoundError(f"no golden tensors for {cfg!r}: {path} is missing")
    return read_archive(path)


def golden(cfg):
    """{name: array} of cfg's recorded tensors, fresh writable copies: eval_decoded (1, 84, 525) and
    train_map<i> (2, 144, H, W) float32; loss_total (1,), loss_items (3,), grad_norms (P,) float64."""
    return arrays_of(_members(cfg))


def golden_lines(cfg, which):
    """The lines of cfg's keys.txt (which="keys") or grad_names.txt (which="grad_names")."""
    return _members(cfg)[f"{which}.txt"].decode().splitlines()
