"""The Edge TPU legalization of attention's products (tflfuse/targets/edgetpu/attention.py):
BATCH_MATMUL of two activations and FULLY_CONNECTED with computed weights, spelled out in 1x1
CONV_2Ds, a per-channel MUL and RESHAPE/SLICE/CONCATENATION; float (tight) and int8 (within the
declared steps), the refusals, the encoder export from ../shared and a Keras MultiHeadAttention
model converted end to end."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from conftest import SHARED, benchmark_module
from rulekit import G, apply, assert_same_function, ops, optimize, refusals

from tflfuse.ir import Graph, Model, Quantization, Tensor, flatbuffer
from tflfuse.targets import predict
from tflfuse.targets import target as target_named
from tflfuse.targets.edgetpu import attention
from tflfuse.targets.edgetpu.attention import (
    LegalizeActivationMatmul,
    LegalizeComputedFullyConnected,
    LegalizeNeg,
)
from tflfuse.targets.edgetpu.predict import (
    edgetpu_statuses,
    gate_statuses,
    statuses_once_quantized,
)
from tflfuse.verification import verify

RULE = "LegalizeActivationMatmul"
FC_RULE = "LegalizeComputedFullyConnected"


@pytest.fixture
def per_channel_mul(monkeypatch) -> None:
    """The per-channel-vector MUL ways only (both operands repeated is tried first where it
    fits in FULL_PIECES pieces per head)."""
    monkeypatch.setattr(attention, "FULL_PIECES", 0)


def _mapped_once_quantized(model: Model) -> Counter[str]:
    return Counter(key for key, _ in statuses_once_quantized(model.main))


def _product(a_shape, b_shape, out_shape, **options) -> tuple[bytes, G]:
    """TANH(a) @ TANH(b): two computed operands (the TANHs keep them activations)."""
    g = G()
    a = g.unary("TANH", g.input(a_shape, "a"))
    b = g.unary("TANH", g.input(b_shape, "b"))
    options = {"adj_x": False, "adj_y": False, **options}
    return g.bytes(g.op("BATCH_MATMUL", [a, b], out_shape, **options)), g


# -- float -----------------------------------------------------------------------------------------
@pytest.mark.usefixtures("per_channel_mul")
def test_heads_product_becomes_convs_and_a_per_channel_mul_exactly() -> None:
    """[2, 8, 4] @ [2, 4, 6]: per head a repeat conv, one vector MUL, a summing conv; the
    heads joined and reshaped. Every op maps once quantized (the BATCH_MATMUL did not)."""
    before, _ = _product((2, 8, 4), (2, 4, 6), (2, 8, 6))
    after, model, result = apply(before, LegalizeActivationMatmul())
    assert result.fired() == {RULE: 1}
    counts = Counter(ops(model))
    assert "BATCH_MATMUL" not in counts
    assert counts["CONV_2D"] == 4 and counts["MUL"] == 2 and counts["CONCATENATION"] == 1
    # b arrives as [d, m]: each head's rows are transposed once
    assert counts["TRANSPOSE"] == 2
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)
    assert _mapped_once_quantized(flatbuffer.from_bytes(before))["mapped"] == 2
    assert _mapped_once_quantized(model) == {"mapped": len(model.main.ops)}


@pytest.mark.parametrize(("adj_x", "adj_y"), [(False, False), (False, True), (True, False)])
def test_small_products_use_only_forms_compiled_models_show(adj_x: bool, adj_y: bool) -> None:
    """Both operands repeated to [1, d, 1, n m] by 1x1 convs, a MUL of two tensors of the same
    shape, the sum over d a depthwise conv of ones: exact."""
    n, m, d = 8, 6, 4
    a_shape = (2, d, n) if adj_x else (2, n, d)
    b_shape = (2, m, d) if adj_y else (2, d, m)
    before, _ = _product(a_shape, b_shape, (2, n, m), adj_x=adj_x, adj_y=adj_y)
    after, model, result = apply(before, LegalizeActivationMatmul())
    assert result.fired() == {RULE: 1}
    muls = [op for op in model.main.ops if op.type == "MUL"]
    assert len(muls) == 2 and all(op.inputs[0].shape == op.inputs[1].shape for op in muls)
    assert ops(model).count("DEPTHWISE_CONV_2D") == 2
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


@pytest.mark.usefixtures("per_channel_mul")
@pytest.mark.parametrize(("adj_x", "adj_y"), [(False, True), (True, False), (True, True)])
def test_adjoint_operands_of_four_dimensional_heads(adj_x: bool, adj_y: bool) -> None:
    """[1, H, N, d] heads, either operand transposed by adj_x / adj_y (Q.K^T is adj_y)."""
    n, m, d = 5, 7, 3
    a_shape = (1, 2, d, n) if adj_x else (1, 2, n, d)
    b_shape = (1, 2, m, d) if adj_y else (1, 2, d, m)
    before, _ = _product(a_shape, b_shape, (1, 2, n, m), adj_x=adj_x, adj_y=adj_y)
    after, model, result = apply(before, LegalizeActivationMatmul())
    assert result.fired() == {RULE: 1}
    assert ops(model).count("TRANSPOSE") == 2 * (int(adj_x) + int(not adj_y))
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


@pytest.mark.usefixtures("per_channel_mul")
def test_a_transpose_feeding_the_product_is_read_through() -> None:
    """q @ TRANSPOSE(k, swap last two): k's rows are read as they are; the TRANSPOSE goes."""
    g = G()
    q = g.unary("TANH", g.input((1, 2, 6, 4), "q"))
    k = g.unary("TANH", g.input((1, 2, 6, 4), "k"))
    kt = g.op("TRANSPOSE", [k, g.const(np.array([0, 1, 3, 2]), "perm")], (1, 2, 4, 6))
    before = g.bytes(g.op("BATCH_MATMUL", [q, kt], (1, 2, 6, 6), adj_x=False, adj_y=False))
    after, model, _ = apply(before, LegalizeActivationMatmul())
    assert "TRANSPOSE" not in ops(model) and "BATCH_MATMUL" not in ops(model)
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


