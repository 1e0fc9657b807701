"""Edge TPU legalization: a mean over the innermost axis, read against the rows it averages, as
a 1x1 CONV_2D whose every weight is 1/C (the mean written once per element of the row).

A LayerNorm, as exporters write it (litert-torch's, shortened by `ShortenLayerNorm`; onnx2tf's),
is MEAN(x, innermost, keep_dims) -> [.., 1], then SUB / SQUARED_DIFFERENCE / MUL of x [.., C]
against that column, and a variance MEAN -> ADD eps -> RSQRT -> MUL against the centred rows.
No compiled model shows an int8 MEAN over the innermost axis ("axes=kr") or a binary op of two
activations broadcast one-sided ("[xx] against [x1]") mapped (`delegates/edgetpu_forms.toml`),
so the forms gate predicts them undecided and a one-segment compile stops at the first
LayerNorm. A 1x1 CONV_2D whose C x C weights are all 1/C writes the row's mean into every one
of its C elements: the same values, replicated, so every op that read the column now reads a
tensor of x's shape ("same": MUL/SUB/SQUARED_DIFFERENCE of two activations of one shape), and
the per-row ops between (ADD eps, RSQRT) compute the same value C times. CONV_2D 1x1 is the
form compiled models show most (66 models, up to 11,107,248 elements).

Float (before quantization): the weights quantize exactly (all equal: one int8 code per output
channel), the convolution sums in int32 and rounds once at its output's scale, as the MEAN did;
the sum in another order, within a few ulps. int8 (the quantized stage, where a float-stage cut
such as a GELU left to the int8 GELU legalization kept the float rule from firing): weights 127
at scale 1/(127 C), a zero bias, the MEAN's own output parameters: the same sum and one
rounding, within one step of the MEAN kernel's. No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np

from tflfuse.ir import Op, Quantization, Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, Value, refuse
from tflfuse.rewrite.common import NotApplicable, is_float
from tflfuse.targets.edgetpu.forms import gate
from tflfuse.targets.edgetpu.heads import form_verdict
from tflfuse.targets.edgetpu.rules import _gated, _refusal_of

ROW_UNARY = frozenset({"RSQRT", "SQRT", "RELU", "RELU6", "LOGISTIC", "TANH", "ABS", "NEG", "EXP"})
BINARY = frozenset({"MUL", "ADD", "SUB", "SQUARED_DIFFERENCE", "DIV", "MAXIMUM", "MINIMUM"})
MOST_OPS = 16  # the per-row ops of a normalization, not a network


@dataclass
class RowRegion:
    """The ops that compute on the row column (made x's shape) and the ops that read it against
    x's rows (then of two operands of one shape)."""

    ops: list[Op] = field(default_factory=list)
    readers: list[Op] = field(default_factory=list)


def is_row_mean(x: Tensor, op: Op) -> bool:
    """Whether `op` averages x over its innermost axis (and size-1 axes) keeping dims."""
    axes = op.inputs[1].data if len(op.inputs) > 1 and op.inputs[1] is not None else None
    if axes is None or not op.options.get("keep_dims") or len(x.shape) < 2 or x.shape[-1] < 2:
        return False
    rank, last = len(x.shape), len(x.shape) - 1
    found = {int(a) % rank for a in np.asarray(axes).reshape(-1)}
    return last in found and all(x.shape[a] == 1 for a in found - {last})


def row_region(mean: Op, x: Tensor, graph) -> RowRegion | str:
    """The ops the mean's column flows through before it meets x's rows, or why it cannot be
    replicated (a reader of another kind, a model output)."""
    region, todo, full = RowRegion(), [mean.output], tuple(x.shape)
    while todo:
        t = todo.pop()
        if any(t is o for o in graph.outputs):
            return f"{t.name!r} is a model output"
        for op in t.consumers:
            if op in region.ops or op in region.readers:
                continue
            others = [i for i in op.inputs if i is not None and i is not t]
            if op.type in BINARY and len(op.inputs) == 2 and not others:  # t * t: per row
                region.ops.append(op)
                todo.append(op.output)
                continue
            if op.type in BINARY and len(op.inputs) == 2 and others:
                other = others[0]
                if tuple(other.shape) == full and tuple(op.output.shape) == full:
                    region.readers.append(op)
                    continue
                if other.is_constant and other.size == 1:
                    region.ops.append(op)
                    todo.append(op.output)
                    continue
            elif op.type in ROW_UNARY:
                region.ops.append(op)
                todo.append(op.output)
                continue
            return f"{op.type} reads the column {t.name!r} {list(t.shape)} otherwise"
        if len(region.ops) > MOST_OPS:
            return f"more than {MOST_OPS} per-row ops"
    if not region.readers:
        return "nothing reads the column against x's rows"
    return region


def _conv_shapes(x: Tensor) -> tuple[tuple[int, ...], ...]:
    """(the 4-D NHWC shape the convolution reads x as, its output shape)."""
    if len(x.shape) == 4 and x.shape[0] == 1:
        return tuple(x.shape), tuple(x.shape)
    rows = int(np.prod(x.shape[:-1]))
    return (1, 1, rows, x.shape[-1]), (1, 1, rows, x.shape[-1])


def _per_tensor_int8(*tensors: Tensor) -> bool:
    return all(
        t.dtype == "INT8" and t.quantization is not None and np.size(t.quantization.scale) == 1  # type: ignore[arg-type]  # (None: size 1)
        for t in tensors
    )


def _weights(b, x: Tensor, c: int):
    """The C x C weights of 1/C and a zero bias: float, or int8 codes 127 at scale 1/(127 C)
    and an int32 bias at the input's scale times it."""
    if is_float(x):
        w = b.const(np.full((c, 1, 1, c), 1.0 / c, np.float32), "mean_weights")
        return w, b.const(np.zeros(c, np.float32), "mean_bias")
    s_w = 1.0 / (127.0 * c)
    s_x = float(np.asarray(cast(Quantization, x.quantization).scale).reshape(-1)[0])  # (int8)
    q_w = Quantization(np.array([s_w], np.float32), np.zeros(1, np.int64))
    q_b = Quantization(np.array([s_x * s_w], np.float32), np.zeros(1, np.int64))
    w = b.const(np.full((c, 1, 1, c), 127, np.int8), "mean_weights", "INT8", q_w)
    return w, b.const(np.zeros(c, np.int32), "mean_bias", "INT32", q_b)


class ReplicateRowMean(Rule):
    """float: MEAN(x, innermost, keep_dims) read against x's rows (the module docstring)  =>
    CONV_2D_1x1(x, W = 1/C everywhere) [with RESHAPEs to and from NHWC]: the mean in every
    element of the row; the per-row ops after it compute on x's shape, and the ops that read it
    against x read two tensors of one shape. mean_j = sum_i x_i / C for every j: exact."""

    quantized_ok = True
    int8_error_steps = 1  # int8: the convolution's requantization against the MEAN kernel's

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MEAN(p.x, p.const("axes"))

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | RowRegion:
        """A refusal, or the region (the plan)."""
        mean = m.root
        if not is_float(x) and not _per_tensor_int8(x, mean.output):
            return NotApplicable("neither float nor int8 with per-tensor quantization")
        if not is_row_mean(x, mean):
            return NotApplicable("not a mean over the innermost axis keeping dims")
        if gate(mean, as_quantized=True).answer == "mapped":
            return NotApplicable("the MEAN's form is shown mapped as it is")
        region = row_region(mean, x, m.graph)
        if isinstance(region, str):
            return refuse(f"the mean cannot be replicated over the row: {region}")
        c = x.shape[-1]
        shape_in, shape_out = _conv_shapes(x)
        w = np.zeros((c, 1, 1, c), np.float32)
        conv_in = Tensor("in", shape_in, "FLOAT32")
        asks = [("CONV_2D", [conv_in], shape_out, {"padding": "VALID"}, [w, np.zeros(c)])]
        if shape_in != tuple(x.shape):
            asks.append(("RESHAPE", [x], shape_in, {}, [np.asarray(shape_in, np.int32)]))
        for op_type, ins, shape, options, consts in asks:
            why = _refusal_of(op_type, ins, shape, options, consts)
            verdict = form_verdict(op_type, ins, shape, options, consts)
            if why or verdict.answer == "refused":
                return refuse(f"its {op_type} would not map: {why or verdict.reason}")
        return region

    def rewrite(self, m: Match, *, x: Tensor, plan: RowRegion) -> None:
        mean, region = m.root, plan
        c, full = x.shape[-1], tuple(x.shape)
        shape_in, shape_out = _conv_shapes(x)
        b = m.builder()
        src: Tensor | Value = x
        if shape_in != full:
            src = b.RESHAPE(x, b.ints(shape_in, "rows_shape"), name="rows", like=x, shape=shape_in)
        w, bias = _weights(b, x, c)
        quant = mean.output.quantization  # float: none, or a range a rule recorded
        rep = b.CONV_2D(src, w, bias, name="replicated", like=x, quant=quant, shape=shape_out,
                        padding="VALID", stride_w=1, stride_h=1, dilation_w_factor=1,
                        dilation_h_factor=1)  # fmt: skip
        if shape_out != full:
            rep = b.RESHAPE(rep, b.ints(full, "replicated_shape"), name="replicated_rows",
                            like=x, quant=quant, shape=full)  # fmt: skip
        column = mean.output
        b.commit(remove=mean)
        m.graph.replace_uses(column, rep.made)
        for op in region.ops:
            op.output.shape = full
            op.output.shape_signature = None


ROW_MEAN_LEGALIZATION: tuple[Rule, ...] = (ReplicateRowMean(),)
