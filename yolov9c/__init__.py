"""yolov9c: YOLOv9 training that fits.

The published YOLOv9 workflow (train_dual.py, model yamls, datasets, checkpoints) with a memory-lean
C/CUDA backend. The Python API:

    import yolov9c
    model = yolov9c.build_model("yolov9-s", nc=80)      # nn.Module, published state_dict layout
    model = yolov9c.load_model("yolov9-c.pt")           # our checkpoints or published YOLOv9 .pt files
    loss_fn = yolov9c.make_loss(model)                  # (preds, targets) -> (loss_total, loss_items)
"""

__version__ = "0.1.0"

__all__ = ["build_model", "load_model", "make_loss", "__version__"]


def __getattr__(name):
    # the API is imported on first use: `import yolov9c.<module>` (the CLI's light commands, such as
    # `python -m yolov9c memory`) does not pay for importing torch
    if name in ("build_model", "load_model", "make_loss"):
        from yolov9c import api

        return getattr(api, name)
    raise AttributeError(f"module 'yolov9c' has no attribute {name!r}")
