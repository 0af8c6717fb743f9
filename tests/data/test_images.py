"""Image reading and checks (yolov9c/data/images.py): EXIF orientation, truncated / corrupt / empty /
unsupported / tiny files, odd paths.

Run: python -m pytest -q tests/data/test_images.py
"""

import struct

import cv2
import numpy as np
import pytest

from yolov9c.data.images import BadImage, check_image, exif_orientation, read_image


def _jpeg_bytes(img, quality=95):
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes()


def _with_exif(data, orientation, big_endian=False):
    """Insert an APP1 Exif segment holding only IFD0 tag 0x0112 right after SOI."""
    e = ">" if big_endian else "<"
    tiff = (b"MM" if big_endian else b"II") + struct.pack(e + "H", 42) + struct.pack(e + "I", 8)
    tiff += struct.pack(e + "H", 2)
    tiff += struct.pack(e + "HHI", 0x010F, 2, 4) + b"abc\x00"  # Make, an entry before the one we want
    tiff += struct.pack(e + "HHIH", 0x0112, 3, 1, orientation) + b"\x00\x00"
    tiff += struct.pack(e + "I", 0)
    payload = b"Exif\x00\x00" + tiff
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + data[2:]


def _pattern(h=40, w=64):
    # asymmetric: a bright top-left quadrant and a mid-grey right column band
    img = np.full((h, w, 3), 30, np.uint8)
    img[: h // 2, : w // 2] = (220, 220, 220)
    img[:, -8:] = (120, 120, 120)
    return img


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("big_endian", [False, True])
def test_exif_orientation_matches_opencv(tmp_path, orientation, big_endian):
    data = _with_exif(_jpeg_bytes(_pattern()), orientation, big_endian)
    assert exif_orientation(data) == orientation
    f = tmp_path / "o.jpg"
    f.write_bytes(data)
    ours = read_image(f)
    theirs = cv2.imread(str(f))  # OpenCV applies EXIF orientation by default
    assert ours.shape == theirs.shape
    assert ours.shape[:2] == ((40, 64) if orientation < 5 else (64, 40))
    assert np.array_equal(ours, theirs)
    (h, w), notes = check_image(f)
    assert (h, w) == ours.shape[:2]
    assert (orientation != 1) == any("EXIF orientation" in n for n in notes)


def test_truncated_jpeg_is_decoded_and_left_unchanged(tmp_path):
    rng = np.random.default_rng(0)
    img = cv2.GaussianBlur((rng.random((96, 128, 3)) * 255).astype(np.uint8), (7, 7), 2)
    full = _jpeg_bytes(img)
    for cut in (2, len(full) // 3):  # only the end marker missing / two thirds missing
        f = tmp_path / f"t{cut}.jpg"
        f.write_bytes(full[:-cut])
        before = f.read_bytes()
        (h, w), notes = check_image(f)
        assert (h, w) == (96, 128)
        assert any("truncated JPEG" in n for n in notes)
        out = read_image(f)
        assert out.shape == (96, 128, 3)
        # the top rows decoded (close to the original), the file itself untouched
        assert np.abs(out[:16].astype(int) - img[:16]).mean() < 6
        assert f.read_bytes() == before


@pytest.mark.parametrize("name, content, reason", [
    ("empty.jpg", b"", "empty file"),
    ("garbage.jpg", b"\xff\xd8\xff\xe0 not really a jpeg" * 3, "corrupt"),
    ("garbage.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "corrupt"),
    ("anim.gif", b"GIF89a....", "unsupported image format"),
    ("noext", b"\x00\x01", "unsupported image format"),
])
def test_bad_images_raise_with_reason(tmp_path, name, content, reason):
    f = tmp_path / name
    f.write_bytes(content)
    with pytest.raises(BadImage, match=reason):
        check_image(f)


def test_too_small_and_missing(tmp_path):
    f = tmp_path / "tiny.png"
    cv2.imwrite(str(f), np.zeros((8, 50, 3), np.uint8))
    with pytest.raises(BadImage, match="too small"):
        check_image(f)
    with pytest.raises(BadImage, match="cannot read"):
        check_image(tmp_path / "absent.jpg")


def test_odd_path_and_grey_png(tmp_path):
    d = tmp_path / "dössier ü 画像"
    d.mkdir()
    f = d / "b w.png"
    grey = np.arange(60 * 70, dtype=np.uint32).reshape(60, 70) % 251
    cv2.imwrite(str(f), grey.astype(np.uint8))  # single-channel file
    img = read_image(f)
    assert img.shape == (60, 70, 3) and img.dtype == np.uint8
    assert np.array_equal(img[..., 0], grey.astype(np.uint8)) and np.array_equal(img[..., 0], img[..., 2])


def test_reduced_jpeg_decode_for_large_images(tmp_path):
    # validation: a JPEG >= 2x the size is decoded at 1/2, 1/4 or 1/8 scale, pixels close to a full decode +
    # INTER_AREA. Training: exactly the published full decode + INTER_LINEAR (its aliasing is part of the
    # training images). Sizes in both: the published int(side * r) truncation (900 * 320 / 1300 = 221.5 -> 221)
    from yolov9c.data.dataset import DatasetConfig, YoloDataset
    from yolov9c.data.images import jpeg_reduction

    assert [jpeg_reduction(n, 320) for n in (319, 639, 640, 1280, 2559, 2560, 9000)] == [1, 1, 2, 4, 4, 8, 8]
    yy, xx = np.mgrid[0:900, 0:1300]
    img = np.stack([(xx * 255 // 1299), (yy * 255 // 899), ((xx + yy) // 9) % 256], 2).astype(np.uint8)
    img = cv2.GaussianBlur(img, (0, 0), 3)
    d = tmp_path / "images"
    d.mkdir()
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "big.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    data = _with_exif(_jpeg_bytes(img), 6)  # turned: upright 1300 tall x 900 wide
    (d / "big.jpg").write_bytes(data)
    full = cv2.rotate(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION),
                      cv2.ROTATE_90_CLOCKWISE)
    for augment in (False, True):
        ds = YoloDataset(str(d), DatasetConfig(img_size=320, augment=augment, nc=1, label_cache=False),
                         log=lambda s: None)
        assert jpeg_reduction(int(ds.shapes[0].max()), 320) == 4
        out, hw0, hw = ds.load_image(0)
        assert hw0 == (1300, 900) and hw == (320, 221) and out.shape == (320, 221, 3)
        if augment:
            assert np.array_equal(out, cv2.resize(full, (221, 320), interpolation=cv2.INTER_LINEAR))
        else:
            ref = cv2.resize(full, (221, 320), interpolation=cv2.INTER_AREA)
            assert np.abs(out.astype(int) - ref).mean() < 3
