"""Errors that reach the user as one line (the CLI prints them and exits 2, no traceback)."""

from __future__ import annotations

from pathlib import Path


class TflfuseError(Exception):
    """A problem with the user's input or environment, stated in one sentence."""

    exit_code = 2


class ModelError(TflfuseError):
    """A model file that cannot be read: missing, empty, truncated, corrupt or not a .tflite."""

    def __init__(self, source: str | Path, problem: str) -> None:
        self.source = str(source)
        self.problem = problem
        super().__init__(f"{self.source}: {problem}")


class UsageError(TflfuseError):
    """Arguments that cannot work together (e.g. an output path equal to the input)."""


class LoaderBugError(RuntimeError):
    """tflfuse failed on a model file that parsed: a bug in tflfuse, not a corrupt file.

    Deliberately not a `TflfuseError`: the CLI lets it through with its traceback (chained to the
    original exception), because the user cannot fix it and a report needs the trace.
    """

    def __init__(self, source: str | Path, step: str, cause: BaseException) -> None:
        self.source = str(source)
        self.step = step
        self.cause = cause
        super().__init__(
            f"{self.source}: tflfuse bug while reading a well-formed model "
            f"(in {step}: {type(cause).__name__}: {cause}); please report it"
        )
