"""Every command in a ```bash block of README.md and docs/*.md that can run on a CPU runs, shrunk to tiny sizes.

Each command line (continuation lines joined, `# comments` dropped, `a && b` split) is either run here or
excluded by a rule in `why_not_run` that says why (installs, the test suite itself, two GPUs, an interrupted
run): a new documented command is run automatically, and one that cannot be run must be given a reason.
How a command is shrunk (`shrink`): --epochs 1, --img 64, --batch 4, --workers 0 (given or added; training also
--noplots), the c-sized
models of training and conversion replaced by the t-sized ones (yolov9-c.yaml -> yolov9-t.yaml, gelan-c ->
gelan-t; in training also yolov9-s.yaml), a training command without --data given the tiny dataset;
its placeholders point at files made here: data.yaml / path/to/data.yaml / `...` -> 4 + 2 synthetic images
with 80 class names, best.pt / yolov9-c.pt / runs/train/exp/weights/best.pt -> a yolov9-t checkpoint (nc 80),
yolov9-c-converted.pt -> a gelan-t one, path/to/images, clips/*.mp4 and list.txt -> two images and a
3-frame video, data/images/horses.jpg (the published repository's sample) -> one of those images. Each
command runs in its own folder, in this process (runpy of the script or `-m yolov9c`, as `python` would), and
must exit 0 and leave its output (run folder, weights, .onnx).
Run: python -m pytest -q tests/docs/test_docs_commands.py
"""

import re
import runpy
import shlex
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

import yolov9c
from yolov9c.data.synthetic import synthetic_dataset
from yolov9c.models.checkpoint import save_checkpoint

REPO = Path(__file__).resolve().parents[2]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SCRIPTS = ("train_dual.py", "val_dual.py", "detect_dual.py", "train.py", "val.py", "detect.py")


def documented_commands():
    """[(doc file name, command)] for every python/torchrun command of a ```bash block, in document order."""
    found = []
    for doc in DOC_FILES:
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S):
            text = block.replace("\\\n", " ")
            for line in text.splitlines():
                line = re.sub(r"\s+#\s.*$", "", line).strip()
                for part in line.split("&&"):
                    part = " ".join(part.split())
                    if part.startswith(("python", "torchrun")):
                        found.append((doc.name, part))
    return found


def why_not_run(cmd):
    """Why a documented command is not run on the CPU here, or None (it is run)."""
    if " -m pip " in f" {cmd} ":
        return "installs packages (.ci/run runs the README's install and test command)"
    if " -m pytest" in cmd:
        return "the test suite itself"
    if "--nnodes" in cmd.split():
        return "needs two machines (tests/engine/train/test_train_multinode.py runs two nodes on 127.0.0.1)"
    if cmd.startswith("torchrun") or "--device 0,1" in cmd:
        return "needs two GPUs (tests/engine/train/test_train_ddp.py)"
    if "--measure" in cmd.split():
        return "measures on a CUDA GPU (tests/engine/train/test_memory_plan.py, cuda)"
    if re.search(r"--resume(\s|$)", cmd):
        return "needs an interrupted run (tests/engine/train/test_resume.py)"
    return None


def _distinct(commands):
    """Each command once (README and docs repeat some; the data placeholders are one file here)."""
    seen, out = set(), []
    for doc, cmd in commands:
        key = " ".join("DATA" if t in DATA else t for t in cmd.split())
        if key not in seen:
            seen.add(key)
            out.append((doc, cmd))
    return out


COMMANDS = documented_commands()
SIZE_FLAGS = {"--epochs": "1", "--img": "64", "--imgsz": "64", "--img-size": "64", "--batch": "4",
              "--batch-size": "4", "--evolve": "1"}
SMALLER = {"yolov9-c.yaml": "yolov9-t.yaml", "gelan-c.yaml": "gelan-t.yaml",
           "models/detect/gelan-c.yaml": "models/detect/gelan-t.yaml"}
