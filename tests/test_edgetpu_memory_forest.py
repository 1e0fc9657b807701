"""The Edge TPU parameter bytes of the GEMM random forests' later matrix products, one-element
SUBs and SUM columns (`tflfuse.targets.edgetpu.memory_forest`), on inline graphs built to the
shapes of dev twins (local pairs, not redistributable: their bytes are quoted, the graphs are
rebuilt here) with the CPU ops between their Edge TPU subgraphs left out of the mapped list."""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Graph, Op, Quantization, Tensor
from tflfuse.targets import capability
from tflfuse.targets.edgetpu.memory import predicted_memory, undecided_line
from tflfuse.targets.edgetpu.memory_forest import (
    one_element_sub,
    tiled_constant_bytes,
    undecided_tiles,
    weights_from_cpu,
)

Q = Quantization(scale=np.array([0.01], np.float32), zero_point=np.array([-128], np.int64))


class _Forest:
    """A graph grown op by op; `cpu` ops are the ones the Edge TPU does not map."""

    def __init__(self) -> None:
        self.g = Graph("main")
        self.mapped: list[Op] = []
        self.n = 0

    def t(self, shape: tuple[int, ...], dtype: str = "INT8") -> Tensor:
        self.n += 1
        return self.g.add_tensor(f"t{self.n}", shape, dtype, quantization=Q)

    def c(self, shape: tuple[int, ...], value: int | None = None) -> Tensor:
        """A constant, each one's bytes its own unless `value` is given (trees of one shape
        share their path matrix: a repeated constant is undecided, `repeated_constant`)."""
        self.n += 1
        fill = self.n % 251 - 125 if value is None else value
        data = np.full(shape, fill, np.int8)
        return self.g.add_constant(f"c{self.n}", data, quantization=Q)

    def op(self, kind: str, inputs: list[Tensor | None], out: Tensor, *, cpu: bool = False) -> Op:
        made = self.g.add_op(kind, inputs, [out])
        if not cpu:
            self.mapped.append(made)
        return made

    def reshape(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        y = self.t(shape)
        spec = self.g.add_constant(f"s{self.n}", np.array(shape, np.int32))
        self.op("RESHAPE", [x, spec], y)
        return y

    def cpu_value(self, shape: tuple[int, ...]) -> Tensor:
        """A tensor a CPU op computes (the QUANTIZE between two Edge TPU subgraphs)."""
        y = self.t(shape)
        self.op("QUANTIZE", [self.t(shape, "FLOAT32")], y, cpu=True)
        return y

    def product(self, rows: tuple[int, int], w: Tensor, value: int | None = None) -> Tensor:
        """FULLY_CONNECTED(constant [M, K], computed weights [N, K]) -> [M, N]."""
        y = self.t((rows[0], int(w.shape[0])))
        self.op("FULLY_CONNECTED", [self.c(rows, value), w, None], y)
        return y

    def transpose(self, x: Tensor) -> Tensor:
        y = self.t(tuple(int(d) for d in reversed(x.shape)))
        perm = self.g.add_constant(f"p{self.n}", np.array([1, 0], np.int32))
        self.op("TRANSPOSE", [x, perm], y)
        return y

    def sum_rows(self, x: Tensor) -> Tensor:
        y = self.t(tuple(int(d) for d in x.shape[1:]))
        self.op("SUM", [x, self.g.add_constant(f"a{self.n}", np.array(0, np.int32))], y)
        return y

    def memory(self) -> dict[str, int]:
        return predicted_memory(self.mapped, capability("edgetpu"))


def _first_subgraph(f: _Forest, rows: tuple[int, int], samples: int) -> None:
    """FULLY_CONNECTED(constant, the model's input as weights), SUB of thresholds, LOGISTIC, MUL
    by one value."""
    x = f.product(rows, f.g.add_tensor("input", (samples, rows[1]), "INT8", quantization=Q))
    d = f.t(tuple(int(v) for v in x.shape))
    f.op("SUB", [f.c((rows[0], 1) if samples == 1 else (1, 1)), x], d)
    e = f.t(tuple(int(v) for v in x.shape))
    f.op("LOGISTIC", [d], e)
    f.op("MUL", [e, f.c(())], f.t(tuple(int(v) for v in x.shape)))


def test_a_forest_of_one_tree_in_three_subgraphs() -> None:
    """A dev forest of one tree of depth 1 (one sample) compiled into three Edge TPU subgraphs:
    its package caches 640 bytes and streams 64 - the first product's constant [1, 8] streamed;
    the SUB of one value from a one-element activation one block, cached; each later product
    one tile ([2, 1], [4, 2]) and one block more, its weights read from a CPU op; the RESHAPE of
    the SUM's [4, 1] column into a row a zero block and 4 lanes (320)."""
    f = _Forest()
    _first_subgraph(f, (1, 8), 1)
    w = f.reshape(f.cpu_value((1, 1, 1)), (1, 1))
    f.product((2, 1), w)
    w = f.reshape(f.cpu_value((1, 2, 1)), (1, 2))
    y = f.product((4, 2), w)
    column = f.sum_rows(f.reshape(y, (1, 4, 1)))
    f.reshape(column, (1, 4))
    memory = f.memory()
    assert (memory["on_chip_bytes"], memory["off_chip_bytes"]) == (640, 64)
    assert undecided_line(memory) is None
    sub = f.mapped[1]
    assert one_element_sub(sub) and not one_element_sub(_sub_of_64())


def _sub_of_64() -> Op:
    """The same SUB of one value from a [1, 64] activation (a dev forest of 64 samples: none)."""
    f = _Forest()
    out = f.t((1, 64))
    return f.op("SUB", [f.c((1, 1)), f.t((1, 64))], out)


def test_later_products_tile_their_constant_and_the_sum_column_is_two_lanes() -> None:
    """A dev forest of 16 trees' last subgraph caches 14,528 bytes: 16 products of a [2, 51]
    constant (13 tiles each) whose weights a CPU op computes (one block more each), their PACK
    and SUM, the RESHAPE of the [2, 1] column into a row (a zero block and 2 lanes)."""
    f = _Forest()
    _first_subgraph(f, (8, 2), 1)  # an earlier product, so the ones below are later ones
    scores = [f.product((2, 51), f.reshape(f.cpu_value((1, 51, 1)), (1, 51))) for _ in range(16)]
    packed = f.t((16, 2, 1))
    f.op("PACK", list(scores), packed)
    f.reshape(f.sum_rows(packed), (1, 2))
    first = 64 + 64  # [8, 2] as it is, the SUB's [8, 1] as it is
    memory = f.memory()
    assert memory["parameter_bytes"] - first == 14_528
    assert undecided_line(memory) is None


def test_constants_of_more_than_four_rows_pad_their_rows_to_16() -> None:
    """A dev forest of 8 trees' middle subgraph caches 98,816 bytes: 8 products of a [49, 48]
    constant, rows padded to 64 (16 x 12 tiles) and one block more; [51, 50] holds 16 x 13
    tiles and [83, 82] 24 x 21 in two more dev twins. 5 to 15 rows are not shown: undecided."""
    f = _Forest()
    _first_subgraph(f, (384, 2), 1)
    first = 768 + 384
    for _ in range(8):
        f.product((49, 48), f.reshape(f.cpu_value((1, 48, 1)), (1, 48)))
    memory = f.memory()
    assert memory["parameter_bytes"] - first == 98_816
    assert undecided_line(memory) is None
    later = [op for op in f.mapped if op.type == "FULLY_CONNECTED"][1:]
    assert all(weights_from_cpu(op, {id(o) for o in f.mapped}) for op in later)
    g = _Forest()
    big = g.op("FULLY_CONNECTED", [g.c((83, 82)), g.t((1, 82)), None], g.t((83, 1)))
    assert tiled_constant_bytes(big) == 24 * 21 * 64
    eight = g.op("FULLY_CONNECTED", [g.c((8, 5)), g.t((1, 5)), None], g.t((8, 1)))
    assert undecided_tiles(eight) and not undecided_tiles(big)
    line = undecided_line(predicted_memory([big, eight], capability("edgetpu")))
    assert line is not None and "more than 4 rows" in line


def test_products_of_weights_an_edge_tpu_op_computes_hold_no_block_more() -> None:
    """The single-subgraph dev forests (300 samples): a later product of a [2, 1] constant whose
    weights a RESHAPE of the first product's output gives holds its one tile only."""
    f = _Forest()
    x = f.product((1, 8), f.g.add_tensor("input", (300, 8), "INT8", quantization=Q))
    f.product((2, 1), f.reshape(x, (300, 1)))
    memory = f.memory()
    assert (memory["on_chip_bytes"], memory["off_chip_bytes"]) == (64, 64)


def test_a_row_read_from_a_cpu_op_turned_into_a_column_is_undecided_where_no_twin_shows_it() -> (
    None
):
    """RESHAPE [1, 1, N] -> [N, 1] of a CPU op's output holds lane bytes only the dev forests of
    64 and 300 samples show (laid out there, `ROW_TO_COLUMN_SHOWN`); at any other N, 256 and
    65 among them, undecided; of one element (a forest of one sample) none; of an Edge TPU
    op's output (the single-subgraph forests) none."""
    table = capability("edgetpu")
    for n, undecided in ((64, False), (300, False), (256, True), (65, True), (1, False)):
        f = _Forest()
        w = f.reshape(f.cpu_value((1, 1, n)), (n, 1))
        f.product((2, 1), w)
        line = undecided_line(f.memory())
        assert (line is not None and "row read from a CPU op" in line) == undecided
    f = _Forest()
    x = f.product((1, 8), f.g.add_tensor("input", (300, 8), "INT8", quantization=Q))
    f.reshape(x, (300, 1))
    assert undecided_line(predicted_memory(f.mapped, table)) is None


def test_a_forest_of_300_samples_last_subgraph() -> None:
    """A dev forest of 300 samples in three subgraphs caches 192 bytes in its last: a TRANSPOSE
    of [2, 300] read from a CPU op, a later product of a [4, 2] constant (one tile, its weights
    an Edge TPU op's: no block more), the SUM over trees and a TRANSPOSE of [4, 300] (the two
    transposes 128 bytes, `memory_shown`)."""
    f = _Forest()
    f.product((1, 8), f.g.add_tensor("input", (300, 8), "INT8", quantization=Q))
    first = list(f.mapped)
    x = f.reshape(f.cpu_value((1, 2, 300)), (2, 300))

    def transpose(x: Tensor) -> Tensor:
        y = f.t((int(x.shape[1]), int(x.shape[0])))
        f.op("TRANSPOSE", [x, f.g.add_constant(f"p{f.n}", np.array([1, 0], np.int32))], y)
        return y

    y = f.product((4, 2), transpose(x))
    transpose(f.sum_rows(f.reshape(y, (1, 4, 300))))
    memory = f.memory()
    assert (
        memory["parameter_bytes"]
        - predicted_memory(first, capability("edgetpu"))["parameter_bytes"]
        == 192
    )
    assert undecided_line(memory) is None


def _one_tree_of_many_samples(samples: int) -> _Forest:
    """A forest of one tree of depth 1 over `samples` samples in three Edge TPU subgraphs (two
    dev twins, 64 and 300 samples): its first product streams its constant [1, 16] and the SUB
    of one value from [1, N] holds none; the second reads a row a CPU op computes as a column
    [N, 1]; the third transposes a [2, N] a CPU op computes into its product's weights and the
    SUM's [4, N] into the output."""
    f = _Forest()
    _first_subgraph(f, (1, 16), samples)
    f.product((2, 1), f.reshape(f.cpu_value((1, 1, samples)), (samples, 1)))
    w = f.transpose(f.reshape(f.cpu_value((1, 2, samples)), (2, samples)))
    y = f.product((4, 2), w)
    f.transpose(f.sum_rows(f.reshape(y, (1, 4, samples))))
    return f


def test_the_lanes_of_a_forest_of_64_and_of_300_samples_at_the_shapes_dev_twins_show() -> None:
    """64 samples: 21,824 bytes cached, 64 streamed - the column's zero block and 64 lanes
    (4,160) beside the product's tile and block, the [4, 64] transpose 17,472 beside one tile,
    the [2, 64] one none. 300 samples: 109,696 cached, 64 streamed (the column's 109,376; the
    transposes 0 and 128). Both dev twins exact; 256 samples (the holdout's) are not shown,
    so undecided."""
    for samples, cached in ((64, 21_824), (300, 109_696)):
        memory = _one_tree_of_many_samples(samples).memory()
        assert (memory["on_chip_bytes"], memory["off_chip_bytes"]) == (cached, 64)
        assert undecided_line(memory) is None
    line = undecided_line(_one_tree_of_many_samples(256).memory())
    assert line is not None and "row read from a CPU op" in line and "does not cover" in line


def test_the_transposes_of_a_forest_of_32_trees_of_64_samples() -> None:
    """A dev forest of 32 trees over 64 samples: its middle subgraph caches 755,712 bytes, per
    tree a [15, 64] read from a CPU op transposed into a product's weights (22,592 bytes) and
    the product's [16, 15] constant in 16 tiles; its last one 750,656, per tree [16, 64]
    transposed (22,656) and a [4, 16] constant in 4 tiles, then the SUM's [4, 64] transposed
    (17,472)."""
    f = _Forest()
    _first_subgraph(f, (480, 8), 64)
    before = f.memory()["parameter_bytes"]
    for _ in range(32):
        f.product((16, 15), f.transpose(f.reshape(f.cpu_value((1, 15, 64)), (15, 64))))
    middle = f.memory()["parameter_bytes"]
    scores = [
        f.product((4, 16), f.transpose(f.reshape(f.cpu_value((1, 16, 64)), (16, 64))))
        for _ in range(32)
    ]
    packed = f.t((32, 4, 64))
    f.op("PACK", list(scores), packed)
    f.transpose(f.sum_rows(packed))
    memory = f.memory()
    assert (middle - before, memory["parameter_bytes"] - middle) == (755_712, 750_656)
    assert undecided_line(memory) is None


def test_a_constant_repeated_in_several_products_is_undecided() -> None:
    """The dev twins store a repeated constant each time (8 identical [2, 1] of a forest of 8
    trees), yet a forest of 128 trees with 10 distinct [16, 15] constants holds far fewer bytes
    than 128 copies: a later product whose constant repeats an earlier one's is undecided,
    the bytes still counted per copy; the column [1, 2, 1] a CPU op computes read as the
    weights [1, 2] holds none (decided: 4 dev twins)."""
    f = _Forest()
    _first_subgraph(f, (8, 2), 1)
    for _ in range(8):
        f.product((2, 2), f.reshape(f.cpu_value((1, 2, 1)), (1, 2)), value=5)
    memory = f.memory()
    assert memory["parameter_bytes"] - 128 == 8 * 128
    line = undecided_line(memory)
    assert line is not None and "repeated in several matrix products" in line
    assert "column into a row" not in line
