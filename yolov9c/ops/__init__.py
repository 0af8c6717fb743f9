"""Fused ops: one file per op (`nms.py`, ...), each with its C/CUDA entry point and a stock-torch reference.

`extension.py` loads yolov9c._C (which takes torch tensors as they are) and reads the run-time switches.
YOLOV9C_FUSED=0 sends every op to its reference. Tests: tests/ops/test_<op>.py.
"""
