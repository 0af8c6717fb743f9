"""Why is val/cls_loss large? The validation loss of a checkpoint with BatchNorm in eval mode (running statistics,
what training's validation uses) against BatchNorm with each batch's own statistics, plus the class logits of
background anchors. A large val/cls_loss that comes back to the training level with batch statistics means the
running statistics lag the weights (docs/train.md, "FAQ: val/cls_loss far above train/cls_loss").

    python dev/probes/val_loss_bn_check.py --weights runs/train/exp/weights/epoch17.pt --data synthetic --img 640

Prints one JSON line per BN mode: box/cls/dfl loss (means over the batches, as results.csv), and the mean and
the 99th percentile of the class logits of every anchor (nearly all are background). CPU or --device 0.
"""

import argparse
import json

import numpy as np
import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--data", default="synthetic")
    ap.add_argument("--img", type=int, default=640)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()

    from yolov9c.data.dataset import DatasetConfig
    from yolov9c.data.dataset_yaml import load_data_config
    from yolov9c.data.loader import LoaderConfig, create_dataloader
    from yolov9c.engine.val.validator import split_outputs
    from yolov9c.loss.detection import make_loss
    from yolov9c.models.weights import load_model

    device = torch.device("cpu" if a.device == "cpu" else f"cuda:{a.device}")
    model = load_model(a.weights).to(device).float().eval()  # the EMA weights, as training validates them
    data = load_data_config(a.data)
    gs = max(int(model.stride.max()), 32)
    cfg = DatasetConfig(augment=False, rect=True, stride=gs, pad=0.5, nc=int(data["nc"]))
    loader, _ = create_dataloader(data["val"], a.img, a.batch, LoaderConfig(cfg, workers=0), log=lambda *x: None)
    loss_fn = make_loss(model)
    nc = model.model[-1].nc
    for mode in ("eval (running statistics)", "batch statistics"):
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.train(mode != "eval (running statistics)")
                m.momentum = 0.0  # batch statistics without touching the running ones
        total, logits, nb = torch.zeros(3), [], 0
        with torch.no_grad():
            for imgs, targets, _, _ in loader:
                out = model(imgs.to(device).float() / 255)
                _, raw = split_outputs(out)
                total += loss_fn(raw, targets.to(device))[1].float().cpu()  # both branches of a dual head
                main = raw[-1] if isinstance(raw[0], (list, tuple)) else raw
                logits.append(torch.cat([r[:, -nc:].flatten() for r in main]).float().cpu())
                nb += 1
        lg = torch.cat(logits).numpy()
        box, cls, dfl = (total / max(nb, 1)).tolist()
        print(json.dumps({"bn": mode, "box_loss": round(box, 4), "cls_loss": round(cls, 4), "dfl_loss": round(dfl, 4),
                          "cls_logit_mean": round(float(lg.mean()), 3),
                          "cls_logit_p99": round(float(np.percentile(lg, 99)), 3)}))


if __name__ == "__main__":
    main()
