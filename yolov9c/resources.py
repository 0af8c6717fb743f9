"""Where the bundled configs live, finding a bundled file from the names users type, and loading a hyp file.

In a source checkout or an editable install the configs are the repo's `configs/` beside the package; an
installed wheel carries a copy as `yolov9c/configs/` (setup.py's build_py puts it there). Everything that
needs a bundled yaml (model configs, hyp.scratch-high.yaml) asks here.

Names that find a bundled file when no such file exists on disk: a bare name (`gelan-t`, `gelan-t.yaml`,
`hyp.scratch-high.yaml`) and the path of the same file in the published repository, relative to its root
(`models/detect/gelan-t.yaml`, `data/hyps/hyp.scratch-high.yaml`, also with a leading `./`), so the published
commands carry over. Any other missing path is an error: it never silently turns into a bundled file.
Test: python -m pytest -q tests/test_resources.py
"""

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


def load_hyp(hyp=None):
    """None -> the bundled hyp.scratch-high.yaml; a str/Path -> that yaml file (a mapping; resolve_hyp finds
    it); a dict -> a shallow copy. Raises FileNotFoundError naming a missing file, ValueError for a file that
    is not a mapping."""
    if hyp is None:
        hyp = DEFAULT_HYP
    if isinstance(hyp, (str, Path)):
        path = resolve_hyp(hyp)
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
        if not isinstance(data, dict):
            raise ValueError(f"hyp file {path} must hold a mapping of hyperparameter: value")
        return data
    return dict(hyp)

