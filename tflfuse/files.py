"""File output that never leaves a half-written file or folder behind, even when interrupted."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tflfuse.errors import TflfuseError
from tflfuse.version import __version__


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same folder and an atomic rename."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise TflfuseError(f"{path}: folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:200]}.", suffix=".tmp", dir=folder)
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


def same_file(a: str | Path, b: str | Path) -> bool:
    """True when both paths name one existing file (so writing b would overwrite a)."""
    try:
        return Path(a).resolve() == Path(b).resolve() or os.path.samefile(a, b)
    except OSError:
        return False


# -- output folders ------------------------------------------------------------------------------
# A command that writes a folder of results (`convert -o OUT`) builds it in a hidden temp folder
# and publishes it at the end, so a failed or interrupted run leaves OUT as it was.
#
# What tflfuse may delete is what it can prove it wrote. Every published result holds a manifest
# (MANIFEST: each file's name and SHA-256). `force` replaces only the files an earlier manifest
# lists, and only while they still hold what tflfuse wrote; every other file in OUT (the user's
# notes, device runs, anything) is kept and named in the result (`publish` returns them), never
# moved. A folder without a manifest (another folder that happens to hold a report.json, or a
# result of a tflfuse older than the manifest) is refused even with `force`: nothing in it can
# be proven ours. Files listed but changed since are refused too (they hold the user's edits).
# Keeping foreign files rather than refusing the run is deliberate: users keep notes and device
# runs beside a result, and moving them away before every re-run is the kind of chore that ends
# in `rm -rf`.
#
# The temp folder sits beside an absent OUT (publishing is then one rename) and inside an
# existing OUT (each file is then renamed into place on the same filesystem, which also covers
# OUT being a mount point, and OUT itself, perhaps the current folder, is never replaced). It
# holds a marker (TEMP_MARKER: the owner's pid, process start time, pid namespace, boot id); a
# temp folder whose owner is provably gone (a run killed with SIGKILL) is removed by the next
# run into the same place. Temp folders without the marker are left alone.
MANIFEST = ".tflfuse-manifest.json"
TEMP_MARKER = ".tflfuse-temp"
_TEMP_TAG = ".tflfuse-"
_MANIFEST_FORMAT = 1


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def _temp_prefix(real: Path) -> str:
    return f".{real.name[:200]}{_TEMP_TAG}"  # room for the suffix within NAME_MAX


def _is_temp(entry: Path, real: Path) -> bool:
    return entry.name.startswith(_temp_prefix(real))


def _content(folder: Path) -> list[Path]:
    """What a folder holds, leaving out tflfuse's own temp folders, marker and manifest."""
    return [
        p
        for p in folder.iterdir()
        if not _is_temp(p, folder) and p.name not in (MANIFEST, TEMP_MARKER)
    ]


def _names(entries: list[Path]) -> str:
    first = sorted(entries)[:6]
    names = [p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in first]
    more = f" and {len(entries) - 6} more" if len(entries) > 6 else ""
    return ", ".join(names) + more


# -- the manifest --------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    """The SHA-256 (hex) of a file, as the result manifest lists it."""
    return _sha256(path)


