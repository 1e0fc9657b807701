"""The `tflfuse` command: the parser, the dispatch, and what every command shares when it fails.

The command line is a package. `commands` declares every command and its options (the only
module that declares arguments); the command `X` is `run(args)` of tflfuse/cli/X.py, which calls
library functions (through `tflfuse.api` for the pipelines) and prints. Errors the user can fix
are `TflfuseError`s: printed as one line `tflfuse: error: ...`, exit code 2, no traceback.

A command's module is imported when that command runs, and only then (`_run_command`): that is
what keeps NumPy, the IR and the pipelines out of `tflfuse --help`, `--version` and
device_scripts/compile_edgetpu.py (which reads the parser), and keeps `inspect` from loading the
pipelines. Each command module imports what it needs at its top.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from typing import NoReturn

from tflfuse import quiet
from tflfuse.cli.commands import ADDERS, JSON_TAKES_A_PATH
from tflfuse.errors import TflfuseError
from tflfuse.files import Terminated, shown, signals_raise
from tflfuse.version import __version__


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line like every other error (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"tflfuse: error: {message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tflfuse",
        description="Fused, quantized, target-aware TensorFlow Lite models for edge devices.",
    )
    parser.add_argument("--version", action="version", version=f"tflfuse {__version__}")
    verbose_help = "also show what TensorFlow, the converter and the interpreter print"
    parser.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in ADDERS:
        add(sub)
    for command in sub.choices.values():  # `tflfuse convert ... -v` works too
        command.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help
        )
    return parser


# Commands whose native code (the interpreter; TFLite's GPU analyzer) runs in a child process,
# so that a crash there is one line (tflfuse.isolation); convert isolates its own stages.
_ISOLATED = {
    "optimize": "the optimize command (the interpreter, verifying)",
    "bench": "the bench command (the interpreter)",
    "compare": "the compare command (the interpreter)",
    "check": "the check command",
}
BROKEN_PIPE = 128 + int(getattr(signal, "SIGPIPE", 13))  # what a shell shows for `... | head -1`


def _os_error_text(exc: OSError) -> str:
    """An OSError from the user's environment (a name too long, a full disk) as one line."""
    if exc.filename is not None:
        return f"{shown(exc.filename)}: {exc.strerror or exc}"
    return exc.strerror or str(exc)


def _run_command(args: argparse.Namespace) -> int:
    """The command. A reader that closes stdout early (`| head -1`) ends it quietly, as it ends
    any Unix tool; an OSError becomes one line."""
    try:
        command = importlib.import_module(f"tflfuse.cli.{args.command}")  # loads what it needs
        return command.run(args)
    except BrokenPipeError:
        return BROKEN_PIPE
    except OSError as exc:
        raise TflfuseError(_os_error_text(exc)) from None


def _dispatch(args: argparse.Namespace) -> int:
    what = _ISOLATED.get(args.command)
    if what is None:
        return _run_command(args)
    from tflfuse import isolation  # (ctypes, pickle: not for --help nor the commands run here)

    def work() -> int:
        isolation.stage(what)
        return _run_command(args)

    subject = (
        getattr(args, "model", None)
        or getattr(args, "folder", None)
        or ", ".join(getattr(args, "models", []))
    )
    try:
        return isolation.run(work, what=subject)
    except BrokenPipeError:  # the child's output, written here, found the reader gone
        return BROKEN_PIPE


def _stdout_gone() -> None:
    """After a broken pipe: stdout to /dev/null, so the final flush at exit raises nothing."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _stdout_closed() -> bool:
    """`tflfuse ... >&-`: Python then has no sys.stdout, and fd 1 is free for the next file
    opened (C++ code writing to fd 1 would write into it)."""
    if sys.stdout is None:
        return True
    try:
        os.fstat(1)
    except OSError:
        return True
    return False


def _json_value_is_positional(value: str) -> bool:
    """`--json [OUT]` takes the word after it; an existing folder or .tflite file is the
    command's operand (`compare --json OUT_DIR`, `bench --json m.tflite`), never where JSON
    goes."""
    try:
        return os.path.isdir(value) or (value.lower().endswith(".tflite") and os.path.isfile(value))
    except (OSError, ValueError):  # (a NUL in the name: the command says so)
        return False


def _unswallowed(argv: list[str]) -> list[str]:
    """argv with `--json X` read as `--json` (stdout) and X where X is an operand."""
    out = list(argv)
    command = next((w for w in out if not w.startswith("-")), None)
    if command not in JSON_TAKES_A_PATH:
        return out
    for i, word in enumerate(out[:-1]):
        if word == "--":
            break
        follows = out[i + 1]
        if word == "--json" and not follows.startswith("-") and _json_value_is_positional(follows):
            out[i] = "--json=-"
    return out


def main(argv: list[str] | None = None) -> int:
    if _stdout_closed():
        if sys.stderr is not None:
            print(
                "tflfuse: error: standard output is closed (send it to /dev/null instead)",
                file=sys.stderr,
            )
        return 2
    argv = _unswallowed(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    log = None
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(signals_raise())  # SIGTERM/SIGHUP unwind: temp files removed
            if not args.verbose:  # library chatter goes to a temp file (tflfuse.quiet)
                log = stack.enter_context(quiet.captured())
            code = _dispatch(args)
    except TflfuseError as exc:
        from tflfuse.isolation import NativeCrashError  # (loaded already when it is one)

        hint = " (-v shows what it printed)" if isinstance(exc, NativeCrashError) else ""
        _end_progress_line()
        print(f"tflfuse: error: {exc}{hint if not args.verbose else ''}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # outside a command's own work (e.g. a fork refused)
        print(f"tflfuse: error: {_os_error_text(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _end_progress_line()
        print("tflfuse: interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"tflfuse: terminated by signal {exc.signum}", file=sys.stderr)
        return 128 + exc.signum
    except Exception:  # a bug: what the libraries said may explain it, so show it first
        if log is not None and log.text():
            sys.stderr.write("tflfuse: library output before the failure:\n" + log.text())
        raise
    if code == BROKEN_PIPE:
        _stdout_gone()
    return code


def _end_progress_line() -> None:
    """On a terminal, clear a progress bar a crashed or interrupted step left on the line."""
    with contextlib.suppress(Exception):
        if sys.stderr.isatty():
            sys.stderr.write("\r\x1b[K")
