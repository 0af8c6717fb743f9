"""Statistics of augmented training samples and batches, shared by both sides of the fidelity harness.

Plain numpy + OpenCV, no yolov9c and no published import: compare_published.py (our side) and
published_side.py (run inside the published checkout) both load this file, so the two sides measure with the
same code.

    s = item_stats(img_chw_rgb_uint8, labels_n6)      # one sample -> dict of numbers and small arrays
    summary = summarize([s, ...])                    # aggregates, histograms (plain JSON)
    rows = compare_summaries(ours, published)        # [(metric, ours, published, z)] for the report

Not a test: a developer tool (see dev/fidelity/compare_published.py).
"""

import math
import os

import cv2
import numpy as np

GREY = 114
# FIDELITY_EDGES=1 (compare_published.py --rects: bright rectangles drawn exactly at the label boxes): each
# sample also measures where its boxes' edges are in the pixels (edge_offsets), both sides with this code
EDGES = os.environ.get("FIDELITY_EDGES") == "1"
# box size bins: sqrt(w * h) in pixels of the sample (COCO's small/medium/large cut at 32 and 96 px for 640)
SIZE_EDGES = (0, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 10_000)
ASPECT_EDGES = (0, 0.25, 0.5, 0.8, 1.25, 2.0, 4.0, 1e9)


def item_stats(img, labels):
    """img: (3, H, W) uint8 RGB (what the loader yields per sample); labels (n, 6) [idx, cls, xc, yc, w, h]
    normalised. Returns a dict: n boxes, per-box class / side / aspect arrays, per-channel mean and std,
    the share of grey-114 padding pixels and the mean |Laplacian| (sharpness: tells how an image was decoded
    and resized)."""
    img = np.asarray(img)
    labels = np.asarray(labels, np.float64).reshape(-1, 6)
    _, h, w = img.shape
    px = img.reshape(3, -1).astype(np.float64)
    gray = cv2.cvtColor(np.ascontiguousarray(img.transpose(1, 2, 0)), cv2.COLOR_RGB2GRAY)
    lap = cv2.Laplacian(gray, cv2.CV_32F)
    bw, bh = labels[:, 4] * w, labels[:, 5] * h
    return {
        "n": int(len(labels)),
        "cls": labels[:, 1].astype(np.int64),
        "side": np.sqrt(np.maximum(bw * bh, 0.0)),
        "aspect": bw / np.maximum(bh, 1e-9),
        "mean": px.mean(1) / 255.0,
        "std": px.std(1) / 255.0,
        "grey": float((img == GREY).all(0).mean()),
        "sharp": float(np.abs(lap).mean()),
        "hw": (int(h), int(w)),
        **(edge_offsets(gray, labels) if EDGES else {}),
    }


def _crossing(v, thr, i_in, i_out):
    """Sub-pixel position (pixel centres at k + 0.5) where the profile v goes from above thr at i_in to below
    it at the adjacent i_out."""
    a, b = float(v[i_in]), float(v[i_out])
    t = (a - thr) / max(a - b, 1e-9)
    return i_in + 0.5 + (i_out - i_in) * t


def _run_edges(v, c, thr):
    """(start, end) of the bright run of profile v through index c: the crossings on both sides, or None when
    the run reaches the end of the profile."""
    lo = c
    while lo > 0 and v[lo - 1] >= thr:
        lo -= 1
    hi = c
    while hi < len(v) - 1 and v[hi + 1] >= thr:
        hi += 1
    if lo == 0 or hi == len(v) - 1:
        return None
    return _crossing(v, thr, lo, lo - 1), _crossing(v, thr, hi, hi + 1)