def _plain_relative(name: Any) -> bool:
    """A manifest entry is a relative path below OUT: no '..', no absolute path, no hidden."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        return False
    parts = name.split("/")
    return all(p and p not in (".", "..") and not p.startswith(".") for p in parts)


def read_manifest(folder: Path) -> dict[str, str] | None:
    """{relative path: sha256} of the files tflfuse wrote into `folder`; None without a manifest.
    A manifest that cannot be read is a one-line error: nothing can be proven from it."""
    path = Path(folder) / MANIFEST
    if not path.is_file() or path.is_symlink():
        return None
    try:
        data = json.loads(path.read_bytes()[: 1 << 20].decode("utf-8"))
        files = data["files"]
        if not isinstance(files, dict) or not all(
            _plain_relative(k) and isinstance(v, str) and len(v) == 64 for k, v in files.items()
        ):
            raise ValueError("bad entries")
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise TflfuseError(
            f"{folder}: {MANIFEST} is unreadable, so tflfuse cannot tell which files it wrote"
            " there; nothing is deleted: choose another folder"
        ) from None
    return dict(files)


def _write_manifest(folder: Path, files: dict[str, str]) -> None:
    text = json.dumps(
        {"format": _MANIFEST_FORMAT, "tflfuse": __version__, "files": dict(sorted(files.items()))},
        indent=2,
    )
    atomic_write_text(folder / MANIFEST, text + "\n")


def _ours(real: Path, manifest: dict[str, str]) -> tuple[dict[str, Path], list[str]]:
    """The files of an earlier result still as tflfuse wrote them ({name: path}), and the listed
    names changed since (a different content, or no longer a plain file)."""
    unchanged: dict[str, Path] = {}
    changed: list[str] = []
    for name, digest in manifest.items():
        path = real / name
        if not path.exists() and not path.is_symlink():
            continue  # removed by the user: nothing to do
        if path.is_symlink() or not path.is_file() or _sha256(path) != digest:
            changed.append(name)
        else:
            unchanged[name] = path
    return unchanged, sorted(changed)


def _foreign(real: Path, manifest: dict[str, str]) -> list[Path]:
    """Entries of `real` tflfuse did not write (a folder counts when nothing in it is listed)."""
    listed_tops = {name.split("/")[0] for name in manifest}
    return sorted(p for p in _content(real) if p.name not in listed_tops)


# -- temp folders: marked, and removed once their owner is provably gone --------------------------
def _owner() -> dict[str, Any]:
    return {"pid": os.getpid(), **_process_identity(os.getpid())}


def _process_identity(pid: int) -> dict[str, Any]:
    """What tells a live process from a recycled pid: its start time, pid namespace, boot."""
    identity: dict[str, Any] = {"host": socket.gethostname()}
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        identity["start"] = int(stat.rsplit(")", 1)[1].split()[19])
    with contextlib.suppress(OSError):
        identity["pidns"] = os.readlink(f"/proc/{pid}/ns/pid")
    with contextlib.suppress(OSError):
        identity["boot"] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return identity


def _owner_gone(marker: dict[str, Any]) -> bool:
    """True only when the process that made a temp folder is provably not running any more."""
    here = _process_identity(os.getpid())
    if marker.get("host") != here["host"]:
        return False  # another machine (a shared volume): cannot tell
    if "boot" in here and marker.get("boot") and marker["boot"] != here["boot"]:
        return True  # the machine rebooted since
    if marker.get("pidns") != here.get("pidns"):
        return False  # another container: its pids are not ours to check
    pid = marker.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    then, now = marker.get("start"), _process_identity(pid).get("start")
    return then is not None and now is not None and then != now  # the pid was reused


def _make_temp(real: Path, where: Path) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(real), dir=where))
    try:
        (tmp / TEMP_MARKER).write_text(json.dumps(_owner()) + "\n")
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise TflfuseError(f"{real}: cannot write there: {exc.strerror or exc}") from None
    return tmp


def _is_our_marker_file(path: Path) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and _owner_gone(marker)


def _is_our_temp(path: Path) -> dict[str, Any] | None:
    """The marker of a tflfuse temp folder, or None when `path` is not provably one."""
    if path.is_symlink() or not path.is_dir():
        return None
    try:
        marker = json.loads((path / TEMP_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def remove_stale_temps(real: Path) -> list[Path]:
    """Remove the temp folders of killed runs into `real` (beside it and inside it): only those
    holding tflfuse's marker whose owner is provably gone. Returns what was removed."""
    removed = []
    stray = real / TEMP_MARKER  # a result published by a run killed before it removed this
    if real.is_dir() and _is_our_marker_file(stray):
        stray.unlink()
    for folder in (real.parent, real):
        try:
            entries = [p for p in folder.iterdir() if _is_temp(p, real)]
        except OSError:
            continue
        for entry in entries:
            marker = _is_our_temp(entry)
            if marker is not None and _owner_gone(marker):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


# -- where results may go ------------------------------------------------------------------------
def _protected(real: Path) -> str | None:
    """Why `real` is never a result folder: the root, the home folder, or a folder that holds
    the current one (results go into a folder of their own)."""
    if real == Path(real.anchor):
        return "the root folder"
    home = os.environ.get("HOME")
    with contextlib.suppress(OSError):
        if home and Path(home).resolve() == real:
            return "the home folder"
    with contextlib.suppress(OSError):
        cwd = Path.cwd().resolve()
        if real != cwd and real in cwd.parents:
            return "a folder that holds the current folder"
    return None


