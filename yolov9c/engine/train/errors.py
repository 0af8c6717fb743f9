"""TrainError: a problem a user can cause (bad data, a missing file, a bad combination of options). The CLI prints
it as one `train_dual.py: error: ...` line and exits with code 2."""


class TrainError(RuntimeError):
    """A user-facing problem of a training run: one `error:` line."""
