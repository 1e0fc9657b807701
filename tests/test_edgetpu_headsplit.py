"""SplitHeadsInWindows: attention's head split through 5-D tensors, written in at most 3 dims > 1.

Synthetic int8 graphs shaped like timm's ViT export (litert-torch and onnx2tf write the same
chain): a fused q/k/v projection [1, N, 3 H d] reshaped to [1, N, 3, H, d], transposed to
[3, 1, H, N, d] and sliced into q, k, v, each read by an op the compiler maps.
"""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import apply, assert_same_function, ops, refusals
from test_edgetpu_heads import Head, identical, mapped

from tflfuse.ir import Quantization
from tflfuse.targets.edgetpu.gelu import LegalizeGeluInt8
from tflfuse.targets.edgetpu.headsplit import SplitHeadsInWindows, window
from tflfuse.targets.edgetpu.rows import SplitFullyConnectedRows

RULE = "SplitHeadsInWindows"


def _float(h: Head) -> None:
    """Make every activation of `h`'s graph float32 (the same chain before quantization)."""
    for t in h.g.tensors:
        if not t.is_constant:
            t.dtype, t.quantization = "FLOAT32", None


def qkv_split(
    tokens: int = 17,
    heads: int = 3,
    depth: int = 8,
    requantize: bool = False,
    f32: bool = False,
    transposed_k: bool = False,
) -> bytes:
    h = Head()
    width = 3 * heads * depth
    x = h.input((1, tokens, width), "x")
    x = h.op("ADD", [x, x], x.shape, fused_activation_function="NONE")  # an op before
    five = h.op("RESHAPE", [x, h.ints([1, tokens, 3, heads, depth])], (1, tokens, 3, heads, depth))
    moved = h.op("TRANSPOSE", [five, h.ints([2, 0, 3, 1, 4])], (3, 1, heads, tokens, depth))
    outs = []
    for i in range(3):
        scale = 0.07 if requantize and i == 2 else 0.05
        part = h.op("SLICE", [moved, h.ints([i, 0, 0, 0, 0]), h.ints([1, 1, heads, tokens, depth])],
                    (1, 1, heads, tokens, depth), scale=scale)  # fmt: skip
        shape = (1, heads, tokens, depth) if i < 2 else (heads, tokens, depth)
        part = h.op("RESHAPE", [part, h.ints(list(shape))], shape, scale=scale)
        if i == 1 and transposed_k:  # onnx2tf's K^T: [1, H, N, d] -> [1, H, d, N]
            shape = (1, heads, depth, tokens)
            part = h.op("TRANSPOSE", [part, h.ints([0, 1, 3, 2])], shape)
        outs.append(h.op("ADD", [part, part], shape, fused_activation_function="NONE"))
    if f32:
        _float(h)
    return h.bytes(*outs)


def test_a_qkv_head_split_is_written_per_head_bit_exactly_and_maps_in_one_segment() -> None:
    before = qkv_split()
    assert mapped(before)[0] == 1  # cut at the 5-D RESHAPE: only the first ADD maps
    after, model, result = apply(before, SplitHeadsInWindows())
    assert result.fired() == {RULE: 1}
    kinds = ops(model)
    assert "TRANSPOSE" not in kinds
    assert kinds.count("SLICE") == 9 and kinds.count("CONCATENATION") == 3
    assert all(sum(d > 1 for d in t.shape) <= 3 for t in model.main.tensors if not t.is_constant)
    assert mapped(after) == (len(kinds), 0)
    identical(before, after)


def test_a_float_head_split_computes_the_same_q_k_v() -> None:
    before = qkv_split(f32=True)
    after, model, result = apply(before, SplitHeadsInWindows())
    assert result.fired() == {RULE: 1} and "TRANSPOSE" not in ops(model)
    assert_same_function(before, after, atol=0, rtol=0)


