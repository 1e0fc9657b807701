"""benchmarks/float_islands.py: an island's ops compute in float and round only where read
outside; the families it names (LayerNorm's variance chain, the swish ops)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import benchmark_module
from rulekit import apply
from test_edgetpu_headsplit import every_code, int8_gelu

from tflfuse.ir import flatbuffer
from tflfuse.targets.edgetpu import gelu
from tflfuse.targets.edgetpu.gelu import LegalizeGeluInt8


@pytest.fixture(scope="module")
def bench():
    return benchmark_module("float_islands")


def _cubic_gelu() -> tuple[bytes, tuple[float, int, float, int]]:
    params = (20 / 255, 0, 10.2 / 255, -124)
    after, _, result = apply(int8_gelu(False, params[:2], params[2:]), LegalizeGeluInt8())
    assert result.fired() == {"LegalizeGeluInt8": 1}
    return after, params


def test_an_island_of_every_op_rounds_once_at_its_output(bench) -> None:
    """The cubic GELU's 7 int8 ops in float: x's code in, y's code out, nothing rounded or
    saturated between (q, k, t and sigma on no grid): the codes of the float formula, where
    the all-int8 model differs from it on more codes."""
    data, (s_x, z_x, s_y, z_y) = _cubic_gelu()
    model = flatbuffer.from_bytes(data)
    ids = bench.families(model, {})["all"]
    island = flatbuffer.to_bytes(bench.with_island(model, lambda op: id(op) in ids))
    x = s_x * (np.arange(-128, 128) - z_x)
    t = x * (gelu.CUBIC_A + gelu.CUBIC_B * x * x)  # (in float no int8 range saturates)
    exact = np.clip(np.round(gelu.TOP * x / (1 + np.exp(-t)) / s_y) + z_y, -128, 127)
    floated, int8 = every_code(island), every_code(data)
    assert np.abs(floated - exact).max() <= 1 and np.count_nonzero(floated - exact) <= 2
    assert np.count_nonzero(int8 - exact) > np.count_nonzero(floated - exact)


def test_an_island_of_one_op_read_outside_changes_nothing(bench) -> None:
    """A family of only the last MUL: its int8 kernel rounds once, at its output, as the
    QUANTIZE after its float twin does."""
    data, _ = _cubic_gelu()
    model = flatbuffer.from_bytes(data)
    last = id(model.main.ops[-1])
    island = flatbuffer.to_bytes(bench.with_island(model, lambda op: id(op) == last))
    assert np.array_equal(every_code(island), every_code(data))


def test_the_families_are_found_by_structure(bench) -> None:
    data, _ = _cubic_gelu()
    model = flatbuffer.from_bytes(data)
    fams = bench.families(model, {"argument": "argument"})
    kinds = {
        name: sorted(op.type for op in model.main.ops if id(op) in ids)
        for name, ids in fams.items()
    }
    assert kinds["swish"] == ["LOGISTIC", "MUL"]  # sigma and the product reading it
    assert kinds["argument"] == ["MUL"] and kinds["lnvar"] == []  # no square reaches an RSQRT
    assert len(kinds["all"]) == 7