def prepare_output(
    output_dir: Path | str, *, force: bool = False, names: Iterable[str] = ()
) -> Path:
    """A fresh hidden temp folder to build `output_dir` in, after every check that can fail
    early (so no heavy work is done for a result that could not be written). `names`: files the
    result will hold, refused now when `output_dir` holds a file of that name tflfuse did not
    write."""
    if str(output_dir) == "":
        raise TflfuseError("the output folder name is empty")
    output_dir = Path(output_dir)
    try:
        if output_dir.exists() and not output_dir.is_dir():
            raise TflfuseError(f"{shown(output_dir)}: exists and is not a folder")
        real = output_dir.resolve()
    except OSError as exc:
        raise TflfuseError(f"{shown(output_dir)}: {exc.strerror or exc}") from None
    parent = real.parent
    if not parent.is_dir():
        raise TflfuseError(f"{shown(output_dir)}: parent folder {parent} does not exist")
    why = _protected(real)
    if why is not None:
        raise TflfuseError(
            f"{shown(output_dir)}: is {why}; tflfuse writes a result only into a folder of its own"
        )
    remove_stale_temps(real)
    if real.exists():
        try:
            _check_replaceable(shown(output_dir), real, force, names)
        except OSError as exc:
            raise TflfuseError(
                f"{shown(output_dir)}: cannot read it: {exc.strerror or exc}"
            ) from None
        if not _writable(real):
            raise TflfuseError(f"{shown(output_dir)}: cannot write there (permission denied)")
        where = real  # inside: OUT itself is never replaced, and renames stay on its filesystem
    elif _writable(parent):
        where = parent
    else:
        raise TflfuseError(f"{shown(output_dir)}: cannot create it in {parent} (permission denied)")
    try:
        return _make_temp(real, where)
    except OSError as exc:
        raise TflfuseError(
            f"{shown(output_dir)}: cannot write there: {exc.strerror or exc}"
        ) from None


def _check_replaceable(label: str, real: Path, force: bool, names: Iterable[str]) -> None:
    """Refuse (one line, listing the files) an existing folder tflfuse may not write into."""
    entries = _content(real)
    manifest = read_manifest(real)
    if not entries and manifest is None:
        return  # empty
    if manifest is None:
        hint = (
            " (a report.json alone does not make one: tflfuse replaces only files its manifest"
            f" {MANIFEST} lists)"
            if (real / "report.json").exists()
            else ""
        )
        raise TflfuseError(
            f"{label}: folder is not empty and holds no tflfuse result{hint}; it holds"
            f" {_names(entries)}: choose a new or empty folder"
        )
    if not force:
        raise TflfuseError(
            f"{label}: holds an earlier tflfuse result (pass --force to replace the files it"
            " wrote; other files are kept)"
        )
    _, changed = _ours(real, manifest)
    if changed:
        raise TflfuseError(
            f"{label}: {', '.join(changed)} changed since tflfuse wrote them; --force replaces"
            " only files as tflfuse wrote them: move those away first"
        )
    clash = sorted(n for n in names if n not in manifest and (real / n).exists())
    if clash:
        raise TflfuseError(
            f"{label}: holds {', '.join(clash)}, which tflfuse did not write and the new result"
            " would replace: move them away first"
        )


# -- publishing ----------------------------------------------------------------------------------
def _result_files(tmp: Path) -> dict[str, Path]:
    """{relative path: file} of a finished temp folder (its marker left out)."""
    out = {}
    for path in sorted(tmp.rglob("*")):
        rel = path.relative_to(tmp).as_posix()
        if rel == TEMP_MARKER or path.is_dir():
            continue
        if path.is_symlink() or not _plain_relative(rel):
            raise TflfuseError(f"{tmp}: tflfuse bug: the result holds {rel!r}")
        out[rel] = path
    return out


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait (blocked, then delivered) while the files are renamed into
    place, so an interrupt never leaves half of one result and half of the other."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def publish(tmp: Path, output_dir: Path, *, force: bool = False) -> list[str]:
    """Make the finished temp folder `tmp` (from `prepare_output`) the content of `output_dir`,
    with a manifest of what it holds. Returns the names of the entries of `output_dir` tflfuse
    did not write, which are kept (see the section comment). An absent `output_dir` is created
    by one rename, with mode 0777 minus the umask; in an existing one each file is renamed into
    place, the files of an earlier result it replaces removed, anything else left alone."""
    tmp, output_dir = Path(tmp), Path(output_dir)
    real = output_dir.resolve()
    files = _result_files(tmp)
    digests = {name: _sha256(path) for name, path in files.items()}
    if tmp.parent != real and not real.exists():
        _write_manifest(tmp, digests)
        os.chmod(tmp, 0o777 & ~_umask())
        try:
            os.rename(tmp, real)
        except OSError:  # OUT appeared meanwhile: publish into it as below
            (tmp / MANIFEST).unlink()
        else:
            (real / TEMP_MARKER).unlink()  # (a run killed just before: see remove_stale_temps)
            return []
    return _publish_into(tmp, real, shown(output_dir), files, digests, force)