def _mha_heads() -> tuple[bytes, G]:
    """Keras/timm-style heads: [1, 6, 8] -> RESHAPE [1, 6, 2, 4] -> TRANSPOSE (0, 2, 1, 3) per
    q, k, v; softmax(q k^T) v; the merge TRANSPOSE back and a RESHAPE to [1, 6, 8]."""
    g = G()
    perm = g.const(np.array([0, 2, 1, 3]), "perm")

    def heads(name: str) -> Tensor:
        t = g.unary("TANH", g.input((1, 6, 8), name))
        t = g.op("RESHAPE", [t, g.const(np.array([1, 6, 2, 4]), f"{name}/s")], (1, 6, 2, 4))
        return g.op("TRANSPOSE", [t, perm], (1, 2, 6, 4))

    q, k, v = heads("q"), heads("k"), heads("v")
    scores = g.op("BATCH_MATMUL", [q, k], (1, 2, 6, 6), adj_x=False, adj_y=True)
    probs = g.op("SOFTMAX", [scores], (1, 2, 6, 6), beta=1.0)
    att = g.op("BATCH_MATMUL", [probs, v], (1, 2, 6, 4), adj_x=False, adj_y=False)
    merged = g.op("TRANSPOSE", [att, perm], (1, 6, 2, 4))
    return g.bytes(g.op("RESHAPE", [merged, g.const(np.array([1, 6, 8]), "o/s")], (1, 6, 8))), g


@pytest.mark.usefixtures("per_channel_mul")
def test_head_split_and_merge_transposes_are_read_through() -> None:
    """The exporters' head TRANSPOSEs ([1, N, H, d] <-> [1, H, N, d], a form no compiled model
    shows mapped) go: each head is a slice of the split's input, and the heads are joined in
    the merge's order. What is left moves 2-D pieces only (v's rows, perm (1, 0))."""
    before, _ = _mha_heads()
    after, model, result = apply(before, LegalizeActivationMatmul())
    assert result.fired() == {RULE: 2}
    transposes = [op for op in model.main.ops if op.type == "TRANSPOSE"]
    assert len(transposes) == 2 and all(len(op.inputs[0].shape) == 2 for op in transposes)
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


