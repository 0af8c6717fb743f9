"""Capturable optimizer steps for the CUDA-graph training step (graph_step.py): torch.optim's SGD (Nesterov), Adam
and AdamW (amsgrad) written with torch._foreach ops that read each group's lr (and SGD momentum) from device
tensors and skip the update where a device flag says so; no host read, so a CUDA graph can hold the step.

    fused = FusedOptimizer(optimizer, params)   # the torch optimizer of build_optimizer (optim.py)
    fused.set_hyper()                           # host, before a replay: lr / momentum of every group → device
    fused.step(found_inf)                       # capturable; found_inf: 0-dim float (1 = skip), or None

Invariants: the state tensors are the torch optimizer's own, updated in place (state_dict, checkpoints and a
later eager step see the same values); missing state is created as torch's first step leaves it. With
found_inf = 1 (gradients already zeroed by graph_step) momentum factors become 1 and lr/decay 0, so every buffer
and parameter keeps its bits. Otherwise equal to torch.optim within rounding (its fused a + α·b are two
roundings here). Groups that are not SGD/Adam/AdamW: kind() is None and the trainer runs the eager step.
Test: python -m pytest -q tests/engine/train/test_graph_step.py -k fused
"""

import torch


def kind(optimizer):
    """'SGD', 'Adam' or 'AdamW' for the torch optimizers this module reproduces, else None (LION, others)."""
    if type(optimizer) is torch.optim.SGD:
        return "SGD"
    if type(optimizer) is torch.optim.AdamW:
        return "AdamW"
    if type(optimizer) is torch.optim.Adam:
        return "Adam"
    return None


class FusedOptimizer:
    """The update of `optimizer` (SGD, Adam or AdamW) over `params` (the parameters that get gradients), with
    lr and momentum in device tensors. The parameters' .grad must be set (graph_step binds static views)."""

    def __init__(self, optimizer, params):
        self.kind = kind(optimizer)
        if self.kind is None:
            raise TypeError(f"FusedOptimizer: {type(optimizer).__name__} has no capturable step here")
        self.optimizer = optimizer
        wanted = {id(p) for p in params}
        self.groups = [[p for p in g["params"] if id(p) in wanted] for g in optimizer.param_groups]
        device = params[0].device
        n = len(optimizer.param_groups)
        self.lr = [torch.zeros((), device=device) for _ in range(n)]
        self.momentum = [torch.zeros((), device=device) for _ in range(n)]
        self._host = [None] * n  # the (lr, momentum) last written to the device tensors
        for g, ps in zip(optimizer.param_groups, self.groups):
            self._init_state(g, ps)

    def _init_state(self, group, params):
        st = self.optimizer.state
        for p in params:
            s = st[p]
            if self.kind == "SGD":
                if s.get("momentum_buffer") is None:
                    s["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                continue
            if not s:
                s["step"] = torch.zeros((), dtype=torch.float32)
                s["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                s["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group.get("amsgrad") and "max_exp_avg_sq" not in s:
                s["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            s["step"] = s["step"].to(device=p.device, dtype=torch.float32)

    def set_hyper(self):
        """Copy each group's lr (and SGD momentum) into the device tensors: host → device fills, outside the
        graph, only where a value changed since the last call."""
        for j, g in enumerate(self.optimizer.param_groups):
            now = (float(g["lr"]), float(g.get("momentum", 0.0)))
            if now != self._host[j]:
                self.lr[j].fill_(now[0])
                self.momentum[j].fill_(now[1])
                self._host[j] = now

    @torch.no_grad()
    def step(self, found_inf=None):
        """One update of every group; capturable. found_inf: 0-dim float tensor (non-zero: skip), or None."""
        keep = None if found_inf is None else 1.0 - found_inf
        for j, (g, ps) in enumerate(zip(self.optimizer.param_groups, self.groups)):
            if not ps:
                continue
            lr = self.lr[j] if keep is None else self.lr[j] * keep
            if self.kind == "SGD":
                self._sgd(g, ps, lr, self.momentum[j], found_inf, keep)
            else:
                self._adam(g, ps, lr, found_inf, keep)

    def _sgd(self, g, params, lr, momentum, found_inf, keep):
        if g["dampening"] or g["maximize"]:
            raise ValueError("FusedOptimizer: SGD dampening / maximize are not reproduced")
        st = self.optimizer.state
        grads = [p.grad for p in params]
        bufs = [st[p]["momentum_buffer"] for p in params]
        m = momentum if found_inf is None else torch.where(found_inf > 0, 1.0, momentum)
        d = grads  # as torch: the gradients themselves when there is no weight decay
        if g["weight_decay"]:
            if keep is None:
                d = torch._foreach_add(grads, params, alpha=g["weight_decay"])
            else:
                d = torch._foreach_mul(params, keep * g["weight_decay"])
                torch._foreach_add_(d, grads)
        torch._foreach_mul_(bufs, m)
        torch._foreach_add_(bufs, d)
        if g["nesterov"]:
            upd = torch._foreach_mul(bufs, m)
            torch._foreach_add_(upd, d)
        else:
            upd = [b.clone() for b in bufs]
        torch._foreach_mul_(upd, lr)
        torch._foreach_sub_(params, upd)

    def _adam(self, g, params, lr, found_inf, keep):
        if g.get("maximize") or g.get("differentiable"):
            raise ValueError("FusedOptimizer: Adam maximize / differentiable are not reproduced")
        st = self.optimizer.state
        b1, b2 = g["betas"]
        wd, eps, amsgrad = g["weight_decay"], g["eps"], g.get("amsgrad", False)
        grads = [p.grad for p in params]
        m = [st[p]["exp_avg"] for p in params]
        v = [st[p]["exp_avg_sq"] for p in params]
        steps = [st[p]["step"] for p in params]
        one = torch.ones((), device=lr.device)
        keep = one if keep is None else keep
        torch._foreach_add_(steps, keep)
        if wd and self.kind == "AdamW":
            torch._foreach_mul_(params, 1.0 - lr * wd)
        elif wd:
            d = torch._foreach_mul(params, keep * wd)
            torch._foreach_add_(d, grads)
            grads = d
        # exp_avg ← exp_avg + (1 − β1)·(g − exp_avg)  (torch: lerp); skipped: weight 0
        diff = torch._foreach_sub(grads, m)
        torch._foreach_mul_(diff, keep * (1.0 - b1))
        torch._foreach_add_(m, diff)
        # exp_avg_sq ← β2·exp_avg_sq + (1 − β2)·g²; skipped: factor 1, weight 0
        torch._foreach_mul_(v, torch.where(keep > 0, b2, 1.0))
        gg = torch._foreach_mul(grads, grads)
        torch._foreach_mul_(gg, keep * (1.0 - b2))
        torch._foreach_add_(v, gg)
        # every parameter of a group steps together; float64 as torch's host arithmetic (1 − β2^t cancels)
        step = steps[0].double().clamp(min=1.0)
        bc1 = (1.0 - torch.pow(b1, step)).float()
        bc2_sqrt = (1.0 - torch.pow(b2, step)).sqrt().float()
        if amsgrad:
            vmax = [st[p]["max_exp_avg_sq"] for p in params]
            torch._foreach_maximum_(vmax, v)
            denom = torch._foreach_sqrt(vmax)
        else:
            denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, eps)
        upd = torch._foreach_div(m, denom)
        torch._foreach_mul_(upd, (lr.double() / bc1.double()).float())
        torch._foreach_sub_(params, upd)
