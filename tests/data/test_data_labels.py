"""Label files and the split scan (yolov9c/data/labels.py, scan.py): every bad-file class of issue 3 built
here, its `path: reason` line, the summary counts, and that valid labels are never dropped silently.

Run: python -m pytest -q tests/data/test_data_labels.py
"""

import cv2
import numpy as np
import pytest

from yolov9c.data.image_list import collect_image_files
from yolov9c.data.labels import BadLabels, parse_label_file
from yolov9c.data.scan import scan_split


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, reason", [
    ("0 0.5 0.5 0.2\n", "4 columns"),
    ("0 0.5 0.5 0.2 0.2 0.3\n", "6 columns"),
    ("0 0.1 0.1 0.5 0.1 0.5 0.5 0.9\n", "8 columns"),
    ("0 0.5 abc 0.2 0.2\n", "non-numeric"),
    ("0 0.5 nan 0.2 0.2\n", "non-finite"),
    ("0 1.2 0.5 0.2 0.2\n", "outside \\[0, 1\\]"),
    ("0 0.5 0.5 -0.1 0.2\n", "outside \\[0, 1\\]"),
    ("7 0.5 0.5 0.2 0.2\n", "class 7 >= nc \\(5\\)"),
    ("-1 0.5 0.5 0.2 0.2\n", "not a non-negative integer"),
    ("1.5 0.5 0.5 0.2 0.2\n", "not a non-negative integer"),
])
def test_bad_label_rows(tmp_path, text, reason):
    f = _write(tmp_path / "a.txt", "1 0.5 0.5 0.1 0.1\n" + text)
    with pytest.raises(BadLabels, match=reason) as e:
        parse_label_file(f, nc=5)
    assert "line 2" in str(e.value)


def test_good_boxes_polygons_duplicates(tmp_path):
    f = _write(tmp_path / "a.txt",
               "2 0.5 0.5 0.2 0.4\n"
               "  \n"
               "2 0.5 0.5 0.2 0.4\n"               # duplicate: removed with a note
               "1.0 0.1 0.1 0.3 0.1 0.2 0.4\n"     # polygon, class written as a float
               "0 0.9 0.9 0.2 0.2\n"               # box reaching past the border: allowed, as published
               "3 1.0000004 0.5 0.1 0.1\n")        # float printing overshoot within 1e-6: clipped
    labels, segments, notes = parse_label_file(f, nc=4)
    assert labels.dtype == np.float32 and labels.shape == (4, 5)
    assert notes == ["1 duplicate label rows removed"]
    np.testing.assert_allclose(labels[0], [2, 0.5, 0.5, 0.2, 0.4], atol=1e-7)
    np.testing.assert_allclose(labels[1], [1, 0.2, 0.25, 0.2, 0.3], atol=1e-6)  # bounds of the polygon
    assert labels[3, 1] == 1.0
    # segments aligned with rows: the polygon as written, box rows as their rectangles
    assert len(segments) == 4
    np.testing.assert_allclose(segments[1], [[0.1, 0.1], [0.3, 0.1], [0.2, 0.4]], atol=1e-7)
    np.testing.assert_allclose(segments[0], [[0.4, 0.3], [0.6, 0.3], [0.6, 0.7], [0.4, 0.7]], atol=1e-6)


def test_missing_and_empty_are_background(tmp_path):
    for f in (tmp_path / "none.txt", _write(tmp_path / "empty.txt", "\n \n")):
        labels, segments, notes = parse_label_file(f, nc=3)
        assert labels.shape == (0, 5) and segments == [] and notes == []


def _img(path, h=48, w=64, value=100):
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((h, w, 3), value, np.uint8))
    return path


