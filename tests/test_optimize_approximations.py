"""Approximate rewrites (exact GELU in the tanh form, for the Edge TPU) are recorded with their
error bound, verified against it, and never taken for exact ones."""

from __future__ import annotations

import pytest
from irgraphs import fully_connected, model_of, to_bytes

from tflfuse.convert.optimize import optimize_bytes
from tflfuse.ir import Graph


def fc_gelu(approximate: bool) -> bytes:
    g = Graph("main")
    x = g.add_tensor("x", (4, 6))
    fc = fully_connected(g, x, 8)
    y = g.add_tensor("y", (4, 8))
    g.add_op("GELU", [fc.output], [y], {"approximate": approximate})
    return to_bytes(model_of(g, [x], [y]))


def test_erf_gelu_for_the_edgetpu_is_an_approximation_within_its_bound() -> None:
    result = optimize_bytes(fc_gelu(approximate=False), target="edgetpu")
    approximations = result.result.approximations()
    assert approximations == {"LegalizeGelu": {"count": 1, "error_bound": pytest.approx(4.74e-4)}}
    v = result.verification
    assert v["ok"] and v["varies"]
    roundoff = v["outputs"]["y"]["roundoff"]["bound_max"]  # what exact re-association may do
    assert roundoff < v["max_abs"] <= 4.74e-4 * 1.01  # really approximate, and within the bound
    assert "GELU" not in result.after["op_counts"]


def test_tanh_gelu_for_the_edgetpu_is_exact() -> None:
    result = optimize_bytes(fc_gelu(approximate=True), target="edgetpu")
    assert result.result.approximations() == {}
    v = result.verification
    assert v["ok"] and (v["identical"] or v["outputs"]["y"]["ratio"] <= 1.0)
    assert v["tolerance"]["atol"] == 0.0  # no approximation allowance: round-off alone


def test_other_targets_keep_the_builtin() -> None:
    result = optimize_bytes(fc_gelu(approximate=False), target="xnnpack")
    assert result.after["op_counts"].get("GELU") == 1
    assert result.result.approximations() == {}
