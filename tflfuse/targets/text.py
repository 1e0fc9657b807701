"""The text of `tflfuse check`: a prediction in the Edge TPU compiler's own layout.

The header names the target by its label in the registry; the table is the compiler's
`Operator  Count  Status` (so a prediction and a real `edgetpu_compiler -s` log read alike).
"""

from __future__ import annotations

from tflfuse.targets.capabilities import Prediction
from tflfuse.targets.edgetpu.memory import undecided_line
from tflfuse.targets.registry import target


def format_table(rows: list[tuple[str, int, str]]) -> list[str]:
    """Rows in the compiler's `Operator  Count  Status` layout."""
    lines = [f"{'Operator':<30} {'Count':<10} Status", ""]
    lines += [f"{op:<30} {count:<10} {status}" for op, count, status in rows]
    return lines


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}MiB" if n >= 2**20 else f"{n / 2**10:.2f}KiB"


def format_prediction(prediction: Prediction, model_name: str) -> str:
    """The text report of `tflfuse check`: header, status table, then each CPU op and why."""
    accel = target(prediction.target_name).label
    lines = [f"{model_name}: predicted placement on {accel}"]
    if prediction.compiler_version is not None:
        lines[0] += f" (edgetpu_compiler {prediction.compiler_version}, {prediction.mode})"
    mem = prediction.memory
    if mem:
        lines += [
            f"Estimated parameters of mapped ops: {_mib(mem['parameter_bytes'])}",
            f"On-chip memory used for caching model parameters: {_mib(mem['on_chip_bytes'])}"
            f" of {_mib(mem['cache_bytes'])}",
            f"Off-chip memory used for streaming uncached model parameters:"
            f" {_mib(mem['off_chip_bytes'])}",
        ]
        undecided = undecided_line(mem)
        if undecided:
            lines.append(undecided)
    if prediction.segments is not None:
        lines.append(f"Number of Edge TPU subgraphs: {prediction.segments}")
    lines += [
        f"Total number of operations: {len(prediction.ops)}",
        f"Number of operations that will run on {accel}: {prediction.mapped}"
        + "".join(
            f" (or {r.mapped} on the other reading of {r.where}: undecided by the evidence,"
            " see the note)"
            for r in prediction.other_readings
        ),
        f"Number of operations that will run on CPU: {prediction.cpu}",
        "",
        *format_table(prediction.table()),
    ]
    cpu = [o for o in prediction.ops if o.runs_on == "cpu"]
    if cpu:
        lines += ["", "On the CPU, and why:"]
        lines += [f"  #{o.index:<4} {o.op:<24} {o.reason}" for o in cpu]
    lines += [f"note: {n}" for n in prediction.notes]
    return "\n".join(lines)
