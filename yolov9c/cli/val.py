"""`val_dual.py`: validate a checkpoint on a dataset with the published flags and run folders.

    python val_dual.py --weights runs/train/exp/weights/best.pt [--data D.yaml] [--imgsz 640] [--batch-size 32]

Loads ours, a published YOLOv9 .pt or a converted gelan file (yolov9c.load_model, fused), builds the val loader
(rect, pad 0.5, no augmentation), runs yolov9c.engine.val.validator.validate and writes runs/val/exp*
(labels/*.txt with --save-txt; <weights stem>_predictions.json with --save-json, evaluated by
yolov9c/engine/val/coco.py; confusion matrix, curves, val_batch images). --task val|test picks the split;
speed runs at conf 0.25 / iou 0.45 on square batches without plots and json; study sweeps --imgsz 256…1536.
Without --data the dataset recorded in the checkpoint is used (and said), else the built-in synthetic one.
--augment runs test-time augmentation (yolov9c/engine/tta.py). Refused with an argparse-style error: --dnn (ONNX only).
Bad input (missing weights, bad data yaml) gives one error line and exit code 2.
Test: python -m pytest -q tests/cli/test_val_cli.py
"""

import argparse
import contextlib
import sys
from pathlib import Path

from yolov9c.cli.weights_args import check_nms_args, check_refused_and_weights, missing_extension

EXIT_USAGE = 2
_REFUSED = {
    "dnn": "--dnn (OpenCV DNN for ONNX models) is not supported: yolov9c validates PyTorch weights",
}


def build_parser(prog="val_dual.py"):
    p = argparse.ArgumentParser(prog=prog, description="Validate a YOLOv9 checkpoint (published val_dual.py flags).")
    p.add_argument("--data", type=str, default=None,
                   help="dataset yaml, or synthetic[:SEED] (default: the dataset the checkpoint was trained on, "
                        "else the built-in synthetic dataset)")
    p.add_argument("--weights", nargs="+", type=str, default=None, help="model.pt path")
    p.add_argument("--batch-size", "--batch", type=int, default=32, help="batch size")
    p.add_argument("--imgsz", "--img", "--img-size", type=int, default=640, help="inference size (pixels)")
    p.add_argument("--conf-thres", type=float, default=0.001, help="confidence threshold")
    p.add_argument("--iou-thres", type=float, default=0.7, help="NMS IoU threshold")
    p.add_argument("--max-det", type=int, default=300, help="maximum detections per image")
    p.add_argument("--task", default="val", choices=("train", "val", "test", "speed", "study"),
                   help="train, val, test, speed or study")
    p.add_argument("--device", default="", help="cuda device, i.e. 0 or cpu")
    p.add_argument("--workers", type=int, default=8, help="max dataloader workers")
    p.add_argument("--single-cls", action="store_true", help="treat as single-class dataset")
    p.add_argument("--augment", action="store_true", help="augmented inference (TTA: scales 1, 0.83, 0.67 with a flip)")
    p.add_argument("--verbose", action="store_true", help="report mAP by class")
    p.add_argument("--save-txt", action="store_true", help="save results to *.txt")
    p.add_argument("--save-hybrid", action="store_true", help="save label+prediction hybrid results to *.txt")
    p.add_argument("--save-conf", action="store_true", help="save confidences in --save-txt labels")
    p.add_argument("--save-json", action="store_true", help="save a COCO-JSON results file")
    p.add_argument("--project", default="runs/val", help="save to project/name")
    p.add_argument("--name", default="exp", help="save to project/name")
    p.add_argument("--exist-ok", action="store_true", help="existing project/name ok, do not increment")
    p.add_argument("--half", action="store_true", help="use FP16 half-precision inference (CUDA only)")
    p.add_argument("--dnn", action="store_true", help="use OpenCV DNN for ONNX inference (refused)")
    return p


