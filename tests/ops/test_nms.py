"""Tests of class-aware NMS: yolov9c.ops.nms.nms (C CPU and CUDA through yolov9c._C) against nms_reference.

Tolerances and conventions:
  * Kept indices must be IDENTICAL (same set, same order) in the torch reference, the C CPU code and the
    CUDA kernels: all three compute IoU in float32 with one operation order (csrc/nms_ref.c states it).
  * Random inputs are clustered so that IoUs cover (0, 1) densely. Up to 3000 boxes the threshold is
    picked near a target value in the widest gap between the inputs' same-class pair IoUs (float64), and
    asserted to be more than 1e-6 from each, so a correct implementation with slightly different rounding
    could not flip a decision. Other cases (the 30 000-box CUDA case, chunk-edge sizes) skip that on
    purpose: there the bit-exact float32 arithmetic the three implementations share is what is tested.
  * Score ties are tested on purpose (float16 scores repeat often; explicit equal scores): the lower index
    ranks first.
  * Bad arguments must raise ValueError/TypeError naming the argument, both in the Python wrapper and in
    the raw binding yolov9c._C.nms_forward (so the C checks themselves run).
CPU cases always run (about 10 s on 2 cores); CUDA cases skip without a GPU.
Run: python -m pytest -q tests/ops/test_nms.py
"""

import math

import numpy as np
import pytest
import torch

from yolov9c.ops import extension
from yolov9c.ops.nms import nms, nms_reference

C = extension.load()
cuda = pytest.mark.cuda  # conftest.py skips it without a GPU; `pytest -m cuda` (gpu_run.sh) selects it


# ----------------------------------------------------------------------------------------------- inputs


