"""Each int8 rewrite checked where it stands (issue 26): a wrong rewrite deep in an int8 network,
which the end-to-end bound lets through, is refused by the per-rewrite check; a right one passes
it with its steps listed in `verification.rewrites`.

The network is MobileNet-like (a strided stem conv, then depthwise + pointwise blocks, linear
bottlenecks without an activation), built as floats here, calibrated on the interpreter and
quantized as the stock converter does (`test_rules_property_int8`). The planted rule adds a
bias 3 output steps too large on one channel of a pointwise conv while declaring 1 step: what a
subtly wrong fold (a scale applied twice, a lost rounding) does to one channel.
"""

from __future__ import annotations

import numpy as np
from rulekit import G
from test_rules_property_int8 import observed_ranges, quantize_graph

from tflfuse.ir import Graph
from tflfuse.rewrite import Rule
from tflfuse.rewrite.pattern import Match, PatternBuilder
from tflfuse.rewrite.rule import refuse
from tflfuse.verification import verified


def mobilenet_like() -> tuple[bytes, list[str]]:
    """(the int8 model, the names of its linear pointwise conv outputs, first to last)."""
    g = G(seed=3)
    x = g.input((1, 16, 16, 3))
    x = g.conv(x, 8, k=3, stride=2, act="RELU6")
    linear = []
    for out in (8, 12, 12, 16):
        x = g.dwconv(x, act="RELU6")
        x = g.conv(x, out)  # linear bottleneck: no activation
        linear.append(x)
        x = g.conv(x, out * 2, act="RELU6")
    x = g.dwconv(x, act="RELU6")
    x = g.conv(x, 10)
    graph: Graph = g.model(x).main
    names = [t.name for t in linear]
    return quantize_graph(graph, observed_ranges(graph)), names


class ShiftBias(Rule):
    """CONV_2D(x, w, b) => CONV_2D(x, w, b + `steps` output steps on channel 0), declared as
    1 step: a planted wrong rewrite (`steps` 0: the conv as it was, a right one)."""

    quantized_ok = True
    int8_error_steps = 1

    def __init__(self, site: str, steps: int) -> None:
        self.site, self.steps = site, steps

    def pattern(self, p: PatternBuilder):
        return p.CONV_2D(p.x, p.w, p.b)

    def check(self, m: Match):
        if m.root.output.name != self.site or m.root.extra.get("planted"):
            return refuse("not the planted site")
        return None

    def rewrite(self, m: Match) -> None:
        bias = m.root.inputs[2]
        out_scale = float(m.root.output.quantization.scale[0])
        shifted = np.array(bias.data, np.int32)
        shifted[0] += round(self.steps * out_scale / float(bias.quantization.scale[0]))
        b = m.builder()
        b.set_input(m.root, 2, b.const(shifted, "shifted_bias", "INT32", bias.quantization))
        b.commit()
        m.root.extra["planted"] = True


def planted(steps: int) -> verified.Candidate:
    data, linear = mobilenet_like()
    deep = linear[-2]  # three blocks deep, two more blocks after it
    return verified.apply(data, lambda: [[ShiftBias(deep, steps)]])


def test_a_wrong_int8_rewrite_deep_in_the_network_is_refused_where_it_stands() -> None:
    candidate = planted(3)
    assert candidate.result.fired() == {"ShiftBias": 1}
    # today's check: the end-to-end bound has grown through the later layers and passes it
    failure, record = verified.end_to_end(candidate)
    assert failure is None and record["ok"] and record["varies"], record
    allowed = record["tolerance"]["int8_steps"]
    assert max(allowed.values()) > 3, allowed
    # the per-rewrite check runs the conv before and after on the same activations
    failure, record = verified.within_declared_error(candidate)
    assert failure is not None and "ShiftBias" in failure, failure
    [entry] = record["rewrites"]
    assert entry["rule"] == "ShiftBias" and entry["allowed_steps"] == 1
    assert entry["seen_steps"] >= 3 and not record["ok"], entry


def test_a_right_int8_rewrite_passes_and_is_listed_with_its_steps() -> None:
    candidate = planted(0)
    failure, record = verified.within_declared_error(candidate)
    assert failure is None and record["ok"], record
    [entry] = record["rewrites"]
    assert entry["tensor"] == candidate.result.events[0].sites[0]
    assert entry["allowed_steps"] == 1 and entry["seen_steps"] == 0, entry
    assert record["rewrites_not_checked"] == []
