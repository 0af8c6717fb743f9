"""Every training option's check, in one place: the type its value must have and the range it must lie in.

    CHECKS["epochs"].text("3")            # 3: a command-line word (cli/train.py builds its argparse types here)
    CHECKS["epochs"].value(-1)            # ValueError "must be an integer >= 1, got -1": a stored (yaml) value
    checked(stored, source)               # a stored mapping's known options, each checked → OptionError
    combination_error(cfg, name)          # options that exclude or need each other; None when they agree

The command line (yolov9c/cli/train.py) and every stored set of options (opt.yaml, a checkpoint's 'opt':
RunConfig.from_dict, which --resume reads) use these entries, so what the command line refuses is refused in an
opt.yaml too, in the same words. A stored value must have the option's yaml type (an integer is `5`, not `5.0`,
`'5'` or `true`; a flag is `true` or `false`). Three rules live with what they guard and are called from here:
parse_switch (the c backend's switches and their YOLOV9C_* variables), parse_size (memory sizes) and check_hyp
(a hyp mapping). batch_error (batching.py) needs the process count and is asked at set-up.
Test: python -m pytest -q tests/engine/train/test_options.py
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from yolov9c.backends.c.switches import parse_switch
from yolov9c.engine.train.memory_plan import parse_size
from yolov9c.resources import check_hyp

OPTIMIZERS = ("SGD", "Adam", "AdamW", "LION")
CACHE_CHOICES = ("ram", "disk", "val")
BACKENDS = ("torch", "c")
VAL_CHUNKS = ("auto", "off")  # --val-chunks (val_chunks.py)
SCHEDULES = ("cos_lr", "flat_cos_lr", "fixed_lr")  # at most one; none: the linear schedule


class OptionError(ValueError):
    """A stored option whose value its check refuses, "<source>: <key>: <what is wrong, what is allowed>", or
    stored options that exclude each other (key None: the line names them)."""

    def __init__(self, source, key, why):
        super().__init__(f"{source}: {key}: {why}" if key else f"{source}: {why}")
        self.key = key


@dataclass(frozen=True)
class Check:
    """One option's rule. `value` takes a stored value (already typed by yaml), `text` a command-line word (None:
    the option takes no word, a flag); both return the option's value or raise ValueError saying what is wrong
    and what is allowed."""
    value: Callable
    text: Callable | None = None


def shown(v):
    """A value as yaml writes it (null, true, 'text', 5), for the error messages."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return repr(v)


def _number(cast, kinds, ok, allowed):
    """A number of `kinds` (never a bool) for which ok(v) holds, returned as cast(v); on the command line the text
    is read by cast first. ValueError "<allowed>, got <value>" otherwise."""
    def value(v):
        if isinstance(v, bool) or not isinstance(v, kinds) or not ok(v):  # NaN fails every `ok`
            raise ValueError(f"{allowed}, got {shown(v)}")
        return cast(v)

    def text(t):
        try:
            v = cast(t)
        except ValueError:
            raise ValueError(f"{allowed}, got {t!r}") from None
        return value(v)
    return Check(value, text)


def _integer(ok, allowed):
    return _number(int, int, ok, allowed)


def _at_least(lo):
    return _integer(lambda v: v >= lo, f"must be an integer >= {lo}")


def _real(ok, allowed):
    return _number(float, (int, float), ok, allowed)


def _typed(kinds, allowed):
    """A stored value of one of `kinds` (bool, str), taken as it is; no command-line word."""
    def value(v):
        if not isinstance(v, kinds):
            raise ValueError(f"{allowed}, got {shown(v)}")
        return v
    return Check(value)


def _choice(values):
    def value(v):
        if not isinstance(v, str) or v not in values:
            raise ValueError(f"must be one of {', '.join(values)}, got {shown(v)}")
        return v
    return Check(value)  # the command line: argparse's choices= of the same tuple


def _optional(check, means):
    """`check`, or null (yaml) standing for `means`."""
    def value(v):
        if v is None:
            return None
        try:
            return check.value(v)
        except ValueError as e:
            raise ValueError(f"{e} (or null: {means})") from None
    return Check(value, check.text)


def _switch(name):
    def value(v):
        if isinstance(v, bool) and name != "main_recompute":
            return v  # opt.yaml writes the on/off switches as true/false
        return parse_switch(name, v)  # 0/1 or a stride, as the command line and YOLOV9C_* take them
    return Check(value, lambda t: parse_switch(name, t))


def _size(gib, auto=False):
    """A memory size: a number of GiB or a text such as 7.5G (memory_plan.parse_size); `gib`: stored as GiB;
    `auto`: the word auto too (--mem-budget auto: memory_auto.py)."""
    def value(v):
        if auto and isinstance(v, str) and v.strip().lower() == "auto":
            return "auto"
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise ValueError(f"must be a memory size such as 7.5 (GiB) or '8GB'{' or auto' if auto else ''}, "
                             f"got {shown(v)}")
        size = parse_size(str(v))  # ValueError: not a size, or not positive
        return size if gib else v
    return Check(value)


def _freeze():
    def value(v):
        items = v if isinstance(v, list) else [v]  # older files: a bare number
        if not items or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in items):
            raise ValueError(f"must be a list of layer indices (integers >= 0), got {shown(v)}")
        return items
    return Check(value, _integer(lambda v: v >= 0, "layer indices must be integers >= 0").text)


def _hyp():
    def value(v):
        if isinstance(v, str):
            return v
        if not isinstance(v, dict):
            raise ValueError(f"must be a hyp file name or a mapping of hyperparameters, got {shown(v)}")
        try:
            return check_hyp(dict(v), where="hyp")
        except ValueError as e:
            raise ValueError(str(e).removeprefix("hyp: ")) from None
    return Check(value)


