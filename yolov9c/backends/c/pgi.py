"""The c backend's model forward: the PGI auxiliary branch recomputed in backward, and uint8 input.

    c.install(model, sw)      # model.forward = model_forward (and every layer's forward, layers.py)
    model(imgs_uint8)         # a uint8 batch is read as imgs / 255 by its first convs (lazy.Image)

Auxiliary layers are read off the layer graph: those whose outputs reach only the DualDDetect head's auxiliary
inputs. In training they run as recomputed segments (segment.py): chains of layers each read only by the next
(_chains), one segment per auxiliary head level; a segment keeps only its result and is re-run and back-propagated
at once in backward. Each auxiliary step runs as soon as its inputs exist, so autograd back-propagates the main
neck first and an image-only segment last, which keeps the peak low.
Main backbone blocks (RepNCSPELAN4, ELAN1) at stride <= main_recompute are one-layer segments too (the switches:
switches.py, model.c_switches). Results do not depend on the order (same inputs; each BatchNorm updates once).
Plain layer loop when not training / no grad, the head is not a c-runnable DualDDetect, or aux_recompute is off
(unless plain_stride: then this walk, or _forward_layers for a DDetect model); a segment with a non-recomputable
layer runs plain. Test: python -m pytest -q tests/backends/test_backend_pgi.py tests/backends/test_plain_stride.py
"""

import functools

import torch
import torch.nn as nn

import yolov9c.backends.c.layers as L
from yolov9c.backends.c.casts import weights_cast
from yolov9c.backends.c.conv import autocast_dtype
from yolov9c.backends.c.lazy import Image, materialise_any
from yolov9c.backends.c.segment import run_segment
from yolov9c.backends.c.switches import DEFAULT
from yolov9c.models.common import ELAN1, Conv, RepConvN, RepNCSPELAN4
from yolov9c.models.head import DDetect, DualDDetect


STEP_HOOKS = []  # callables (label, value) run before (value None) and after each auxiliary segment and head
# level (memory timelines: dev/probes/mem_timeline.py); plain layer steps are module calls (module hooks)


def _observe(label, value):
    for hook in STEP_HOOKS:
        hook(label, value)


MAIN_BLOCKS = (RepNCSPELAN4, ELAN1)  # the main layer types the main_recompute switch may recompute


def switches_of(model):
    """The switches.Switches the c forward of `model` runs with (install() sets them; the defaults otherwise)."""
    return model.__dict__.get("c_switches", DEFAULT)


def inputs_of(m):
    """Absolute indices of the layers top-level layer m reads; -1 is the model input."""
    f = m.f if isinstance(m.f, (list, tuple)) else [m.f]
    return [m.i - 1 if j == -1 else j for j in f]


def _ancestors(layers, roots):
    """roots and every layer they read, transitively (indices ≥ 0)."""
    seen, stack = set(), [r for r in roots if r >= 0]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        stack.extend(j for j in inputs_of(layers[i]) if j >= 0)
    return seen


class Graph:
    """The auxiliary split of a model with a DualDDetect head.
    aux: the auxiliary layer indices; steps: the execution order, ("layer", i) for a main layer (index
    order), ("segment", [i, ...]) for a chain of auxiliary layers, ("aux_head", k) for auxiliary head level
    k; uses: layer index (-1: the input) -> how many steps read it; blocks: the main layers of the yaml's
    backbone section that may run as recomputed segments (MAIN_BLOCKS; the stride is checked per call)."""

    __slots__ = ("key", "aux", "steps", "uses", "blocks")

    def __init__(self, model):
        layers = model.model
        head = layers[-1]
        n, nl = len(layers) - 1, head.nl
        hin = inputs_of(head)
        main = _ancestors(layers, hin[nl:])
        aux = _ancestors(layers, hin[:nl]) - main
        readers = {}
        for i in range(n + 1):
            for j in set(inputs_of(layers[i])):
                readers.setdefault(j, []).append(i)
        units = [(("segment", c), _chain_inputs(layers, c)) for c in _chains(layers, aux, readers)]
        units += [(("aux_head", k), {hin[k]}) for k in range(nl)]
        self.key = tuple(layers)  # the layers themselves: an id is reused once its object is freed
        self.aux = aux
        self.steps = _schedule([i for i in range(n) if i not in aux], units)
        self.uses = {j: len(r) for j, r in readers.items()}
        yaml = getattr(model, "yaml", None)
        n_backbone = len(yaml.get("backbone") or []) if isinstance(yaml, dict) else 0
        self.blocks = {i for i in range(min(n, n_backbone)) if i not in aux and type(layers[i]) in MAIN_BLOCKS}


