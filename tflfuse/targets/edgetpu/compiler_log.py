"""The `edgetpu_compiler -s` log: its header (versions, memory, subgraphs, op counts) and
its `Operator  Count  Status` table, read into a `CompilerLog`. Used by the compiler
wrapper and by the truth reader (compiled twins); no TensorFlow, no compiler needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tflfuse.json_types import JSONDict
from tflfuse.targets.capabilities import capability

CUSTOM_OP = "edgetpu-custom-op"


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
# How the compiler words a refusal of the whole model (google-coral/edgetpu issues: gh34, gh340,
# gh879 parse; gh168, gh313 not quantized; gh439-gh686 large activations; gh49, gh100, gh211).
FAILURE_LINES = (  # the most telling first
    "Compilation failed:",
    "ERROR: Didn't find op for builtin opcode",
    "Model not quantized",
    "Internal compiler error",
    "Model could not be parsed",
    "Invalid model",
    "Compilation failed",
)
_SEARCH_TRY = re.compile(r"^Try to compile segment with (\d+) ops")
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
    def failure(self) -> str | None:
        """The compiler's refusal of the whole model (or of one try of its delegate search), as
        it printed it: its most telling line (`FAILURE_LINES`; None when it printed none)."""
        for start in FAILURE_LINES:
            found = next((m for m in self.messages if m.startswith(start)), None)
            if found:
                return found
        return None

    @property
    def search_tries(self) -> list[int]:
        """The op counts the delegate search (`-d`) tried, in order ("Try to compile segment
        with N ops"); the last one compiled when the log goes on to a model."""
        return [int(m.group(1)) for m in map(_SEARCH_TRY.match, self.messages) if m]

    @property
    def mapped(self) -> int:
        return sum(n for _, n, status in self.rows if status == _status("mapped"))

    @property
    def cpu(self) -> int:
        return sum(n for _, n, status in self.rows if status != _status("mapped"))

    def to_dict(self) -> JSONDict:
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