def test_scan_reports_every_bad_file_and_counts(tmp_path):
    im, lb = tmp_path / "images", tmp_path / "labels"
    for i in range(3):
        _img(im / f"good{i}.jpg")
    for i in range(3):
        _write(lb / f"good{i}.txt", f"{i} 0.5 0.5 0.25 0.25\n0 0.2 0.2 0.1 0.1\n")
    _img(im / "bg_missing.jpg")                      # no label file: background
    _img(im / "bg_empty.jpg")
    _write(lb / "bg_empty.txt", "")                  # empty label file: background
    _img(im / "dup.jpg")
    _write(lb / "dup.txt", "1 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2\n")
    _img(im / "badcls.jpg")
    _write(lb / "badcls.txt", "9 0.5 0.5 0.2 0.2\n")
    _img(im / "badcol.jpg")
    _write(lb / "badcol.txt", "1 0.5 0.5\n")
    (im / "empty.jpg").write_bytes(b"")
    (im / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(50))
    ok, buf = cv2.imencode(".jpg", np.full((40, 40, 3), 200, np.uint8))
    (im / "trunc.jpg").write_bytes(buf.tobytes()[:-2])
    _write(lb / "trunc.txt", "2 0.5 0.5 0.5 0.5\n")
    _img(im / "tiny.png", h=5, w=5)
    (tmp_path / "list.txt").write_text("\n".join(sorted(str(p) for p in im.iterdir())) + f"\n{im}/doc.pdf\n")
    (im / "doc.pdf").write_bytes(b"%PDF-1.4")

    lines = []
    files = collect_image_files(tmp_path / "list.txt")
    res = scan_split(files, nc=3, sources=str(tmp_path / "list.txt"), log=lines.append, prefix="train: ")
    out = "\n".join(lines)
    # usable: 3 good, 2 backgrounds, dup, trunc; skipped: badcls, badcol, empty, corrupt, tiny, pdf
    assert lines[-1] == "train: 7 images, 2 backgrounds, 6 corrupt, 1 missing"
    assert (res.n_images, res.n_backgrounds, res.n_corrupt) == (7, 2, 6)
    assert res.missing == [str(im / "bg_missing.jpg")] and res.orphans == []
    for name, reason in [("badcls.txt", "class 9 >= nc (3)"), ("badcol.txt", "3 columns"),
                         ("empty.jpg", "empty file"), ("corrupt.png", "corrupt image"),
                         ("tiny.png", "too small"), ("doc.pdf", "unsupported image format"),
                         ("dup.txt", "1 duplicate label rows removed"), ("trunc.jpg", "truncated JPEG")]:
        hit = [ln for ln in lines if ln.startswith("train: ") and name + ": " in ln]
        assert len(hit) == 1, (name, out)
        assert reason in hit[0], hit[0]
    # one line per bad file, plus one per warning, plus the missing line, plus the summary
    assert len(lines) == 6 + 2 + 1 + 1
    assert lines[-2] == (f"train: 1 image without a label file (missing, used as background), "
                         f"e.g. {im / 'bg_missing.jpg'} (no {lb / 'bg_missing.txt'})")
    # every valid label kept: 2 per good image, 1 from dup, 1 from trunc
    assert sum(len(x) for x in res.labels) == 3 * 2 + 1 + 1
    assert sorted(str(p.name) for p in map(__import__("pathlib").Path, res.im_files)) == sorted(
        ["good0.jpg", "good1.jpg", "good2.jpg", "bg_missing.jpg", "bg_empty.jpg", "dup.jpg", "trunc.jpg"])


BOM = b"\xef\xbb\xbf"


def test_bom_and_crlf_file_is_read_like_plain_utf8(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"0 0.5 0.5 0.2 0.4\n3 0.1 0.1 0.3 0.1 0.2 0.4\n")
    bom = tmp_path / "bom.txt"
    bom.write_bytes(BOM + b"0 0.5 0.5 0.2 0.4\r\n3 0.1 0.1 0.3 0.1 0.2 0.4\r\n")  # as Notepad saves it
    a, b = parse_label_file(plain, nc=4), parse_label_file(bom, nc=4)
    assert a[0].shape == (2, 5) and np.array_equal(a[0], b[0]) and a[2] == b[2] == []
    assert all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))
    u16 = tmp_path / "u16.txt"  # Notepad's "Unicode": UTF-16 LE with its BOM
    u16.write_bytes("0 0.5 0.5 0.2 0.4\r\n3 0.1 0.1 0.3 0.1 0.2 0.4\r\n".encode("utf-16"))
    assert np.array_equal(parse_label_file(u16, nc=4)[0], a[0])


