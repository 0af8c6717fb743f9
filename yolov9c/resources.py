"""Where the bundled configs live, finding a bundled file from the names users type, and loading a hyp file.

The configs: the repo's `configs/` in a checkout, `yolov9c/configs/` in a wheel (setup.py's build_py copies them).

Names that find a bundled file when no such file exists on disk: a bare name (`gelan-t`, `gelan-t.yaml`,
`hyp.scratch-high.yaml`) and the path of the same file in the published repository, relative to its root
(`models/detect/gelan-t.yaml`, `data/hyps/hyp.scratch-high.yaml`, also with a leading `./`), so the published
commands carry over. Any other missing path is an error: it never silently turns into a bundled file.
A hyp file is checked as it is read (check_hyp): UTF-8, plain yaml only (a `!!python/...` tag is refused, never run),
every known key a number in its range (HYP_RANGES); each problem is one ValueError naming the file, line and key.
Numbers written as YAML 1.2 reads them (`1e-3`, which PyYAML's YAML 1.1 rules leave a string) are numbers. A key
training does not read is one warning line naming the key it resembles (`lrO` beside `lr0`: did you mean lr0?); a
misspelling of a key the file lacks (`mosiac`, no `mosaic`) is an error naming both.
Test: python -m pytest -q tests/package/test_resources.py tests/cli/test_cli_errors.py -k hyp
"""

import difflib
import math
import re
from pathlib import Path

import yaml

_PKG = Path(__file__).resolve().parent
CONFIGS_DIR = next((d for d in (_PKG / "configs", _PKG.parent / "configs") if d.is_dir()), _PKG.parent / "configs")
MODEL_CONFIG_DIR = CONFIGS_DIR / "models" / "detect"
HYP_DIR = CONFIGS_DIR / "hyps"
DEFAULT_HYP = HYP_DIR / "hyp.scratch-high.yaml"

# kind -> (bundled folder, that folder's path in the published repository)
_KINDS = {"model": (MODEL_CONFIG_DIR, ("models", "detect")), "hyp": (HYP_DIR, ("data", "hyps"))}


def bundled_file(name, kind):
    """The bundled file of `kind` ("model" or "hyp") that `name` names, else None.

    `name`: a bare file name or stem (`gelan-t`, `gelan-t.yaml`) or the published repository path
    (`models/detect/gelan-t.yaml`, `data/hyps/hyp.scratch-high.yaml`). Absolute paths and other folders
    never match."""
    folder, published = _KINDS[kind]
    path = Path(str(name))
    parts = [p for p in path.parts if p != "."]
    if path.is_absolute() or not parts or (len(parts) > 1 and tuple(parts[:-1]) != published):
        return None
    file = parts[-1] if Path(parts[-1]).suffix in (".yaml", ".yml") else parts[-1] + ".yaml"
    cand = folder / file
    return cand if cand.is_file() else None


def bundled_names(kind):
    """The bundled files of `kind`, by name (for error messages)."""
    return sorted(p.name for p in _KINDS[kind][0].glob("*.yaml"))


def resolve_hyp(hyp):
    """A hyp argument -> an existing file: the path itself when it is a file, else the bundled file it names
    (see bundled_file). Raises FileNotFoundError naming the argument and the bundled hyp files."""
    path = Path(str(hyp)).expanduser()
    if path.is_file():
        return path
    found = bundled_file(hyp, "hyp")
    if found is None:
        raise FileNotFoundError(f"hyp file not found: {hyp} (not a file, nor a bundled hyp: "
                                f"{', '.join(bundled_names('hyp'))})")
    return found


# The hyp keys: the one list of them in the package (the others below and in data/, engine/ derive from it;
# tests/package/test_resources.py). key -> (reader, test, rule), in the published file's order. The reader: "train"
# (optimizer, LR schedule, warm-up: a run's set-up requires them), "augment" and "warp" (the data pipeline requires
# them; "warp": the random perspective, mosaics' too), "loss" (read when present; label_smoothing is set from
# --label-smoothing), "unread" (published keys nothing here reads). test/rule: the values a training can run with
# (evolve.META is narrower: the range it searches). Keys not listed (a published file's extras) are not checked.
_POSITIVE = (lambda v: v > 0, "a number > 0")
_ANY = (lambda v: v >= 0, "a number >= 0")
_FRACTION = (lambda v: 0 <= v <= 1, "a fraction in [0, 1]")
_BELOW_1 = (lambda v: 0 <= v < 1, "a number in [0, 1)")
HYP_RANGES = {
    "lr0": ("train", *_POSITIVE), "lrf": ("train", *_ANY), "momentum": ("train", *_BELOW_1),
    "weight_decay": ("train", *_ANY), "warmup_epochs": ("train", *_ANY), "warmup_momentum": ("train", *_FRACTION),
    "warmup_bias_lr": ("train", *_ANY),
    "box": ("unread", *_ANY), "cls": ("unread", *_ANY), "cls_pw": ("loss", *_ANY), "obj": ("unread", *_ANY),
    "obj_pw": ("unread", *_ANY), "dfl": ("unread", *_ANY), "iou_t": ("unread", *_FRACTION),
    "anchor_t": ("unread", *_ANY), "fl_gamma": ("loss", *_ANY), "label_smoothing": ("loss", *_BELOW_1),
    "hsv_h": ("augment", *_FRACTION), "hsv_s": ("augment", *_FRACTION), "hsv_v": ("augment", *_FRACTION),
    "degrees": ("warp", *_ANY), "translate": ("warp", *_FRACTION), "scale": ("warp", *_ANY),
    "shear": ("warp", *_ANY), "perspective": ("warp", *_ANY),
    "flipud": ("augment", *_FRACTION), "fliplr": ("augment", *_FRACTION), "mosaic": ("augment", *_FRACTION),
    "mixup": ("augment", *_FRACTION), "copy_paste": ("augment", *_FRACTION),
}


