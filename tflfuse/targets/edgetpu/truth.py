"""What the real `edgetpu_compiler` did to a model, read from a compiled pair on disk.

A *pair* is a quantized CPU model `X.tflite` beside its compiled twin `X_edgetpu.tflite` (and,
when the compiler was run with `-s`, its operation log `X_edgetpu.log`). The compiler replaces
the ops it maps by one `edgetpu-custom-op` per Edge TPU segment and copies every other op
unchanged, output tensor names included; so the ops of the CPU model whose outputs reappear
outside the custom ops of the twin are the ones that ran on the CPU. This is the ground truth the
mapping predictor (`tflfuse.targets.edgetpu.predict.predict_edgetpu`) is measured against
(`benchmarks/edgetpu_oracle_score.py`, `tests/test_edgetpu_oracle.py`).

No TensorFlow here; the log is read by `tflfuse.targets.edgetpu.compiler_log.parse_log`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from struct import error as struct_error
from typing import Any

from flatbuffers import encode
from flatbuffers import number_types as fb_types
from flatbuffers.table import Table

from tflfuse.ir import Model, Op, flatbuffer
from tflfuse.json_types import JSONDict
from tflfuse.targets.capabilities import OpPrediction, Prediction, capability, op_label
from tflfuse.targets.edgetpu.compiler_log import CUSTOM_OP, CompilerLog, parse_log
from tflfuse.targets.edgetpu.memory import predicted_memory, undecided_counts, undecided_line
from tflfuse.targets.edgetpu.package import PackageMemory, package_memory
from tflfuse.targets.edgetpu.predict import compiler_version_key, predict_edgetpu

COMPILED_SUFFIX = "_edgetpu"


@dataclass
class Pair:
    """One CPU model and its compiled twin, found under `root` (the set's folder)."""

    root: Path
    cpu: Path
    compiled: Path
    log: Path | None
    all_dev: bool = False  # the 5 original pairs: all dev (the first predictor was built on them)

    @property
    def key(self) -> str:
        """The CPU model's path relative to its set's folder (stable across machines)."""
        return self.cpu.relative_to(self.root).as_posix()

    @property
    def half(self) -> str:
        """ "dev" or "holdout": a fixed hash of `key`, decided before any rule was written."""
        if self.all_dev:
            return "dev"
        return "dev" if hashlib.sha256(self.key.encode()).digest()[0] % 2 == 0 else "holdout"


def find_pairs(root: Path, *, all_dev: bool = False) -> list[Pair]:
    """Every `X.tflite` under `root` whose twin `X_edgetpu.tflite` sits beside it, sorted.

    `all_dev` puts every pair in the dev half (the original 5-pair set)."""
    pairs = []
    for compiled in sorted(Path(root).rglob(f"*{COMPILED_SUFFIX}.tflite")):
        stem = compiled.name[: -len(f"{COMPILED_SUFFIX}.tflite")]
        cpu = compiled.with_name(f"{stem}.tflite")
        if not cpu.is_file():
            continue
        log = compiled.with_suffix(".log")
        pairs.append(Pair(Path(root), cpu, compiled, log if log.is_file() else None, all_dev))
    return pairs


# -- what the twin says about its compiler -------------------------------------------------------
# The custom op's options hold a DarwiNN `Package` flatbuffer (file identifier "DWN1"; schema:
# google-coral/libedgetpu executable/executable.fbs) whose field 0 is `min_runtime_version`, the
# oldest Edge TPU runtime the compiled model runs on. On the twins whose compiler log survives,
# compiler 16.0 wrote 14 (124 of 124 logs) and 15.0 wrote 12 (4 of 4); 1.0 and 2.0 wrote 10 or
# 12. A twin needing runtime 14 was therefore made by compiler 16 or later. Less does not tell
# 15.0 from a newer compiler asked for an older runtime: Coral's own twins of 2021 (MoveNet, the
# LSTM example) need runtime 12 yet map what only 16 maps. So the runtime is reported, and the
# compiler version comes from the log alone.
_PACKAGE_ID = b"DWN1"


def package_runtime_version(custom_options: bytes) -> int | None:
    """`min_runtime_version` of the DarwiNN package in an edgetpu-custom-op's options, or None
    when the options hold no readable package (compilers 1.x/2.0 wrote an older layout)."""
    at = custom_options.find(_PACKAGE_ID)
    if at < 4:
        return None
    buf = bytearray(custom_options[at - 4 :])
    try:
        table = Table(buf, encode.Get(fb_types.UOffsetTFlags.packer_type, buf, 0))
        slot = table.Offset(4)  # vtable entry of field 0
        return int(table.Get(fb_types.Int32Flags, slot + table.Pos)) if slot else None
    except (IndexError, ValueError, struct_error):
        return None


def compiled_runtime_version(compiled: Model) -> int | None:
    """The Edge TPU runtime version a compiled model needs (its first custom op's package)."""
    for op in compiled.main.ops:
        if op.custom_code == CUSTOM_OP and op.custom_options:
            return package_runtime_version(bytes(op.custom_options))
    return None


@dataclass
class Truth:
    """Where the compiler put each op of the CPU model's main subgraph.

    `cpu_ops` are indices into `model.main.ops` of the ops left outside every custom op;
    `unmatched` counts ops of the twin outside the custom ops that match no op of the CPU model by
    output names (0 on every pair seen: the compiler keeps tensor names); `segments` is the number
    of `edgetpu-custom-op`s (1 unless compiled with `-a`, several Edge TPU subgraphs allowed).
    """

    model: Model
    cpu_ops: list[int]
    cpu_types: Counter[str]
    segments: int
    unmatched: int
    log: CompilerLog | None
    runtime_version: int | None = None  # min_runtime_version of the twin's custom op
    memory: PackageMemory | None = None  # parameter memory read from the twin's packages

    @property
    def total(self) -> int:
        return len(self.model.main.ops)

    @property
    def mapped(self) -> int:
        return self.total - len(self.cpu_ops)

    @property
    def compiler_version(self) -> str | None:
        """The compiler that made the twin, as its log names it (None without a log)."""
        return self.log.header.get("version") if self.log else None

    @property
    def mode(self) -> str:
        """How the twin was compiled: several Edge TPU subgraphs (`-a`) when it holds more than
        one custom op, else one (the default; `-a` that found one segment looks the same)."""
        if self.segments > 1:
            return "multiple subgraphs (-a)"
        return "one Edge TPU subgraph" if self.segments == 1 else "nothing mapped"


def read_truth(pair: Pair) -> Truth:
    """Load both models of `pair` (and its log) and extract the compiler's placement."""
    model = flatbuffer.load(pair.cpu)
    compiled = flatbuffer.load(pair.compiled)
    return truth_of(model, compiled, parse_log(pair.log.read_text()) if pair.log else None)


def truth_of(model: Model, compiled: Model, log: CompilerLog | None = None) -> Truth:
    """The placement the compiler chose, from the CPU model and its compiled twin."""
    outside = [op for op in compiled.main.ops if op.custom_code != CUSTOM_OP]
    segments = len(compiled.main.ops) - len(outside)
    left = {t.name for op in outside for t in op.outputs}
    cpu_ops = [
        i
        for i, op in enumerate(model.main.ops)
        if op.outputs and all(t.name in left for t in op.outputs)
    ]
    matched = {t.name for i in cpu_ops for t in model.main.ops[i].outputs}
    unmatched = sum(1 for op in outside if not any(t.name in matched for t in op.outputs))
    types = Counter(op_label(model.main.ops[i]) for i in cpu_ops)
    runtime = compiled_runtime_version(compiled)
    memory = package_memory(compiled)
    return Truth(model, cpu_ops, types, segments, unmatched, log, runtime, memory)


def is_exact(prediction: Prediction, truth: Truth, *, count_segments: bool = False) -> bool:
    """The definition of an exact prediction used by the score and the oracle test.

    Exact means: the set of ops (indices into the CPU model's main subgraph) predicted to run on
    the CPU is the set the compiler left outside its custom op(s), hence also the same multiset of
    CPU op types and the same number of mapped ops. When some CPU op of the twin could not be
    matched by name (`truth.unmatched`), the multiset of CPU op types and the mapped count are
    compared instead. With `count_segments` (the multiple-subgraph mode) the predicted number of
    Edge TPU segments must also equal the number of `edgetpu-custom-op`s in the twin.
    """
    if truth.unmatched:
        predicted = Counter(o.op for o in prediction.ops if o.runs_on == "cpu")
        same = predicted == truth.cpu_types and prediction.mapped == truth.mapped
    else:
        same = prediction.cpu_ops() == truth.cpu_ops
    if count_segments:
        same = same and predicted_segments(prediction) == truth.segments
    return same


def predicted_segments(prediction: Prediction) -> int:
    """Edge TPU segments a prediction implies (its `segments` note, else 1 when anything maps)."""
    segments = getattr(prediction, "segments", None)
    if segments is not None:
        return int(segments)
    return 1 if prediction.mapped else 0


def logged_statuses(prediction: Prediction, model: Model | None = None) -> Counter[tuple[str, str]]:
    """(operator, status) of each predicted op as the compiler's log names it: a custom op is
    `CUSTOM` there whatever its custom code (cmpss94068/tensorflowlite detect_edgetpu.log,
    tensorflow/models#10695: the SSD's TFLite_Detection_PostProcess is logged as CUSTOM), where
    `op_label` names it by its code. Without `model` the labels are taken as they are."""
    ops = model.main.ops if model is not None else None
    return Counter(
        ("CUSTOM" if ops is not None and ops[o.index].type == "CUSTOM" else o.op, o.status)
        for o in prediction.ops
    )


def logged_rows(log: CompilerLog) -> Counter[tuple[str, str]]:
    """The log's `Operator Count Status` rows as a multiset of (operator, status)."""
    actual: Counter[tuple[str, str]] = Counter()
    for op, count, status in log.rows:
        actual[(op, status)] += count
    return actual


def status_agreement(
    prediction: Prediction, log: CompilerLog, model: Model | None = None
) -> tuple[int, int]:
    """(ops whose predicted status the log confirms, ops the log lists), counted per op type.

    The log gives `Operator Count Status` rows, not per-op placement, so agreement is the
    multiset intersection of (op type, status) between the prediction and the log's rows, the
    ops named as the log names them (`logged_statuses`, given the `model` predicted).
    """
    actual = logged_rows(log)
    agree = sum((logged_statuses(prediction, model) & actual).values())
    return agree, sum(actual.values())


# -- the documented rule: the baseline every predictor must beat -----------------------------------
# The op table of https://coral.ai/docs/edgetpu/models-intro/#supported-operations, frozen here
# (not read from delegates/edgetpu.toml, so that tuning the table cannot move the baseline).
DOCUMENTED_OPS = frozenset(
    {
        "ADD",
        "AVERAGE_POOL_2D",
        "CONCATENATION",
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "EXPAND_DIMS",
        "FULLY_CONNECTED",
        "L2_NORMALIZATION",
        "LOGISTIC",
        "UNIDIRECTIONAL_SEQUENCE_LSTM",
        "MAXIMUM",
        "MAX_POOL_2D",
        "MEAN",
        "MINIMUM",
        "MUL",
        "PACK",
        "PAD",
        "PRELU",
        "QUANTIZE",
        "REDUCE_MAX",
        "REDUCE_MIN",
        "RELU",
        "RELU6",
        "RELU_N1_TO_1",
        "RESHAPE",
        "RESIZE_BILINEAR",
        "RESIZE_NEAREST_NEIGHBOR",
        "RSQRT",
        "SLICE",
        "SOFTMAX",
        "SPACE_TO_DEPTH",
        "SPLIT",
        "SQUEEZE",
        "STRIDED_SLICE",
        "SUB",
        "SUM",
        "SQUARED_DIFFERENCE",
        "TANH",
        "TRANSPOSE",
        "TRANSPOSE_CONV",
    }
)
_INT8 = frozenset({"INT8", "UINT8"})


def documented_op_ok(op: Op) -> bool:
    """The documented rule for one op: its type is in the table, every activation it reads or
    writes is int8/uint8, and every activation has a static (all-positive) shape."""
    if op.type not in DOCUMENTED_OPS:
        return False
    for t in (*op.inputs, *op.outputs):
        if t is None or t.is_constant:
            continue
        if t.dtype not in _INT8 or any(d <= 0 for d in t.shape):
            return False
    return True


def documented_rule(model: Model) -> Prediction:
    """Map in execution order until the first op the documented rule refuses; it and every op
    after it run on the CPU. (No other knowledge of the compiler: this is the baseline.)"""
    ops = []
    cut = False
    for index, op in enumerate(model.main.ops):
        cut = cut or not documented_op_ok(op)
        target = "cpu" if cut else "edgetpu"
        ops.append(OpPrediction(index, op_label(op), target, "", "documented rule"))
    return Prediction("edgetpu", ops)


# -- scoring ---------------------------------------------------------------------------------------
@dataclass
class PairScore:
    """One pair scored: tflfuse's prediction and the documented rule, each exact or not."""

    pair: Pair
    mode: str  # "single" (one edgetpu-custom-op) or "multi" (compiled with several allowed)
    truth: Truth | None = None
    prediction: Prediction | None = None
    baseline: Prediction | None = None
    exact: bool = False
    baseline_exact: bool = False
    status: tuple[int, int] | None = None  # (agreeing, listed) per-op statuses against the log
    error: str | None = None
    memory: dict[str, Any] | None = None  # `memory_comparison`, when the twin's package parses


def score_pair(pair: Pair) -> PairScore:
    """Predict `pair` in the mode its twin was compiled in and compare with the truth.

    The compiler version named in the pair's log, when there is one, is passed to the predictor
    (a user knows which compiler they run). A pair that does not load counts as a miss for both.
    """
    try:
        truth = read_truth(pair)
    except Exception as exc:  # an unloadable pair is a miss, reported with its error
        return PairScore(pair, "single", error=f"{type(exc).__name__}: {exc}")
    multi = truth.segments > 1
    prediction = predict_edgetpu(truth.model, truth.compiler_version, multiple_subgraphs=multi)
    baseline = documented_rule(truth.model)
    score = PairScore(
        pair,
        "multi" if multi else "single",
        truth,
        prediction,
        baseline,
        exact=is_exact(prediction, truth, count_segments=multi),
        baseline_exact=is_exact(baseline, truth, count_segments=multi),
    )
    if truth.log is not None and truth.log.rows:
        score.status = status_agreement(prediction, truth.log, truth.model)
    score.memory = memory_comparison(prediction, truth)
    return score


def twin_compiler_major(truth: Truth) -> int:
    """The compiler generation that made the twin: its log's version, else its package's form
    (`package.compiler_generation`), else 2 (a runtime-10 package: 1.x or 2.x)."""
    if truth.compiler_version:
        return compiler_version_key(truth.compiler_version)[0]
    major = truth.memory.get("compiler_major") if truth.memory else None
    return int(major) if major is not None else 2


def memory_comparison(prediction: Prediction, truth: Truth) -> JSONDict | None:
    """The predicted parameter memory against the twin's packages (None when they do not parse):
    the bytes on chip and streamed as predicted (the ops the prediction maps, laid out for the
    compiler the twin shows, `twin_compiler_major`), and the layout alone (`layout_bytes`: the
    same layout applied to the ops the twin maps), so that a placement miss and a layout miss
    are told apart."""
    if truth.memory is None:
        return None
    ops = truth.model.main.ops
    cpu = set(truth.cpu_ops)
    major = twin_compiler_major(truth)
    table = capability("edgetpu")
    layout = predicted_memory([op for i, op in enumerate(ops) if i not in cpu], table, major)
    mapped = [ops[o.index] for o in prediction.ops if o.runs_on != "cpu"]
    predicted = predicted_memory(mapped, table, major) if prediction.ops else prediction.memory
    on, off = truth.memory["on_chip_bytes"], truth.memory["off_chip_bytes"]
    return {
        "on_chip_bytes": on,
        "off_chip_bytes": off,
        "compiler_major": major,
        "predicted_on_chip_bytes": predicted.get("on_chip_bytes"),
        "predicted_off_chip_bytes": predicted.get("off_chip_bytes"),
        "layout_bytes": layout["parameter_bytes"],
        "exact": predicted.get("on_chip_bytes") == on and predicted.get("off_chip_bytes") == off,
        "total_exact": predicted.get("parameter_bytes") == on + off,
        "layout_exact": layout["parameter_bytes"] == on + off,
        "undecided": undecided_line(predicted) is not None,  # `check` says what it cannot decide
        "undecided_reasons": sorted(undecided_counts(predicted)),  # which of its reasons
    }


# -- a compiled model on its own, and a model beside its twin (`tflfuse check`) --------------------
def is_compiled(model: Model) -> bool:
    """Whether `model` is an Edge TPU compiled model (it holds an edgetpu-custom-op)."""
    return any(op.custom_code == CUSTOM_OP for op in model.main.ops)


def compiler_label(runtime: int | None, form: int | None) -> str:
    """What a twin's package tells of the compiler that made it: its runtime version
    (`package_runtime_version`) and its form (`package.compiler_generation`: 15 when a running
    executable carries a cycle estimate, 16 when none does, None below runtime 12).

    - runtime 14: compiler 16 or later (its default; 124 of 124 logged twins).
    - runtime 12 with a cycle estimate: 15.0 or 2.x. Both write that form: Coral's
      demo-manufacturing classifier beside a 15.0.340273435 log, cmpss94068/tensorflowlite's
      SSD detector beside a 2.1.302470888 log. Only a log tells them apart.
    - runtime 12 without one: 16 asked for an older runtime (-m 12; Coral's MoveNet and LSTM
      twins map what only 16 maps), or 15.0: MarcelloCeresini/Franco's twin, beside a
      15.0.340273435 log, carries no cycle estimate either.
    - an older runtime: 15.0 or older, or a newer compiler asked for it (-m)."""
    if runtime is None:
        return "unknown (no readable package)"
    if runtime >= 14:
        return "edgetpu_compiler 16 or later (runtime 14: its default)"
    if form is not None and form >= 16:
        return (
            f"edgetpu_compiler 16 asked for runtime {runtime} (-m {runtime}), or 15.0 (no cycle"
            " estimate: both write that form; a log tells)"
        )
    if form == 15:
        return (
            f"edgetpu_compiler 15.0 or 2.x (runtime {runtime}, a cycle estimate: both write that"
            " form; a log tells)"
        )
    return (
        f"edgetpu_compiler 15.0 or older (runtime {runtime}), or a newer one asked for an"
        " older runtime (-m)"
    )


def compiled_summary(compiled: Model) -> dict[str, object]:
    """What a compiled model says about its compile: the number of Edge TPU segments and so the
    mode (several only with `-a`), the Edge TPU runtime it needs and what that tells of the
    compiler (see `package_runtime_version`), and the ops left on the CPU."""
    segments = sum(1 for op in compiled.main.ops if op.custom_code == CUSTOM_OP)
    runtime = compiled_runtime_version(compiled)
    package = package_memory(compiled)
    major = package.get("compiler_major") if package else None
    compiler = compiler_label(runtime, int(major) if major is not None else None)
    mode = (
        "several Edge TPU subgraphs (edgetpu_compiler -a)"
        if segments > 1
        else "one Edge TPU subgraph (the default, or -a finding one)"
    )
    if segments == 0:  # the compiler took no op: its output is the model, op for op
        mode, compiler = "nothing mapped (no edgetpu-custom-op: every op on the CPU)", "not told"
    cpu = [
        {"index": i, "op": op_label(op)}
        for i, op in enumerate(compiled.main.ops)
        if op.custom_code != CUSTOM_OP
    ]
    return {
        "segments": segments,
        "mode": mode,
        "multiple_subgraphs": segments > 1,
        "runtime_version": runtime,
        "compiler": compiler,
        "cpu_ops": cpu,
        "package": package,
    }


def format_package(package: dict[str, object] | None) -> list[str]:
    """The lines `check` prints of the Edge TPU packages (`package.package_memory`): what the
    compiler's console said of parameter memory, the executables and the caching token."""
    if not package:
        return ["Edge TPU package: not readable (an older compiler's layout)"]
    kinds = package["executables_by_type"]
    assert isinstance(kinds, dict)
    kinds_text = ", ".join(f"{k.replace('_', ' ')} x{n}" for k, n in kinds.items())
    tokens = package["caching_tokens"]
    assert isinstance(tokens, list)
    lines = [
        f"On-chip memory used for caching model parameters: {package['on_chip_bytes']:,} B",
        f"Off-chip memory used for streaming uncached model parameters:"
        f" {package['off_chip_bytes']:,} B",
        f"Executables: {package['executables']}"
        f" ({kinds_text});"
        f" caching token {', '.join(tokens) or 'none'}",
    ]
    packages = package["packages"]
    assert isinstance(packages, list)
    for i, pkg in enumerate(packages):
        if not pkg:
            continue
        ins = ", ".join(f"{x['name']} {x['yxz']}" for x in pkg["inputs"])
        outs = ", ".join(f"{x['name']} {x['yxz']}" for x in pkg["outputs"])
        lines.append(f"  segment {i}: inputs {ins or '-'}; outputs {outs or '-'}")
        running = [e for e in pkg["executable_list"] if e["type"] != "PARAMETER_CACHING"]
        if running:
            narrow = max(int(e.get("narrow_bytes_per_tile", 0)) for e in running)
            scratch = max(int(e["scratch_bytes"]) for e in running)
            code = sum(int(e.get("instruction_bytes", 0)) for e in pkg["executable_list"])
            lines.append(
                f"    activations: {narrow:,} B of on-chip memory per tile, {scratch:,} B in"
                f" host memory (scratch); instructions {code:,} B"
            )
    return lines


def format_compiled(summary: dict[str, object], name: str) -> str:
    """`tflfuse check` on a compiled model: how it was compiled and what runs on the CPU."""
    cpu = summary["cpu_ops"]
    assert isinstance(cpu, list)
    counts = Counter(str(o["op"]) for o in cpu)
    lines = [
        f"{name}: compiled for the Edge TPU",
        f"Compiled with: {summary['mode']}; {summary['segments']} edgetpu-custom-op",
        f"Needs Edge TPU runtime: {summary['runtime_version']} ({summary['compiler']})",
        f"Operations left on the CPU: {len(cpu)}"
        + (f" ({', '.join(f'{op} x{n}' for op, n in counts.items())})" if cpu else ""),
        *format_package(summary.get("package")),  # type: ignore[arg-type]
        "predict the CPU model it was compiled from (`check X.tflite --twin X_edgetpu.tflite`)",
    ]
    return "\n".join(lines)


def compare_with_twin(
    model: Model, compiled: Model, compiler_version: str | None = None
) -> tuple[Prediction, dict[str, object]]:
    """The prediction for `model` in the mode its compiled twin was made in, and how it compares:
    exact or the ops placed differently (indices into `model.main.ops`)."""
    truth = truth_of(model, compiled)
    multi = truth.segments > 1
    prediction = predict_edgetpu(model, compiler_version, multiple_subgraphs=multi)
    predicted, actual = set(prediction.cpu_ops()), set(truth.cpu_ops)
    comparison: dict[str, object] = {
        **compiled_summary(compiled),
        "exact": is_exact(prediction, truth, count_segments=multi),
        "predicted_only_cpu": sorted(predicted - actual),
        "compiler_only_cpu": sorted(actual - predicted),
        "predicted_segments": predicted_segments(prediction),
    }
    comparison.pop("cpu_ops")
    return prediction, comparison


def format_twin_comparison(comparison: dict[str, object], model: Model) -> str:
    """The lines `check --twin` prints after the prediction."""
    ops = model.main.ops

    def named(indices: object) -> str:
        assert isinstance(indices, list)
        return ", ".join(f"#{i} {op_label(ops[i])}" for i in indices[:12]) + (
            " ..." if len(indices) > 12 else ""
        )

    lines = [
        "",
        f"Compiled twin: {comparison['mode']}, {comparison['segments']} edgetpu-custom-op;"
        f" needs Edge TPU runtime {comparison['runtime_version']} ({comparison['compiler']})",
    ]
    if not comparison["segments"]:
        lines[1] = f"Compiled twin: {comparison['mode']}"
    if comparison["exact"]:
        lines.append("The prediction for that mode is exact: the same ops on the CPU")
    else:
        lines.append("The prediction for that mode differs from the twin:")
        if comparison["predicted_only_cpu"]:
            lines.append(
                f"  predicted on the CPU, compiled: {named(comparison['predicted_only_cpu'])}"
            )
        if comparison["compiler_only_cpu"]:
            lines.append(
                f"  predicted mapped, left on the CPU: {named(comparison['compiler_only_cpu'])}"
            )
        if comparison["predicted_segments"] != comparison["segments"]:
            lines.append(
                f"  segments: predicted {comparison['predicted_segments']},"
                f" compiled {comparison['segments']}"
            )
    return "\n".join(lines)
