"""`python -m yolov9c`: the package's command line (argparse subcommands).

    python -m yolov9c info --cfg yolov9-s.yaml [--nc 80] [--imgsz 640] [--fuse]
    python -m yolov9c info --weights yolov9-c.pt            # the model inside a checkpoint
    python -m yolov9c convert --weights yolov9-c.pt --cfg gelan-c.yaml --out yolov9-c-converted.pt
    python -m yolov9c check-data --data D.yaml               # scan a dataset (yolov9c/cli/check_data.py)
    python -m yolov9c export --weights best.pt --format onnx # ONNX file, checked (yolov9c/cli/export.py)
    python -m yolov9c memory --cfg yolov9-s.yaml --batch 64 --img 640   # predicted memory (yolov9c/cli/memory.py)

`info` prints the published parse table and `<name> summary: L layers, P parameters, G gradients, F GFLOPs`.
`convert` re-parameterises a trained yolov9-X (ours or a published .pt) into the gelan-X inference model and
writes it in our checkpoint format (atomic; loadable by yolov9c.load_model).
Errors (missing file, unknown config, weights that do not fit) print one `error:` line to stderr and exit with
code 2, writing nothing. Test: python -m pytest -q tests/cli/test_cli.py
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing error: printed as `error: <message>`, exit code 2."""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m yolov9c",
                                     description="yolov9c: YOLOv9 training that fits. Model tools.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    info = sub.add_parser("info", help="layer table, parameters and GFLOPs of a model config or checkpoint",
                          description="Print the layer table, parameter count and GFLOPs of a model.")
    src = info.add_mutually_exclusive_group(required=True)
    src.add_argument("--cfg", help="model yaml: a name (yolov9-s, gelan-c.yaml) or a path")
    src.add_argument("--weights", help="a checkpoint (ours or a published YOLOv9 .pt)")
    info.add_argument("--nc", type=int, default=None, help="number of classes (overrides the yaml's nc)")
    info.add_argument("--imgsz", "--img", "--img-size", type=int, default=640,
                      help="square image size for the GFLOPs figure (default 640)")
    info.add_argument("--fuse", action="store_true",
                      help="fold BatchNorms and RepConvN branches first (the inference model's figures)")

    conv = sub.add_parser("convert", help="re-parameterise a yolov9-X checkpoint into gelan-X",
                          description="Load a trained yolov9-X checkpoint (ours or published), drop the "
                                      "auxiliary branch (re-parameterise to gelan-X) and save it in our format.")
    conv.add_argument("--weights", required=True, help="input checkpoint (yolov9-X, ours or published .pt)")
    conv.add_argument("--cfg", required=True, help="target gelan model yaml (e.g. gelan-c.yaml)")
    conv.add_argument("--out", required=True, help="output checkpoint path")
    conv.add_argument("--fp32", action="store_true",
                      help="store float32 weights (default fp16, like the published converted files)")

    from yolov9c.cli import check_data, export, memory

    check_data.add_parser(sub)
    export.add_parser(sub)
    memory.add_parser(sub)
    return parser


def _positive_imgsz(imgsz: int) -> int:
    if imgsz < 32:
        raise CliError(f"--imgsz must be at least 32, got {imgsz}")
    return imgsz


def cmd_info(args) -> int:
    import torch

    from yolov9c.models.info import count_flops, layer_table, model_summary

    imgsz = _positive_imgsz(args.imgsz)
    if args.cfg is not None:
        from yolov9c.models.model import DetectionModel
        if args.nc is not None and args.nc < 1:
            raise CliError(f"--nc must be a positive integer, got {args.nc}")
        try:
            model = DetectionModel(args.cfg, nc=args.nc)
        except FileNotFoundError as e:
            raise CliError(str(e)) from None
        except (ValueError, TypeError, KeyError) as e:
            raise CliError(f"cannot build the model from {args.cfg}: {e}") from None
        where = args.cfg
    else:
        if args.nc is not None:
            raise CliError("--nc applies to --cfg only; a checkpoint's class count is fixed by its weights")
        model = _load(args.weights)
        where = args.weights
    model.eval()
    if args.fuse:
        model.fuse()
    with torch.no_grad():
        gflops = count_flops(model, imgsz)
    print(layer_table(model))
    print(model_summary(model, imgsz, gflops=gflops))
    print(f"(GFLOPs at {imgsz}x{imgsz}; {'fused' if args.fuse else 'unfused'} model from {where}; "
          f"nc={getattr(model, 'nc', '?')})")
    return 0


