"""The deterministic weights, input and targets of the golden recipe (tests/assets/goldens/README.md).

Shared by the golden tests (tests/models/test_goldens.py for maps and decoded outputs, tests/loss/test_loss.py for
the loss and gradients):

    model = yolov9c.build_model("yolov9-s").double()
    golden_init_(model)
    maps = model.train()(golden_input(2))          # compare with repo_assets.golden("yolov9-s")

Conditioning: with these weights, the train-mode (batch-statistics) outputs of the deeper levels of gelan-c,
gelan-e and the main branch of yolov9-c and yolov9-e are extremely sensitive to float64 rounding: moving
every input pixel by one ulp (`ulp_perturbed`) changes gelan-e's P5 map by ~100 % and gelan-c's by ~1e-5.
The published tensors differ from ours on those maps by about the same amount (0.2-3x that
sensitivity), and on every well-conditioned map by only the float32 storage rounding (~2.5e-8). So a
golden comparison of such a map is only meaningful to within its measured sensitivity; tests measure it
with `ulp_perturbed` and widen (or skip) only those comparisons.
"""

import torch

from repo_assets import GOLDEN_DIR, golden, golden_lines  # noqa: F401  (re-exported to the golden tests)

CONFIGS = ["yolov9-t", "yolov9-s", "yolov9-m", "yolov9-c", "yolov9-e",
           "gelan-t", "gelan-s", "gelan-m", "gelan-c", "gelan-e"]

# Recipe step 5: image index, class, x, y, w, h (normalised).
GOLDEN_TARGETS = torch.tensor([
    [0, 3, 0.50, 0.50, 0.30, 0.40],
    [0, 17, 0.20, 0.25, 0.10, 0.12],
    [0, 0, 0.80, 0.70, 0.25, 0.35],
    [1, 79, 0.35, 0.60, 0.60, 0.50],
    [1, 5, 0.85, 0.15, 0.08, 0.06],
], dtype=torch.float64)


def _golden_value(name, k, shape):
    """Recipe step 2 for the entry of rank k: float64 tensor of `shape`."""
    numel = 1
    for s in shape:
        numel *= s
    # in place on one buffer, the same float64 operations in the same order as the recipe's expressions
    # (bit-identical; the conv weights of the e models are ~58M values, where temporaries cost seconds)
    j = torch.arange(numel, dtype=torch.float64)
    if name.endswith("running_var"):
        v = j.mul_(0.7).add_(k).sin_().add_(1).mul_(0.25).add_(1)  # 1 + 0.25 * (1 + sin(0.7 j + k))
    elif name.endswith("running_mean"):
        v = j.mul_(0.3).add_(k).sin_().mul_(0.1)  # 0.1 * sin(0.3 j + k)
    elif len(shape) == 4:
        fan_in = numel / shape[0]
        v = j.mul_(0.37).add_(1.3 * k).sin_().mul_(1.7).div_(fan_in ** 0.5)  # sin(0.37 j + 1.3 k) * 1.7 / √fan_in
    elif name.endswith("weight"):
        v = j.mul_(0.5).add_(k).sin_().mul_(0.1).add_(1)  # 1 + 0.1 * sin(0.5 j + k)
    else:
        v = j.mul_(0.9).add_(k).sin_().mul_(0.1)  # 0.1 * sin(0.9 j + k)
    return v.view(shape)


@torch.no_grad()
def golden_init_(model):
    """Overwrite every floating-point state_dict entry of `model` (except the fixed `.dfl` convs) with
    the recipe's deterministic values, in place; integer entries are left alone. Returns model."""
    sd = model.state_dict()
    for k, name in enumerate(sorted(sd)):
        t = sd[name]
        if not t.is_floating_point() or ".dfl" in name:
            continue
        t.copy_(_golden_value(name, k, tuple(t.shape)))
    return model


def golden_input(b, s=160):
    """Recipe step 3: (b, 3, s, s) float64, x = 0.5 + 0.5·sin(0.013·j)·cos(0.0007·j) over the flat index j."""
    j = torch.arange(b * 3 * s * s, dtype=torch.float64)
    return (0.5 + 0.5 * torch.sin(0.013 * j) * torch.cos(0.0007 * j)).view(b, 3, s, s)


def ulp_perturbed(x):
    """x with every element moved up by one unit in the last place: a probe of how strongly an output
    amplifies float rounding."""
    return x.nextafter(torch.tensor(float("inf"), dtype=x.dtype))
