"""bench_step.py's training paths: the shapes each path feeds the step and which rows a call makes (the
measurements themselves need a CUDA GPU: dev/gpu_run.sh part `step`).
Test: python -m pytest -q tests/benchmarks/test_bench_step.py"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_step  # noqa: E402


@pytest.mark.parametrize("batch,img", [(64, 640), (16, 320), (5, 96)])
def test_each_path_feeds_the_shapes_of_its_trainer_path(batch, img):
    paths = {name: make(batch, img) for name, make in bench_step.PATHS.items()}
    for name in ("fixed", "micro", "ckpt"):
        assert paths[name] == [(batch, img, img)]
    (b, h, w), = paths["rect"]
    assert b == batch and w == img and h < img and h % 32 == 0 and abs(h - img * 3 / 4) <= 16
    sizes = paths["multiscale"]
    assert len(sizes) == 3 and len(set(sizes)) == 3 and (batch, img, img) in sizes
    assert all(b == batch and h == w and h % 32 == 0 for b, h, w in sizes)
    (b, h, w), = paths["partial"]
    assert 1 <= b < batch or batch == 1
    assert (h, w) == (img, img)


def test_a_call_makes_a_row_per_path_and_mode_and_skips_ckpt_for_c(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(bench_step, "run_config",
                        lambda args, m, b, mode, path: calls.append((m, b, mode, path)) or
                        {"model": m, "backend": b, "mode": mode, "path": path, "status": "ok", "step_ms": 1.0})
    bench_step.main(["--models", "yolov9-t", "--backends", "c", "torch", "--paths", "fixed", "ckpt",
                     "--modes", "eager", "graph", "--markdown"])
    assert ("yolov9-t", "torch", "graph", "ckpt") in calls and ("yolov9-t", "c", "eager", "fixed") in calls
    assert not [c for c in calls if c[1] == "c" and c[3] == "ckpt"]
    assert len(calls) == 6
    table = capsys.readouterr().out
    assert "| yolov9-t | torch | ckpt | graph | ok | 1.0 |" in table


@pytest.mark.parametrize("flags, passed", [((), "--graph-shapes"), (("--no-graph-shapes",), "--no-graph-shapes")])
def test_graph_shapes_and_the_path_reach_the_child_process(monkeypatch, flags, passed):
    args = bench_step.build_parser().parse_args([*flags, "--paths", "rect"])  # on by default, as in the trainer
    seen = []

    def fake_run(argv, **kw):
        seen.append(argv)
        raise bench_step.subprocess.TimeoutExpired(argv, 1)

    monkeypatch.setattr(bench_step.subprocess, "run", fake_run)
    row = bench_step.run_config(args, "yolov9-t", "c", "graph", "rect")
    assert row["status"] == "timeout" and row["path"] == "rect"
    argv = seen[0]
    i = argv.index("--one")
    assert argv[i + 1:i + 5] == ["yolov9-t", "c", "graph", "rect"] and passed in argv
    assert bench_step.build_parser().parse_args(argv[2:]).graph_shapes is (passed == "--graph-shapes")


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_the_state_of_a_row_carries_graph_shapes_into_its_run_config(mode):
    args = bench_step.build_parser().parse_args(["--batch", "2", "--paths", "rect"])  # the default: keyed by shape
    state = bench_step._state("yolov9-t", "c", args, "rect", mode, device="cpu")
    assert state.cfg.graph_shapes is (mode == "graph") and state.cfg.rect


def test_host_profile_names_the_step_functions_by_own_time_and_calls_per_step():
    synced = []

    def slow():  # its own time: a loop without calls
        x = 0
        for i in range(200_000):
            x += i
        return x

    def fast():
        pass

    def one():
        slow()
        fast()
        fast()

    calls, top = bench_step.host_profile(one, 3, sync=lambda: synced.append(1), top=5)
    by_name = {name.split("(")[-1].rstrip(")"): (ms, n) for name, ms, n in top}
    assert top[0][0].endswith("(slow)") and by_name["slow"][0] > 10 * by_name["fast"][0]  # own ms, largest first
    assert by_name["fast"][1] == 2.0 and by_name["slow"][1] == 1.0     # calls per step
    assert calls >= 4 and len(synced) == 4                              # one sync before each step and at the end


def test_host_profile_reaches_the_child_process(monkeypatch):
    args = bench_step.build_parser().parse_args(["--host-profile", "3"])
    seen = []

    def fake_run(argv, **kw):
        seen.append(argv)
        raise bench_step.subprocess.TimeoutExpired(argv, 1)

    monkeypatch.setattr(bench_step.subprocess, "run", fake_run)
    bench_step.run_config(args, "yolov9-t", "c", "eager")
    assert bench_step.build_parser().parse_args(seen[0][2:]).host_profile == 3


def test_interleave_steps_each_configuration_in_turn_with_its_switch_set_only_during_its_steps(monkeypatch):
    from yolov9c.ops import extension

    monkeypatch.delenv("YOLOV9C_LEAN_HOST", raising=False)
    seen = []
    real = bench_step._state

    def spy_state(model, backend, args, path, mode, device):
        state = real(model, backend, args, path, mode, device)
        forward = state.model.forward
        state.model.forward = lambda *a, **k: seen.append((backend, extension.lean_host())) or forward(*a, **k)
        return state

    monkeypatch.setattr(bench_step, "_state", spy_state)
    configs = ["c+YOLOV9C_LEAN_HOST=0", "c+YOLOV9C_LEAN_HOST=1", "torch"]
    args = bench_step.build_parser().parse_args(["--batch", "2", "--img", "64", "--steps", "3", "--warmup", "1",
                                                 "--interleave", *configs])
    rows = bench_step.run_interleaved("yolov9-t", args.interleave, args, device="cpu")
    assert [r["config"] for r in rows] == ["c+YOLOV9C_LEAN_HOST=0", "c+YOLOV9C_LEAN_HOST=1", "torch"]
    assert rows[0]["vs_first"] == 1.0 and all(r["step_ms"] > 0 and r["rounds"] == 3 for r in rows)
    assert all(r["vs_first_q"][0] <= r["vs_first"] <= r["vs_first_q"][1] for r in rows)
    assert len(seen) == 4 * 3                                               # (warm-up + timed) rounds x configs
    assert seen[:3] == [("c", False), ("c", True), ("torch", True)]         # round 0 from the first configuration
    assert seen[3:6] == [("c", True), ("torch", True), ("c", False)]        # round 1 one later (torch: the default)
    assert "YOLOV9C_LEAN_HOST" not in bench_step.os.environ                 # restored


@pytest.mark.parametrize("text, parsed", [("c", ("c", {})), ("torch", ("torch", {})),
                                          ("c+YOLOV9C_LEAN_HOST=0", ("c", {"YOLOV9C_LEAN_HOST": "0"})),
                                          ("c+A=1+B=x=y", ("c", {"A": "1", "B": "x=y"}))])
def test_interleave_config_reads_the_backend_and_its_switches(text, parsed):
    assert bench_step.interleave_config(text) == parsed


@pytest.mark.parametrize("text", ["cuda", "c+lean", "c+=1", "torch+X"])
def test_interleave_config_refuses_what_it_cannot_set(text):
    with pytest.raises(bench_step.argparse.ArgumentTypeError, match="expected c or torch"):
        bench_step.interleave_config(text)
