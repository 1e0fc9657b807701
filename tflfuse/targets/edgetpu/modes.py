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
cross in every mode, are not counted). Each mode carries its parameter memory as the memory
predictor lays it out (`mode_memory`): cached on chip, and streamed on every inference; for
`-n N` per segment, each on an Edge TPU of its own, with the tensors its segments pass each
other through the host (`segment_handoffs`). The best mode (`rank_key`) maps the most ops, then
has the fewest crossings and bytes crossing, then needs no more Edge TPUs than the user has
(one, unless `--num-segments N` says N), then moves the fewest bytes through the host per
inference (parameters streamed, and `-n`'s hand-offs), then needs the fewest Edge TPUs and
segments; `why_line` says which of these decided, and `streaming_line` what still streams.
No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tflfuse.ir import Graph, Model
from tflfuse.json_types import JSONDict
from tflfuse.targets.capabilities import OpPrediction, Prediction, capability
from tflfuse.targets.edgetpu.failures import whole_model_failures
from tflfuse.targets.edgetpu.limits import interface_limit_notes
from tflfuse.targets.edgetpu.mode_memory import ParameterMemory, mib, segment_lines
from tflfuse.targets.edgetpu.pipeline import PipelineSplit, pipeline_split, segment_graph
from tflfuse.targets.edgetpu.predict import predict_edgetpu

COMPILER = "edgetpu_compiler"
FAILS = "edgetpu_compiler fails"  # how a decided whole-model refusal's note starts (failures.py)
REFUSED = "none, the compiler refuses the model (see the note)"


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
    """One compile mode predicted: what maps, in how many segments, what crosses, the flags, and
    its parameter memory (`memory`; for `-n N` the sum of `segment_memory`, one per segment,
    each on an Edge TPU of its own)."""

    mode: str  # "single", "multi" or "pipelined"
    flags: list[str]
    mapped: int
    total: int
    segments: int
    crossings: Crossings
    note: str = ""
    pieces: list[JSONDict] = field(default_factory=list)  # -n: each segment's ops and bytes
    memory: ParameterMemory = field(default_factory=ParameterMemory)
    segment_memory: list[ParameterMemory] = field(default_factory=list)
    handoffs: tuple[int, int] | None = None  # -n: tensors passed between segments, their bytes

    def command(self, model_name: str = "MODEL.tflite") -> str:
        return " ".join([COMPILER, *self.flags, model_name])

    @property
    def label(self) -> str:
        """ "one segment", "-a" or "-n N"."""
        return {"single": "one segment", "multi": "-a"}.get(self.mode, " ".join(self.flags))

    @property
    def edgetpus(self) -> int:
        """Edge TPUs the compiled model runs on: N for `-n N`, else one."""
        return int(self.flags[1]) if self.mode == "pipelined" else 1

    @property
    def host_bytes(self) -> int:
        """Bytes through the host per inference besides the CPU crossings: the parameters
        streamed, and for `-n N` the tensors passed from one segment to a later one."""
        return self.memory.streamed_bytes + (self.handoffs[1] if self.handoffs else 0)

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
            "edgetpus": self.edgetpus,
            "cached_bytes": self.memory.cached_bytes,
            "streamed_bytes": self.memory.streamed_bytes,
            "parameter_memory": self.memory.to_dict(),
            "host_bytes": self.host_bytes,
            **({"note": self.note} if self.note else {}),
            **({"pieces": self.pieces} if self.pieces else {}),
            **(
                {"segment_handoffs": self.handoffs[0], "segment_handoff_bytes": self.handoffs[1]}
                if self.handoffs is not None
                else {}
            ),
        }

    def memory_lines(self) -> list[str]:
        """Its parameters in words: one Edge TPU's in a line, N segments' summarised in two."""
        return segment_lines(self.segment_memory) if self.segment_memory else [self.memory.line()]