def _publish_into(
    tmp: Path,
    real: Path,
    label: str,
    files: dict[str, Path],
    digests: dict[str, str],
    force: bool,
) -> list[str]:
    earlier = read_manifest(real)
    if not force and (earlier is not None or _content(real)):
        raise TflfuseError(f"{label}: folder is not empty (it was filled meanwhile)")
    manifest = earlier or {}
    foreign = _foreign(real, manifest)
    unchanged, changed = _ours(real, manifest)
    if changed:
        raise TflfuseError(
            f"{label}: {', '.join(changed)} changed while tflfuse worked; nothing replaced"
        )
    clash = sorted(n for n in files if n not in manifest and (real / n).exists())
    if clash:
        raise TflfuseError(
            f"{label}: {', '.join(clash)} appeared while tflfuse worked and would be replaced;"
            " nothing replaced"
        )
    stale = {name: path for name, path in unchanged.items() if name not in files}
    with _signals_held():
        # while files move, the manifest lists old and new: a run killed here leaves nothing
        # a later --force cannot prove it wrote
        _write_manifest(real, {**{n: manifest[n] for n in unchanged}, **digests})
        try:
            for name, path in files.items():
                target = real / name
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
        except OSError as exc:
            raise TflfuseError(
                f"{label}: cannot move the result into place: {exc.strerror or exc}"
            ) from None
        for path in stale.values():
            path.unlink()
        _write_manifest(real, digests)
        discard(tmp)
    return [p.name for p in foreign]


def discard(tmp: Path) -> None:
    """Remove an unpublished temp folder (a failed or interrupted run); only one tflfuse made."""
    tmp = Path(tmp)
    if _is_our_temp(tmp) is not None:
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


def shown(path: Path | str, limit: int = 160) -> str:
    """A path as an error message shows it: whole, or its start and end when very long."""
    text = str(path)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 :]}"


def _os_problem(path: Path, exc: OSError) -> TflfuseError:
    return TflfuseError(f"{shown(path)}: {exc.strerror or exc}")


def check_destination(path: Path | str, what: str = "output") -> None:
    """A one-line error now, before any work, if a file could not be written at `path` later."""
    if str(path) == "":
        raise TflfuseError(f"the {what} file name is empty")
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        if path.is_dir():
            raise TflfuseError(f"{shown(path)}: is a folder; the {what} needs a file name")
        if not folder.is_dir():
            raise TflfuseError(f"{shown(path)}: folder {shown(folder)} does not exist")
        exists = path.exists() or path.is_symlink()
        if exists and not path.is_file():
            raise TflfuseError(f"{shown(path)}: exists and is not a regular file")
        if not _writable(folder) or (exists and not os.access(path, os.W_OK)):
            raise TflfuseError(f"{shown(path)}: cannot write the {what} there (permission denied)")
        name_max = os.pathconf(folder, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
    except OSError as exc:  # a name or path too long, a loop of links
        raise _os_problem(path, exc) from None
    if len(os.fsencode(path.name)) > name_max:
        raise TflfuseError(
            f"{shown(path)}: file name too long ({len(os.fsencode(path.name))} bytes; at most"
            f" {name_max} here)"
        )


def check_input(path: Path | str, what: str = "model", *, folder_ok: bool = False) -> Path:
    """`path` as a Path, or a one-line error before anything reads it: an empty name, a name or
    path too long, a missing file, a folder (unless `folder_ok`), or not a regular file (a FIFO
    would block a read forever and a device such as /dev/zero never ends)."""
    if str(path) == "":
        raise TflfuseError(f"the {what} file name is empty")
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise TflfuseError(f"{shown(path)}: no such file") from None
    except OSError as exc:
        raise _os_problem(path, exc) from None
    if stat.S_ISDIR(mode):
        if folder_ok:
            return path
        raise TflfuseError(f"{shown(path)}: is a directory, not a {what} file")
    if not stat.S_ISREG(mode):
        raise TflfuseError(
            f"{shown(path)}: not a regular file (a FIFO, device or socket); the {what} must be"
            " a file"
        )
    return path
