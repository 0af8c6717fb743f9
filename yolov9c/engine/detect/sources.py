"""Inference sources for detect_dual.py: image files, folders, globs, `.txt` lists and video files.

`resolve_sources(source)` turns the --source string into a sorted list of image and video files;
`MediaSource(files, imgsz, stride, auto, vid_stride)` yields one `Frame` per image or kept video frame,
letterboxed for the model (published detect semantics: minimal stride padding, `auto=True`).
Webcams, streams (rtsp/rtmp/http), URLs and `screen` need devices or a network this package does not use: they
raise SourceError with a clear message (the CLI exits with code 2).
A file unusable once the run has started (an empty, corrupt or unreadable image, a video that cannot be opened
or gives no frame) never stops the run: MediaSource skips it, hands one line `WARNING: image 2/5 path: reason,
skipped` to its `warn` callback and records (path, reason) in `failed`; the native decoders' own messages are
silenced while a file is opened, so that line is the only one.
Test: python -m pytest -q tests/engine/detect/test_detect_sources.py
"""

import glob
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from yolov9c.data.images import IMG_FORMATS, BadImage, read_image
from yolov9c.data.letterbox import letterbox

# the published video whitelist (dataloaders.py)
VID_FORMATS = ("asf", "avi", "gif", "m4v", "mkv", "mov", "mp4", "mpeg", "mpg", "ts", "wmv")

# the published guides' sample images (their data/images folder); yolov9c ships none of them
PUBLISHED_SAMPLES = ("horses.jpg",)
_STREAM_PREFIXES = ("rtsp://", "rtmp://", "http://", "https://", "tcp://", "udp://")


class SourceError(ValueError):
    """A --source that cannot be used; the message says why."""


def is_video_path(path):
    """True when the file name ends in one of VID_FORMATS (case-insensitive)."""
    return Path(path).suffix[1:].lower() in VID_FORMATS


def _media_in(folder):
    return sorted(str(p) for p in Path(folder).iterdir()
                  if p.is_file() and p.suffix[1:].lower() in IMG_FORMATS + VID_FORMATS)


def resolve_sources(source):
    """--source (str or Path) → sorted list of str paths of image/video files.

    Accepted: an image or video file; a folder (its images and videos, not recursive); a glob pattern
    (`*`, `?`, `[`); a `.txt` file holding one path per line (each itself a file, folder or glob; relative
    lines resolve against the .txt's folder). Raises SourceError for webcams (a digit), streams, URLs,
    `screen`, a missing path, or a source without any image/video file."""
    s = str(source).strip()
    low = s.lower()
    if s.isnumeric():
        raise SourceError(f"--source {s}: webcam input is not supported (no camera access in yolov9c); "
                          "pass image or video files, a folder, a glob or a .txt list")
    if low.startswith(_STREAM_PREFIXES):
        raise SourceError(f"--source {s}: streams and URLs are not supported (yolov9c reads local files only); "
                          "download the file first")
    if low.startswith("screen"):
        raise SourceError(f"--source {s}: screen capture is not supported; pass image or video files")
    p = Path(s).expanduser()
    if p.is_file() and p.suffix.lower() == ".txt":
        files = []
        for line in p.read_text().splitlines():
            line = line.strip()
            if line:
                q = Path(line).expanduser()
                files += resolve_sources(q if q.is_absolute() else p.parent / q)
        return files
    if any(c in s for c in "*?["):
        hits = sorted(h for h in glob.glob(os.path.expanduser(s), recursive=True) if os.path.isfile(h))
        files = [h for h in hits if Path(h).suffix[1:].lower() in IMG_FORMATS + VID_FORMATS]
        if not files:
            raise SourceError(f"--source {s}: the pattern matches no image or video file")
        return files
    if p.is_dir():
        files = _media_in(p)
        if not files:
            raise SourceError(f"--source {s}: the folder holds no image or video file "
                              f"(images: {', '.join(IMG_FORMATS)}; videos: {', '.join(VID_FORMATS)})")
        return files
    if p.is_file():
        if p.suffix[1:].lower() not in IMG_FORMATS + VID_FORMATS:
            raise SourceError(f"--source {s}: unsupported file type '{p.suffix or '(none)'}' "
                              f"(images: {', '.join(IMG_FORMATS)}; videos: {', '.join(VID_FORMATS)})")
        return [str(p)]
    raise SourceError(f"--source {s}: no such file or folder{_published_sample_hint(p)}")


def _published_sample_hint(p):
    """Where the published guides' sample image `p` comes from ('' for any other path), as README.md's FAQ says."""
    if p.name not in PUBLISHED_SAMPLES:
        return ""
    return (f"; {p.name} is the published guides' sample image, in the data/images folder of the published YOLOv9 "
            f"repository (https://github.com/WongKinYiu/yolov9): download it yourself (yolov9c downloads nothing)")


