"""NormalizeTwice (targets/edgetpu/renorm.py): a row normalization c * rsqrt(mean(c^2) + eps)
normalized once more, in each exporter's spelling (litert-torch's shortened, onnx2tf's with
DIV(1, SQRT), an RMSNorm); float exact; int8 (litert-quantizer, with the recorded ranges) the
output is the exact normalization of the int8 first output within the declared bound, and far
closer to the float model than the normalization as written; other arithmetic left alone."""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import G, apply, assert_same_function, ops, refusals
from test_edgetpu_rowmean import _undecided

from tflfuse.ir import Graph, Quantization
from tflfuse.quantize.range_hints import hinted_ranges
from tflfuse.rules.exporter import ReciprocalSqrtAsRsqrt
from tflfuse.targets.edgetpu import renorm
from tflfuse.targets.edgetpu.renorm import NormalizeTwice
from tflfuse.targets.edgetpu.rowmean import ReplicateRowMean

RULE = "NormalizeTwice"
ROWS, C = 64, 24


def normalization(g: G, x, form: str, eps: float = 1e-5):
    """c * 1/sqrt(mean(c^2) + eps) over the last axis: `form` "litert" (SQUARED_DIFFERENCE
    of x and its mean, RSQRT: ShortenLayerNorm's), "onnx2tf" (SUB, MUL(c, c), DIV(1, SQRT)),
    "rms" (no centring: MUL(x, x), RSQRT)."""
    row = (*x.shape[:-1], 1)
    axis = g.const(np.array([len(x.shape) - 1], np.int32), "axis")
    if form == "rms":
        c = x
        sq = g.op("MUL", [x, x], x.shape)
    else:
        mu = g.op("MEAN", [x, axis], row, keep_dims=True)
        c = g.op("SUB", [x, mu], x.shape)
        sq = g.op("MUL", [c, c], x.shape) if form == "onnx2tf" else g.op(
            "SQUARED_DIFFERENCE", [x, mu], x.shape)  # fmt: skip
    var = g.op("MEAN", [sq, axis], row, keep_dims=True)
    shifted = g.op("ADD", [var, g.const(np.array([eps], np.float32), "eps")], row)
    if form == "onnx2tf":
        std = g.op("SQRT", [shifted], row)
        r = g.op("DIV", [g.const(np.array([1.0], np.float32), "one"), std], row)
    else:
        r = g.op("RSQRT", [shifted], row)
    return g.op("MUL", [c, r], x.shape)


def _model(form: str, eps: float = 1e-5) -> bytes:
    from tflfuse.sources import tflite as tflite_frontend

    g = G()
    x = g.input((1, ROWS, C))
    return tflite_frontend.load(g.bytes(normalization(g, x, form, eps))).float_tflite(None)


def _rows(n: int, seed: int) -> np.ndarray:
    """Rows whose scales spread over two decades (a transformer's rows: most small, a few
    large) around per-row offsets."""
    rng = np.random.default_rng(seed)
    scale = np.exp(rng.uniform(np.log(0.2), np.log(2.0), (n, ROWS, 1)))
    return (rng.standard_normal((n, ROWS, C)) * scale + rng.standard_normal((n, ROWS, 1))).astype(
        np.float32
    )


@pytest.mark.parametrize("form", ["litert", "onnx2tf", "rms"])
def test_each_spelling_is_normalized_twice_exactly_in_mapped_forms(form: str) -> None:
    before = _model(form)
    rules = (NormalizeTwice(), ReplicateRowMean(), ReciprocalSqrtAsRsqrt())
    after, model, result = apply(before, *rules)
    assert result.fired()[RULE] == 1  # once: the rewritten form reads its first factor twice
    kinds = ops(model)
    assert kinds.count("RSQRT") == 2 and "MEAN" not in kinds and "DIV" not in kinds
    assert kinds.count("MUL") == 5 + (form != "litert")  # c r1, c1^2, r1^2, eps r1^2, c1 r2
    assert _undecided(model) == []  # every op of a form compiled models show mapped
    hinted = {
        t.name.split("/")[1]: (float(t.quantization.min[0]), float(t.quantization.max[0]))
        for t in model.main.tensors
        if t.quantization is not None and t.quantization.min is not None
    }
    assert hinted == {"second_variance": (0.0, 4.0), "second_factor": (0.0, 2.0)}, hinted
    assert_same_function(before, after, atol=1e-5, rtol=1e-4)


