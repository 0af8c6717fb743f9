"""train_dual.py's main in this process with one module attribute replaced for the run: what the accuracy
benchmark's swap runners (train_other_loss.py, train_unfused.py) share. A developer tool.

    patched_train.run(PROG, argv, module, "name", replacement, note="...", ddp_why="...")

Refuses a multi-GPU --device with one `PROG: error: one process only: <ddp_why>` line (DDP workers would start
without the replacement) and returns 2 before anything trains; else prints `PROG: <note>`, runs train_dual.py's
main on argv and puts the attribute back, whatever happens.
Tests: dev/tests/test_patched_train.py, dev/tests/test_patched_train.py
"""

import sys


def run(prog, argv, module, name, replacement, note, ddp_why):
    device = argv[argv.index("--device") + 1] if "--device" in argv[:-1] else ""
    if "," in device:
        print(f"{prog}: error: one process only: {ddp_why}", file=sys.stderr)
        return 2
    from yolov9c.cli.train import main as train_main

    real = getattr(module, name)
    setattr(module, name, replacement)
    print(f"{prog}: {note}", flush=True)
    try:
        return train_main(argv)
    finally:
        setattr(module, name, real)
