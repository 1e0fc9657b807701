"""SplitHeadsInWindows: attention's head split through 5-D tensors, written in at most 3 dims > 1.

Synthetic int8 graphs shaped like timm's ViT export (litert-torch and onnx2tf write the same
chain): a fused q/k/v projection [1, N, 3 H d] reshaped to [1, N, 3, H, d], transposed to
[3, 1, H, N, d] and sliced into q, k, v, each read by an op the compiler maps.
"""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import apply, ops, refusals
from test_edgetpu_heads import Head, identical, mapped

from tflfuse.targets.edgetpu.headsplit import SplitHeadsInWindows, window

RULE = "SplitHeadsInWindows"


def qkv_split(tokens: int = 17, heads: int = 3, depth: int = 8, requantize: bool = False) -> bytes:
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
        outs.append(h.op("ADD", [part, part], shape, fused_activation_function="NONE"))
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
