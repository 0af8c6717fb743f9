"""benchmarks/gpu_run.sh, the one device-machine script: every part its header lists is a case of the script,
every case is listed, every benchmark it runs exists and takes the flags the script passes (checked against
the benchmark's own argparse source, so a renamed flag fails here rather than on the GPU machine), and the
script parses (`bash -n`). Run: python -m pytest -q tests/test_gpu_run.py
"""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_run.sh"


def _text():
    return SCRIPT.read_text()


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_listed_parts_are_the_cases():
    text = _text()
    header = text.split("# Parts:")[1].split("# Test:")[0]
    listed = set(re.findall(r"^#\s{3}(\w+)\s", header, re.M))
    body = text.split('for part in "$@"; do')[1]
    cases = set(re.findall(r"^    (\w+)\)", body, re.M))
    assert listed == cases and {"build", "tests", "step", "memory", "train"} <= cases, (listed, cases)


def test_every_benchmark_exists_and_takes_its_flags():
    commands = re.sub(r"\\\n\s*", " ", _text())
    runs = re.findall(r"python3 (benchmarks/\S+\.py)([^\n;|]*)", commands)
    assert len(runs) >= 9
    for path, args in runs:
        source = (REPO / path).read_text()
        for local in re.findall(r"^from (\w+) import", source, re.M):   # argparse helpers beside it
            if (REPO / path).with_name(local + ".py").is_file():
                source += (REPO / path).with_name(local + ".py").read_text()
        for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", args):
            assert f'"{flag}"' in source, f"{path} has no {flag}"