def clustered_boxes(n, n_clusters, n_classes, seed, device="cpu"):
    """n boxes (float32 xyxy, pixels in a 640 image) around n_clusters centres, heavy overlap inside a
    cluster; scores uniform in [0, 1); classes uniform in [0, n_classes) (int64), None when n_classes == 0."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(n_clusters, 2, generator=g) * 640
    sizes = 20 + torch.rand(n_clusters, 2, generator=g) * 100
    which = torch.randint(0, n_clusters, (n,), generator=g)
    xy = centres[which] + torch.randn(n, 2, generator=g) * sizes[which] * 0.15
    wh = sizes[which] * (1 + 0.25 * torch.randn(n, 2, generator=g)).clamp(min=0.2)
    boxes = torch.cat([xy - wh / 2, xy + wh / 2], 1)
    scores = torch.rand(n, generator=g)
    classes = torch.randint(0, n_classes, (n,), generator=g) if n_classes else None
    return boxes.to(device), scores.to(device), None if classes is None else classes.to(device)


def overlapping_pair_ious(boxes, classes):
    """float64 IoU of every same-class pair of overlapping boxes (1-D tensor), computed exactly enough
    (float64 from the float32-rounded inputs) to know on which side of a float32 threshold each pair lies."""
    b32 = boxes.float()
    b = b32.double()
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    out = []
    for s in range(0, len(b), 1024):
        r = b32[s:s + 1024]
        ov = (torch.minimum(r[:, None, 2], b32[None, :, 2]) > torch.maximum(r[:, None, 0], b32[None, :, 0])) & (
            torch.minimum(r[:, None, 3], b32[None, :, 3]) > torch.maximum(r[:, None, 1], b32[None, :, 1]))
        if classes is not None:
            ov &= classes[s:s + 1024, None] == classes[None, :]
        i, j = ov.nonzero(as_tuple=True)
        i = i + s
        i, j = i[i < j], j[i < j]
        iw = torch.minimum(b[i, 2], b[j, 2]) - torch.maximum(b[i, 0], b[j, 0])
        ih = torch.minimum(b[i, 3], b[j, 3]) - torch.maximum(b[i, 1], b[j, 1])
        inter = iw * ih
        out.append(inter / (area[i] + area[j] - inter))
    return torch.cat(out)


def tie_free_threshold(boxes, classes, target, margin=1e-6):
    """A threshold within 0.01 of `target`, in the middle of the widest gap between the inputs' pair IoUs
    there, asserted to be more than `margin` from every one of them (see the file docstring)."""
    ious = overlapping_pair_ious(boxes, classes).cpu()
    window = torch.cat([torch.tensor([target - 0.01, target + 0.01], dtype=torch.float64),
                        ious[(ious > target - 0.01) & (ious < target + 0.01)]]).sort().values
    k = int((window[1:] - window[:-1]).argmax())
    thr = float(np.float32((window[k] + window[k + 1]) / 2))
    closest = float((ious - thr).abs().min()) if len(ious) else math.inf
    assert closest > margin, f"no tie-free threshold near {target}: nearest IoU {closest:.2e} away"
    return thr


def raw_cpu(boxes, scores, classes, thr, workspace=None, keep=None, count=None, stream=0):
    """Call the raw binding on NumPy arrays (boxes may be anything, to test its checks); returns the kept
    indices."""
    n = len(scores)
    workspace = np.zeros(C.nms_workspace_size(n, False), np.uint8) if workspace is None else workspace
    keep = np.full(n, -1, np.int64) if keep is None else keep
    count = np.zeros(1, np.int64) if count is None else count
    C.nms_forward(boxes, scores, classes, thr, workspace, keep, count, stream)
    return keep[: count[0]]


def expected_order_check(kept, scores):
    """Kept indices are by score descending, equal scores by lower index."""
    s = scores.float()[kept].tolist()
    k = kept.tolist()
    for a in range(len(k) - 1):
        assert s[a] > s[a + 1] or (s[a] == s[a + 1] and k[a] < k[a + 1]), (a, s[a], s[a + 1], k[a], k[a + 1])


# ------------------------------------------------------------------------------------ CPU: correctness


@pytest.mark.parametrize("dtype,n_classes,target,seed", [
    (torch.float32, 0, 0.45, 1), (torch.float32, 7, 0.65, 2), (torch.float32, 80, 0.5, 3),
    (torch.float16, 0, 0.45, 1), (torch.float16, 7, 0.65, 2),
])
def test_random_inputs_match_reference(dtype, n_classes, target, seed):
    boxes, scores, classes = clustered_boxes(3000, 60, n_classes, seed)
    boxes, scores = boxes.to(dtype), scores.to(dtype)
    thr = tie_free_threshold(boxes, classes, target)
    ref = nms_reference(boxes, scores, thr, classes)
    out = nms(boxes, scores, thr, classes)
    assert out.dtype == torch.int64 and out.device == boxes.device
    assert torch.equal(out, ref), f"C kept {len(out)}, reference kept {len(ref)}"
    # Heavy overlap must actually suppress something, and never everything.
    assert 0 < len(ref) < 3000
    expected_order_check(ref, scores)


def test_int32_classes_and_raw_binding_agree():
    boxes, scores, classes = clustered_boxes(1500, 40, 5, seed=4)
    thr = tie_free_threshold(boxes, classes, 0.55)
    ref = nms_reference(boxes, scores, thr, classes)
    out32 = nms(boxes, scores, thr, classes.int())
    raw = raw_cpu(boxes.numpy(), scores.numpy(), classes.int().numpy(), thr)
    assert torch.equal(out32, ref)
    assert np.array_equal(raw, ref.numpy())
    # int16 classes are accepted by the wrapper (converted), not by the binding.
    assert torch.equal(nms(boxes, scores, thr, classes.to(torch.int16)), ref)


def test_bfloat16_and_float64_inputs():
    boxes, scores, classes = clustered_boxes(800, 20, 3, seed=5)
    bb, sb = boxes.bfloat16(), scores.bfloat16()
    thr = tie_free_threshold(bb, classes, 0.47)
    assert torch.equal(nms(bb, sb, thr, classes), nms_reference(bb, sb, thr, classes))
    # float64 is computed in float32 (documented): the same as rounding the inputs first.
    bd, sd = boxes.double() + 1e-9, scores.double()
    assert torch.equal(nms(bd, sd, 0.47, classes), nms(bd.float(), sd.float(), 0.47, classes))


def test_score_ties_broken_by_lower_index():
    # Ten disjoint boxes with equal scores: all kept, in index order.
    x = torch.arange(10, dtype=torch.float32) * 10
    disjoint = torch.stack([x, x, x + 5, x + 5], 1)
    same = torch.full((10,), 0.5)
    assert nms(disjoint, same, 0.5).tolist() == list(range(10))
    # Identical boxes with equal scores: the lowest index survives (index 3 has a lower score).
    box = torch.tensor([[0.0, 0.0, 10.0, 10.0]]).repeat(6, 1)
    scores = torch.tensor([0.9, 0.9, 0.9, 0.2, 0.9, 0.9])
    assert nms(box, scores, 0.5).tolist() == [0]
    assert nms(box[1:], scores[1:], 0.5).tolist() == [0]   # index 0 here is the former index 1
    # Many exact ties in random data (scores quantised to 16 levels): order and set as the reference.
    boxes, scores, classes = clustered_boxes(2000, 50, 4, seed=6)
    scores = (scores * 16).floor() / 16
    thr = tie_free_threshold(boxes, classes, 0.52)
    ref = nms_reference(boxes, scores, thr, classes)
    out = nms(boxes, scores, thr, classes)
    assert torch.equal(out, ref)
    expected_order_check(out, scores)


def test_nan_scores_and_signed_zero():
    x = torch.arange(6, dtype=torch.float32) * 10
    boxes = torch.stack([x, x, x + 5, x + 5], 1)   # disjoint: order only
    scores = torch.tensor([0.0, float("nan"), -0.0, float("inf"), float("nan"), 0.3])
    out = nms(boxes, scores, 0.5)
    assert out.tolist() == [1, 4, 3, 5, 0, 2]      # NaN first (by index), +inf, 0.3, then 0 == -0 by index
    assert torch.equal(out, nms_reference(boxes, scores, 0.5))
    # A NaN coordinate makes IoU NaN: it suppresses nothing, identically everywhere.
    boxes = torch.tensor([[0.0, 0, 10, 10], [0.0, float("nan"), 10, 10], [1.0, 1, 10, 10]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    out = nms(boxes, scores, 0.5)
    assert torch.equal(out, nms_reference(boxes, scores, 0.5))
    assert out.tolist() == [0, 1]


def test_empty_single_and_all_same_box():
    empty = nms(torch.zeros(0, 4), torch.zeros(0), 0.5)
    assert empty.shape == (0,) and empty.dtype == torch.int64
    assert nms_reference(torch.zeros(0, 4), torch.zeros(0), 0.5).shape == (0,)
    assert raw_cpu(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), None, 0.5).shape == (0,)
    assert nms(torch.tensor([[1.0, 2, 3, 4]]), torch.tensor([0.1]), 0.5).tolist() == [0]
    g = torch.Generator().manual_seed(7)
    box = torch.tensor([[5.0, 5.0, 50.0, 40.0]]).repeat(500, 1)
    scores = torch.rand(500, generator=g)
    assert nms(box, scores, 0.9).tolist() == [int(scores.argmax())]
    # ... but one box per class survives, and classes never suppress each other.
    classes = torch.arange(500) % 5
    out = nms(box, scores, 0.9, classes)
    assert sorted(classes[out].tolist()) == [0, 1, 2, 3, 4]
    assert torch.equal(out, nms_reference(box, scores, 0.9, classes))
    assert len(nms(box, scores, 0.9, torch.arange(500))) == 500


def test_threshold_is_strictly_greater():
    boxes = torch.tensor([[0.0, 0.0, 4.0, 1.0], [0.0, 0.0, 2.0, 1.0]])   # IoU exactly 0.5
    scores = torch.tensor([0.9, 0.8])
    for fn in (nms, nms_reference):
        assert fn(boxes, scores, 0.5).tolist() == [0, 1]
        assert fn(boxes, scores, 0.4999).tolist() == [0]
    # Degenerate (zero-area) boxes: 0/0 IoU suppresses nothing.
    flat = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert nms(flat, scores, 0.0).tolist() == [0, 1]


def test_non_contiguous_inputs_are_handled():
    boxes, scores, classes = clustered_boxes(600, 15, 3, seed=8)
    thr = tie_free_threshold(boxes, classes, 0.5)
    bt = boxes.t().contiguous().t()                # (N, 4) with strides (1, N)
    s2 = torch.stack([scores, scores], 1)[:, 0]    # stride 2
    c2 = torch.stack([classes, classes], 1)[:, 1]
    assert not bt.is_contiguous() and not s2.is_contiguous()
    assert torch.equal(nms(bt, s2, thr, c2), nms_reference(boxes, scores, thr, classes))


def test_fused_switch_routes_to_reference(monkeypatch):
    boxes, scores, classes = clustered_boxes(300, 10, 2, seed=9)

    def unavailable():
        raise ImportError("pretend yolov9c._C is missing")

    monkeypatch.setattr(extension, "load", unavailable)
    monkeypatch.setenv("YOLOV9C_FUSED", "0")
    assert torch.equal(nms(boxes, scores, 0.5, classes), nms_reference(boxes, scores, 0.5, classes))
    monkeypatch.setenv("YOLOV9C_FUSED", "1")
    with pytest.raises(ImportError):
        nms(boxes, scores, 0.5, classes)


# -------------------------------------------------------------------------------- bad input: wrapper

B4 = torch.rand(5, 4)
S5 = torch.rand(5)


@pytest.mark.parametrize("args,exc,word", [
    ((B4.numpy(), S5, 0.5, None), TypeError, "boxes"),
    ((B4, S5.tolist(), 0.5, None), TypeError, "scores"),
    ((torch.rand(5, 4, 1), S5, 0.5, None), ValueError, "boxes"),
    ((torch.rand(5, 3), S5, 0.5, None), ValueError, "boxes"),
    ((B4.int(), S5, 0.5, None), TypeError, "boxes"),
    ((B4, torch.rand(4), 0.5, None), ValueError, "scores"),
    ((B4, torch.rand(5, 1), 0.5, None), ValueError, "scores"),
    ((B4, S5.half(), 0.5, None), TypeError, "scores"),
    ((B4, S5, 0.5, torch.zeros(4, dtype=torch.long)), ValueError, "classes"),
    ((B4, S5, 0.5, torch.zeros(5)), TypeError, "classes"),
    ((B4, S5, 0.5, torch.zeros(5, dtype=torch.bool)), TypeError, "classes"),
    ((B4, S5, 0.5, [0, 0, 0, 0, 0]), TypeError, "classes"),
    ((B4, S5, "0.5", None), TypeError, "iou_thres"),
    ((B4, S5, True, None), TypeError, "iou_thres"),
    ((B4, S5, torch.tensor(0.5), None), TypeError, "iou_thres"),
    ((torch.zeros(0, 4), torch.zeros(0), 0.5, torch.zeros(3, dtype=torch.long)), ValueError, "classes"),
    ((B4, S5, float("nan"), None), ValueError, "iou_thres"),
])
def test_wrapper_rejects_bad_arguments(args, exc, word):
    with pytest.raises(exc, match=word):
        nms(*args)
    with pytest.raises(exc, match=word):
        nms_reference(*args)


# ---------------------------------------------------------------------------- bad input: raw binding


def np_inputs(n=5):
    g = np.random.default_rng(0)
    b = g.random((n, 4), dtype=np.float32)
    b[:, 2:] += b[:, :2]
    return b, g.random(n, dtype=np.float32)


def test_raw_binding_arity_and_argument_types():
    b, s = np_inputs()
    with pytest.raises(TypeError, match=r"nms_forward\(\) takes exactly 8"):
        C.nms_forward(b, s, None, 0.5)
    with pytest.raises(TypeError, match="nms_forward: boxes must be a torch.Tensor .*, got list"):
        raw_cpu([[0, 0, 1, 1]], s, None, 0.5)
    with pytest.raises(TypeError, match="nms_forward: iou_thres"):
        raw_cpu(b, s, None, "x")
    with pytest.raises(ValueError, match="nms_forward: iou_thres must not be NaN"):
        raw_cpu(b, s, None, float("nan"))
    with pytest.raises(TypeError, match="nms_forward: stream must be an int"):
        raw_cpu(b, s, None, 0.5, stream=None)
    with pytest.raises(ValueError, match="nms_forward: stream must be 0 for CPU"):
        raw_cpu(b, s, None, 0.5, stream=1234)
    with pytest.raises(TypeError, match=r"nms_workspace_size\(\) takes exactly 2"):
        C.nms_workspace_size(5)
    with pytest.raises(ValueError, match="nms_workspace_size: n must be"):
        C.nms_workspace_size(-1, False)


@pytest.mark.parametrize("case,exc,message", [
    ("boxes_ndim", ValueError, "nms_forward: boxes must have 2 dimensions"),
    ("boxes_width", ValueError, "nms_forward: boxes must have size 4 in dimension 1"),
    ("boxes_dtype", TypeError, "nms_forward: boxes must be float32, float16, got float64"),
    ("boxes_uint16", TypeError, "nms_forward: boxes has NumPy dtype"),
    ("boxes_strided", ValueError, "nms_forward: boxes must be contiguous"),
    ("boxes_swapped", ValueError, "nms_forward: boxes is not in native byte order"),
    ("scores_len", ValueError, "nms_forward: scores must have size 5 in dimension 0"),
    ("scores_dtype", TypeError, "nms_forward: scores must have the dtype of boxes"),
    ("scores_strided", ValueError, "nms_forward: scores must be contiguous"),
    ("classes_len", ValueError, "nms_forward: classes must have size 5"),
    ("classes_dtype", TypeError, "nms_forward: classes must be int32, int64, got float32"),
    ("keep_len", ValueError, "nms_forward: keep must have size 5"),
    ("keep_dtype", TypeError, "nms_forward: keep must be int64, got int32"),
    ("keep_readonly", ValueError, "nms_forward: keep is an output and must be writeable"),
    ("count_shape", ValueError, "nms_forward: count must have size 1"),
    ("workspace_small", ValueError, "nms_forward: workspace has"),
    ("workspace_dtype", TypeError, "nms_forward: workspace must be uint8"),
    ("mixed_devices", ValueError, "nms_forward: scores is on cpu but boxes is on cuda:0"),
    ("descriptor_short", TypeError, "nms_forward: boxes descriptor must be"),
    ("descriptor_device", ValueError, "nms_forward: boxes descriptor's device must be"),
    ("descriptor_dtype", TypeError, "nms_forward: boxes descriptor has unknown dtype code"),
    ("descriptor_shape", TypeError, "nms_forward: boxes descriptor's strides must be a tuple of 2"),
    ("descriptor_align", ValueError, "nms_forward: boxes data pointer is not aligned"),
    ("descriptor_null", ValueError, "nms_forward: boxes has a null data pointer"),
])
def test_raw_binding_checks(case, exc, message):
    b, s = np_inputs()
    kw = {}
    cls = None
    if case == "boxes_ndim":
        b = b[:, :, None]
    elif case == "boxes_width":
        b = np.ascontiguousarray(b[:, :3])
    elif case == "boxes_dtype":
        b = b.astype(np.float64)
    elif case == "boxes_uint16":
        b = b.astype(np.uint16)
    elif case == "boxes_strided":
        b = np.asfortranarray(b)
    elif case == "boxes_swapped":
        b = b.astype(b.dtype.newbyteorder())
    elif case == "scores_len":
        s = s[:4]
    elif case == "scores_dtype":
        s = s.astype(np.float16)
    elif case == "scores_strided":
        s = np.stack([s, s], 1)[:, 0]
    elif case == "classes_len":
        cls = np.zeros(4, np.int64)
    elif case == "classes_dtype":
        cls = np.zeros(5, np.float32)
    elif case == "keep_len":
        kw["keep"] = np.zeros(4, np.int64)
    elif case == "keep_dtype":
        kw["keep"] = np.zeros(5, np.int32)
    elif case == "keep_readonly":
        keep = np.zeros(5, np.int64)
        keep.flags.writeable = False
        kw["keep"] = keep
    elif case == "count_shape":
        kw["count"] = np.zeros(2, np.int64)
    elif case == "workspace_small":
        kw["workspace"] = np.zeros(8, np.uint8)
    elif case == "workspace_dtype":
        kw["workspace"] = np.zeros(4096, np.int64)
    elif case == "mixed_devices":
        # A CUDA descriptor next to CPU arrays is rejected before any pointer is touched.
        b = (0x10000, C.DTYPE_FLOAT32, (5, 4), (4, 1), 0)
    elif case == "descriptor_short":
        b = (0x10000, C.DTYPE_FLOAT32, (5, 4), (4, 1))
    elif case == "descriptor_device":
        b = (0x10000, C.DTYPE_FLOAT32, (5, 4), (4, 1), -1)
    elif case == "descriptor_dtype":
        b = (0x10000, 99, (5, 4), (4, 1), 0)
    elif case == "descriptor_shape":
        b = (0x10000, C.DTYPE_FLOAT32, (5, 4), (4,), 0)
    elif case == "descriptor_align":
        b = (0x10002, C.DTYPE_FLOAT32, (5, 4), (4, 1), 0)
    elif case == "descriptor_null":
        b = (0, C.DTYPE_FLOAT32, (5, 4), (4, 1), 0)
    with pytest.raises(exc, match=message.replace("(", r"\(").replace(")", r"\)")):
        raw_cpu(b, s, cls, 0.5, **kw)


def test_raw_binding_output_untouched_on_error():
    b, s = np_inputs()
    keep = np.full(5, -7, np.int64)
    with pytest.raises(TypeError):
        raw_cpu(b, s.astype(np.float16), None, 0.5, keep=keep)
    assert (keep == -7).all()


# ------------------------------------------------------------------------------------------ CUDA


def cuda_cpu_ref(boxes, scores, thr, classes):
    """(CUDA result, C CPU result, reference on the GPU) for the same inputs."""
    out = nms(boxes, scores, thr, classes)
    cpu_b, cpu_s = boxes.cpu(), scores.cpu()
    cpu = nms(cpu_b, cpu_s, thr, None if classes is None else classes.cpu())
    ref = nms_reference(boxes, scores, thr, classes)
    return out, cpu, ref


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_classes,target,seed", [(0, 0.45, 1), (7, 0.65, 2), (80, 0.5, 3)])
def test_cuda_matches_reference_and_cpu(dtype, n_classes, target, seed):
    boxes, scores, classes = clustered_boxes(3000, 60, n_classes, seed, device="cuda")
    boxes, scores = boxes.to(dtype), scores.to(dtype)
    thr = tie_free_threshold(boxes, classes, target)
    out, cpu, ref = cuda_cpu_ref(boxes, scores, thr, classes)
    assert out.is_cuda and out.dtype == torch.int64
    assert torch.equal(out.cpu(), cpu) and torch.equal(out, ref)
    assert 0 < len(out) < 3000


@cuda
@pytest.mark.parametrize("n", [1, 63, 64, 65, 129, 4097])
def test_cuda_chunk_edges(n):
    # Sizes around the 64-box words of the suppression mask.
    boxes, scores, classes = clustered_boxes(n, max(1, n // 40), 3, seed=n, device="cuda")
    out, cpu, ref = cuda_cpu_ref(boxes, scores, 0.5, classes)
    assert torch.equal(out.cpu(), cpu) and torch.equal(out, ref)


@cuda
def test_cuda_score_ties_nan_and_empty():
    box = torch.tensor([[0.0, 0.0, 10.0, 10.0]], device="cuda").repeat(300, 1)
    scores = torch.full((300,), 0.5, device="cuda")
    assert nms(box, scores, 0.5).tolist() == [0]
    boxes, scores, classes = clustered_boxes(2000, 50, 4, seed=6, device="cuda")
    scores = (scores * 16).floor() / 16
    scores[::97] = float("nan")
    out, cpu, ref = cuda_cpu_ref(boxes, scores, 0.52, classes)
    assert torch.equal(out.cpu(), cpu) and torch.equal(out, ref)
    e = nms(torch.zeros(0, 4, device="cuda"), torch.zeros(0, device="cuda"), 0.5)
    assert e.shape == (0,) and e.is_cuda and e.dtype == torch.int64


@cuda
def test_cuda_non_default_stream_and_sync(monkeypatch):
    boxes, scores, classes = clustered_boxes(5000, 100, 10, seed=11, device="cuda")
    expect = nms(boxes.cpu(), scores.cpu(), 0.6, classes.cpu())
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        # Inputs produced on this stream right before the call: the kernels must run on it, after them.
        b2 = boxes * 1.0
        out = nms(b2, scores, 0.6, classes)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), expect)
    monkeypatch.setenv("YOLOV9C_SYNC", "1")
    assert torch.equal(nms(boxes, scores, 0.6, classes).cpu(), expect)


@cuda
def test_cuda_large_n():
    # The published NMS caps candidates at 30 000; bit-exact arithmetic is required here (no tie check).
    boxes, scores, classes = clustered_boxes(30000, 100, 4, seed=12, device="cuda")
    out, cpu, ref = cuda_cpu_ref(boxes, scores, 0.5, classes)   # about 4400 kept
    assert torch.equal(out.cpu(), cpu) and torch.equal(out, ref)
    out1 = nms(boxes, scores, 0.5)   # one class: more suppression
    assert torch.equal(out1.cpu(), nms(boxes.cpu(), scores.cpu(), 0.5))
    assert len(out1) < len(out)


@cuda
def test_cuda_bad_arguments():
    boxes, scores, classes = clustered_boxes(10, 2, 2, seed=13, device="cuda")
    with pytest.raises(ValueError, match="scores"):
        nms(boxes, scores.cpu(), 0.5, classes)
    with pytest.raises(ValueError, match="classes"):
        nms(boxes, scores, 0.5, classes.cpu())
    n = 10
    ws = torch.empty(C.nms_workspace_size(n, True), dtype=torch.uint8, device="cuda")
    keep = torch.empty(n, dtype=torch.int64, device="cuda")
    count = torch.empty(1, dtype=torch.int64, device="cuda")
    stream = extension.stream_of(boxes.device)
    with pytest.raises(ValueError, match="nms_forward: workspace has"):
        C.nms_forward(boxes, scores, classes, 0.5, ws[:16], keep, count, stream)
    with pytest.raises(ValueError, match="nms_forward: boxes must be contiguous"):
        C.nms_forward(boxes.t().contiguous().t(), scores, classes, 0.5, ws, keep, count, stream)
    with pytest.raises(ValueError, match="nms_forward: keep is on cpu but boxes is on cuda"):
        C.nms_forward(boxes, scores, classes, 0.5, ws, keep.cpu(), count, stream)
