"""dev/probes/bn_passes.py: the counts of the c backend's BN/SiLU passes in one CPU training step."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bn_passes_counts_one_statistics_pass_per_z():
    r = subprocess.run([sys.executable, str(REPO / "dev" / "probes" / "bn_passes.py"), "--model", "yolov9-t",
                        "--img", "64", "--sites", "--keep-inputs"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    entry = ("stats", "forward", "backward")
    rows = {tuple(line.split()[:2]): line.split() for line in r.stdout.splitlines() if line.startswith(entry)}
    # batch statistics: every BatchNorm's input exactly once per step (the torch forward's BN inputs = 1.00x)
    assert float(rows["stats", "forward"][3]) == 1.0
    # every z is activated at least once in forward and its BN backward runs at least once in backward
    assert float(rows["forward", "forward"][3]) >= 1.0
    assert float(rows["backward", "backward"][3]) >= 1.0
    assert ("stats", "backward") not in rows   # no statistics recomputed in backward
    assert "forward: z regions by times activated" in r.stdout
    # by call site: with --keep-inputs (the switch) a segment's recompute hands each conv its materialised input
    # (conv.inputs_kept), so its conv backwards activate nothing; the other convs' backwards do
    assert "  backward  conv backward / BNAct.fill" in r.stdout
    assert "segment recompute: conv forward" in r.stdout and "segment recompute: conv backward" not in r.stdout