@pytest.mark.usefixtures("per_channel_mul")
@pytest.mark.parametrize(("block", "muls", "joins"), [(False, 8, 7), (True, 4, 3)])
def test_shared_operand_and_chunks_within_small_limits(monkeypatch, block, muls, joins) -> None:
    """Limits made small (row 24, RESHAPE 100, TRANSPOSE 64): the product is cut into column
    chunks (and, summed on the grid, row chunks), joined exactly, each head reshaped on its own
    (2 x 10 x 9 > 100); the right operand, shared by both heads, is read once per column
    chunk. Both ways of summing (0/1 blocks, or the grid and a conv of ones)."""
    monkeypatch.setattr(attention, "_limits", lambda: (24, 100, 64))
    monkeypatch.setattr(attention, "_pieces_refusal", lambda plan: None)
    layout = attention._layout
    monkeypatch.setattr(attention, "_layout", lambda p, b: layout(p, b) if b == block else None)
    before, _ = _product((2, 10, 4), (1, 4, 9), (2, 10, 9))
    after, model, result = apply(before, LegalizeActivationMatmul())
    assert result.fired() == {RULE: 1}
    counts = Counter(ops(model))
    # columns: 9 in chunks of <= 6 (24 // 4) -> 5 + 4; grid rows: 100 // (5 * 4) = 5 -> 2
    assert counts["MUL"] == muls
    assert counts["CONCATENATION"] == joins
    assert counts["TRANSPOSE"] == 2  # the shared operand's two column chunks
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


def test_onnx2tf_rows_spread_over_a_broadcast_axis() -> None:
    """onnx2tf's q^T k: [h, N, 1, d] @ [h, 1, d, N] -> [h, N, 1, N], read as [h, N, d] @
    [h, d, N] (one RESHAPE of q); exact."""
    before, _ = _product((2, 6, 1, 4), (2, 1, 4, 5), (2, 6, 1, 5))
    after, model, result = apply(before, LegalizeActivationMatmul())
    assert result.fired() == {RULE: 1}
    assert "BATCH_MATMUL" not in ops(model)
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


@pytest.mark.usefixtures("per_channel_mul")
def test_few_columns_of_a_deep_product_are_computed_transposed(monkeypatch) -> None:
    """A.V-like: 4 rows, 50 columns, depth 30, repeat weights limited to 4 columns: C^T (4
    columns) needs one piece where C needs 13, so C^T is built and turned back per head."""
    monkeypatch.setattr(attention, "PARAMETER_BUDGET", 4 * 30 * 30)
    before, _ = _product((2, 4, 30), (2, 30, 50), (2, 4, 50))
    after, model, result = apply(before, LegalizeActivationMatmul())
    assert result.fired() == {RULE: 1}
    counts = Counter(ops(model))
    assert counts["MUL"] == 2  # one piece per head
    assert counts["TRANSPOSE"] == 2 + 2  # b read as rows, per head; each C^T turned back
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


@pytest.mark.usefixtures("per_channel_mul")
def test_computed_weights_fully_connected_with_its_relu() -> None:
    """FULLY_CONNECTED(x, W) with W computed (onnx2tf's MatMul of two activations): the same
    spelling, W already as rows, the fused RELU on the summing conv."""
    g = G()
    x = g.unary("TANH", g.input((1, 6, 8), "x"))
    w = g.unary("TANH", g.input((5, 8), "w"))
    y = g.op("FULLY_CONNECTED", [x, w, None], (6, 5), fused_activation_function="RELU",
             keep_num_dims=False)  # fmt: skip
    before = g.bytes(y)
    after, model, result = apply(before, LegalizeComputedFullyConnected())
    assert result.fired() == {FC_RULE: 1}
    assert "FULLY_CONNECTED" not in ops(model) and "TRANSPOSE" not in ops(model)
    sums = [op for op in model.main.ops if op.output.name.endswith("/sum")]
    assert [op.fused_activation for op in sums] == ["RELU"]
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


# -- refusals ------------------------------------------------------------------------------------
def test_a_constant_operand_is_left_to_the_fully_connected_rule() -> None:
    g = G()
    x = g.unary("TANH", g.input((1, 4, 3)))
    before = g.bytes(g.op("BATCH_MATMUL", [x, g.rand(3, 5)], (1, 4, 5), adj_x=False, adj_y=False))
    _, model, result = apply(before, LegalizeActivationMatmul())
    assert ops(model) == ["TANH", "BATCH_MATMUL"]
    assert refusals(result, RULE) == ["an operand is constant (BatchMatmulToFullyConnected's case)"]


