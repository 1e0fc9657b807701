"""File output that never leaves a half-written file or folder behind, even when interrupted."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tflfuse.errors import TflfuseError


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same folder and an atomic rename."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise TflfuseError(f"{path}: folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise TflfuseError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path))  # mkstemp makes 0600; give the file a normal mode
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise TflfuseError(f"{path}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mode_for(path: Path) -> int:
    """Keep an existing file's mode; a new file gets 0666 minus the umask, like open() gives."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def same_file(a: Path, b: Path) -> bool:
    """True when both paths name one existing file (so writing b would overwrite a)."""
    try:
        return Path(a).resolve() == Path(b).resolve() or os.path.samefile(a, b)
    except OSError:
        return False


# -- output folders ------------------------------------------------------------------------------
# A command that writes a folder of results (`convert -o OUT`) builds it in a hidden temp folder
# and publishes it at the end, so a failed or interrupted run leaves OUT as it was. The temp
# folder sits beside OUT when both are on one filesystem (then publishing is one rename), else
# inside OUT (OUT is its own mount point: a container volume, a USB stick; a rename across
# devices would fail with EXDEV). An existing non-empty OUT is refused unless `force`, and then
# only when it holds a previous tflfuse result (MARKER): its files are all replaced, stale ones
# (an old bench.json) removed.
MARKER = "report.json"
_TEMP_TAG = ".tflfuse-"


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def _same_device(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_dev == b.stat().st_dev
    except OSError:
        return False


def _content(folder: Path) -> list[Path]:
    """What a folder holds, leaving out tflfuse's own temp folders (of a killed run)."""
    ours = f".{folder.name}{_TEMP_TAG}"
    return [p for p in folder.iterdir() if not p.name.startswith(ours)]


def prepare_output(output_dir: Path, *, force: bool = False) -> Path:
    """A fresh hidden temp folder to build `output_dir` in, after every check that can fail
    early (so no heavy work is done for a result that could not be written)."""
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise TflfuseError(f"{output_dir}: exists and is not a folder")
    real = output_dir.resolve()
    parent = real.parent
    if not parent.is_dir():
        raise TflfuseError(f"{output_dir}: parent folder {parent} does not exist")
    if real.exists():
        try:
            entries = _content(real)
        except OSError as exc:
            raise TflfuseError(f"{output_dir}: cannot read it: {exc.strerror or exc}") from None
        if entries and not force:
            raise TflfuseError(
                f"{output_dir}: folder is not empty (pass --force to replace the results"
                " of an earlier run)"
            )
        if entries and not (real / MARKER).is_file():
            raise TflfuseError(
                f"{output_dir}: folder is not empty and holds no earlier tflfuse result"
                f" ({MARKER}); --force replaces only those: choose another folder"
            )
        if _same_device(real, parent) and _writable(parent) and _writable(real):
            where = parent
        elif _writable(real):
            where = real  # its own mount point, or a writable mount under a read-only parent
        else:
            raise TflfuseError(f"{output_dir}: cannot write there (permission denied)")
    elif _writable(parent):
        where = parent
    else:
        raise TflfuseError(f"{output_dir}: cannot create it in {parent} (permission denied)")
    try:
        return Path(tempfile.mkdtemp(prefix=f".{real.name}{_TEMP_TAG}", dir=where))
    except OSError as exc:
        raise TflfuseError(f"{output_dir}: cannot write there: {exc.strerror or exc}") from None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if sys.platform != "linux":
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return result == 0


def publish(tmp: Path, output_dir: Path, *, force: bool = False) -> None:
    """Make the finished temp folder `tmp` (from `prepare_output`) the content of `output_dir`:
    one rename (an atomic swap when it replaces an earlier result) when it sits beside it, else
    a move of its files into `output_dir` after the earlier files are moved out. The folder gets
    the mode of the one it replaces, or 0777 minus the umask."""
    tmp, output_dir = Path(tmp), Path(output_dir)
    real = output_dir.resolve()
    if tmp.parent == real:
        _publish_inside(tmp, real, force)
        return
    if real.exists() and any(real.iterdir()):
        if _content(real) and not force:
            raise TflfuseError(f"{output_dir}: folder is not empty (it was filled meanwhile)")
        mode = real.stat().st_mode & 0o7777
        os.chmod(tmp, mode)
        if not _exchange(tmp, real):  # two renames: OUT is absent for a moment
            old = Path(tempfile.mkdtemp(prefix=f".{real.name}{_TEMP_TAG}old-", dir=real.parent))
            os.replace(real, old / real.name)
            os.replace(tmp, real)
            tmp = old
        shutil.rmtree(tmp, ignore_errors=True)  # the earlier result
        return
    mode = real.stat().st_mode & 0o7777 if real.exists() else 0o777 & ~_umask()
    os.chmod(tmp, mode)
    os.replace(tmp, real)  # onto an absent or empty folder


def _publish_inside(tmp: Path, real: Path, force: bool) -> None:
    old_entries = [p for p in _content(real) if p != tmp]
    if old_entries and not force:
        raise TflfuseError(f"{real}: folder is not empty (it was filled meanwhile)")
    trash = Path(tempfile.mkdtemp(prefix=f".{real.name}{_TEMP_TAG}old-", dir=real))
    for p in old_entries:
        os.replace(p, trash / p.name)
    for p in sorted(tmp.iterdir()):
        os.replace(p, real / p.name)
    tmp.rmdir()
    shutil.rmtree(trash, ignore_errors=True)


def discard(tmp: Path) -> None:
    """Remove an unpublished temp folder (a failed or interrupted run)."""
    shutil.rmtree(tmp, ignore_errors=True)


# -- signals -------------------------------------------------------------------------------------
class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: raised like KeyboardInterrupt, so cleanup code runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Within: SIGTERM and SIGHUP raise Terminated (SIGINT raises KeyboardInterrupt as always),
    so `except BaseException` / `finally` cleanup runs instead of the process dying on the spot.
    After the first signal the others are ignored until the block ends, so cleanup is not cut
    short. Only the main thread can install handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    names = [n for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]
    watched = [getattr(signal, n) for n in names]
    previous = {s: signal.getsignal(s) for s in watched}

    def handler(signum: int, frame: Any) -> None:
        for s in watched:
            signal.signal(s, signal.SIG_IGN)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    for s in watched:
        if previous[s] != signal.SIG_IGN:  # a nohup'd run keeps ignoring SIGHUP
            signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def check_destination(path: Path, what: str = "output") -> None:
    """A one-line error now, before any work, if a file could not be written at `path` later."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise TflfuseError(f"{path}: is a folder; the {what} needs a file name")
    if not folder.is_dir():
        raise TflfuseError(f"{path}: folder {folder} does not exist")
    if not _writable(folder) or (path.exists() and not os.access(path, os.W_OK)):
        raise TflfuseError(f"{path}: cannot write the {what} there (permission denied)")
