"""Test-time augmentation (yolov9c/engine/tta.py) and the --augment flag of val_dual.py / detect_dual.py:
- scale_img resizes and pads to the stride with 0.447;
- on a random gelan-t the output has the three passes' anchors minus the published clipping (the scale-1
  pass's coarsest level, the 0.67 pass's finest level), counted from the head's own raw maps;
- a stub detector that boxes the bright rectangle of whatever image it is given (so its predictions follow
  the flip and the scale) gets every de-augmented box back onto the rectangle of the input image, and the
  flipped pass alone would not (x un-flip is really exercised); after NMS the top box has IoU > 0.5;
- val_dual.py and detect_dual.py run end to end with --augment.

Run: python -m pytest -q tests/engine/test_tta.py   (CPU, a few seconds)
"""

import math

import numpy as np
import pytest
import torch

import yolov9c
from yolov9c.engine.postprocess import non_max_suppression
from yolov9c.engine.tta import FLIPS, PAD_VALUE, SCALES, augmented_inference, scale_img

BOX = (20.0, 30.0, 60.0, 50.0)  # x1 y1 x2 y2 of the bright rectangle: off-centre in x


def _image(h=128, w=160):
    img = torch.full((1, 3, h, w), 0.2)
    x1, y1, x2, y2 = (int(v) for v in BOX)
    img[..., y1:y2, x1:x2] = 1.0
    return img


class BlobDetector(torch.nn.Module):
    """Eval output like DualDDetect: ([aux, main], maps). main: at every anchor whose centre falls inside the
    bright (> 0.9) region of its input, that region's xywh box with score 0.9; elsewhere score 0. aux is
    garbage (must not be used)."""

    def __init__(self):
        super().__init__()
        self.stride = torch.tensor([8.0, 16.0, 32.0])
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        b, _, h, w = x.shape
        mask = x[0, 0] > 0.9
        ys, xs = torch.nonzero(mask, as_tuple=True)
        x1, x2, y1, y2 = float(xs.min()), float(xs.max()) + 1, float(ys.min()), float(ys.max()) + 1
        preds, maps = [], []
        for s in self.stride.tolist():
            gh, gw = math.ceil(h / s), math.ceil(w / s)
            cy, cx = torch.meshgrid((torch.arange(gh) + 0.5) * s, (torch.arange(gw) + 0.5) * s, indexing="ij")
            inside = ((cx >= x1) & (cx < x2) & (cy >= y1) & (cy < y2)).flatten().float()
            p = torch.zeros(b, 5, gh * gw)
            p[:, 0], p[:, 1], p[:, 2], p[:, 3] = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1
            p[:, 4] = 0.9 * inside
            preds.append(p)
            maps.append(torch.zeros(b, 1, gh, gw))
        main = torch.cat(preds, -1)
        return [torch.rand_like(main) * 1000, main], [maps, maps]


def _iou(a, b):
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_scale_img_resizes_and_pads_with_published_value():
    img = torch.rand(2, 3, 96, 128)
    assert scale_img(img, 1.0) is img
    out = scale_img(img, 0.67, gs=32)
    sh, sw = int(96 * 0.67), int(128 * 0.67)
    assert out.shape == (2, 3, 96, 96)  # ceil(64.32/32)·32, ceil(85.76/32)·32
    assert torch.all(out[..., sh:, :] == PAD_VALUE) and torch.all(out[..., :, sw:] == PAD_VALUE)
    assert torch.allclose(out[..., :sh, :sw].mean(), img.mean(), atol=0.02)


def test_output_has_the_three_passes_anchors_minus_the_clipped_levels():
    torch.manual_seed(0)
    model = yolov9c.build_model("gelan-t", nc=3).eval()
    imgs = torch.rand(2, 3, 160, 224)
    expected = 0
    with torch.no_grad():
        for k, (s, f) in enumerate(zip(SCALES, FLIPS)):
            y, maps = model(scale_img(imgs.flip(-1) if f else imgs, s, 32))
            n = [m.shape[-2] * m.shape[-1] for m in maps]
            assert y.shape[-1] == sum(n)
            expected += y.shape[-1] - (n[-1] if k == 0 else n[0] if k == 2 else 0)
        out = augmented_inference(model, imgs)
    assert out.shape == (2, 4 + 3, expected)
    assert torch.isfinite(out).all()


