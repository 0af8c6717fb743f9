"""The image files of a split: folders, `.txt` lists of image paths, or lists of both (published rules).

- a folder: every entry under it (recursively) named as an image, whatever it is (a dangling link, a folder
  `x.jpg`, a FIFO: kept for the scan to report, data/regular_file.py); other files are ignored, and images in
  a format training does not read (.gif, .heic, ...: OTHER_IMAGE_FORMATS) are returned in `ignored` so that the
  caller warns once, naming them (the published formats list has no gif either);
- any other file not named as an image (`train.txt`, `train.list`, as published): one image path per line;
  `./x` and other relative lines are relative to the list's folder (a line that exists only relative to the
  current folder is still accepted); a listed non-image is reported by the scan, not dropped. Decoded as label
  files are (UTF-8, BOM or not; UTF-16 with BOM); another encoding raises ImageListError naming the list;
- a single image file.

Test: python -m pytest -q tests/data/test_data_yaml.py
"""

import os
from pathlib import Path

from yolov9c.data.images import IMG_FORMATS, is_image_path

# image formats a folder may hold that training does not read (not in IMG_FORMATS, as published)
OTHER_IMAGE_FORMATS = ("gif", "heic", "heif", "avif", "jfif", "jxl", "jp2", "svg", "ico", "ppm", "pgm", "pbm",
                       "exr", "hdr")


class ImageListError(ValueError):
    """A `.txt` list of images that cannot be read; the message names the file."""


def is_image_list(path):
    """True for a file given as a split that is a list of image paths: any file not named as an image (the
    published code reads every file source as a list)."""
    p = Path(path)
    return p.is_file() and not is_image_path(p) and p.suffix[1:].lower() not in OTHER_IMAGE_FORMATS


def _list_text(path):
    data = path.read_bytes()
    try:
        if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
            return data.decode("utf-16")
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ImageListError(f"{path}: not a UTF-8 text file (byte {e.start}: {data[e.start:e.start + 4]!r}); "
                             f"save the list as UTF-8") from None


def ignored_images_line(ignored, examples=3):
    """The one warning line for the images collect_image_files ignored ('' when none)."""
    if not ignored:
        return ""
    n = len(ignored)
    more = f" and {n - examples} more" if n > examples else ""
    return (f"WARNING: {n} image file{'s' * (n > 1)} ignored, in a format training does not read "
            f"(accepted: {', '.join(IMG_FORMATS)}): {', '.join(sorted(ignored)[:examples])}{more}")


def collect_image_files(sources, ignored=None):
    """Sorted unique list of str paths from `sources` (a path or a list of paths). Raises FileNotFoundError
    naming the source for one that does not exist, ImageListError for a list that does not decode. `ignored` (a list): receives the folders' image files in
    OTHER_IMAGE_FORMATS (str paths). Test: tests/data/test_data_yaml.py::test_gif_in_a_folder_is_named_once."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    files = []
    for src in sources:
        p = Path(src).expanduser()
        if p.is_dir():
            for f in p.rglob("*"):
                if is_image_path(f):  # a file or not: the scan reads regular files only and reports the rest
                    files.append(str(f))
                elif ignored is not None and f.suffix[1:].lower() in OTHER_IMAGE_FORMATS:
                    ignored.append(str(f))
        elif is_image_list(p):
            parent = p.parent
            for line in _list_text(p).splitlines():
                line = line.strip()
                if not line:
                    continue
                q = Path(line)
                if not q.is_absolute():
                    r = parent / (line[2:] if line.startswith("./") else line)
                    q = r if (r.exists() or line.startswith("./") or not q.exists()) else q
                files.append(str(q))
        elif p.is_file():
            files.append(str(p))
        else:
            raise FileNotFoundError(f"{src} does not exist")
    return sorted(set(files))
