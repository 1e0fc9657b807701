"""Drive Coral's `edgetpu_compiler` where it is installed, and read what it says.

The compiler is a Debian x86-64 package from Coral's own repository (there is no arm64 build:
google-coral/edgetpu#311, #702), so on most machines `tflfuse check --target edgetpu` (the
prediction) is all there is. Where it is installed, `compile_model` runs it with `-s` (show the
operations), keeps its console output next to the `.log` it writes, and parses both into the
same per-op structure as the prediction, so the two can be printed side by side. What the
compiled twin shows is read by `tflfuse.targets.edgetpu.truth.truth_of` (the one reader of compiled
models, shared with the oracle score); exactness is its `is_exact`.

Several Edge TPU subgraphs: `-a`, long form `--enable_multiple_subgraphs`, is in the compiler's
own `--help` ("Enable multiple(all) subgraphs (experimental flag)") but not in the options table
of coral.ai/docs/edgetpu/compiler; it is seen in use with 15.0.340273435 (google-coral/edgetpu
#189, #400) and 16.0.384591198 (#601). With it the table has no "More than one subgraph is not
supported" rows (#461) and the console's "Number of Edge TPU subgraphs" counts the segments.

Log format (compiler 15/16; the `.log` file repeats the header lines `Input:` / `Output:` and the
table): a header of `Key: value` lines (version, input/output model and sizes, on-chip and
off-chip memory, number of Edge TPU subgraphs, total ops, ops on the Edge TPU and on the CPU)
and a table `Operator  Count  Status` whose statuses are listed in `delegates/edgetpu.toml`.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from tflfuse.errors import TflfuseError
from tflfuse.files import atomic_write_text
from tflfuse.ir import Model, Op, flatbuffer
from tflfuse.json_types import JSONDict
from tflfuse.targets.capabilities import OpPrediction, Prediction, op_label
from tflfuse.targets.edgetpu.compiler_log import CompilerLog, _status, parse_log
from tflfuse.targets.edgetpu.modes import ModeChoice, compare_modes, why_line
from tflfuse.targets.edgetpu.predict import predict_edgetpu
from tflfuse.targets.edgetpu.truth import (
    Truth,
    is_exact,
    predicted_segments,
    status_agreement,
    truth_of,
)

COMPILER = "edgetpu_compiler"
MULTIPLE_SUBGRAPHS_FLAG = "-a"  # --enable_multiple_subgraphs (see the module docstring)
NOT_INSTALLED = (
    "edgetpu_compiler is not installed: it comes from Coral's package repository"
    " (packages.cloud.google.com/apt, Debian/Ubuntu x86-64 only: apt-get install edgetpu-compiler);"
    " `tflfuse check MODEL --target edgetpu` gives the predicted mapping"
)


def logged_label(op: Op) -> str:
    """An op's name as the compiler's status table prints it: custom ops appear as `CUSTOM`,
    whatever their custom code (compiler 14.1 and 16.0 logs of SSD post-processing models,
    e.g. tensorflow/models#10695), builtin ops by their builtin name."""
    return "CUSTOM" if op.type == "CUSTOM" else op_label(op)


def as_logged(prediction: Prediction, model: Model) -> Prediction:
    """`prediction` with each op named as the compiler's log names it (`logged_label`), so that
    its (op, status) rows can be set beside the log's table."""
    ops = [replace(o, op=logged_label(model.main.ops[o.index])) for o in prediction.ops]
    return replace(prediction, ops=ops)


def placement_from_truth(truth: Truth, log: CompilerLog) -> Prediction:
    """The compiler's placement (`edgetpu_truth.truth_of`) as a per-op `Prediction`: the ops the
    twin left outside its custom ops run on the CPU; each takes its status from the log's table
    (the rows of its op type that are not "Mapped", in table order)."""
    pending: dict[str, list[str]] = {}
    for op_name, count, status in log.rows:
        if status != _status("mapped"):
            pending.setdefault(op_name, []).extend([status] * count)
    on_cpu = set(truth.cpu_ops)
    ops = []
    for index, op in enumerate(truth.model.main.ops):
        label = op_label(op)
        if index in on_cpu:
            statuses = pending.get(logged_label(op)) or ["On the CPU (status not in the log)"]
            status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
            ops.append(OpPrediction(index, label, "cpu", status, "left outside the compiled op"))
        else:
            ops.append(OpPrediction(index, label, "edgetpu", _status("mapped"), "compiled"))
    return Prediction("edgetpu", ops, segments=truth.segments)


@dataclass
class CompileResult:
    """One compiler run: its files, its parsed log, tflfuse's prediction for the same mode, and
    (when the compiler wrote one `_edgetpu` twin, i.e. without `-n`) what the twin shows."""

    model: Path
    outputs: list[Path]
    console: Path
    log: CompilerLog
    prediction: Prediction
    truth: Truth | None
    multiple_subgraphs: bool = False
    modes: ModeChoice | None = None  # with mode "auto": every mode predicted, and the one chosen

    @property
    def actual(self) -> Prediction | None:
        return None if self.truth is None else placement_from_truth(self.truth, self.log)

    @property
    def predicted_segments(self) -> int:
        return predicted_segments(self.prediction)

    @property
    def actual_segments(self) -> int | None:
        """`edgetpu-custom-op`s in the twin, else the log's "Number of Edge TPU subgraphs"."""
        if self.truth is not None:
            return self.truth.segments
        return self.log.header.get("edgetpu_subgraphs")

    def _logged_prediction(self) -> Prediction:
        model = self.truth.model if self.truth is not None else flatbuffer.load(self.model)
        return as_logged(self.prediction, model)

    def comparison(self) -> list[tuple[str, str, int, int]]:
        """(op, status, predicted count, logged count) for every (op type, status) either side
        has, grouped by op type in the log's order, then ops only the prediction has."""
        keys: dict[tuple[str, str], list[int]] = {}
        for op, n, status in self.log.rows:
            keys.setdefault((op, status), [0, 0])[1] += n
        for op, n, status in self._logged_prediction().table():
            keys.setdefault((op, status), [0, 0])[0] += n
        order = list(dict.fromkeys(op for op, _ in keys))
        rows = [(op, status, p, a) for (op, status), (p, a) in keys.items()]
        return sorted(rows, key=lambda r: order.index(r[0]))

    def status_agreement(self) -> tuple[int, int] | None:
        """(logged ops whose predicted status the log confirms, ops the log lists), per op type
        (`edgetpu_truth.status_agreement`); None when the log has no status table."""
        if not self.log.rows:
            return None
        return status_agreement(self._logged_prediction(), self.log)

    def agrees(self) -> bool:
        """The prediction is exact (`edgetpu_truth.is_exact`: the same ops on the CPU and, with
        `multiple_subgraphs`, the same number of Edge TPU segments). Without a twin (a `-n`
        split), the mapped count must equal the log's (and the segments its subgraph count)."""
        if self.truth is not None:
            return is_exact(self.prediction, self.truth, count_segments=self.multiple_subgraphs)
        same = self.prediction.mapped == self.log.mapped
        if self.multiple_subgraphs and self.actual_segments is not None:
            same = same and self.predicted_segments == self.actual_segments
        return same

    def to_dict(self) -> JSONDict:
        actual = self.actual
        status = self.status_agreement()
        return {
            "model": str(self.model),
            "outputs": [str(p) for p in self.outputs],
            "console_log": str(self.console),
            "multiple_subgraphs": self.multiple_subgraphs,
            "compiler": self.log.to_dict(),
            "prediction": self.prediction.to_dict(),
            "actual": None if actual is None else actual.to_dict(),
            "segments": {"predicted": self.predicted_segments, "actual": self.actual_segments},
            "twin": None
            if self.truth is None
            else {
                "mode": self.truth.mode,
                "runtime_version": self.truth.runtime_version,
                "package": self.truth.memory,
            },
            "status_agreement": None if status is None else list(status),
            "agrees": self.agrees(),
            "mode_choice": None if self.modes is None else self.modes.to_dict(),
        }


def find_compiler() -> str:
    path = shutil.which(COMPILER)
    if path is None:
        raise TflfuseError(NOT_INSTALLED)
    return path


MODES = ("single", "multi", "auto")


def choose_mode(
    model: Model, mode: str, num_segments: int | None = None
) -> tuple[bool, int | None, ModeChoice | None]:
    """(multiple subgraphs, number of segments, the modes compared) for `--mode`: "single" (the
    compiler's default), "multi" (`-a`) or "auto", the mode `modes.compare_modes` predicts
    best, as `check` names it (`modes.rank_key`: the most ops mapped, then the fewest CPU <->
    Edge TPU crossings and bytes crossing, then no more Edge TPUs than `num_segments` (the
    user's `--num-segments`; one without it), then the fewest parameter bytes streamed)."""
    if mode not in MODES:
        raise TflfuseError(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    if mode != "auto":
        return mode == "multi", None, None
    choice = compare_modes(model, None, num_segments)
    chosen = choice.chosen
    pieces = int(chosen.flags[1]) if chosen.mode == "pipelined" else None
    return chosen.mode == "multi", pieces, choice


def compile_model(
    model: Path,
    out_dir: Path | None = None,
    *,
    num_segments: int | None = None,
    search_delegate: bool = False,
    multiple_subgraphs: bool = False,
    mode: str | None = None,
    timeout: int = 600,
) -> CompileResult:
    """Run `edgetpu_compiler -s` on `model`, keep its output, parse it, predict alongside.

    `multiple_subgraphs` passes `-a` (`--enable_multiple_subgraphs`, the compiler's experimental
    mode that lets it build several Edge TPU segments) and predicts that mode; `mode` ("single",
    "multi", "auto": `choose_mode`) sets it instead. The prediction uses the compiler version
    the log names."""
    model = Path(model)
    cpu = flatbuffer.load(model)  # a readable model, or a one-line ModelError (before the compiler)
    if num_segments is not None and num_segments < 1:
        raise TflfuseError("--num-segments must be at least 1")
    choice = None
    if mode is not None:
        if multiple_subgraphs and mode != "multi":
            raise TflfuseError(f"--multiple-subgraphs is --mode multi, not --mode {mode}")
        multiple_subgraphs, pieces, choice = choose_mode(cpu, mode, num_segments)
        num_segments = num_segments or pieces
    compiler = find_compiler()
    out_dir = Path(out_dir) if out_dir is not None else model.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [compiler, "-s", "-o", str(out_dir)]
    if num_segments:
        command += ["-n", str(num_segments)]
    if multiple_subgraphs:
        command.append(MULTIPLE_SUBGRAPHS_FLAG)
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
        why = parse_log(text).failure or last.strip()
        raise TflfuseError(f"edgetpu_compiler failed (exit {done.returncode}): {why}")
    log = parse_log(text)
    outputs = sorted(out_dir.glob(f"{model.stem}*_edgetpu.tflite"))
    single = out_dir / f"{model.stem}_edgetpu.tflite"
    truth = truth_of(cpu, flatbuffer.load(single), log) if single in outputs else None
    prediction = predict_edgetpu(
        cpu, log.header.get("version"), multiple_subgraphs=multiple_subgraphs
    )
    return CompileResult(
        model, outputs, console, log, prediction, truth, multiple_subgraphs, choice
    )


def format_comparison(result: CompileResult) -> str:
    """Prediction against the compiler: totals, segments, then per op type the predicted and the
    logged count of each status (the compiler's table layout plus two count columns; `*` marks
    a status whose counts differ)."""
    h = result.log.header
    mode = " -a (several Edge TPU subgraphs allowed)" if result.multiple_subgraphs else ""
    lines = [
        f"{result.model}: edgetpu_compiler {h.get('version', '?')}{mode}",
        f"  output: {', '.join(str(p) for p in result.outputs) or 'none'}",
        f"  console log kept in {result.console}",
    ]
    if result.modes is not None:
        chosen = result.modes.chosen
        lines.append(
            f"  --mode auto chose {chosen.mode}: {chosen.command(result.model.name)}"
            f" ({chosen.mapped}/{chosen.total} predicted mapped,"
            f" {chosen.crossings.count} CPU<->Edge TPU crossings,"
            f" {chosen.memory.streamed_bytes:,} B of parameters streamed per inference)"
        )
        lines.append(f"  why: {why_line(result.modes)}")
    for key in ("on_chip_memory", "off_chip_memory"):
        if key in h:
            lines.append(f"  {key.replace('_', ' ')}: {h[key]}")
    if result.truth is not None:  # what the twin itself says about its compile
        lines.append(
            f"  compiled twin: {result.truth.mode}, {result.truth.segments} edgetpu-custom-op,"
            f" needs Edge TPU runtime {result.truth.runtime_version}"
        )
    p, log = result.prediction, result.log
    mem = p.memory
    if mem:
        lines.append(
            f"  parameter memory: predicted {mem['on_chip_bytes']:,} B cached,"
            f" {mem['off_chip_bytes']:,} B streamed"
        )
    package = result.truth.memory if result.truth is not None else None
    if package:
        lines.append(
            f"  parameter memory in the compiled package: {package['on_chip_bytes']:,} B cached,"
            f" {package['off_chip_bytes']:,} B streamed"
        )
    lines += [
        f"  mapped to Edge TPU: predicted {p.mapped}, actual {log.mapped}",
        f"  on the CPU:         predicted {p.cpu}, actual {log.cpu}",
        f"  Edge TPU segments:  predicted {result.predicted_segments},"
        f" actual {'?' if result.actual_segments is None else result.actual_segments}",
    ]
    status = result.status_agreement()
    if status is None:
        lines += ["", "the compiler printed no per-op status table"]
    else:
        lines += [
            f"  statuses: {status[0]} of {status[1]} logged ops have the predicted status",
            "",
            f"  {'Operator':<30} {'Predicted':<10} {'Logged':<10} Status",
            "",
        ]
        for op, s, a, b in result.comparison():
            mark = "*" if a != b else " "
            lines.append(f"{mark} {op:<30} {a:<10} {b:<10} {s}")
    verdict = "agree" if result.agrees() else "DISAGREE"
    lines += ["", f"prediction and compiler {verdict}"]
    return "\n".join(lines)
