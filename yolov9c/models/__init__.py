"""YOLOv9 / GELAN models (torch reference): yaml → modules, fuse, re-parameterisation, checkpoints.

common.py (building blocks), head.py (DFL, DDetect, DualDDetect, anchors), parse.py (yaml schema, channel
rules, row-naming errors), model.py (DetectionModel, fuse), reparam.py (yolov9-X → gelan-X),
checkpoint.py / info.py (checkpoint I/O, model summary). Nothing is imported here, so `import yolov9c`
stays cheap. Tests: tests/test_models.py, tests/test_goldens.py, tests/test_fuse_reparam.py.
"""
