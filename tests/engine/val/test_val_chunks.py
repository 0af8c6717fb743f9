"""Validation in chunks (ValConfig.chunk: images per forward, the loader's batch kept as the batch of record):
- CPU, fp32: a random gelan-t and yolov9-t (dual head) on 8 synthetic images in one loader batch of 8,
  validated in chunks of 1, 3 and 5 images, give the same detections (the --save-txt rows with confidences,
  text equal) and validation losses (exact: an eval-mode model treats every image on its own) as one pass; the
  model really ran in those chunks (forward calls of 1, 3, ... images). A random model matches no label
  (mAP 0), so the metrics are compared on a predictor that finds each image's labels from its pixels, with
  boxes shifted and one class in four wrong (0 < mAP50-95 < mAP50 < 1): the same P, R, mAP50, mAP50-95;
- the plots of a chunked pass are written as usual;
- CUDA, fp16 (AMP validation): chunks of 3 against one pass, mAP and losses within fp16 rounding.
Run: python -m pytest -q tests/engine/val/test_val_chunks.py
"""

import pytest
import torch

import yolov9c
from yolov9c.engine.val.validator import ValConfig, validate

METRICS = ("mp", "mr", "map50", "map", "box_loss", "cls_loss", "dfl_loss")


@pytest.fixture(scope="module")
def val_data(val_split):
    cfg, loader = val_split(seed=4, imgsz=128, batch=8)
    assert len(loader) == 1 and loader.batch_size == 8
    return cfg, loader


def _run(model, loss_fn, cfg, loader, out_dir, chunk, **extra):
    sizes = []
    hook = model.register_forward_pre_hook(lambda m, args: sizes.append(args[0].shape[0]))
    try:
        r = validate(model, loader, nc=cfg["nc"], names=cfg["names"], compute_loss=loss_fn, log=lambda *_: None,
                     cfg=ValConfig(chunk=chunk, save_dir=out_dir, save_txt=True, save_conf=True, **extra))
    finally:
        hook.remove()
    rows = {p.name: p.read_text() for p in sorted((out_dir / "labels").glob("*.txt"))}
    return r, rows, sizes


@pytest.mark.parametrize("name", ["gelan-t", "yolov9-t"])
def test_chunks_give_the_same_detections_and_metrics(val_data, tmp_path, name):
    cfg, loader = val_data
    torch.manual_seed(1)
    model = yolov9c.build_model(name, nc=cfg["nc"])
    loss_fn = yolov9c.make_loss(model)
    whole, rows, sizes = _run(model, loss_fn, cfg, loader, tmp_path / "whole", None)
    assert sizes == [8] and sum(len(t.splitlines()) for t in rows.values()) > 8  # detections to compare
    for chunk, want in ((1, [1] * 8), (3, [3, 3, 2]), (5, [5, 3])):
        r, got_rows, got_sizes = _run(model, loss_fn, cfg, loader, tmp_path / f"chunk{chunk}", chunk)
        assert got_sizes == want
        assert got_rows == rows, f"chunks of {chunk}: other detections"
        for k in METRICS:
            assert r[k] == whole[k], (chunk, k, r[k], whole[k])
        assert r["seen"] == whole["seen"] == 8 and (r["nt"] == whole["nt"]).all()


class LabelReader(torch.nn.Module):
    """Finds each image's labels by its pixels (a per-image model, whatever the chunk) and returns them as
    DDetect eval output (y (B, 4+nc, A), no maps): boxes shifted by a few pixels that grow with the box's
    index, confidences falling with it, every fourth class wrong."""

    def __init__(self, loader, nc):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))  # gives the validator a device
        self.nc, self.labels = nc, {}
        for imgs, t, _, _ in loader:
            for i in range(imgs.shape[0]):
                self.labels[imgs[i].numpy().tobytes()] = t[t[:, 0] == i, 1:]

    def forward(self, imgs):
        b, _, h, w = imgs.shape
        rows = [self.labels[(imgs[i] * 255).round().to(torch.uint8).numpy().tobytes()] for i in range(b)]
        y = torch.zeros(b, 4 + self.nc, 64)  # a fixed anchor count, as a detector's at one image size
        for i, r in enumerate(rows):
            for k, (c, xc, yc, bw, bh) in enumerate(r.tolist()):
                c = (int(c) + 1) % self.nc if k % 4 == 3 else int(c)
                y[i, :4, k] = torch.tensor([xc * w + k % 5, yc * h - k % 3, bw * w, bh * h])
                y[i, 4 + c, k] = 0.9 - 0.01 * k
        return y, []


def test_chunks_give_the_same_metrics(val_data, tmp_path):
    cfg, loader = val_data
    model = LabelReader(loader, cfg["nc"])
    whole, rows, _ = _run(model, None, cfg, loader, tmp_path / "whole", None)
    assert 0 < whole["map"] < whole["map50"] < 0.99 and whole["mp"] > 0 and whole["mr"] > 0, whole
    for chunk in (1, 3, 5):
        r, got_rows, sizes = _run(model, None, cfg, loader, tmp_path / f"chunk{chunk}", chunk)
        assert sizes == [chunk] * (8 // chunk) + ([8 % chunk] if 8 % chunk else [])
        assert got_rows == rows
        for k in METRICS[:4]:
            assert r[k] == whole[k], (chunk, k)
        assert (r["maps"] == whole["maps"]).all()


def test_a_chunk_of_the_whole_batch_or_more_is_one_pass(val_data, tmp_path):
    cfg, loader = val_data
    torch.manual_seed(1)
    model = yolov9c.build_model("gelan-t", nc=cfg["nc"])
    for chunk in (8, 64):
        _, _, sizes = _run(model, None, cfg, loader, tmp_path / f"c{chunk}", chunk)
        assert sizes == [8]


def test_a_chunked_pass_writes_its_plots(val_data, tmp_path):
    cfg, loader = val_data
    torch.manual_seed(1)
    model = yolov9c.build_model("gelan-t", nc=cfg["nc"])
    _run(model, None, cfg, loader, tmp_path, 3, plots=True)
    for f in ("val_batch0_labels.jpg", "val_batch0_pred.jpg", "confusion_matrix.png"):
        assert (tmp_path / f).stat().st_size > 1000, f


@pytest.mark.cuda
def test_chunks_in_fp16_on_the_gpu(val_data, tmp_path):
    cfg, loader = val_data
    torch.manual_seed(1)
    model = yolov9c.build_model("yolov9-t", nc=cfg["nc"]).cuda()
    loss_fn = yolov9c.make_loss(model)
    whole, _, _ = _run(model, loss_fn, cfg, loader, tmp_path / "whole", None, half=True)
    r, _, sizes = _run(model, loss_fn, cfg, loader, tmp_path / "chunks", 3, half=True)
    assert sizes == [3, 3, 2]
    for k in METRICS:  # cuDNN may pick other kernels for another batch: fp16 rounding, not other results
        assert r[k] == pytest.approx(whole[k], rel=2e-2, abs=2e-3), k
