"""Dataset yaml files (the published schema) → a resolved config dict.

Keys: `path` (dataset root; relative → against the yaml's folder, else the current folder as the published
code does; absent → the yaml's folder), `train`, `val` (required), `test` (optional): each a folder, a `.txt`
list of image paths or a list of those, relative to `path` (a `../x` that does not exist: `x`, as published,
for Roboflow exports); `names` (required, as published) as a list or an
int-keyed dict (0 … nc−1); `nc` (optional; as published the class count is len(names): an `nc` that
differs is replaced, with a warning line). `download` is never run (no network access);
a path not found then says to get the dataset first.
`synthetic` or `synthetic:SEED` (and `None`, the default of the CLIs) resolves to the built-in synthetic
dataset (yolov9c/data/synthetic.py), generated on first use into the cache folder.

Every problem raises DataConfigError naming the key (e.g. "data.yaml: 'val': path not found: …").

Test: python -m pytest -q tests/data/test_data_yaml.py
"""

from pathlib import Path

import yaml

from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.resources import yaml_error_line


class DataConfigError(ValueError):
    """A dataset yaml that cannot be used; the message names the file and the key."""


def is_synthetic(data):
    return data is None or str(data) == "synthetic" or str(data).startswith("synthetic:")


def load_data_config(data, cache_dir=None, splits=("train", "val", "test"), log=None):
    """Resolve `data` (a yaml path, a dict in the yaml schema, 'synthetic[:SEED]' or None) to a dict:
    path (str), train/val (lists of str paths), test (list, possibly empty), nc (int), names (list of str),
    yaml_file (str or ''). `splits`: those the caller reads, whose paths must exist (training: train and val;
    val_dual.py: its task's split); the others' paths are resolved, not checked, as published (check_dataset
    looks for val only), so a test list or train folder not downloaded stops nothing that does not read it.
    `log`: where a warning line goes (an `nc` that is not len(names)); None: not said."""
    if is_synthetic(data):
        seed = 0
        if data is not None and ":" in str(data):
            try:
                seed = int(str(data).split(":", 1)[1])
            except ValueError:
                raise DataConfigError(f"--data {data}: the seed after 'synthetic:' must be an integer") from None
        data = synthetic_dataset(seed=seed, root=cache_dir)
    if isinstance(data, dict):
        cfg, where, base = dict(data), "data dict", Path.cwd()
        yaml_file = ""
    else:
        f = Path(data).expanduser()
        if f.is_dir():
            found = sorted(str(y) for y in f.glob("*.y*ml"))
            raise DataConfigError(f"{data} is a folder: a dataset .yaml file is expected (keys train, val, nc, "
                                  f"names; docs/data.md)" + (f", e.g. {found[0]} there" if found else ""))
        if not f.is_file():
            raise DataConfigError(f"data yaml not found: {data}")
        try:
            cfg = yaml.safe_load(f.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise DataConfigError(f"{f}: not a UTF-8 text file (byte {e.start}: {e.object[e.start:e.start + 4]!r}); "
                                  f"save it as UTF-8") from None
        except yaml.YAMLError as e:
            at, problem = yaml_error_line(e, f)
            raise DataConfigError(f"{at}: not valid yaml ({problem})") from None
        if not isinstance(cfg, dict):
            raise DataConfigError(f"{f}: expected a mapping with keys train, val, names")
        where, base = str(f), f.resolve().parent
        yaml_file = str(f)

    # a published yaml's download: script is never run; a path it would have made is not there yet
    get_it = ("; this yaml's download: is not run here: get the dataset first (with the published repo's script "
              "or by hand)") if cfg.get("download") else ""
    root = cfg.get("path")
    if root in (None, ""):
        root_path = base
    else:
        root_path = Path(str(root)).expanduser()
        cand = [root_path]
        if not root_path.is_absolute():
            # the yaml's folder first (our convention), the current folder as a fallback (published)
            cand = [base / root_path, Path.cwd() / root_path]
            root_path = next((c for c in cand if c.exists()), cand[0])
        if not root_path.is_dir():
            tried = " nor ".join(dict.fromkeys(str(c.resolve()) for c in cand))  # both places looked in
            raise DataConfigError(f"{where}: 'path': dataset root not found: {tried}{get_it}")
    root_path = root_path.resolve()

    out = {"path": str(root_path), "yaml_file": yaml_file}
    for key in ("train", "val", "test"):
        v = cfg.get(key)
        if v in (None, "", []):
            if key in ("train", "val"):
                raise DataConfigError(f"{where}: '{key}' is missing")
            out[key] = []
            continue
        items = v if isinstance(v, (list, tuple)) else [v]
        paths = []
        for item in items:
            p = _split_path(str(item), root_path)
            if key in splits and not p.exists():
                raise DataConfigError(f"{where}: '{key}': path not found: {p}{get_it}")
            paths.append(str(p))
        out[key] = paths

    names = cfg.get("names")
    nc = cfg.get("nc")
    if names is None:  # an error, as published (check_dataset: "data.yaml 'names:' field missing")
        hint = (f"names: {[str(i) for i in range(_as_int(nc, where, 'nc'))]}" if nc is not None and
                _as_int(nc, where, "nc") <= 5 else "names: [cat, dog, ...] (one per class)")
        raise DataConfigError(f"{where}: 'names' is missing; it is required (as in the published code, which stops "
                              f"the same way): add e.g. {hint}")
    if isinstance(names, dict):
        try:
            keys = sorted(int(k) for k in names)
        except (TypeError, ValueError):
            raise DataConfigError(f"{where}: 'names': dict keys must be integers 0 … nc-1") from None
        if keys != list(range(len(keys))):
            raise DataConfigError(f"{where}: 'names': dict keys must be 0 … {len(keys) - 1} without gaps")
        names = [str(names[k] if k in names else names[str(k)]) for k in keys]
    elif isinstance(names, (list, tuple)):
        names = [str(n) for n in names]
    else:
        raise DataConfigError(f"{where}: 'names' must be a list or an int-keyed dict")
    if not names:
        raise DataConfigError(f"{where}: 'names' is empty")
    if nc is not None and _as_int(nc, where, "nc") != len(names) and log is not None:
        log(f"WARNING: {where}: 'nc' is {nc} but 'names' has {len(names)} entries: using nc={len(names)}, as the "
            f"published code does (set nc: {len(names)} or list every class in names)")
    out["nc"] = len(names)
    out["names"] = names
    return out


def _split_path(item, root):
    """The path of one train/val/test entry: absolute as written, else under `root`. A relative `../x` that
    does not exist is read as `x` under root, as published: Roboflow exports write `train: ../train/images`
    in a data.yaml that sits beside train/. Returns a Path, not checked for existence."""
    p = Path(item).expanduser()
    if p.is_absolute():
        return p
    if not (root / p).exists() and item.startswith("../") and (root / item[3:]).exists():
        return root / item[3:]
    return root / p


def _as_int(v, where, key):
    try:
        i = int(v)
    except (TypeError, ValueError):
        raise DataConfigError(f"{where}: '{key}' must be an integer, got {v!r}") from None
    if i != v or i < 1:
        raise DataConfigError(f"{where}: '{key}' must be a positive integer, got {v!r}")
    return i
