"""TileBroadcastOperand: a squeeze-excite MUL of two int8 activations, one broadcast against the
other (a form no compiled model shows mapped), becomes a TILE and a MUL of one shape (forms
compiled models show mapped): bit-identical, and predicted mapped where it was undecided."""

from __future__ import annotations

import numpy as np
from rulekit import apply, ops, refusals

from tflfuse.ir import Graph, Model, Quantization, flatbuffer
from tflfuse.targets.edgetpu.broadcast import TileBroadcastOperand
from tflfuse.targets.edgetpu.forms import gate
from tflfuse.verification import verify

RULE = "TileBroadcastOperandMul"


def quantized(scale: float, zero: int) -> Quantization:
    return Quantization(scale=np.array([scale], np.float32), zero_point=np.array([zero], np.int64))


def squeeze_excite(plane: int = 8, channels: int = 16, dtype: str = "INT8", swap=False) -> bytes:
    """x [1, P, P, C] -> MEAN over the plane [1, 1, 1, C] -> LOGISTIC -> MUL(x, gate)."""
    g = Graph("main")

    def q(scale: float, zero: int) -> Quantization | None:  # float tensors carry none
        return quantized(scale, zero) if dtype != "FLOAT32" else None

    x = g.add_tensor("x", (1, plane, plane, channels), dtype, quantization=q(0.05, 3))
    g.inputs.append(x)
    axes = g.add_constant("axes", np.array([1, 2], np.int32))
    mean = g.add_tensor("mean", (1, 1, 1, channels), dtype, quantization=q(0.04, 1))
    g.add_op("MEAN", [x, axes], [mean], {"keep_dims": True})
    sig = g.add_tensor("gate", (1, 1, 1, channels), dtype, quantization=q(1 / 256, -128))
    g.add_op("LOGISTIC", [mean], [sig])
    out = g.add_tensor("out", x.shape, dtype, quantization=q(0.03, -2))
    g.add_op("MUL", [sig, x] if swap else [x, sig], [out], {"fused_activation_function": "NONE"})
    g.outputs = [out]
    g.validate()
    return flatbuffer.to_bytes(Model([g]))


def _mul_verdict(data: bytes) -> str:
    model = flatbuffer.from_bytes(data)
    return next(gate(op).answer for op in model.main.ops if op.type == "MUL")


def test_a_squeeze_excite_mul_is_tiled_bit_identically_into_forms_shown_mapped() -> None:
    for swap in (False, True):
        before = squeeze_excite(swap=swap)
        assert _mul_verdict(before) == "undecided"  # no compiled model shows the broadcast MUL
        after, model, result = apply(before, TileBroadcastOperand("MUL"))
        assert ops(model) == ["MEAN", "LOGISTIC", "TILE", "MUL"], refusals(result, RULE)
        assert [e.rule for e in result.events] == [RULE]
        for op in model.main.ops[2:]:
            assert gate(op).answer == "mapped", gate(op).reason
        agreement = verify.compare(before, after, runs=3, int_atol=0)
        assert agreement.identical and agreement.varies, agreement


def test_a_tile_larger_than_any_compiled_model_shows_is_refused() -> None:
    before = squeeze_excite(plane=96, channels=64)  # 589824 elements: TILE seen up to 139392
    _, model, result = apply(before, TileBroadcastOperand("MUL"))
    assert "TILE" not in ops(model)
    assert any("its TILE is not shown mapped" in r for r in refusals(result, RULE))


def test_a_float_graph_waits_for_quantization() -> None:
    before = squeeze_excite(dtype="FLOAT32")
    _, model, result = apply(before, TileBroadcastOperand("MUL"))
    assert "TILE" not in ops(model)
    assert any("float graph" in r for r in refusals(result, RULE))
