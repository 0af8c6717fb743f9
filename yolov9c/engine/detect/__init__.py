"""yolov9c.engine.detect: see yolov9c/engine/__init__.py."""
