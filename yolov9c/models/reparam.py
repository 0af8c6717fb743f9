"""Re-parameterisation: a trained YOLOv9 model (PGI auxiliary branch + DualDDetect) → its GELAN
inference model, by copying the main branch's tensors; the auxiliary branch and head are dropped.

    gelan = reparameterize(yolov9_model, "gelan-c")    # same nc, dtype and device as the source

Which yolov9 layer feeds which gelan layer is read from the two configs: the main branch is every layer
the main half of DualDDetect depends on (its `from` closure), in index order; a leading Silence that the
gelan config lacks is skipped. The head's main half (cv4, cv5, dfl2) becomes DDetect's cv2, cv3, dfl.
For the published configs this gives the published mappings (tools/reparameterization.ipynb):
  T, S: gelan i ← yolov9 i (i < 22), head 22 ← 29;   M, C: gelan i ← yolov9 i+1 (i < 22), head 22 ← 38;
  E: gelan i ← yolov9 i (i < 29), 29-41 ← i+7, head 42 ← 49.
Every copied row must have the same module and args, its inputs must map onto the gelan row's inputs,
and every tensor must have the same shape, else ValueError.
Tests: tests/models/test_fuse_reparam.py (`pytest tests/models/test_fuse_reparam.py -k reparam`).
"""

from yolov9c.models.model import DetectionModel
from yolov9c.models.parse import row_text

HEAD_RENAME = {"cv4": "cv2", "cv5": "cv3", "dfl2": "dfl"}  # yolov9 main-head name → gelan head name


def _rows(d):
    return list(d["backbone"]) + list(d["head"])


def _sources(f, i):
    """Absolute input indices of row i (−1 at row 0 = the image)."""
    out = []
    for j in [f] if isinstance(f, int) else f:
        out.append(-1 if (i == 0 and j == -1) else j % i)
    return out


def layer_mapping(yolov9_cfg, gelan_cfg):
    """{gelan layer index: yolov9 layer index} for two model dicts (the head included)."""
    src, dst = _rows(yolov9_cfg), _rows(gelan_cfg)
    if src[-1][2] != "DualDDetect":
        raise ValueError(f"reparameterize: the source model's head is {src[-1][2]}, not DualDDetect "
                         "(only a YOLOv9 training model has an auxiliary branch to remove)")
    if dst[-1][2] != "DDetect":
        raise ValueError(f"reparameterize: the target config's head is {dst[-1][2]}, not DDetect")
    head_in = src[-1][0]
    main = head_in[len(head_in) // 2:]

    keep, stack = set(), list(main)
    while stack:
        j = stack.pop()
        if j < 0 or j in keep:
            continue
        keep.add(j)
        stack.extend(_sources(src[j][0], j))
    order = sorted(keep)
    if order and src[order[0]][2] == "Silence" and dst[0][2] != "Silence":
        order = order[1:]
    n_body = len(dst) - 1
    if len(order) != n_body:
        raise ValueError(f"reparameterize: the source's main branch has {len(order)} layers, the target config "
                         f"has {n_body} (+ head): they are not the same model family")
    mapping = dict(enumerate(order))
    mapping[n_body] = len(src) - 1

    inverse = {j: i for i, j in mapping.items()}
    for i, j in mapping.items():
        a, b = dst[i], src[j]
        if i == n_body:
            want = [inverse.get(s) for s in main]
            if list(a[0]) != want:
                raise ValueError(f"reparameterize: target head row {i} ({row_text(a)}) reads {a[0]}, "
                                 f"but the source's main head inputs map to {want}")
            continue
        if a[2] != b[2] or a[1] != b[1] or a[3] != b[3]:
            raise ValueError(f"reparameterize: target row {i} ({row_text(a)}) does not match source row {j} "
                             f"({row_text(b)})")
        # the inputs must correspond: a source input that is the image or a skipped Silence is the image
        want = [inverse.get(s) if s >= 0 and (s in inverse or src[s][2] != "Silence") else -1
                for s in _sources(b[0], j)]
        got = _sources(a[0], i)
        if got != want:
            raise ValueError(f"reparameterize: target row {i} ({row_text(a)}) reads layers {got}, but source row "
                             f"{j} ({row_text(b)}) reads layers that map to {want}")
    return mapping


def reparameterize(model, gelan_cfg):
    """Build the gelan model for `gelan_cfg` (name, path or dict; nc taken from `model`) and copy the
    main-branch tensors of the YOLOv9 `model` into it. Returns the gelan DetectionModel with the source's
    names, dtype, device and train/eval mode. The source must not be fused."""
    p = next(model.parameters())
    gelan = DetectionModel(gelan_cfg, nc=model.nc).to(device=p.device, dtype=p.dtype)  # cast first: no rounding
    mapping = layer_mapping(model.yaml, gelan.yaml)
    head_i = len(gelan.model) - 1
    src_sd, dst_sd = model.state_dict(), gelan.state_dict()
    new = {}
    for key, t in dst_sd.items():
        _, i, rest = key.split(".", 2)
        i = int(i)
        if i == head_i:
            first, _, tail = rest.partition(".")
            rest = next(k for k, v in HEAD_RENAME.items() if v == first) + "." + tail
        skey = f"model.{mapping[i]}.{rest}"
        if skey not in src_sd:
            raise ValueError(f"reparameterize: the source model has no {skey} for {key} "
                             "(a fused model cannot be re-parameterised; use the unfused weights)")
        s = src_sd[skey]
        if s.shape != t.shape:
            raise ValueError(f"reparameterize: shape mismatch: source {skey} {tuple(s.shape)} vs target {key} "
                             f"{tuple(t.shape)}")
        new[key] = s
    gelan.load_state_dict(new)
    gelan.names = list(model.names)
    gelan.train(model.training)
    return gelan
