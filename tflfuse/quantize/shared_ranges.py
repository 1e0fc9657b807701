"""Calibrated ranges shared where a tensor is only copied: one rounding where the float graph has
one, not two.

Calibration gives every tensor its own [min, max]; litert-quantizer turns each into a scale. Where
a tensor is only copied on (an exact copy, or one part of a concatenation), two scales for the
same values cost a second rounding that the graph before the rules did not have: the copy
re-rounds the values onto its own grid, or the quantizer puts a QUANTIZE between a part and its
concatenation (the concatenation's kernel takes one scale). The rules of the Edge TPU recipe
write such copies (`targets/edgetpu/attention.py`: the 1x1 convolutions repeating an operand,
the chunks and heads joined by CONCATENATION), so each of attention's logits rounded three or
four times more than stock's one BATCH_MATMUL output (measured on YOLO11n's C2PSA:
benchmarks/FUSED_ACCURACY.md). Two rules, applied to the statistics before quantizing (the
statistics as measured are left as they were):

- **An exact copy keeps its input's range.** An op whose every output element is one of its
  input's elements, times 1: a CONV_2D (or DEPTHWISE_CONV_2D) with constant weights of only 0
  and 1, one 1 per output channel, no bias (or a zero one) and no fused activation. Its output
  takes the range of its input, so its scale is the input's and the int8 copy is exact (a weight
  of 1 is exact in int8: 127 at scale 1/127). Its own calibrated range lies inside the input's,
  so nothing clips.
- **A part of a concatenation takes the concatenation's range.** A part read by nothing but the
  CONCATENATION (through a RESHAPE, SQUEEZE or EXPAND_DIMS the part alone reads, which keep
  their input's scale), and written by an op that rounds into its own output scale (CONV_2D,
  ADD, SUM, ...: `REQUANTIZING`): that op rounds once into the concatenation's scale, where it
  rounded into the part's own and a QUANTIZE rounded again. The concatenation's calibrated
  range holds every part's (it is their union), so nothing clips, and the part's only reader
  takes the coarser scale anyway: the error of the part as the concatenation holds it is at
  most half the concatenation's step, where it was that plus half the part's. Applied from the
  last op back, so a concatenation of concatenations hands its range down to the innermost
  parts, before the copies (a copy that is such a part rounds once into the concatenation's
  scale instead).
- **Copies of one tensor joined keep its range.** A CONCATENATION every input of which is the
  same tensor, or an earlier such join of it (`targets/edgetpu/spread.py` copies an attention
  operand n times by joins of 2-4): its output, and the views (RESHAPE, SLICE, TRANSPOSE, PAD)
  between the tensor and the joins, take the range of the tensor the views start from (the
  operand, whose scale the quantizer hands down the views). Calibrated on their own, the joins
  got the narrower range of the rows they copy, and a QUANTIZE re-rounded every copied value
  (YOLO26n-320: 8 of them, a softmax's 1/256 steps re-rounded onto 1/255). All the copies'
  values are the operand's, so nothing clips. Where the operand is written by an op of fixed
  output scale (SOFTMAX, LOGISTIC: 1/256 from -128), the range is that scale's, [0, 255/256].
Ops with a fixed output scale (LOGISTIC, SOFTMAX, ...) are not in `REQUANTIZING`: the quantizer
fixes their scale whatever the range says, and their QUANTIZE stays.
"""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Graph, Op, Tensor
from tflfuse.quantize.calibrated_ranges import Stats, TensorStats

# Ops whose int8 kernel rounds its result into its own output scale, whatever the input's: their
# output may take any range.
REQUANTIZING = frozenset(
    {
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "FULLY_CONNECTED",
        "ADD",
        "SUB",
        "MUL",
        "SUM",
        "MEAN",
        "SQUARED_DIFFERENCE",
    }
)
# Ops the quantizer gives their input's scale (a reshape of the same values).
SAME_SCALE_VIEWS = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS"})
COPY_CONVS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D"})
# Ops that only place their input's values: a copy's range is found through them.
VIEWS = SAME_SCALE_VIEWS | {"SLICE", "STRIDED_SLICE", "TRANSPOSE", "PAD"}
# int8 output ranges fixed by the kernel (TFLite's int8 spec: scale 1/256, zero point -128).
FIXED_RANGES = {"SOFTMAX": (0.0, 255.0 / 256.0), "LOGISTIC": (0.0, 255.0 / 256.0)}


def is_exact_copy(op: Op) -> bool:
    """Whether `op` is a 1x1-style CONV_2D / DEPTHWISE_CONV_2D whose every output channel copies
    one input element (constant float weights of 0 and 1, one 1 per output channel), with no
    bias (or a zero one) and no fused activation."""
    if op.type not in COPY_CONVS or len(op.inputs) < 2 or op.fused_activation != "NONE":
        return False
    w = op.inputs[1]
    if w is None or not w.is_constant or w.is_raw or w.dtype != "FLOAT32":
        return False
    values = np.asarray(w.data, np.float64)
    if values.size == 0 or not np.all((values == 0) | (values == 1)):
        return False
    # ones per output channel: the last axis of a depthwise kernel [1, h, w, C], the first of a
    # conv's [O, h, w, I]
    if op.type == "DEPTHWISE_CONV_2D":
        ones = values.reshape(-1, values.shape[-1]).sum(axis=0)
    else:
        ones = values.reshape(len(values), -1).sum(axis=1)
    if not np.all(ones == 1):
        return False
    bias = op.inputs[2] if len(op.inputs) > 2 else None
    if bias is None:
        return True
    return bias.is_constant and not bias.is_raw and not np.any(np.asarray(bias.data))


