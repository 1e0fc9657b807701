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
