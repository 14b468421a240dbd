"""The errors of the training side of the Zeus optimizers (:mod:`offcut.client.training`,
which re-exports them)."""

from __future__ import annotations


class TrainingSetupError(ValueError):
    """The run cannot start as configured (a missing or malformed ``OFFCUT_*`` variable, a
    batch size that is not the trial's, a power range outside the GPU's); says what to fix."""


class BackendUnavailable(RuntimeError):
    """No measurement backend could be created (library missing, no GPU, no energy counter)."""


class PowerLimitError(RuntimeError):
    """A GPU refused a power limit. ``gpu_index`` (the framework's index) and
    ``power_limit_w`` [W] name what was attempted."""

    def __init__(self, message: str, gpu_index: int, power_limit_w: float):
        super().__init__(message)
        self.gpu_index = gpu_index
        self.power_limit_w = power_limit_w


class PowerHelperError(RuntimeError):
    """The node's power helper (zeusd's API on ``ZEUSD_SOCK_PATH``) could not be reached,
    refused a request or answered something else than zeusd's shape. ``status``: the HTTP
    status of a refusal (403: a GPU that is not the job's; 400: a limit outside the GPU's
    range), None otherwise."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RankSyncError(RuntimeError):
    """Rank 0 failed a step that every rank of the generation takes together (fetching or
    reporting the daemon's power plan) and told the other ranks so; its own error, with the
    cause, is in its log."""


class TrialEndedError(RuntimeError):
    """An epoch was started on a trial that already has a final verdict (check
    :attr:`ZeusTraining.should_stop` before each epoch)."""