def hyp_keys(*readers):
    """The HYP_RANGES keys read by any of `readers`, in the table's order."""
    return tuple(k for k, (reader, _, _) in HYP_RANGES.items() if reader in readers)


TRAIN_KEYS = hyp_keys("train")
AUGMENT_KEYS = hyp_keys("augment", "warp")
WARP_KEYS = hyp_keys("warp")
# keys a hyp file may hold besides HYP_RANGES': `anchors` (commented out in the published files; evolve.META has it)
HYP_KEYS = (*HYP_RANGES, "anchors")
# a plain scalar that YAML 1.2 reads as a float and PyYAML (YAML 1.1) as a string: 1e-3, 5E4, 1.0e3
_YAML12_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+")
_LOOKALIKE = str.maketrans("ol-", "01_")  # O/0, l/1 and -/_ look alike in a key typed by hand


def likely_key(key):
    """The hyp key (HYP_KEYS) that `key`, which is none of them, was probably meant to be: the same but for case
    and look-alike characters (lrO: lr0), else difflib's closest at a ratio >= 0.75 (mosiac: mosaic); or None."""
    folded = {k.lower().translate(_LOOKALIKE): k for k in HYP_KEYS}
    mine = str(key).lower().translate(_LOOKALIKE)
    if mine in folded:
        return folded[mine]
    close = difflib.get_close_matches(mine, list(folded), n=1, cutoff=0.75)
    return folded[close[0]] if close else None


def yaml_error_line(e, where):
    """(at, problem) of a yaml.YAMLError for one error line: `where: line N`, N the line where the broken
    construct starts (a flow list opened on line 3 and never closed: line 3), and PyYAML's context and problem
    joined (its own text spans 4-6 lines). Used by every yaml file users give: hyp, dataset, model."""
    mark = getattr(e, "context_mark", None) or getattr(e, "problem_mark", None)
    at = f"{where}: line {mark.line + 1}" if mark is not None else str(where)
    problem = "; ".join(t for t in (getattr(e, "context", None), getattr(e, "problem", None)) if t)
    return at, problem or str(e).splitlines()[0]


def check_hyp(hyp: dict, where="hyp", lines=None) -> dict:
    """Raise ValueError "<where>: line N: <key>: <why>" for the first value of a HYP_RANGES key that is not a
    number (true/false count as not) or lies outside its range; `lines` maps keys to their line in the file.
    Returns `hyp`."""
    for k, (_, ok, rule) in HYP_RANGES.items():
        if k not in hyp:
            continue
        v = hyp[k]
        at = f"{where}: line {lines[k]}: {k}" if lines and k in lines else f"{where}: {k}"
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{at}: {v!r} is not a number")
        if not ok(v):
            raise ValueError(f"{at}: {v} is out of range: {k} must be {rule}")
    return hyp


def _read_hyp_file(path: Path, log=print) -> dict:
    """The mapping of hyp file `path`, checked (check_hyp): ValueError naming the file and line of a file that is
    not UTF-8, of plain-yaml errors, of a tag that would build a Python object (never run), of a file that is not
    a mapping, of a misspelt key whose intended key is missing. A key no one reads: one warning through `log`."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a UTF-8 text file (byte {e.start}: {e.object[e.start:e.start + 4]!r}); "
                         f"save it as UTF-8") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if isinstance(node, yaml.MappingNode):  # YAML 1.2 floats PyYAML leaves strings: 1e-3 is a number
            for _, v in node.value:
                if (isinstance(v, yaml.ScalarNode) and v.style is None and v.tag == "tag:yaml.org,2002:str"
                        and _YAML12_FLOAT.fullmatch(v.value)):
                    v.tag = "tag:yaml.org,2002:float"
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        at, problem = yaml_error_line(e, path)
        problem = problem.replace("tag:yaml.org,2002:", "!!")
        if isinstance(e, yaml.constructor.ConstructorError):
            problem += " (a hyp file holds plain numbers; tags that build Python objects are refused, never run)"
        raise ValueError(f"{at}: not a valid hyp file: {problem}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ValueError(f"hyp file {path} must hold a mapping of hyperparameter: value")
    lines = {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    for key in data:
        if key in HYP_KEYS:
            continue
        meant, at = likely_key(key), f"{path}: line {lines.get(key, '?')}"
        if meant is not None and meant not in data:
            raise ValueError(f"{at}: unknown key {key!r}: did you mean {meant!r}? (the file has no {meant})")
        also = f" (did you mean {meant!r}? it is set on line {lines.get(meant, '?')})" if meant else ""
        log(f"WARNING: {at}: {key!r} is not a hyperparameter training reads: ignored{also}")
    return check_hyp(data, str(path), lines)


def load_hyp(hyp=None, log=print):
    """None -> the bundled hyp.scratch-high.yaml; a str/Path -> that yaml file (a mapping; resolve_hyp finds
    it; check_hyp checks its values); a dict -> a shallow copy. Raises FileNotFoundError naming a missing file,
    ValueError naming the file (and line) of a file that is not UTF-8, invalid yaml, a refused tag, a value that
    is not a number in its range (check_hyp), a file that is not a mapping, a misspelt key whose intended key is
    missing. A file's key that training does not read is one warning line through `log`."""
    if hyp is None:
        hyp = DEFAULT_HYP
    if isinstance(hyp, (str, Path)):
        return _read_hyp_file(resolve_hyp(hyp), log)
    return dict(hyp)

