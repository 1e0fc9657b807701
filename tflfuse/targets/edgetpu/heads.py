"""Edge TPU legalization of detection, segmentation and pose heads: cut along the anchor axis.

A YOLOv8/11/26 head flattens each scale's NHWC map to channels-first rows [1, C, H W], joins the
scales along the anchors ([1, 84 | 116 | 144, 2100 | 8400]) and decodes every anchor on its own
(box distribution, class scores, mask coefficients, keypoints). The compiler refuses those tensors
for their size: two innermost dimensions over 176400 elements, a TRANSPOSE over 69696, a RESHAPE
over 408000 (`delegates/edgetpu.toml`: the compiler's own statuses on the YOLOv8 logs). Since each
anchor is computed on its own, the anchor axis can be cut into pieces under the limits: every op
of the head runs per piece, and the pieces are joined only where one tensor is needed (a model
output, or an op that reads every anchor at once). The function is the same bit for bit: each
piece op computes the same elements with the same parameters (the int8 graph: one scale for every
piece, as for `SplitOversizedTranspose`).

`ChunkHeadAlongAnchors` finds the head from its join (`HeadRegion`), chooses the pieces
(`piece_plan`), and asks the compiler's table for every op it would write
(`edgetpu_shape_refusal`) and the forms evidence (`tflfuse.targets.edgetpu.forms.gate`): it
fires only when no written op is refused. `PadChannelsForMean` is the other reduction the
heads and the NCHW exports of their backbones bring: a MEAN over an innermost axis whose size is
no multiple of 4, read padded with zeros and rescaled. No TensorFlow here.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from tflfuse.ir import Graph, Op, Quantization, Tensor
from tflfuse.rewrite import Builder, Match, OpPattern, PatternBuilder, Refusal, Rule, refuse
from tflfuse.rewrite.build import ELEMENTWISE_BINARY, Value
from tflfuse.rewrite.common import NotApplicable
from tflfuse.targets.capabilities import capability
from tflfuse.targets.edgetpu.forms import Verdict, gate
from tflfuse.targets.edgetpu.predict import cut_origins, edgetpu_shape_refusal
from tflfuse.targets.edgetpu.rules import (
    _gated,
    _kind,
    _kind_refusal,
    _pieces,
    _quant,
    _refusal_of,
    _scale_zp,
    _slice,
)

# ops that compute each element from the same element of their one input
_UNARY = frozenset(
    {"LOGISTIC", "TANH", "RELU", "RELU6", "RELU_N1_TO_1", "QUANTIZE", "ABS", "NEG",
     "EXP", "LOG", "SQRT", "RSQRT", "SQUARE", "HARD_SWISH", "LEAKY_RELU", "GELU", "ELU"}
)  # fmt: skip
_REDUCTIONS = frozenset({"MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN"})
_SHAPES = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS"})


# -- which axis an op keeps per anchor -------------------------------------------------------------
def _ints(t: Tensor | None) -> list[int] | None:
    if t is None or not t.is_constant or t.is_raw:
        return None
    return [int(v) for v in np.asarray(t.data).reshape(-1)]


def _reshaped_axis(src: tuple[int, ...], dst: tuple[int, ...], k: int) -> int | None:
    """The axis of `dst` that axis k of `src` becomes when a reshape keeps it whole, or merges it
    with the axes right after it (so a piece of whole rows stays one contiguous range): the
    elements before it and after it stay the same."""
    before = math.prod(src[:k])
    for j, d in enumerate(dst):
        if math.prod(dst[:j]) != before or d % src[k]:
            continue
        merged, m = src[k], k + 1
        while merged < d and m < len(src):
            merged, m = merged * src[m], m + 1
        if merged == d and math.prod(src[m:]) == math.prod(dst[j + 1 :]):
            return j
    return None


def _strided_slice_keeps(op: Op, k: int) -> bool:
    o = op.options
    if any(int(o.get(f, 0)) for f in ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask")):
        return False
    if o.get("offset"):
        return False
    begin, end, strides = (_ints(op.inputs[i]) for i in (1, 2, 3))
    if begin is None or end is None or strides is None or strides[k] != 1:
        return False
    size = _input(op, 0).shape[k]
    starts = int(o.get("begin_mask", 0)) >> k & 1 or begin[k] == 0
    ends = int(o.get("end_mask", 0)) >> k & 1 or end[k] >= size
    return bool(starts and ends)


def moved_axis(op: Op, index: int, k: int) -> int | None:
    """The axis of `op`'s output that axis k of input `index` lands on when the op computes each
    index along it on its own (an element-wise op, a layout op that keeps it whole, a slice or
    a reduction over other axes, a 1x1 convolution along it), else None."""
    x, t = op.inputs[index], op.type
    if len(op.outputs) != 1 or x is None:
        return None
    out = op.outputs[0]
    if t in _UNARY or (t == "SOFTMAX" and k != len(x.shape) - 1):
        return k
    if t in ELEMENTWISE_BINARY:
        return k + len(out.shape) - len(x.shape)
    if t == "TRANSPOSE":
        perm = _ints(op.inputs[1])
        return [p % len(x.shape) for p in perm].index(k) if perm else None
    if t in _SHAPES:
        return _reshaped_axis(x.shape, out.shape, k)
    if t == "SLICE":
        begin, size = _ints(op.inputs[1]), _ints(op.inputs[2])
        if begin is None or size is None:
            return None
        return k if size[k] in (-1, x.shape[k]) and begin[k] == 0 else None
    if t == "STRIDED_SLICE":
        return k if _strided_slice_keeps(op, k) else None
    if t == "CONCATENATION":
        return k if int(op.options.get("axis", 0)) % len(out.shape) != k else None
    if t in ("CONV_2D", "DEPTHWISE_CONV_2D") and index == 0 and k in (1, 2):
        w, stride = op.inputs[1], int(op.options.get(("stride_h", "stride_w")[k - 1], 1))
        return k if w is not None and w.shape[k] == 1 and stride == 1 else None
    if t in _REDUCTIONS:
        axes = _ints(op.inputs[1])
        axes = [a % len(x.shape) for a in axes] if axes is not None else None
        if axes is None or k in axes:
            return None
        return k if op.options.get("keep_dims") else k - sum(a < k for a in axes)
    return None


# -- the head: its ops, where each tensor sits on the anchor axis -------------------------------
@dataclass(frozen=True)
class Place:
    """Where a tensor lies on the anchor axis: its `axis`, the first anchor it holds (`offset`)
    and the anchors per index along the axis (`unit`: a row of an NHWC map holds W anchors)."""

    axis: int
    offset: int
    unit: int

    def span(self, t: Tensor) -> tuple[int, int]:
        return self.offset, self.offset + t.shape[self.axis] * self.unit


@dataclass
class HeadRegion:
    """The ops computed per anchor around a join (`ops`, graph order; `joins` among them only
    pass pieces on), each tensor's `Place`, the `sources` the pieces are sliced from (tensors
    the compiler computes whole), and the `boundary` tensors read whole (model outputs, or by
    an op that reads every anchor)."""

    graph: Graph
    places: dict[int, tuple[Tensor, Place]] = field(default_factory=dict)
    ops: dict[int, Op] = field(default_factory=dict)
    joins: set[int] = field(default_factory=set)
    sources: dict[int, Tensor] = field(default_factory=dict)
    boundary: list[Tensor] = field(default_factory=list)

    def place(self, t: Tensor) -> Place:
        return self.places[id(t)][1]

    def ordered_ops(self) -> list[Op]:
        return [op for op in self.graph.ops if id(op) in self.ops]

    def late(self) -> set[int]:
        """The tensors computed from a join's result (a join's output included): their pieces
        may span several scales; the tensors before every join hold one scale each."""
        found: set[int] = set()
        for op in self.ordered_ops():
            if id(op) in self.joins or any(t is not None and id(t) in found for t in op.inputs):
                found.update(id(t) for t in op.outputs)
        return found


def _data_inputs(op: Op) -> list[int]:
    return [i for i, t in enumerate(op.inputs) if t is not None and not t.is_constant]


def _input(op: Op, index: int) -> Tensor:
    """Input `index` of an op of the head, present: a data input, or an operand its type has."""
    return cast(Tensor, op.inputs[index])


def _inputs(op: Op) -> tuple[Tensor, ...]:
    """The inputs of a join or an element-wise op, none of them omitted."""
    return cast(tuple[Tensor, ...], op.inputs)


def _aligned_axis(op: Op, index: int, k_out: int) -> int | None:
    """The axis of input `index` (an operand of a binary op or a join along another axis) lined
    up with output axis k_out, or None when the operand is broadcast along it."""
    t = _input(op, index)
    if op.type == "CONCATENATION":
        return k_out
    j = k_out - (len(op.outputs[0].shape) - len(t.shape))
    return j if j >= 0 and t.shape[j] > 1 else None


def _claim(region: HeadRegion, t: Tensor, place: Place) -> str | None:
    """Put `t` in the head at `place`, walking back through the ops that compute it over the
    limits; None or why the head cannot be cut there."""
    known = region.places.get(id(t))
    if known is not None:
        return None if known[1] == place else f"{t.name!r} would lie at two places"
    region.places[id(t)] = (t, place)
    producer = t.producer
    if producer is None or id(producer) in region.ops:
        return None if producer is not None else _as_source(region, t)
    if edgetpu_shape_refusal(producer) is None and not _refused_right_above(producer):
        return _as_source(region, t)
    if producer.type == "CONCATENATION" and _is_join(producer, place.axis):
        region.ops[id(producer)] = producer
        region.joins.add(id(producer))
        offset = place.offset
        for u in _inputs(producer):
            why = _claim(region, u, Place(place.axis, offset, place.unit))
            if why:
                return why
            offset += u.shape[place.axis] * place.unit
        return None
    return _claim_producer(region, producer, place)


def _refused_right_above(op: Op) -> bool:
    """Whether `op` (mapped as it is) reads, through its one data input, an op the compiler
    refuses that computes each index along some axis on its own: the RESHAPE of a flattened
    map fits where the TRANSPOSE before it does not, so the head starts above both."""
    ins = _data_inputs(op)
    above = _input(op, ins[0]).producer if len(ins) == 1 else None
    if above is None or edgetpu_shape_refusal(above) is None or not above.outputs:
        return False
    x = above.inputs[_data_inputs(above)[0]] if len(_data_inputs(above)) == 1 else None
    return x is not None and any(moved_axis(above, list(above.inputs).index(x), k) is not None
                                 for k in range(len(x.shape)) if x.shape[k] > 1)  # fmt: skip


def _as_source(region: HeadRegion, t: Tensor) -> str | None:
    if t.is_constant:
        return f"{t.name!r} is a constant"
    region.sources[id(t)] = t
    return None


def _is_join(op: Op, k: int) -> bool:
    out = op.outputs[0]
    joined = int(op.options.get("axis", 0)) % len(out.shape) == k
    return joined and all(t is not None and not t.is_constant for t in op.inputs)


def _claim_producer(region: HeadRegion, op: Op, place: Place) -> str | None:
    """Walk back through `op` (refused as it is): each data input at the axis that lands on
    `place.axis`. An op that is not computed per anchor is not walked through: its result is
    sliced as it is (`_cut_refusal` then says whether that is worth it)."""
    out = op.outputs[0]
    claims = []
    for i in _data_inputs(op):
        x = _input(op, i)
        if op.type in ELEMENTWISE_BINARY and _aligned_axis(op, i, place.axis) is None:
            continue  # broadcast along the anchors: read whole
        axes = [
            k for k in range(len(x.shape)) if x.shape[k] > 1 and moved_axis(op, i, k) == place.axis
        ]
        factor, rest = divmod(out.shape[place.axis], x.shape[axes[0]]) if len(axes) == 1 else (0, 1)
        if rest:
            return _as_source(region, out)
        claims.append((x, Place(axes[0], place.offset, place.unit * factor)))
    region.ops[id(op)] = op
    for x, at in claims:
        why = _claim(region, x, at)
        if why:
            return why
    return None


def _inside(region: HeadRegion, t: Tensor | None) -> bool:
    """A tensor of the head that its ops compute (not a source they slice)."""
    return t is not None and id(t) in region.places and id(t) not in region.sources


def _take(region: HeadRegion, op: Op, tainted: set[int]) -> bool:
    """Put `op` in the head when it computes each anchor on its own from tensors of the head
    (its other operands: broadcast along the anchors, constants, or tensors the head can be
    walked back into); False leaves it reading what it reads whole."""
    ins = _data_inputs(op)
    placed = [i for i in ins if _inside(region, op.inputs[i])]
    # int8 or uint8 out (the edgetpu interface's uint8 output QUANTIZE maps), never float
    if not placed or len(op.outputs) != 1 or op.outputs[0].dtype not in ("INT8", "UINT8"):
        return False
    first = _input(op, placed[0])
    place = region.place(first)
    k = moved_axis(op, placed[0], place.axis)
    out = op.outputs[0]
    factor = out.shape[k] // first.shape[place.axis] if k is not None else 0
    if k is None or not factor or place.unit % factor or not _maps_in_pieces(op, k):
        return False
    here = Place(k, place.offset, place.unit // factor)
    saved = (dict(region.places), dict(region.ops), set(region.joins), dict(region.sources))
    region.ops[id(op)] = op
    for i in ins:
        if i == placed[0]:
            continue
        if op.type not in ELEMENTWISE_BINARY and op.type != "CONCATENATION":
            region.places, region.ops, region.joins, region.sources = saved
            return False
        u, j = _input(op, i), _aligned_axis(op, i, k)
        if j is None:
            continue  # broadcast along the anchors
        expected = Place(j, here.offset, here.unit)
        known = region.places.get(id(u))
        ok = known[1] == expected if known else id(u) not in tainted
        if ok and not known:
            ok = _claim(region, u, expected) is None
        if not ok:
            region.places, region.ops, region.joins, region.sources = saved
            return False
    region.places[id(out)] = (out, here)
    return True


def _maps_in_pieces(op: Op, k: int) -> bool:
    """Whether `op` could map once its output is cut to 2 along axis k (more than 3 non-trivial
    dimensions never maps however it is cut; a [1, 17, 3, N] keypoint tensor has three)."""
    out = op.outputs[0]
    shape = [2 if i == k else d for i, d in enumerate(out.shape)]
    return sum(d > 1 for d in shape) <= 3


def find_head(graph: Graph, join: Op) -> HeadRegion | Refusal:
    """The head around `join` (a CONCATENATION along the anchor axis of non-constant tensors,
    refused as it is), or why it cannot be cut: walked back from the join to tensors the
    compiler computes whole, then forward in graph order to every op computing each anchor on
    its own."""
    out = join.outputs[0]
    k = int(join.options.get("axis", 0)) % len(out.shape)
    region = HeadRegion(graph)
    why = _claim(region, out, Place(k, 0, 1))
    if why:
        return refuse(f"the head cannot be cut along its anchors: {why}")
    grew = True
    while grew:
        grew, tainted = False, set[int]()
        for op in graph.ops:
            if id(op) in region.ops:
                continue
            if _take(region, op, tainted):
                grew = True
            elif any(t is not None and (_inside(region, t) or id(t) in tainted)
                     for t in op.inputs):  # fmt: skip
                tainted.update(id(t) for t in op.outputs)
    for t, _ in list(region.places.values()):
        if id(t) in region.sources:
            continue
        outside = any(id(c) not in region.ops for c in t.consumers)
        if outside or graph.is_graph_output(t):
            region.boundary.append(t)
    size = out.shape[k]
    for t, place in region.places.values():
        if place.span(t)[1] > size or place.offset < 0:
            return refuse(f"{t.name!r} lies outside the {size} anchors of the join")
    return region


# -- the pieces -----------------------------------------------------------------------------------
def _piece_shape(region: HeadRegion, t: Tensor, a: int, b: int) -> tuple[int, ...]:
    place = region.place(t)
    return tuple((b - a) // place.unit if i == place.axis else d for i, d in enumerate(t.shape))


def _piece_start(region: HeadRegion, t: Tensor, a: int) -> int:
    place = region.place(t)
    return (a - place.offset) // place.unit


def _constant_piece(region: HeadRegion, op: Op, index: int, a: int, b: int) -> np.ndarray | None:
    """The constant input `index` of `op` for the piece [a, b): sliced where it runs along the
    anchors, rewritten where it states the shape or the extent (RESHAPE, SLICE, STRIDED_SLICE);
    None when it stays as it is."""
    t, out = _input(op, index), op.outputs[0]
    data = np.asarray(t.data)
    if op.type in _SHAPES and index == 1:
        return np.array(_piece_shape(region, out, a, b), np.int32)
    if op.type in ("SLICE", "STRIDED_SLICE") and index in (1, 2):
        x = _input(op, 0)
        k = region.place(x).axis
        if op.type == "SLICE" and index == 2 and data.reshape(-1)[k] == -1:
            return None
        edited = data.reshape(-1).copy()
        edited[k] = 0 if index == 1 else (b - a) // region.place(x).unit
        return edited.reshape(data.shape)
    if op.type in ELEMENTWISE_BINARY or op.type == "CONCATENATION":
        k = region.place(out).axis
        j = _aligned_axis(op, index, k)
        if j is None or t.is_raw:
            return None
        start = _piece_start(region, out, a)
        stop = start + (b - a) // region.place(out).unit
        return np.take(data, range(start, stop), axis=j)
    return None


def _scratch_op(region: HeadRegion, op: Op, a: int, b: int) -> Op:
    """`op` as one piece would compute it, in a scratch graph (the head's graph is not touched)."""
    g = Graph("scratch")
    ins: list[Tensor | None] = []
    for i, t in enumerate(op.inputs):
        if t is None:
            ins.append(None)
        elif id(t) in region.places:
            shape = _piece_shape(region, t, a, b)
            ins.append(g.add_tensor(f"in{i}", shape, t.dtype, quantization=t.quantization))
        elif t.is_constant:
            data = _constant_piece(region, op, i, a, b)
            data = np.asarray(t.data) if data is None else data
            ins.append(g.add_tensor(f"c{i}", data.shape, t.dtype, data, t.quantization))
        else:
            ins.append(g.add_tensor(f"in{i}", t.shape, t.dtype, quantization=t.quantization))
    out = op.outputs[0]
    shape = _piece_shape(region, out, a, b)
    written = g.add_tensor("out", shape, out.dtype, quantization=out.quantization)
    return g.add_op(op.type, ins, [written], dict(op.options))


def piece_refusal(region: HeadRegion, op: Op, a: int, b: int) -> str | None:
    """Why the compiler would refuse `op` computing the piece [a, b) of the anchors: the op
    table's limits, or a compiled model refusing its form at that size; None when neither."""
    piece = _scratch_op(region, op, a, b)
    why = edgetpu_shape_refusal(piece)
    if why:
        return f"{op.type} {list(piece.outputs[0].shape)}: {why}"
    verdict = gate(piece)
    return verdict.reason if verdict.answer == "refused" else None


def _segments(region: HeadRegion, size: int) -> list[tuple[int, int, int]] | Refusal:
    """The stretches of the anchors each piece must stay within (one source per tensor), with
    the granularity a piece must keep there (whole rows of an NHWC map)."""
    cuts = sorted({0, size, *(c for t, p in region.places.values() for c in p.span(t))})
    found = []
    for a, b in itertools.pairwise(cuts):
        units = [p.unit for t, p in region.places.values() if p.span(t)[0] <= a < p.span(t)[1]]
        step = math.lcm(*units) if units else 1
        if (b - a) % step:
            return refuse(f"anchors {a}..{b} do not cut into whole rows of {step}")
        found.append((a, b, step))
    return found


def _early_pieces(region: HeadRegion, size: int, late: set[int]) -> list[tuple[int, int]] | Refusal:
    """Consecutive pieces [a, b) of the anchors for the ops before the joins, as few as the
    compiler's limits allow: per stretch the largest piece every such op maps (the limits only
    bound sizes from above, so a bisection finds it), then the stretch cut into equal pieces of
    at most that size. The ops after the joins must map these pieces too."""
    segments = _segments(region, size)
    if isinstance(segments, Refusal):
        return segments
    pieces: list[tuple[int, int]] = []
    for a, b, step in segments:
        covering = [op for op in region.ordered_ops()
                    if id(op) not in region.joins and id(op.outputs[0]) not in late
                    and _covers(region, op.outputs[0], a, a + step)]  # fmt: skip
        low, high = 0, (b - a) // step
        while low < high:
            mid = (low + high + 1) // 2
            fits = _refusal_among(region, covering, a, a + mid * step) is None
            low, high = (mid, high) if fits else (low, mid - 1)
        if low == 0:
            why = _refusal_among(region, covering, a, a + step)
            return refuse(f"even the smallest piece would stay on the CPU: {why}")
        for units in _pieces((b - a) // step, -(-((b - a) // step) // low)):
            pieces.append((a, a + units * step))
            a += units * step
    return pieces


def _covers(region: HeadRegion, t: Tensor, a: int, e: int) -> bool:
    start, stop = region.place(t).span(t)
    return start <= a and e <= stop


def _refusal_among(region: HeadRegion, ops: list[Op], a: int, e: int) -> str | None:
    return next((w for op in ops if (w := piece_refusal(region, op, a, e))), None)


def _join_refusal(region: HeadRegion, early: list[tuple[int, int]], a: int, e: int) -> str | None:
    """Why a join of the early pieces within [a, e) (the start of a late piece) would not map."""
    for op in region.ops.values():
        if id(op) not in region.joins:
            continue
        out = op.outputs[0]
        parts = [p for p in early if a <= p[0] and p[1] <= e]
        if len(parts) < 2:
            continue
        g = Graph("scratch")
        ins = [
            g.add_tensor(f"in{i}", _piece_shape(region, out, pa, pe), out.dtype,
                         quantization=out.quantization)
            for i, (pa, pe) in enumerate(parts)
        ]  # fmt: skip
        joined = g.add_tensor("out", _piece_shape(region, out, a, e), out.dtype,
                              quantization=out.quantization)  # fmt: skip
        join = g.add_op("CONCATENATION", ins, [joined], dict(op.options))
        verdict = gate(join)
        why = edgetpu_shape_refusal(join) or (
            verdict.reason if verdict.answer == "refused" else None
        )
        if why:
            return why
    return None


def piece_plan(region: HeadRegion, size: int) -> tuple[list, list] | Refusal:
    """The early pieces (`_early_pieces`) and the late ones: consecutive early pieces joined
    while every op after the joins still maps the joined piece, and the join itself does, and
    no tensor those ops read begins or ends inside it (the box distribution's transpose allows
    about twice the anchors a 144-channel map's transpose does: half the ops after the join)."""
    late = region.late()
    early = _early_pieces(region, size, late)
    if isinstance(early, Refusal):
        return early
    after = [op for op in region.ordered_ops()
             if id(op) not in region.joins and id(op.outputs[0]) in late]  # fmt: skip
    read = [t for op in after for t in (*op.inputs, *op.outputs)]
    cuts = {c for t in read if t is not None and id(t) in region.places
            for c in region.place(t).span(t)}  # fmt: skip
    merged = [early[0]]
    for a, e in early[1:]:
        ga = merged[-1][0]
        fits = (
            a not in cuts
            and all(_covers(region, op.outputs[0], ga, e) for op in after)
            and _refusal_among(region, after, ga, e) is None
            and _join_refusal(region, early, ga, e) is None
        )
        merged[-1:] = [(ga, e)] if fits else [merged[-1], (a, e)]
    why = next((_refusal_among(region, after, a, e) for a, e in merged
                if _refusal_among(region, after, a, e)), None)  # fmt: skip
    if why:
        return refuse(f"a piece after the joins would stay on the CPU: {why}")
    return early, merged


# -- the rule --------------------------------------------------------------------------------------
@dataclass
class HeadPlan:
    """What `ChunkHeadAlongAnchors.check` found: the head and its pieces."""

    region: HeadRegion
    early: list[tuple[int, int]]  # the pieces of the tensors before the joins
    late: list[tuple[int, int]]  # the pieces of the tensors after (unions of early ones)


def _quantization_refusal(region: HeadRegion) -> Refusal | None:
    """Refused unless every tensor of the head is per-tensor int8/uint8 and every join keeps its
    inputs' parameters (the pieces bypass the join: a requantizing join would be lost)."""
    for t, _ in region.places.values():
        if _kind(t) != "int":
            return refuse(f"{t.name!r} is {t.dtype} with per-channel or no quantization")
    for op in region.ops.values():
        if id(op) in region.joins and not all(
            cast(Quantization, t.quantization).same_as(op.outputs[0].quantization)
            for t in _inputs(op)  # (every tensor of the region is int8: tested above)
        ):
            return refuse(f"the join {op.outputs[0].name!r} requantizes its inputs")
    return None


def _cut_refusal(region: HeadRegion) -> Refusal | None:
    """Refused when the head reads what a one-segment compile computes on the CPU after the
    segment (`tflfuse.targets.edgetpu.rules.after_the_cut`): its pieces would only add CPU work."""
    origins = cut_origins(region.graph)
    for op in region.ops.values():
        for t in op.inputs:
            if t is None or _inside(region, t) or id(t) not in origins:
                continue
            cut = region.graph.ops[origins[id(t)]]
            return refuse(
                f"{t.name!r} is computed on the CPU after the Edge TPU segment (cut at"
                f" {cut.type} {cut.outputs[0].name!r}): cut into pieces, the head would still"
                " run on the CPU, in more ops"
            )
    return None


class ChunkHeadAlongAnchors(Rule):
    """A head joined along its anchors over the compiler's limits  =>  every op of the head
    once per piece of the anchors, the pieces joined where one tensor is needed.

        CONCATENATION_anchors(RESHAPE(TRANSPOSE(x_i))) -> SLICE/RESHAPE/TRANSPOSE/SOFTMAX/
        CONV_2D/MUL/ADD/SUB/LOGISTIC/QUANTIZE/CONCATENATION_channels -> [1, 84, 8400]
      =>
        per piece p: the same ops on SLICE_rows(x_i)[p] (constants along the anchors sliced
        to p) -> [1, 84, n_p];  CONCATENATION_anchors(pieces) -> [1, 84, 8400]

    Each anchor of a YOLOv8/11/26 detect, seg or pose head is decoded on its own (`moved_axis`
    says, per op, which axis it computes index by index), so the anchor axis is cut into pieces
    under the compiler's limits (`piece_plan`: whole rows of each scale's NHWC map, each piece
    as large as every op before the joins still maps; after the joins, consecutive pieces joined
    again as far as every op there still maps, so a 640-pixel YOLOv8n decodes its anchors in 10
    pieces, not 19). Bit-exact on the int8 graph: every piece op
    keeps the parameters of the op it copies; the float graph is left to the quantized stage
    (quantizing the pieces separately could give each its own scale).

    The end: a model output such as [1, 84, 8400] holds 705600 elements in its two innermost
    dimensions, over the 176400 the compiler accepts (its own "otherwise supported" status on the
    [1, 84, 8400] CONCATENATION of the compiled YOLOv8n in edgetpu-more/MaxwellHogan; a [1, 84,
    2100] one is accepted). Whatever op writes that tensor stays on the CPU, and the output's
    layout is the model's interface (every YOLO decoder reads [1, C, N]); a RESHAPE back from a
    layout the compiler takes would write the same tensor, refused the same way. So the pieces
    are joined by one CONCATENATION on the CPU after the segment: one op, one crossing (the
    segment's outputs are the pieces, the same bytes the output holds), the least any layout
    that keeps the model's outputs allows. At 320 pixels ([1, 84, 2100]: 176400) that join maps.

    Forms no compiled model shows mapped at a piece's size stay undecided, not claimed: on the
    640-pixel YOLOv8n, 38 of the ops written (the box distribution's two transposes, perm
    (0, 2, 1, 3) and (0, 2, 3, 1), which no compiled model maps at any size; the flattening
    transposes, shown mapped only with NHWC rows of up to 2880 elements) are undecided, and a
    predictor asking the forms evidence counts them on the CPU on its less favourable reading
    (253/494 mapped there, 230/255 before; 493/494 on the other).

    Refused when an op it would write is refused by the op table (`edgetpu_shape_refusal`) or
    by a compiled model showing its form refused (`forms.gate`), when a piece op cannot map
    however small (more than 3 non-trivial dimensions: the head stops before it and joins
    there), and when the head reads what the CPU computes after the segment.
    """

    quantized_ok = True
    int8_error_steps = 0  # each piece computes the same elements with the same parameters

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.CONCATENATION()

    def check(self, m: Match) -> Refusal | HeadPlan:
        """A refusal, or the head and its pieces (the plan)."""
        op, out = m.root, m.root.output
        k = int(op.options.get("axis", 0)) % max(len(out.shape), 1)
        if len(out.shape) != 3 or k != 2 or len(op.inputs) < 2 or not _is_join(op, k):
            return NotApplicable("not a join of computed [1, C, N] rows along N")
        if op.fused_activation != "NONE":
            return refuse("the join has a fused activation")
        if _kind(out) != "int":
            return NotApplicable("float graph: cut after quantization, one scale for all pieces")
        if edgetpu_shape_refusal(op) is None:
            return NotApplicable("the join maps as it is")
        region = find_head(m.graph, op)
        if isinstance(region, Refusal):
            return region
        if all(id(o) in region.joins for o in region.ops.values()):
            return NotApplicable("the join only gathers tensors the compiler computes whole")
        why = _quantization_refusal(region) or _cut_refusal(region)
        if why:
            return why
        plan = piece_plan(region, out.shape[k])
        if isinstance(plan, Refusal):
            return plan
        if len(plan[0]) < 2:
            return NotApplicable("one piece: nothing to cut")
        return HeadPlan(region, *plan)

    def rewrite(self, m: Match, *, plan: HeadPlan) -> None:
        cutter = _Cutter(plan, Builder(m.graph, None, m.root.output.name))
        region = plan.region
        for n, op in enumerate(region.ordered_ops()):
            if id(op) not in region.joins:
                for a, e in cutter.pieces_of(op.outputs[0]):
                    cutter.values[(id(op.outputs[0]), a)] = _build_piece(cutter, op, (a, e), n)
        for t in region.boundary:
            parts = [cutter.value_of(t, a, e) for a, e in cutter.pieces_of(t)]
            _write_whole(cutter.b, t, parts, region.place(t).axis)
        cutter.b.commit(remove=region.ordered_ops())
        m.graph.toposort()


class _Cutter:
    """The rewrite's state: the plan, the builder, and each piece made so far."""

    def __init__(self, plan: HeadPlan, b: Builder) -> None:
        self.plan, self.b, self.region = plan, b, plan.region
        self.late = plan.region.late()
        self.values: dict[tuple[int, int], object] = {}

    def pieces_of(self, t: Tensor) -> list[tuple[int, int]]:
        pieces = self.plan.late if id(t) in self.late else self.plan.early
        return [(a, e) for a, e in pieces if _covers(self.region, t, a, e)]

    def value_of(self, t: Tensor, a: int, e: int):
        """The piece [a, e) of head tensor `t`: a slice of a source (made once), a join of its
        input's pieces, or what the piece op made."""
        key, region = (id(t), a), self.region
        if key not in self.values:
            if id(t) in region.sources:
                self.values[key] = self._slice(t, a, e)
            else:
                self.values[key] = self._join(t, a, e)
        return self.values[key]

    def _slice(self, t: Tensor, a: int, e: int):
        if self.region.place(t).span(t) == (a, e):
            return t
        begin = [0] * len(t.shape)
        begin[self.region.place(t).axis] = _piece_start(self.region, t, a)
        size = _piece_shape(self.region, t, a, e)
        return _slice(self.b, t, begin, size, f"{t.name}/anchors{a}", t.quantization)

    def _join(self, t: Tensor, a: int, e: int):
        join = cast(Op, t.producer)  # (a head tensor not read from a source is a join's)
        parts = [self.value_of(u, pa, pe) for u in _inputs(join)
                 for pa, pe in self.pieces_of(u) if a <= pa and pe <= e]  # fmt: skip
        if len(parts) == 1:
            return parts[0]
        shape, axis = _piece_shape(self.region, t, a, e), self.region.place(t).axis
        return self.b.CONCATENATION(*parts, name=f"anchors{a}/join", shape=shape,
                                    quant=t.quantization, axis=axis)  # fmt: skip


def _build_piece(cutter: _Cutter, op: Op, piece: tuple[int, int], n: int):
    a, e = piece
    b, region = cutter.b, cutter.region
    ins: list[Tensor | Value | None] = []
    for i, t in enumerate(op.inputs):
        if t is None:
            ins.append(None)
        elif id(t) in region.places:
            ins.append(cutter.value_of(t, a, e))
        elif t.is_constant and (data := _constant_piece(region, op, i, a, e)) is not None:
            ins.append(b.const(data, f"anchors{a}/op{n}/in{i}", t.dtype, t.quantization))
        else:
            ins.append(t)
    out = op.outputs[0]
    options = dict(op.options)
    if "new_shape" in options:
        options["new_shape"] = list(_piece_shape(region, out, a, e))
    return b.op(
        op.type, *ins, name=f"anchors{a}/op{n}", shape=_piece_shape(region, out, a, e),
        dtype=out.dtype, quant=out.quantization, version=op.version, options=options,
    )  # fmt: skip


def _write_whole(b: Builder, t: Tensor, parts: list, axis: int) -> None:
    """`t` written whole from its pieces: their join (one piece: the op that made it)."""
    if len(parts) > 1:
        b.op("CONCATENATION", *parts, out=t, axis=axis)
        return
    [part] = parts
    if isinstance(part, Tensor) or part.tensor is not None:
        b.op("RESHAPE", part, b.ints(t.shape, f"{t.name}/shape"), out=t)
        return
    part.tensor = t


# -- a MEAN over a channel count the compiler refuses ----------------------------------------------
def _channel_multiple() -> int:
    return int(capability("edgetpu")["ops"]["MEAN"].get("z_reduction_multiple", 1))


def form_verdict(op_type: str, ins: list[Tensor], out_shape, options, consts=()) -> Verdict:
    """`forms.gate` on the op a rule would write (a scratch op reading tensors like `ins` plus
    the constants `consts`, judged as quantized; the rule's own graph is not touched)."""
    g = Graph("scratch")
    inputs = [g.add_tensor(f"in{i}", t.shape, t.dtype, quantization=t.quantization)
              for i, t in enumerate(ins)]  # fmt: skip
    inputs += [g.add_constant(f"c{i}", np.asarray(c)) for i, c in enumerate(consts)]
    out = g.add_tensor("out", tuple(out_shape), ins[0].dtype)
    return gate(g.add_op(op_type, inputs, [out], dict(options or {})), as_quantized=True)


def _form_refusal(op_type: str, ins: list[Tensor], out_shape, options, consts) -> str | None:
    """Why a compiled model shows the form of the op a rule would write refused, or None
    (mapped, or undecided: no compiled model shows it, which the forms evidence reports, not
    this rule)."""
    verdict = form_verdict(op_type, ins, out_shape, options, consts)
    return verdict.reason if verdict.answer == "refused" else None


class PadChannelsForMean(Rule):
    """MEAN(x, axes including the innermost), x's innermost size C not a multiple of 4  =>
    MUL(MEAN(PAD(x, C -> C + p zeros), axes), (C + p) / C).

    The compiler maps a reduction over the innermost axis only when its size is a multiple of 4
    (delegates/edgetpu.toml [ops.MEAN] z_reduction_multiple): an NCHW tensor kept by an exporter
    reduces over W there (e.g. [1, C, 7, 7] in a squeeze-excite block). Zeros add nothing to the
    sum, so the mean over the padded axis is the mean times n / (n + n p / C) = C / (C + p), n the
    elements averaged; the MUL by (C + p) / C gives it back. Exact in float (two roundings of the
    last bit). int8: PAD writes the zero point (real 0); the MEAN of the padded tensor is
    quantized at the output's scale times C / (C + p) with its zero point, so its codes are those
    the MEAN would give, and the MUL by the constant (C + p) / C brings them to the output's
    scale: two requantizations, within two output steps.
    """

    quantized_ok = True
    int8_error_steps = 2  # the MEAN and the MUL each round once

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MEAN(p.x, p.const("axes"))

    @_gated
    def check(self, m: Match, *, x: Tensor, axes: Tensor) -> Refusal | int:
        """A refusal, or the number of zero channels to pad (the plan)."""
        out, multiple = m.root.output, _channel_multiple()
        last = len(x.shape) - 1
        reduced = sorted({int(a) % len(x.shape) for a in np.asarray(axes.data).reshape(-1)})
        if (
            len(x.shape) < 3
            or last not in reduced
            or multiple <= 1
            or x.shape[last] % multiple == 0
        ):
            return NotApplicable("the MEAN does not reduce an innermost axis the compiler refuses")
        refusal = _kind_refusal("MEAN", x, out)
        if refusal is not None:
            return refusal
        pad = -x.shape[last] % multiple
        padded = Tensor("padded", (*x.shape[:-1], x.shape[last] + pad), x.dtype)
        pads = np.zeros((len(x.shape), 2), np.int32)
        pads[last, 1] = pad
        for op_type, ins, shape, options, consts in (
            ("PAD", [x], padded.shape, {}, [pads]),
            ("MEAN", [padded], out.shape, m.root.options, [np.asarray(axes.data)]),
            ("MUL", [out], out.shape, {}, [np.ones(1, np.float32)]),
        ):
            why = _refusal_of(op_type, ins, shape, options, consts) or _form_refusal(
                op_type, ins, shape, options, consts
            )
            if why:
                return refuse(f"its {op_type} would stay on the CPU: {why}")
        return pad

    def rewrite(self, m: Match, *, x: Tensor, axes: Tensor, plan: int) -> None:
        out, pad = m.root.output, plan
        last = len(x.shape) - 1
        factor = (x.shape[last] + pad) / x.shape[last]
        b = m.builder()
        pads = np.zeros((len(x.shape), 2), np.int32)
        pads[last, 1] = pad
        padded = b.PAD(x, b.const(pads, "paddings", "INT32"), name="padded", like=x,
                       shape=(*x.shape[:-1], x.shape[last] + pad))  # fmt: skip
        quant = None
        if _kind(x) == "int":
            scale, zero = _scale_zp(out)
            quant = _quant(scale / factor, zero)
        mean = b.MEAN(padded, axes, name="mean", shape=out.shape, like=out, quant=quant,
                      options=m.root.options)  # fmt: skip
        b.replace(m.root, b.MUL(mean, b.scalar(factor, "rescale", like=x)))


HEAD_LEGALIZATION: tuple[Rule, ...] = (ChunkHeadAlongAnchors(), PadChannelsForMean())
