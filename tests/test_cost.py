"""Cost model: machine-independent kernel, byte and multiply-add counts; fusion decisions."""

from __future__ import annotations

from rulekit import G, optimize

from tflfuse.targets import cost
from tflfuse.targets import target as target_named


def test_op_cost_counts_conv_traffic_weights_and_macs() -> None:
    g = G()
    x = g.input((1, 8, 8, 3))
    y = g.conv(x, 4, k=3)
    c = cost.op_cost(y.producer)
    assert c.kernels == 1
    assert c.read_bytes == 8 * 8 * 3 * 4
    assert c.write_bytes == 8 * 8 * 4 * 4
    assert c.weight_bytes == (4 * 3 * 3 * 3 + 4) * 4
    assert c.macs == 8 * 8 * 4 * 3 * 3 * 3


def test_model_cost_falls_when_an_epilogue_fuses() -> None:
    g = G()
    x = g.input((1, 8, 8, 3))
    y = g.unary("RELU", g.binary("ADD", g.conv(x, 4), g.rand(4, name="b")))
    data = g.bytes(y)
    before = cost.model_cost(g.model(y))
    _, model, _ = optimize(data)
    after = cost.model_cost(model)
    assert (before["kernels"], after["kernels"]) == (3, 1)
    assert after["write_bytes"] == before["write_bytes"] // 3
    delta = cost.cost_delta(before, after)
    assert delta["kernels"]["ratio"] == round(1 / 3, 4)


def test_decisions() -> None:
    assert cost.chain_merge_pays(8, 16, 4)
    assert not cost.chain_merge_pays(32, 4, 32)
    assert (
        cost.horizontal_pays(
            target_named("xnnpack"), 3, 1000, absorbs_concat=False, equal_parts=True
        )
        is None
    )
    assert (
        cost.horizontal_pays(
            target_named("xnnpack"), 2, 1000, absorbs_concat=True, equal_parts=False
        )
        is None
    )
    assert cost.horizontal_pays(
        target_named("xnnpack"), 5, 1000, absorbs_concat=False, equal_parts=True
    )
    assert cost.horizontal_pays(
        target_named("edgetpu"), 3, 9 * cost.MIB, absorbs_concat=True, equal_parts=True
    )


def _binary_op(shape_b: tuple[int, ...], dtype: str = "FLOAT32"):
    from tflfuse.ir import Graph

    g = Graph("main")
    a = g.add_tensor("a", (1, 16, 32), dtype)
    b = g.add_tensor("b", shape_b, dtype)
    y = g.add_tensor("y", (1, 16, 32), dtype)
    return g.add_op("SUB", [a, b], [y], {})


def test_op_kinds_name_the_kernel_variant_the_table_measured() -> None:
    assert cost.op_kind(_binary_op((1, 16, 32))) == "SUB"
    assert cost.op_kind(_binary_op((1, 16, 1))) == "SUB@bcast"
    assert cost.op_dtype(_binary_op((1, 16, 1), "INT8")) == "int8"
    assert cost.work(_binary_op((1, 16, 1))) == 16 * 32


def test_prediction_follows_the_table() -> None:
    table = {("SUB", "float32", "none"): (2.0, 0.01), ("ADD", "float32", "none"): (1.0, 0.0)}
    assert cost.predict_op_us(_binary_op((1, 16, 32)), "none", table) == 2.0 + 0.01 * 512
    # an unmeasured variant is priced as its op type, an unmeasured type as an ADD
    assert cost.predict_op_us(_binary_op((1, 16, 1)), "none", table) == 2.0 + 0.01 * 512
    del table[("SUB", "float32", "none")]
    assert cost.predict_op_us(_binary_op((1, 16, 1)), "none", table) == 1.0


def test_shipped_table_loads_and_says_where_int8_sub_and_mean_are_slow() -> None:
    table = cost.cost_table()
    assert ("FULLY_CONNECTED", "int8", "xnnpack") in table
    assert all(a >= 0 and b >= 0 for a, b in table.values())
    # measured facts the rules rely on (delegates/cost_table.json): plain int8 kernels
    assert not cost.fast_sub(target_named("cpu")) and cost.fast_sub(target_named("xnnpack"))
    assert cost.mean_keep_dims_pays(target_named("cpu"), "int8", (1, 7, 7, 256))
    assert not cost.mean_keep_dims_pays(target_named("xnnpack"), "int8", (1, 7, 7, 256))
