"""The torchrun that `python train_dual.py --device 0,1` starts: torch.distributed.run, without its traceback.

    python -m yolov9c.cli.ddp_launch --standalone --nproc_per_node 2 train_dual.py ARGS   # torchrun's arguments

A rank that stops on a user error prints its one `error:` line and exits with code 2. torchrun then raises
ChildFailedError in its own process (its main re-raises it through @record) and Python prints it: a 35-line
traceback after our line. A worker cannot avoid it: every nonzero exit, by sys.exit or os._exit, is a failure to
the elastic agent (checked with torch 2.13), and exiting 0 would hide the error. So a direct `torchrun
train_dual.py ...` keeps that traceback (docs/train.md says so), while the DDP launch train_dual.py makes itself
runs torchrun's main here: a failure ends with torch's one `failed (exitcode: N)` log line, one line of ours
when the rank was not stopped by our own error (another exit code, a signal), and this exit code (the rank's: 2
for a user error, 128 + N for signal N), never a traceback of this process.
Test: python -m pytest -q tests/cli/test_cli_errors.py -k torchrun
"""

import signal
import sys

USER_ERROR = 2  # the exit code of a rank that printed its `error:` line (yolov9c.cli.train.main)


def main(argv=None) -> int:
    """Run torchrun with `argv` (default sys.argv[1:]); returns its exit code (see the module docstring)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(sys.argv[1:] if argv is None else list(argv))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        code = failure.exitcode
        if code == USER_ERROR:
            return code  # the rank printed the line
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            print(f"{e.name}: rank {rank} (pid {failure.pid}) was killed by {name}", file=sys.stderr)
            return 128 - code
        print(f"{e.name}: rank {rank} (pid {failure.pid}) exited with code {code} (its output above says why)",
              file=sys.stderr)
        return code or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
