"""The detect workflow (yolov9c/engine/detect/predictor.py) end to end on the CPU.

- A "perfect" model (a fixed-output module, no weights) whose boxes are placed in the letterboxed input:
  the label files must hold the boxes mapped back to the original image exactly as computed by hand, NMS
  must drop the overlapping lower-scored box of the same class, --classes / --agnostic-nms / --max-det act,
  crops land in crops/<class>/ with the published gain/pad, --nosave writes no image.
- Real tiny models from checkpoints saved in the test (random weights, nc=8): gelan-t and yolov9-t on
  synthetic images and a generated mp4v video: files, label format (5 or 6 columns, normalised), frame
  suffixes, the output video, yolov9-t (main head) giving the same labels as its converted gelan-t, and a
  published-layout .pt of the same weights giving the same labels as our checkpoint.

Run: python -m pytest -q tests/engine/detect/test_detect_predictor.py
"""

import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from yolov9c.engine.detect.predictor import DetectConfig, detect, main_head_output
from yolov9c.geometry import scale_boxes

NAMES = ["zero", "one", "two", "three"]


class FixedBoxes(torch.nn.Module):
    """Eval-mode stand-in for a detection model: returns (y, None) with y (B, 4+4, 5) built from ROWS
    (xywh in input pixels, class, score); records the input it saw."""

    ROWS = (  # (xc, yc, w, h, class, score)
        (80, 64, 40, 20, 1, 0.9),
        (81, 64, 40, 20, 1, 0.5),   # same class, IoU ~0.95 with the first: suppressed
        (20, 20, 16, 16, 2, 0.8),
        (80, 65, 40, 20, 3, 0.6),   # other class on the first box: kept unless --agnostic-nms
        (100, 100, 10, 10, 0, 0.1),  # below --conf-thres 0.25
    )

    def __init__(self):
        super().__init__()
        self.stride = torch.tensor([8.0, 16.0, 32.0])
        self.names = NAMES
        self.seen = []

    def forward(self, x):
        self.seen.append(x.clone())
        y = torch.zeros(x.shape[0], 4 + len(NAMES), len(self.ROWS))
        for a, (xc, yc, w, h, c, s) in enumerate(self.ROWS):
            y[:, :4, a] = torch.tensor([xc, yc, w, h], dtype=torch.float32)
            y[:, 4 + c, a] = s
        return y, None


# For a 240x320 (h, w) image at --imgsz 160: scale 0.5 → 120x160, padded to 128x160 (4 px top and bottom).
# Box 1: input xyxy (60, 54, 100, 74) → original (120, 100, 200, 140) → normalised xc .5, yc .5, w .25, h 1/6
# Box 2: input xyxy (12, 12, 28, 28) → original (24, 16, 56, 48) → xc .125, yc 2/15, w .1, h 2/15
# Box 3: input xyxy (60, 55, 100, 75) → original (120, 102, 200, 142) → xc .5, yc 122/240, w .25, h 1/6
EXPECT = {
    1: (0.5, 0.5, 0.25, 1 / 6, 0.9),
    2: (0.125, 2 / 15, 0.1, 2 / 15, 0.8),
    3: (0.5, 122 / 240, 0.25, 1 / 6, 0.6),
}


def _read_labels(path):
    return [[float(v) for v in line.split()] for line in path.read_text().splitlines()]


@pytest.fixture
def image_240x320(tmp_path):
    img = np.full((240, 320, 3), 60, np.uint8)
    img[:, :160] = (0, 0, 255)  # left half red (BGR)
    d = tmp_path / "src"
    d.mkdir()
    cv2.imwrite(str(d / "pic.png"), img)
    return d / "pic.png"


def test_perfect_model_labels_are_the_hand_computed_boxes(image_240x320, tmp_path):
    model = FixedBoxes()
    logs = []
    r = detect(DetectConfig(source=image_240x320, imgsz=160, project=tmp_path / "runs", save_txt=True,
                            save_conf=True, save_crop=True), model=model, log=logs.append)
    x = model.seen[0]
    assert x.shape == (1, 3, 128, 160) and x.dtype == torch.float32
    assert x[0, 0, 64, 10] == 1.0 and x[0, 2, 64, 10] == 0.0  # RGB order, scaled to [0, 1]
    assert r["save_dir"] == tmp_path / "runs" / "exp" and r["frames"] == 1 and r["detections"] == 3
    rows = _read_labels(r["save_dir"] / "labels" / "pic.txt")
    assert [int(row[0]) for row in rows] == [3, 2, 1]  # published: reversed(det), the least confident first
    for row in rows:
        assert row[1:] == pytest.approx(EXPECT[int(row[0])], abs=2e-6)
    assert (r["save_dir"] / "pic.png").is_file()
    crop = cv2.imread(str(r["save_dir"] / "crops" / "one" / "pic.jpg"))
    assert crop.shape == (51, 91, 3)  # 80x40 box × 1.02 + 10 px = 91.6x50.8 at (160, 120): x 114..205, y 94..145
    assert (r["save_dir"] / "crops" / "two" / "pic.jpg").is_file()
    assert (r["save_dir"] / "crops" / "three" / "pic.jpg").is_file()
    assert logs[0].startswith(f"image 1/1 {image_240x320}: 128x160 1 one, 1 two, 1 three, ")
    assert logs[-2].startswith("Speed: ") and "per image at shape (1, 3, 160, 160)" in logs[-2]
    assert "1 labels saved to" in logs[-1]


