"""Image files: the accepted formats, reading with OpenCV, EXIF orientation, and the per-file check.

Images are read with `cv2.imdecode` of the file's bytes (paths imread cannot open, such as non-ASCII names on
some platforms, still work) and returned as HWC BGR uint8 arrays.
EXIF orientation: decoded with IMREAD_IGNORE_ORIENTATION, the tag read by the small parser below and applied
here, so the result does not depend on the OpenCV version (which applies it itself by default) and the scan can
report which files were turned; tests/data/test_images.py checks all eight orientations against OpenCV's own.
Only regular files are read (data/regular_file.py): a FIFO, a device, a folder named x.jpg or a dangling link is a
bad image like any other, never read. Truncated JPEG (no FFD9 end marker): the file is never written (the published code re-saves it in place); the
bytes are decoded with an end marker appended in memory (libjpeg fills the missing rows with grey) and a
warning reported; image and labels are kept. A file that still does not decode is corrupt and skipped.
Test: python -m pytest -q tests/data/test_images.py
"""

import struct
from pathlib import Path

import cv2
import numpy as np

from yolov9c.data.regular_file import NotRegularFile, read_regular

# the published whitelist (dataloaders.py:35)
IMG_FORMATS = ("bmp", "dng", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp", "pfm")
MIN_SIDE = 10  # published: images smaller than 10 px on a side are rejected

_JPEG_EXT = ("jpg", "jpeg", "mpo")


class BadImage(Exception):
    """Raised by check_image/read_image with the reason as its message (e.g. 'empty file')."""


def is_image_path(path):
    """True when the file name ends in one of IMG_FORMATS (case-insensitive)."""
    return Path(path).suffix[1:].lower() in IMG_FORMATS


def exif_orientation(data):
    """The EXIF orientation tag (1-8) of JPEG bytes `data`, or 1 when absent or unreadable.

    Walks the JPEG markers up to the start of scan; in the APP1 'Exif' segment reads the TIFF header
    (byte order), then the entries of IFD0 for tag 0x0112 (SHORT)."""
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return 1
    i = 2
    n = len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return 1
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan: no EXIF before the pixels
            return 1
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length field
            i += 2
            continue
        seg_len = struct.unpack(">H", data[i + 2:i + 4])[0]
        seg = data[i + 4:i + 2 + seg_len]
        if marker == 0xE1 and seg[:6] == b"Exif\x00\x00":
            return _tiff_orientation(seg[6:])
        i += 2 + seg_len
    return 1


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def jpeg_size(data):
    """(h, w) stored in the start-of-frame header of JPEG bytes `data` (before EXIF orientation), or None."""
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            i += 2
            continue
        if marker in (0xD9, 0xDA):
            return None
        seg_len = struct.unpack(">H", data[i + 2:i + 4])[0]
        if marker in _SOF and i + 9 <= n:
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            return (h, w) if h and w else None
        i += 2 + seg_len
    return None


def _tiff_orientation(tiff):
    if len(tiff) < 8:
        return 1
    order = tiff[:2]
    if order == b"II":
        e = "<"
    elif order == b"MM":
        e = ">"
    else:
        return 1
    ifd = struct.unpack(e + "I", tiff[4:8])[0]
    if ifd + 2 > len(tiff):
        return 1
    count = struct.unpack(e + "H", tiff[ifd:ifd + 2])[0]
    for k in range(count):
        p = ifd + 2 + 12 * k
        if p + 12 > len(tiff):
            return 1
        tag, typ = struct.unpack(e + "HH", tiff[p:p + 4])
        if tag == 0x0112 and typ == 3:
            value = struct.unpack(e + "H", tiff[p + 8:p + 10])[0]
            return value if 1 <= value <= 8 else 1
    return 1


def apply_orientation(img, orientation):
    """Turn decoded pixels `img` (H, W, C) as EXIF `orientation` (1-8) says, so the result is upright."""
    if orientation == 2:
        return cv2.flip(img, 1)
    if orientation == 3:
        return cv2.rotate(img, cv2.ROTATE_180)
    if orientation == 4:
        return cv2.flip(img, 0)
    if orientation == 5:
        return cv2.transpose(img)
    if orientation == 6:
        return cv2.rotate(img, cv2.ROTATE_90_CLOCKWISE)
    if orientation == 7:
        return cv2.rotate(cv2.transpose(img), cv2.ROTATE_180)
    if orientation == 8:
        return cv2.rotate(img, cv2.ROTATE_90_COUNTERCLOCKWISE)
    return img


_REDUCED = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}


