"""Where the developers' shared folder (goldens, coco128) is: $YOLOV9C_SHARED, else `shared/` inside the
checkout (how the GPU machine receives it), else `../shared` beside the checkout (the development layout).

Used by the tests that read spec/goldens or data/coco128.
"""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _find_shared():
    if os.environ.get("YOLOV9C_SHARED"):
        return Path(os.environ["YOLOV9C_SHARED"]).resolve()
    inside = REPO / "shared"
    return inside if (inside / "spec").is_dir() else REPO.parent / "shared"


SHARED = _find_shared()
GOLDEN_DIR = SHARED / "spec" / "goldens"
COCO128 = SHARED / "data" / "coco128"
