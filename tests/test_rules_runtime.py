"""Runtime legalization (tflfuse.rules.runtime): each rule fires only where the runtime lacks the
op version, keeps the function (checked in the interpreter), and refuses with a reason; the
optimize stage that runs them refuses in one line what no rule can lower."""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import G, apply, assert_same_function, ops, refusals
from test_rules_edgetpu import Q8

from tflfuse.convert.optimize import optimize_bytes
from tflfuse.errors import TflfuseError
from tflfuse.ir import flatbuffer
from tflfuse.rules.runtime import SpellOutGelu, SplitTransposeConvActivation
from tflfuse.targets import runtimes

OLD = runtimes.resolve("tflite-runtime==2.7.0")  # no GELU (builtin 150), TRANSPOSE_CONV up to v3
NEW = runtimes.resolve("ai-edge-litert==2.3.0")


def gelu_model(approximate: bool, scale: float = 1.0) -> bytes:
    g = G()
    x = g.input((1, 16))
    h = g.fc(x, 32)
    if scale != 1.0:
        h = g.binary("MUL", h, g.const(np.array([scale], np.float32), "scale"))
    y = g.op("GELU", [h], (1, 32), approximate=approximate)
    return g.bytes(y)


# -- GELU ----------------------------------------------------------------------------------------
def test_erf_gelu_is_spelled_out_within_its_declared_bound() -> None:
    before = gelu_model(approximate=False, scale=4.0)  # |x| up to ~10: the tails too
    after, model, result = apply(before, SpellOutGelu(OLD))
    assert "GELU" not in ops(model)
    assert set(ops(model)) <= {"FULLY_CONNECTED", "MUL", "ADD", "SUB", "DIV", "ABS", "EXP", "RELU"}
    assert result.approximations() == {"SpellOutGelu": {"count": 1, "error_bound": 2.2e-7}}
    assert runtimes.check(model, OLD).runtime_ok
    assert not runtimes.check(flatbuffer.from_bytes(before), OLD).runtime_ok
    assert_same_function(before, after, atol=1e-6, rtol=1e-6)


def test_tanh_gelu_is_spelled_out_exactly() -> None:
    before = gelu_model(approximate=True)
    after, model, result = apply(before, SpellOutGelu(OLD))
    assert set(ops(model)) == {"FULLY_CONNECTED", "MUL", "ADD", "TANH"}
    assert result.approximations() == {}
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


def test_gelu_stays_where_the_runtime_has_it() -> None:
    before = gelu_model(approximate=False)
    _, model, result = apply(before, SpellOutGelu(NEW))
    assert ops(model) == ["FULLY_CONNECTED", "GELU"]
    assert result.fired() == {}
    assert refusals(result, "SpellOutGelu") == ["ai-edge-litert 2.3.0 has GELU v1"]


def test_int8_gelu_is_refused_with_the_reason() -> None:
    g = Q8()
    x = g.input((1, 16))
    y = g.op("GELU", [x], x.shape, 0.03, -20)
    _, model, result = apply(g.bytes(y), SpellOutGelu(OLD))
    assert ops(model) == ["GELU"]
    assert refusals(result, "SpellOutGelu") == [
        "tflite-runtime 2.7.0 has no GELU v2 and an int8 GELU is spelled out only before"
        " quantizing (convert --runtime does)"
    ]


# -- TRANSPOSE_CONV ------------------------------------------------------------------------------
def transpose_conv_model(act: str, version: int) -> bytes:
    g = G()
    x = g.input((1, 4, 4, 3))
    shape = g.const(np.array([1, 8, 8, 5], np.int32), "shape")
    w, b = g.rand(5, 3, 3, 3), g.rand(5, name="b")
    y = g.op(
        "TRANSPOSE_CONV", [shape, w, x, b], (1, 8, 8, 5),
        padding="SAME", stride_h=2, stride_w=2, fused_activation_function=act,
    )  # fmt: skip
    g.graph.ops[-1].version = version
    return g.bytes(y)


def test_transpose_conv_activation_becomes_its_own_op() -> None:
    before = transpose_conv_model("RELU6", 4)
    after, model, result = apply(before, SplitTransposeConvActivation(OLD))
    assert ops(model) == ["TRANSPOSE_CONV", "RELU6"]
    assert [op.version for op in model.main.ops] == [3, 1]  # bias input: version 3
    assert model.main.ops[0].fused_activation == "NONE"
    assert result.fired() == {"SplitTransposeConvActivation": 1}
    assert runtimes.check(model, OLD).runtime_ok
    assert_same_function(before, after, atol=1e-6, rtol=1e-6)


