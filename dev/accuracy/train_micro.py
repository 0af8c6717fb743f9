"""train_dual.py with every loader batch split into micro-batches of YOLOV9C_MICRO_BATCH images: bench_accuracy.py's
`microN` runners (c+micro8: the c backend, micro-batches of 8), which train as a run our out-of-memory guard split
(engine/train/guards.back_off): the gradient of the whole batch, each BatchNorm over a micro-batch. They tell what
that split does to accuracy, apart from memory pressure (RESULTS.md §12: runs sharing a card were split). A
developer tool: the product splits only where the memory plan or the guard must.

    YOLOV9C_MICRO_BATCH=8 python dev/accuracy/train_micro.py --backend c --data D.yaml --img 640 --batch 32 ...

After set-up's memory plan (state.plan_memory) the run's micro-batch is set as the guard sets it
(state.progress.micro_batch; kept in last.pt, so a --resume keeps it too); a micro-batch not below the loader
batch changes nothing. The rest of the command line is train_dual.py's; its main runs in this process (a
--device 0,1 run would start DDP workers without the change: refused).
Test: python -m pytest -q dev/tests/test_patched_train.py
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # runs from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))       # patched_train beside it

PROG = "train_micro.py"
ENV = "YOLOV9C_MICRO_BATCH"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    text = os.environ.get(ENV, "")
    if not text.isdigit() or int(text) < 1:
        print(f"{PROG}: error: {ENV}={text!r}: give the micro-batch, a whole number of images >= 1", file=sys.stderr)
        return 2
    micro = int(text)
    import yolov9c.engine.train.state as state
    from patched_train import run

    real = state.plan_memory

    def plan_then_split(st):
        real(st)
        if micro < st.cfg.batch_size // st.world:  # the loader batch of a rank (set-up's batching comes later)
            st.progress.micro_batch = micro

    return run(PROG, argv, state, "plan_memory", plan_then_split,
               note=f"each loader batch runs as micro-batches of {micro} images (BatchNorm over {micro})",
               ddp_why="DDP workers would train their whole batches")


if __name__ == "__main__":
    sys.exit(main())