def test_symmetric_detector_gets_deflipped_boxes_back_in_place():
    img = _image()
    model = BlobDetector()
    with torch.no_grad():
        y = augmented_inference(model, img)
    hit = y[0, :, y[0, 4] > 0]
    assert hit.shape[1] > 0
    cx, cy, w, h = (BOX[0] + BOX[2]) / 2, (BOX[1] + BOX[3]) / 2, BOX[2] - BOX[0], BOX[3] - BOX[1]
    # resize quantisation: at most a couple of input pixels at scale 0.67
    assert torch.allclose(hit[0], torch.full_like(hit[0], cx), atol=2.5)
    assert torch.allclose(hit[1], torch.full_like(hit[1], cy), atol=2.5)
    assert torch.allclose(hit[2], torch.full_like(hit[2], w), atol=3.5)
    assert torch.allclose(hit[3], torch.full_like(hit[3], h), atol=3.5)
    # the flipped pass as seen without un-flipping would sit at W − cx: far from the box
    flipped, _ = model(scale_img(img.flip(-1), 0.83))
    raw_x = flipped[1][0, 0, 0].item() / 0.83
    assert abs(raw_x - cx) > 30 and abs(img.shape[-1] - raw_x - cx) < 2.5


def test_tta_finds_the_box_the_plain_model_finds():
    img = _image()
    model = BlobDetector()
    with torch.no_grad():
        plain = non_max_suppression(model(img)[0][1], 0.25, 0.45)[0]
        aug = non_max_suppression(augmented_inference(model, img), 0.25, 0.45)[0]
    assert len(plain) >= 1 and _iou(plain[0, :4].tolist(), BOX) > 0.9
    assert len(aug) >= 1 and _iou(aug[0, :4].tolist(), BOX) > 0.5


@pytest.fixture(scope="module")
def weights_and_data(tmp_path_factory):
    from yolov9c.data.synthetic import synthetic_dataset
    from yolov9c.models.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("tta")
    data = synthetic_dataset(seed=5, root=root, n_train=2, n_val=3, imgsz=128)
    torch.manual_seed(0)
    weights = root / "gelan-t.pt"
    save_checkpoint(weights, yolov9c.build_model("gelan-t", nc=8))
    return root, data, weights


def test_val_dual_runs_with_augment(weights_and_data, tmp_path, capsys):
    from yolov9c.cli.val import main

    _, data, weights = weights_and_data
    code = main(["--weights", str(weights), "--data", str(data), "--img", "96", "--batch", "2", "--device",
                 "cpu", "--workers", "0", "--augment", "--project", str(tmp_path / "runs"), "--save-txt"])
    out = capsys.readouterr().out
    assert code == 0
    assert "mAP50-95" in out and any(line.split()[:2] == ["all", "3"] for line in out.splitlines())
    assert (tmp_path / "runs" / "exp" / "confusion_matrix.png").is_file()


def test_detect_dual_runs_with_augment(weights_and_data, tmp_path, capsys):
    from yolov9c.cli.detect import main

    from yolov9c.data.dataset_yaml import load_data_config

    _, data, weights = weights_and_data
    src = load_data_config(str(data))["val"]
    src = src[0] if isinstance(src, (list, tuple)) else src
    code = main(["--weights", str(weights), "--source", str(src), "--img", "96", "--device", "cpu",
                 "--conf-thres", "0.001", "--max-det", "3", "--augment", "--save-txt",
                 "--project", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert code == 0
    labels = list((tmp_path / "runs" / "exp" / "labels").glob("*.txt"))
    assert len(labels) == 3 and "Speed: " in out
    rows = np.loadtxt(labels[0], ndmin=2)
    assert rows.shape[1] == 5 and np.all((rows[:, 1:] >= 0) & (rows[:, 1:] <= 1))