@pytest.mark.parametrize("data", [BOM, BOM + b"\r\n", BOM + b"  \r\n\r\n"])
def test_bom_only_file_is_a_background(tmp_path, data):
    f = tmp_path / "a.txt"
    f.write_bytes(data)
    labels, segments, notes = parse_label_file(f, nc=3)
    assert labels.shape == (0, 5) and segments == [] and notes == []


@pytest.mark.parametrize("data, words", [
    (BOM + b"0 0.5 0.5 0.2 0.2\r\n1 0.5 0.5 0.2\r\n", ["line 2", "4 columns", "'1 0.5 0.5 0.2'"]),
    (BOM + b"0 0.5 0.5 0.2 0.2\r\n1 0.5 O.5 0.2 0.2\r\n", ["line 2", "non-numeric value 'O.5'",
                                                           "'1 0.5 O.5 0.2 0.2'"]),
    # a second BOM inside the file (two files concatenated): the escape shows the invisible character
    (BOM + b"0 0.5 0.5 0.2 0.2\n" + BOM + b"1 0.5 0.5 0.2 0.2\n", ["line 2", "'\\ufeff1'"]),
    (b"0 0.5 0.5 0.2 0.2\n\xff\xfe\x00junk\n", ["not a UTF-8 text file"]),
    (BOM + b"4 0.5 0.5 0.2 0.2\r\n", ["line 1", "class 4 >= nc (3)", "'4 0.5 0.5 0.2 0.2'"]),
])
def test_bad_row_messages_name_the_line_and_quote_it(tmp_path, data, words):
    f = tmp_path / "a.txt"
    f.write_bytes(data)
    with pytest.raises(BadLabels) as e:
        parse_label_file(f, nc=3)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def _pairing_dataset(root, n_good=2, missing=(), orphans=(), empty=()):
    """images/train + labels/train: n_good labelled images, images without a label file (`missing`),
    with an empty label file (`empty`), and label files without an image (`orphans`)."""
    im, lb = root / "images" / "train", root / "labels" / "train"
    for i in range(n_good):
        _img(im / f"g{i}.jpg")
        _write(lb / f"g{i}.txt", "0 0.5 0.5 0.2 0.2\n")
    for name in missing:
        _img(im / f"{name}.jpg")
    for name in empty:
        _img(im / f"{name}.png")
        _write(lb / f"{name}.txt", "")
    for name in orphans:
        _write(lb / f"{name}.txt", "1 0.5 0.5 0.2 0.2\n")
    return im, lb


def _scan_lines(sources, nc=2, use_cache=False):
    lines = []
    res = scan_split(collect_image_files(sources), nc, sources=sources, use_cache=use_cache, log=lines.append,
                     prefix="train: ")
    return res, lines


def test_missing_orphan_and_empty_are_counted_apart_with_examples(tmp_path):
    im, lb = _pairing_dataset(tmp_path, missing=["m0", "m1", "m2", "m3"], orphans=["o0", "o1"], empty=["e0"])
    res, lines = _scan_lines(str(im))
    assert lines[-1] == "train: 7 images, 5 backgrounds, 0 corrupt, 4 missing, 2 orphan"
    assert res.missing == [str(im / f"m{i}.jpg") for i in range(4)]
    assert res.orphans == [str(lb / "o0.txt"), str(lb / "o1.txt")]
    miss = [ln for ln in lines if "without a label file" in ln]
    orph = [ln for ln in lines if "without an image" in ln]
    assert len(miss) == len(orph) == 1 and len(lines) == 3
    # up to 3 examples, the first with the label path that was looked for
    assert miss[0] == (f"train: 4 images without a label file (missing, used as backgrounds), e.g. "
                       f"{im / 'm0.jpg'} (no {lb / 'm0.txt'}), {im / 'm1.jpg'}, {im / 'm2.jpg'}")
    assert orph[0] == f"train: 2 label files without an image (orphan, not used), e.g. {lb / 'o0.txt'}, {lb / 'o1.txt'}"
    # orphans never reach training; empty and missing are backgrounds
    assert str(lb / "o0.txt") not in res.label_files and res.n_backgrounds == 4 + 1


