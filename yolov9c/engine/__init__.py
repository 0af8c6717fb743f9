"""The engine, split by workflow:

    yolov9c/engine/train/    training: RunConfig, set-up → RunState, the loop (trainer) and its per-batch step,
                             resume, optimizers, LR schedule, EMA, AutoBatch, evolve, results
    yolov9c/engine/val/      validation: validator, metrics, COCO json evaluation, plots
    yolov9c/engine/detect/   detection: predictor, media sources, annotation
    yolov9c/engine/          shared by val and detect: postprocess (NMS), tta; run_dir (run folders)

Test: python -m pytest -q tests/engine/train/test_train_parts.py tests/engine/val/test_validator.py
    tests/engine/detect/test_detect_predictor.py
"""
