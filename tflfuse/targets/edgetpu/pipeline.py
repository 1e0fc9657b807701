"""Where `edgetpu_compiler -n N` (`--num_segments`) cuts a model into N pipelined segments.

Coral documents the compiler's segmentation as "each segment has roughly the same amount of
parameter data" (libcoral `coral/tools/partitioner/README.md`), and libcoral's
`ParameterCountBasedPartitioner` spells that heuristic out: walk the ops in execution order,
adding each op's parameter bytes (the constant buffers it reads; 0 for a custom op) to the
current segment, and cut just before the op that would take it over `total // N + 1`; every
segment but the last ends before the first op whose outputs nothing reads (so each keeps at
least one op), and the last takes every op left.

Evidence: Coral's test data holds SSD MobileNet v1 and v2 compiled with `-n 2`, `-n 3` and
`-n 4` (6 pipelines, 15 cuts; `google-coral/test_data/pipeline`). Their source models are not at
hand, but each segment's inputs name the tensors cut; rebuilt from the published layer sizes
(backbone, extra layers, then the box predictors, in that order), the heuristic puts all 15 cuts
on exactly those tensors (`tests/test_edgetpu_pipeline.py`), and several segments' packages cache
exactly the bytes it assigns them (1,315,840, 1,510,912, 1,991,168, 1,247,744). The execution
order of the real sources is the one thing taken on trust; libcoral sorts the graph itself, but
its order would put each box predictor beside its feature map, which the twins contradict.

Each segment is then compiled alone in the default (one Edge TPU subgraph) mode. No TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tflfuse.ir import Graph, Op
from tflfuse.json_types import JSONDict


def parameter_bytes(op: Op) -> int:
    """Bytes of the constant buffers `op` reads (libcoral's count: 0 for a custom op)."""
    if op.type == "CUSTOM":
        return 0
    seen: set[int] = set()
    total = 0
    for t in op.inputs:
        if t is None or not t.is_constant or id(t) in seen:
            continue
        seen.add(id(t))
        assert t.data is not None
        total += int(t.data.nbytes)
    return total


@dataclass
class PipelineSplit:
    """N segments: op indices (execution order), parameter bytes, and the tensors each segment
    reads from earlier ones (the cut tensors; the model's inputs are not listed)."""

    num_segments: int
    ops: list[list[int]] = field(default_factory=list)
    parameter_bytes: list[int] = field(default_factory=list)
    inputs: list[list[str]] = field(default_factory=list)

    def segments(self) -> list[JSONDict]:
        """Each segment: its first and last op, op count, parameter bytes, the cut tensors."""
        return [
            {
                "ops": [s[0], s[-1]] if s else [],
                "op_count": len(s),
                "parameter_bytes": b,
                "reads_from_earlier_segments": list(i),
            }
            for s, b, i in zip(self.ops, self.parameter_bytes, self.inputs)
        ]

    def to_dict(self) -> JSONDict:
        return {"num_segments": self.num_segments, "segments": self.segments()}


def _first_sink(graph: Graph) -> int:
    """Execution index of the first op whose outputs no op reads."""
    for i, op in enumerate(graph.ops):
        if not any(t is not None and t.consumers for t in op.outputs):
            return i
    return len(graph.ops) - 1


def segment_sizes(sizes: list[int], n: int, first_sink: int) -> list[int] | None:
    """Ops per segment by the parameter heuristic, or None when N segments cannot each hold
    one op before the first sink (the compiler cannot cut the model that many times)."""
    total = sum(sizes)
    limit = total // n + 1
    counts = [0] * n
    i = 0
    for seg in range(n - 1):
        last = first_sink - (n - seg - 1)
        if last < i:
            return None
        size = 0
        while i <= last and size + sizes[i] <= limit:
            size += sizes[i]
            counts[seg] += 1
            i += 1
    counts[-1] = len(sizes) - i
    return counts if all(counts) else None


def pipeline_split(graph: Graph, n: int) -> PipelineSplit | None:
    """The N segments `edgetpu_compiler -n N` makes of `graph` (None when it cannot)."""
    if n < 2 or len(graph.ops) < n:
        return None
    sizes = [parameter_bytes(op) for op in graph.ops]
    counts = segment_sizes(sizes, n, _first_sink(graph))
    if counts is None:
        return None
    split = PipelineSplit(n)
    start = 0
    segment_of: dict[int, int] = {}
    for k, count in enumerate(counts):
        indices = list(range(start, start + count))
        split.ops.append(indices)
        split.parameter_bytes.append(sum(sizes[i] for i in indices))
        for i in indices:
            segment_of[id(graph.ops[i])] = k
        start += count
    for k, indices in enumerate(split.ops):
        names: list[str] = []
        for i in indices:
            for t in graph.ops[i].inputs:
                if t is None or t.producer is None or segment_of.get(id(t.producer), k) >= k:
                    continue
                if t.name not in names:
                    names.append(t.name)
        split.inputs.append(names)
    return split


def segment_graph(graph: Graph, split: PipelineSplit, k: int) -> Graph:
    """Segment `k` of `split` as a graph of its own (a structural copy of `graph` keeping only
    its ops): its inputs are what it reads from earlier segments or the model, its outputs what
    later segments or the model read of it, as the compiler writes `X_segment_k_of_N.tflite`."""
    sub = graph.snapshot(only=set(split.ops[k]))  # (not a full copy unwired: linear, not n^2)
    kept = list(sub.ops)
    produced = {id(t) for op in kept for t in op.outputs if t is not None}
    model_outputs = {t.name for t in graph.outputs}
    inputs: list = []
    outputs: list = []
    for op in kept:
        for t in op.inputs:
            if t is None or t.is_constant or id(t) in produced or t in inputs:
                continue
            inputs.append(t)
    later = {
        t.name
        for j in range(k + 1, len(split.ops))
        for i in split.ops[j]
        for t in graph.ops[i].inputs
        if t is not None
    }
    for op in kept:
        for t in op.outputs:
            if t is not None and (t.name in later or t.name in model_outputs):
                outputs.append(t)
    sub.inputs, sub.outputs = inputs, outputs
    return sub
