"""yolov9c.engine.train: see yolov9c/engine/__init__.py."""