def test_clean_split_prints_the_published_line_only(tmp_path):
    im, _ = _pairing_dataset(tmp_path, empty=["e0"])
    res, lines = _scan_lines(str(im))
    assert lines == ["train: 3 images, 1 backgrounds, 0 corrupt"] and res.missing == res.orphans == []


def test_list_of_some_images_makes_no_orphans_and_skips_its_own_txt(tmp_path):
    # a .txt list naming only g0: the labels of g1 (an image on disk, not in this split) are not orphans;
    # images beside their labels (no images/ folder): the list file itself is no orphan either
    im, lb = _pairing_dataset(tmp_path, orphans=["o0"])
    lst = tmp_path / "part.txt"
    lst.write_text(f"{im / 'g0.jpg'}\n")
    res, lines = _scan_lines(str(lst))
    assert res.orphans == [str(lb / "o0.txt")] and lines[-1] == "train: 1 images, 0 backgrounds, 0 corrupt, 1 orphan"
    flat = tmp_path / "flat"
    _img(flat / "a.jpg")
    _write(flat / "a.txt", "0 0.5 0.5 0.2 0.2\n")
    _write(flat / "stray.txt", "0 0.5 0.5 0.2 0.2\n")
    (flat / "list.txt").write_text("a.jpg\n")
    res, _ = _scan_lines(str(flat / "list.txt"))
    assert res.orphans == [str(flat / "stray.txt")] and res.n_images == 1 and res.missing == []


def test_missing_and_orphan_found_again_when_the_cache_is_used(tmp_path):
    im, lb = _pairing_dataset(tmp_path, missing=["m0"])
    first, _ = _scan_lines(str(im), use_cache=True)
    assert not first.from_cache and first.missing == [str(im / "m0.jpg")] and first.orphans == []
    _write(lb / "late_orphan.txt", "0 0.5 0.5 0.2 0.2\n")  # not in the cache key: the cache stays valid
    again, lines = _scan_lines(str(im), use_cache=True)
    assert again.from_cache and again.missing == first.missing and again.orphans == [str(lb / "late_orphan.txt")]
    assert lines[-1].startswith("train: 3 images, 1 backgrounds, 0 corrupt, 1 missing, 1 orphan")


def test_zero_size_boxes_keep_their_image(tmp_path):
    """As published: a zero-width box and a zero-size polygon keep the image and every row; a note says so
    (mosaic and random_perspective's box filter drop them from the training samples)."""
    f = _write(tmp_path / "a.txt", "1 0.5 0.5 0.1 0.1\n0 0.5 0.5 0 0.1\n2 0.2 0.2 0.2 0.2 0.2 0.2\n")
    labels, segments, notes = parse_label_file(f, nc=5)
    assert labels.shape == (3, 5)
    assert labels[1, 3] == 0 and labels[2, 3] == 0 and labels[2, 4] == 0
    assert len(segments) == 3
    assert notes == ["2 zero-size boxes kept, as published (training's augmentations drop them; validation "
                     "counts each as an object no detection can match)"]


def test_libjpeg_corrupt_data_line_names_the_file(tmp_path, capfd):
    # libjpeg prints "Corrupt JPEG data: premature end of data segment" to fd 2 without a file name; the scan
    # names the file in a warning (kept in the label cache) and the bare line does not reach the terminal
    im, lb = _pairing_dataset(tmp_path, n_good=3)
    ok, buf = cv2.imencode(".jpg", (np.random.default_rng(0).random((48, 64, 3)) * 255).astype(np.uint8))
    data = buf.tobytes()
    (im / "g1.jpg").write_bytes(data[:len(data) // 2] + b"\xff\xd9")  # entropy data cut short, end marker kept
    capfd.readouterr()
    res, lines = _scan_lines(str(im), use_cache=True)
    err = capfd.readouterr().err
    named = [ln for ln in lines if "Corrupt JPEG data" in ln]
    assert len(named) == 1 and named[0].startswith(f"train: {im / 'g1.jpg'}: libjpeg: Corrupt JPEG data"), lines
    assert res.n_images == 3 and res.n_warnings == 1 and "Corrupt JPEG data" not in err
    again, lines = _scan_lines(str(im), use_cache=True)
    assert again.from_cache and [ln for ln in lines if "Corrupt JPEG data" in ln] == named