@dataclass
class ModeChoice:
    """Every mode that applies to a model, and the best of them (`best`: an index)."""

    outcomes: list[ModeOutcome] = field(default_factory=list)
    best: int = 0
    notes: list[str] = field(default_factory=list)
    edgetpus: int = 1  # Edge TPUs the user has said they have (`--num-segments N`), else one

    @property
    def chosen(self) -> ModeOutcome:
        return self.outcomes[self.best]

    def of(self, mode: str) -> ModeOutcome | None:
        return next((o for o in self.outcomes if o.mode == mode), None)

    @property
    def refused(self) -> bool:
        """A decided whole-model refusal (`failures`): no mode compiles."""
        return any(n.startswith(FAILS) for n in self.notes)

    def ranked(self) -> list[ModeOutcome]:
        """The outcomes best first (`rank_key`), the chosen one leading."""
        rest = [o for i, o in enumerate(self.outcomes) if i != self.best]
        return [self.chosen, *sorted(rest, key=lambda o: rank_key(o, self.edgetpus))]

    def on_one_edgetpu(self) -> ModeOutcome | None:
        """The best mode that needs one Edge TPU, when the chosen one needs several (None
        otherwise)."""
        if self.chosen.edgetpus == 1:
            return None
        return next((o for o in self.ranked() if o.edgetpus == 1), None)

    def to_dict(self) -> JSONDict:
        one = self.on_one_edgetpu()
        return {
            "modes": [o.to_dict() for o in self.outcomes],
            "best": self.chosen.mode,
            "best_flags": list(self.chosen.flags),
            "notes": list(self.notes),
            "why": why_line(self) if not self.refused else REFUSED,
            "best_streamed_bytes": self.chosen.memory.streamed_bytes,
            **(
                {"best_on_one_edgetpu": one.mode, "best_on_one_edgetpu_flags": one.flags}
                if one
                else {}
            ),
        }


def rank_key(o: ModeOutcome, edgetpus: int = 1) -> tuple[int, ...]:
    """What orders the modes: the most ops mapped, then the fewest CPU <-> Edge TPU crossings
    and bytes crossing, then a mode that needs no more Edge TPUs than `edgetpus` (the user has
    one unless `--num-segments N` says N: a `-n N` pipeline that maps no more is offered, not
    chosen, for a user who has one USB Accelerator), then the fewest parameter bytes streamed
    per inference (the predicted layout's, undecided parts included as predicted; for `-n N`
    with the tensors its segments pass each other through the host, which a pipeline moves on
    every inference too: `-n N` does not win by streaming less only to pass more between its
    Edge TPUs), then the fewest Edge TPUs and segments."""
    return (
        -o.mapped,
        o.crossings.count,
        o.crossings.bytes,
        int(o.edgetpus > edgetpus),
        o.host_bytes,
        o.edgetpus,
        o.segments,
    )


def _memory_fact(o: ModeOutcome) -> str:
    """The chosen mode's parameters in a clause: do they fit, what streams per inference."""
    m = o.memory
    undecided = " (layout undecided in part)" if m.undecided else ""
    if o.segment_memory:
        parts = o.segment_memory
        over = sum(p.exceeds_cache for p in parts)
        streaming = sum(bool(p.streamed_bytes) for p in parts)
        fit = (
            f"{over} of {len(parts)} segments exceed their cache"
            if over
            else "every segment's parameters fit its cache"
        )
        flow = (
            f"{'one' if streaming == 1 else streaming} segment{'s' * (streaming > 1)}"
            f" stream{'s' * (streaming == 1)}"
            f" {mib(m.streamed_bytes)} per inference"
            if streaming
            else "no segment streams"
        )
        passed = f" (passing {mib(o.handoffs[1])} between them)" if o.handoffs else ""
        return f"on {o.edgetpus} Edge TPUs{passed}, {fit}; {flow}{undecided}"
    if not m.streamed_bytes:
        cached = f"{mib(m.cached_bytes)} of {mib(m.cache_bytes)}"
        if m.undecided:
            cached += "; layout undecided in part"
        return f"its parameters fit the cache ({cached})"
    return (
        f"it streams {mib(m.streamed_bytes)} of its {mib(m.parameter_bytes)} of parameters per"
        f" inference{undecided}"
    )


def _reason(best: ModeOutcome, other: ModeOutcome, edgetpus: int = 1) -> str:
    """Why `best` ranks before `other`: the first count of `rank_key` where they differ."""
    a, b = rank_key(best, edgetpus), rank_key(other, edgetpus)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    same = f"maps as many as {other.label}"
    if first == 0:
        more = best.mapped - other.mapped
        return f"maps {best.mapped}/{best.total} ops, {more} more than {other.label}"
    if first == 1:
        n = other.crossings.count - best.crossings.count
        return f"{same} with {n} fewer CPU<->Edge TPU crossing{'s' * (n > 1)}"
    if first == 2:
        fewer = other.crossings.bytes - best.crossings.bytes
        return f"{same} with as many crossings and {fewer:,} fewer bytes crossing"
    if first == 3:
        return (
            f"{same} with as few crossings on {best.edgetpus} Edge TPU{'s' * (best.edgetpus > 1)};"
            f" {other.label} needs {other.edgetpus} (`--num-segments {other.edgetpus}` chooses"
            f" among modes on that many)"
        )
    if first == 4 and (best.handoffs or other.handoffs):
        return (
            f"{same} with as few crossings and moves fewer bytes through the host per inference,"
            f" parameters streamed and tensors passed between segments ({mib(best.host_bytes)};"
            f" {other.label}: {mib(other.host_bytes)})"
        )
    if first == 4:
        theirs = mib(other.memory.streamed_bytes)
        return f"{same} with as few crossings and streams less ({other.label}: {theirs})"
    if first in (5, 6):
        return (
            f"ties with {other.label} on ops, crossings and streamed bytes, on fewer Edge TPUs"
            " or segments"
        )
    default = " and is the compiler's default" if best.mode == "single" else ""
    return f"ties with {other.label} on every count{default}"


