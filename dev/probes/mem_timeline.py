"""Memory timeline of one training step per layer: what is alive when, and what is alive at the peak.

    python dev/probes/mem_timeline.py --model yolov9-s                       # c backend, batch 64, 640, AMP
    python dev/probes/mem_timeline.py --model yolov9-s --stored --float      # aux z's kept, float input
    python dev/probes/mem_timeline.py --model yolov9-t --batch 2 --img 128 --device cpu   # CPU: stored bytes only
    python dev/probes/mem_timeline.py --model yolov9-s --markdown            # + markdown tables

The step is the trainer's (memory_plan.MeasuredStep; uint8 batch when the model accepts it, --float forces
float/255; --stored: the c backend's aux_recompute switch off): --warmup plain steps, then one instrumented step.
Marks (one JSON line each): after every layer's forward (module hooks, pgi.STEP_HOOKS for recomputed
segments), after the loss, when each layer output's gradient arrives in backward, after backward, unscale,
clip, step and zero_grad; each with memory allocated/reserved and the peak allocated since the previous mark.
"alive": the allocated blocks right after the loss (torch.cuda.memory._snapshot), split into tensors stored
for backward per layer (saved-tensor hooks), parameters, optimizer state, the image, the head outputs and the
rest. On the CPU only the stored bytes are counted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from yolov9c.units import GIB, MIB  # noqa: E402


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="yolov9-s")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--img", type=int, default=640)
    p.add_argument("--boxes", type=int, default=40, help="random boxes per image")
    p.add_argument("--backend", default="c", choices=("c", "torch"))
    p.add_argument("--stored", action="store_true",
                   help="c backend without the auxiliary recompute (--aux-recompute 0): keep every auxiliary z")
    p.add_argument("--float", dest="uint8", action="store_false", help="float/255 input even when accepted")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cuda")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--out", help="also write the JSON lines to this file")
    return p


def _tensors(v, out):
    from yolov9c.backends.c.lazy import Node

    if isinstance(v, Node):
        out.extend(v.tensors())
    elif hasattr(v, "untyped_storage"):
        out.append(v)
    elif isinstance(v, (list, tuple)):
        for e in v:
            _tensors(e, out)
    return out


class Recorder:
    def __init__(self, device):
        import torch

        self.torch, self.device = torch, device
        self.cuda = device.type == "cuda"
        self.marks, self.current = [], "input"
        self.saved, self.made = {}, {}  # storage ptr -> (layer label, bytes)
        self.t0 = time.perf_counter()

    def mark(self, phase, label):
        torch = self.torch
        row = {"mark": len(self.marks), "phase": phase, "label": label}
        if self.cuda:
            row.update(alloc_mib=round(torch.cuda.memory_allocated(self.device) / MIB, 1),
                       reserved_mib=round(torch.cuda.memory_reserved(self.device) / MIB, 1),
                       peak_since_mib=round(torch.cuda.max_memory_allocated(self.device) / MIB, 1))
            torch.cuda.reset_peak_memory_stats(self.device)
        self.marks.append(row)

    # forward
    def pre(self, label):
        self.current = label

    def post(self, label, value):
        if value is None:  # pgi.STEP_HOOKS: a step starts
            self.pre(label)
            return
        for t in _tensors(value, []):
            s = t.untyped_storage()
            self.made[s.data_ptr()] = (label, s.nbytes())
        self.mark("forward", label)
        self.watch(label, value)

    def pack(self, t):
        s = t.untyped_storage()
        self.saved.setdefault(s.data_ptr(), (self.current, s.nbytes()))
        return t

    # backward
    def watch(self, label, value):
        for t in _tensors(value, []):
            if t.ndim == 4 and t.requires_grad:
                t.register_hook(lambda g, label=label: self.mark("backward", label))
                return


def run(args):
    import torch

    from yolov9c.backends.c import pgi
    from yolov9c.backends.c.switches import Switches
    from yolov9c.engine.train.memory_plan import MeasuredStep

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.backends.cudnn.benchmark = cuda
    fmt = torch.channels_last if cuda else torch.contiguous_format
    switches = Switches(aux_recompute=False) if args.stored and args.backend == "c" else None
    step = MeasuredStep(args.model, args.backend, args.batch, args.img, device, fmt, boxes=args.boxes,
                        uint8=args.uint8, switches=switches)
    step.targets = step.targets.to(device)
    model = step.model
    for _ in range(args.warmup):
        step.run()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    static = torch.cuda.memory_allocated(device) if cuda else 0
    rec = Recorder(device)
    handles = []
    for m in model.model:
        label = f"{m.i} {type(m).__name__}"
        handles.append(m.register_forward_pre_hook(lambda mod, inp, label=label: rec.pre(label)))
        handles.append(m.register_forward_hook(lambda mod, inp, out, label=label: rec.post(label, out)))
    pgi.STEP_HOOKS.append(rec.post)
    # segment steps have no module call: their label is set when the previous step ends
    rec.mark("start", "start")
    try:
        _instrumented_step(rec, step)
        step.ema.update(model)
        rec.mark("after", "EMA update")
    finally:
        for h in handles:
            h.remove()
        pgi.STEP_HOOKS.remove(rec.post)
    if cuda:
        torch.cuda.synchronize(device)
    return summary(args, rec, static, model, cuda)


def _instrumented_step(rec, step):
    """MeasuredStep.run() with marks, but for the EMA update; the saved-tensor hooks count what forward and
    the loss store."""
    import torch

    cuda = rec.cuda
    model, opt, loss_fn, targets, scaler = step.model, step.opt, step.loss_fn, step.targets, step.scaler
    imgs = step.images if step.uint8 else step.images.float() / 255
    with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
        with torch.autocast(rec.device.type, enabled=cuda):
            pred = model(imgs)
            rec.pre("loss")
            loss, _ = loss_fn(pred, targets)
    rec.mark("loss", "loss")
    rec.alive = alive(rec, model, opt, imgs, pred) if cuda else None
    scaler.scale(loss.sum()).backward()
    del loss, pred
    rec.mark("after", "backward")
    scaler.unscale_(opt)
    rec.mark("after", "unscale")
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
    rec.mark("after", "clip")
    scaler.step(opt)
    scaler.update()
    rec.mark("after", "optimizer step")
    opt.zero_grad()
    rec.mark("after", "zero_grad")


def alive(rec, model, opt, imgs, pred):
    """Bytes of the allocated blocks right after the loss, by what holds them (see module docstring)."""
    import torch

    blocks = {}
    for seg in torch.cuda.memory._snapshot()["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                blocks[b["address"]] = b["size"]
    cats = {}

    def claim(ptr, cat):
        if ptr in blocks:
            cats[cat] = cats.get(cat, 0) + blocks.pop(ptr)

    for p in model.parameters():
        claim(p.untyped_storage().data_ptr(), "parameters")
        if p.grad is not None:
            claim(p.grad.untyped_storage().data_ptr(), "gradients")
    for st in opt.state.values():
        for v in st.values():
            if hasattr(v, "untyped_storage"):
                claim(v.untyped_storage().data_ptr(), "optimizer state")
    claim(imgs.untyped_storage().data_ptr(), f"image ({imgs.dtype})")
    for t in _tensors(pred, []):
        claim(t.untyped_storage().data_ptr(), "head outputs")
    per_layer = {}
    for ptr in list(blocks):
        owner = rec.made.get(ptr) or rec.saved.get(ptr)
        if owner is not None:
            per_layer[owner[0]] = per_layer.get(owner[0], 0) + blocks.pop(ptr)
    cats["stored for backward (layers)"] = sum(per_layer.values())
    cats["other (loss, workspaces, small)"] = sum(blocks.values())
    return {"by_category_mib": {k: round(v / MIB, 1) for k, v in cats.items()},
            "stored_by_layer_mib": {k: round(v / MIB, 1) for k, v in per_layer.items()}}


def summary(args, rec, static, model, cuda):
    import torch

    peak = max((m.get("peak_since_mib", 0) for m in rec.marks), default=0)
    at = max(rec.marks, key=lambda m: m.get("peak_since_mib", 0)) if cuda else None
    row = {"model": args.model, "backend": args.backend, "batch": args.batch, "img": args.img,
           "boxes": args.boxes, "recompute": not args.stored, "uint8_input": args.uint8,
           "gpu": torch.cuda.get_device_name() if cuda else None, "torch": torch.__version__,
           "static_mib": round(static / MIB, 1), "peak_alloc_mib": peak,
           "peak_reserved_mib": round(torch.cuda.max_memory_reserved() / MIB, 1) if cuda else None,
           "peak_at": f"{at['phase']} {at['label']} (mark {at['mark']})" if at else None,
           "alive_after_loss": rec.alive}
    if not cuda:
        row["stored_by_layer_mib"] = {}
        for label, nbytes in rec.saved.values():
            row["stored_by_layer_mib"][label] = round(row["stored_by_layer_mib"].get(label, 0) + nbytes / MIB, 1)
    return row, rec.marks


def markdown(row, marks):
    out = [f"{row['model']} {row['backend']} batch {row['batch']} {row['img']}² recompute={row['recompute']} "
           f"uint8={row['uint8_input']}: peak allocated {row['peak_alloc_mib'] / 1024:.2f} GiB, peak reserved "
           f"{(row['peak_reserved_mib'] or 0) / 1024:.2f} GiB, held between steps {row['static_mib'] / 1024:.2f} GiB; "
           f"peak in the interval ending at: {row['peak_at']}", ""]
    alive_ = row.get("alive_after_loss") or {}
    if alive_:
        out.append("| alive after the loss | MiB |")
        out.append("|---|---|")
        for k, v in alive_["by_category_mib"].items():
            out.append(f"| {k} | {v:.0f} |")
        out.append("")
    out.append("| mark | phase | step | allocated MiB | peak since previous mark MiB | reserved MiB | stored MiB |")
    out.append("|---|---|---|---|---|---|---|")
    stored = (alive_ or {}).get("stored_by_layer_mib", {})
    for m in marks:
        s = stored.get(m["label"]) if m["phase"] == "forward" else None
        out.append(f"| {m['mark']} | {m['phase']} | {m['label']} | {m.get('alloc_mib', '—')} | "
                   f"{m.get('peak_since_mib', '—')} | {m.get('reserved_mib', '—')} | {'' if s is None else s} |")
    return "\n".join(out)


def main(argv=None):
    args = build_parser().parse_args(argv)
    row, marks = run(args)
    lines = [json.dumps(row)] + [json.dumps(m) for m in marks]
    print(lines[0], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    if args.markdown:
        print(markdown(row, marks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
