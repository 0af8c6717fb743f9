"""dev/probes/host_step.py --host on the CPU: for both backends at a tiny size the JSON line carries wall_ms, each
compute group's ms and host_ms, with 0 < host_ms <= wall_ms, every group >= 0 and the c backend's extension
group > 0; compute_timed replaces every attribute it lists and puts each original object back on exit.
Run: OMP_NUM_THREADS=1 python -m pytest -q dev/tests/test_host_step.py
"""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "dev" / "probes"))
import host_step  # noqa: E402


def test_host_splits_wall_into_compute_and_host_and_restores_the_patched_attributes(capsys):
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in host_step._timed_attributes()]
    with host_step.compute_timed():
        assert all(getattr(owner, name) is not original for owner, name, original in originals)
    host_step.main(["--host", "--img", "32", "--steps", "2", "--warmup", "1"])
    rows = {r["backend"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert set(rows) == {"c", "torch"}
    for backend, r in rows.items():
        groups = [f"{g}_ms" for g in host_step.GROUPS]
        assert {"wall_ms", "host_ms", "host_min_ms", *groups} <= set(r), backend
        assert 0 < r["host_min_ms"] <= r["host_ms"] <= r["wall_ms"], (backend, r)
        assert all(r[g] >= 0 for g in groups), (backend, r)
    assert rows["c"]["ext_ms"] > 0 and rows["c"]["conv2d_ms"] > 0 and rows["c"]["conv_backward_ms"] > 0
    assert rows["torch"]["conv2d_ms"] > 0 and rows["torch"]["foreach_ms"] > 0
    assert all(getattr(owner, name) is original for owner, name, original in originals)
