"""The attention's sums written as float SUMs when int8 follows, and their int8 completion
(tflfuse/targets/edgetpu/sumconv.py): SUM over axis 1 (and its scaled form) => DEPTHWISE_CONV_2D."""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import G, apply, assert_same_function, ops, refusals

from tflfuse.convert import recipe
from tflfuse.convert.rule_sets import pipeline
from tflfuse.ir import Graph, Model, Quantization, flatbuffer
from tflfuse.targets import target as target_named
from tflfuse.targets.edgetpu.attention import LegalizeActivationMatmul
from tflfuse.targets.edgetpu.sumconv import (
    ScaledSumAsDepthwise,
    SumAsDepthwise,
    scaled_sum_steps,
)
from tflfuse.verification import verify


def _product(a_kind: str, d: int) -> bytes:
    """a @ TANH(b), [1, 2, 8, d] @ [1, 2, d, 6]; a is TANH(input) or a SOFTMAX's rows."""
    g = G()
    a = g.unary(a_kind, g.input((1, 2, 8, d), "a"))
    b = g.unary("TANH", g.input((1, 2, d, 6), "b"))
    out = g.op("BATCH_MATMUL", [a, b], (1, 2, 8, 6), adj_x=False, adj_y=False)
    return g.bytes(out)


# -- float: the sums as SUMs -------------------------------------------------------------------
def test_float_sums_are_written_as_sums_when_int8_follows() -> None:
    """The small product's sums over d: one float SUM(axis 1) a head where the plain rule
    writes a depthwise conv of ones; the same function."""
    before = _product("TANH", 4)
    plain = ops(apply(before, LegalizeActivationMatmul())[1])
    after, model, result = apply(before, LegalizeActivationMatmul().waiting_for_int8())
    assert result.fired() == {"LegalizeActivationMatmul": 1}
    assert plain.count("DEPTHWISE_CONV_2D") == 2 and "SUM" not in plain
    assert ops(model).count("SUM") == 2 and "DEPTHWISE_CONV_2D" not in ops(model)
    # every other op as the depthwise form writes it
    assert sorted(o for o in ops(model) if o != "SUM") == sorted(
        o for o in plain if o != "DEPTHWISE_CONV_2D"
    )
    for op in model.main.ops:
        if op.type == "SUM":
            assert op.options.get("keep_dims") and op.inputs[1].data.tolist() == [1]
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


def test_a_split_softmax_sum_is_a_sum_and_a_mul_by_its_factor() -> None:
    """A softmax operand split at 1/20 and 8/20 (softmax_split: three ranges; each small
    range's sum scaled by its width / 6): those sums are a SUM then a MUL by width / 6, the
    large range's a plain SUM; the same function."""
    before = _product("SOFTMAX", 20)
    after, model, _ = apply(before, LegalizeActivationMatmul().waiting_for_int8())
    names = ops(model)
    assert names.count("SUM") == 6 and "DEPTHWISE_CONV_2D" not in names  # 2 products x 3
    factors = [
        float(op.inputs[1].data.reshape(-1)[0])
        for op in model.main.ops
        if op.type == "MUL" and op.inputs[1].is_constant
    ]
    assert factors == pytest.approx([(1 / 20) / 6, (8 / 20 - 1 / 20) / 6] * 2)
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


def test_the_edgetpu_recipe_writes_the_float_sums_before_int8_only() -> None:
    edgetpu = target_named("edgetpu")
    assert recipe.load("edgetpu").attention_sum_after_int8
    assert not recipe.load("xnnpack-int8").attention_sum_after_int8

    def waits(stage) -> list[bool]:
        rules = [r for r in stage if r.name == "LegalizeActivationMatmul"]
        return [getattr(r, "sums_wait", None) for r in rules]

    assert waits(pipeline(2, edgetpu, before_int8=True, int8_completes=True)) == [True]
    assert waits(pipeline(2, edgetpu, before_int8=True)) == [False]
    assert waits(pipeline(2, edgetpu, int8_completes=True)) == [False]  # (no int8 next)
    assert {"SumAsDepthwise", "ScaledSumAsDepthwise"} <= {
        r.name for r in pipeline(2, edgetpu, quantized=True)
    }