def why_line(choice: ModeChoice) -> str:
    """One line: the chosen mode, why it ranks first (against the runner-up), and its memory."""
    ranked = choice.ranked()
    best = ranked[0]
    reason = (
        _reason(best, ranked[1], choice.edgetpus) if len(ranked) > 1 else "the only mode predicted"
    )
    return f"{best.label}: {reason}; {_memory_fact(best)}"


def streaming_line(choice: ModeChoice) -> str | None:
    """Said plainly when even the chosen mode streams parameters on every inference: how many
    bytes, and whether the model's parameters exceed one Edge TPU's cache (None when nothing
    streams)."""
    m = choice.chosen.memory
    if not m.streamed_bytes:
        return None
    line = (
        f"Parameters stream on every inference, even in the best mode: {mib(m.streamed_bytes)}"
        f" ({m.streamed_bytes:,} bytes) per inference"
    )
    whole = max(o.memory.parameter_bytes for o in choice.outcomes)
    if m.cache_bytes and whole > m.cache_bytes:
        line += (
            f"; the model's {mib(whole)} of parameters exceed one Edge TPU's"
            f" {mib(m.cache_bytes)} cache"
        )
    return line + (" (layout undecided in part)" if m.undecided else "")


def _outcome(mode: str, flags: list[str], graph: Graph, prediction: Prediction) -> ModeOutcome:
    mapped = [o.runs_on != "cpu" for o in prediction.ops]
    segments = prediction.segments if prediction.segments is not None else int(any(mapped))
    return ModeOutcome(
        mode,
        flags,
        prediction.mapped,
        len(prediction.ops),
        segments,
        crossings(graph, mapped),
        memory=ParameterMemory.of(prediction.memory),
    )


