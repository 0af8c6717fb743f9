"""Validation plots: confusion matrix, PR / F1 / P / R curves (matplotlib, Agg) and batch mosaics (OpenCV).

Files (published names): confusion_matrix.png, PR_curve.png, F1_curve.png, P_curve.png, R_curve.png,
val_batch{i}_labels.jpg / val_batch{i}_pred.jpg (predictions above confidence 0.25 only, as published).
Plot failures are reported, never raised: a plot must not
end a validation or a training run.

Test: python -m pytest -q tests/engine/val/test_validator.py -k plots
"""

import math
import warnings
from pathlib import Path

import cv2
import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _colour(c):
    """A stable BGR colour for class c."""
    rng = np.random.default_rng(int(c) * 7919 + 17)
    return tuple(int(v) for v in rng.integers(40, 256, 3))


PRED_CONF_THRES = 0.25  # the published mosaics draw predictions above this confidence only


def boxes_to_draw(targets, conf_thres=PRED_CONF_THRES):
    """The rows of `targets` a mosaic draws: every label row (N, 6); of prediction rows (N, 7), those whose
    confidence (column 6) is above conf_thres, as published: the validation NMS keeps boxes down to conf
    0.001, which would bury the image."""
    if targets.shape[1] > 6:
        return targets[targets[:, 6] > conf_thres]
    return targets


def plot_images(imgs, targets, paths, out, names, max_images=16, conf_thres=PRED_CONF_THRES):
    """Mosaic of a batch with boxes. imgs: (B, 3, H, W) float in [0, 1] (or uint8) RGB; targets: (N, 6)
    [image, cls, xc, yc, w, h] pixels, or (N, 7) with a confidence column (predictions: only those above
    conf_thres are drawn, see boxes_to_draw)."""
    try:
        imgs = imgs.detach().float().cpu().numpy()
        if imgs.max() <= 1.0:
            imgs = imgs * 255
        targets = boxes_to_draw(targets.detach().float().cpu().numpy(), conf_thres)
        bs = min(len(imgs), max_images)
        _, _, h, w = imgs.shape
        ns = math.ceil(bs ** 0.5)
        mosaic = np.full((ns * h, ns * w, 3), 255, np.uint8)
        for i in range(bs):
            y0, x0 = (i // ns) * h, (i % ns) * w
            tile = np.ascontiguousarray(imgs[i].transpose(1, 2, 0)[:, :, ::-1].clip(0, 255).astype(np.uint8))
            for row in targets[targets[:, 0] == i]:
                c = int(row[1])
                xc, yc, bw, bh = row[2:6]
                p1, p2 = (int(xc - bw / 2), int(yc - bh / 2)), (int(xc + bw / 2), int(yc + bh / 2))
                cv2.rectangle(tile, p1, p2, _colour(c), 1)
                text = names[c] if c < len(names) else str(c)
                if len(row) > 6:
                    text += f" {row[6]:.1f}"
                cv2.putText(tile, text, (p1[0], max(p1[1] - 2, 8)), cv2.FONT_HERSHEY_SIMPLEX, 0.3, _colour(c), 1)
            cv2.putText(tile, Path(paths[i]).name[:40], (3, h - 4), cv2.FONT_HERSHEY_SIMPLEX, 0.3, (220, 220, 220), 1)
            mosaic[y0:y0 + h, x0:x0 + w] = tile
        cv2.imwrite(str(out), mosaic)
    except Exception as e:  # noqa: BLE001 - a plot never ends a run
        warnings.warn(f"plot_images {out}: {e}", stacklevel=2)


def plot_confusion_matrix(cm, names, save_dir, normalize=True):
    """confusion_matrix.png: columns = true class (+ background), rows = predicted; normalised per column."""
    try:
        plt = _pyplot()
        m = cm.matrix.copy()
        if normalize:
            m = m / (m.sum(0).reshape(1, -1) + 1e-9)
        m[m < 0.005] = np.nan
        nc = cm.nc
        labels = (list(names)[:nc] if 0 < nc < 99 and len(names) >= nc else []) + ["background"]
        fig, ax = plt.subplots(1, 1, figsize=(12, 9), tight_layout=True)
        im = ax.imshow(m, cmap="Blues", vmin=0.0, vmax=1.0 if normalize else None)
        fig.colorbar(im, ax=ax)
        if len(labels) == nc + 1:
            ax.set_xticks(range(nc + 1), labels, rotation=90, fontsize=8)
            ax.set_yticks(range(nc + 1), labels, fontsize=8)
            if nc < 30:
                for i in range(nc + 1):
                    for j in range(nc + 1):
                        if not np.isnan(m[i, j]):
                            ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xlabel("True")
        ax.set_ylabel("Predicted")
        ax.set_title("Confusion Matrix")
        fig.savefig(Path(save_dir) / "confusion_matrix.png", dpi=150)
        plt.close(fig)
    except Exception as e:  # noqa: BLE001 - a plot never ends a run
        warnings.warn(f"confusion matrix plot: {e}", stacklevel=2)


def plot_metric_curves(curves, names, save_dir):
    """PR_curve.png (precision vs recall, IoU 0.5, with per-class AP), F1/P/R_curve.png (vs confidence)."""
    try:
        plt = _pyplot()
        px, classes = curves["px"], curves["classes"]
        names = list(names)
        ap50 = curves["ap"][:, 0]

        def label(i):
            c = int(classes[i])
            return names[c] if c < len(names) else str(c)

        fig, ax = plt.subplots(1, 1, figsize=(9, 6), tight_layout=True)
        for i in range(len(classes)):
            ax.plot(px, curves["pr_curve"][i], linewidth=1, label=f"{label(i)} {ap50[i]:.3f}" if len(classes) < 21 else None)
        ax.plot(px, curves["pr_curve"].mean(0), linewidth=3, color="blue", label=f"all classes {ap50.mean():.3f} mAP@0.5")
        ax.set(xlabel="Recall", ylabel="Precision", xlim=(0, 1), ylim=(0, 1), title="Precision-Recall Curve")
        ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left")
        fig.savefig(Path(save_dir) / "PR_curve.png", dpi=150)
        plt.close(fig)
        for key, ylabel, fname in (("f1_curve", "F1", "F1_curve.png"), ("p_curve", "Precision", "P_curve.png"),
                                   ("r_curve", "Recall", "R_curve.png")):
            y = curves[key]
            fig, ax = plt.subplots(1, 1, figsize=(9, 6), tight_layout=True)
            for i in range(len(classes)):
                ax.plot(px, y[i], linewidth=1, label=label(i) if len(classes) < 21 else None)
            mean = y.mean(0)
            best = int(mean.argmax())
            ax.plot(px, mean, linewidth=3, color="blue", label=f"all classes {mean[best]:.2f} at {px[best]:.3f}")
            ax.set(xlabel="Confidence", ylabel=ylabel, xlim=(0, 1), ylim=(0, 1), title=f"{ylabel}-Confidence Curve")
            ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left")
            fig.savefig(Path(save_dir) / fname, dpi=150)
            plt.close(fig)
    except Exception as e:  # noqa: BLE001 - a plot never ends a run
        warnings.warn(f"metric curves plot: {e}", stacklevel=2)
