"""Augmentation hyper-parameters: the hyp file (published keys and meaning) and the CLI overrides.

`--mosaic P` and `--mixup P` given on the command line win over the hyp file's `mosaic` and `mixup`.

Test: python -m pytest -q tests/data/test_dataset.py -k hyp
"""

from yolov9c.resources import AUGMENT_KEYS, check_hyp, load_hyp


def augment_hyp(hyp=None, mosaic=None, mixup=None, log=print):
    """hyp: None (configs/hyps/hyp.scratch-high.yaml), a yaml path or a dict. mosaic/mixup: CLI values
    (None = not given). Returns a new dict; raises KeyError naming the keys the pipeline needs that are
    missing, ValueError for a value that is not a number in its range (resources.check_hyp: a probability
    outside [0, 1], ...; a file's values name the file and line). A file's key no one reads: a warning
    through `log` (resources.load_hyp)."""
    hyp = load_hyp(hyp, log)
    if mosaic is not None:
        hyp["mosaic"] = float(mosaic)
    if mixup is not None:
        hyp["mixup"] = float(mixup)
    missing = [k for k in AUGMENT_KEYS if k not in hyp]
    if missing:
        raise KeyError(f"hyp lacks augmentation keys: {', '.join(missing)}")
    return check_hyp(hyp)
