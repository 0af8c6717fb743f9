"""The YOLOv9 training loss (torch reference): TaskAlignedAssigner, CIoU/DFL box terms, BCE, the dual loss.

    from yolov9c.loss import make_loss
    loss_total, loss_items = make_loss(model)(preds, targets)

Files: boxes.py (box geometry), assigner.py (TaskAlignedAssigner), bbox_loss.py (CIoU + DFL),
detection.py (single and dual loss, make_loss). Test: python -m pytest -q tests/test_loss.py tests/test_goldens_loss.py
"""

from yolov9c.loss.detection import DetectionLoss, DualDetectionLoss, make_loss

__all__ = ["DetectionLoss", "DualDetectionLoss", "make_loss"]
