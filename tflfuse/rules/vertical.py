"""Vertical fusion: fold an op into the heavy kernel that *follows* it, or merge a chain of them.

The stock converter only folds affine ops that come after a conv. Pre-activation networks
(BatchNorm -> ReLU -> Conv, ResNetV2) put them before; linear 1x1 chains and explicit PAD ops
come from other converters. All rules here are float-only: they recompute weights.
"""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Op, Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, common, refuse
from tflfuse.rewrite.common import NotApplicable
from tflfuse.targets import cost

_READERS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def _absorbing_readers(
    m: Match, t: Tensor, *, needs_no_padding: bool, through_mean: bool = False
) -> Refusal | None:
    """None when every reader of `t` is a float conv/FC taking it as data input only.

    With `through_mean`, a MEAN over non-channel axes counts when its own readers absorb
    (MoveScaleThroughMean then carries the scale past it).
    """
    if m.graph.is_graph_output(t):
        return refuse("the value is also a model output")
    if not t.consumers:
        return refuse("nothing reads the value")
    for op in t.consumers:
        if through_mean and _spatial_mean(op, t):
            reason = _absorbing_readers(m, op.output, needs_no_padding=needs_no_padding)
            if reason is not None:
                return reason
            continue
        if op.type not in _READERS:
            return refuse(f"{op.type} reads the value and cannot absorb it")
        if op.inputs[0] is not t or t in op.inputs[1:]:
            return refuse(f"{op.type} reads the value as weights")
        if not common.has_float_params(op):
            return refuse(f"{op.type} weights or bias are not float constants")
        if op.type == "FULLY_CONNECTED" and op.input(1).shape[-1] % t.shape[-1]:
            return refuse(
                f"FULLY_CONNECTED rows of {op.input(1).shape[-1]} values do not line up with"
                f" the {t.shape[-1]} channels"
            )
        if needs_no_padding and not common.same_padding_is_zero(op):
            return refuse(
                f"{op.type} uses SAME padding: its zero border would not see the added constant"
            )
    return None


