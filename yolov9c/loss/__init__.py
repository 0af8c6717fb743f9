"""The YOLOv9 training loss (torch reference and the c branch): TaskAlignedAssigner, CIoU/DFL box terms, BCE.

    from yolov9c.loss import make_loss
    loss_total, loss_items = make_loss(model)(preds, targets)          # backend="torch" | "c"

Files: assigner.py (TaskAlignedAssigner), bbox_loss.py (CIoU + DFL), detection.py (DetectionLoss: single
and dual heads, torch or c branch chosen at construction; make_loss). Box geometry: yolov9c/geometry.py.
Test: python -m pytest -q tests/loss/test_loss.py tests/models/test_goldens_loss.py
"""

from yolov9c.loss.detection import DetectionLoss, make_loss

__all__ = ["DetectionLoss", "make_loss"]