def _entry_like(source: TensorStats, target: TensorStats | None) -> TensorStats:
    """`source`'s min and max in a new entry (the target's other statistics kept)."""
    out = dict(target or {})
    out["min"] = np.array(np.min(source["min"])).reshape(1)
    out["max"] = np.array(np.max(source["max"])).reshape(1)
    return out


def _sole_reader(graph: Graph, t: Tensor) -> Op | None:
    if graph.is_graph_output(t) or len(t.consumers) != 1:
        return None
    return t.consumers[0]


def _part_chain(graph: Graph, part: Tensor, join: Op) -> list[Tensor] | None:
    """The tensors from a requantizing op's output to `part` (a view chain only they read), or
    None when `part` is not written that way or is read elsewhere."""
    chain = [part]
    reader = join
    while True:
        t = chain[-1]
        if _sole_reader(graph, t) is not reader:
            return None
        producer = t.producer
        if producer is None:
            return None
        if producer.type in REQUANTIZING or producer.type == "CONCATENATION":
            return chain  # (a concatenation's own parts are handed the range in turn)
        if producer.type not in SAME_SCALE_VIEWS:
            return None
        reader = producer
        chain.append(producer.input(0))  # (a view's data input; its shape operand is constant)


def shared_ranges(graph: Graph, stats: Stats) -> tuple[dict[str, TensorStats], dict[str, str]]:
    """(statistics with the module docstring's ranges shared, {tensor: what changed}) for the
    calibration `stats` of `graph` (per-tensor {"min", "max"}; per-channel entries and tensors
    without statistics are left alone). The given statistics are not modified."""
    out: dict[str, TensorStats] = {k: dict(v) for k, v in stats.items()}
    changed: dict[str, str] = {}

    def usable(t: Tensor | None) -> bool:
        entry = out.get(t.name) if t is not None else None
        return entry is not None and np.size(entry["min"]) == 1 and np.size(entry["max"]) == 1

    for op in reversed(graph.ops):  # backward: a concatenation's range down to its parts
        if op.type != "CONCATENATION" or not usable(op.outputs[0]):
            continue
        whole = out[op.outputs[0].name]
        for part in op.inputs:
            chain = _part_chain(graph, part, op) if part is not None and usable(part) else None
            for t in chain or ():
                if usable(t):
                    out[t.name] = _entry_like(whole, out[t.name])
                    changed[t.name] = f"the range of {op.outputs[0].name!r}, which it is part of"
    for op in graph.ops:  # forward: a copy of a copy takes the first input's range
        x = op.inputs[0] if op.inputs else None
        if (
            is_exact_copy(op)
            and usable(x)
            and usable(op.outputs[0])
            and op.outputs[0].name not in changed
        ):
            assert x is not None
            out[op.outputs[0].name] = _entry_like(out[x.name], out[op.outputs[0].name])
            changed[op.outputs[0].name] = f"the range of {x.name!r}, which it copies exactly"
    _share_joined_copies(graph, out, changed)
    return out, changed


def _view_chain(t: Tensor) -> list[Tensor]:
    """`t` and the tensors before it through VIEWS: the last one is where its values start."""
    chain = [t]
    while chain[-1].producer is not None and chain[-1].producer.type in VIEWS:
        chain.append(chain[-1].producer.input(0))
    return chain


def _share_joined_copies(
    graph: Graph, out: dict[str, TensorStats], changed: dict[str, str]
) -> None:
    """Joins of copies of one tensor, and the views before them, take that tensor's range (the
    module docstring's third rule); `out` and `changed` updated in place."""
    source: dict[int, Tensor] = {}  # a join's output -> the tensor it copies
    for op in graph.ops:
        joined = [x for x in op.inputs if x is not None]
        if op.type != "CONCATENATION" or len(joined) < 2 or op.outputs[0].name not in out:
            continue
        copied = {id(source.get(id(x), x)) for x in joined}
        if len(copied) != 1:
            continue
        x = source.get(id(joined[0]), joined[0])
        chain = _view_chain(x)
        origin = chain[-1]
        fixed = FIXED_RANGES.get(origin.producer.type) if origin.producer is not None else None
        if fixed is not None:
            entry: TensorStats = {"min": np.array([fixed[0]]), "max": np.array([fixed[1]])}
        elif origin.name in out and np.size(out[origin.name]["min"]) == 1:
            entry = out[origin.name]
        else:
            continue
        for t in (*chain[:-1], op.outputs[0]):
            if t.name in out and np.size(out[t.name]["min"]) == 1:
                out[t.name] = _entry_like(entry, out[t.name])
                changed[t.name] = f"the range of {origin.name!r}, which it copies"
        source[id(op.outputs[0])] = x
