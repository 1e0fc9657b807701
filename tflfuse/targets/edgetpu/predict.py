"""The Edge TPU mapping predictor: which ops `edgetpu_compiler` maps, from `delegates/edgetpu.toml`.

`edgetpu_op_status` judges one op on its own for one compiler version, in the order the
compiler's logs show (output data type, then op type, then inputs, shapes and the row's
constraints); `predict_edgetpu` places every op of the main subgraph for a one-segment compile
(an op maps when it can and nothing it reads comes from an op left on the CPU: the cut follows the
data flow; float I/O conversions stay outside without cutting) or, with `multiple_subgraphs`, for
`edgetpu_compiler -a` (every mappable op maps; segments are TFLite's delegate partitioning of them).
The evidence for each rule is cited in the table's semantics block and rows; the predictor is
scored on real compiled pairs by `benchmarks/edgetpu_oracle_score.py` (see
`tflfuse.targets.edgetpu.truth`).
`tflfuse.targets` re-exports the public names. No TensorFlow here.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from tflfuse.ir import Graph, Model, Op, Tensor
from tflfuse.targets.capabilities import (
    FLOAT_TYPES,
    CapabilityTable,
    OpPrediction,
    OtherReading,
    Prediction,
    _activations,
    _axes,
    _const_ints,
    capability,
    op_label,
)
from tflfuse.targets.edgetpu.forms import FormTable, form_of, gate, gated, load_table
from tflfuse.targets.edgetpu.memory import predicted_memory

_RowCheck = Callable[[Op, dict[str, Any]], str | None]  # a table row's constraint, checked


def _check_pool_plane(op: Op, row: dict[str, Any]) -> str | None:
    limit = row.get("max_pool_plane")
    if limit is None:
        return None
    if op.type == "AVERAGE_POOL_2D":
        plane = int(op.options.get("filter_height", 1)) * int(op.options.get("filter_width", 1))
    else:
        axes = _axes(op) or []
        shape = op.input(0).shape  # the reduction's input
        plane = int(np.prod([shape[a] for a in axes if a not in (0, len(shape) - 1)] or [1]))
    if plane > limit:
        return f"averages a {plane}-pixel plane, more than the {limit} the compiler maps"
    return None


def _check_reduction(op: Op, row: dict[str, Any]) -> str | None:
    if op.type not in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN"):
        return None
    axes = _axes(op)
    if axes is None:
        return "reduction axes are not a constant"
    shape = op.input(0).shape
    if row.get("no_batch_reduction") and 0 in axes and len(shape) == 4 and shape[0] > 1:
        return "reduces over the batch dimension"
    multiple = row.get("z_reduction_multiple")
    last = len(shape) - 1
    if multiple and last in axes and len(shape) >= 3 and shape[last] % multiple:
        return f"reduces over {shape[last]} channels, not a multiple of {multiple}"
    return None


def _check_concat(op: Op, row: dict[str, Any]) -> str | None:
    if not row.get("constant_input_rule"):
        return None
    consts = [t for t in op.inputs if t is not None and t.is_constant]
    if not consts:
        return None
    if len(op.inputs) != 2:
        return "a constant input is allowed only when there are exactly 2 inputs"
    for t in consts:
        zero = 0
        q = t.quantization
        if t.is_quantized and q is not None and q.zero_point is not None:
            zero = int(np.asarray(q.zero_point).reshape(-1)[0])
        if t.is_raw or not np.all(np.asarray(t.data) == zero):
            return "its constant input is not all zeros"
    return None


def _check_pad(op: Op, row: dict[str, Any]) -> str | None:
    if not row.get("no_batch_padding"):
        return None
    pads = _const_ints(op.inputs[1] if len(op.inputs) > 1 else None)
    if pads is None:
        return "paddings are not a constant"
    if len(pads) >= 2 and (pads[0] or pads[1]):
        return "pads the batch dimension"
    return None


def _check_moved_elements(op: Op, row: dict[str, Any]) -> str | None:
    """TRANSPOSE and RESHAPE limits are a property of the tensor they move: its element count
    (see those rows for the evidence, and for what it cannot decide)."""
    limit = row.get("max_elements")
    x = op.inputs[0] if op.inputs else None
    if op.type not in ("TRANSPOSE", "RESHAPE") or not limit or x is None or x.size <= limit:
        return None
    how = f"transposes {list(x.shape)}" if op.type == "TRANSPOSE" else f"reshapes {list(x.shape)}"
    if op.type == "TRANSPOSE":
        how += f" (perm {_const_ints(op.inputs[1] if len(op.inputs) > 1 else None)})"
    return f"{how}: {x.size} elements, more than the {limit} of the largest seen mapped"


def _check_resize(op: Op, row: dict[str, Any]) -> str | None:
    if not row.get("integer_scale"):
        return None
    src, dst = op.input(0).shape, op.outputs[0].shape  # RESIZE_*(x, size)
    if len(src) != 4 or len(dst) != 4:
        return "input/output is not an image tensor"
    align = bool(op.options.get("align_corners", False))
    for n_in, n_out in ((src[1], dst[1]), (src[2], dst[2])):
        if n_in == n_out:
            continue
        if align:
            if n_in <= 1 or (n_out - 1) % (n_in - 1):
                return (
                    f"align_corners resize {n_in} -> {n_out} has no integer scale"
                    " (the compiler refuses it to avoid loss in precision)"
                )
        elif n_out % n_in:
            return f"resize {n_in} -> {n_out} has no integer scale"
    limit = row.get("max_output_plane")
    if limit and dst[1] * dst[2] > limit:
        return f"output plane {dst[1]}x{dst[2]} is larger than the compiler maps ({limit} px)"
    return None


def _check_fc(op: Op, row: dict[str, Any]) -> str | None:
    default_format = op.options.get("weights_format", 0) in (0, "DEFAULT")
    if row.get("default_weights_only") and not default_format:
        return "weights are not in the default format"
    return None


def _check_prelu(op: Op, row: dict[str, Any]) -> str | None:
    if op.type != "PRELU" or len(op.inputs) < 2 or op.inputs[1] is None:
        return None
    if any(d > 1 for d in op.inputs[1].shape[:-1]):
        return "alpha varies along more than the channel dimension"
    return None


def _check_pack(op: Op, row: dict[str, Any]) -> str | None:
    """No packing along the batch dimension: dimension 0 of a 4-D (NHWC) output. Packing along
    dimension 0 of a rank <= 3 output maps (see the PACK row)."""
    axis = int(op.options.get("axis", 0))
    if row.get("no_batch_axis") and len(op.outputs[0].shape) == 4 and axis % 4 == 0:
        return "packs along the batch dimension"
    return None


def _check_split(op: Op, row: dict[str, Any]) -> str | None:
    if op.type != "SPLIT" or not row.get("no_first_axis_split") or len(op.inputs) < 2:
        return None
    axis = _const_ints(op.inputs[0])
    data = op.inputs[1]
    if axis is None or data is None or not data.shape:
        return None
    if axis[0] % len(data.shape) == 0 and data.shape[0] > 1:
        return f"splits {list(data.shape)} along its first dimension"
    return None


_EDGETPU_CHECKS: tuple[tuple[_RowCheck, str], ...] = (
    (_check_pool_plane, "limitation"),
    (_check_reduction, "limitation"),
    (_check_concat, "limitation"),
    (_check_pad, "limitation"),
    (_check_moved_elements, "limitation"),
    (_check_resize, "limitation"),
    (_check_fc, "limitation"),
    (_check_prelu, "limitation"),
    (_check_pack, "limitation"),
    (_check_split, "first_dimension"),
)


def _row_elements(t: Tensor) -> int:
    """Elements in the two innermost dimensions (x * z of the compiler's y, x, z layout)."""
    shape = list(t.shape)
    return int(np.prod(shape[-2:])) if shape else 1


def _edgetpu_dynamic(t: Tensor) -> bool:
    """A shape the compiler cannot fix at compile time. A -1 batch in `shape_signature` (every
    Keras export) is not dynamic to it: it compiles `shape` (see [meta] in edgetpu.toml)."""
    if any(d <= 0 for d in t.shape):
        return True
    sig = t.shape_signature
    return sig is not None and any(d < 0 for d in sig[1:])


def compiler_version_key(text: str) -> tuple[int, int]:
    """'16.0.384591198' / '16' / '15.0' -> (major, minor), the part the table's rows compare."""
    major, minor = [*(int(p) for p in re.findall(r"\d+", text)[:2]), 0, 0][:2]
    return major, minor


def default_compiler_version(table: CapabilityTable | None = None) -> str:
    """The compiler the table describes unless told otherwise (its [meta] compiler_version)."""
    return str((table or capability("edgetpu"))["meta"]["compiler_version"])


def edgetpu_op_status(
    op: Op, table: CapabilityTable | None = None, compiler_version: str | None = None
) -> tuple[str, str]:
    """(status key, reason) for one op on its own: "mapped" or why not (keys of [status]).

    The order of the checks is the compiler's, as its logs show (see the semantics block of
    `delegates/edgetpu.toml`): an activation with a dimension > 1 outside its 3 innermost is an
    "unsupported rank" (`_outer_dimension`); an op writing a tensor that is not int8/uint8 is
    "working on an unsupported data type" whatever its type, a custom op included; otherwise a
    custom op or an op outside the table is "not supported"; then the compiler version (ops and
    op versions it has), inputs, shapes and the row's constraints. `compiler_version` defaults
    to the table's (16.0).
    """
    table = table or capability("edgetpu")
    version = compiler_version_key(compiler_version or default_compiler_version(table))
    meta = table["meta"]
    acts, consts = set(meta["activation_types"]), set(meta["constant_types"])
    states = set(meta["state_types"])
    outer = _outer_dimension(op)
    if outer is not None:
        return "rank", (
            f"tensor {outer.name!r} {list(outer.shape)} has a dimension > 1 outside its 3"
            " innermost (only those are mapped)"
        )
    for y in op.outputs:
        if y is not None and not y.is_constant and y.dtype not in acts:
            return "data_type", f"writes {y.dtype} tensor {y.name!r} (the Edge TPU computes int8)"
    if op.type == "CUSTOM":
        return "unsupported", f"{op_label(op)} is a custom op, which the compiler does not map"
    row = table["ops"].get(op.type)
    if row is None:
        return "unsupported", f"{op_label(op)} is not in the Edge TPU op table"
    since = row.get("since")
    if since and compiler_version_key(since) > version:
        return "unsupported", f"{op_label(op)} needs edgetpu_compiler {since} or later"
    for t in op.inputs:
        if t is None:
            continue
        if t.is_variable:
            ok = t.dtype in states
        elif t.is_constant:
            ok = t.dtype in consts
        else:
            ok = t.dtype in acts
        if ok:
            continue
        if not t.is_constant and row.get("float_input") == "limitation":
            return "limitation", f"reads {t.dtype} tensor {t.name!r}: it stays on the CPU"
        kind = "constant" if t.is_constant else "tensor"
        return "data_type", f"{kind} {t.name!r} is {t.dtype} (the Edge TPU runs int8 only)"
    refusal = _tensor_limits(op, row, meta)
    if refusal:
        return refusal
    half_pixel_since = row.get("half_pixel_centers_since")
    if (
        half_pixel_since
        and op.options.get("half_pixel_centers")
        and compiler_version_key(half_pixel_since) > version
    ):
        return "version", (
            f"half_pixel_centers makes this op version 3, which edgetpu_compiler maps only"
            f" from {half_pixel_since} on"
        )
    return _row_limits(op, row) or ("mapped", "in the op table; types, shapes and limits hold")


# The operand a convolution reads its filter [O, kh, kw, I] from: not an activation the compiler
# lays out as (y, x, z), so the rank check (`_outer_dimension`) passes it by.
_FILTER_OPERAND = {"CONV_2D": 1, "TRANSPOSE_CONV": 1}
_INNER_DIMS = 3  # the dimensions the compiler maps (y, x, z); any outside them must be 1


def _outer_dimension(op: Op) -> Tensor | None:
    """The first activation of `op` with a dimension > 1 outside its 3 innermost (Coral's model
    requirements: "only the 3 innermost dimensions may have a size greater than 1"), a
    convolution's filter operand excepted; None when there is none.

    The compiler's log says "Tensor has unsupported rank (up to 3 innermost dimensions mapped)"
    of such an op, and says it before the op's data type: in ml-const/edgeTPU's fp16 YOLOv5n-seg
    log (tflite_fp32/5nano_seg-fp16_edgetpu.log, compiler 16.0.384591198), the 60 DEQUANTIZE
    writing float32 [O, kh, kw, I] filters (O > 1) get it, its other 71 DEQUANTIZE (rank 0 to 2,
    and rank 4 of outer dimension 1: [1, 6400, 1, 2]) the data type, and the 60 CONV_2D reading
    those computed filters the data type too (the filter is no activation to it). No other log
    at hand has an op with such a tensor (the score's status strings)."""
    skip = _FILTER_OPERAND.get(op.type)
    tensors = [t for i, t in enumerate(op.inputs) if i != skip] + list(op.outputs)
    for t in tensors:
        if t is not None and not t.is_constant and any(d > 1 for d in t.shape[:-_INNER_DIMS]):
            return t
    return None


def _tensor_limits(op: Op, row: dict[str, Any], meta: dict[str, Any]) -> tuple[str, str] | None:
    """The limits every op's tensors obey (static, at most 3 dimensions > 1, the two innermost
    dimensions' size) and the row's fused activations."""
    for t in _activations(op):
        if _edgetpu_dynamic(t):
            return "limitation", f"tensor {t.name!r} has a dynamic shape"
        big = [d for d in t.shape if d > 1]
        if len(big) > meta["max_nontrivial_dims"]:
            return "limitation", f"tensor {t.name!r} {list(t.shape)} has more than 3 dimensions > 1"
        inner, inner_limit = _row_elements(t), meta.get("max_row_elements")
        if inner_limit and inner > inner_limit:
            return "limitation", (
                f"tensor {t.name!r} {list(t.shape)}: its two innermost dimensions hold {inner}"
                f" elements, more than the {inner_limit} seen accepted"
            )
    if "fused_activation_function" in op.options:
        allowed = row.get("fused_activations", meta["default_fused_activations"])
        if op.fused_activation not in allowed:
            return "limitation", f"fused activation {op.fused_activation} is not allowed here"
    return None


def _row_limits(op: Op, row: dict[str, Any]) -> tuple[str, str] | None:
    """The op's own row's constraints (`_EDGETPU_CHECKS`)."""
    for check, key in _EDGETPU_CHECKS:
        reason = check(op, row)
        if reason:
            return key, reason
    return None


def edgetpu_shape_refusal(op: Op, table: CapabilityTable | None = None) -> str | None:
    """Why the compiler would refuse `op` for its type, shapes and constants alone, whatever its
    data types, or None: what a legalization can ask of an op it writes into a float graph that
    is quantized afterwards (quantization keeps every shape)."""
    table = table or capability("edgetpu")
    if op.type == "CUSTOM":
        return f"{op_label(op)} is a custom op"
    row = table["ops"].get(op.type)
    if row is None:
        return f"{op.type} is not in the Edge TPU op table"
    outer = _outer_dimension(op)
    if outer is not None:
        return (
            f"tensor {outer.name!r} {list(outer.shape)} has a dimension > 1 outside its 3 innermost"
        )
    refusal = _tensor_limits(op, row, table["meta"]) or _row_limits(op, row)
    return refusal[1] if refusal else None


def _boundary_cpu(op: Op, graph: Graph, status: str) -> bool:
    """A DEQUANTIZE writing a model output: it stays on the CPU (float output) and cuts nothing.
    (Ops before the segment, like the float -> int8 QUANTIZE of an input, are `_single_segment`'s
    "before the segment" case.)"""
    if op.type == "DEQUANTIZE" and status in ("data_type", "rank"):
        return all(graph.is_graph_output(t) for t in op.outputs)
    return False


def edgetpu_statuses(model: Model, compiler_version: str | None = None) -> list[tuple[str, str]]:
    """(status key, reason) of every op of the main subgraph on its own, for one compiler."""
    table = capability("edgetpu")
    return [edgetpu_op_status(op, table, compiler_version) for op in model.main.ops]


def _single_segment(
    graph: Graph,
    statuses: list[tuple[str, str]],
    *,
    left_ahead: frozenset[int] = frozenset(),
    front_cuts: frozenset[int] = frozenset(),
) -> tuple[list[bool], dict[int, int], dict[int, int]]:
    """The default compiler (one Edge TPU subgraph). The segment may read what the CPU computes
    before it (a float -> int8 QUANTIZE of an input, a CAST before it) but not what the CPU
    computes from the segment's own outputs, which would need a second segment. So an op maps
    when its own status is "mapped" and nothing it reads was computed on the CPU from the
    segment; an op left on the CPU after the segment cuts every op that depends on it, and ops
    that do not depend on it still map (the data flow decides, not the execution order: see the
    semantics block of edgetpu.toml).

    The two keyword sets place ops the other way round for the reading of the compiler that the
    evidence leaves open (`_other_readings`): `left_ahead` are mappable ops kept on the CPU ahead
    of the segment, `front_cuts` are refused ops ahead of the segment that cut what depends on
    them.

    Returns (mapped per op, {index of a mappable op left on the CPU: index of the op that cut it,
    the earliest one it depends on}, {id of a tensor the CPU computes after the segment: index of
    the op that cut it})."""
    mapped = [False] * len(graph.ops)
    cut_by: dict[int, int] = {}
    after: dict[int, int] = {}  # id(tensor the CPU computes after the segment) -> cutting op
    segment: set[int] = set()  # id(tensors the segment writes)
    for index, (op, (key, _)) in enumerate(zip(graph.ops, statuses)):
        reads = [t for t in op.inputs if t is not None]
        roots = [after[id(t)] for t in reads if id(t) in after]
        if key == "mapped" and not roots and index not in left_ahead:
            mapped[index] = True
            segment.update(id(t) for t in op.outputs if t is not None)
            continue
        if roots:
            cut_by[index] = min(roots)
        elif index in front_cuts:
            pass  # the other reading: a refused op ahead of the segment cuts its dependents
        elif not any(id(t) in segment for t in reads) or _boundary_cpu(op, graph, key):
            continue  # computed before the segment (or a float output): cuts nothing
        origin = cut_by.get(index, index)
        for t in op.outputs:
            if t is not None:
                after[id(t)] = origin
    return mapped, cut_by, after


def _io_conversion(op: Op, key: str) -> bool:
    """An op the compiler leaves on the CPU for its data type: it reads or writes a type that is
    not int8/uint8 (CAST, DEQUANTIZE, int32 shape arithmetic), or it is a float -> int8 QUANTIZE.
    Hundreds of compiled models keep such ops ahead of their segment without a cut."""
    if key == "data_type" or (key == "rank" and _other_type(op)):
        return True
    x = op.inputs[0] if op.inputs else None
    return op.type == "QUANTIZE" and x is not None and x.dtype in FLOAT_TYPES


def _other_type(op: Op) -> bool:
    """Whether `op` reads or writes an activation that is not int8/uint8 (an op refused for its
    rank first, `_outer_dimension`, that the data type refuses as well)."""
    return any(t.dtype not in ("INT8", "UINT8") for t in _activations(op))


def _input_requantization(op: Op, graph: Graph) -> bool:
    """A QUANTIZE that reads a model input (uint8 -> int8, the edgetpu interface)."""
    x = op.inputs[0] if op.inputs else None
    return op.type == "QUANTIZE" and x is not None and any(x is t for t in graph.inputs)


def _front_refusals(
    graph: Graph, statuses: list[tuple[str, str]], mapped: list[bool]
) -> list[tuple[int, list[int]]]:
    """Ops the compiler refuses for a reason other than their data type that come ahead of
    every op of the segment they depend on, except input requantizations: (index of the
    refused op, indices of the mapped input requantizations it reads through). What the compiler
    does with them is the question the evidence leaves open (header of edgetpu.toml); only ops
    with something mappable depending on them are listed, since only there does it matter."""
    index = {id(op): i for i, op in enumerate(graph.ops)}

    def producers(i: int) -> list[int]:
        found = (index.get(id(t.producer)) for t in graph.ops[i].inputs if t is not None)
        return [j for j in found if j is not None]

    consumers: dict[int, list[int]] = {}
    for i in range(len(graph.ops)):
        for j in producers(i):
            consumers.setdefault(j, []).append(i)
    refused = {
        i
        for i, (op, (key, _)) in enumerate(zip(graph.ops, statuses))
        if key != "mapped" and not _io_conversion(op, key)
    }
    found = []
    for i in sorted(refused):
        ancestors, stack = set(), producers(i)
        while stack:
            j = stack.pop()
            if j not in ancestors:
                ancestors.add(j)
                stack.extend(producers(j))
        ahead = sorted(j for j in ancestors if mapped[j])
        if any(not _input_requantization(graph.ops[j], graph) for j in ahead):
            continue  # it reads the segment's work: the cut the compiled models show
        if ancestors & refused:
            continue  # another refused op comes first: that one is the question
        stack, below = list(consumers.get(i, [])), set()
        while stack:
            j = stack.pop()
            if j not in below:
                below.add(j)
                stack.extend(consumers.get(j, []))
        if any(statuses[j][0] == "mapped" for j in below):
            found.append((i, ahead))
    return found


def _refused(graph: Graph, indices: list[int], statuses: list[tuple[str, str]]) -> str:
    """`op 1 TRANSPOSE (why) is refused`, or the first with `and 5 more ops like it are refused`
    (the sentence stays short when an export computes its anchor grids with a dozen)."""
    first, more = indices[0], len(indices) - 1
    text = f"op {first} {op_label(graph.ops[first])} ({statuses[first][1]})"
    return text + (f" and {more} more op{'s' * (more > 1)} are refused" if more else " is refused")


def _other_readings(
    graph: Graph, statuses: list[tuple[str, str]], mapped: list[bool]
) -> list[OtherReading]:
    """The front refusals (`_front_refusals`) under the reading tflfuse does not predict: the
    mapped count, and a sentence saying which reading is which. At most two readings: one for
    the refusals right after an input requantization, one for those ahead of every mapped op
    (each applied to all refusals of its kind at once; they move the count opposite ways).

    tflfuse predicts what the compiled models show everywhere else: the segment starts at the
    first op the compiler maps. So a refused op after an input requantization cuts (the
    requantization maps, alone); the other reading leaves the requantization on the CPU too and
    starts the segment after the refused op. A refused op with nothing mapped before it stays
    ahead of the segment, as a leading float QUANTIZE or CAST does; the other reading is
    Coral's documented rule, under which it cuts everything that depends on it."""
    found = _front_refusals(graph, statuses, mapped)
    n, now = len(graph.ops), sum(mapped)
    undecided = "undecided by the evidence (delegates/edgetpu.toml)"
    readings = []
    after = [i for i, ahead in found if ahead]
    if after:
        ahead = sorted({j for _, js in found for j in js})
        other = sum(_single_segment(graph, statuses, left_ahead=frozenset(ahead))[0])
        quantize = ", ".join(f"op {j} QUANTIZE" for j in ahead)
        text = (
            f"{_refused(graph, after, statuses)} right after the input's requantization"
            f" ({quantize}): predicted as the compiled models show a refusal after the first op"
            f" the compiler maps, a cut ({now}/{n} mapped); if the compiler instead left"
            f" {quantize} on the CPU too and started its segment after the refused op,"
            f" {other}/{n} would map. No compiled model shows a refusal this close to the"
            f" input: {undecided}"
        )
        readings.append(OtherReading(after, other, text))
    first = [i for i, ahead in found if not ahead]
    if first:
        other = sum(_single_segment(graph, statuses, front_cuts=frozenset(first))[0])
        text = (
            f"{_refused(graph, first, statuses)} with nothing mapped ahead (reading only"
            " inputs, constants or CPU ops ahead of the segment): predicted on the CPU ahead"
            f" of the segment, cutting nothing, as a leading float QUANTIZE or CAST does"
            f" ({now}/{n} mapped); if such an op cut everything that depends on it, as Coral's"
            f" documentation says of an unsupported op, {other}/{n} would map. No compiled"
            f" model shows an op refused there for a reason other than its data type: {undecided}"
        )
        readings.append(OtherReading(first, other, text))
    return [r for r in readings if r.mapped != now]


def statuses_once_quantized(
    graph: Graph, compiler_version: str | None = None
) -> list[tuple[str, str]]:
    """Each op's own status (`edgetpu_op_status`), and on a float graph the status it will have
    once quantized: the `edgetpu` recipe legalizes in float and quantizes afterwards, which keeps
    every shape, so a float op is judged on its type, shapes and constants
    (`edgetpu_shape_refusal`); ops on types quantization keeps (int32 shape arithmetic, bool)
    keep their data-type status."""
    table = capability("edgetpu")
    acts = [t for op in graph.ops for t in (*op.inputs, *op.outputs) if t and not t.is_constant]
    quantized = any(t.dtype in ("INT8", "UINT8") for t in acts)
    statuses = []
    for op in graph.ops:
        key = (_op_key(op), quantized, compiler_version)
        known = _STATUS_MEMO.get(op)
        if known is not None and known[0] == key:
            statuses.append(known[1])
            continue
        types = {t.dtype for t in (*op.inputs, *op.outputs) if t and not t.is_constant}
        if quantized or not types & FLOAT_TYPES or types - FLOAT_TYPES - {"INT8", "UINT8"}:
            status = edgetpu_op_status(op, table, compiler_version)
        else:
            refusal = edgetpu_shape_refusal(op, table)
            status = ("mapped", "") if refusal is None else ("limitation", refusal)
        _STATUS_MEMO[op] = (key, status)
        statuses.append(status)
    return statuses


# An op's status depends only on the op and its tensors: kept per op while they stay the same
# (the legalization asks the whole graph's statuses after each rewrite, `after_the_cut`, and a
# rewrite changes a few ops of hundreds).
_STATUS_MEMO: weakref.WeakKeyDictionary[Op, tuple[tuple, tuple[str, str]]] = (
    weakref.WeakKeyDictionary()
)


def _tensor_key(t: Tensor | None) -> tuple:
    if t is None:
        return ()
    data = t.data
    # small constants (perms, axes, paddings, sizes) by value: a row's check reads them
    values = data.tobytes() if data is not None and data.size <= 64 else id(data)
    return (id(t), t.name, t.shape, t.dtype, values, t.is_variable, id(t.quantization))


def _op_key(op: Op) -> tuple:
    """What an op's status is computed from: its type, version and options, and its tensors
    (each by identity, name, shape, type, small constants' values, and data and quantization
    objects)."""
    tensors = tuple(_tensor_key(t) for t in (*op.inputs, *op.outputs))
    return (op.type, op.version, op.custom_code, repr(op.options), tensors)


def cut_origins(
    graph: Graph,
    compiler_version: str | None = None,
    lifted: Callable[[Op], bool] | None = None,
) -> dict[int, int]:
    """{id of a tensor a one-segment compile computes on the CPU from the segment's outputs:
    index of the refused op that cut it}, on the graph as it is (a float graph judged as it
    will be once quantized). An op reading such a tensor can never map, whatever is done to the
    op itself: a legalization there only adds CPU work (`tflfuse.targets.edgetpu.rules`).
    `lifted(op)`: a refused op the quantized stage's legalization makes mapped, counted mapped."""
    statuses = statuses_once_quantized(graph, compiler_version)
    if lifted is not None:
        statuses = [
            ("mapped", "") if key != "mapped" and lifted(op) else (key, why)
            for op, (key, why) in zip(graph.ops, statuses)
        ]
    return _single_segment(graph, statuses)[2]


def _segments(graph: Graph, mapped: list[bool]) -> int:
    """Edge TPU segments of an `-a` compile: the delegated node subsets of TFLite's delegate
    partitioning, which the compiler runs inside (its "Restored original execution plan after
    delegate application failure" is the interpreter's message). Subsets alternate between
    mapped and CPU ops; each takes, in execution order and until none is left, every op of its
    kind whose inputs are ready. So mapped ops that a CPU op separates on some path land in
    different segments even when a tensor joins them directly (one custom op holding both would
    wait on itself: deeplab's pooling branch, attention blocks around a CPU BATCH_MATMUL), and
    independent mapped ops ready together share one. Exact on the 18 twins compiled with -a, as
    the connected groups of mapped ops were (they differ only where such a cycle exists)."""
    ready = {id(t) for t in graph.inputs}
    ready.update(
        id(t)
        for op in graph.ops
        for t in op.inputs
        if t is not None and (t.is_constant or t.producer is None)
    )
    left = set(range(len(graph.ops)))
    segments = 0
    while left:
        kind: bool | None = None
        taken = True
        while taken:
            taken = False
            for i in sorted(left):
                op = graph.ops[i]
                if any(t is not None and id(t) not in ready for t in op.inputs):
                    continue
                kind = mapped[i] if kind is None else kind
                if mapped[i] != kind:
                    continue
                left.discard(i)
                ready.update(id(t) for t in op.outputs if t is not None)
                taken = True
        if kind is None:
            break  # ops whose inputs never become ready (not a valid graph)
        segments += int(kind)
    return segments


UNDECIDED = "undecided:"  # how a gated op's reason starts when no compiled model shows its form


def gate_statuses(
    graph: Graph, statuses: list[tuple[str, str]], table: FormTable | None = None
) -> tuple[list[tuple[str, str]], list[int]]:
    """The statuses with the forms gate applied (`tflfuse.targets.edgetpu.forms`): an op the op
    table maps whose form is `gated` maps only where a compiled model shows that form mapped at
    its size. Where one shows it refused on its own (and none mapped as large), it is refused;
    where none shows it, it is undecided: predicted on the CPU (the less favourable reading; the
    other one is `_gate_reading`). Returns (statuses, indices of the undecided ops)."""
    table = table if table is not None else load_table()
    out, undecided = list(statuses), []
    for index, (op, (key, _)) in enumerate(zip(graph.ops, statuses)):
        if key != "mapped" or not gated(form_of(op)):
            continue
        verdict = gate(op, table)
        if verdict.answer == "refused":
            out[index] = ("limitation", f"{verdict.reason} (delegates/edgetpu_forms.toml)")
        elif verdict.answer == "undecided":
            undecided.append(index)
            out[index] = (
                "limitation",
                f"{UNDECIDED} {verdict.reason}; predicted on the CPU, the less favourable reading",
            )
    return out, undecided


def _gate_reading(
    graph: Graph,
    statuses: list[tuple[str, str]],
    undecided: list[int],
    now: int,
    multiple_subgraphs: bool,
) -> OtherReading | None:
    """The reading under which every undecided op maps (`gate_statuses`): its mapped count, and
    the sentence that names the undecided ops that would then map, with their forms (one cut
    anyway by an op the evidence refuses is the same under both readings, and is not named)."""
    if not undecided:
        return None
    mapped_reading = list(statuses)
    for i in undecided:
        mapped_reading[i] = ("mapped", "")
    if multiple_subgraphs:
        flags = [key == "mapped" for key, _ in mapped_reading]
    else:
        flags = _single_segment(graph, mapped_reading)[0]
    listed = [i for i in undecided if flags[i]]
    other = sum(flags)
    if not listed or other == now:
        return None
    named = "; ".join(
        f"op {i} {statuses[i][1][len(UNDECIDED) :].split(';')[0].strip()}" for i in listed[:4]
    )
    more = f"; and {len(listed) - 4} more" if len(listed) > 4 else ""
    n, them = len(graph.ops), "them" if len(listed) > 1 else "it"
    text = (
        f"{len(listed)} op{'s' * (len(listed) > 1)} of a form no compiled model shows"
        f" mapped ({named}{more}): predicted on the CPU ({now}/{n} mapped); if the compiler maps"
        f" {them}, {other}/{n} would map. Undecided by the evidence (delegates/edgetpu_forms.toml)"
    )
    return OtherReading(listed, other, text)


def predict_edgetpu(
    model: Model, compiler_version: str | None = None, *, multiple_subgraphs: bool = False
) -> Prediction:
    """The compiler's mapping of the main subgraph, predicted from `delegates/edgetpu.toml`.

    `compiler_version` (e.g. "15.0") predicts that compiler: ops and op versions its table rows
    say came later are refused. Default: the version the table describes (16.0).
    `multiple_subgraphs` predicts a compiler run that allows several Edge TPU subgraphs
    (`edgetpu_compiler -a`): every op that can map maps, with no cut, and the prediction counts
    the segments (TFLite's delegate partitioning, `_segments`) the compiled model will hold.
    """
    table = capability("edgetpu")
    status_text = table["status"]
    graph = model.main
    version = compiler_version or default_compiler_version(table)
    statuses, gated_ops = gate_statuses(graph, edgetpu_statuses(model, version))
    readings: list[OtherReading] = []
    if multiple_subgraphs:
        mapped = [key == "mapped" for key, _ in statuses]
        cut_by: dict[int, int] = {}
    else:
        mapped, cut_by, _ = _single_segment(graph, statuses)
        readings = _other_readings(graph, statuses, mapped)
    gated_reading = _gate_reading(graph, statuses, gated_ops, sum(mapped), multiple_subgraphs)
    readings += [gated_reading] if gated_reading else []
    ops: list[OpPrediction] = []
    for index, (op, (key, reason)) in enumerate(zip(graph.ops, statuses)):
        label = op_label(op)
        if mapped[index]:
            ops.append(OpPrediction(index, label, "edgetpu", status_text[key], reason))
        elif key == "mapped" or (index in gated_ops and index in cut_by):
            # mappable (or of a form no compiled model shows), but it needs an op on the CPU
            root = cut_by.get(index)
            why = (
                reason
                if root is None
                else f"after the cut at op {root} ({graph.ops[root].type}): it reads what that"
                " op computes on the CPU"
            )
            ops.append(OpPrediction(index, label, "cpu", status_text["after_cut"], why))
        else:
            ops.append(OpPrediction(index, label, "cpu", status_text[key], reason))
    mapped_ops = [op for op, m in zip(graph.ops, mapped) if m]
    prediction = Prediction(
        "edgetpu",
        ops,
        memory=_edgetpu_memory(mapped_ops, table, version),
        segments=_segments(graph, mapped) if multiple_subgraphs else int(any(mapped)),
        compiler_version=version,
        mode="multiple subgraphs (-a)" if multiple_subgraphs else "one Edge TPU subgraph",
        other_readings=readings,
    )
    prediction.notes += [r.reading for r in readings]
    if not mapped_ops and any(key == "data_type" for key, _ in statuses):
        prediction.notes.append(
            "the model computes in float: the Edge TPU needs full int8 (convert with the edgetpu"
            " recipe, uint8 I/O)"
        )
    if len(model.subgraphs) > 1:
        prediction.notes.append(
            f"only the main subgraph is predicted ({len(model.subgraphs) - 1} more not compiled)"
        )
    return prediction


def _edgetpu_memory(mapped_ops: list[Op], table: CapabilityTable, version: str) -> dict[str, int]:
    """Parameter bytes of the mapped ops in the compiler's layout (`edgetpu.memory`)."""
    return predicted_memory(mapped_ops, table, compiler_version_key(version)[0])