class OffPixelBoxes(FixedBoxes):
    ROWS = ((80.3, 64.2, 40.5, 20.2, 1, 0.9), (20, 20, 16, 16, 2, 0.8))


def test_label_rows_are_whole_pixel_boxes_least_confident_first(image_240x320, tmp_path):
    # published detect_dual.py: det[:, :4] = scale_boxes(...).round(), then `for ... in reversed(det)`.
    # Box 1: input xyxy (60.05, 54.1, 100.55, 74.3) → original (120.1, 100.2, 201.1, 140.6) → (120, 100, 201, 141)
    r = detect(DetectConfig(source=image_240x320, imgsz=160, project=tmp_path, save_txt=True, save_conf=True),
               model=OffPixelBoxes(), log=lambda s: None)
    lines = (r["save_dir"] / "labels" / "pic.txt").read_text().splitlines()
    assert lines[0].startswith("2 ") and lines[1] == "1 %g %g %g %g 0.9" % (321 / 640, 241 / 480, 81 / 320, 41 / 240)


@pytest.mark.parametrize("kw, classes", [
    ({"classes": [2, 3]}, [3, 2]), ({"agnostic_nms": True}, [2, 1]), ({"max_det": 1}, [1]),
    ({"conf_thres": 0.05}, [0, 3, 2, 1]),
])
def test_filters(image_240x320, tmp_path, kw, classes):
    r = detect(DetectConfig(source=image_240x320, imgsz=160, project=tmp_path, save_txt=True, nosave=True, **kw),
               model=FixedBoxes(), log=lambda s: None)
    rows = _read_labels(r["save_dir"] / "labels" / "pic.txt")
    assert [int(row[0]) for row in rows] == classes
    assert all(len(row) == 5 for row in rows)  # no conf column without save_conf
    assert not list(r["save_dir"].glob("*.png"))  # --nosave


def test_run_dirs_increment_unless_exist_ok(image_240x320, tmp_path):
    kw = {"source": image_240x320, "imgsz": 160, "project": tmp_path}
    dirs = [detect(DetectConfig(**kw), model=FixedBoxes(), log=lambda s: None)["save_dir"].name for _ in range(2)]
    dirs.append(detect(DetectConfig(exist_ok=True, **kw), model=FixedBoxes(), log=lambda s: None)["save_dir"].name)
    assert dirs == ["exp", "exp2", "exp"]


def test_scale_boxes_inverts_the_letterbox():
    boxes = torch.tensor([[10.0, 20.0, 300.0, 200.0], [0.0, 0.0, 320.0, 240.0]])
    r, pad = 0.5, 4  # 240x320 → 128x160, as above
    lb = boxes * r
    lb[:, [1, 3]] += pad
    assert torch.allclose(scale_boxes(lb.clone(), (128, 160), (240, 320)), boxes)
    clipped = scale_boxes(torch.tensor([[-5.0, 0.0, 170.0, 140.0]]), (128, 160), (240, 320))
    assert clipped.tolist() == [[0.0, 0.0, 320.0, 240.0]]


def test_main_head_output_takes_the_main_branch():
    aux, main = torch.zeros(1, 12, 7), torch.ones(1, 12, 7)
    assert main_head_output(([aux, main], None)) is main
    assert main_head_output((main, None)) is main
    assert main_head_output(main) is main


# ---- real models ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def synthetic_val(tmp_path_factory):
    from yolov9c.data.synthetic import synthetic_dataset

    yaml_file = synthetic_dataset(root=tmp_path_factory.mktemp("cache"))
    return sorted((yaml_file.parent / "images" / "val").glob("*.jpg"))[:3]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """yolov9-t (random weights, nc=8), and its converted gelan-t, saved in our format (fp32)."""
    import yolov9c
    from yolov9c.models.checkpoint import save_checkpoint
    from yolov9c.models.reparam import reparameterize

    d = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    y9 = yolov9c.build_model("yolov9-t", nc=8).eval()
    # The initial head biases make every box the whole image at score ~1e-3 in both branches, so aux and main
    # would give the same labels; random final-layer biases make the two branches' detections differ.
    with torch.no_grad():
        for n, p in y9.model[-1].named_parameters():
            if n.endswith(".2.bias"):
                p.normal_(0.0, 2.0)
    y9.names = [f"c{i}" for i in range(8)]
    gelan = reparameterize(y9, "gelan-t")
    save_checkpoint(d / "yolov9-t.pt", y9, half=False)
    save_checkpoint(d / "gelan-t.pt", gelan, half=False)
    # the same weights as a published YOLOv9 file (pickled model objects, fp16) and as ours in fp16
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))  # tests/models/test_checkpoint.py
    from test_checkpoint import PublishedLayout

    PublishedLayout(d / "published").save(d / "published-yolov9-t.pt", y9, ema=y9, half=True)
    save_checkpoint(d / "yolov9-t-fp16.pt", y9, half=True)
    return d