def _per_weight_column(op: Op, v: np.ndarray) -> np.ndarray:
    """A per-channel vector laid along the op's input axis: an FC reading an NHWC tensor
    directly flattens it row-major, so its column k reads channel k mod C (the check made sure
    the row length is a multiple of C)."""
    if op.type != "FULLY_CONNECTED":
        return v
    return np.tile(v, op.input(1).shape[-1] // v.size)


def _scale_input_channels(op: Op, s: np.ndarray) -> np.ndarray:
    """Weights of `op` with input channel i multiplied by s[i]."""
    w = common.weights(op)
    s = _per_weight_column(op, s)
    if op.type == "DEPTHWISE_CONV_2D":
        multiplier = w.shape[3] // s.size
        return w * np.repeat(s, multiplier).reshape(1, 1, 1, -1)
    return w * s.reshape(*([1] * (w.ndim - 1)), -1)


def _bias_from_input_offset(op: Op, c: np.ndarray) -> np.ndarray:
    """The op's bias after its input gains +c[i] on every element of channel i (no padding)."""
    w = common.weights(op).astype(np.float64)
    b = common.bias(op).astype(np.float64)
    c = _per_weight_column(op, c)
    if op.type == "DEPTHWISE_CONV_2D":
        multiplier = w.shape[3] // c.size
        return (b + np.repeat(c, multiplier) * w.sum(axis=(0, 1, 2))).astype(np.float32)
    return (b + w.reshape(w.shape[0], -1, w.shape[-1]).sum(axis=1) @ c).astype(np.float32)


class FoldAffineIntoFollowing(Rule):
    """y = x * s | x + c | x - c, read only by CONV_2D/DEPTHWISE_CONV_2D/FULLY_CONNECTED  =>
    each reader reads x with W'[..., i] = W[..., i] * s[i]  |  b' = b + sum_{k,i} W[o, k, i] c[i].

    s, c hold one value per channel (last axis). A MUL is always exact (zero padding stays
    zero); an ADD/SUB only when the reader pads nothing, otherwise the border would lack c.
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any("MUL", "ADD", "SUB")(p.x, p.const("c"), out="y")

    def check(self, m: Match, *, x: Tensor, y: Tensor, c: Tensor) -> Refusal | np.ndarray:
        """A refusal, or the constant as one value per channel."""
        root = m.root
        if root.fused_activation != "NONE":
            return refuse(f"{root.type} has fused {root.fused_activation}")
        if not common.is_float(x) or x.is_constant or x.shape != y.shape or not x.shape:
            return refuse(f"{root.type} broadcasts or is not a float activation")
        vector = common.channel_vector(c, y.shape[-1], len(y.shape))
        if vector is None:
            return refuse(f"the {root.type} constant is not one value per channel")
        return _absorbing_readers(m, y, needs_no_padding=root.type != "MUL") or vector

    def rewrite(self, m: Match, *, x: Tensor, y: Tensor, plan: np.ndarray) -> None:
        vector = plan
        b = m.builder()
        for op in y.consumers:
            if m.root.type == "MUL":
                b.set_weights(op, _scale_input_channels(op, vector))
            else:
                sign = -1.0 if m.root.type == "SUB" else 1.0
                b.set_bias(op, _bias_from_input_offset(op, sign * vector))
            b.set_input(op, 0, x)
        b.commit()


class MoveScaleThroughRelu(Rule):
    """relu(x * s + b)  =>  relu(x + b / s) * s, for s > 0 per channel.

    Exact because relu(s * z) = s * relu(z) when s > 0. Fires only when every reader of the
    result is a conv/FC, so the MUL then folds into them (FoldAffineIntoFollowing): a
    pre-activation BatchNorm loses its MUL.
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.ADD(p.MUL(p.x, p.const("scale"), out="scaled"), p.const("shift"), out="y")

    def check(
        self, m: Match, *, x: Tensor, scale: Tensor, scaled: Tensor, shift: Tensor, y: Tensor
    ) -> Refusal | tuple[np.ndarray, np.ndarray]:
        """A refusal, or the scale and the offset as one value per channel."""
        if m.root.fused_activation == "NONE":
            return refuse("no RELU follows the affine, so there is nothing to move it past")
        if m.root.fused_activation != "RELU":
            act = m.root.fused_activation
            return refuse(f"only RELU commutes with a positive scale, not {act}")
        # the engine's check (read elsewhere) and an activation, in one sentence
        if scaled.op.fused_activation != "NONE" or not common.single_reader(m.graph, scaled):
            return refuse("the scale is read elsewhere or has an activation")
        if not common.is_float(x) or x.shape != y.shape or not x.shape:
            return refuse("the affine broadcasts or is not float")
        channels, rank = y.shape[-1], len(y.shape)
        s = common.channel_vector(scale, channels, rank)
        b = common.channel_vector(shift, channels, rank)
        if s is None or b is None:
            return refuse("scale or offset is not one value per channel")
        if not np.all(s > 0):
            return refuse("a scale is not positive, so it does not commute with RELU")
        return _absorbing_readers(m, y, needs_no_padding=False, through_mean=True) or (s, b)

    def rewrite(
        self, m: Match, *, x: Tensor, y: Tensor, plan: tuple[np.ndarray, np.ndarray]
    ) -> None:
        s, b = plan
        add, bld = m.root, m.builder(prefix="")
        shifted = bld.tensor(add.output.name + "_shifted", y.shape)
        offset = bld.const(b / s, add.name + "_offset")
        bld.ADD(x, offset, out=shifted, fused_activation_function="RELU", version=add.version)
        bld.replace(add, bld.MUL(shifted, bld.const(s, add.output.name + "_scale")))


def _spatial_mean(op: Op, t: Tensor) -> bool:
    """op is a MEAN of t over axes that leave the last (channel) axis in place."""
    if op.type != "MEAN" or op.inputs[0] is not t or not t.shape or not op.input(1).is_constant:
        return False
    rank = len(t.shape)
    axes = {int(a) % rank for a in np.asarray(op.input(1).data).reshape(-1)}
    out = op.output.shape
    return rank - 1 not in axes and bool(out) and out[-1] == t.shape[-1]


class MoveScaleThroughMean(Rule):
    """MEAN(x * s, axes)  =>  MEAN(x, axes) * s, when axes leave the channel axis of s alone.

    Exact up to rounding: the mean is linear and s is constant along the averaged axes. Fires
    only when a conv/FC reads the mean, which then absorbs s (global pooling before a classifier).
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        why = "the scale has an activation or is read elsewhere"
        scaled = p.MUL(p.x, p.const("s"), out="scaled").where(fused_activation="NONE", because=why)
        return p.MEAN(scaled, p.const("axes"), out="y")

    def check(self, m: Match, *, x: Tensor, s: Tensor, scaled: Tensor, y: Tensor) -> Refusal | None:
        if not common.single_reader(m.graph, scaled):  # the engine's check, in this rule's words
            return refuse("the scale has an activation or is read elsewhere")
        if not common.is_float(x) or x.shape != scaled.shape or not x.shape:
            return refuse("the scale broadcasts or is not float")
        if common.channel_vector(s, x.shape[-1], len(x.shape)) is None:
            return refuse("the scale is not one value per channel")
        if not _spatial_mean(m.root, scaled):
            return refuse("the MEAN averages over the channel axis")
        return _absorbing_readers(m, y, needs_no_padding=False)

    def rewrite(self, m: Match, *, s: Tensor, x: Tensor, y: Tensor) -> None:
        mean, b = m.root, m.builder(prefix="", after=m.root)
        vector = common.channel_vector(s, x.shape[-1], len(x.shape))
        assert vector is not None  # (check said so)
        averaged = b.tensor(y.name + "_unscaled", y.shape)
        b.set_output(mean, 0, averaged)
        b.set_input(mean, 0, x)
        b.MUL(averaged, b.const(vector, y.name + "_scale"), out=y)
        b.commit()


class FoldBiasThroughAdd(Rule):
    """(a + W(z)) + c  =>  a + W'(z) with bias b + c (c one value per channel).

    A residual ADD followed by the offset of the next pre-activation BatchNorm: the offset goes
    into the conv/FC on the residual branch; the outer ADD's activation moves to the inner one.
    Exact up to the order of float additions.
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.ADD(p.ADD(p.a, p.any(*common.WEIGHTED)(..., out="w"), out="total"), p.const("c"))

    def check(self, m: Match, *, a: Tensor, w: Tensor, total: Tensor, c: Tensor) -> Refusal | None:
        inner, producer = total.op, w.op
        if inner.fused_activation != "NONE":
            return refuse(f"the residual ADD has fused {inner.fused_activation}")
        # the engine's checks, in this rule's words (the sum: often the next shortcut's input)
        if not common.single_reader(m.graph, total):
            return refuse("the residual sum is read elsewhere (e.g. the next shortcut)")
        if not common.single_reader(m.graph, w) or producer.fused_activation != "NONE":
            return refuse(f"the {producer.type} output is read elsewhere or has an activation")
        if not common.has_float_params(producer):
            return refuse(f"{producer.type} weights or bias are not float constants")
        shape = m.root.output.shape
        if not (total.shape == w.shape == shape and a.shape == shape):
            return refuse("the ADDs broadcast")
        if common.channel_vector(c, common.out_channels(producer), len(shape)) is None:
            return refuse("the offset is not one value per channel")
        return None

    def rewrite(self, m: Match, *, w: Tensor, total: Tensor, c: Tensor) -> None:
        inner, producer, outer = total.op, w.op, m.root
        vector = common.channel_vector(c, common.out_channels(producer), len(total.shape))
        b = m.builder()
        b.set_bias(producer, common.bias(producer) + vector)
        b.set_output(inner, 0, outer.output)
        act = outer.fused_activation
        b.commit(remove=outer)
        inner.fused_activation = act


def _pointwise(op: Op) -> bool:
    return op.type == "CONV_2D" and common.kernel_hw(op) == (1, 1)


class MergeLinearChain(Rule):
    """conv1x1_2(conv1x1_1(x)) | fc_2(fc_1(x)) with no activation between  =>  one op with
    W = W2 @ W1, b = W2 @ b1 + b2.

    Fires when the cost model says the merged op does no more multiply-adds per position
    (I*O <= I*M + M*O) — it always saves a kernel and the intermediate tensor.
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any("CONV_2D", "FULLY_CONNECTED")(
            p.any("CONV_2D", "FULLY_CONNECTED")(p.x, ..., out="mid"), ...
        )

    def check(self, m: Match, *, x: Tensor, mid: Tensor) -> Refusal | None:
        first, second = mid.op, m.root
        if first.type != second.type:
            return refuse("a conv and an FC do not merge")
        if first.fused_activation != "NONE":
            return refuse(f"{first.fused_activation} between the two ops is not linear")
        if not common.single_reader(m.graph, mid):  # the engine's check, in this rule's words
            return refuse("the intermediate is read elsewhere")
        if second.inputs[0] is not mid:
            return refuse("the first op feeds the weights of the second")
        if not (common.has_float_params(first) and common.has_float_params(second)):
            return refuse("weights or bias are not float constants")
        if first.type == "CONV_2D":
            if not (_pointwise(first) and _pointwise(second)):
                return refuse("only 1x1 convolutions merge")
            strides = [
                (o.options.get("stride_h", 1), o.options.get("stride_w", 1))
                for o in (first, second)
            ]
            if (1, 1) not in strides:
                return refuse("both convolutions are strided")
            if any(o.options.get("dilation_h_factor", 1) != 1 for o in (first, second)):
                return refuse("dilated 1x1 convolutions")
        elif first.options.get("weights_format", 0) or second.options.get("weights_format", 0):
            return refuse("shuffled FC weights")
        w1, w2 = common.weights(first), common.weights(second)
        i, inner, o = w1.shape[-1], w1.shape[0], w2.shape[0]
        if not cost.chain_merge_pays(i, inner, o):
            return refuse(
                f"merging {i}->{inner}->{o} channels into {i}->{o} would need more multiply-adds"
            )
        if first.type == "FULLY_CONNECTED" and not self._fc_shape_ok(m, x, mid):
            return refuse("the merged FC would produce a different shape")
        return None

    @staticmethod
    def _fc_shape_ok(m: Match, x: Tensor, mid: Tensor) -> bool:
        out = m.root.output
        keep = bool(m.root.options.get("keep_num_dims", False)) and bool(
            mid.op.options.get("keep_num_dims", False)
        )
        o = out.shape[-1]
        rows = int(np.prod(x.shape[:-1]))
        want = (*x.shape[:-1], o) if keep else (rows, o)
        return tuple(out.shape) == tuple(want)

    def rewrite(self, m: Match, *, mid: Tensor, x: Tensor) -> None:
        first, second = mid.op, m.root
        w1 = common.weights(first).astype(np.float64)
        w2 = common.weights(second).astype(np.float64)
        b1 = common.bias(first).astype(np.float64)
        b2 = common.bias(second).astype(np.float64)
        a1, a2 = w1.reshape(w1.shape[0], -1), w2.reshape(w2.shape[0], -1)
        w = (a2 @ a1).reshape(w2.shape[0], *w1.shape[1:])
        b = a2 @ b1 + b2
        if first.type == "CONV_2D":
            s1 = (first.options.get("stride_h", 1), first.options.get("stride_w", 1))
            strided = first if s1 != (1, 1) else second
            for key in ("padding", "stride_h", "stride_w"):
                second.options[key] = strided.options.get(key, 1)
        else:
            second.options["keep_num_dims"] = bool(second.options.get("keep_num_dims")) and bool(
                first.options.get("keep_num_dims")
            )
        bld = m.builder()
        bld.set_weights(second, w)
        bld.set_bias(second, b)
        bld.set_input(second, 0, x)
        bld.commit()


class FoldPadIntoConv(Rule):
    """PAD(x, zeros on H and W) -> CONV_2D|DEPTHWISE_CONV_2D|MAX_POOL_2D (VALID)  =>  the op
    with SAME padding on x, when the PAD adds exactly the border SAME would.

    For MAX_POOL_2D only when x >= 0 (it follows a RELU): SAME max pool ignores the border,
    the PAD's zeros never win over non-negative values. int8: exact when the PAD keeps its
    input's quantization and pads with the zero point (real 0), which is what the int8 conv
    kernels' SAME border holds.
    """

    quantized_ok = True
    int8_error_steps = 0
    inner_ops_may_be_shared = True  # the PAD stays for its other readers

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any("CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D")(
            p.any("PAD", "PADV2")(p.x, p.const("paddings"), ..., out="padded"), ...
        )

    def check(self, m: Match, *, x: Tensor, paddings: Tensor, padded: Tensor) -> Refusal | None:
        op, pad = m.root, padded.op
        if op.options.get("padding") != "VALID":
            return refuse(f"{op.type} already pads")
        if len(x.shape) != 4:
            return refuse("the PAD input is not an NHWC tensor")
        if x.is_quantized or padded.is_quantized:
            reason = _int8_pad_refusal(x, padded, pad)
            if reason is not None:
                return reason
        elif not common.is_float(x):
            return refuse("the PAD input is neither float nor int8")
        elif pad.type == "PADV2" and common.scalar_value(pad.inputs[2]) != 0.0:
            return refuse("the PAD value is not zero")
        pads = np.asarray(paddings.data).reshape(-1, 2).tolist()
        if len(pads) != 4 or pads[0] != [0, 0] or pads[3] != [0, 0]:
            return refuse("the PAD touches the batch or channel axis")
        kh, kw = common.kernel_hw(op)
        dil_h = op.options.get("dilation_h_factor", 1)
        dil_w = op.options.get("dilation_w_factor", 1)
        want_h = common.pads_for_same(x.shape[1], kh, op.options.get("stride_h", 1), dil_h)
        want_w = common.pads_for_same(x.shape[2], kw, op.options.get("stride_w", 1), dil_w)
        if tuple(pads[1]) != want_h or tuple(pads[2]) != want_w:
            return refuse(
                f"the PAD adds {pads[1]}/{pads[2]} but SAME would add {list(want_h)}/{list(want_w)}"
            )
        if op.type == "MAX_POOL_2D" and not _non_negative(x):
            return refuse("max pool over a zero border equals SAME only for inputs >= 0")
        return None

    def rewrite(self, m: Match, *, x: Tensor) -> None:
        m.root.options["padding"] = "SAME"
        m.root.set_input(0, x)


def _int8_pad_refusal(x: Tensor, padded: Tensor, pad: Op) -> Refusal | None:
    """None when an int8 PAD pads real zeros and keeps x's quantization."""
    if x.dtype not in ("INT8", "UINT8") or padded.dtype != x.dtype:
        return refuse("the PAD input is not int8 or uint8")
    q = x.quantization
    if q is None or q.per_channel or q.scale is None or not _same_quantization(x, padded):
        return refuse("the PAD changes the quantization")
    if pad.type == "PADV2":
        value = pad.input(2)
        zero = int(np.ravel(q.zero_point)[0]) if q.zero_point is not None else 0
        data = value.data if value.is_constant else None
        if data is None or data.size != 1 or int(np.ravel(data)[0]) != zero:
            return refuse("the PAD value is not the zero point (real zero)")
    return None


def _non_negative(t: Tensor) -> bool:
    op = t.producer
    if op is None:
        return False
    return op.type in ("RELU", "RELU6") or op.fused_activation in ("RELU", "RELU6")


_LAYOUT = ("RESHAPE", "TRANSPOSE")


def _scalable_producer(m: Match, t: Tensor) -> Op | None:
    """The conv/FC whose output reaches `t` through RESHAPE/TRANSPOSE ops only, each value on
    the way read once: scaling its weights and bias scales `t`."""
    while t.producer is not None and t.producer.type in _LAYOUT:
        if not common.single_reader(m.graph, t):
            return None
        t = t.producer.input(0)
    op = t.producer
    if op is None or op.type not in ("FULLY_CONNECTED", "CONV_2D"):
        return None
    if not common.single_reader(m.graph, t) or not common.has_float_params(op):
        return None
    if op.fused_activation != "NONE" or op.options.get("weights_format", 0):
        return None
    return op


class FoldScaleIntoMatmulOperand(Rule):
    """BATCH_MATMUL(a, b) * c, c a scalar, a = layout ops of W(x) + bias  =>
    BATCH_MATMUL(a', b) with a' from W' = c W, bias' = c bias.

    Attention's 1/sqrt(d) on the scores: (c Q) K^T = c (Q K^T), and Q comes from a projection
    through a reshape and a transpose (which commute with a scalar). One kernel fewer per head
    group. Exact up to float rounding.
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MUL(p.BATCH_MATMUL(p.a, p.b, out="mm"), p.const("c"), out="y")

    def check(
        self, m: Match, *, a: Tensor, b: Tensor, mm: Tensor, c: Tensor, y: Tensor
    ) -> Refusal | Op:
        """A refusal, or the projection whose weights take the factor."""
        if m.root.fused_activation != "NONE":
            return refuse(f"the MUL has fused {m.root.fused_activation}")
        if common.scalar_value(c) is None:
            return NotApplicable("the factor is not one float number")
        if not common.is_float(mm) or mm.shape != y.shape:
            return refuse("the product is not float or the MUL broadcasts")
        if m.graph.is_graph_output(y):
            return refuse("the scaled result is a model output")
        op = None if a is b else _scalable_producer(m, a) or _scalable_producer(m, b)
        if op is None:
            return refuse("no matmul operand comes from a projection through layout ops only")
        return op

    def rewrite(self, m: Match, *, mm: Tensor, c: Tensor, y: Tensor, plan: Op) -> None:
        k, op, b = common.scalar_value(c), plan, m.builder()
        b.set_weights(op, common.weights(op) * np.float32(k))
        b.set_bias(op, common.bias(op) * np.float32(k))
        b.commit()
        common.forward(m.graph, y, mm)


class DropReshapeBeforeFullyConnected(Rule):
    """FULLY_CONNECTED(RESHAPE(x) to [rows, I], keep_num_dims=False)  =>  FULLY_CONNECTED(x).

    The FC kernel flattens its input to [elements / I, I] itself, row-major like the RESHAPE,
    so the RESHAPE is one kernel (and one tensor) too many. Pure data layout: exact, and
    exact in int8 too when both sides of the RESHAPE share their quantization.
    """

    quantized_ok = True
    int8_error_steps = 0

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.FULLY_CONNECTED(p.RESHAPE(p.x, ..., out="flat"), p.const("w"), ...)

    def check(self, m: Match, *, w: Tensor, flat: Tensor, x: Tensor) -> Refusal | None:
        fc = m.root
        if fc.options.get("keep_num_dims", False):
            return refuse("the FC keeps its input's dimensions")
        inputs = w.shape[-1] if w.shape else 0
        if len(flat.shape) != 2 or flat.shape[-1] != inputs:
            return refuse("the RESHAPE does more than flatten to [rows, input size]")
        if not x.shape or int(np.prod(x.shape)) % inputs or x.shape[-1] > inputs:
            return refuse("the FC input would not flatten to the same rows")
        if inputs % x.shape[-1]:
            return refuse("the input's last axis does not divide the FC input size")
        if x.dtype != flat.dtype or not _same_quantization(x, flat):
            return refuse("the RESHAPE changes the type or quantization")
        return None

    def rewrite(self, m: Match, *, x: Tensor) -> None:
        m.root.set_input(0, x)


def _same_quantization(a: Tensor, b: Tensor) -> bool:
    qa, qb = a.quantization, b.quantization
    if qa is None or qa.is_empty():
        return qb is None or qb.is_empty()
    return qa.same_as(qb)