def _device():
    def value(v):
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return str(v)  # `device: 0` written by hand
        if not isinstance(v, str):
            raise ValueError(f"must be a device text such as '', '0', '0,1' or 'cpu', got {shown(v)}")
        return v
    return Check(value)


_FLAG = _typed((bool,), "must be true or false")
_TEXT = _typed((str,), "must be a text")
_INT = _integer(lambda v: True, "must be an integer")
_PROBABILITY = _real(lambda v: 0.0 <= v <= 1.0, "must be a probability in [0, 1]")

# field of RunConfig -> its check. Every field but `given` has one (tests/engine/train/test_options.py).
CHECKS = {
    "weights": _TEXT, "cfg": _TEXT, "data": _TEXT, "hyp": _hyp(),
    "epochs": _at_least(1),
    "batch_size": _integer(lambda v: v >= 1 or v == -1, "must be a positive integer (or -1 for AutoBatch)"),
    "imgsz": _at_least(32),
    "rect": _FLAG, "resume": _typed((bool, str), "must be true, false or the path of a last.pt"),
    "nosave": _FLAG, "noval": _FLAG, "noautoanchor": _FLAG, "noplots": _FLAG,
    "evolve": _optional(_at_least(1), "no evolution"), "bucket": _TEXT,
    "cache": _optional(_choice(CACHE_CHOICES), "no cache"), "image_weights": _FLAG, "device": _device(),
    "multi_scale": _FLAG, "single_cls": _FLAG, "optimizer": _choice(OPTIMIZERS), "sync_bn": _FLAG,
    "workers": _at_least(0), "project": _TEXT, "name": _TEXT, "exist_ok": _FLAG, "quad": _FLAG,
    "cos_lr": _FLAG, "flat_cos_lr": _FLAG, "fixed_lr": _FLAG,
    "label_smoothing": _real(lambda v: 0.0 <= v < 1.0, "must be a number in [0, 1)"),
    "patience": _at_least(0), "freeze": _freeze(), "save_period": _INT, "seed": _INT, "local_rank": _INT,
    "min_items": _at_least(0), "close_mosaic": _at_least(0),
    "entity": _optional(_TEXT, "none"), "upload_dataset": _typed((bool, str), "must be true, false or a text"),
    "bbox_interval": _INT, "artifact_alias": _TEXT,
    "backend": _optional(_choice(BACKENDS), "c on a CUDA GPU, torch on the CPU"),
    "channels_last": _optional(_FLAG, "the backend's default"),
    "accumulate": _optional(_at_least(1), "the nominal-64 rule"), "amp": _FLAG, "ckpt": _FLAG,
    "aux_recompute": _switch("aux_recompute"), "main_recompute": _switch("main_recompute"),
    "keep_inputs": _switch("keep_inputs"), "plain_stride": _switch("plain_stride"),
    "val_period": _at_least(1), "pin_memory": _optional(_FLAG, "the PIN_MEMORY variable"), "gpu_augment": _FLAG,
    "mosaic": _optional(_PROBABILITY, "the hyp file's"), "mixup": _optional(_PROBABILITY, "the hyp file's"),
    "deterministic": _FLAG, "max_nonfinite": _at_least(0), "divergence_stop": _FLAG, "cuda_graph": _FLAG,
    "graph_shapes": _FLAG, "cudnn_benchmark": _FLAG, "val_chunks": _choice(VAL_CHUNKS),
    "mem_budget": _optional(_size(gib=False, auto=True), "no budget"), "mem_cap": _optional(_size(gib=True), "no cap"),
    "dynamic_img": _FLAG, "min_img": _at_least(32),
    "mem_plan": _optional(_typed((dict,), "must be a mapping (what --mem-budget auto chose)"), "no plan"),
    "save_dir": _TEXT, "world_size": _at_least(1), "global_rank": _integer(lambda v: v >= -1,
                                                                          "must be an integer >= -1"),
}


def checked(stored: dict, source) -> dict:
    """The options of `stored` (a mapping read from a file) that CHECKS knows, each through its check (values
    normalised: `device: 0` → '0', `freeze: 3` → [3]). OptionError for the first refused one, in the mapping's
    order: "<source>: <key>: <why>". Unknown keys are left out (the caller names them)."""
    out = {}
    for key, v in stored.items():
        if key not in CHECKS:
            continue
        try:
            out[key] = CHECKS[key].value(v)
        except ValueError as e:
            raise OptionError(source, key, str(e)) from None
    return out


def combination_error(cfg, name=str):
    """The first options of `cfg` (a RunConfig) that exclude or need each other, as one line naming them through
    `name` (a field name → how the source spells it: '--cos-lr' on the command line, 'cos_lr' in opt.yaml); None
    when they agree."""
    on = [k for k in SCHEDULES if getattr(cfg, k)]
    if len(on) > 1:
        return (f"{', '.join(map(name, SCHEDULES[:-1]))} and {name(SCHEDULES[-1])} are alternatives: at most one "
                f"may be on, got {' and '.join(map(name, on))}")
    if cfg.quad and 0 < cfg.batch_size < 4:  # data/quad.py: published collate_fn4 would stack no image at all
        return (f"{name('quad')} makes one image of every 4: it needs {name('batch_size')} 4 or more, got "
                f"{cfg.batch_size}")
    if cfg.dynamic_img and (cfg.mem_budget is None or cfg.mem_budget == "auto"):
        return (f"{name('dynamic_img')} needs {name('mem_budget')} SIZE (it picks the image size that fits the "
                f"budget; auto keeps the images and splits the batch)")
    return None