TRAIN_SMALLER = {"yolov9-s.yaml": "yolov9-t.yaml"}
DATA = ("data.yaml", "path/to/data.yaml", "D.yaml", "...")
RUN = _distinct([c for c in COMMANDS if why_not_run(c[1]) is None])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The files the placeholders point at (made once, linked into each command's folder)."""
    root = tmp_path_factory.mktemp("docs")
    syn = synthetic_dataset(seed=4, root=root, n_train=4, n_val=2, imgsz=64).parent
    data = root / "tiny80.yaml"
    names = "".join(f"  {i}: c{i}\n" for i in range(80))  # 80 names: the coco-sized checkpoints fit it
    data.write_text(f"path: {syn}\ntrain: images/train\nval: images/val\nnames:\n{names}")
    dual, single = root / "yolov9-t-80.pt", root / "gelan-t-80.pt"
    save_checkpoint(dual, yolov9c.build_model("yolov9-t", nc=80))
    save_checkpoint(single, yolov9c.build_model("gelan-t", nc=80))
    video = root / "clip.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 5, (64, 48))
    for i in range(3):
        writer.write(np.full((48, 64, 3), 40 * i, np.uint8))
    writer.release()
    return {"data": data, "images": syn / "images" / "val", "dual": dual, "single": single, "video": video}


def _lay_out(cwd, files):
    """The placeholder files of the docs, in a command's folder."""
    for name in ("best.pt", "yolov9-c.pt", "runs/train/exp/weights/best.pt", "runs/train/exp2/weights/best.pt"):
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        (cwd / name).symlink_to(files["dual"])
    (cwd / "yolov9-c-converted.pt").symlink_to(files["single"])
    (cwd / "clips").mkdir()
    (cwd / "clips" / "a.mp4").symlink_to(files["video"])
    (cwd / "list.txt").write_text(f"{files['images']}\n")
    (cwd / "data" / "images").mkdir(parents=True)  # the published repository's sample image
    (cwd / "data" / "images" / "horses.jpg").symlink_to(sorted(files["images"].glob("*.jpg"))[0])


def shrink(cmd, files):
    """The command as argv, with tiny sizes and the placeholders pointed at `files` (see the module doc)."""
    argv = []
    for tok in shlex.split(cmd):
        if tok.startswith("[") or tok.endswith("]"):  # [--nc 80]: an optional argument, given here
            tok = tok.strip("[]")
            if not tok:
                continue
        argv.append(tok)
    out = []
    for i, tok in enumerate(argv):
        prev = argv[i - 1] if i else ""
        if prev in SIZE_FLAGS:
            tok = SIZE_FLAGS[prev]
        elif prev == "--data" and tok in DATA:
            tok = str(files["data"])
        elif prev == "--source" and tok == "path/to/images":
            tok = str(files["images"])
        elif prev == "--cfg":
            tok = SMALLER.get(tok, tok)
            if argv[1] in ("train_dual.py", "train.py"):  # training: yolov9-s too (the memory planner needs its costs)
                tok = TRAIN_SMALLER.get(tok, tok)
        out.append(tok)
    # the sizes a command leaves at their defaults (100 epochs, 640 px, the 160 built-in images): tiny too
    script = out[1] if len(out) > 1 else ""
    given = set(out)
    extra = {}
    if script in ("train_dual.py", "train.py"):
        # --noplots: the plots cost most of a 1-epoch run; tests/engine/train/test_train_e2e.py checks them
        extra = {"--epochs": "1", "--batch": "4", "--data": str(files["data"]), "--workers": "0", "--noplots": None}
    elif script in ("val_dual.py", "val.py"):
        extra = {"--workers": "0"}
    if script in SCRIPTS or out[1:4] == ["-m", "yolov9c", "export"]:
        extra["--img"] = "64"
    for flag, value in extra.items():
        aliases = {"--batch": ("--batch", "--batch-size"), "--img": ("--img", "--imgsz", "--img-size")}
        if not given & set(aliases.get(flag, (flag,))):
            out += [flag] if value is None else [flag, value]
    return out


def run_in_process(argv, capsys):
    """Run `python SCRIPT ARGS`, `python -m yolov9c ARGS` or `python -c CODE` here; returns (exit code, output)."""
    old = sys.argv
    code = 0
    try:
        if argv[1] == "-c":
            exec(compile(argv[2], "<docs>", "exec"), {})
        elif argv[1:3] == ["-m", "yolov9c"]:
            sys.argv = ["python -m yolov9c", *argv[3:]]
            runpy.run_module("yolov9c", run_name="__main__", alter_sys=True)
        else:
            assert argv[1] in SCRIPTS, f"unknown script in the docs: {argv[1]}"
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_path(str(REPO / argv[1]), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return code, out.out + out.err


def check_outputs(argv, cwd, output):
    """What the command must leave behind, by kind of command."""
    script = argv[1]
    if script in ("train_dual.py", "train.py"):
        assert list(cwd.glob("runs/train/*/weights/best.pt")) and list(cwd.glob("runs/train/*/results.csv"))
    elif script in ("val_dual.py", "val.py"):
        assert "mAP50-95" in output and list(cwd.glob("runs/val/exp*"))
    elif script in ("detect_dual.py", "detect.py"):
        assert list(cwd.glob("runs/detect/exp*/*"))
    elif argv[1:4] == ["-m", "yolov9c", "export"]:
        assert (cwd / Path(argv[argv.index("--weights") + 1]).with_suffix(".onnx")).is_file()  # beside the weights
    elif argv[1:4] == ["-m", "yolov9c", "convert"]:
        assert (cwd / argv[argv.index("--out") + 1]).is_file()


def test_docs_have_commands_and_every_one_is_classified():
    names = {doc for doc, _ in COMMANDS}
    assert {"README.md", "train.md", "val.md", "detect.md", "data.md"} <= names
    skipped = {cmd: why_not_run(cmd) for _, cmd in COMMANDS if why_not_run(cmd)}
    assert len(RUN) >= 20 and len(skipped) <= 8, (len(RUN), skipped)
    assert not any("coco128.yaml" == t for _, c in COMMANDS for t in shlex.split(c)), "a bare coco128.yaml names no file"


@pytest.mark.parametrize("doc, cmd", RUN, ids=[f"{d}: {c}" for d, c in RUN])
def test_documented_command_runs(doc, cmd, files, tmp_path, monkeypatch, capsys):
    if "export" in cmd:
        pytest.importorskip("onnx")
    argv = shrink(cmd, files)
    _lay_out(tmp_path, files)
    monkeypatch.chdir(tmp_path)
    code, output = run_in_process(argv, capsys)
    assert code == 0, f"{doc}: {cmd}\nran as: {' '.join(argv)}\n{output[-3000:]}"
    check_outputs(argv, tmp_path, output)