def _load(path: str):
    """Our DetectionModel from a checkpoint, with loader errors turned into CliError."""
    from yolov9c.models.checkpoint import CheckpointError
    from yolov9c.models.published import weights_not_found
    from yolov9c.models.weights import load_model

    if not Path(path).is_file():  # a folder, or a published name to download: said as export and convert say it
        raise CliError(weights_not_found(path))
    try:
        return load_model(path)
    except FileNotFoundError as e:
        raise CliError(str(e)) from None
    except CheckpointError as e:  # includes UnsafeCheckpointError
        raise CliError(str(e)) from None
    except (ValueError, KeyError, TypeError) as e:
        raise CliError(f"{path}: cannot rebuild the stored model: {e}") from None


def cmd_convert(args) -> int:
    import torch

    from yolov9c.models.atomic_io import DiskFullError, is_temp_name
    from yolov9c.models.checkpoint import CheckpointError, read_checkpoint, save_checkpoint
    from yolov9c.models.weights import model_from_checkpoint

    out = Path(args.out)
    src = Path(args.weights)
    if not src.is_file():
        from yolov9c.models.published import weights_not_found

        raise CliError(weights_not_found(src))
    if out.resolve() == src.resolve():
        raise CliError("--out must differ from --weights (the input is kept)")
    if out.is_dir():
        raise CliError(f"--out is a directory: {out}")
    # resolve the target config first: an unknown name fails before the (slow) checkpoint read
    from yolov9c.models.parse import resolve_config
    try:
        resolve_config(args.cfg)
    except (FileNotFoundError, ValueError, TypeError) as e:
        raise CliError(f"--cfg: {e}") from None

    t0 = time.time()
    try:
        ckpt = read_checkpoint(src)
        model, (n, total) = model_from_checkpoint(ckpt, source=str(src))
    except (FileNotFoundError, CheckpointError) as e:
        raise CliError(str(e)) from None
    except (ValueError, KeyError, TypeError) as e:
        raise CliError(f"{src}: cannot rebuild the stored model: {e}") from None
    head = type(model.model[-1]).__name__
    print(f"Loaded {src} ({ckpt.get('source')} checkpoint, {head} head, nc={model.nc}, "
          f"{'EMA' if ckpt.get('ema') else 'model'} weights): transferred {n}/{total} items")

    stem, target = Path(model.yaml_file or "").stem, Path(args.cfg).stem
    if head != "DualDDetect":
        raise CliError(f"{src} holds a {stem or 'single-head'} model ({head} head, no auxiliary branch): nothing to "
                       "convert; use it as it is (val.py, detect.py, export)")
    import re
    pair = re.fullmatch(r"yolov9(-[tsmce])?", stem), re.fullmatch(r"gelan(-[tsmce])?", target)
    if all(pair) and pair[0].group(1) != pair[1].group(1):  # e.g. yolov9-t into gelan-s: say which one fits
        raise CliError(f"--cfg {args.cfg} does not match the checkpoint's {stem}: use gelan{pair[0].group(1) or ''}.yaml")

    from yolov9c.models.reparam import reparameterize
    try:
        with torch.no_grad():
            gelan = reparameterize(model, args.cfg)  # nc (and names) follow the trained model
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise CliError(f"cannot re-parameterise {src} into {args.cfg}: {e}") from None
    gelan.names = list(model.names)
    if getattr(model, "hyp", None) is not None:
        gelan.hyp = model.hyp

    try:
        save_checkpoint(out, gelan, half=not args.fp32)
    except DiskFullError as e:  # its one line says what was needed and what is free
        raise CliError(str(e)) from None
    except OSError as e:  # a read-only folder, a file where a folder should be
        where = f" ({e.filename})" if e.filename and not is_temp_name(Path(e.filename).name) else ""
        raise CliError(f"cannot write {out}: {e.strerror or e}{where}") from None
    n_src = sum(p.numel() for p in model.parameters())
    n_dst = sum(p.numel() for p in gelan.parameters())
    print(f"Re-parameterised {Path(model.yaml_file or 'model').stem} -> {Path(gelan.yaml_file or 'gelan').stem}: "
          f"{n_src} -> {n_dst} parameters (auxiliary branch and head dropped)")
    print(f"Saved {out} ({out.stat().st_size / 1e6:.1f} MB, {'fp32' if args.fp32 else 'fp16'}) "
          f"in {time.time() - t0:.1f}s")
    return 0


def main(argv=None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 usage or input error)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = _build_parser()
    args = parser.parse_args(argv)  # argparse itself exits with 2 on a usage error
    try:
        return {"info": cmd_info, "convert": cmd_convert}.get(args.command, getattr(args, "func", None))(args)
    except CliError as e:
        print(f"{parser.prog} {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
