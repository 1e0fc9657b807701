"""A LayerNorm's mean over the innermost axis as a 1x1 CONV_2D of weights 1/C (targets/edgetpu/
rowmean.py): the shortened litert-torch form and onnx2tf's, float exact; int8 after the recipe's
quantization every op of a form compiled models show mapped (none undecided), within the
declared error of the float model; refused where the column leaves otherwise."""

from __future__ import annotations

import numpy as np
from rulekit import G, apply, assert_same_function, ops, refusals

from tflfuse.ir import flatbuffer
from tflfuse.targets.edgetpu.forms import form_of, gate, gated
from tflfuse.targets.edgetpu.rowmean import ReplicateRowMean
from tflfuse.verification import verify


def layer_norm(g: G, x, onnx: bool = False):
    """(x - mu) * rsqrt(mean((x - mu)^2) + eps), the MEANs over the last axis keeping dims:
    SQUARED_DIFFERENCE (litert-torch, shortened) or SUB then MUL (onnx2tf)."""
    row = (*x.shape[:-1], 1)
    axis = g.const(np.array([len(x.shape) - 1], np.int32), "axis")
    mu = g.op("MEAN", [x, axis], row, keep_dims=True)
    centred = g.op("SUB", [x, mu], x.shape)
    sq = g.op("MUL", [centred, centred], x.shape) if onnx else g.op(
        "SQUARED_DIFFERENCE", [x, mu], x.shape)  # fmt: skip
    var = g.op("MEAN", [sq, axis], row, keep_dims=True)
    r = g.op("RSQRT", [g.op("ADD", [var, g.const(np.array([1e-5], np.float32), "eps")], row)], row)
    return g.op("MUL", [centred, r], x.shape)


def _undecided(model) -> list[str]:
    return [
        gate(op, as_quantized=True).reason
        for op in model.main.ops
        if gated(form_of(op, True)) and gate(op, as_quantized=True).answer != "mapped"
    ]


def test_a_layer_norm_mean_becomes_a_replicating_convolution_exactly() -> None:
    for onnx in (False, True):
        g = G()
        x = g.conv(g.input((1, 8, 8, 16)), 24, 1)
        flat = g.op("RESHAPE", [x, g.const(np.array([1, 64, 24], np.int32), "s")], (1, 64, 24))
        before = g.bytes(layer_norm(g, flat, onnx))
        assert len(_undecided(flatbuffer.from_bytes(before))) == 5 - onnx  # MEANs and one-sided ops
        after, model, result = apply(before, ReplicateRowMean())
        assert result.fired() == {"ReplicateRowMean": 2}
        assert "MEAN" not in ops(model) and ops(model).count("CONV_2D") == 3
        assert _undecided(model) == []
        conv = [op for op in model.main.ops if op.type == "CONV_2D"][1]
        assert np.allclose(conv.inputs[1].data, 1 / 24) and conv.outputs[0].shape == (1, 1, 64, 24)
        assert_same_function(before, after, atol=1e-5, rtol=1e-4)


def test_a_column_read_by_another_kind_of_op_is_refused() -> None:
    g = G()
    x = g.input((1, 64, 24))
    mu = g.op("MEAN", [x, g.const(np.array([2], np.int32), "axis")], (1, 64, 1), keep_dims=True)
    centred = g.op("SUB", [x, mu], x.shape)
    flat = g.op("RESHAPE", [mu, g.const(np.array([1, 64], np.int32), "s")], (1, 64))
    _, model, result = apply(g.bytes(centred, flat), ReplicateRowMean())
    assert ops(model).count("MEAN") == 1
    assert refusals(result, "ReplicateRowMean") == [
        "the mean cannot be replicated over the row: RESHAPE reads the column 'mean' [1, 64, 1]"
        " otherwise"
    ]


def test_int8_the_layer_norm_maps_once_replicated_and_stays_close_to_float() -> None:
    """Quantized (ranges observed on the float graphs), the LayerNorm was cut at its first MEAN;
    replicated, every op maps and its error against the float LayerNorm is no larger."""
    from test_edgetpu_layout import mapped
    from test_rules_property_int8 import observed_ranges, quantize_graph

    g = G()
    x = g.conv(g.input((1, 8, 8, 16)), 24, 1)
    flat = g.op("RESHAPE", [x, g.const(np.array([1, 64, 24], np.int32), "s")], (1, 64, 24))
    before = g.bytes(layer_norm(g, flat))
    after, _, _ = apply(before, ReplicateRowMean())
    int8 = {}
    for key, data in (("before", before), ("after", after)):
        graph = flatbuffer.from_bytes(data).main
        int8[key] = quantize_graph(graph, observed_ranges(graph), float_io=True)
    n_before, n_after = mapped(int8["before"]), mapped(int8["after"])
    # all but the float I/O's QUANTIZE and DEQUANTIZE, which stay on the CPU
    assert n_before == (2, 11) and n_after == (13, 15), (n_before, n_after)
    errors = {k: verify.compare(before, v, atol=10.0, rtol=10.0).max_abs for k, v in int8.items()}
    assert 0 < errors["after"] <= errors["before"] * 1.05 + 1e-3, errors


def test_an_int8_layer_norm_is_replicated_in_the_quantized_stage_too() -> None:
    """Where a float-stage cut kept the float rule off, the int8 graph's MEANs become int8 1x1
    convolutions (weights 127 at 1/(127 C)): every op maps, within a step of the MEAN's."""
    from test_edgetpu_layout import mapped
    from test_rules_property_int8 import observed_ranges, quantize_graph

    g = G()
    x = g.conv(g.input((1, 8, 8, 16)), 24, 1)
    flat = g.op("RESHAPE", [x, g.const(np.array([1, 64, 24], np.int32), "s")], (1, 64, 24))
    graph = flatbuffer.from_bytes(g.bytes(layer_norm(g, flat))).main
    before = quantize_graph(graph, observed_ranges(graph))
    after, model, result = apply(before, ReplicateRowMean())
    assert result.fired() == {"ReplicateRowMean": 2}
    conv = [op for op in model.main.ops if op.type == "CONV_2D"][1]
    assert conv.inputs[1].dtype == "INT8" and set(conv.inputs[1].data.ravel()) == {127}
    assert mapped(before) == (2, 9) and mapped(after) == (13, 13)
    agreement = verify.compare(before, after, int_atol=2, runs=3)
    assert agreement.ok and agreement.varies, agreement