def test_broadcast_batches_are_refused() -> None:
    before, _ = _product((2, 1, 4, 3), (1, 3, 3, 5), (2, 3, 4, 5))
    _, model, result = apply(before, LegalizeActivationMatmul())
    assert "BATCH_MATMUL" in ops(model)
    assert refusals(result, RULE) == ["its operands broadcast their batch dimensions"]


def test_a_head_larger_than_one_reshape_is_refused() -> None:
    """700 x 700 scores per head: 490000 elements, more than the RESHAPE the compiler is seen
    to map (408000), so the pieces could not be put back together on the Edge TPU."""
    before, _ = _product((1, 700, 2), (1, 2, 700), (1, 700, 700))
    _, model, result = apply(before, LegalizeActivationMatmul())
    assert "BATCH_MATMUL" in ops(model)
    [reason] = refusals(result, RULE)
    assert reason.startswith("its [1, 700, 700] result is larger than one RESHAPE")


def test_a_product_behind_the_cut_is_left_whole() -> None:
    """An operand computed after the segment (EXP is outside the table): the product would run
    on the CPU however it is spelled."""
    g = G()
    a = g.unary("EXP", g.unary("TANH", g.input((2, 4, 3), "a")))
    b = g.unary("TANH", g.input((2, 3, 5), "b"))
    before = g.bytes(g.op("BATCH_MATMUL", [a, b], (2, 4, 5), adj_x=False, adj_y=False))
    _, model, result = apply(before, LegalizeActivationMatmul())
    assert "BATCH_MATMUL" in ops(model)
    [reason] = refusals(result, RULE)
    assert "EXP is not in the Edge TPU op table" in reason


def test_a_biased_computed_weights_product_is_refused() -> None:
    g = G()
    x = g.unary("TANH", g.input((1, 6, 8), "x"))
    w = g.unary("TANH", g.input((5, 8), "w"))
    y = g.op("FULLY_CONNECTED", [x, w, g.rand(5, name="bias")], (1, 6, 5), keep_num_dims=True)
    _, model, result = apply(g.bytes(y), LegalizeComputedFullyConnected())
    assert "FULLY_CONNECTED" in ops(model)
    assert refusals(result, FC_RULE) == ["the product has a bias"]


# -- int8 ----------------------------------------------------------------------------------------
def _q(scale: float, zero: int) -> Quantization:
    return Quantization(scale=np.array([scale], np.float32), zero_point=np.array([zero], np.int64))


def _int8_product(dtype: str = "INT8", out_scale: float = 0.07) -> bytes:
    g = Graph("main")
    a = g.add_tensor("a", (2, 6, 4), dtype, quantization=_q(0.02, 5))
    b = g.add_tensor("b", (2, 4, 5), dtype, quantization=_q(0.03, -7))
    g.inputs = [a, b]
    out = g.add_tensor("scores", (2, 6, 5), dtype, quantization=_q(out_scale, 3))
    g.add_op("BATCH_MATMUL", [a, b], [out], {"adj_x": False, "adj_y": False})
    g.outputs = [out]
    g.validate()
    return flatbuffer.to_bytes(Model([g]))


@pytest.mark.usefixtures("per_channel_mul")
def test_int8_product_stays_within_its_declared_steps_and_maps() -> None:
    before = _int8_product()
    after, model, result = apply(before, LegalizeActivationMatmul())
    [event] = [e for e in result.events if e.rule == RULE]
    # d = 4 products rounded at s_t = (2.66 * 3.63 * 2) / 255 = 0.0757: 4 * 0.0757 / (2 * 0.07)
    # = 2.16 -> 3, plus one for the two final roundings
    assert event.int8_steps == 4
    agreement = verify.compare(before, after, int_atol=event.int8_steps, runs=4)
    assert agreement.ok and agreement.varies, agreement
    assert predict(flatbuffer.from_bytes(before), target_named("edgetpu")).mapped == 0
    _assert_mapped_but_for_the_undecided_muls(model)


def test_an_int8_product_whose_bound_exceeds_four_steps_stays_whole() -> None:
    """The same product with a finer output step: 4 * 0.0757 / (2 * 0.05) = 3.03 -> 4, + 1 = 5
    steps, more than the 4 an int8 legalization may declare (a looser bound checks little)."""
    before = _int8_product(out_scale=0.05)
    _, model, result = apply(before, LegalizeActivationMatmul())
    assert "BATCH_MATMUL" in ops(model)
    [reason] = refusals(result, RULE)
    assert "may differ by 5 steps of the output (at most 4 kept)" in reason


