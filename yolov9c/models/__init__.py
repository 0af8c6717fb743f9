"""YOLOv9 / GELAN models (torch reference): yaml → modules, fuse, re-parameterisation, checkpoints.

common.py (building blocks), head.py (DFL, DDetect, DualDDetect, anchors), parse.py (yaml schema, channel
rules, row-naming errors), model.py (DetectionModel, fuse), reparam.py (yolov9-X → gelan-X),
checkpoint.py (our checkpoint format: make, save, strip, read), ckpt_data.py (its keys, plain data, errors),
atomic_io.py (atomic writes), published.py (restricted unpickler for published .pt files), weights.py (weights
into models: load_model), info.py (model summary). Nothing is imported here, so `import yolov9c`
stays cheap. Tests: tests/models/test_models.py, tests/models/test_goldens.py, tests/models/test_fuse_reparam.py.
"""
