"""The training engine: trainer (the loop), optimizers, LR schedule, EMA, run folders, results files;
validator/metrics/postprocess (validation) and predictor (detection) live here too.

Test: python -m pytest -q tests/test_train_parts.py tests/test_train_e2e.py
"""
