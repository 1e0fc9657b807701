"""A float GELU quantized next is left to its int8 form (LegalizeGeluInt8), not spelled as the
tanh form (LegalizeGelu), whose x^2 and x^3 take int8 ranges of the square and cube of x's.

The failure mode, in numbers: each tensor of the tanh spelling quantized per tensor over the
values x's 256 codes give it (what calibration over those inputs gives), against the int8 GELU
of the same parameters. Its error grows as the cube of x's range; the sloped swish's, measured
by the rule over the same codes, stays at 2 steps.
"""

from __future__ import annotations

import math

import numpy as np
from irgraphs import fully_connected, model_of, to_bytes
from rulekit import apply, ops, refusals
from test_edgetpu_heads import Head

from tflfuse.convert.optimize import optimize_bytes
from tflfuse.convert.rule_sets import pipeline
from tflfuse.ir import Graph, Quantization, flatbuffer
from tflfuse.targets import target as target_named
from tflfuse.targets.edgetpu.gelu import (
    MAX_STEPS,
    LegalizeGeluInt8,
    float_gelu_lifted,
    form_error,
    gelu_steps,
)


def _fc_gelu() -> bytes:
    g = Graph("main")
    x = g.add_tensor("x", (4, 6))
    fc = fully_connected(g, x, 8)
    y = g.add_tensor("y", (4, 8))
    g.add_op("GELU", [fc.output], [y], {"approximate": False})
    return to_bytes(model_of(g, [x], [y]))


def _params(lo: float, hi: float) -> tuple[float, int]:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255
    return scale, round(-128 - lo / scale)


def _q(v: np.ndarray, scale: float, zero: int) -> np.ndarray:
    return (np.clip(np.round(v / scale) + zero, -128, 127) - zero) * scale


def _calibrated(v: np.ndarray) -> np.ndarray:
    return _q(v, *_params(float(v.min()), float(v.max())))


def _erf_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _tanh_form_steps(bound: float) -> tuple[int, tuple[float, int, float, int]]:
    """Largest |tanh spelling in int8 - int8 GELU| over x's codes, in y's steps, and the
    (s_x, z_x, s_y, z_y) of that GELU (x in [-bound, bound])."""
    s_x, z_x = _params(-bound, bound)
    x = s_x * (np.arange(-128, 128, dtype=np.float64) - z_x)
    x3 = _calibrated(_calibrated(x * x) * x)
    inner = _calibrated(x + _calibrated(x3 * 0.044715))
    th = _calibrated(np.tanh(_calibrated(inner * math.sqrt(2 / math.pi))))
    spelled = _calibrated(x * 0.5) * _calibrated(th + 1)
    ref = _erf_gelu(x)
    s_y, z_y = _params(float(ref.min()), float(ref.max()))
    steps = np.abs(_q(spelled, s_y, z_y) - _q(ref, s_y, z_y)).max() / s_y
    return round(float(steps)), (s_x, z_x, s_y, z_y)


def test_the_tanh_form_loses_the_signal_in_int8_where_the_int8_form_does_not() -> None:
    small, params = _tanh_form_steps(4.0)
    assert small <= 1 and gelu_steps(*params, approximate=False) <= 3
    # EfficientFormer-L1's GELU inputs span +-10 to +-23 (litert-quantizer's calibration)
    wide, params = _tanh_form_steps(20.0)
    assert wide >= 2 * MAX_STEPS  # 8 steps
    assert gelu_steps(*params, approximate=False) == 2


def test_edgetpu_float_stage_leaves_gelu_for_its_int8_form_when_quantized_next() -> None:
    edgetpu = target_named("edgetpu")
    names = {type(r).__name__ for r in pipeline(2, edgetpu, before_int8=True)}
    assert "LegalizeGelu" not in names and "LegalizeGeluInt8" in names
    assert "LegalizeGelu" in {type(r).__name__ for r in pipeline(2, edgetpu)}
    assert "LegalizeGeluInt8" in {type(r).__name__ for r in pipeline(2, edgetpu, quantized=True)}
    kept = optimize_bytes(_fc_gelu(), target="edgetpu", before_int8=True)
    assert kept.after["op_counts"].get("GELU") == 1
    spelled = optimize_bytes(_fc_gelu(), target="edgetpu")  # a float model that stays float
    assert "GELU" not in spelled.after["op_counts"]


