"""Native code in a child process: a crash there is one line, not the end of tflfuse.

The TFLite converter, litert-quantizer's calibration and the interpreter's allocate/invoke are
native code that can abort or segfault on odd input (seen: a 3e38 calibration value, a scale of
inf), which would end the Python process on the spot: exit 134/139, no message, a temp folder
left behind. `run(work, what=...)` runs `work` in a forked child and hands back its result
(pickled through a pipe). A child that dies (a signal, or an exit from native code) becomes a
`NativeCrashError` naming the model and the step it was in (the child says which with `stage()` and
`detail()`); an exception raised in the child is raised again in the parent. What the child's
Python code prints goes through the parent's own sys.stdout / sys.stderr (so progress bars and
messages reach a notebook, a test's capture or `tflfuse.quiet`'s routing as they would without
the child; native code writes to the inherited file descriptors). The parent owns
everything that must be cleaned up (the output temp folder), so nothing survives a crash, not
even a SIGKILL of the child; the child dies with the parent (PR_SET_PDEATHSIG).

Fork, not spawn: a spawned child must import TensorFlow again (9 s measured here on a loaded
machine) and cannot be handed a traced function or a Keras model, while a fork costs a few
milliseconds. But TensorFlow is not fork-safe once its runtime has started: measured here, the
converter hung in 3 of 3 children forked after the parent had run one conversion (its thread
pools do not survive the fork). So `run` forks only while TensorFlow is not imported in this
process, which is always the case for the CLI (everything TensorFlow does then happens in the
child); in a process that already runs TensorFlow (an API caller holding a Keras model) `work`
runs in-process, unprotected. TFLFUSE_ISOLATION=0 turns the child off (e.g. to debug a crash in
gdb). POSIX only; elsewhere `work` runs in-process.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import io
import os
import pickle
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tflfuse.errors import TflfuseError
from tflfuse.files import Terminated

T = TypeVar("T")

_channel: int | None = None  # the pipe to the parent, in an isolated child
_HEADER = struct.Struct("<Q")
_GRACE_S = 5.0  # how long an interrupted child gets to unwind before SIGKILL

_SIGNAL_WORDS = {
    "SIGSEGV": "segmentation fault",
    "SIGABRT": "abort",
    "SIGBUS": "bus error",
    "SIGFPE": "arithmetic fault",
    "SIGILL": "illegal instruction",
    "SIGKILL": "killed; out of memory?",
}


class NativeCrashError(TflfuseError):
    """Native code ended the process that ran a step (a signal or an exit from C++)."""

    def __init__(self, what: str, where: str, status: int) -> None:
        self.what, self.where, self.status = what, where, status
        super().__init__(
            f"{what}: {where} crashed in native code ({describe_status(status)}); nothing written"
        )


class IsolatedBugError(RuntimeError):
    """An unexpected exception in the isolated child (a tflfuse bug): its traceback, as text."""


def describe_status(status: int) -> str:
    """'SIGABRT, abort' for a waitpid status that is a signal, 'exit status 1' for an exit."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        word = _SIGNAL_WORDS.get(name)
        return f"{name}, {word}" if word else name
    return f"exit status {os.WEXITSTATUS(status)}"


def available() -> bool:
    """True when `run` can fork: POSIX, not turned off, not already in an isolated child, and
    TensorFlow not loaded here."""
    if not hasattr(os, "fork") or os.environ.get("TFLFUSE_ISOLATION", "1") == "0":
        return False
    return _channel is None and "tensorflow" not in sys.modules


# -- what the child is doing -------------------------------------------------------------------
_where = {"stage": "", "detail": ""}


def stage(text: str) -> None:
    """The step now running (e.g. "the quantize stage (litert-quantizer)"), for crash messages;
    clears the detail."""
    _where.update(stage=text, detail="")
    _tell()


def detail(text: str) -> None:
    """What inside the stage is running (e.g. "calibrating stock"), for crash messages."""
    _where["detail"] = text
    _tell()


def _where_text() -> str:
    where = _where["stage"] or "a native step"
    return f"{where}: {_where['detail']}" if _where["detail"] else where


def _tell() -> None:
    if _channel is not None:
        _send(_channel, ("where", _where_text()))


# -- the pipe ------------------------------------------------------------------------------------
def _send(fd: int, message: tuple[str, Any]) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None  # the child is gone
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _messages(fd: int) -> Iterator[tuple[str, Any]]:
    while True:
        header = _read_exactly(fd, _HEADER.size)
        if header is None:
            return
        body = _read_exactly(fd, _HEADER.unpack(header)[0])
        if body is None:
            return
        yield pickle.loads(body)


class _Forwarder(io.TextIOBase):
    """The child's stdout or stderr: each write goes to the parent, which writes it to its own
    stream of that name."""

    def __init__(self, fd: int, tag: str, like: Any) -> None:
        super().__init__()
        self._fd, self._tag, self._like = fd, tag, like

    def write(self, text: str) -> int:
        if text:
            _send(self._fd, (self._tag, text))
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        with contextlib.suppress(Exception):
            return bool(self._like.isatty())
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._like, "encoding", None) or "utf-8"


