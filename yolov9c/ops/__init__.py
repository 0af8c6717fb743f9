"""Fused ops: one file per op (`nms.py`, ...), each with its C/CUDA entry point and a stock-torch reference.

`extension.py` loads yolov9c._C and converts tensors for it. YOLOV9C_FUSED=0 sends every op to its
reference. Tests: tests/ops/test_<op>.py.
"""