def edge_offsets(gray, labels, min_side=12, margin=3, contrast=40):
    """Signed offsets in pixels (measured − labelled) of the left, right, top and bottom edges of each label
    box whose rectangle is visible: on the row and the column through the box centre, the bright run around
    the centre, cut at half way between the centre's level and the background 3 px outside the box. Boxes
    smaller than min_side, within margin of the border or without the contrast are skipped. For datasets of
    bright rectangles on a dark ground drawn exactly at their labels (compare_published.py --rects)."""
    h, w = gray.shape
    out = {k: [] for k in ("edge_x1", "edge_x2", "edge_y1", "edge_y2")}
    g = gray.astype(np.float64)
    for _, _, xc, yc, bw, bh in labels:
        x1, x2, y1, y2 = (xc - bw / 2) * w, (xc + bw / 2) * w, (yc - bh / 2) * h, (yc + bh / 2) * h
        if min(x2 - x1, y2 - y1) < min_side or x1 < margin or y1 < margin or x2 > w - margin or y2 > h - margin:
            continue
        cx, cy = min(int(xc * w), w - 1), min(int(yc * h), h - 1)
        fg = g[cy, cx]
        bg = min(g[cy, max(int(x1) - 3, 0)], g[cy, min(int(x2) + 3, w - 1)],
                 g[max(int(y1) - 3, 0), cx], g[min(int(y2) + 3, h - 1), cx])
        if fg - bg < contrast:
            continue
        thr = (fg + bg) / 2
        row, col = _run_edges(g[cy], cx, thr), _run_edges(g[:, cx], cy, thr)
        if row is None or col is None:
            continue
        out["edge_x1"].append(row[0] - x1)
        out["edge_x2"].append(row[1] - x2)
        out["edge_y1"].append(col[0] - y1)
        out["edge_y2"].append(col[1] - y2)
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def batch_items(imgs, targets):
    """Split a collated batch (imgs (B, 3, H, W) uint8 or float in [0, 1], targets (N, 6) with the image
    index in column 0) into item_stats dicts."""
    imgs = np.asarray(imgs)
    if imgs.dtype != np.uint8:
        imgs = np.clip(np.rint(imgs.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)
    targets = np.asarray(targets, np.float64).reshape(-1, 6)
    return [item_stats(imgs[b], targets[targets[:, 0] == b]) for b in range(imgs.shape[0])]


def _hist(items, key, edges):
    x = np.concatenate([s[key] for s in items])
    return (np.histogram(x, edges)[0] / max(len(x), 1)).tolist()


def _cls_hist(cls, nc):
    cls = np.asarray(cls, np.int64)
    return (np.bincount(cls, minlength=nc)[:max(nc, int(cls.max(initial=0)) + 1)] / max(len(cls), 1)).tolist()


def _mean_se(x):
    x = np.asarray(x, np.float64)
    if len(x) == 0:
        return float("nan"), float("nan")
    se = x.std(ddof=1) / math.sqrt(len(x)) if len(x) > 1 else float("nan")
    return float(x.mean()), float(se)


def summarize(items, nc=80):
    """Aggregate item_stats dicts into plain JSON: each scalar as [mean, standard error], histograms as shares."""
    if not items:
        return {"items": 0}
    cat = lambda k: np.concatenate([s[k] for s in items]) if items else np.zeros(0)  # noqa: E731
    side, aspect, cls = cat("side"), cat("aspect"), cat("cls").astype(np.int64)
    out = {"items": len(items)}
    out["boxes_per_image"] = _mean_se([s["n"] for s in items])
    out["empty_images"] = _mean_se([s["n"] == 0 for s in items])
    out["box_side_px"] = _ratio_mean_se([s["side"] for s in items])
    out["box_side_median_px"] = float(np.median(side)) if len(side) else float("nan")
    out["grey_share"] = _mean_se([s["grey"] for s in items])
    out["sharpness"] = _mean_se([s["sharp"] for s in items])
    for c, name in enumerate("RGB"):
        out[f"pixel_mean_{name}"] = _mean_se([s["mean"][c] for s in items])
        out[f"pixel_std_{name}"] = _mean_se([s["std"][c] for s in items])
    n = max(len(side), 1)
    out["hist_side"] = {"edges": list(SIZE_EDGES),
                        "share": (np.histogram(side, SIZE_EDGES)[0] / n).tolist()}
    out["hist_aspect"] = {"edges": list(ASPECT_EDGES),
                          "share": (np.histogram(aspect, ASPECT_EDGES)[0] / n).tolist()}
    out["hist_cls"] = _cls_hist(cls, nc)
    # the same histograms of two halves of the items: their distance is the sampling noise of this sample
    half = len(items) // 2
    if half >= 2:
        out["noise"] = {}
        for key, fn in (("hist_side", lambda it: _hist(it, "side", SIZE_EDGES)),
                        ("hist_aspect", lambda it: _hist(it, "aspect", ASPECT_EDGES)),
                        ("hist_cls", lambda it: _cls_hist(np.concatenate([s["cls"] for s in it]), nc))):
            out["noise"][key] = hist_distance(fn(items[:half]), fn(items[half:]))
    out["shapes"] = sorted({f"{s['hw'][0]}x{s['hw'][1]}" for s in items})
    if "edge_x1" in items[0]:
        for k in ("edge_x1", "edge_x2", "edge_y1", "edge_y2"):
            out[k] = _ratio_mean_se([s[k] for s in items])
        out["edge_boxes"] = int(sum(len(s["edge_x1"]) for s in items))
    return out


def _ratio_mean_se(groups):
    """Mean over all values of the groups (boxes of the images) with a cluster-robust standard error: boxes of one
    image are not independent (a mosaic scale shrinks all of them), so the error is computed per image."""
    n = np.array([len(g) for g in groups], np.float64)
    tot = np.array([np.sum(g) for g in groups], np.float64)
    if n.sum() == 0:
        return float("nan"), float("nan")
    m = tot.sum() / n.sum()
    k = len(groups)
    se = math.sqrt(k / max(k - 1, 1) * np.sum((tot - m * n) ** 2)) / n.sum()
    return float(m), float(se)


def _z(a, b):
    """z score of the difference of two [mean, se] pairs (nan when no spread is known)."""
    (ma, sa), (mb, sb) = a, b
    se = math.sqrt((sa if sa == sa else 0.0) ** 2 + (sb if sb == sb else 0.0) ** 2)
    if se == 0:
        return 0.0 if ma == mb else float("inf")
    return (ma - mb) / se


def hist_distance(a, b):
    """Total variation distance (0 = same shares, 1 = disjoint) of two share lists."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    m = max(len(a), len(b))
    a, b = np.pad(a, (0, m - len(a))), np.pad(b, (0, m - len(b)))
    return float(0.5 * np.abs(a - b).sum())


def hist_flag_level(ours, pub, key, floor=0.02):
    """Distance above which two histograms differ for real: 1.5 x the mean split-half distance of the two
    samples (two halves differ by the noise of samples of half the size, so this is about 2x the noise
    expected between the full samples), at least `floor`."""
    halves = [s.get("noise", {}).get(key) for s in (ours, pub)]
    halves = [h for h in halves if h is not None]
    return max(floor, 1.5 * float(np.mean(halves))) if halves else 0.05


def compare_summaries(ours, pub):
    """Rows (metric, ours, published, z or distance, kind) for two summarize() outputs; kind 'z' (a mean with its
    standard error: |z| > 4 is a real difference at these sample sizes) or 'tv' (histogram distance, with the
    level above which it is flagged in the published slot)."""
    rows = []
    for k, v in ours.items():
        if isinstance(v, (list, tuple)) and len(v) == 2 and k in pub and not k.startswith("hist"):
            if all(isinstance(x, (int, float)) for x in v):
                rows.append((k, v[0], pub[k][0], _z(v, pub[k]), "z"))
    for k in ("hist_side", "hist_aspect", "hist_cls"):
        if k in ours and k in pub:
            a, b = (ours[k], pub[k]) if k == "hist_cls" else (ours[k]["share"], pub[k]["share"])
            rows.append((k, None, hist_flag_level(ours, pub, k), hist_distance(a, b), "tv"))
    return rows
