"""How many times the c backend's BN/SiLU kernels touch each conv output z in one training step: where its
BN/SiLU passes beyond torch's come from. CPU only; the counts depend only on the model graph, not on the
device, the batch or the image size.

    python dev/probes/bn_passes.py --model yolov9-s            # one step at batch 2, 128 px, on the CPU
    python dev/probes/bn_passes.py --model yolov9-s --sites    # and the activation passes by call site
    python dev/probes/bn_passes.py --model yolov9-s --keep-inputs   # with the keep_inputs switch (--keep-inputs 1)

Wraps the three entry points of yolov9c.ops.bn_silu (stats, forward and backward,
each counting the z of its one or two BN operands), runs forward + loss + backward of `--backend c`, and prints per entry point its calls and the
elements of z it read, in forward and in backward, as multiples of the BN layers' input elements of one torch
forward (the minimum for one pass over every z), plus how many times each z region was activated in forward
and in backward. --sites splits the activation passes by the c-backend function that asked for them and the
lazy node method that ran the kernel. Bytes per element per pass (fp16): statistics 2, forward apply 4,
backward 10 (a reduction reading z and g, then an elementwise pass reading z and g and writing dz).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # runs from a checkout without installing
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from yolov9c.api import build_model, make_loss  # noqa: E402
from yolov9c.backends import apply  # noqa: E402
from yolov9c.backends.c.switches import Switches  # noqa: E402
from yolov9c.engine.train.memory_plan import random_targets  # noqa: E402
from yolov9c.ops import bn_silu  # noqa: E402

# entry point: the z arguments of a call (stats(z, ...); forward(bn, bn2=None, ...); backward(bn, dy, bn2=None,
# ...), bn2 None for one operand)
def _arg(args, kwargs, i, name):
    return args[i] if len(args) > i else kwargs.get(name)


def _zs(bn, bn2):
    return (bn[0],) + (() if bn2 is None else (bn2[0],))


ENTRY_POINTS = {"stats": lambda a, k: (a[0],),
                "forward": lambda a, k: _zs(a[0], _arg(a, k, 1, "bn2")),
                "backward": lambda a, k: _zs(a[0], _arg(a, k, 2, "bn2"))}
APPLIES = ("forward",)
BACKEND = str(Path(__file__).resolve().parents[2] / "yolov9c" / "backends" / "c")
CALLERS = {"LazyConvFunction.forward": "conv forward", "LazyConvFunction.backward": "conv backward",
           "materialise": "materialise"}


def call_site():
    """(caller, node method) of the current BN/SiLU call: the innermost c-backend caller of CALLERS ("segment
    recompute: ..." inside SegmentFunction.backward) and the innermost lazy-node method (lazy/nodes.py)."""
    caller = node = None
    recompute = False
    f = sys._getframe(2)
    while f is not None:
        code = f.f_code
        if code.co_filename.startswith(BACKEND):
            name = code.co_qualname
            if node is None and code.co_filename.endswith(os.path.join("lazy", "nodes.py")):
                node = name
            if caller is None and name in CALLERS:
                caller = CALLERS[name]
            recompute = recompute or name == "SegmentFunction.backward"
        f = f.f_back
    caller = caller or "other"
    return (f"segment recompute: {caller}" if recompute else caller), node or "-"


class Counter:
    def __init__(self, sites=False):
        self.phase, self.sites, self.depth = "forward", sites, 0
        self.by_site = collections.Counter()   # (phase, caller, node method) -> elements of z activated
        self.elems = collections.Counter()     # (phase, entry point) -> elements of z
        self.calls = collections.Counter()     # (phase, entry point) -> calls
        self.applies = collections.Counter()   # (phase, z region) -> times activated

    def wrap(self, name, zs_of):
        """bn_silu.<name> replaced by a counting wrapper; a call made inside a counted one (forward's autograd
        Function runs forward again) is not counted twice."""
        f = getattr(bn_silu, name)

        def counted(*args, **kwargs):
            if self.depth:
                return f(*args, **kwargs)
            for z in zs_of(args, kwargs):
                self.elems[self.phase, name] += z.numel()
                if name in APPLIES and self.sites:
                    self.by_site[(self.phase, *call_site())] += z.numel()
                if name in APPLIES:
                    self.applies[self.phase, (z.untyped_storage().data_ptr(), z.storage_offset(), z.shape)] += 1
            self.calls[self.phase, name] += 1
            self.depth += 1
            try:
                return f(*args, **kwargs)
            finally:
                self.depth -= 1
        setattr(bn_silu, name, counted)
        return f


def bn_input_elements(name, x):
    """Elements of every BatchNorm2d input in one plain torch forward: one pass over every z."""
    model = build_model(name, nc=80).train()
    total = [0]
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.register_forward_hook(lambda mod, inp, out: total.__setitem__(0, total[0] + inp[0].numel()))
    with torch.no_grad():
        model(x)
    return total[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="yolov9-s")
    ap.add_argument("--img", type=int, default=128)
    ap.add_argument("--sites", action="store_true", help="also print the activation passes by call site")
    ap.add_argument("--keep-inputs", action="store_true",
                    help="the c backend's keep_inputs switch on (a recompute keeps its conv inputs)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.rand(2, 3, args.img, args.img)
    base = bn_input_elements(args.model, x)
    model = build_model(args.model, nc=80).train()
    loss_fn = make_loss(model, backend="c")
    out = apply(model, "c", Switches(keep_inputs=args.keep_inputs))
    model = model if out is None else out
    counter = Counter(args.sites)
    originals = {name: counter.wrap(name, zs) for name, zs in ENTRY_POINTS.items()}
    try:
        loss, _ = loss_fn(model(x), random_targets(2, 5, 80, torch.Generator().manual_seed(0)))
        counter.phase = "backward"
        loss.sum().backward()
    finally:
        for name, f in originals.items():
            setattr(bn_silu, name, f)
    print(f"{args.model}: BN input elements of one forward {base / 1e6:.2f}M (= 1.00x)")
    print(f"{'entry point':16s} {'phase':9s} {'calls':>6s} {'x one pass':>10s}")
    for (phase, name), n in sorted(counter.elems.items(), key=lambda kv: (kv[0][1], kv[0][0] != "forward")):
        print(f"{name:16s} {phase:9s} {counter.calls[phase, name]:6d} {n / base:10.2f}")
    for phase in ("forward", "backward"):
        hist = collections.Counter(n for (p, _), n in counter.applies.items() if p == phase)
        print(f"{phase}: z regions by times activated (times: regions) {dict(sorted(hist.items()))}")
    if args.sites:
        print(f"{'activation by call site':60s} {'x one pass':>10s}")
        for (phase, caller, node), n in sorted(counter.by_site.items(), key=lambda kv: (kv[0][0] != "forward", -kv[1])):
            print(f"  {phase:9s} {caller + ' / ' + node:48s} {n / base:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
