"""Cost model: machine-independent kernel, byte and multiply-add counts; fusion decisions."""

from __future__ import annotations

from rulekit import G, optimize

from tflfuse import cost


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
    assert cost.horizontal_pays("xnnpack", 3, 1000, absorbs_concat=False, equal_parts=True) is None
    assert cost.horizontal_pays("xnnpack", 2, 1000, absorbs_concat=True, equal_parts=False) is None
    assert cost.horizontal_pays("xnnpack", 5, 1000, absorbs_concat=False, equal_parts=True)
    assert cost.horizontal_pays("edgetpu", 3, 9 * cost.MIB, absorbs_concat=True, equal_parts=True)
