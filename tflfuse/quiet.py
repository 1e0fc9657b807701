"""Quiet output: only tflfuse's own lines and progress bars reach the terminal.

TensorFlow, the TFLite converter, the interpreter and litert-quantizer talk a lot, at two levels:
C++ code writes straight to file descriptors 1 and 2 (absl and cudart_stub lines, "Created
TensorFlow Lite XNNPACK delegate", the MLIR "error: failed while converting" block of a
conversion that then succeeds, `fully_quantize: 0, ...`), and Python code writes to sys.stdout
and sys.stderr (warnings, logging, litert-quantizer's own tqdm bars). `TF_CPP_MIN_LOG_LEVEL`
silences only part of it.

`captured()` takes both: fds 1 and 2 point at a temp file for the duration, and sys.stdout and
sys.stderr become routers that pass a write to the terminal only when tflfuse's own code made it
(the first frame outside the stdlib's io/logging/warnings and tqdm is in a file of this package) and
send everything else to the same temp file. The captured text is kept (`Capture.text()`), so the
CLI shows it when it matters (a crash) and `-v` skips the capture altogether.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any, TextIO, TypeVar, cast

from tqdm import tqdm

# modules whose frames are plumbing between the code that writes and the stream
_PLUMBING: tuple[str, ...] = (
    "io",
    "_io",
    "codecs",
    "encodings",
    "logging",
    "warnings",
    "tqdm",
    "contextlib",
)
_PLUMBING += ("threading", "traceback")
# tflfuse's code is known by its file (the CLI may run as `python -m tflfuse.cli`: `__main__`)
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_SELF = os.path.abspath(__file__)


def _is_plumbing(frame: Any) -> bool:
    if os.path.abspath(frame.f_code.co_filename) == _SELF:
        return True
    module = frame.f_globals.get("__name__", "")
    return any(module == p or module.startswith(p + ".") for p in _PLUMBING)


def _written_by_tflfuse() -> bool:
    """True when the code behind the current write is tflfuse's (see the module docstring)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if not _is_plumbing(frame):
            return os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE)
        frame = frame.f_back
    return False


class _Router(io.TextIOBase):
    """A text stream that sends tflfuse's writes to `shown` and all others to `log`."""

    def __init__(self, shown: TextIO, log: TextIO) -> None:
        super().__init__()
        self._shown, self._log = shown, log

    def write(self, text: str) -> int:
        target = self._shown if _written_by_tflfuse() else self._log
        target.write(text)
        return len(text)

    def flush(self) -> None:
        self._shown.flush()
        self._log.flush()

    def show_through(self, stream: TextIO) -> TextIO:
        """Send what this router shows to `stream` from now on (tflfuse.isolation: a child
        process forwards it to its parent); returns where it went before."""
        previous, self._shown = self._shown, stream
        return previous

    def isatty(self) -> bool:
        try:
            return self._shown.isatty()
        except ValueError:  # closed with the capture; asked at exit (Ray's colorama)
            return False

    def fileno(self) -> int:
        return self._shown.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._shown, "encoding", None) or "utf-8"


class Capture:
    """What the libraries wrote while captured (readable during and after the capture)."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self._text: str | None = None

    def text(self) -> str:
        if self._text is not None:
            return self._text
        self._file.seek(0)
        return self._file.read().decode("utf-8", errors="replace")  # writes still append

    def _close(self) -> None:
        self._text = self.text()
        self._file.close()


def _terminal(stream: TextIO, fd: int, saved: int) -> TextIO:
    """Where `stream`'s shown writes go once fd `fd` is redirected: a stream on the saved copy of
    the fd when `stream` wrote to that fd, else `stream` itself (e.g. pytest's capture)."""
    try:
        uses_fd = stream.fileno() == fd
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        uses_fd = False
    if not uses_fd:
        return stream
    raw = open(saved, "wb", buffering=0, closefd=False)  # noqa: SIM115 - closed with the wrapper
    return io.TextIOWrapper(
        raw,
        encoding=getattr(stream, "encoding", None) or "utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=True,
    )


@contextlib.contextmanager
def captured() -> Iterator[Capture]:
    """Within: library output (fd-level and Python-level) goes to a temp file, tflfuse's own
    writes to the terminal. Restores everything on the way out, even on an exception."""
    # unbuffered and O_APPEND: C++ (through fds 1 and 2) and Python writes interleave in order
    log_file = tempfile.TemporaryFile(mode="a+b", buffering=0)  # noqa: SIM115 - Capture closes it
    log_text = io.TextIOWrapper(
        log_file, encoding="utf-8", errors="backslashreplace", write_through=True
    )
    capture = Capture(log_file)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    old_out, old_err, old_show = sys.stdout, sys.stderr, warnings.showwarning
    shown_out = _terminal(old_out, 1, saved[1])
    shown_err = _terminal(old_err, 2, saved[2])

    def show_warning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        log_text.write(warnings.formatwarning(message, category, filename, lineno))

    try:
        for fd in (1, 2):
            os.dup2(log_file.fileno(), fd)
        sys.stdout = _Router(shown_out, log_text)
        sys.stderr = _Router(shown_err, log_text)
        warnings.showwarning = show_warning
        yield capture
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr, warnings.showwarning = old_out, old_err, old_show
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        for shown, old in ((shown_out, old_out), (shown_err, old_err)):
            if shown is not old:
                with contextlib.suppress(Exception):
                    shown.flush()
                    cast(io.TextIOWrapper, shown).detach()  # made by _terminal
        log_text.flush()
        log_text.detach()
        capture._close()


_T = TypeVar("_T")


def progress_bar(samples: Iterable[_T], total: int, desc: str, enabled: bool) -> Iterable[_T]:
    """`samples` behind one of tflfuse's own progress bars (calibration: litert-quantizer's and
    the converter's), or as they are when progress is off."""
    if not enabled:
        return samples
    return tqdm(samples, total=total, desc=desc, unit="sample", leave=False)
