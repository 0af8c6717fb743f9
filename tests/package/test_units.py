"""One definition of the byte units (yolov9c/units.py): no module of the package, the benchmarks or the developer
tools spells a GiB or MiB as its own number, so a figure printed in one place means what it means in another.
Test: python -m pytest -q tests/package/test_units.py"""

import re
from pathlib import Path

from yolov9c.units import GIB, MIB

REPO = Path(__file__).resolve().parents[2]
OWN_NUMBER = re.compile(r"\b(?:2\s*\*\*\s*(?:20|30)|1024\s*\*\*\s*[23]|1\s*<<\s*(?:20|30)|1073741824|1048576)\b")


def test_units_are_binary():
    assert (MIB, GIB) == (1 << 20, 1 << 30)


# files that spell GIB themselves, and why: bench_published_step.py runs in the published code's interpreter and
# loads memory_plan.py and bench_step.py there, where no yolov9c module may be imported
# (tests/benchmarks/test_bench_published_step.py); each says so on the line
OWN_GIB = {"yolov9c/engine/train/memory_plan.py", "benchmarks/bench_step.py", "benchmarks/bench_published_step.py"}


def test_no_module_defines_its_own_gib_or_mib():
    found = []
    for folder in ("yolov9c", "benchmarks", "dev"):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel == "yolov9c/units.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#")[0]
                if rel in OWN_GIB and code.strip() == "GIB = 2 ** 30" and "yolov9c.units.GIB" in line:
                    continue
                if OWN_NUMBER.search(code):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "use yolov9c.units.GIB / MIB:\n" + "\n".join(found)
