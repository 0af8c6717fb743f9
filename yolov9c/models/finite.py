"""Finite weights in checkpoints: which tensors hold inf/NaN, and an fp16 cast that never makes one.

    bad = nonfinite_names(sd)            # names of floating tensors holding inf or NaN (one host read in all)
    sd16, kept = half_where_safe(sd)     # fp16, except tensors with a finite value beyond ±65504 (kept float32)
    warn_nonfinite(ckpt, source)         # a loader's one WARNING line naming them (None when all finite)
    nonfinite_text(source, bad)          # "<source>: N tensors hold inf/NaN (a, b, ...)": that line's start

Invariant: half_where_safe never turns a finite value into inf (a BatchNorm running_var of 81177 stays float32);
values already inf/NaN are cast as they are. A state_dict of mixed fp16/float32 tensors loads into any model
(load_state_dict copies into the model's dtype).
Test: python -m pytest -q tests/models/test_checkpoint.py -k "finite or fp16"
"""

from __future__ import annotations

import logging

import torch

LOGGER = logging.getLogger("yolov9c")

FP16_MAX = 65504.0  # the largest finite float16


def nonfinite_names(sd: dict, prefix: str = "") -> list:
    """Names (prefix + key) of the floating tensors of state_dict `sd` holding an inf or NaN, in order. The
    per-tensor verdicts are gathered on the tensors' device and read once."""
    keys = [k for k, v in sd.items() if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()]
    if not keys:
        return []
    ok = torch.stack([torch.isfinite(sd[k]).all().to(sd[keys[0]].device) for k in keys]).cpu().tolist()
    return [prefix + k for k, good in zip(keys, ok) if not good]


def fits_fp16(v: torch.Tensor) -> bool:
    """Whether casting `v` to fp16 keeps every finite value finite (inf/NaN already there do not count)."""
    big = (v.abs() > FP16_MAX) & torch.isfinite(v)
    return not bool(big.any())


def half_where_safe(sd: dict) -> tuple:
    """(state_dict with floating tensors cast to fp16, names kept in float32 because a finite value of theirs is
    beyond the fp16 range). Integer tensors are unchanged."""
    out, kept = type(sd)(), []
    for k, v in sd.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            if v.dtype == torch.float16 or fits_fp16(v):
                v = v.half()
            else:
                v = v.float()
                kept.append(k)
        out[k] = v
    return out, kept


def describe(names: list, limit: int = 4) -> str:
    """'a, b, c, d (+3 more)'."""
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def warn_nonfinite(ckpt: dict, source) -> list:
    """Log one WARNING line when the model or EMA weights of checkpoint dict `ckpt` hold inf/NaN; returns the
    names (those of the EMA prefixed 'EMA ')."""
    bad = []
    for key in ("model", "ema"):
        if isinstance(ckpt.get(key), dict):
            bad += nonfinite_names(ckpt[key], prefix="" if key == "model" else "EMA ")
    if bad:
        LOGGER.warning(f"WARNING: {nonfinite_text(source, bad)}: these weights come from a diverged run and give "
                       f"meaningless outputs; use an earlier checkpoint (weights/epochN.pt) or train again with a "
                       f"smaller lr0")
    return bad


def nonfinite_text(source, bad: list) -> str:
    """What is wrong with the weights of `source` whose tensors `bad` (nonfinite_names) hold inf/NaN, in words:
    the start of every message about it (the loaders' warning, training's refusal of such --weights)."""
    return f"{source}: {len(bad)} tensors hold inf/NaN ({describe(bad)})"
