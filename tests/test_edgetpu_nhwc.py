"""An NCHW island between two TRANSPOSEs computed in NHWC (targets/edgetpu/nhwc.py): onnx2tf 2.6's
MobileNetV3 squeeze-excite block (TRANSPOSE, HARD_SWISH, MEAN over [2, 3], the gate's product,
TRANSPOSE back), float exact and int8 within the declared step; refused where a tensor of the
island leaves it in the transposed layout."""

from __future__ import annotations

import numpy as np
from rulekit import G, apply, assert_same_function, ops, refusals
from test_rules_edgetpu import Q8, mapped

from tflfuse.targets.edgetpu.nhwc import ComputeNchwIslandInNhwc, ReduceBeforeTranspose
from tflfuse.verification import verify


def _se_island(g, x, c: int, hw: int, leak: bool = False, int8: bool = False):
    """x [1, hw, hw, c] NHWC -> NCHW island -> NHWC; the gate through the pooled vector."""

    def op(type_, ins, shape, s=0.05, z=0, **o):
        return g.op(type_, ins, shape, s, z, **o) if int8 else g.op(type_, ins, shape, **o)

    const = g.graph.add_constant if int8 else (lambda n, v: g.const(v, n))
    t = op("TRANSPOSE", [x, const("to_nchw", np.array([0, 3, 1, 2], np.int32))], (1, c, hw, hw),
           0.05, -10)  # fmt: skip
    h = op("RELU6", [t], (1, c, hw, hw))
    m = op("MEAN", [h, const("axes", np.array([2, 3], np.int32))], (1, c, 1, 1), 0.02, -100,
           keep_dims=True)  # fmt: skip
    v = op("RESHAPE", [m, const("flat", np.array([1, 1, 1, c], np.int32))], (1, 1, 1, c), 0.02,
           -100)  # fmt: skip
    gate = op("LOGISTIC", [v], (1, 1, 1, c), 1 / 256, -128)
    gate = op("RESHAPE", [gate, const("back", np.array([1, c, 1, 1], np.int32))], (1, c, 1, 1),
              1 / 256, -128)  # fmt: skip
    y = op("MUL", [h, gate], (1, c, hw, hw))
    out = op("TRANSPOSE", [y, const("to_nhwc", np.array([0, 2, 3, 1], np.int32))], (1, hw, hw, c))
    return (out, h) if leak else (out,)


def test_a_float_squeeze_excite_island_is_computed_in_nhwc_exactly() -> None:
    g = G()
    x = g.input((1, 7, 7, 16))
    before = g.bytes(*_se_island(g, x, 16, 7))
    after, model, result = apply(before, ComputeNchwIslandInNhwc())
    assert result.fired() == {"ComputeNchwIslandInNhwc": 1}
    assert "TRANSPOSE" not in ops(model)
    mean = next(op for op in model.main.ops if op.type == "MEAN")
    assert [int(a) for a in mean.inputs[1].data] == [1, 2]
    assert mean.outputs[0].shape == (1, 1, 1, 16)
    assert_same_function(before, after, atol=1e-6, rtol=1e-5)


def test_an_int8_squeeze_excite_island_keeps_the_function_and_maps_more() -> None:
    g = Q8()
    x = g.input((1, 14, 14, 24), 0.05, -10)
    before = g.bytes(*_se_island(g, x, 24, 14, int8=True))
    after, model, result = apply(before, ComputeNchwIslandInNhwc())
    assert result.fired() == {"ComputeNchwIslandInNhwc": 1}
    # the two TRANSPOSEs go; the pooled vector and the gate are reshaped (a RESHAPE pair the
    # float pipeline's CollapseReshapeChain then folds)
    assert ops(model).count("TRANSPOSE") == 0 and len(ops(model)) == len(ops_of(before))
    assert mapped(after)[0] > mapped(before)[0]
    steps = ComputeNchwIslandInNhwc().int8_error_steps
    agreement = verify.compare(before, after, int_atol=steps, runs=3)
    assert agreement.ok and agreement.varies, agreement


def ops_of(data: bytes) -> list[str]:
    from tflfuse.ir import flatbuffer

    return ops(flatbuffer.from_bytes(data))


def test_an_island_tensor_leaving_in_nchw_is_refused() -> None:
    g = G()
    x = g.input((1, 7, 7, 16))
    before = g.bytes(*_se_island(g, x, 16, 7, leak=True))
    _, model, result = apply(before, ComputeNchwIslandInNhwc())
    assert ops(model).count("TRANSPOSE") == 2
    assert (
        "its output is not an island the other layout computes: 'relu6' is a model output"
        in refusals(result, "ComputeNchwIslandInNhwc")
    )


def _nchw_head(keep: bool = False) -> bytes:
    """EdgeNeXt's head through litert-torch: the NHWC map moved to NCHW, averaged over H, W."""
    g = G()
    x = g.input((1, 4, 4, 8), "x")
    y = g.binary("ADD", x, x)
    t = g.op("TRANSPOSE", [y, g.const(np.array([0, 3, 1, 2], np.int32))], (1, 8, 4, 4))
    shape = (1, 8, 1, 1) if keep else (1, 8)
    mean = g.op("MEAN", [t, g.const(np.array([2, 3], np.int32))], shape, keep_dims=keep)
    return g.bytes(g.binary("ADD", mean, mean))


def test_a_mean_over_an_nchw_plane_reads_the_nhwc_map() -> None:
    before = _nchw_head()
    after, model, result = apply(before, ReduceBeforeTranspose())
    assert result.fired() == {"ReduceBeforeTranspose": 1}
    assert ops(model) == ["ADD", "MEAN", "ADD"]
    mean = model.main.ops[1]
    assert [int(a) for a in mean.inputs[1].data] == [1, 2]
    assert_same_function(before, after, atol=1e-6, rtol=1e-6)
    before = _nchw_head(keep=True)
    after, kept, result = apply(before, ReduceBeforeTranspose())
    assert result.fired() == {"ReduceBeforeTranspose": 1}
    assert ops(kept) == ["ADD", "MEAN", "RESHAPE", "ADD"]
    assert_same_function(before, after, atol=1e-6, rtol=1e-6)