def test_a_transpose_of_a_head_tensor_that_fits_is_left_to_its_readers() -> None:
    before = qkv_split(transposed_k=True)
    after, model, result = apply(before, SplitHeadsInWindows())
    assert result.fired() == {RULE: 1}
    assert ops(model).count("TRANSPOSE") == 1  # K^T stays; the 5-D transpose goes
    assert all(sum(d > 1 for d in t.shape) <= 3 for t in model.main.tensors if not t.is_constant)
    identical(before, after)


def test_a_chain_that_requantizes_is_left_alone() -> None:
    before = qkv_split(requantize=True)
    _, model, result = apply(before, SplitHeadsInWindows())
    assert RULE not in result.fired()
    assert "requantizes" in " ".join(refusals(result, RULE))
    assert "TRANSPOSE" in ops(model)


@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 12, 10), (6, 5, 1, 4)])
def test_every_window_found_is_the_slice_it_stands_for(shape) -> None:
    rng = np.random.default_rng(1)
    x = np.arange(int(np.prod(shape))).reshape(shape)
    found = 0
    for _ in range(40):
        keys = []
        for d in shape:
            a = int(rng.integers(0, d))
            keys.append(slice(a, int(rng.integers(a + 1, d + 1))))
        g = x[tuple(keys)]
        w = window(g, shape)
        if w is None:
            continue
        found += 1
        view = x.reshape(w.view) if w.view else x
        got = view[tuple(slice(b, b + s) for b, s in zip(w.begin, w.size))]
        assert np.array_equal(got.reshape(-1), g.reshape(-1))
    assert found > 10


# -- SplitFullyConnectedRows ---------------------------------------------------------------------
def fc_rows(side: int = 64, c_in: int = 8, c: int = 48, float32: bool = False) -> bytes:
    """x [1, side^2, c_in] -> FULLY_CONNECTED -> [1, side^2, c] -> RESHAPE [1, side, side, c]."""
    h = Head()
    rows = side * side
    if float32:
        g = h.g
        x = g.add_tensor("x", (1, rows, c_in), "FLOAT32")
        g.inputs.append(x)
        w = g.add_constant("w", h.rng.normal(size=(c, c_in)).astype(np.float32))
        bias = g.add_constant("b", h.rng.normal(size=c).astype(np.float32))
        y = g.add_tensor("y", (1, rows, c), "FLOAT32")
        g.add_op("FULLY_CONNECTED", [x, w, bias], [y], {"fused_activation_function": "NONE",
                 "keep_num_dims": True})  # fmt: skip
        o = g.add_tensor("o", (1, side, side, c), "FLOAT32")
        g.add_op("RESHAPE", [y, h.ints([1, side, side, c])], [o], {})
        r = g.add_tensor("r", o.shape, "FLOAT32")
        g.add_op("RELU", [o], [r], {})
        return h.bytes(r)
    x = h.input((1, rows, c_in), "x")
    q_bias = Quantization(np.array([0.05 * 0.02], np.float32), np.zeros(1, np.int64))
    bias = h.g.add_constant("bias", h.rng.integers(-500, 500, c).astype(np.int32), "INT32", q_bias)
    y = h.op("FULLY_CONNECTED", [x, h.int8((c, c_in)), bias], (1, rows, c), 0.1, -5,
             fused_activation_function="NONE", keep_num_dims=True)  # fmt: skip
    o = h.op("RESHAPE", [y, h.ints([1, side, side, c])], (1, side, side, c), 0.1, -5)
    return h.bytes(h.op("ADD", [o, o], o.shape, fused_activation_function="NONE"))


def test_a_fully_connected_over_the_row_limit_is_computed_in_pieces_of_map_rows_bit_exactly():
    before = fc_rows()
    assert mapped(before) == (1, 2)  # FC and RESHAPE: rows [4096, 48] hold 196608 > 176400
    after, model, result = apply(before, SplitFullyConnectedRows())
    assert result.fired() == {"SplitFullyConnectedRows": 1}
    kinds = ops(model)
    # pieces of 28 map rows (28 x 64 x 48 = 86016, the largest row-split RESHAPE shown mapped)
    assert kinds.count("FULLY_CONNECTED") == 3 and kinds.count("CONCATENATION") == 1
    assert mapped(after) == (len(kinds), 0)
    identical(before, after)