def test_the_int8_form_is_refused_where_its_measured_error_exceeds_its_bound() -> None:
    """The check that now carries every GELU of a quantized model can fail: an output step of
    0.004 (y spans about 1 over its 256 codes) makes the sloped swish's 0.02 off GELU 8 steps,
    which the cubic form (the tanh form's argument) brings to 3; at a step of 0.001 it is 6
    (the sloped one 26), and the GELU stays."""

    def int8_gelu(s_y: float, z_y: int) -> bytes:
        h = Head()
        x = h.input((1, 16, 16), "x")
        x.quantization = Quantization(np.array([0.02], np.float32), np.array([0], np.int64))
        return h.bytes(h.op("GELU", [x], x.shape, s_y, z_y))

    assert gelu_steps(0.02, 0, 0.004, -100, approximate=False) == 8
    assert form_error("cubic", 0.02, 0, 0.004, -100, approximate=False)[1] == 3
    _, model, result = apply(int8_gelu(0.004, -100), LegalizeGeluInt8())
    assert result.fired() == {"LegalizeGeluInt8": 1}
    assert ops(model) == ["MUL", "MUL", "ADD", "MUL", "LOGISTIC", "MUL", "MUL"]
    assert result.events[0].int8_steps == 3
    _, model, result = apply(int8_gelu(0.001, 0), LegalizeGeluInt8())
    assert ops(model) == ["GELU"]
    assert refusals(result, "LegalizeGeluInt8") == [
        f"x sigma(1.702 x) and its cubic form are 6 steps off GELU here (at most {MAX_STEPS})"
    ]
    _, model, result = apply(int8_gelu(0.02, -110), LegalizeGeluInt8())  # a coarser output
    assert result.fired() == {"LegalizeGeluInt8": 1}
    assert len(ops(model)) in (4, 7) and ops(model)[-3:] == ["LOGISTIC", "MUL", "MUL"]


def _gelu_then_leaky(shape: tuple[int, ...]) -> bytes:
    """x -> ADD -> GELU -> LEAKY_RELU (float): the legalization after GELU asks where the cut
    falls (the ADD maps, so an op refused after it cuts)."""
    g = Graph("main")
    x = g.add_tensor("x", shape)
    shifted = g.add_tensor("shifted", shape)
    one = g.add_constant("one", np.ones((1,), np.float32))
    g.add_op("ADD", [x, one], [shifted], {"fused_activation_function": "NONE"})
    y = g.add_tensor("gelu", shape)
    g.add_op("GELU", [shifted], [y], {"approximate": False})
    z = g.add_tensor("leaky", shape)
    g.add_op("LEAKY_RELU", [y], [z], {"alpha": 0.1})
    return to_bytes(model_of(g, [x], [z]))


def _float_stage(data: bytes) -> tuple[list[str], list[str]]:
    stage = pipeline(2, target_named("edgetpu"), before_int8=True)
    _, model, result = apply(data, *stage)
    return ops(model), refusals(result, "LegalizeLeakyRelu")


def test_a_float_gelu_left_to_its_int8_form_is_no_cut_for_the_float_legalizations() -> None:
    """The float stage keeps GELU (its int8 form comes after quantizing) and legalizes what
    follows it: GELU is not read as a cut where the quantized stage maps it."""
    after, reasons = _float_stage(_gelu_then_leaky((1, 8, 32)))
    assert "GELU" in after and "LEAKY_RELU" not in after
    assert reasons == []


def test_a_gelu_its_int8_form_cannot_map_stays_a_cut() -> None:
    """Over the row limit the int8 form's MULs are refused too: such a GELU is not lifted (the
    gate keeps reading it as a cut)."""
    for shape, lifted in (((1, 8, 32), True), ((1, 2, 400000), False)):
        gelu = flatbuffer.from_bytes(_gelu_then_leaky(shape)).main.ops[1]
        assert gelu.type == "GELU" and float_gelu_lifted(gelu) is lifted
