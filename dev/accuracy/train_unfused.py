"""train_dual.py with every training op on its torch reference but validation's NMS on the extension:
bench_accuracy.py's `unfused` runner (its environment sets YOLOV9C_FUSED=0), which tells whether an accuracy gap
of the c backend comes from its kernels (the c structure on torch ops) or from the structure itself. A developer
tool: the product never mixes the two.

    YOLOV9C_FUSED=0 python dev/accuracy/train_unfused.py --backend c --data D.yaml --img 640 ...

NMS takes no part in training, and its reference (one Python iteration per kept box, up to 30,000 candidates a
photo) makes each validation of a barely trained model take minutes: the unfused fruit runs of 2026-12-07 trained
3 epochs in 1,280 s. Here nms() alone reads the switch as on; every other op still follows YOLOV9C_FUSED. The rest
of the command line is train_dual.py's; its main runs in this process (a --device 0,1 run would start DDP workers
without the change: refused).
Test: python -m pytest -q dev/tests/test_patched_train.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # runs from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))       # patched_train beside it

PROG = "train_unfused.py"


class _NmsSwitch:
    """yolov9c.ops.nms's view of the extension module: the module itself, its switch always on."""

    def __init__(self, extension):
        self._extension = extension

    def __getattr__(self, name):
        return getattr(self._extension, name)

    @staticmethod
    def fused_enabled():
        return True


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    import yolov9c.ops.nms as nms
    from patched_train import run

    return run(PROG, argv, nms, "extension", _NmsSwitch(nms.extension),
               note="validation's NMS on the extension; the other ops as YOLOV9C_FUSED says",
               ddp_why="DDP workers would validate with the reference NMS")


if __name__ == "__main__":
    sys.exit(main())