def _check(parser, opt):
    check_refused_and_weights(parser, opt, _REFUSED)
    if opt.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {opt.batch_size}")
    if opt.imgsz < 32:
        parser.error(f"--imgsz must be >= 32, got {opt.imgsz}")
    check_nms_args(parser, opt)
    if opt.workers < 0:
        parser.error(f"--workers must be >= 0, got {opt.workers}")


def _device(spec):
    from yolov9c.engine.detect.predictor import inference_device

    return inference_device(spec)


def data_from_checkpoint(ckpt, weights, log=print):
    """The dataset to validate on when --data is not given: the `data` option recorded in the checkpoint (its
    training run's --data), None (the built-in synthetic dataset) when it records none. A recorded yaml
    that does not exist here is an error that says to pass --data."""
    from yolov9c.data.dataset_yaml import is_synthetic

    opt = ckpt.get("opt")
    recorded = opt.get("data") if isinstance(opt, dict) else None
    if not recorded:
        log(f"data: {weights} records no dataset: validating on the built-in synthetic dataset (--data to choose)")
        return None
    recorded = str(recorded)
    if not is_synthetic(recorded) and not Path(recorded).expanduser().is_file():
        raise FileNotFoundError(f"--data not given, and the dataset recorded in {weights} ({recorded}) is not "
                                f"found from {Path.cwd()}: pass --data path/to/data.yaml")
    log(f"data: {recorded} (recorded in {weights}; --data overrides)")
    return recorded


@contextlib.contextmanager
def _removed_if_left_empty(save_dir, claimed):
    """Remove save_dir if the block fails while it is still empty and this run made it (never an --exist-ok
    folder that was there before): the next run then gets the same name, as after an error before the start."""
    try:
        yield
    except BaseException:
        if claimed and save_dir.is_dir() and not any(save_dir.iterdir()):
            save_dir.rmdir()
        raise