# -- int8: the SUMs as depthwise convs -------------------------------------------------------------
def _q(scale: float, zero: int) -> Quantization:
    return Quantization(scale=np.array([scale], np.float32), zero_point=np.array([zero], np.int64))


def _int8_sum(
    shape=(1, 12, 1, 40), axis: int = 1, factor: tuple[int, float, int] | None = None
) -> bytes:
    """SUM(x, axis, keep_dims) of an int8 input, then (`factor`: code, scale, zero point) a MUL
    by an int8 constant."""
    g = Graph("main")
    x = g.add_tensor("x", shape, "INT8", quantization=_q(0.05, -4))
    g.inputs = [x]
    out_shape = tuple(1 if i == axis else a for i, a in enumerate(shape))
    s = g.add_tensor("s", out_shape, "INT8", quantization=_q(0.21, 2))
    axes = g.add_constant("axis", np.array([axis], np.int32), "INT32")
    g.add_op("SUM", [x, axes], [s], {"keep_dims": True})
    out = s
    if factor is not None:
        code, scale, zero = factor
        f = g.add_constant("f", np.array([code], np.int8), "INT8", quantization=_q(scale, zero))
        out = g.add_tensor("y", out_shape, "INT8", quantization=_q(0.013, -1))
        g.add_op("MUL", [s, f], [out], {"fused_activation_function": "NONE"})
    g.outputs = [out]
    g.validate()
    return flatbuffer.to_bytes(Model([g]))


def test_an_int8_sum_over_axis_one_becomes_a_depthwise_conv_within_one_step() -> None:
    before = _int8_sum()
    after, model, result = apply(before, SumAsDepthwise())
    assert ops(model) == ["DEPTHWISE_CONV_2D"]
    [event] = result.events
    assert event.int8_steps == 1
    w = model.main.ops[0].inputs[1]
    assert w.shape == (1, 12, 1, 40) and np.all(w.data == 127)
    assert float(w.quantization.scale[0]) == pytest.approx(1 / 127)
    agreement = verify.compare(before, after, int_atol=event.int8_steps, runs=4)
    assert agreement.ok and agreement.varies, agreement


@pytest.mark.parametrize("code", [17, -23])
def test_a_scaled_int8_sum_becomes_one_depthwise_conv_within_its_declared_bound(code) -> None:
    """MUL(SUM(x), f), f = code * 0.004: weights 127 sign(f) at |f|/127, the SUM's rounding
    magnified by |f| declared: ceil(|f| 0.21 / (2 0.013)) + 1 steps."""
    before = _int8_sum(factor=(code, 0.004, 0))
    after, model, result = apply(before, ScaledSumAsDepthwise(), SumAsDepthwise())
    assert ops(model) == ["DEPTHWISE_CONV_2D"]
    [event] = result.events
    f = code * 0.004
    assert event.rule == "ScaledSumAsDepthwise"
    assert event.int8_steps == int(np.ceil(abs(f) * 0.21 / (2 * 0.013))) + 1 == 2
    w = model.main.ops[0].inputs[1]
    real = w.data.astype(np.float64) * float(w.quantization.scale[0])
    assert np.allclose(real, f, rtol=1e-6)
    agreement = verify.compare(before, after, int_atol=event.int8_steps, runs=4)
    assert agreement.ok and agreement.varies, agreement


def test_scaled_sum_steps_grow_with_the_sums_step() -> None:
    g = Graph("main")
    s = g.add_tensor("s", (1,), "INT8", quantization=_q(0.5, 0))
    y = g.add_tensor("y", (1,), "INT8", quantization=_q(0.01, 0))
    assert scaled_sum_steps(0.1, s, y) == 3 + 1
    assert scaled_sum_steps(-0.1, s, y) == 3 + 1