@contextmanager
def _quiet_opencv():
    """Silence the native decoders (libpng, libjpeg, FFmpeg: they write to file descriptor 2 themselves, and
    FFmpeg ignores OpenCV's log level once it is initialised) while a file is opened: the caller reports a
    failure itself, in one line. Only the opening is covered, nothing of ours is written inside."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (a detached process): nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@dataclass
class Frame:
    """One model input.

    path: the source file. img: (3, h, w) uint8 RGB, letterboxed (contiguous). img0: (H, W, 3) uint8 BGR,
    the original (annotations are drawn on it). index/count: position of the file among the sources (1-based).
    frame: 1-based number of this frame among the kept frames of a video (0 for an image); frames: how many
    frames the video will give (0 for an image). fps: the video's frame rate (0 for an image)."""
    path: str
    img: np.ndarray
    img0: np.ndarray
    index: int
    count: int
    frame: int = 0
    frames: int = 0
    fps: float = 0.0

    @property
    def is_video(self):
        return self.frames > 0 or self.frame > 0

    def describe(self):
        """The published log prefix: 'image 1/3 /p/a.jpg: ' or 'video 1/1 (2/30) /p/v.mp4: ' (kept frames)."""
        if self.is_video:
            return f"video {self.index}/{self.count} ({self.frame}/{self.frames}) {self.path}: "
        return f"image {self.index}/{self.count} {self.path}: "


class MediaSource:
    """Iterate over image and video files, yielding Frame objects.

    files: list of paths (from resolve_sources). imgsz: (h, w) model input size. stride: the model's largest
    stride (padding multiple). auto: pad only to a stride multiple (True for PyTorch models, as published).
    vid_stride: keep every vid_stride-th video frame (frames vid_stride, 2·vid_stride, …).
    warn: called with one line per file that is skipped (an image that cannot be read, a video that cannot
    be opened or gives no frame); `failed` then holds (path, reason) of each, in order, for the last pass."""

    def __init__(self, files, imgsz=(640, 640), stride=32, auto=True, vid_stride=1, warn=None):
        if int(vid_stride) < 1:
            raise SourceError(f"--vid-stride must be >= 1, got {vid_stride}")
        self.files = list(files)
        self.imgsz = (int(imgsz), int(imgsz)) if np.isscalar(imgsz) else tuple(int(v) for v in imgsz)
        self.stride = int(stride)
        self.auto = auto
        self.vid_stride = int(vid_stride)
        self.warn = warn or (lambda line: None)
        self.failed = []

    def __len__(self):
        return len(self.files)

    def _prepare(self, img0):
        img = letterbox(img0, self.imgsz, stride=self.stride, auto=self.auto)[0]
        return np.ascontiguousarray(img.transpose(2, 0, 1)[::-1])  # HWC BGR → CHW RGB

    def _skip(self, kind, i, n, path, reason):
        self.failed.append((path, reason))
        self.warn(f"WARNING: {kind} {i}/{n} {path}: {reason}, skipped")

    def __iter__(self):
        self.failed = []
        n = len(self.files)
        for i, path in enumerate(self.files, 1):
            if is_video_path(path):
                yield from self._video(path, i, n)
                continue
            try:
                with _quiet_opencv():
                    img0 = read_image(path)
            except BadImage as e:
                self._skip("image", i, n, path, str(e))
                continue
            yield Frame(path, self._prepare(img0), img0, i, n)

    def _video(self, path, i, n):
        with _quiet_opencv():
            cap = cv2.VideoCapture(str(path))
        if not cap.isOpened():
            cap.release()
            self._skip("video", i, n, path, "cannot open video (missing, empty, corrupt or an unknown codec)")
            return
        try:
            fps = cap.get(cv2.CAP_PROP_FPS) or 30.0
            frames = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) / self.vid_stride)
            k = grabbed = 0
            while True:
                ok = True
                for _ in range(self.vid_stride):  # skip vid_stride-1 frames without decoding them
                    ok = cap.grab()
                    if not ok:
                        break
                    grabbed += 1
                if not ok:
                    break
                ok, img0 = cap.retrieve()
                if not ok:
                    break
                k += 1
                yield Frame(path, self._prepare(img0), img0, i, n, k, max(frames, k), fps)
        finally:
            cap.release()
        if k == 0:
            reason = (f"{grabbed} frames, fewer than --vid-stride {self.vid_stride}: no frame kept"
                      if 0 < grabbed < self.vid_stride else "no frame could be decoded")
            self._skip("video", i, n, path, reason)