def test_without_eps_it_is_normalized_twice_once() -> None:
    """eps = 0 writes no eps r1^2 (r1 is read once): the squared output still marks it done
    (alone, without ReplicateRowMean taking its MEANs away)."""
    before = _model("litert", eps=0.0)
    after, model, result = apply(before, NormalizeTwice())
    assert result.fired()[RULE] == 1 and ops(model).count("RSQRT") == 2
    assert_same_function(before, after, atol=1e-5, rtol=1e-4)


def test_other_arithmetic_is_left_alone() -> None:
    """c * rsqrt(mean(d^2) + eps) with d not c, and a mean over another axis: no rule fires."""
    g = G()
    x = g.input((1, ROWS, C))
    row = (1, ROWS, 1)
    d = g.op("ADD", [x, g.const(np.full(C, 0.5, np.float32))], x.shape)
    var = g.op("MEAN", [g.op("MUL", [d, d], x.shape), g.const(np.array([2], np.int32))], row,
               keep_dims=True)  # fmt: skip
    r = g.op("RSQRT", [g.op("ADD", [var, g.const(np.array([1e-5], np.float32))], row)], row)
    out1 = g.op("MUL", [x, r], x.shape)
    cols = g.op("MEAN", [g.op("MUL", [x, x], x.shape), g.const(np.array([1], np.int32))],
                (1, 1, C), keep_dims=True)  # fmt: skip
    r2 = g.op("RSQRT", [g.op("ADD", [cols, g.const(np.array([1e-5], np.float32))], (1, 1, C))],
              (1, 1, C))  # fmt: skip
    out2 = g.op("MUL", [x, r2], x.shape)
    _, model, result = apply(g.bytes(out1, out2), NormalizeTwice())
    assert RULE not in result.fired() and ops(model).count("RSQRT") == 2
    assert set(refusals(result, RULE)) == {"not a normalization c * rsqrt(mean(c^2) + eps)"}


def test_a_recorded_range_widens_a_calibrated_one_and_never_narrows_it() -> None:
    g = Graph("main")
    a = g.add_tensor("a", (4,))
    a.quantization = Quantization(min=np.array([0.0], np.float32), max=np.array([4.0], np.float32))
    b = g.add_tensor("b", (4,))
    b.quantization = Quantization(min=np.array([0.0], np.float32), max=np.array([1.0], np.float32))
    stats = {"a": {"min": np.float32(0.9), "max": np.float32(1.1)},
             "b": {"min": np.float32(-2.0), "max": np.float32(3.0)}}  # fmt: skip
    out, changed = hinted_ranges(g, stats)
    assert (float(out["a"]["min"]), float(out["a"]["max"])) == (0.0, 4.0)
    assert (float(out["b"]["min"]), float(out["b"]["max"])) == (-2.0, 3.0)
    assert list(changed) == ["a"] and float(stats["a"]["max"]) == np.float32(1.1)


