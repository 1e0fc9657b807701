"""An int8 model the interpreter cannot run is refused in one line naming the file, which of the
three models fail and how, and whether stock fails too (edgenext / MobileViT exports: an int8 DIV
whose divisor quantizes to its zero point)."""

from __future__ import annotations

import numpy as np
import pytest

from tflfuse.convert.pipeline import _refuse_what_does_not_run
from tflfuse.convert.report import agreement, invoke_failure
from tflfuse.errors import ModelError, TflfuseError
from tflfuse.ir import Graph, Model, Quantization, flatbuffer


def _int8_div() -> bytes:
    """x / y in int8 (float I/O through QUANTIZE / DEQUANTIZE): a divisor of 0 fails the
    kernel's check."""
    g = Graph("main")

    def q(scale: float) -> Quantization:
        return Quantization(scale=np.array([scale], np.float32), zero_point=np.array([0]))

    x, y = g.add_tensor("x", (1, 4)), g.add_tensor("y", (1, 4))
    xq = g.add_tensor("xq", (1, 4), "INT8", quantization=q(0.05))
    yq = g.add_tensor("yq", (1, 4), "INT8", quantization=q(0.05))
    zq = g.add_tensor("zq", (1, 4), "INT8", quantization=q(0.1))
    z = g.add_tensor("z", (1, 4))
    g.add_op("QUANTIZE", [x], [xq])
    g.add_op("QUANTIZE", [y], [yq])
    g.add_op("DIV", [xq, yq], [zq], {"fused_activation_function": "NONE"})
    g.add_op("DEQUANTIZE", [zq], [z])
    g.inputs, g.outputs = [x, y], [z]
    return flatbuffer.to_bytes(Model([g]))


def test_a_kernel_failure_is_an_agreement_that_did_not_run() -> None:
    data = _int8_div()
    x = np.ones((2, 4), np.float32)
    fine = agreement(data, [x, 2 * x], [np.full((2, 4), 0.5)])
    assert fine["verified"] and fine["max_abs"] <= 0.05
    failed = agreement(data, [x, 0 * x], [np.full((2, 4), 0.5)])
    assert failed["verified"] is False and failed["runs"] is False
    assert failed["reason"].startswith("op 2 (DIV) failed to invoke: ")
    assert "div.cc" in failed["reason"] and "\n" not in failed["reason"]


def test_invoke_failure_without_a_node_keeps_the_message_in_one_clause() -> None:
    text = invoke_failure(RuntimeError("something\nwent wrong"))
    assert text == "the interpreter failed running it: something went wrong"
    said = TflfuseError(
        "the interpreter failed to run the model: tflite/kernels/div.cc:262 data[i] !="
        " zero_point was not true.Node number 101 (DIV) failed to invoke."
    )
    assert invoke_failure(said) == (
        "op 101 (DIV) failed to invoke: tflite/kernels/div.cc:262 data[i] != zero_point was"
        " not true"
    )


def test_stock_alone_failing_is_a_warning() -> None:
    reason = "op 101 (DIV) failed to invoke: tflite/kernels/div.cc:262 data[i] != zero_point"
    agree = {
        "fused": {"verified": True},
        "unfused": {"verified": False, "runs": False, "reason": reason},
        "stock": {"verified": False, "runs": False, "reason": reason},
    }
    said = _refuse_what_does_not_run("edgenext.tflite", agree)  # fused runs: a warning, no error
    assert said == (
        "stock (litert-quantizer's int8 of the same file) fails in the"
        f" interpreter: {reason}, and so does unfused; the int8 model tflfuse made (fused) runs"
    )


@pytest.mark.parametrize("stock_runs", [False, True])
def test_the_refusal_says_which_models_fail(stock_runs: bool) -> None:
    reason = "op 61 (DIV) failed to invoke: tflite/kernels/div.cc:262 data[i] != zero_point"
    failed = {"verified": False, "runs": False, "reason": reason}
    agree = {
        "fused": failed,
        "unfused": {"verified": True},
        "stock": {"verified": True} if stock_runs else dict(failed),
    }
    with pytest.raises(ModelError) as err:
        _refuse_what_does_not_run("models/edgenext.tflite", agree)
    line = str(err.value)
    assert "\n" not in line and line.startswith("models/edgenext.tflite: ")
    assert f"(fused) fails in the interpreter: {reason};" in line
    tail = "runs" if stock_runs else "fails the same way"
    assert f"stock (litert-quantizer's int8 of the same file) {tail}; nothing written" in line
    assert _refuse_what_does_not_run("m.tflite", {k: {"verified": True} for k in agree}) is None


# -- the cure for MobileViT's form: 1 / SQRT(y) as RSQRT(y) ---------------------------------------
@pytest.mark.parametrize("c", [1.0, 0.5])
def test_reciprocal_sqrt_becomes_rsqrt_and_its_int8_runs(c: float) -> None:
    """DIV(c, SQRT(y)) over a variance that reaches 0: quantized as written the int8 DIV divides
    by the zero point and fails; as RSQRT it quantizes and runs."""
    from rulekit import G, apply, assert_same_function, ops

    from tflfuse.rules.exporter import ReciprocalSqrtAsRsqrt

    g = G()
    x = g.input((1, 16, 8))
    var = g.op("MEAN", [g.binary("MUL", x, x), g.const(np.array([2], np.int32), "axes")],
               (1, 16, 1), keep_dims=True)  # fmt: skip
    eps = g.binary("ADD", var, g.const(np.array([1e-6], np.float32), "eps"))
    inv = g.op("DIV", [g.const(np.array([c], np.float32), "c"), g.unary("SQRT", eps)], (1, 16, 1))
    before = g.bytes(g.binary("MUL", x, inv))
    after, model, result = apply(before, ReciprocalSqrtAsRsqrt())
    assert result.fired() == {"ReciprocalSqrtAsRsqrt": 1}
    assert "DIV" not in ops(model) and "SQRT" not in ops(model) and "RSQRT" in ops(model)
    assert_same_function(before, after, atol=1e-4, rtol=1e-4)
    pytest.importorskip("litert_quantizer")
    from tflfuse.quantize.quantize import quantize
    from tflfuse.sources import tflite
    from tflfuse.verification.runs import run_float

    def signed(data: bytes) -> bytes:
        return tflite.load(data).float_tflite(None)

    before, after = signed(before), signed(after)
    rng = np.random.default_rng(0)
    calib = rng.normal(0, 2, (16, 16, 8)).astype(np.float32)
    calib[:, :4] = 0  # rows whose variance is 0: 1 / sqrt(eps) is large, sqrt(eps) below a step
    x_eval = calib[:2]
    with pytest.raises(RuntimeError, match="DIV"):  # the int8 DIV divides by its zero point
        run_float(quantize(before, "int8", [calib], progress=False).data, [x_eval])
    got = run_float(quantize(after, "int8", [calib], progress=False).data, [x_eval])[0]
    assert np.all(np.isfinite(got))