def _forward_streams(fd: int) -> None:
    """In the child: sys.stdout / sys.stderr (or what tflfuse.quiet's router shows of them)
    forwarded to the parent."""
    for name, tag in (("stdout", "out"), ("stderr", "err")):
        stream = getattr(sys, name)
        forwarder = _Forwarder(fd, tag, stream)
        if hasattr(stream, "show_through"):  # tflfuse.quiet: it keeps routing library chatter
            forwarder._like = stream.show_through(forwarder)
        else:
            setattr(sys, name, forwarder)


# -- exceptions across the fork ------------------------------------------------------------------
def _error_state(exc: TflfuseError) -> tuple[str, str, tuple[Any, ...], dict[str, Any]]:
    state = (type(exc).__module__, type(exc).__qualname__, exc.args, dict(vars(exc)))
    try:
        pickle.dumps(state)
    except Exception:  # an attribute that does not pickle: the message is what matters
        state = (type(exc).__module__, type(exc).__qualname__, (str(exc),), {})
    return state


def _portable(exc: BaseException) -> tuple[str, Any]:
    """An exception as it can cross the pipe: pickled when that round-trips, else its state."""
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)  # e.g. an __init__ taking other arguments than .args fails here
        return ("pickle", data)
    except Exception:
        if isinstance(exc, TflfuseError):
            return ("state", _error_state(exc))
        return ("state", ("tflfuse.errors", "TflfuseError", (str(exc),), {}))


def _unportable(message: tuple[str, Any]) -> BaseException:
    kind, payload = message
    return pickle.loads(payload) if kind == "pickle" else _rebuild(payload)


def _rebuild(state: tuple[str, str, tuple[Any, ...], dict[str, Any]]) -> TflfuseError:
    """The child's TflfuseError as the same class (whatever its __init__ takes)."""
    module, qualname, args, attrs = state
    cls: Any = TflfuseError
    with contextlib.suppress(Exception):
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        if isinstance(found, type) and issubclass(found, TflfuseError):
            cls = found
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(attrs)
    return exc


# -- parent and child ----------------------------------------------------------------------------
def run(work: Callable[[], T], *, what: str) -> T:
    """`work()` in a forked child when `available()`, else in-process (see the module docstring).
    Raises NativeCrashError when the child dies, and the child's own exceptions otherwise."""
    if not available():
        return work()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    scratch = tempfile.mkdtemp(prefix="tflfuse-child-")
    read_end, write_end = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        _private_temp(scratch)
        _child(work, write_end, parent)
    os.close(write_end)
    try:
        return _supervise(pid, read_end, what)
    finally:
        os.close(read_end)
        shutil.rmtree(scratch, ignore_errors=True)


def _private_temp(folder: str) -> None:
    """The child's temp files go to `folder`, which the parent removes when the child ends,
    however it ends: what the libraries leave for atexit (TensorFlow's AutoGraph writes each
    function it converts to `__autograph_generated_file*.py` there), which `os._exit` skips,
    and what a crash leaves. Python's tempfile and C code (TMPDIR) alike."""
    tempfile.tempdir = folder
    os.environ["TMPDIR"] = folder


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this child when the parent dies (a SIGKILLed tflfuse leaves no
    orphan converting away); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _child(work: Callable[[], Any], fd: int, parent: int) -> None:
    global _channel
    try:
        _die_with_parent(parent)
        _channel = fd
        _forward_streams(fd)
        try:
            result = work()
            message: tuple[str, Any] = ("result", result)
        except (TflfuseError, OSError) as exc:  # the user's problem: one line in the parent
            message = ("error", _portable(exc))
        except KeyboardInterrupt:
            message = ("interrupted", int(signal.SIGINT))
        except Terminated as exc:
            message = ("interrupted", exc.signum)
        except BaseException:
            message = ("bug", traceback.format_exc())
        try:
            _send(fd, message)
        except Exception:
            _send(fd, ("bug", traceback.format_exc()))
    finally:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):
                stream.flush()  # type: ignore[union-attr]  # a None stream: suppressed
        os._exit(0)


def _supervise(pid: int, fd: int, what: str) -> Any:
    where, outcome, broken = "a native step", None, None
    try:
        for kind, payload in _messages(fd):
            if kind == "where":
                where = payload
            elif kind == "out":
                broken = broken or _write(sys.stdout, payload)
            elif kind == "err":
                _write(sys.stderr, payload)
            else:
                outcome = (kind, payload)
        _, status = os.waitpid(pid, 0)
    except BaseException:  # interrupted: the child goes too, before the parent cleans up
        _stop(pid)
        raise
    if outcome is None:
        raise NativeCrashError(what, where, status)
    kind, payload = outcome
    if kind == "result":
        if broken is not None:  # the reader went away (`| head -1`): as it would end us
            raise broken
        return payload
    if kind == "error":
        raise _unportable(payload)
    if kind == "interrupted":
        if payload == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(payload)
    raise IsolatedBugError(f"tflfuse bug in {where} (isolated child process):\n{payload}")


def _write(stream: Any, text: str) -> BrokenPipeError | None:
    """Write what the child printed; a closed reader is remembered (the child goes on to the
    end, so what it writes is complete) and further output dropped."""
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError as exc:
        with contextlib.suppress(OSError, ValueError):  # later writes: nowhere, quietly
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        return exc
    return None


def _stop(pid: int) -> None:
    """End the child: SIGTERM (it unwinds, removing its own temp files), SIGKILL after a grace
    period, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if not done:
                time.sleep(0.02)
                continue
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