def _chains(layers, aux, readers):
    """The auxiliary layers cut into chains: a layer joins the chain before it when it is that chain's last
    layer's only reader and reads nothing outside the chain (so a chain never waits on a main layer: it can
    run as soon as its first layer's inputs exist)."""
    chains = []
    for i in sorted(aux):
        c = chains[-1] if chains else None
        if c and readers.get(c[-1]) == [i] and set(inputs_of(layers[i])) <= set(c):
            c.append(i)
        else:
            chains.append([i])
    return chains


def _chain_inputs(layers, chain):
    return {j for i in chain for j in inputs_of(layers[i])} - set(chain)


def _schedule(main, units):
    """Main layers in index order, each auxiliary unit inserted as early as its inputs allow. Autograd runs
    the ready node created last first, so a unit created early is back-propagated late: the main neck (made
    after every unit) before any unit, and a unit reading only the image (yolov9-c's second stem) after
    the first backbone, when little else is alive."""
    done, steps, pending = {-1}, [], list(units)

    def flush():
        progress = True
        while progress:
            progress = False
            for u in list(pending):
                step, needs = u
                if needs <= done:
                    steps.append(step)
                    pending.remove(u)
                    if step[0] == "segment":
                        done.update(step[1])
                    progress = True

    for i in main:
        flush()
        steps.append(("layer", i))
        done.add(i)
    flush()
    if pending:
        raise ValueError(f"auxiliary steps {[u[0] for u in pending]} read layers that never run")
    return steps


def graph(model):
    """The model's Graph (cached on the model; rebuilt when its layers change), None without a DualDDetect."""
    if type(model.model[-1]) is not DualDDetect:
        return None
    g = model.__dict__.get("_c_graph")
    if g is None or g.key != tuple(model.model):
        g = model.__dict__["_c_graph"] = Graph(model)
    return g


def recomputable(mods):
    """Modules (with their sub-modules) a segment may re-run: c layers only, activations the fused kernels
    apply (a torch BatchNorm inside would update its running statistics again in the recompute)."""
    for root in mods:
        for m in L._submodules(root):  # (act from _modules: nn.Module.__getattr__ is a call per read)
            if type(m) is Conv and type(m._modules["act"]) not in (nn.SiLU, nn.Identity):
                return False
            if type(m) is RepConvN and type(m._modules["act"]) is not nn.SiLU:
                return False
    return True


def _arg(m, vals):
    """The input of layer m from the outputs computed so far (as DetectionModel.forward passes it)."""
    if isinstance(m.f, int):
        return vals[m.i - 1 if m.f == -1 else m.f]
    return [vals[m.i - 1 if j == -1 else j] for j in m.f]


def _run_chain(layers, chain, vals):
    """The c forwards of layers[chain] in order; vals: the chain's external inputs by layer index."""
    vals = dict(vals)
    for k, i in enumerate(chain):
        vals[i] = L.run(layers[i], _arg(layers[i], vals))
        if k:
            del vals[chain[k - 1]]  # a chain member is read only by the next one
    return vals[chain[-1]]


def _level(head, k, vals):
    return L.detect_level(head.cv2[k], head.cv3[k], vals["x"])


class _Run:
    """One forward pass: the layer outputs alive so far, dropped after their last reader."""

    def __init__(self, g, x):
        self.vals, self.left = {-1: x}, dict(g.uses)
        self.img_h = x.shape[2]

    def take(self, m):
        return _arg(m, self.vals)

    def done(self, readers):
        for j in set(readers):
            self.left[j] -= 1
            if self.left[j] == 0 and j in self.vals:
                del self.vals[j]


def _segment(model, chain, run, sw, label=None, recompute=True):
    """A chain of layers as one recomputed segment (recompute, and every layer recomputable), else run as it
    stands (plain_stride applies to each layer then)."""
    label = label or (f"segment {chain[0]}-{chain[-1]}" if len(chain) > 1 else f"segment {chain[0]}")
    _observe(label, None)
    layers = model.model
    mods = [layers[i] for i in chain]
    ext = sorted({j for i in chain for j in inputs_of(layers[i])} - set(chain))
    vals = {j: run.vals[j] for j in ext}
    params = L.parameters_of(mods) if recompute and all(map(L.supported, mods)) and recomputable(mods) else None
    if params:
        out = run_segment(functools.partial(_run_chain, layers, chain), vals, params, sw.keep_inputs)
    else:
        out = _run_chain_plain(layers, chain, vals, sw.plain_stride, run.img_h)
    run.vals[chain[-1]] = out
    run.done(ext)
    _observe(label, out)