def pipeline_segments(prediction: Prediction) -> int | None:
    """Edge TPUs a pipelined compile (`-n N`) needs to cache every parameter of the ops
    `prediction` maps, when one is not enough (None otherwise). `compare_modes` asks it of the
    one-segment and the `-a` prediction and takes the larger: each piece of a pipeline starts
    a segment afresh, so it can map ops past the point where one segment stops."""
    memory = prediction.memory
    total, cache = memory.get("parameter_bytes", 0), memory.get("cache_bytes", 0)
    if not cache or total <= cache:
        return None
    return -(-total // cache)


def compare_modes(
    model: Model, compiler_version: str | None = None, num_segments: int | None = None
) -> ModeChoice:
    """The one-segment and `-a` compiles predicted (and `-n N` where the parameters exceed the
    cache, or `num_segments` asks), and the best (`rank_key`): the most ops mapped, then the
    fewest crossings and bytes crossing, then no more Edge TPUs than `num_segments` (else one),
    then the fewest parameter bytes streamed."""
    graph = model.main
    single = predict_edgetpu(model, compiler_version)
    multi = predict_edgetpu(model, compiler_version, multiple_subgraphs=True)
    outcomes = [
        _outcome("single", [], graph, single),
        _outcome("multi", ["-a"], graph, multi),
    ]
    pieces = num_segments or max(filter(None, map(pipeline_segments, (single, multi))), default=0)
    if pieces and pieces > 1:
        outcomes.append(pipelined_outcome(model, pieces, compiler_version, single))
    edgetpus = num_segments or 1
    ranked = sorted(range(len(outcomes)), key=lambda i: rank_key(outcomes[i], edgetpus))
    notes = [f.line() for f in whole_model_failures(model, compiler_version)]
    notes += interface_limit_notes(model)
    failure = failure_note(model, multi)
    if failure:
        notes.append(f"{failure}; {search_note(len(graph.ops))}")
    return ModeChoice(outcomes, ranked[0], notes, edgetpus)


@dataclass
class Pipelined:
    """`edgetpu_compiler -n N` predicted: the cuts, the whole placement, each piece's memory."""

    split: PipelineSplit
    prediction: Prediction
    memory: list[ParameterMemory]


def predict_pipelined(
    model: Model, n: int, compiler_version: str | None = None
) -> Pipelined | None:
    """`edgetpu_compiler -n N`: the cuts (`pipeline.pipeline_split`) and every piece predicted in
    the default one-segment mode on its own, as the compiler compiles them, with its parameter
    memory on its own Edge TPU (None when the model cannot be cut N times)."""
    graph = model.main
    split = pipeline_split(graph, n)
    if split is None:
        return None
    ops: list[OpPrediction] = []
    memory: list[ParameterMemory] = []
    segments = 0
    for k, indices in enumerate(split.ops):
        piece = Model([segment_graph(graph, split, k), *model.subgraphs[1:]])
        predicted = predict_edgetpu(piece, compiler_version)
        for index, o in zip(indices, predicted.ops):
            ops.append(OpPrediction(index, o.op, o.runs_on, o.status, o.reason))
        memory.append(ParameterMemory.of(predicted.memory))
        segments += predicted.mapped > 0
    whole = Prediction("edgetpu", ops, compiler_version=compiler_version, mode="pipelined")
    whole.segments = segments
    return Pipelined(split, whole, memory)


def pipelined_outcome(
    model: Model, pieces: int, compiler_version: str | None, single: Prediction
) -> ModeOutcome:
    """The `-n N` outcome: its pieces predicted, each with its parameter memory, or (when the
    model cannot be cut N times) the one-segment mapping with a note saying so."""
    graph = model.main
    found = predict_pipelined(model, pieces, compiler_version)
    if found is None:
        outcome = _outcome("pipelined", ["-n", str(pieces)], graph, single)
        outcome.note = f"cannot be cut into {pieces} segments (a first segment over the average)"
        return outcome
    outcome = _outcome("pipelined", ["-n", str(pieces)], graph, found.prediction)
    outcome.segments = pieces
    outcome.memory = ParameterMemory.summed(found.memory)
    outcome.segment_memory = found.memory
    outcome.pieces = [
        {**piece, "predicted_parameter_bytes": m.parameter_bytes, **_piece_memory(m)}
        for piece, m in zip(found.split.segments(), found.memory)
    ]
    handoffs, handoff_bytes = segment_handoffs(graph, found.split)
    outcome.handoffs = (handoffs, handoff_bytes)
    outcome.note = (
        f"cut by Coral's parameter heuristic (segments in --json); {handoffs} tensors"
        f" ({handoff_bytes:,} bytes) pass between segments through the host"
    )
    return outcome


def segment_handoffs(graph: Graph, split: PipelineSplit) -> tuple[int, int]:
    """The tensors a segment reads from earlier ones, and their bytes: what leaves one Edge TPU
    and enters another through the host on every inference of a pipeline (not counted as
    CPU <-> Edge TPU crossings, which are the model's own CPU ops)."""
    tensors = {t.name: t for op in graph.ops for t in op.outputs if t is not None}
    names = [name for names in split.inputs for name in names if name in tensors]
    return len(names), sum(tensors[name].nbytes for name in names)


def _piece_memory(m: ParameterMemory) -> JSONDict:
    """A segment's memory for its `pieces` entry (its laid-out total is added beside)."""
    d = m.to_dict()
    keys = ("cached_bytes", "streamed_bytes", "exceeds_cache", "undecided")
    return {k: d[k] for k in keys if k in d}


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
    """The lines `check` and the report print: each mode (its mapping, then its parameters:
    `-n N`'s segments summarised, listed only in --json), then the one to use, its command and
    why, and what streams on every inference."""
    lines = ["Compile modes (predicted):"]
    for o in choice.outcomes:
        lines.append(
            f"  {o.label:<12} {o.mapped}/{o.total} mapped in {o.segments} Edge TPU segment"
            f"{'s' * (o.segments != 1)}; {o.crossings.count} CPU<->Edge TPU crossings"
            f" ({o.crossings.bytes:,} bytes)"
        )
        lines += [f"  {'':<12} {o.note}"] if o.note else []
        lines += [f"  {'':<12} {line}" for line in o.memory_lines()]
        if o.edgetpus > choice.edgetpus:
            lines.append(
                f"  {'':<12} needs {o.edgetpus} Edge TPUs: chosen only where it maps more or"
                f" crosses less, or when `--num-segments {o.edgetpus}` says you have them"
            )
    if choice.refused:
        lines.append(f"Best mode: {REFUSED}")
        return lines + [f"note: {n}" for n in choice.notes]
    lines.append(f"Best mode: {choice.chosen.command(model_name)}")
    lines.append(f"  why: {why_line(choice)}")
    one = choice.on_one_edgetpu()
    if one is not None:
        lines.append(
            f"Best mode on one Edge TPU: {one.command(model_name)} (streams"
            f" {mib(one.memory.streamed_bytes)} per inference)"
        )
    streaming = streaming_line(choice)
    if streaming:
        lines.append(streaming)
    return lines + [f"note: {n}" for n in choice.notes]