def run(opt, log=print):
    """Run one validation as `opt` says; returns the validate() result dict (study: the last one).
    opt.data None: the checkpoint's dataset (data_from_checkpoint), written back to opt.data."""
    from yolov9c.data.dataset import DatasetConfig
    from yolov9c.data.dataset_yaml import load_data_config
    from yolov9c.data.loader import LoaderConfig, create_dataloader
    from yolov9c.engine.val.coco import coco_layout
    from yolov9c.engine.run_dir import increment_path
    from yolov9c.engine.val.validator import ValConfig, validate
    from yolov9c.models.checkpoint import read_checkpoint
    from yolov9c.models.weights import model_from_checkpoint

    device = _device(opt.device)
    ckpt = read_checkpoint(opt.weights[0])
    model, _ = model_from_checkpoint(ckpt, source=opt.weights[0])
    if opt.data is None:
        opt.data = data_from_checkpoint(ckpt, opt.weights[0], log)
    del ckpt
    split = opt.task if opt.task in ("train", "test") else "val"
    cfg = load_data_config(opt.data, splits=(split,), log=log)  # the others need not be on disk
    nc = 1 if opt.single_cls else cfg["nc"]
    head_nc = int(getattr(model.model[-1], "nc", nc))
    if head_nc != nc and not opt.single_cls:
        raise ValueError(f"{opt.weights[0]} has {head_nc} classes but {opt.data or 'synthetic'} has {nc}: pass "
                         f"the dataset the model was trained on")
    model = model.to(device).fuse()
    names = ["item"] if opt.single_cls else cfg["names"]
    stride = max(int(model.stride.max()), 32)
    if split == "test" and not cfg.get("test"):  # not the val split's metrics under a test heading
        raise ValueError(f"--task test: {opt.data or 'synthetic'} has no 'test' split; add test: to the dataset "
                         f"yaml or use --task val")
    claimed = not (opt.exist_ok and (Path(opt.project) / opt.name).is_dir())
    save_dir = increment_path(Path(opt.project) / opt.name, exist_ok=opt.exist_ok, mkdir=True)
    conf, iou, plots = opt.conf_thres, opt.iou_thres, True
    if opt.task in ("train", "val", "test"):  # published main(): mAP from these runs is not comparable
        if opt.conf_thres > 0.001:
            log(f"WARNING: confidence threshold {opt.conf_thres} > 0.001 produces invalid results")
        if opt.save_hybrid:
            log("WARNING: --save-hybrid will return high mAP from hybrid labels, not from predictions alone")
    if opt.task == "speed":
        conf, iou, plots = 0.25, 0.45, False
    sizes = list(range(256, 1536 + 128, 128)) if opt.task == "study" else [opt.imgsz]
    # published: on for coco.yaml, off for --task speed
    save_json = opt.save_json or str(opt.data or "").endswith("coco.yaml")
    json_name = f"{Path(opt.weights[0]).stem}_predictions.json"
    # published: --task speed times square imgsz x imgsz batches (no rect shapes, no padding)
    rect, pad = (False, 0.0) if opt.task == "speed" else (True, 0.5)
    study_file = save_dir / f"study_{Path(str(opt.data or 'synthetic')).stem}_{Path(opt.weights[0]).stem}.txt"
    rows, result = [], None
    for imgsz in sizes:
        if opt.task == "study":  # published: which size the block below is
            log(f"Running {study_file.name} --imgsz {imgsz}...")
        data = DatasetConfig(augment=False, rect=rect, single_cls=opt.single_cls, stride=stride, pad=pad,
                             prefix=f"{split}: ", nc=cfg["nc"])
        with _removed_if_left_empty(save_dir, claimed):  # no usable images: no empty exp folder left behind
            loader, dataset = create_dataloader(cfg[split], imgsz, opt.batch_size,
                                                LoaderConfig(data, workers=opt.workers), log=log)
        _is_coco, anno, class_map, image_ids = coco_layout(cfg, cfg[split], dataset.im_files)
        vcfg = ValConfig(conf_thres=conf, iou_thres=iou, max_det=opt.max_det, half=opt.half and device.type == "cuda",
                         single_cls=opt.single_cls, augment=opt.augment, save_dir=save_dir,
                         plots=plots and opt.task != "study", verbose=opt.verbose,
                         save_txt=opt.save_txt or opt.save_hybrid, save_conf=opt.save_conf,
                         save_hybrid=opt.save_hybrid, save_json=save_json and opt.task != "speed",
                         json_name=json_name, anno_json=anno, class_map=class_map, image_ids=image_ids)
        result = validate(model, loader, nc=nc, names=names, cfg=vcfg, log=log)
        rows.append([imgsz, result["mp"], result["mr"], result["map50"], result["map"], *result["speed"]])
    if opt.task == "study":
        study_file.write_text("".join(("%10.4g" * len(r)) % tuple(r) + "\n" for r in rows))
        log(f"Saved {study_file}")
    if opt.save_txt or opt.save_hybrid:
        n = len(list((save_dir / "labels").glob("*.txt")))
        log(f"{n} labels saved to {save_dir / 'labels'}")
    return result


def main(argv=None, prog="val_dual.py"):
    """Parse `argv` (default sys.argv[1:]), validate, return the exit code (0 ok, 2 usage/input error)."""
    from yolov9c.data.dataset import DataError
    from yolov9c.data.dataset_yaml import DataConfigError
    from yolov9c.models.checkpoint import CheckpointError

    parser = build_parser(prog)
    opt = parser.parse_args(argv)
    _check(parser, opt)
    if not Path(opt.weights[0]).is_file():
        from yolov9c.models.published import weights_not_found

        print(f"{prog}: error: {weights_not_found(opt.weights[0])}", file=sys.stderr)
        return EXIT_USAGE
    why = missing_extension()
    if why:
        print(f"{prog}: error: {why}", file=sys.stderr)
        return EXIT_USAGE
    try:
        run(opt)
    except (FileNotFoundError, CheckpointError, DataConfigError, DataError, ValueError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