def test_other_sums_stay() -> None:
    """A sum over another axis, a float sum, and one whose depthwise conv the table refuses
    (more channels than the compiler's row limit) are left as they are, each saying why."""
    _, model, result = apply(_int8_sum(axis=2, shape=(1, 12, 5, 8)), SumAsDepthwise())
    assert ops(model) == ["SUM"]
    assert refusals(result, "SumAsDepthwise") == ["not a sum over axis 1 alone"]
    g = G()
    x = g.input((1, 4, 1, 6))
    y = g.op("SUM", [x, g.const(np.array([1]), "axis")], (1, 1, 1, 6), keep_dims=True)
    _, model, result = apply(g.bytes(y), SumAsDepthwise())
    assert ops(model) == ["SUM"]
    assert refusals(result, "SumAsDepthwise") == ["not a per-tensor int8 sum"]
    _, model, result = apply(_int8_sum(shape=(1, 4, 1, 1 << 20)), SumAsDepthwise())
    assert ops(model) == ["SUM"]
    [reason] = refusals(result, "SumAsDepthwise")
    assert reason.startswith("the depthwise conv it would be is refused:")


def test_equal_kernels_are_one_constant() -> None:
    """Two sums of the same shape and input scale read one kernel and one bias (the quantized
    stage merges no constants: unshared, a 640-px YOLO26n's file grew by 110 MB)."""
    g = Graph("main")
    q = _q(0.05, -4)
    xs = [g.add_tensor(f"x{i}", (1, 12, 1, 40), "INT8", quantization=q) for i in range(2)]
    g.inputs = xs
    axes = g.add_constant("axis", np.array([1], np.int32), "INT32")
    outs = [g.add_tensor(f"s{i}", (1, 1, 1, 40), "INT8", quantization=_q(0.21, 2)) for i in (0, 1)]
    for x, s in zip(xs, outs):
        g.add_op("SUM", [x, axes], [s], {"keep_dims": True})
    g.outputs = outs
    before = flatbuffer.to_bytes(Model([g]))
    after, model, _ = apply(before, SumAsDepthwise())
    first, second = model.main.ops
    assert (first.type, second.type) == ("DEPTHWISE_CONV_2D", "DEPTHWISE_CONV_2D")
    assert first.inputs[1] is second.inputs[1] and first.inputs[2] is second.inputs[2]
    assert verify.compare(before, after, int_atol=1, runs=3).ok


# -- the whole conversion ------------------------------------------------------------------------
def _converted(tmp_path, sums_after_int8: bool) -> tuple[dict, Model, dict]:
    from tflfuse.convert.pipeline import convert

    src = tmp_path / "product.tflite"
    src.write_bytes(_product("SOFTMAX", 20))
    rng = np.random.default_rng(1)
    calib = [rng.uniform(-2, 2, (32, 1, 2, 8, 20)).astype(np.float32),
             rng.uniform(-2, 2, (32, 1, 2, 20, 6)).astype(np.float32)]  # fmt: skip
    out = tmp_path / f"o{int(sums_after_int8)}"
    res = convert(src, "edgetpu", calibration=calib, output_dir=out, progress=False,
                  attention_sum_after_int8=sums_after_int8)  # fmt: skip
    return res.report, flatbuffer.load(res.fused), res.report["float_models"]["fused"]["op_counts"]


def test_the_edgetpu_conversion_writes_the_same_int8_ops_either_way(tmp_path) -> None:
    """`convert --recipe edgetpu` of a split softmax product: with the sums after int8, the
    float model carries SUMs (and no depthwise kernel), the int8 legalization turns each into
    the DEPTHWISE_CONV_2D the plain route quantizes, and the int8 model's ops are the same."""
    report, fused, fused_float = _converted(tmp_path, True)
    _, plain, plain_float = _converted(tmp_path, False)
    assert "SUM" in fused_float and "DEPTHWISE_CONV_2D" not in fused_float
    assert "DEPTHWISE_CONV_2D" in plain_float
    assert report["legalization"]["kept"]
    fired = report["legalization"]["fired"]
    assert fired == {"SumAsDepthwise": 2, "ScaledSumAsDepthwise": 4}  # 2 products x 3 ranges
    assert sorted(ops(fused)) == sorted(ops(plain)) and "SUM" not in ops(fused)
    assert report["agreement"]["fused"]["verified"]