def test_real_models_main_head_equals_converted_gelan(synthetic_val, checkpoints, tmp_path):
    src = tmp_path / "imgs"
    src.mkdir()
    for p in synthetic_val:
        (src / p.name).write_bytes(p.read_bytes())
    out = {}
    for w in ("yolov9-t", "gelan-t"):
        r = detect(DetectConfig(weights=checkpoints / f"{w}.pt", source=src, imgsz=160, conf_thres=0.25, max_det=5,
                                project=tmp_path / "runs", name=w, save_txt=True, save_conf=True), log=lambda s: None)
        assert r["frames"] == 3 and r["detections"] > 0
        assert sorted(p.name for p in r["save_dir"].glob("*.jpg")) == [p.name for p in synthetic_val]
        labels = {p.name: _read_labels(p) for p in (r["save_dir"] / "labels").glob("*.txt")}
        for rows in labels.values():
            assert 1 <= len(rows) <= 5
            for row in rows:
                assert len(row) == 6 and row[0] == int(row[0]) and 0 <= row[0] < 8
                assert all(0 <= v <= 1 for v in row[1:5]) and 0.25 < row[5] <= 1
        out[w] = labels
    assert out["yolov9-t"].keys() == out["gelan-t"].keys()
    for k in out["yolov9-t"]:
        a, b = np.array(out["yolov9-t"][k]), np.array(out["gelan-t"][k])
        assert a.shape == b.shape and np.allclose(a, b, atol=1e-4), k


def test_video_labels_frames_and_mp4(checkpoints, tmp_path):
    vid = tmp_path / "clip.mp4"
    vw = cv2.VideoWriter(str(vid), cv2.VideoWriter_fourcc(*"mp4v"), 5, (96, 64))
    for i in range(4):
        frame = np.full((64, 96, 3), 90, np.uint8)
        cv2.circle(frame, (20 + 15 * i, 32), 10, (30, 200, 40), -1)
        vw.write(frame)
    vw.release()
    r = detect(DetectConfig(weights=checkpoints / "gelan-t.pt", source=vid, imgsz=64, conf_thres=0.001, max_det=3,
                            vid_stride=2, project=tmp_path / "runs", save_txt=True), log=lambda s: None)
    assert r["frames"] == 2
    assert sorted(p.name for p in (r["save_dir"] / "labels").glob("*.txt")) == ["clip_1.txt", "clip_2.txt"]
    assert all(len(row) == 5 for p in (r["save_dir"] / "labels").glob("*.txt") for row in _read_labels(p))
    cap = cv2.VideoCapture(str(r["save_dir"] / "clip.mp4"))
    try:
        assert cap.isOpened() and int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == 2
        ok, frame = cap.read()
        assert ok and frame.shape == (64, 96, 3)
    finally:
        cap.release()


def test_published_pt_gives_the_same_labels_as_ours(synthetic_val, checkpoints, tmp_path):
    got = []
    for w in ("published-yolov9-t", "yolov9-t-fp16"):
        r = detect(DetectConfig(weights=checkpoints / f"{w}.pt", source=synthetic_val[0], imgsz=160, conf_thres=0.25,
                                max_det=5, project=tmp_path, name=w, save_txt=True, save_conf=True, nosave=True),
                   log=lambda s: None)
        got.append((r["save_dir"] / "labels" / f"{synthetic_val[0].stem}.txt").read_text())
    assert got[0] == got[1] and got[0].count("\n") >= 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_half_on_cuda_matches_float32(synthetic_val, checkpoints, tmp_path):
    got = {}
    for half in (False, True):
        r = detect(DetectConfig(weights=checkpoints / "yolov9-t.pt", source=synthetic_val[0], imgsz=160,
                                conf_thres=0.25, max_det=5, device="0", half=half, project=tmp_path, name=f"h{half}",
                                save_txt=True, save_conf=True, nosave=True), log=lambda s: None)
        got[half] = np.array(_read_labels(r["save_dir"] / "labels" / f"{synthetic_val[0].stem}.txt"))
    assert got[True].shape == got[False].shape
    assert np.allclose(got[True], got[False], atol=5e-3)  # fp16 rounding of boxes and scores