def _assert_mapped_but_for_the_undecided_muls(model: Model) -> None:
    """No compiled model shows a MUL of two activations broadcast against each other
    (delegates/edgetpu_forms.toml): the prediction leaves those MULs (and what they feed) on
    the CPU, and its other reading, where they map, maps every op."""
    p = predict(model, target_named("edgetpu"))
    total = len(model.main.ops)
    muls = [i for i, op in enumerate(model.main.ops) if op.type == "MUL"]
    assert p.mapped < total
    [reading] = [r for r in p.other_readings if set(r.ops) == set(muls)]
    assert reading.mapped == total


def test_int8_computed_weights_fully_connected_within_its_declared_steps() -> None:
    g = Graph("main")
    x = g.add_tensor("x", (1, 6, 8), "INT8", quantization=_q(0.04, -3))
    w = g.add_tensor("w", (5, 8), "INT8", quantization=_q(0.02, 2))
    g.inputs = [x, w]
    out = g.add_tensor("y", (6, 5), "INT8", quantization=_q(0.15, 0))
    g.add_op("FULLY_CONNECTED", [x, w, None], [out], {"keep_num_dims": False})
    g.outputs = [out]
    before = flatbuffer.to_bytes(Model([g]))
    after, model, result = apply(before, LegalizeComputedFullyConnected())
    [event] = [e for e in result.events if e.rule == FC_RULE]
    assert "FULLY_CONNECTED" not in ops(model) and event.int8_steps >= 2
    agreement = verify.compare(before, after, int_atol=event.int8_steps, runs=4)
    assert agreement.ok and agreement.varies, agreement


def test_int8_small_product_maps_with_every_form_shown() -> None:
    """The int8 product spelled with shown forms only: within its declared steps, and every op
    predicted mapped with no undecided form (the per-channel MUL is not used)."""
    before = _int8_product()
    after, model, result = apply(before, LegalizeActivationMatmul())
    [event] = [e for e in result.events if e.rule == RULE]
    assert "DEPTHWISE_CONV_2D" in ops(model)
    agreement = verify.compare(before, after, int_atol=event.int8_steps, runs=4)
    assert agreement.ok and agreement.varies, agreement
    p = predict(model, target_named("edgetpu"))
    assert (p.mapped, p.cpu, p.other_readings) == (len(model.main.ops), 0, [])


def test_uint8_products_are_refused() -> None:
    _, model, result = apply(_int8_product("UINT8"), LegalizeActivationMatmul())
    assert ops(model) == ["BATCH_MATMUL"]
    assert refusals(result, RULE) == [
        "uint8 operands: only float and int8 products are spelled out"
    ]


# -- NEG -------------------------------------------------------------------------------------------
def test_neg_becomes_a_mul_by_minus_one_in_float_only() -> None:
    g = G()
    x = g.unary("TANH", g.input((1, 4, 8)))
    before = g.bytes(g.unary("NEG", x))
    after, model, result = apply(before, LegalizeNeg())
    assert ops(model) == ["TANH", "MUL"]
    assert_same_function(before, after, atol=0.0, rtol=0.0)
    q8 = Graph("main")
    xi = q8.add_tensor("x", (1, 4, 8), "INT8", quantization=_q(0.03, 4))
    yi = q8.add_tensor("y", (1, 4, 8), "INT8", quantization=_q(0.03, -4))
    q8.inputs, q8.outputs = [xi], [yi]
    q8.add_op("NEG", [xi], [yi], {})
    _, model, result = apply(flatbuffer.to_bytes(Model([q8])), LegalizeNeg())
    assert ops(model) == ["NEG"]
    assert refusals(result, "LegalizeNeg") == ["float-only rule; the op is quantized"]


# -- real exports ----------------------------------------------------------------------------------
ENCODER = SHARED / "models" / "pytorch" / "encoder.tflite"


