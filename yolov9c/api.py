"""The public Python API: build_model, load_model, make_loss (documented in README.md).

Thin wrappers so that the CLIs and user code share one entry point; imports are local so that
`import yolov9c` stays cheap.
"""


def build_model(cfg, nc=None):
    """Build a model from a config: a bare name ("yolov9-s" or "yolov9-s.yaml", resolved in
    configs/models/detect/), a path to a yaml file, or a dict in the published yaml schema.
    `nc` overrides the yaml's class count. Returns a DetectionModel (nn.Module) in train mode, float32."""
    from yolov9c.models.model import DetectionModel

    return DetectionModel(cfg, nc=nc)


def load_model(path):
    """Load the model stored in one of our checkpoints or in a published YOLOv9 .pt file (through a
    restricted unpickler). Prefers the EMA weights when present. Returns a float32 DetectionModel."""
    from yolov9c.models.weights import load_model as _load

    return _load(path)


def make_loss(model, hyp=None, backend="torch"):
    """Return a callable (preds, targets) -> (loss_total, loss_items) for `model`: the dual loss for
    models with a DualDDetect head, the single-head loss otherwise. `targets` is (N, 6) float:
    image index, class, x, y, w, h (normalised). `hyp` is a dict or a hyp yaml path (default
    configs/hyps/hyp.scratch-high.yaml). `backend` "torch" is the reference; "c" computes the same loss
    with the C/CUDA assigner and loss kernels (no batch × boxes × anchors tensors)."""
    from yolov9c.loss.detection import make_loss as _make

    return _make(model, hyp, backend=backend)
