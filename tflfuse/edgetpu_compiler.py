"""Drive Coral's `edgetpu_compiler` where it is installed, and read what it says.

The compiler is a Debian x86-64 package from Coral's own repository (there is no arm64 build:
google-coral/edgetpu#311, #702), so on most machines `tflfuse check --target edgetpu` (the
prediction) is all there is. Where it is installed, `compile_model` runs it with `-s` (show the
operations), keeps its console output next to the `.log` it writes, and parses both into the
same per-op structure as the prediction, so the two can be printed side by side.

Log format (compiler 15/16; the `.log` file repeats the header lines `Input:` / `Output:` and the
table): a header of `Key: value` lines (version, input/output model and sizes, on-chip and
off-chip memory, number of Edge TPU subgraphs, total ops, ops on the Edge TPU and on the CPU)
and a table `Operator  Count  Status` whose statuses are listed in `delegates/edgetpu.toml`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tflfuse import flatbuffer
from tflfuse.errors import TflfuseError
from tflfuse.files import atomic_write_text
from tflfuse.targets import OpPrediction, Prediction, capability, op_label, predict

COMPILER = "edgetpu_compiler"
CUSTOM_OP = "edgetpu-custom-op"
NOT_INSTALLED = (
    "edgetpu_compiler is not installed: it comes from Coral's package repository"
    " (packages.cloud.google.com/apt, Debian/Ubuntu x86-64 only: apt-get install edgetpu-compiler);"
    " `tflfuse check MODEL --target edgetpu` gives the predicted mapping"
)

_HEADER_KEYS = {
    "edge tpu compiler version": "version",
    "input model": "input_model",
    "input": "input_model",
    "input size": "input_size",
    "output model": "output_model",
    "output": "output_model",
    "output size": "output_size",
    "on-chip memory used for caching model parameters": "on_chip_memory",
    "on-chip memory remaining for caching model parameters": "on_chip_remaining",
    "off-chip memory used for streaming uncached model parameters": "off_chip_memory",
    "number of edge tpu subgraphs": "edgetpu_subgraphs",
    "total number of operations": "total_ops",
    "number of operations that will run on edge tpu": "ops_on_edgetpu",
    "number of operations that will run on cpu": "ops_on_cpu",
    "operation log": "operation_log",
}
_INT_KEYS = {"edgetpu_subgraphs", "total_ops", "ops_on_edgetpu", "ops_on_cpu"}
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_ROW = re.compile(r"^(\S+)\s+(\d+)\s+(\S.*?)\s*$")
_TABLE_HEADER = re.compile(r"^Operator\s+Count\s+Status\s*$")


def memory_bytes(text: str) -> int | None:
    """'6.25MiB' -> bytes (the compiler prints B, KiB, MiB)."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMG]?i?B)\s*", text)
    if not m or m.group(2) not in _UNITS:
        return None
    return round(float(m.group(1)) * _UNITS[m.group(2)])


