"""train_dual.py with the other backend's loss: bench_accuracy.py's loss-torch / loss-c runners, which tell which
half of the c backend (model or loss) an accuracy gap comes from. A developer tool: the product trains each
backend with its own loss.

    python dev/accuracy/train_other_loss.py torch --backend c --data D.yaml --img 640 ...   # c's model, torch's loss
    python dev/accuracy/train_other_loss.py c --backend torch --resume RUN/weights/last.pt  # torch's model, c's loss

The first argument is the loss's backend, the rest train_dual.py's command line. The loss factory the trainer's
set-up calls (yolov9c.engine.train.state.make_loss) is replaced, for this process only, by one that builds the
loss on that backend; then train_dual.py's main runs. One process only (a --device 0,1 run would start DDP
workers without the replacement: refused).
Test: python -m pytest -q dev/tests/test_patched_train.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # runs from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))       # patched_train beside it

PROG = "train_other_loss.py"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("torch", "c"):
        print(f"{PROG}: error: the first argument is the loss's backend (torch or c), then train_dual.py's flags",
              file=sys.stderr)
        return 2
    loss, rest = argv[0], argv[1:]
    import yolov9c.engine.train.state as state
    from patched_train import run

    real = state.make_loss

    def other_loss(model, hyp=None, backend="torch"):
        return real(model, hyp, backend=loss)

    return run(PROG, rest, state, "make_loss", other_loss,
               note=f"the loss runs on the {loss} backend, whatever --backend the model runs on",
               ddp_why="DDP workers would train with their own loss")


if __name__ == "__main__":
    sys.exit(main())
