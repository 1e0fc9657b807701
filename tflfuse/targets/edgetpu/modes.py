"""The compile modes of `edgetpu_compiler`, predicted side by side, and the one to use.

- **one segment** (the default): one Edge TPU subgraph; an op the compiler refuses after the
  segment has started cuts everything that depends on it (`predict_edgetpu`).
- **several segments** (`-a`, `--enable_multiple_subgraphs`): every op that can map maps; the
  segments are TFLite's delegate partitioning of them (`predict._segments`; exact on the twins
  compiled with `-a`: `benchmarks/edgetpu_oracle_score.py`).
- **pipelined** (`-n N`, `--num_segments`): the model is cut into N pieces compiled one by one,
  one Edge TPU each, for N devices; offered when the parameters exceed one Edge TPU's cache, or
  for the N asked. The cuts follow Coral's parameter heuristic (`pipeline.pipeline_split`: all 15
  cuts of Coral's 6 SSD MobileNet pipeline twins), and each piece is predicted in the default
  one-segment mode on its own (`predict_pipelined`), so a refusal cuts only its own piece.

Between the CPU and the Edge TPU, data crosses wherever a tensor written on one side is read on
the other: `crossings` counts those tensors and their bytes (model inputs and outputs, which
cross in every mode, are not counted). The best mode maps the most ops, then has the fewest
crossings, then the fewest segments. No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tflfuse.ir import Graph, Model
from tflfuse.json_types import JSONDict
from tflfuse.targets.capabilities import OpPrediction, Prediction, capability
from tflfuse.targets.edgetpu.failures import whole_model_failures
from tflfuse.targets.edgetpu.limits import interface_limit_notes
from tflfuse.targets.edgetpu.pipeline import PipelineSplit, pipeline_split, segment_graph
from tflfuse.targets.edgetpu.predict import predict_edgetpu

COMPILER = "edgetpu_compiler"
FAILS = "edgetpu_compiler fails"  # how a decided whole-model refusal's note starts (failures.py)


@dataclass
class Crossings:
    """Tensors written on one side (CPU or Edge TPU) and read on the other, and their bytes."""

    to_cpu: int = 0
    to_edgetpu: int = 0
    bytes: int = 0

    @property
    def count(self) -> int:
        return self.to_cpu + self.to_edgetpu


def crossings(graph: Graph, mapped: list[bool]) -> Crossings:
    """The CPU <-> Edge TPU crossings of a placement (`mapped[i]`: op i on the Edge TPU)."""
    side = {id(op): mapped[i] for i, op in enumerate(graph.ops)}
    found = Crossings()
    seen: set[int] = set()
    for op in graph.ops:
        for t in op.outputs:
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            readers = {side[id(r)] for r in t.consumers if id(r) in side}
            if side[id(op)] and False in readers:
                found.to_cpu += 1
            elif not side[id(op)] and True in readers:
                found.to_edgetpu += 1
            else:
                continue
            found.bytes += t.nbytes
    return found


@dataclass
class ModeOutcome:
    """One compile mode predicted: what maps, in how many segments, what crosses, the flags."""

    mode: str  # "single", "multi" or "pipelined"
    flags: list[str]
    mapped: int
    total: int
    segments: int
    crossings: Crossings
    note: str = ""
    pieces: list[JSONDict] = field(default_factory=list)  # -n: each segment's ops and bytes

    def command(self, model_name: str = "MODEL.tflite") -> str:
        return " ".join([COMPILER, *self.flags, model_name])

    def to_dict(self) -> JSONDict:
        return {
            "mode": self.mode,
            "flags": list(self.flags),
            "mapped": self.mapped,
            "ops": self.total,
            "segments": self.segments,
            "crossings": self.crossings.count,
            "crossings_to_cpu": self.crossings.to_cpu,
            "crossings_to_edgetpu": self.crossings.to_edgetpu,
            "crossing_bytes": self.crossings.bytes,
            **({"note": self.note} if self.note else {}),
            **({"pieces": self.pieces} if self.pieces else {}),
        }


@dataclass
class ModeChoice:
    """Every mode that applies to a model, and the best of them (`best`: an index)."""

    outcomes: list[ModeOutcome] = field(default_factory=list)
    best: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> ModeOutcome:
        return self.outcomes[self.best]

    def of(self, mode: str) -> ModeOutcome | None:
        return next((o for o in self.outcomes if o.mode == mode), None)

    def to_dict(self) -> JSONDict:
        return {
            "modes": [o.to_dict() for o in self.outcomes],
            "best": self.chosen.mode,
            "best_flags": list(self.chosen.flags),
            "notes": list(self.notes),
        }


def _outcome(mode: str, flags: list[str], graph: Graph, prediction: Prediction) -> ModeOutcome:
    mapped = [o.runs_on != "cpu" for o in prediction.ops]
    segments = prediction.segments if prediction.segments is not None else int(any(mapped))
    return ModeOutcome(
        mode, flags, prediction.mapped, len(prediction.ops), segments, crossings(graph, mapped)
    )


def pipeline_segments(prediction: Prediction) -> int | None:
    """Edge TPUs a pipelined compile (`-n N`) needs to cache every parameter, when one is not
    enough (None otherwise)."""
    memory = prediction.memory
    total, cache = memory.get("parameter_bytes", 0), memory.get("cache_bytes", 0)
    if not cache or total <= cache:
        return None
    return -(-total // cache)


def compare_modes(
    model: Model, compiler_version: str | None = None, num_segments: int | None = None
) -> ModeChoice:
    """The one-segment and `-a` compiles predicted (and `-n N` where the parameters exceed the
    cache, or `num_segments` asks), and the best: the most ops mapped, then the fewest
    crossings, then segments."""
    graph = model.main
    single = predict_edgetpu(model, compiler_version)
    multi = predict_edgetpu(model, compiler_version, multiple_subgraphs=True)
    outcomes = [
        _outcome("single", [], graph, single),
        _outcome("multi", ["-a"], graph, multi),
    ]
    pieces = num_segments or pipeline_segments(single)
    if pieces and pieces > 1:
        outcomes.append(pipelined_outcome(model, pieces, compiler_version, single))
    ranked = sorted(
        range(len(outcomes)),
        key=lambda i: (-outcomes[i].mapped, outcomes[i].crossings.count, outcomes[i].segments),
    )
    notes = [f.line() for f in whole_model_failures(model, compiler_version)]
    notes += interface_limit_notes(model)
    failure = failure_note(model, multi)
    if failure:
        notes.append(f"{failure}; {search_note(len(graph.ops))}")
    return ModeChoice(outcomes, ranked[0], notes)


def predict_pipelined(
    model: Model, n: int, compiler_version: str | None = None
) -> tuple[PipelineSplit, Prediction] | None:
    """`edgetpu_compiler -n N`: the cuts (`pipeline.pipeline_split`) and every piece predicted in
    the default one-segment mode on its own, as the compiler compiles them (None when the
    model cannot be cut N times)."""
    graph = model.main
    split = pipeline_split(graph, n)
    if split is None:
        return None
    ops: list[OpPrediction] = []
    for k, indices in enumerate(split.ops):
        piece = Model([segment_graph(graph, split, k), *model.subgraphs[1:]])
        predicted = predict_edgetpu(piece, compiler_version)
        for index, o in zip(indices, predicted.ops):
            ops.append(OpPrediction(index, o.op, o.runs_on, o.status, o.reason))
    whole = Prediction("edgetpu", ops, compiler_version=compiler_version, mode="pipelined")
    whole.segments = sum(
        any(o.runs_on != "cpu" for o in ops if o.index in set(indices)) for indices in split.ops
    )
    return split, whole


def pipelined_outcome(
    model: Model, pieces: int, compiler_version: str | None, single: Prediction
) -> ModeOutcome:
    """The `-n N` outcome: its pieces predicted, or (when the model cannot be cut N times) the
    one-segment mapping with a note saying so."""
    graph = model.main
    found = predict_pipelined(model, pieces, compiler_version)
    if found is None:
        outcome = _outcome("pipelined", ["-n", str(pieces)], graph, single)
        outcome.note = f"cannot be cut into {pieces} segments (a first segment over the average)"
        return outcome
    split, prediction = found
    outcome = _outcome("pipelined", ["-n", str(pieces)], graph, prediction)
    outcome.segments = pieces
    outcome.pieces = split.segments()
    cache = single.memory.get("cache_bytes", 0)
    over = [k for k, b in enumerate(split.parameter_bytes) if cache and b > cache]
    outcome.note = (
        "cuts by Coral's parameter heuristic: "
        + ", ".join(f"{len(s)} ops / {b:,} B" for s, b in zip(split.ops, split.parameter_bytes))
        + (f"; segment {over[0]} still exceeds one cache" if over else "")
    )
    return outcome


def failure_note(model: Model, prediction: Prediction) -> str | None:
    """What the evidence cannot decide about a whole-model failure ("Compilation failed due to
    large activation tensors in model"), said when a mapped activation is larger than any the
    dev pairs show compiled (`largest_activation_compiled` in the table); None otherwise."""
    limit = capability("edgetpu")["meta"].get("largest_activation_compiled")
    ops = model.main.ops
    mapped = [ops[o.index] for o in prediction.ops if o.runs_on != "cpu"]
    tensors = [t for op in mapped for t in (*op.inputs, *op.outputs) if t is not None]
    biggest = max((t for t in tensors if not t.is_constant), key=lambda t: t.nbytes, default=None)
    if not limit or biggest is None or biggest.nbytes <= limit:
        return None
    return (
        f"tensor {biggest.name!r} {list(biggest.shape)} holds {biggest.nbytes:,} bytes, more"
        f" than any activation seen compiled ({limit:,}): whether edgetpu_compiler fails with"
        " 'large activation tensors' is undecided by the evidence (YOLOv5s fails at 352 px and"
        " compiles at 384 px, gh512)"
    )


def search_prefixes(total: int, step: int = 10) -> list[int]:
    """The op counts `edgetpu_compiler -d -k STEP` tries after a failed compile of `total` ops:
    the first `total`, `total - STEP`, ... ops in execution order ("Try to compile segment with
    N ops", the ops after each prefix cut at its "Intermediate tensors": gh608 with step 1,
    534, 533, 532; gh671 with step 10, 340, 330, 320)."""
    if step < 1:
        raise ValueError("the search step is at least 1")
    return list(range(total, 0, -step))


def search_note(total: int, step: int = 10) -> str:
    """What the delegate search (`-d -k STEP`, Ultralytics' export) does after such a failure,
    and what stays undecided."""
    tried = search_prefixes(total, step)[:4]
    return (
        f"with -d -k {step} (Ultralytics' export) a failed compile is retried on the first"
        f" {', '.join(map(str, tried[1:]))}, ... ops; the first prefix that compiles maps in one"
        " segment and every later op runs on the CPU, so where it stops is undecided with the"
        " failure"
    )


def format_modes(choice: ModeChoice, model_name: str = "MODEL.tflite") -> list[str]:
    """The lines `check` and the report print: each mode, then the one to use and its command."""
    names = {"single": "one segment", "multi": "-a", "pipelined": "-n"}
    lines = ["Compile modes (predicted):"]
    for o in choice.outcomes:
        label = names[o.mode] + (f" {o.flags[1]}" if o.mode == "pipelined" else "")
        lines.append(
            f"  {label:<12} {o.mapped}/{o.total} mapped in {o.segments} Edge TPU segment"
            f"{'s' * (o.segments != 1)}; {o.crossings.count} CPU<->Edge TPU crossings"
            f" ({o.crossings.bytes:,} bytes)" + (f"; {o.note}" if o.note else "")
        )
    if any(n.startswith(FAILS) for n in choice.notes):
        lines.append("Best mode: none, the compiler refuses the model (see the note)")
    else:
        lines.append(f"Best mode: {choice.chosen.command(model_name)}")
    return lines + [f"note: {n}" for n in choice.notes]