def jpeg_reduction(long_side, target):
    """Largest libjpeg decode reduction k in (8, 4, 2, 1) that keeps the decoded long side ≥ `target`."""
    for k in (8, 4, 2):
        if long_side >= k * target:
            return k
    return 1


def decode_image(data, is_jpeg, reduce=1):
    """Decode file bytes `data` to (img HWC BGR uint8, notes list of str). Raises BadImage.

    reduce: 2, 4 or 8 decodes a JPEG at 1/reduce of its size (each side rounded up) with libjpeg's DCT
    scaling, several times faster than a full decode followed by a resize; ignored for other formats.
    notes may hold 'EXIF orientation N applied' and 'truncated JPEG (no end marker): ...'."""
    if len(data) == 0:
        raise BadImage("empty file")
    buf = np.frombuffer(data, np.uint8)
    flags = (_REDUCED[reduce] if (is_jpeg and reduce in _REDUCED) else cv2.IMREAD_COLOR)
    flags |= cv2.IMREAD_IGNORE_ORIENTATION
    img = cv2.imdecode(buf, flags)
    notes = []
    if img is None and is_jpeg and data[:2] == b"\xff\xd8" and not data.rstrip(b"\x00").endswith(b"\xff\xd9"):
        # OpenCV rejects a JPEG whose end marker is missing; give it one in memory, never on disk
        img = cv2.imdecode(np.frombuffer(data + b"\xff\xd9", np.uint8), flags)
        if img is not None:
            notes.append("truncated JPEG (no end marker): decoded what is there, missing rows are grey, "
                         "file left unchanged")
    if img is None:
        raise BadImage("corrupt image (does not decode)")
    if is_jpeg:
        o = exif_orientation(data)
        if o != 1:
            img = apply_orientation(img, o)
            notes.append(f"EXIF orientation {o} applied")
    if img.ndim == 2:  # IMREAD_COLOR always gives 3 channels; kept for safety across OpenCV versions
        img = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    if img.dtype != np.uint8:
        raise BadImage(f"unsupported pixel type {img.dtype}")
    return np.ascontiguousarray(img), notes


def _read(path):
    """The bytes of image file `path`; BadImage for a path that is no regular file or cannot be read."""
    try:
        return read_regular(path)
    except NotRegularFile as e:
        raise BadImage(str(e)) from None
    except OSError as e:
        raise BadImage(f"cannot read file ({e.strerror or e})") from None


def read_image(path, reduce=1):
    """Read image file `path` → HWC BGR uint8 array, upright (EXIF applied). Raises BadImage.
    reduce: see decode_image (JPEG only)."""
    path = Path(path)
    data = _read(path)
    img, _ = decode_image(data, path.suffix[1:].lower() in _JPEG_EXT, reduce)
    return img


def check_image(path):
    """Check image file `path` for the scan. Returns ((h, w) upright, notes). Raises BadImage(reason) for
    a file to skip: unsupported format, unreadable, empty, corrupt, smaller than MIN_SIDE."""
    path = Path(path)
    ext = path.suffix[1:].lower()
    if ext not in IMG_FORMATS:
        raise BadImage(f"unsupported image format '{path.suffix or '(none)'}' (accepted: {', '.join(IMG_FORMATS)})")
    data = _read(path)
    is_jpeg = ext in _JPEG_EXT
    size = jpeg_size(data) if is_jpeg else None
    # A JPEG's size is in its header: the check then decodes at 1/8 scale (every byte is still
    # entropy-decoded, so corrupt and truncated files are still caught), several times faster.
    img, notes = decode_image(data, is_jpeg, 8 if size else 1)
    if size:
        h, w = size
        if any(n.startswith("EXIF orientation") and int(n.split()[2]) >= 5 for n in notes):
            h, w = w, h  # orientations 5-8 swap the sides
        if (img.shape[0], img.shape[1]) != (-(-h // 8), -(-w // 8)):
            img, notes = decode_image(data, is_jpeg)  # header and data disagree: trust the full decode
            h, w = img.shape[:2]
    else:
        h, w = img.shape[:2]
    if h < MIN_SIDE or w < MIN_SIDE:
        raise BadImage(f"image too small ({w}x{h}; each side must be >= {MIN_SIDE} px)")
    return (h, w), notes