@pytest.mark.skipif(not ENCODER.is_file(), reason="../shared/models/pytorch is absent")
def test_litert_torch_encoder_maps_whole_once_its_products_are_spelled_out() -> None:
    """PyTorch's TransformerEncoderLayer (litert-torch): both products legalized, then the GELU
    behind them (no longer after a cut); every op maps once quantized, where 18 of 57 did."""
    data = ENCODER.read_bytes()
    fused, model, result = optimize(data, target="edgetpu")
    fired = result.fired()
    assert fired[RULE] == 2 and fired["LegalizeGelu"] == 1
    assert "BATCH_MATMUL" not in ops(model) and "GELU" not in ops(model)
    # the head merge (RESHAPE, then TRANSPOSE (2, 0, 1, 3)) is written directly: every TRANSPOSE
    # left moves a 2-D piece
    moved = [op.inputs[0].shape for op in model.main.ops if op.type == "TRANSPOSE"]
    assert moved and all(sum(a > 1 for a in shape) == 2 for shape in moved), moved
    assert _mapped_once_quantized(model) == {"mapped": len(model.main.ops)}
    before = _mapped_once_quantized(flatbuffer.from_bytes(data))
    assert before["mapped"] < len(model.main.ops)
    assert_same_function(data, fused, atol=1e-4, rtol=1e-3)


def _benchmark():
    """benchmarks/attention_edgetpu.py as a module (it is a script, not a package)."""
    return benchmark_module("attention_edgetpu")


def test_keras_multi_head_attention_converts_and_maps_past_its_products(tmp_path) -> None:
    """A Keras MultiHeadAttention block through `convert --recipe edgetpu`: verified, and the
    fused model maps past attention (the stock model stops at its first BATCH_MATMUL)."""
    pytest.importorskip("keras")
    from tflfuse.convert.pipeline import convert_keras

    model, calib = _benchmark().keras_mha_model()  # the block the benchmark measures
    res = convert_keras(model, "edgetpu", calibration=calib, output_dir=tmp_path / "o",
                        progress=False)  # fmt: skip
    report = res.report
    assert report["agreement"]["fused"]["verified"]
    assert report["agreement"]["fused"]["outputs"][0]["top1_agreement"] >= 0.9
    fused, stock = report["edgetpu"]["fused"], report["edgetpu"]["stock"]
    assert "BATCH_MATMUL" in stock["cpu_ops"] and "NEG" in stock["cpu_ops"]
    assert "BATCH_MATMUL" not in fused["cpu_ops"] and "NEG" not in fused["cpu_ops"]
    # the LayerNorm's NEG legalized, litert-quantizer quantizes the fused model itself
    assert report["rules"]["fired"].get("LegalizeNeg", 0) >= 1
    # every op of the fused model maps on its own, or is of a form no compiled model shows
    # (the products' MULs, the exporter's head transposes): undecided, not refused
    refused = _refused_on_their_own(flatbuffer.load(res.fused))
    assert refused == [], refused
    assert _refused_on_their_own(flatbuffer.load(res.stock))
    # the products use shown forms only: the one segment runs past attention, to the
    # LayerNorm's MEAN over the channels (a reduction form no compiled model shows)
    assert fused["cut"]["op"] == "MEAN" and fused["mapped"] > 90 > 10 > stock["mapped"]


def _refused_on_their_own(model: Model) -> list[str]:
    statuses, undecided = gate_statuses(model.main, edgetpu_statuses(model))
    return [
        f"{i} {op.type}: {why}"
        for i, (op, (key, why)) in enumerate(zip(model.main.ops, statuses))
        if key != "mapped" and i not in undecided and op.type not in ("QUANTIZE", "DEQUANTIZE")
    ]


def test_a_movement_chain_is_planned_with_its_transpose_inside_the_three_innermost_dims() -> None:
    """Coral's rank rule (only the 3 innermost dimensions may exceed 1, `predict._outer_dimension`)
    also holds for the transpose the movement canonicalization writes: [16, 1, 1, 16] with the
    two 16s swapped is planned over [16, 16] instead, and the plan with the outer dimension is
    refused where the target limits the dimensions."""
    from tflfuse.rules.exporter import _Plan, _squeezed, _transpose_fits

    outer = _Plan([0, 0, 0, 0], [16, 1, 1, 16], [16, 1, 1, 16], [3, 1, 2, 0])
    assert not _transpose_fits(outer, 3)
    inner = _squeezed(outer)
    assert (inner.dims, inner.perm) == ([16, 16], [1, 0]) and _transpose_fits(inner, 3)
    moved = np.arange(256).reshape(16, 16)
    assert np.array_equal(
        moved.reshape(outer.dims).transpose(outer.perm).reshape(-1),
        moved.reshape(inner.dims).transpose(inner.perm).reshape(-1),
    )
