"""The attention product laid out as [1, d, n_c, m_c] (tflfuse/targets/edgetpu/spread.py): the
copies' joins, the per-product choice against the full form (both sides), the forms gate's
refusal, float exactness and the int8 bound, and every op shown mapped."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from rulekit import G, apply, assert_same_function, ops

from tflfuse.ir import Graph, Model, Quantization, flatbuffer
from tflfuse.targets import predict
from tflfuse.targets import target as target_named
from tflfuse.targets.edgetpu import spread
from tflfuse.targets.edgetpu.attention import LegalizeActivationMatmul
from tflfuse.targets.edgetpu.forms import form_of, gate, gated
from tflfuse.targets.edgetpu.predict import statuses_once_quantized
from tflfuse.verification import verify

RULE = "LegalizeActivationMatmul"


def _product(a_shape, b_shape, out_shape) -> bytes:
    """TANH(a) @ TANH(b): two computed operands."""
    g = G()
    a = g.unary("TANH", g.input(a_shape, "a"))
    b = g.unary("TANH", g.input(b_shape, "b"))
    return g.bytes(g.op("BATCH_MATMUL", [a, b], out_shape, adj_x=False, adj_y=False))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 16, 25, 26, 50, 64, 100, 197, 400])
def test_copies_are_joins_of_two_to_four_made_blocks(n: int) -> None:
    made = {1}
    for join in spread.copy_joins(n):
        assert 2 <= len(join) <= 4 and set(join) <= made
        made.add(sum(join))
    assert n in made
    assert len(spread.copy_joins(n)) <= 2 * max(1, n.bit_length())


def test_the_spread_form_is_chosen_where_the_full_forms_kernels_stream() -> None:
    """YOLO26n-320's Q.K^T (2 heads, 100 tokens, depth 32): the full form writes 3 pieces of
    0/1 repeat convs and 32-tap depthwise sums of 3,400 channels, 2.5 MiB a head; the spread
    form 2 pieces whose sums have 100 channels: under a ninetieth of the bytes, no more ops."""
    before = spread.full_cost(32, [34, 33, 33], [100], (1, 1))
    found = spread.choose(32, ([34, 33, 33], [100]), 100, 100, (1, 1), (100, 100))
    assert found == (50, 100)
    after = spread.spread_cost(32, [50, 50], [100], (1, 1))
    assert before.bytes > 2.5 * 2**20 and after.bytes < before.bytes / 90
    assert after.ops <= before.ops and after.ms < before.ms


def test_the_full_form_is_kept_where_its_bytes_are_few() -> None:
    """A product of 8 x 8 over depth 8: the full form's one piece holds ~1 KiB; the spread
    form's copies and reshapes are more ops for bytes that would not stream anyway."""
    before = spread.full_cost(8, [8], [8], (1, 1))
    after = spread.spread_cost(8, [8], [8], (1, 1))
    assert before.bytes < 4096 and after.ops > before.ops and after.ms > before.ms
    assert spread.choose(8, ([8], [8]), 8, 8, (1, 1), (8, 8)) is None


def test_a_chunking_the_forms_gate_does_not_show_is_refused() -> None:
    """197 rows of 64 columns over a depth of 197 in one piece: 2.5 M elements, past every
    shown size of the copies' joins (819,200 elements for 4 inputs)."""
    why = spread.site_refusal(197, [(197, 64)], (1, 1))
    assert why is not None and "of the spread form would not be shown mapped" in why
    assert spread.site_refusal(32, [(50, 100)], (1, 1)) is None


