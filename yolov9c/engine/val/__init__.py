"""yolov9c.engine.val: see yolov9c/engine/__init__.py."""
