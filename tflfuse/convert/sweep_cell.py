"""One cell of a sweep: one `tflfuse convert` in a process of its own, measured, on any node.

A cell is handed the bytes of its model, its calibration data and (for a .toml) its recipe, not
paths: the node that runs it may share no filesystem with the machine that planned the sweep.
It writes them into a fresh temp folder, runs the CLI there (`python -m tflfuse.cli convert
... --json`: the same code path and isolation as `tflfuse convert`), in its own process group
with a timeout, and hands back the row (exit, the one line a refusal or crash printed, op counts,
Edge TPU mapping, error, wall time, peak RSS of the conversion and its children from wait4) and
the bytes of the files the conversion wrote. The conversion's process ends with the cell, so
TensorFlow's memory goes with it whatever engine runs the cells: one conversion per process. It
dies with the process that runs the cell (PR_SET_PDEATHSIG): a killed worker leaves no orphan.
With `bench_runs`, the stock and fused models are then timed (`tflfuse bench`, interleaved,
XNNPACK, one thread) for the p50 ratio fused / stock.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from tflfuse.json_types import JSONDict

if TYPE_CHECKING:
    from tflfuse.convert.records import Report

# The CLI, run as a child that dies with its parent (Linux; elsewhere just the CLI).
_LAUNCH = (
    "import ctypes, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "except Exception:\n"
    "    pass\n"
    "import runpy\n"
    "sys.argv[0] = 'tflfuse'\n"
    "runpy.run_module('tflfuse.cli', run_name='__main__', alter_sys=True)\n"
)
_PREFIX = "tflfuse-cell-"  # + the pid of the process running the cell + a random part
_MARKER = ".tflfuse-sweep-cell"  # written first in every cell folder: only those are removed
_running: set[int] = set()  # process groups of the CLI children running now (stop_all)
_lock = threading.Lock()
_SIGNALS = {9: "SIGKILL (out of memory?)", 6: "SIGABRT", 11: "SIGSEGV", 15: "SIGTERM"}


@dataclass(frozen=True)
class Payload:
    """A file or a folder (a SavedModel, a folder of calibration images) as bytes: `name` is
    its file name (the suffix tells tflfuse what it is), `files` (relative path, bytes) pairs,
    one with path "" for a single file."""

    name: str
    files: tuple[tuple[str, bytes], ...]

    @classmethod
    def read(cls, path: Path) -> Payload:
        if path.is_dir():
            files = tuple(
                (p.relative_to(path).as_posix(), p.read_bytes())
                for p in sorted(path.rglob("*"))
                if p.is_file()
            )
            return cls(path.name, files)
        return cls(path.name, (("", path.read_bytes()),))

    def digest(self) -> str:
        h = hashlib.sha256()
        for rel, data in self.files:
            h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
        return h.hexdigest()

    @property
    def size(self) -> int:
        return sum(len(data) for _, data in self.files)

    def write(self, folder: Path) -> Path:
        """Write it into `folder`; returns the path of the file or folder."""
        target = folder / self.name
        for rel, data in self.files:
            path = target / rel if rel else target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return target


@dataclass(frozen=True)
class CellSpec:
    """What one cell converts and how: the names it is reported under, the recipe (a shipped
    name, or the .toml's file name when `recipe_file` is sent), the convert flags its options
    give, and its limits."""

    name: str  # MODEL.RECIPE[.OPTIONS]: its folder under DIR/cells
    model: str
    recipe: str
    options: dict[str, Any]
    flags: tuple[str, ...]
    key: str  # the hash of its inputs (tflfuse.convert.sweep_plan.cell_key)
    payload: str = ""  # which of the plan's model inputs it converts (a model, at a size)
    timeout_s: float = 1800.0
    bench_runs: int = 0
    memory_mib: float | None = None  # a scheduler's memory request (from a measured peak)


@dataclass
class CellResult:
    """A cell's row (see tflfuse.convert.sweep.ROW_FIELDS) and the files its conversion wrote."""

    row: SweepRow
    files: dict[str, bytes] = field(default_factory=dict)


class Measurements(TypedDict):
    """A cell's numbers read from its report.json (`measurements`)."""

    # (typed as the row's keys, which it updates)
    ops: dict[str, int | None] | None  # unfused, stock, fused
    edgetpu_mapped: dict[str, int | None] | None  # stock, fused (Edge TPU targets only)
    edgetpu_ops: dict[str, int | None] | None
    max_error: dict[str, float | None] | None  # stock, fused against the float source


class SweepRow(TypedDict, total=False):
    """A cell's row (`empty_row` has every key a row always has, in order): the cell, how its
    `tflfuse convert` ended, its measurements, where and how long it ran."""

    model: str
    recipe: str
    options: dict[str, Any]  # the plan's option values (TOML as read)
    cell: str
    status: str  # converted, refused, crash, timeout, lost
    exit: int | None
    line: str  # the one line that says why
    ops: dict[str, int | None] | None
    edgetpu_mapped: dict[str, int | None] | None
    edgetpu_ops: dict[str, int | None] | None
    max_error: dict[str, float | None] | None
    p50_ratio: float | None
    bench: JSONDict
    seconds: float | None
    peak_rss_mib: float | None
    cpu_s: float
    lines_printed: int
    left_behind: list[str]
    node: str | None
    turnaround_s: float | None
    reused: bool
    key: str


class ProcessRun(TypedDict):
    """What `run_process` measured of one finished process."""

    exit: int  # negative: killed by that signal
    timed_out: bool
    seconds: float  # wall time
    peak_rss_mib: float  # of it and its waited-for children
    cpu_s: float  # user + system
    stdout: str
    stderr: str


def empty_row(spec: CellSpec) -> SweepRow:
    return {
        "model": spec.model,
        "recipe": spec.recipe,
        "options": dict(spec.options),
        "cell": spec.name,
        "status": "lost",
        "exit": None,
        "line": "",
        "ops": None,
        "edgetpu_mapped": None,
        "max_error": None,
        "p50_ratio": None,
        "seconds": None,
        "peak_rss_mib": None,
        "node": socket.gethostname(),
        "turnaround_s": None,
        "reused": False,
        "key": spec.key,
    }


def lost(spec: CellSpec, line: str) -> CellResult:
    """The row of a cell that did not come back (its worker or node died, the engine failed
    it): its one line; where it ran is not known."""
    row = empty_row(spec)
    row["status"], row["line"], row["node"] = "lost", line[:400], None
    return CellResult(row)


def _tflfuse_env() -> dict[str, str]:
    """The environment of the CLI child: this process's tflfuse first on its path."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding this tflfuse
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "3"}


def run_limited(argv: list[str], cwd: Path, timeout: float) -> ProcessRun:
    """`python -c LAUNCH *argv` (the tflfuse CLI): `run_process` with this tflfuse importable."""
    return run_process([sys.executable, "-c", _LAUNCH, *argv], cwd, timeout, _tflfuse_env())


def run_process(
    cmd: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> ProcessRun:
    """`cmd` in its own process group, killed with its children after `timeout` s: exit code
    (negative: the signal), stdout, stderr, wall time and the peak RSS of it and its waited-for
    children (wait4). Its output goes through cwd/.stdout and cwd/.stderr, removed after."""
    t0 = time.perf_counter()
    out_path, err_path = cwd / ".stdout", cwd / ".stderr"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        with _lock:
            _running.add(proc.pid)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
            with _lock:
                _running.discard(proc.pid)
    result: ProcessRun = {
        "exit": os.waitstatus_to_exitcode(status),
        "timed_out": timed_out.is_set(),
        "seconds": time.perf_counter() - t0,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "stdout": out_path.read_text(errors="replace"),
        "stderr": err_path.read_text(errors="replace"),
    }
    out_path.unlink()
    err_path.unlink()
    return result


def stop_all() -> None:
    """Kill every CLI child this process is running (an interrupted sweep: no cell goes on)."""
    with _lock:
        groups = list(_running)
    for pid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def printed_lines(text: str) -> list[str]:
    """What a user sees on stderr: progress bars resolved to their last state and dropped."""
    lines = []
    for raw in text.splitlines():
        shown = raw.split("\r")[-1].strip()
        if shown and not re.match(r"^[\w :-]+?:*\s*\d+%\|", shown):
            lines.append(shown)
    return lines


def judge(run: ProcessRun, timeout: float) -> tuple[str, str]:
    """(status, the one line that says why) of a finished CLI process: converted, refused
    (tflfuse's own error line), crash (a signal or a traceback) or timeout."""
    if run["timed_out"]:
        return "timeout", f"timed out after {timeout:g} s"
    code, lines = run["exit"], printed_lines(run["stderr"])
    if code == 0:
        return "converted", ""
    errors = [ln for ln in lines if ln.startswith("tflfuse: ")]
    if code < 0:
        said = f" after: {lines[-1]}" if lines else ", nothing printed"
        return "crash", f"killed by {_SIGNALS.get(-code, f'signal {-code}')}{said}"[:400]
    if any(ln.startswith("Traceback") for ln in lines):
        return "crash", f"exit {code}, traceback: {lines[-1]}"[:400]
    line = (errors[-1] if errors else (lines[-1] if lines else f"exit {code}"))[:400]
    # native code that died in tflfuse's isolated child: said in one line, but a crash
    return ("crash" if "crashed in native code" in line else "refused"), line


def measurements(report: Report) -> Measurements:
    """The row's numbers from a report.json: op counts, Edge TPU mapping (Edge TPU targets
    only), the max abs error of stock and fused against the float source."""
    models, agreement = report.get("models") or {}, report.get("agreement") or {}
    edgetpu = report.get("edgetpu") or {}
    mapped = {k: (edgetpu.get(k) or {}).get("mapped") for k in ("stock", "fused")}
    return {
        "ops": {k: (models.get(k) or {}).get("op_count") for k in ("unfused", "stock", "fused")},
        "edgetpu_mapped": mapped if edgetpu else None,
        "edgetpu_ops": {k: (edgetpu.get(k) or {}).get("ops") for k in mapped} if edgetpu else None,
        "max_error": {k: (agreement.get(k) or {}).get("max_abs") for k in ("stock", "fused")},
    }


def remove_stale() -> None:
    """Remove the cell folders of processes that are gone (a killed worker cannot clean up):
    only folders holding the marker a cell writes first, whatever else matches the name."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*-*"):
        pid = folder.name[len(_PREFIX) :].split("-")[0]
        if not pid.isdigit() or not (folder / _MARKER).is_file():
            continue  # a folder no cell made: not ours to remove
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass  # alive, another user's


def run_cell(
    spec: CellSpec, model: Payload, calib: Payload | None, recipe_file: Payload | None = None
) -> CellResult:
    """Convert one cell in a fresh temp folder of this node; see the module docstring."""
    row = empty_row(spec)
    remove_stale()
    with tempfile.TemporaryDirectory(prefix=f"{_PREFIX}{os.getpid()}-") as tmp:
        folder = Path(tmp)
        (folder / _MARKER).touch()
        inputs = folder / "in"
        inputs.mkdir()
        argv = ["convert", str(model.write(inputs)), "-o", "out", "--json"]
        argv += ["--recipe", str(recipe_file.write(inputs)) if recipe_file else spec.recipe]
        if calib is not None:
            argv += ["--calib", str(calib.write(inputs))]
        run = run_limited([*argv, *spec.flags], folder, spec.timeout_s)
        status, line = judge(run, spec.timeout_s)
        line = line.replace(f"{inputs}{os.sep}", "")  # the node's temp folder says nothing
        row["status"], row["line"] = status, line
        row["exit"] = None if run["timed_out"] else run["exit"]
        row["seconds"] = round(run["seconds"], 2)
        row["peak_rss_mib"] = round(run["peak_rss_mib"], 1)
        row["cpu_s"] = round(run["cpu_s"], 2)
        row["lines_printed"] = len(printed_lines(run["stderr"]))
        files: dict[str, bytes] = {}
        out = folder / "out"
        if status != "converted":  # a failed convert leaves nothing: what it did leave
            row["left_behind"] = sorted(
                p.name for p in folder.iterdir() if p.name not in ("in", _MARKER)
            )
        if status == "converted":
            try:
                row.update(measurements(json.loads(run["stdout"])))
            except ValueError:
                row["status"], row["line"] = "crash", "exit 0 but no JSON report printed"
            files = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}
            if spec.bench_runs and row["status"] == "converted":
                row["p50_ratio"], row["bench"] = _bench(folder, spec)
    return CellResult(row, files)


def _bench(folder: Path, spec: CellSpec) -> tuple[float | None, dict[str, Any]]:
    """p50 fused / stock, timed interleaved on XNNPACK with one thread."""
    argv = ["bench", "out/model_stock.tflite", "out/model.tflite", "--runs", str(spec.bench_runs)]
    argv += ["--warmup", "5", "--threads", "1", "--delegate", "xnnpack", "--json", "bench.json"]
    run = run_limited(argv, folder, spec.timeout_s)
    if run["exit"] != 0 or not (folder / "bench.json").exists():
        return None, {"line": judge(run, spec.timeout_s)[1]}
    data = json.loads((folder / "bench.json").read_text())
    stock, fused = (m["latency_ms"]["p50"] for m in data["models"])
    ratio = fused / stock if stock else None
    load = round(os.getloadavg()[0], 1)  # others' work on this node meanwhile
    return ratio, {"stock_p50_ms": stock, "fused_p50_ms": fused, "load_average": load}