def test_the_spread_product_is_exact_in_float_and_every_op_maps() -> None:
    before = _product((2, 100, 32), (2, 32, 100), (2, 100, 100))
    after, model, result = apply(before, LegalizeActivationMatmul())
    assert result.fired() == {RULE: 1}
    counts = Counter(ops(model))
    assert "BATCH_MATMUL" not in counts
    # per head: 2 pieces (2 sums, 2 MULs), X's conv of ones per row chunk, Y's copies once
    assert counts["DEPTHWISE_CONV_2D"] == 4 and counts["MUL"] == 4 and counts["CONV_2D"] == 4
    sums = [op for op in model.main.ops if op.type == "DEPTHWISE_CONV_2D"]
    assert {tuple(op.inputs[1].shape) for op in sums} == {(1, 32, 1, 100)}
    convs = [op for op in model.main.ops if op.type == "CONV_2D"]
    assert {tuple(op.inputs[1].shape) for op in convs} == {(100, 1, 1, 1)}
    assert_same_function(before, after, atol=1e-5, rtol=1e-5)
    statuses = Counter(key for key, _ in statuses_once_quantized(model.main))
    assert statuses == {"mapped": len(model.main.ops)}
    for op in model.main.ops:  # every gated form shown mapped at its size, once quantized
        if gated(form_of(op, as_quantized=True)):
            assert gate(op, as_quantized=True).answer == "mapped", (op.type, op.outputs[0].shape)


def _q(scale: float, zero: int) -> Quantization:
    return Quantization(scale=np.array([scale], np.float32), zero_point=np.array([zero], np.int64))


def test_the_int8_spread_product_stays_within_its_declared_steps_and_maps() -> None:
    """[2, 64, 16] @ [2, 16, 64] in int8: products at s_t = 13.0 / 255, 16 of them rounded per
    output at s_out = 0.2: ceil(16 * 0.051 / 0.4) + 1 = 4 steps, the full form's bound."""
    g = Graph("main")
    a = g.add_tensor("a", (2, 64, 16), "INT8", quantization=_q(0.02, 0))
    b = g.add_tensor("b", (2, 16, 64), "INT8", quantization=_q(0.02, 0))
    out = g.add_tensor("scores", (2, 64, 64), "INT8", quantization=_q(0.2, 0))
    g.add_op("BATCH_MATMUL", [a, b], [out], {"adj_x": False, "adj_y": False})
    g.inputs, g.outputs = [a, b], [out]
    before = flatbuffer.to_bytes(Model([g]))
    after, model, result = apply(before, LegalizeActivationMatmul())
    [event] = [e for e in result.events if e.rule == RULE]
    assert event.int8_steps == 4
    sums = [op for op in model.main.ops if op.type == "DEPTHWISE_CONV_2D"]
    assert sums and all(op.outputs[0].shape[2] > 1 for op in sums)  # the spread layout
    agreement = verify.compare(before, after, int_atol=event.int8_steps, runs=4)
    assert agreement.ok and agreement.varies, agreement
    p = predict(model, target_named("edgetpu"))
    assert (p.mapped, p.cpu, p.other_readings) == (len(model.main.ops), 0, [])


def test_a_prime_depth_is_padded_with_a_row_of_zeros_exactly() -> None:
    """A.V over DeiT's 197 tokens (a prime): both operands' pieces get one row of zeros (PAD),
    the plane is 99 x 2 and the sums have 198 taps; the products are the same."""
    assert spread.padded(197) == 198 and spread.padded(196) == 196 and spread.padded(3) == 3
    before = _product((1, 197, 197), (1, 197, 64), (1, 197, 64))
    after, model, result = apply(before, LegalizeActivationMatmul())
    assert result.fired() == {RULE: 1}
    counts = Counter(ops(model))
    assert counts["PAD"] >= 2 and "BATCH_MATMUL" not in counts
    sums = [op for op in model.main.ops if op.type == "DEPTHWISE_CONV_2D"]
    assert sums and {op.inputs[1].shape[1] for op in sums} == {198}
    assert_same_function(before, after, atol=1e-4, rtol=1e-4)
    for op in model.main.ops:  # (X's 2-D TRANSPOSEs are the full form's: the int8 stage cuts
        # them into shown pieces, CutTransposeIntoShownForms)
        if gated(form_of(op, as_quantized=True)) and op.type != "TRANSPOSE":
            assert gate(op, as_quantized=True).answer == "mapped", (op.type, op.outputs[0].shape)