def _run_chain_plain(layers, chain, vals, plain, img_h):
    vals = dict(vals)
    for i in chain:
        vals[i] = _layer(layers[i], _arg(layers[i], vals), plain, img_h)
    return vals[chain[-1]]


def _layer(m, arg, plain, img_h):
    """Layer m on arg: its c forward, or with plain_stride (switches.py) at that stride or coarser its torch forward
    on the activated input."""
    if plain and img_h >= plain * _finest(arg):
        return type(m).forward(m, materialise_any(arg))
    return m(arg)


def _finest(arg):
    """The height of a layer's finest input (a value, or lists and tuples of them: CBFuse reads CBLinear's)."""
    return max(map(_finest, arg)) if isinstance(arg, (list, tuple)) else arg.shape[2]


def _head_level(box, cls, x, plain, img_h):
    """A head level (box and class branches on x): lazy, or with plain_stride at that stride or coarser as the
    torch backend computes it, on x activated (its activations stored)."""
    if plain and img_h >= plain * x.shape[2]:
        x = materialise_any(x)
        return torch.cat((box(x), cls(x)), 1)
    return L.detect_level(box, cls, x)


def _forward_pgi(model, g, x, sw):
    layers = model.model
    head = layers[-1]
    nl = head.nl
    hin = inputs_of(head)
    run = _Run(g, x)
    d1 = [None] * nl
    limit, img_h, aux, plain = sw.main_recompute, x.shape[2], sw.aux_recompute, sw.plain_stride
    for kind, what in g.steps:
        if kind == "layer":
            m = layers[what]
            arg = run.take(m)
            if aux and what in g.blocks and limit > 0 and img_h <= limit * arg.shape[2]:
                _segment(model, [what], run, sw, f"{what} {type(m).__name__} (recomputed)")
            else:
                run.vals[what] = _layer(m, arg, plain, img_h)
                run.done(inputs_of(m))
        elif kind == "segment":
            _segment(model, what, run, sw, recompute=aux)
        else:  # an auxiliary head level
            k = what
            mods = [head.cv2[k], head.cv3[k]]
            vals = {"x": run.vals[hin[k]]}
            _observe(f"aux head {k}", None)
            if aux and recomputable(mods):
                d1[k] = run_segment(functools.partial(_level, head, k), vals, L.parameters_of(mods), sw.keep_inputs)
            else:
                d1[k] = _head_level(head.cv2[k], head.cv3[k], vals["x"], plain, img_h)
            _observe(f"aux head {k}", d1[k])
    d2 = []
    for k in range(nl):
        _observe(f"main head {k}", None)
        d2.append(_head_level(head.cv4[k], head.cv5[k], run.vals[hin[nl + k]], plain, img_h))
        _observe(f"main head {k}", d2[k])
    return [d1, d2]


def model_forward(self, x):
    """DetectionModel.forward while the c backend is applied (see the module docstring). x: (B, ch, H, W)
    float, or uint8 (read as x / 255; in eval mode converted up front, as the trainer's float path does)."""
    amp = autocast_dtype(x.device.type)
    if x.dtype == torch.uint8:
        if not self.training:
            return type(self).forward(self, x.float() / 255)
        x = Image(x)
    sw = switches_of(self)
    g = graph(self) if self.training and torch.is_grad_enabled() and (sw.aux_recompute or sw.plain_stride) else None
    # lean_host: every num_batches_tracked += 1 in one call, the conv weights cast in one
    with L.counting_batches(), weights_cast(self, amp):
        if g is None or not g.aux or not L.supported(self.model[-1]):
            if sw.plain_stride and self.training and torch.is_grad_enabled() and type(self.model[-1]) is DDetect \
                    and L.supported(self.model[-1]):
                return _forward_layers(self, x, sw.plain_stride)
            return type(self).forward(self, x)
        return _forward_pgi(self, g, x, sw)


def _forward_layers(model, x, plain):
    """DetectionModel.forward's layer loop with plain_stride (a model with a DDetect head: gelan-*): each layer and
    head level through _layer / _head_level."""
    img_h, y = x.shape[2], []
    layers = model.model
    for m in layers[:-1]:
        if m.f != -1:
            x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
        x = _layer(m, x, plain, img_h)
        y.append(x if m.i in model.save else None)
    head = layers[-1]
    xs = [x if j == -1 else y[j] for j in head.f] if not isinstance(head.f, int) else [y[head.f]]
    return [_head_level(head.cv2[k], head.cv3[k], xs[k], plain, img_h) for k in range(head.nl)]