def test_a_float_fully_connected_in_pieces_computes_the_same_rows() -> None:
    before = fc_rows(float32=True)
    after, model, result = apply(before, SplitFullyConnectedRows())
    assert result.fired() == {"SplitFullyConnectedRows": 1}
    assert_same_function(before, after, atol=1e-6, rtol=1e-6)


def test_a_fully_connected_within_the_row_limit_is_left_alone() -> None:
    _, model, result = apply(fc_rows(side=32), SplitFullyConnectedRows())
    assert result.fired() == {} and ops(model).count("FULLY_CONNECTED") == 1


# -- LegalizeGeluInt8 ----------------------------------------------------------------------------
def int8_gelu(approximate: bool = False, x_q=(0.04, 5), y_q=(5.2 / 255, -124)) -> bytes:
    h = Head()
    x = h.input((1, 16, 16), "x")  # 256 values: every code once
    x.quantization = Quantization(np.array([x_q[0]], np.float32), np.array([x_q[1]], np.int64))
    y = h.op("GELU", [x], x.shape, *y_q, approximate=approximate)
    return h.bytes(y)


def every_code(data: bytes) -> np.ndarray:
    """The model's int8 output for each of its input's 256 codes (the reference kernels)."""
    from tflfuse.device.interpreter import make_interpreter

    it = make_interpreter(data, delegate="none")
    it.allocate_tensors()
    it.set_tensor(
        it.get_input_details()[0]["index"], np.arange(-128, 128, dtype=np.int8).reshape(1, 16, 16)
    )
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"]).astype(int).reshape(-1)


@pytest.mark.parametrize("approximate", [False, True])
def test_an_int8_gelu_is_a_sigmoid_swish_within_its_declared_steps_on_every_code(approximate):
    from tflfuse.device.interpreter import make_interpreter

    before = int8_gelu(approximate)
    assert mapped(before) == (0, 1)
    after, model, result = apply(before, LegalizeGeluInt8())
    assert result.fired() == {"LegalizeGeluInt8": 1}
    # the cubic form (x in [-5.3, 4.9]: closer to the kernel than the sloped one)
    assert ops(model) == ["MUL", "MUL", "ADD", "MUL", "LOGISTIC", "MUL", "MUL"]
    assert mapped(after) == (7, 0)
    declared = result.events[0].int8_steps
    assert 1 <= declared <= 4
    codes = np.arange(-128, 128, dtype=np.int8).reshape(1, 16, 16)
    got = []
    for data in (before, after):
        it = make_interpreter(data, delegate="none")
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], codes)
        it.invoke()
        got.append(it.get_tensor(it.get_output_details()[0]["index"]).astype(int))
    worst = int(np.abs(got[0] - got[1]).max())
    assert 0 < worst <= declared  # an approximation, held to what it declares


def test_a_wide_int8_gelu_keeps_its_large_values_where_logistic_saturates() -> None:
    """x up to 20 (EfficientFormer-L1's GELU inputs span +-10 to +-23): LOGISTIC's top code is
    255/256, so x times it falls short of x by x/256, a whole step of y at the top of the
    range. Without the factor 256/255 on x the rewrite's codes differ from the native
    kernel's on 72 of the 256 (59 of the 96 where x >= 5), all low; with it on 5, by one."""
    before = int8_gelu(x_q=(20 / 127, 0), y_q=(20.2 / 255, -126))
    after, model, result = apply(before, LegalizeGeluInt8())
    assert result.fired() == {"LegalizeGeluInt8": 1}
    off = every_code(after) - every_code(before)
    assert np.abs(off).max() == 1 and np.count_nonzero(off) <= 8
    assert abs(off.sum()) <= 2  # no bias: as many codes high as low, near enough
