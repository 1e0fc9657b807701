"""RunPatchPositionsApart: a MobileViT block (timm's unfold of 2 x 2 patches, as an NCHW
exporter writes it around NHWC convolutions, a transformer acting on each patch position alone,
the fold) written per patch position: a window of the unfold's source per position, the
transformer once per position, the fold as a channel join, a nearest resize, a 0/1 mask and a
one-hot 1 x 1 conv. Float, exact; every tensor at most 3 dims > 1."""

from __future__ import annotations

import numpy as np
from rulekit import G, apply, assert_same_function, edgetpu_placed, ops, refusals
from test_rules_property_int8 import int8_twin

from tflfuse.ir import Tensor, flatbuffer
from tflfuse.targets.edgetpu.headsplit import nontrivial
from tflfuse.targets.edgetpu.patchbranches import RunPatchPositionsApart
from tflfuse.targets.edgetpu.rowmean import ReplicateRowMean

RULE = "RunPatchPositionsApart"


def _move(g: G, kind: str, x: Tensor, arg: list[int], shape: tuple[int, ...]) -> Tensor:
    options = {"new_shape": list(arg)} if kind == "RESHAPE" else {}
    return g.op(kind, [x, g.const(np.array(arg, np.int32), "arg")], shape, **options)


def _transformer(g: G, t: Tensor, attention: bool, mix: bool) -> Tensor:
    """[P, N, C] tokens -> (attention over N per position) -> MLP -> residual, as timm writes
    them through litert-torch (rows of [1, P N, C] for the row-wise ops)."""
    p, n, c = t.shape
    if attention:
        kt = g.op("TRANSPOSE", [t, g.const(np.array([0, 2, 1], np.int32))], (p, c, n))
        s = g.op("BATCH_MATMUL", [t, kt], (p, n, n))
        a = g.op("SOFTMAX", [s], (p, n, n), beta=1.0)
        t = g.binary("ADD", t, g.op("BATCH_MATMUL", [a, t], (p, n, c)))
    rows = _move(g, "RESHAPE", t, [1, p * n, c], (1, p * n, c))
    axis = 1 if mix else 2
    mean = g.op("MEAN", [rows, g.const(np.array([axis], np.int32))],
                (1, 1, c) if mix else (1, p * n, 1), keep_dims=True)  # fmt: skip
    centred = g.binary("SUB", rows, mean)
    h = g.op("FULLY_CONNECTED", [centred, g.rand(2 * c, c), g.rand(2 * c, name="b")],
             (1, p * n, 2 * c), fused_activation_function="NONE", keep_num_dims=True)  # fmt: skip
    h = g.binary("MUL", h, g.unary("LOGISTIC", h))
    h = g.op("FULLY_CONNECTED", [h, g.rand(c, 2 * c), g.rand(c, name="b")], (1, p * n, c),
             fused_activation_function="NONE", keep_num_dims=True)  # fmt: skip
    return g.binary("ADD", rows, g.binary("MUL", h, g.const(np.full(1, 0.5, np.float32))))


def mobilevit_block(h: int = 8, c: int = 8, attention: bool = True, mix: bool = False) -> bytes:
    """NHWC x -> 1x1 conv -> TRANSPOSE to NCHW -> timm's unfold -> transformer -> fold ->
    TRANSPOSE to NHWC -> 1x1 conv."""
    g, p = G(), 2
    n = h // p
    x = g.input((1, h, h, c), "x")
    a = g.conv(x, c)
    a = _move(g, "TRANSPOSE", a, [0, 3, 1, 2], (1, c, h, h))
    a = _move(g, "RESHAPE", a, [c * n, p, n, p], (c * n, p, n, p))
    a = _move(g, "TRANSPOSE", a, [0, 2, 1, 3], (c * n, n, p, p))
    a = _move(g, "RESHAPE", a, [1, c, n * n, p * p], (1, c, n * n, p * p))
    a = _move(g, "TRANSPOSE", a, [0, 3, 2, 1], (1, p * p, n * n, c))
    a = _move(g, "RESHAPE", a, [p * p, n * n, c], (p * p, n * n, c))
    a = _transformer(g, a, attention, mix)
    a = _move(g, "RESHAPE", a, [1, p * p, n * n, c], (1, p * p, n * n, c))
    a = _move(g, "TRANSPOSE", a, [0, 3, 2, 1], (1, c, n * n, p * p))
    a = _move(g, "RESHAPE", a, [c * n, n, p, p], (c * n, n, p, p))
    a = _move(g, "TRANSPOSE", a, [0, 2, 1, 3], (c * n, p, n, p))
    a = _move(g, "RESHAPE", a, [1, c, h, h], (1, c, h, h))
    a = _move(g, "TRANSPOSE", a, [0, 2, 3, 1], (1, h, h, c))
    return g.bytes(g.conv(a, c))


def _widest(data: bytes) -> int:
    graph = flatbuffer.from_bytes(data).main
    return max(nontrivial(t.shape) for t in graph.tensors if not t.is_constant)


def test_the_positions_run_apart_exactly_with_attention_per_position() -> None:
    before = mobilevit_block()
    after, model, result = apply(before, RunPatchPositionsApart())
    assert result.fired() == {RULE: 1}
    assert _widest(before) == 4 and _widest(after) == 3
    kinds = ops(model)
    # the transformer once per position: 2 products of two activations and 2 FCs each
    assert kinds.count("BATCH_MATMUL") == 8 and kinds.count("FULLY_CONNECTED") == 8
    assert kinds.count("SLICE") == 4 and kinds.count("RESIZE_NEAREST_NEIGHBOR") == 1
    assert kinds.count("CONCATENATION") == 1 and kinds.count("CONV_2D") == 3
    # float round-off only: the same products, the fold adds zeros
    agreement = assert_same_function(before, after, atol=1e-5, rtol=1e-5)
    assert agreement.max_abs <= 1e-5


def test_the_block_maps_whole_once_its_positions_run_apart() -> None:
    before = mobilevit_block(attention=False)
    # the LayerNorm's row mean is ReplicateRowMean's (as in the edgetpu pipeline), on both sides
    reference, _, _ = apply(before, ReplicateRowMean())
    after, model, result = apply(before, RunPatchPositionsApart(), ReplicateRowMean())
    assert result.fired() == {RULE: 1, "ReplicateRowMean": 4}
    assert_same_function(before, after, atol=1e-5, rtol=1e-5)
    # int8 twins, predicted with the forms evidence: the source cuts at the unfold (a tensor of
    # 4 dims > 1, op 2); the result maps whole
    assert edgetpu_placed(int8_twin(reference)) == (2, 23)
    assert edgetpu_placed(int8_twin(after)) == (len(ops(model)), 0) == (59, 0)


def test_an_op_mixing_the_positions_keeps_the_block_as_it_is() -> None:
    before = mobilevit_block(attention=False, mix=True)
    _, model, result = apply(before, RunPatchPositionsApart())
    assert result.fired() == {}
    assert any("MEAN reduces over the patch positions" in r for r in refusals(result, RULE))
    assert ops(model) == ops(flatbuffer.from_bytes(before))
