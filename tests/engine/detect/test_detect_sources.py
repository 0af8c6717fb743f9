"""Detect sources (yolov9c/engine/detect/sources.py): which --source strings resolve to which files, the letterboxed
model input of images (shape, stride padding, RGB order), video frames with --vid-stride, and the errors for
webcams, streams, screens and missing or empty sources.

Run: python -m pytest -q tests/engine/detect/test_detect_sources.py
"""

import cv2
import numpy as np
import pytest

from yolov9c.engine.detect.sources import MediaSource, SourceError, resolve_sources


def _write_image(path, h, w, bgr=(0, 0, 255)):
    img = np.full((h, w, 3), bgr, np.uint8)
    cv2.imwrite(str(path), img)
    return img


def _write_video(path, n, h=48, w=64, fps=10):
    vw = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    assert vw.isOpened(), "OpenCV cannot write mp4v here"
    for i in range(n):
        vw.write(np.full((h, w, 3), 20 * i, np.uint8))
    vw.release()


@pytest.fixture
def media(tmp_path):
    d = tmp_path / "media"
    d.mkdir()
    _write_image(d / "b.jpg", 40, 60)
    _write_image(d / "a.png", 30, 30)
    _write_video(d / "clip.mp4", 5)
    (d / "notes.md").write_text("not media")
    return d


def test_folder_glob_file_and_txt_list(media, tmp_path):
    names = lambda files: [f.rsplit("/", 1)[1] for f in files]
    assert names(resolve_sources(media)) == ["a.png", "b.jpg", "clip.mp4"]  # sorted, non-media skipped
    assert names(resolve_sources(str(media / "*.jpg"))) == ["b.jpg"]
    assert names(resolve_sources(media / "a.png")) == ["a.png"]
    lst = tmp_path / "list.txt"
    lst.write_text(f"media/b.jpg\n\n{media / 'clip.mp4'}\nmedia/*.png\n")  # relative lines: against the .txt
    assert names(resolve_sources(lst)) == ["b.jpg", "clip.mp4", "a.png"]


@pytest.mark.parametrize("source, words", [
    ("0", "webcam"), ("rtsp://host/stream", "streams"), ("https://x.org/a.jpg", "URL"),
    ("screen 0", "screen"), ("/no/such/place", "no such file"), ("/no/such/*.jpg", "matches no"),
])
def test_unsupported_or_missing_sources_say_why(source, words):
    with pytest.raises(SourceError, match=words):
        resolve_sources(source)


def test_empty_folder_and_wrong_type(tmp_path):
    with pytest.raises(SourceError, match="holds no image or video"):
        resolve_sources(tmp_path)
    f = tmp_path / "x.md"
    f.write_text("x")
    with pytest.raises(SourceError, match="unsupported file type"):
        resolve_sources(f)


def test_image_letterbox_is_minimal_stride_padding_rgb(media):
    frames = list(MediaSource([str(media / "b.jpg")], imgsz=(160, 160), stride=32, auto=True))
    assert len(frames) == 1
    fr = frames[0]
    # 40x60 → scale 160/60: 107x160 (h, w) → height padded to the next multiple of 32: 128
    assert fr.img.shape == (3, 128, 160) and fr.img.dtype == np.uint8 and fr.img.flags["C_CONTIGUOUS"]
    assert fr.img0.shape == (40, 60, 3)
    centre = fr.img[:, 64, 80]
    assert centre[0] > 240 and centre[2] < 15  # red in BGR file → channel 0 of the RGB input
    assert tuple(fr.img[:, 0, 80]) == (114, 114, 114)  # grey padding on top
    assert not fr.is_video and fr.describe().startswith("image 1/1 ")


@pytest.mark.parametrize("vid_stride, expect", [(1, 5), (2, 2), (3, 1)])
def test_video_frames_with_vid_stride(media, vid_stride, expect):
    frames = list(MediaSource([str(media / "clip.mp4")], imgsz=64, stride=32, vid_stride=vid_stride))
    assert [f.frame for f in frames] == list(range(1, expect + 1))
    assert all(f.is_video and f.img.shape == (3, 64, 64) for f in frames)
    # kept frames are numbers vid_stride, 2·vid_stride, …: frame k was written with grey level 20·(k-1)
    levels = [int(np.median(f.img0)) for f in frames]
    want = [20 * (vid_stride * (k + 1) - 1) for k in range(expect)]
    assert all(abs(a - b) <= 3 for a, b in zip(levels, want)), (levels, want)
    assert frames[0].describe().startswith(f"video 1/1 (1/{expect}) ")  # the published wording


def test_bad_vid_stride_raises():
    with pytest.raises(SourceError, match="vid-stride"):
        MediaSource([], vid_stride=0)


def _bad_files(d):
    """An empty file, a garbage file with a .jpg name, a PNG cut in half, a garbage .mp4: name → reason."""
    (d / "empty.jpg").write_bytes(b"")
    (d / "garbage.jpg").write_bytes(b"not a jpeg at all" * 10)
    ok, buf = cv2.imencode(".png", np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8))
    (d / "half.png").write_bytes(buf.tobytes()[:len(buf) // 2])
    (d / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(200))
    return {"empty.jpg": "empty file", "garbage.jpg": "corrupt image (does not decode)",
            "half.png": "corrupt image (does not decode)", "broken.mp4": "cannot open video"}


def test_unreadable_files_are_skipped_with_one_warning_each(tmp_path, capfd):
    d = tmp_path / "mixed"
    d.mkdir()
    reasons = _bad_files(d)
    _write_image(d / "good1.jpg", 40, 60)
    _write_image(d / "good2.png", 30, 30)
    _write_video(d / "good3.mp4", 3)
    # bad files first, between and last: [broken.mp4, empty.jpg, garbage.jpg, good1, good2, good3, half.png]
    files = resolve_sources(d)
    warnings = []
    src = MediaSource(files, imgsz=64, stride=32, warn=warnings.append)
    frames = list(src)
    assert [(f.path.split("/")[-1], f.frame) for f in frames] == [
        ("good1.jpg", 0), ("good2.png", 0), ("good3.mp4", 1), ("good3.mp4", 2), ("good3.mp4", 3)]
    assert [p.split("/")[-1] for p, _ in src.failed] == ["broken.mp4", "empty.jpg", "garbage.jpg", "half.png"]
    assert len(warnings) == 4
    for (path, reason), line in zip(src.failed, warnings):
        name = path.split("/")[-1]
        assert reason.startswith(reasons[name]), (name, reason)
        kind = "video" if name.endswith(".mp4") else "image"
        assert line == f"WARNING: {kind} {files.index(path) + 1}/7 {path}: {reason}, skipped"
    # OpenCV's own complaints about the broken files are silenced: the warning lines are the only report
    captured = capfd.readouterr()
    assert "grfmt" not in captured.err and "moov" not in captured.err and "libpng" not in captured.err.lower()
    # a second pass starts a fresh list
    list(src)
    assert len(src.failed) == 4 and len(warnings) == 8


def test_video_shorter_than_vid_stride_is_reported(media):
    warnings = []
    src = MediaSource([str(media / "clip.mp4")], imgsz=64, vid_stride=9, warn=warnings.append)
    assert list(src) == []
    assert src.failed == [(str(media / "clip.mp4"), "5 frames, fewer than --vid-stride 9: no frame kept")]