def _int8_values(data: bytes, xs: np.ndarray) -> dict[str, np.ndarray]:
    """Every int8 tensor of the model, dequantized, on each input; with its scale under
    NAME + '#scale'."""
    from tflfuse.device.interpreter import make_interpreter

    it = make_interpreter(data, delegate="none", keep_all=True)
    inp = it.get_input_details()[0]
    values: dict[str, list[np.ndarray]] = {}
    scales: dict[str, float] = {}
    for x in xs:
        it.set_tensor(inp["index"], x[None])
        it.invoke()
        for d in it.get_tensor_details():
            scale, zero = d["quantization"]
            if d["dtype"] != np.int8 or not scale:
                continue
            v = it.get_tensor(d["index"]).astype(np.float64)
            values.setdefault(d["name"], []).append((v - zero) * scale)
            scales[d["name"]] = scale
    out = {k: np.stack(v) for k, v in values.items()}
    out.update({k + "#scale": np.float64(s) for k, s in scales.items()})
    return out


def _named(values: dict[str, np.ndarray], suffix: str) -> tuple[np.ndarray, float]:
    name = next(k for k in values if k.endswith(suffix) and "#" not in k)
    return values[name][:, 0], float(values[name + "#scale"])


def test_int8_the_second_factor_is_within_its_bound_and_the_output_far_closer() -> None:
    """Quantized by litert-quantizer: the second factor is within `renorm`'s declared bound
    of the exact factor of the int8 first output c1, and the output within one step of c1
    times it. Against the float model the rms error falls under half of the form as written
    (measured here: 0.117 -> 0.058 of the output's rms, rows whose scales spread over a
    decade)."""
    pytest.importorskip("litert_quantizer")
    from tflfuse.quantize.quantize import quantize
    from tflfuse.verification.runs import run_float

    before = _model("litert")
    written, _, _ = apply(before, ReplicateRowMean())
    after, _, _ = apply(before, NormalizeTwice(), ReplicateRowMean())
    calib, xs = _rows(64, 1), _rows(16, 2)
    ref = run_float(before, [xs])[0]
    int8 = {k: quantize(v, "int8", [calib], progress=False).data for k, v in
            (("written", written), ("after", after))}  # fmt: skip

    def rms(data: bytes) -> float:
        got = run_float(data, [xs])[0]
        return float(np.sqrt(((got - ref) ** 2).mean() / (ref**2).mean()))

    error, written_error = rms(int8["after"]), rms(int8["written"])
    assert error < 0.6 * written_error, (error, written_error)
    values = _int8_values(int8["after"], xs)
    c1, s_c1 = _named(values, "/once")
    squares, s_sq = _named(values, "/once_squared")
    _, s_add = _named(values, "/once_squared_eps")
    e2, s_e2 = _named(values, "/eps_scaled")
    v2, s_v = _named(values, "/second_variance/replicated_rows")
    r2, s_r = _named(values, "/second_factor")
    assert s_v == pytest.approx(renorm.SECOND_VARIANCE_MAX / 255, rel=1e-3)
    # exact: the second variance of the int8 c1 (its squares and eps r1^2 as the model has them)
    exact_v = (c1**2).mean(axis=-1, keepdims=True) + e2[..., :1]
    reach = (s_sq + s_add + s_e2 + s_v) / 2 + 1e-9  # renorm.py's "int8 bound"
    lo, hi = np.maximum(exact_v - reach, 1e-6), exact_v + reach
    bound = np.maximum(np.abs(lo**-0.5 - exact_v**-0.5), np.abs(hi**-0.5 - exact_v**-0.5)) + s_r
    inside = (exact_v + reach < renorm.SECOND_VARIANCE_MAX) & (exact_v**-0.5 < 2.0 - s_r)
    err = np.abs(r2[..., :1] - exact_v**-0.5)  # r2 holds the row's factor in every element
    assert inside.mean() > 0.99
    assert np.all(err[inside] <= bound[inside]), float((err - bound)[inside].max())
    assert np.abs(v2 - exact_v).max() <= reach
    y, s_y = values["mul"][:, 0], float(values["mul#scale"])  # the root's tensor: the output
    assert np.all(np.abs(y - c1 * r2) <= s_y + 1e-9)  # one rounding, at most one step
    assert squares.shape == c1.shape
