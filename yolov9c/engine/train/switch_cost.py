"""What the c backend's switches change in a training step's memory, counted on the CPU from the model graph.

    switch_cost.per_image_gib("yolov9-c", Switches(aux_recompute=False))   # GiB per 640² image vs the defaults
    switch_cost.adjust(cost, "yolov9-c", switches)                        # a memory_plan.Cost under the switches

memory_plan.COSTS are steps measured under the default Switches. Other switches add (or remove) what they make a
step keep, in fp16 under AMP (2 B per element), counted from one no-grad forward of the model at 128² (scaled to
640² by the pixel count) over the units of backends/c/pgi.Graph: the auxiliary chains and head levels, and the
main blocks at stride <= main_recompute; plain_stride's stored activations by saved-tensor hooks (plain_bytes).
A recomputed unit stores only its output, a stored one every conv output (z); aux_recompute off stores every
unit, main blocks included (one mechanism). keep_inputs holds the conv inputs of one unit's backward at once: the
largest unit's is added, an upper bound (that backward may not be at the step's peak). Without a DualDDetect head
nothing is recomputed: only plain_stride changes something.
Test: python -m pytest -q tests/engine/train/test_memory_plan.py -k switch
"""

from __future__ import annotations

import dataclasses
import functools


from yolov9c.units import GIB
BYTES = 2  # fp16 (AMP): a stored z, a kept conv input
COUNT_IMG, REF_IMG = 128, 640


@dataclasses.dataclass(frozen=True)
class Unit:
    """A recomputable part of the step, elements per 640² image: z (every conv output), out (what it stores when
    recomputed), inputs (its conv inputs, each distinct tensor once); stride: a main block's input stride (None:
    an auxiliary unit)."""

    z: float
    out: float
    inputs: float
    stride: int | None = None


@functools.lru_cache(maxsize=None)
def units(cfg):
    """The Units of model `cfg` (built with nc=80) as pgi.Graph splits it; () without a DualDDetect head."""
    import torch
    from torch import nn

    from yolov9c.backends.c import pgi
    from yolov9c.models.model import DetectionModel

    model = DetectionModel(cfg, nc=80).train()
    g = pgi.graph(model)
    if g is None:
        return ()
    layers, head = model.model, model.model[-1]
    rec, hooks = {}, []

    def watch(key, module, outputs=True):
        r = rec.setdefault(key, {"z": 0, "out": 0, "inputs": {}, "stride": None})

        def conv(m, inp, out):
            r["z"] += out.numel()
            r["inputs"][inp[0].data_ptr()] = inp[0].numel()

        def whole(m, inp, out):
            r["out"] += sum(t.numel() for t in (out if isinstance(out, (list, tuple)) else [out]))
            x = inp[0]
            while isinstance(x, (list, tuple)):
                x = x[0]
            r["stride"] = COUNT_IMG // x.shape[2]

        hooks.extend(c.register_forward_hook(conv) for c in module.modules() if isinstance(c, nn.Conv2d))
        if outputs:
            hooks.append(module.register_forward_hook(whole))

    for i in range(len(layers) - 1):
        watch(i, layers[i])
    for k in range(head.nl):  # an auxiliary head level: its cv2 and cv3 branches, their outputs stored
        watch(("aux head", k), head.cv2[k])
        watch(("aux head", k), head.cv3[k])
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, COUNT_IMG, COUNT_IMG))
    finally:
        for h in hooks:
            h.remove()
    scale = (REF_IMG / COUNT_IMG) ** 2

    def unit(keys, last, stride=None):
        return Unit(sum(rec[k]["z"] for k in keys) * scale, rec[last]["out"] * scale,
                    sum(n for k in keys for n in rec[k]["inputs"].values()) * scale, stride)

    out = [unit(w, w[-1]) for kind, w in g.steps if kind == "segment"]
    out += [unit([("aux head", k)], ("aux head", k)) for k in range(head.nl)]
    out += [unit([i], i, rec[i]["stride"]) for i in sorted(g.blocks)]
    return tuple(out)


def _held(cfg, sw):
    """Elements per 640² image that the recomputable units hold at the step's peak under switches `sw`."""
    held, kept = 0.0, 0.0
    for u in units(cfg):
        if sw.aux_recompute and (u.stride is None or u.stride <= sw.main_recompute):
            held += u.out
            kept = max(kept, u.inputs if sw.keep_inputs else 0.0)
        else:
            held += u.z
    return held + kept


@functools.lru_cache(maxsize=None)
def plain_bytes(cfg, sw):
    """Bytes per 640² image that switches `sw` store beyond the same switches with plain_stride 0: the activations
    of the layers it runs through torch's forward, less the lazy values they replace. Counted by saved-tensor
    hooks (distinct storages, parameters and input excluded) in one CPU float32 training forward of the c model at
    COUNT_IMG² (batch 2), floating-point bytes halved (fp16 under AMP); 0 without plain_stride."""
    if not sw.plain_stride:
        return 0.0
    import copy

    import torch

    from yolov9c.backends.c import install  # (not backends.apply: no note about the c backend on the CPU)
    from yolov9c.models.model import DetectionModel

    with torch.random.fork_rng(devices=[]):  # the run's own random state is left as it was
        base = DetectionModel(cfg, nc=80).train()
    x = torch.rand(2, 3, COUNT_IMG, COUNT_IMG, generator=torch.Generator().manual_seed(0))
    stored = []
    for s in (sw, dataclasses.replace(sw, plain_stride=0)):
        model = copy.deepcopy(base)
        install(model, s)
        skip = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
        seen = {}

        def pack(t):
            st = t.untyped_storage()
            if st.data_ptr() not in skip:
                seen[st.data_ptr()] = st.nbytes() / (2 if t.is_floating_point() else 1)
            return t

        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x)  # (grad on: a caller inside no_grad would otherwise count nothing)
        stored.append(sum(seen.values()))
    return (stored[0] - stored[1]) / 2 * (REF_IMG / COUNT_IMG) ** 2


def per_image_gib(cfg, switches):
    """GiB per 640² image that `switches` add to a step of `cfg` under the default switches (negative: less)."""
    from yolov9c.backends.c.switches import DEFAULT

    return ((_held(cfg, switches) - _held(cfg, DEFAULT)) * BYTES + plain_bytes(cfg, switches)) / GIB


def adjust(cost, cfg, switches):
    """The memory_plan.Cost of `cfg` under the c backend's `switches`, from its Cost under the defaults: the same
    Cost for the defaults, another backend or no change, else per_image_gib added and the source saying so."""
    if switches is None or cost.backend != "c":
        return cost
    from yolov9c.backends.c.switches import DEFAULT  # imports torch (the backends package): only when asked

    if switches == DEFAULT:
        return cost
    d = per_image_gib(cfg, switches)
    if d == 0:  # nothing recomputed in this model (no DualDDetect head)
        return cost
    return dataclasses.replace(cost, per_image_gib=cost.per_image_gib + d,
                               source=f"{cost.source}; {d:+.4f} GiB per image for the switches (counted)")
