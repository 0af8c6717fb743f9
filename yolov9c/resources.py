"""Where the bundled configs live, finding and loading a hyp file.

In a source checkout or an editable install the configs are the repo's `configs/` beside the package; an
installed wheel carries a copy as `yolov9c/configs/` (setup.py's build_py puts it there). Everything that
needs a bundled yaml (model configs, hyp.scratch-high.yaml) asks here.
Test: python -m pytest -q tests/test_resources.py
"""

from pathlib import Path

import yaml

_PKG = Path(__file__).resolve().parent
CONFIGS_DIR = next((d for d in (_PKG / "configs", _PKG.parent / "configs") if d.is_dir()), _PKG.parent / "configs")
MODEL_CONFIG_DIR = CONFIGS_DIR / "models" / "detect"
DEFAULT_HYP = CONFIGS_DIR / "hyps" / "hyp.scratch-high.yaml"


def load_hyp(hyp=None):
    """None -> the bundled hyp.scratch-high.yaml; a str/Path -> that yaml file (a mapping); a dict -> a shallow
    copy. Raises FileNotFoundError naming a missing file, ValueError for a file that is not a mapping."""
    if hyp is None:
        hyp = DEFAULT_HYP
    if isinstance(hyp, (str, Path)):
        path = Path(hyp)
        if not path.is_file():
            raise FileNotFoundError(f"hyp file not found: {path}")
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
        if not isinstance(data, dict):
            raise ValueError(f"hyp file {path} must hold a mapping of hyperparameter: value")
        return data
    return dict(hyp)


def resolve_hyp_path(hyp) -> Path:
    """A --hyp argument → an existing file: the path itself, else a bare name in configs/hyps/.
    Raises FileNotFoundError naming both places."""
    p = Path(hyp)
    if p.is_file():
        return p
    cand = CONFIGS_DIR / "hyps" / p.name
    if cand.is_file():
        return cand
    raise FileNotFoundError(f"--hyp {hyp}: file not found (nor {cand})")
