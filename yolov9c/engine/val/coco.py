"""COCO-JSON predictions and COCO's own evaluator for val_dual.py --save-json.

    is_coco, anno_json, class_map, image_ids = coco_layout(cfg, split_paths)   # then json_rows, coco_evaluate

As published, a dataset is COCO when its val list's path ends in `val2017.txt`, whatever its folder: predictions
then use COCO's 91 category ids (the 80 classes skip 12, 26, 29, 30, 45, 66, 68, 69, 71, 83) and the evaluated
image ids are the numeric stems of every val image (images without predictions count as misses). Otherwise the
class index is the category id and COCO evaluates every image of the annotations file
(`<path>/annotations/instances_val2017.json`). Without annotations or without pycocotools / faster-coco-eval the
predictions are still written and a message says why COCO's numbers are absent.
One row: {"image_id": int stem (or the stem string), "category_id": int, "bbox": [x, y, w, h] top-left corner
in original-image pixels rounded to 3 decimals, "score": rounded to 5 decimals}.
Test: python -m pytest -q tests/engine/val/test_coco.py
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

# category ids of COCO's annotation files that no training class uses
_COCO91_UNUSED = frozenset({12, 26, 29, 30, 45, 66, 68, 69, 71, 83})


def coco80_to_coco91():
    """Class index 0..79 → COCO category id (1..90): a list of 80 ints."""
    return [i for i in range(1, 91) if i not in _COCO91_UNUSED]


def image_id(path):
    """The COCO image id of an image file: its stem as an int when numeric (000000000139.jpg → 139), else the
    stem itself (as published)."""
    stem = Path(path).stem
    return int(stem) if stem.isnumeric() else stem


def is_coco_val(val_paths):
    """True when the val split is COCO's: one path ending in val2017.txt, in whatever folder (the published
    val_dual.py and train_dual.py test `data['val'].endswith('val2017.txt')`)."""
    return len(val_paths) == 1 and str(val_paths[0]).endswith("val2017.txt")


def coco_layout(cfg, val_paths, im_files=()):
    """(is_coco, anno_json Path, class_map list or None, image ids list or None) for a resolved data config
    (yolov9c.data.dataset_yaml.load_data_config) and the split being validated; im_files: the loader's images
    (their ids restrict COCO's evaluation when the data is COCO)."""
    coco = is_coco_val(val_paths)
    anno = Path(cfg["path"]) / "annotations" / "instances_val2017.json"
    if not coco:
        return False, anno, None, None
    return True, anno, coco80_to_coco91(), [image_id(f) for f in im_files]


def json_rows(predn, path, class_map=None):
    """COCO result rows of one image. predn: (n, 6) tensor [x1, y1, x2, y2, conf, cls] in original-image
    pixels; class_map: class index → category id (None: the index itself)."""
    iid = image_id(path)
    rows = []
    for x1, y1, x2, y2, conf, cls in predn.tolist():
        c = int(cls)
        rows.append({"image_id": iid, "category_id": class_map[c] if class_map is not None else c,
                     "bbox": [round(x1, 3), round(y1, 3), round(x2 - x1, 3), round(y2 - y1, 3)],
                     "score": round(conf, 5)})
    return rows


def _evaluator():
    """(COCO, COCOeval) classes of pycocotools, else faster-coco-eval, else None."""
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
        return COCO, COCOeval
    except ImportError:
        pass
    try:
        from faster_coco_eval import COCO
        from faster_coco_eval import COCOeval_faster as COCOeval
        return COCO, COCOeval
    except ImportError:
        return None


def coco_evaluate(pred_json, anno_json, image_ids=None, log=print):
    """Evaluate a predictions file with COCO's evaluator. Returns the 12 COCOeval stats (list of float: [0] is
    mAP@0.5:0.95, [1] mAP@0.5, ...) or None after logging why they could not be computed. image_ids: restrict
    the evaluation to these images (None: every image of the annotations)."""
    tools = _evaluator()
    if tools is None:
        log(f"--save-json: predictions saved to {pred_json}; COCO evaluation skipped: install pycocotools or "
            "faster-coco-eval to get COCO's mAP")
        return None
    anno_json = Path(anno_json)
    if not anno_json.is_file():
        log(f"--save-json: predictions saved to {pred_json}; COCO evaluation skipped: annotations not found: "
            f"{anno_json} (COCO's evaluator needs <path>/annotations/instances_val2017.json)")
        return None
    COCO, COCOeval = tools
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):  # pycocotools prints; route it through log
            anno = COCO(str(anno_json))
            pred = anno.loadRes(str(pred_json))
            ev = COCOeval(anno, pred, "bbox")
            if image_ids:
                ev.params.imgIds = list(image_ids)
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
    except Exception as e:  # noqa: BLE001 - a malformed annotations file must not end a validation
        log(f"--save-json: COCO evaluation failed: {type(e).__name__}: {e}")
        return None
    log("\nEvaluating pycocotools mAP... saving " + str(pred_json) + "\n" +
        "\n".join(line for line in out.getvalue().splitlines() if line.startswith(" Average")))
    return [float(s) for s in ev.stats]