@dataclass
class CompilerLog:
    """What one `edgetpu_compiler -s` run printed: header fields and the status table."""

    header: dict[str, Any] = field(default_factory=dict)
    rows: list[tuple[str, int, str]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    @property
    def mapped(self) -> int:
        return sum(n for _, n, status in self.rows if status == _status("mapped"))

    @property
    def cpu(self) -> int:
        return sum(n for _, n, status in self.rows if status != _status("mapped"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "header": dict(self.header),
            "table": [{"op": op, "count": n, "status": s} for op, n, s in self.rows],
            "mapped": self.mapped,
            "cpu": self.cpu,
            "messages": list(self.messages),
        }


def _status(key: str) -> str:
    return capability("edgetpu")["status"][key]


def parse_log(text: str) -> CompilerLog:
    """Parse the compiler's console output or its `.log` file (unknown lines kept as messages)."""
    log = CompilerLog()
    in_table = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if _TABLE_HEADER.match(line):
            in_table = True
            continue
        if in_table:
            m = _ROW.match(line)
            if m:
                log.rows.append((m.group(1), int(m.group(2)), m.group(3)))
                continue
            in_table = False
        version = re.match(r"^Edge TPU Compiler version\s+(\S+)", line)
        if version:
            log.header["version"] = version.group(1)
            continue
        key, sep, value = line.partition(":")
        name = _HEADER_KEYS.get(key.strip().lower()) if sep else None
        if name is None:
            log.messages.append(line)
            continue
        value = value.strip()
        if name in _INT_KEYS:
            log.header[name] = int(value)
        elif name.endswith(("_memory", "_remaining", "_size")):
            log.header[name] = value
            parsed = memory_bytes(value)
            if parsed is not None:
                log.header[f"{name}_bytes"] = parsed
        else:
            log.header[name] = value
    known = set(capability("edgetpu")["status"].values())
    unknown = sorted({s for _, _, s in log.rows} - known)
    if unknown:
        log.messages.append(f"unknown status in the table: {unknown[0]!r}")
    return log


def actual_placement(cpu_model: Path, compiled_model: Path, log: CompilerLog) -> Prediction:
    """Per-op placement the compiler chose: ops of the CPU model that reappear outside the
    `edgetpu-custom-op` of the compiled model ran on the CPU (matched by output tensor names);
    their status comes from the log's table (by op type, in table order)."""
    model = flatbuffer.load(cpu_model)
    compiled = flatbuffer.load(compiled_model)
    left = {t.name for op in compiled.main.ops if op.custom_code != CUSTOM_OP for t in op.outputs}
    pending: dict[str, list[str]] = {}
    for op_name, count, status in log.rows:
        if status != _status("mapped"):
            pending.setdefault(op_name, []).extend([status] * count)
    ops = []
    for index, op in enumerate(model.main.ops):
        label = op_label(op)
        if op.outputs and all(t.name in left for t in op.outputs):
            statuses = pending.get(label) or ["On the CPU (status not in the log)"]
            status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
            ops.append(OpPrediction(index, label, "cpu", status, "left outside the compiled op"))
        else:
            ops.append(OpPrediction(index, label, "edgetpu", _status("mapped"), "compiled"))
    return Prediction("edgetpu", ops)


@dataclass
class CompileResult:
    model: Path
    outputs: list[Path]
    console: Path
    log: CompilerLog
    prediction: Prediction
    actual: Prediction | None

    def comparison(self) -> list[tuple[str, str, int, int]]:
        """(op, status, predicted count, actual count) for every row either side has."""
        keys: dict[tuple[str, str], list[int]] = {}
        for op, n, status in self.prediction.table():
            keys.setdefault((op, status), [0, 0])[0] += n
        for op, n, status in self.log.rows:
            keys.setdefault((op, status), [0, 0])[1] += n
        return [(op, status, p, a) for (op, status), (p, a) in keys.items()]

    def agrees(self) -> bool:
        if self.actual is None:
            return self.prediction.mapped == self.log.mapped
        return self.prediction.cpu_ops() == self.actual.cpu_ops()

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": str(self.model),
            "outputs": [str(p) for p in self.outputs],
            "console_log": str(self.console),
            "compiler": self.log.to_dict(),
            "prediction": self.prediction.to_dict(),
            "actual": None if self.actual is None else self.actual.to_dict(),
            "agrees": self.agrees(),
        }


def find_compiler() -> str:
    path = shutil.which(COMPILER)
    if path is None:
        raise TflfuseError(NOT_INSTALLED)
    return path


def compile_model(
    model: Path,
    out_dir: Path | None = None,
    *,
    num_segments: int | None = None,
    search_delegate: bool = False,
    timeout: int = 600,
) -> CompileResult:
    """Run `edgetpu_compiler -s` on `model`, keep its output, parse it, predict alongside."""
    compiler = find_compiler()
    model = Path(model)
    cpu = flatbuffer.load(model)  # a readable model, or a one-line ModelError
    out_dir = Path(out_dir) if out_dir is not None else model.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [compiler, "-s", "-o", str(out_dir)]
    if num_segments:
        if num_segments < 1:
            raise TflfuseError("--num-segments must be at least 1")
        command += ["-n", str(num_segments)]
    if search_delegate:
        command.append("--search_delegate")
    command.append(str(model))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TflfuseError(f"edgetpu_compiler did not finish within {timeout} s") from None
    text = done.stdout + done.stderr
    console = out_dir / f"{model.stem}_edgetpu_compiler.txt"
    atomic_write_text(console, text)
    if done.returncode != 0:
        last = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "no output")
        raise TflfuseError(f"edgetpu_compiler failed (exit {done.returncode}): {last.strip()}")
    log = parse_log(text)
    outputs = sorted(out_dir.glob(f"{model.stem}*_edgetpu.tflite"))
    single = out_dir / f"{model.stem}_edgetpu.tflite"
    actual = actual_placement(model, single, log) if single in outputs else None
    return CompileResult(model, outputs, console, log, predict(cpu, "edgetpu"), actual)


def format_comparison(result: CompileResult) -> str:
    """Prediction against the compiler, in the compiler's table layout plus two count columns."""
    h = result.log.header
    lines = [
        f"{result.model}: edgetpu_compiler {h.get('version', '?')}",
        f"  output: {', '.join(str(p) for p in result.outputs) or 'none'}",
        f"  console log kept in {result.console}",
    ]
    for key in ("on_chip_memory", "off_chip_memory", "edgetpu_subgraphs"):
        if key in h:
            lines.append(f"  {key.replace('_', ' ')}: {h[key]}")
    p, log = result.prediction, result.log
    mem = p.memory.get("parameter_bytes")
    if mem is not None:
        lines.append(f"  predicted parameter memory: {mem / 2**20:.2f}MiB")
    lines += [
        f"  mapped to Edge TPU: predicted {p.mapped}, actual {log.mapped}",
        f"  on the CPU:         predicted {p.cpu}, actual {log.cpu}",
        "",
        f"{'Operator':<30} {'Predicted':<10} {'Actual':<10} Status",
        "",
    ]
    lines += [f"{op:<30} {a:<10} {b:<10} {s}" for op, s, a, b in result.comparison()]
    verdict = "agree" if result.agrees() else "DISAGREE"
    lines += ["", f"prediction and compiler {verdict}"]
    return "\n".join(lines)