def test_transpose_conv_stays_fused_where_the_runtime_has_v4() -> None:
    _, model, result = apply(transpose_conv_model("RELU", 4), SplitTransposeConvActivation(NEW))
    assert ops(model) == ["TRANSPOSE_CONV"] and result.fired() == {}


def test_a_fused_activation_without_an_op_form_is_refused() -> None:
    _, model, result = apply(transpose_conv_model("TANH", 4), SplitTransposeConvActivation(OLD))
    assert ops(model) == ["TRANSPOSE_CONV"]
    assert refusals(result, "SplitTransposeConvActivation") == [
        "TRANSPOSE_CONV with fused TANH has no separate op form"
    ]


# -- the optimize stage --------------------------------------------------------------------------
def test_optimize_runtime_lowers_fuses_and_verifies() -> None:
    """The target pipeline fuses the RELU into the TRANSPOSE_CONV (v4, TFLite 2.12); the runtime
    stage undoes it for 2.7.0 and spells GELU out; the result is verified and says so."""
    g = G()
    x = g.input((1, 4, 4, 3))
    shape = g.const(np.array([1, 8, 8, 5], np.int32), "shape")
    t = g.op("TRANSPOSE_CONV", [shape, g.rand(5, 3, 3, 3), x, g.rand(5, name="b")], (1, 8, 8, 5),
             padding="SAME", stride_h=2, stride_w=2, fused_activation_function="NONE")  # fmt: skip
    g.graph.ops[-1].version = 3
    y = g.op("GELU", [g.unary("RELU", t)], (1, 8, 8, 5), approximate=False)
    data = g.bytes(y)
    plain = optimize_bytes(data, target="xnnpack")
    assert "TRANSPOSE_CONV" in plain.model.main.op_counts()
    assert max(op.version for op in plain.model.main.ops if op.type == "TRANSPOSE_CONV") == 4
    lowered = optimize_bytes(data, target="xnnpack", runtime="tflite-runtime==2.7.0")
    assert runtimes.check(lowered.model, OLD).runtime_ok
    assert lowered.runtime == {
        "made_for": "tflite-runtime==2.7.0", "runtime_ok": True, "basis": "runtime_version"
    }  # fmt: skip
    fired = lowered.result.fired()
    assert fired["SpellOutGelu"] == 1 and fired["SplitTransposeConvActivation"] == 1
    assert lowered.verification["verified"] and lowered.verification["ok"]
    assert lowered.to_dict()["runtime"]["made_for"] == "tflite-runtime==2.7.0"


def test_optimize_runtime_refuses_in_one_line_what_it_cannot_lower() -> None:
    g = Q8()
    x = g.input((1, 16))
    y = g.op("GELU", [x], x.shape, 0.03, -20)
    g.graph.ops[-1].version = 2  # int8 GELU
    with pytest.raises(TflfuseError) as err:
        optimize_bytes(g.bytes(y), runtime="tflite-runtime==2.7.0", source="m.tflite")
    message = str(err.value)
    assert message == (
        "m.tflite: GELU v2 (builtin 150) cannot run on tflite-runtime 2.7.0: Op builtin_code out of"
        " range: 150. Are you using old TFLite binary with newer model? (GELU is newer than"
        " tflite-runtime 2.7.0; first in TensorFlow Lite 2.9.0); nothing written"
    )
    assert "\n" not in message


def test_optimize_runtime_names_an_unknown_runtime() -> None:
    with pytest.raises(
        TflfuseError, match=r"no data for that tflite-runtime release \(known: 2\.5"
    ):
        optimize_bytes(gelu_model(False), runtime="tflite-runtime==2.4.0")


def test_before_int8_the_erf_gelu_takes_the_quantizable_tanh_form() -> None:
    """litert-quantizer has no int8 ABS or EXP: before quantizing, the tanh form (MUL, ADD,
    TANH), declared 4.74e-4 from the erf GELU."""
    from litert_quantizer import qtyping

    before = gelu_model(approximate=False)
    after, model, result = apply(before, SpellOutGelu(OLD, tanh_form=True))
    assert set(ops(model)) == {"FULLY_CONNECTED", "MUL", "ADD", "TANH"}
    assert set(ops(model)) <= set(qtyping.TFLOperationName.__members__)
    assert result.approximations() == {"SpellOutGelu": {"count": 1, "error_bound": 4.74e-4}}
    assert_same_function(before, after, atol=5e-4, rtol=1e-5)
