"""Parameter groups and optimizers of the published smart_optimizer (utils/torch_utils.py), and LION written out.

Three groups, in this order (the order fixes x/lr0, x/lr1, x/lr2 in results.csv):
  group 0: every module's `bias` Parameter (no weight decay; warm-up starts its lr at warmup_bias_lr);
  group 1: weights of non-norm modules (weight decay = the scaled hyp weight_decay);
  group 2: norm-layer weights (no weight decay).
SGD: momentum hyp['momentum'], Nesterov. Adam: betas (momentum, 0.999). AdamW: betas (momentum, 0.999),
amsgrad. LION: betas (momentum, 0.99).

Test: python -m pytest -q tests/engine/train/test_train_parts.py -k optim
"""

import torch
from torch import nn


def param_groups(model: nn.Module):
    """(biases, decayed weights, norm weights): three lists of Parameters, each parameter exactly once."""
    bias, decay, no_decay = [], [], []
    norms = tuple(v for k, v in vars(nn).items() if "Norm" in k and isinstance(v, type))
    for m in model.modules():
        if isinstance(getattr(m, "bias", None), nn.Parameter):
            bias.append(m.bias)
        if isinstance(m, norms):
            no_decay.append(m.weight)
        elif isinstance(getattr(m, "weight", None), nn.Parameter):
            decay.append(m.weight)
    return bias, decay, no_decay


class Lion(torch.optim.Optimizer):
    """LION (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"):
        update = sign(beta1 · m + (1 − beta1) · g);  p ← p · (1 − lr · wd) − lr · update;
        m ← beta2 · m + (1 − beta2) · g.
    State per parameter: exp_avg (same shape and dtype as the parameter)."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        if lr <= 0:
            raise ValueError(f"Lion: lr must be > 0, got {lr}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"Lion: betas must be in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                update = (m * b1).add_(p.grad, alpha=1 - b1).sign_()
                p.add_(update, alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)
        return loss


def build_optimizer(model: nn.Module, name="SGD", lr=0.001, momentum=0.9, decay=1e-5, log=print):
    """The optimizer over model's three groups (see module docstring). name: SGD, Adam, AdamW or LION.
    Logs the published line `optimizer: SGD(lr=0.01) with parameter groups …`."""
    bias, decay_w, norm_w = param_groups(model)
    if name == "Adam":
        opt = torch.optim.Adam(bias, lr=lr, betas=(momentum, 0.999))
    elif name == "AdamW":
        opt = torch.optim.AdamW(bias, lr=lr, betas=(momentum, 0.999), weight_decay=0.0, amsgrad=True)
    elif name == "LION":
        opt = Lion(bias, lr=lr, betas=(momentum, 0.99), weight_decay=0.0)
    elif name == "SGD":
        opt = torch.optim.SGD(bias, lr=lr, momentum=momentum, nesterov=True)
    else:
        raise ValueError(f"optimizer {name!r} not one of SGD, Adam, AdamW, LION")
    opt.add_param_group({"params": decay_w, "weight_decay": decay})
    opt.add_param_group({"params": norm_w, "weight_decay": 0.0})
    log(f"optimizer: {type(opt).__name__}(lr={lr}) with parameter groups {len(norm_w)} weight(decay=0.0), "
        f"{len(decay_w)} weight(decay={decay}), {len(bias)} bias")
    return opt
