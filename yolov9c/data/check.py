"""check-data: scan the splits of a dataset without training, print the bad-file lines, the images without
a label file ("missing") and the label files without an image ("orphan"), each split's summary, and say
whether the data is usable. Missing and orphan files are reported, not errors: a missing label file makes a
background image, an orphan is not used.

Exit codes (of check_data and `python -m yolov9c check-data`): 0 usable; 1 when a split has no usable image
(or the train split has no label at all: nothing to learn); 2 for a dataset yaml that cannot be read (a
missing file or path, nc/names mismatch: the message names the key). A test split not on disk is one line,
not an error: training never reads it (as published).

Test: python -m pytest -q tests/data/test_check.py
"""

from yolov9c.data.dataset_yaml import DataConfigError, load_data_config
from yolov9c.data.image_list import ImageListError, collect_image_files, ignored_images_line
from yolov9c.data.scan import scan_split

EXIT_OK, EXIT_UNUSABLE, EXIT_CONFIG = 0, 1, 2


def check_data(data, label_cache=True, cache_dir=None, log=print, err=print):
    """Scan train, val (and test when given) of dataset `data` (yaml path, dict, 'synthetic[:SEED]' or None).
    Lines go through `log`, errors through `err`. Returns the exit code."""
    try:
        cfg = load_data_config(data, cache_dir=cache_dir, splits=("train", "val"), log=log)
    except DataConfigError as e:
        err(f"error: {e}")
        return EXIT_CONFIG
    src = cfg["yaml_file"] or "synthetic"
    log(f"data: {src} (root {cfg['path']}), nc={cfg['nc']}: {', '.join(cfg['names'][:10])}"
        f"{', …' if cfg['nc'] > 10 else ''}")
    code = EXIT_OK
    for split in ("train", "val", "test"):
        if not cfg[split]:
            continue
        prefix = f"{split}: "
        ignored = []
        try:
            files = collect_image_files(cfg[split], ignored)
        except FileNotFoundError as e:
            if split != "test":
                err(f"error: {prefix}{e}")
                return EXIT_CONFIG
            log(f"{prefix}{e}: not checked (training does not read it; val_dual.py --task test does)")
            continue
        except ImageListError as e:
            err(f"error: {prefix}{e}")
            return EXIT_CONFIG
        if ignored:
            log(f"{prefix}{ignored_images_line(ignored)}")
        res = scan_split(files, cfg["nc"], sources=cfg[split], use_cache=label_cache, log=log, prefix=prefix)
        if res.n_images == 0:
            log(f"{prefix}no usable image: this split cannot be used")
            code = EXIT_UNUSABLE
        elif split == "train" and res.n_images == res.n_backgrounds:
            none = len(res.missing) == res.n_images
            why = " (no image has a label file: see the missing line above)" if none else ""
            log(f"{prefix}no labels at all: cannot train on this split{why}")
            code = EXIT_UNUSABLE
        else:
            n_boxes = sum(len(lb) for lb in res.labels)
            log(f"{prefix}{n_boxes} boxes in {res.n_images - res.n_backgrounds} labelled images")
    log("data usable" if code == EXIT_OK else "data NOT usable")
    return code
