"""Where the developers' shared folder (goldens, coco128) is, first match wins:
$YOLOV9C_SHARED; `shared/` inside the checkout (how the GPU machine receives it); `../shared` beside the
checkout (the development layout); `../shared` beside the repository this one was cloned from (a CI clone
in /tmp, whose `origin` is the developers' checkout).

Used by the tests that read spec/goldens or data/coco128. Missing everywhere → those tests fail and name the
places looked at (they never skip: the goldens are part of CI).
"""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _origin_sibling():
    try:
        url = subprocess.run(["git", "-C", str(REPO), "config", "--get", "remote.origin.url"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    url = url[len("file://"):] if url.startswith("file://") else url
    return Path(url).resolve().parent / "shared" if url and Path(url).is_dir() else None


def _find_shared():
    if os.environ.get("YOLOV9C_SHARED"):
        return Path(os.environ["YOLOV9C_SHARED"]).resolve()
    candidates = [REPO / "shared", REPO.parent / "shared", _origin_sibling()]
    for c in candidates:
        if c is not None and (c / "spec" / "goldens").is_dir():
            return c
    looked = ", ".join(str(c) for c in candidates if c is not None)
    return Path(f"<shared folder not found; looked at {looked}; set YOLOV9C_SHARED>")


SHARED = _find_shared()
GOLDEN_DIR = SHARED / "spec" / "goldens"
COCO128 = SHARED / "data" / "coco128"
