"""Parameter bytes of matrix products whose weights an op computes, beyond the first one.

The GEMM random forests (a FULLY_CONNECTED of a constant input [M, K] and computed weights, a SUB
of thresholds, a SUM of trees) compile into several Edge TPU subgraphs where a CPU op sits
between the products. Read in the parameter streams of their dev twins
(`tflfuse.targets.edgetpu.package`), per Edge TPU op:

- A later FULLY_CONNECTED of a constant input (not the first in execution order, whose
  constant is stored as it is, `memory.constant_input_bytes`) stores the constant in 64-byte
  tiles of 4 rows by 4 columns, each row padded to 16 bytes, the rows padded to 4 when at most
  4 and to 16 beyond: a [2, 51] constant holds 13 tiles (832 bytes, sixteen of them in one dev
  twin), [2, 1] and [4, 2] one tile, [49, 48] 16 x 12 tiles, [51, 50] 16 x 13, [83, 82]
  24 x 21 (dev twins of 8, 16 and 32 such products, each subgraph's bytes exact). 5 to 15 rows
  are not shown (padded to 16 here, and said undecided: `undecided_tiles`).
- When its weights are read, through RESHAPEs, from a tensor a CPU op computes (the subgraph's
  input), one 64-byte block more follows the tiles (a one-hot byte at 0, cached): one per
  product in every dev twin that shows it (16 in one, 1 and 1 in the two subgraphs of another).
  Weights an Edge TPU op computes hold none (the single-subgraph forests).
- A SUB of a one-value constant from a one-element activation: one 64-byte block, cached (a
  dev forest of one tree, [1, 1] - [1, 1]; the same SUB from a [1, 64] or [1, 300] activation
  holds none, `memory_elementwise`).
- A RESHAPE of a SUM's column [n, 1] into a row [1, n]: a lane selection, a zero block and one
  one-hot block per lane (`memory._lanes`; dev: n = 4 in one twin, 320 bytes, and n = 2 in
  another, 192); other n are laid out so but said undecided.

- A RESHAPE of a row [1, 1, N] read from a CPU op into a column [N, 1] (a product's weights)
  holds lane selections at the N dev twins show (`ROW_TO_COLUMN_SHOWN`): N = 64 a zero block
  and 64 one-hot blocks (4,160 bytes), N = 300 1,709 blocks (109,376); each the forest's middle
  subgraph exact with its product's tile and block (two dev twins of one tree, whose first
  subgraphs stream exactly their product's constant and whose last ones hold the transposes
  of `memory_shown`). The two do not give a formula (300 lanes are not 1 + 300 blocks), so
  other N stay undecided (`undecided_row_to_column`; the holdout's 256 samples among them).

- A RESHAPE of a column [1, K, 1] a CPU op computes (a SPLIT of the trees' rows) into the
  row [1, K] a later product reads as its weights holds none (`weights_column`): the product's
  block above is all its twins hold for it (4 dev twins of 8 to 32 trees, K = 2 and 48 to 83,
  compiled together: their split is the compile's, their totals exact).
- A later product whose constant repeats an earlier later product's (the same bytes: trees of
  one shape share their path matrix) is undecided (`repeated_constant`): the dev twins store
  each copy (8 identical [2, 1] in one, 32 products of 4 distinct [16, 15] in another), but a
  forest of 128 trees whose [16, 15] constants are 10 distinct holds 12,416 bytes in that
  subgraph, not 128 x 1,088: about one tile set and block per distinct constant and 1,536
  bytes more, a sharing no rule here accounts for.

A UNIDIRECTIONAL_SEQUENCE_LSTM (Coral's keras_lstm_mnist_ptq,
the one twin that maps one: 34,944 bytes more than its dense layer and softmax as laid out, of
selection blocks, gate weights in rows of 128 bytes and int32 words) stays not laid out. No
TensorFlow here.
"""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Op, Tensor

TILE = 64  # bytes of one 4 x 4 tile, rows padded to 16 bytes
TILE_SIDE = 4
ROW_PAD = 16  # a constant of more than TILE_SIDE rows has its rows padded to this
SELECTION = 64  # the block after a product of weights read from a CPU op
SUM_COLUMNS_SHOWN = (2, 4)  # the column lengths whose RESHAPE into a row a dev twin shows


def _ceil(n: int, m: int) -> int:
    return -(-n // m)


def _rows_depth(op: Op) -> tuple[int, int]:
    shape = tuple(int(d) for d in op.input(0).shape)  # FULLY_CONNECTED(x, w, b)
    if len(shape) >= 2:
        return shape[-2], shape[-1]
    return 1, shape[0] if shape else 1


def tiled_constant_bytes(op: Op) -> int:
    """A later FULLY_CONNECTED's constant input [M, K] in 4 x 4 tiles, its rows padded to 4
    when at most 4, else to 16 (module docstring)."""
    rows, depth = _rows_depth(op)
    padded = TILE_SIDE if rows <= TILE_SIDE else _ceil(rows, ROW_PAD) * ROW_PAD
    return padded // TILE_SIDE * _ceil(depth, TILE_SIDE) * TILE


def undecided_tiles(op: Op) -> bool:
    """A later product of a constant of 5 to 15 rows: no dev twin shows whether its rows are
    padded to 4 or to 16."""
    return TILE_SIDE < _rows_depth(op)[0] < ROW_PAD


def _source(t: Tensor) -> Op | None:
    """The op computing `t`, looking through RESHAPEs (None for a model input)."""
    producer = t.producer
    while producer is not None and producer.type == "RESHAPE" and producer.inputs:
        producer = producer.input(0).producer
    return producer


def weights_from_cpu(op: Op, mapped: set[int]) -> bool:
    """A FULLY_CONNECTED whose computed weights come, through RESHAPEs, from an op not mapped
    (`mapped`: ids of the mapped ops)."""
    w = op.inputs[1] if len(op.inputs) > 1 else None
    source = _source(w) if w is not None else None
    return source is not None and id(source) not in mapped


def selection_bytes(op: Op, mapped: set[int]) -> int:
    """The block after a later product whose weights a CPU op computes, else 0."""
    return SELECTION if weights_from_cpu(op, mapped) else 0


# The lengths N whose RESHAPE of a row read from a CPU op into a column a dev twin shows, and
# the bytes it holds there (module docstring).
ROW_TO_COLUMN_SHOWN = {64: 4_160, 300: 109_376}


def row_to_column(op: Op, mapped: set[int]) -> int | None:
    """N for a RESHAPE of a row of several elements ([1, ..., 1, N]) into a column ([N, 1]) read
    from a tensor no Edge TPU op computes, else None (a RESHAPE of one element holds none: a
    forest of one sample)."""
    x = op.inputs[0] if op.type == "RESHAPE" and op.inputs else None
    if x is None or not x.shape or not op.outputs:
        return None
    n = int(x.shape[-1])
    row = n > 1 and all(int(d) == 1 for d in x.shape[:-1])
    column = tuple(int(d) for d in op.outputs[0].shape) == (n, 1)
    cpu = x.producer is None or id(x.producer) not in mapped
    return n if row and column and cpu else None


def row_to_column_bytes(op: Op, mapped: set[int]) -> int:
    """The lane bytes of a `row_to_column` RESHAPE at a length a dev twin shows, else 0."""
    n = row_to_column(op, mapped)
    return ROW_TO_COLUMN_SHOWN.get(n, 0) if n is not None else 0


def undecided_row_to_column(op: Op, mapped: set[int]) -> bool:
    """A `row_to_column` RESHAPE of a length no dev twin shows: its lanes' pattern two twins
    do not pin down."""
    n = row_to_column(op, mapped)
    return n is not None and n not in ROW_TO_COLUMN_SHOWN


def one_element_sub(op: Op) -> bool:
    """A SUB of a one-value constant from a one-element activation (one block, cached)."""
    if op.type != "SUB" or len(op.inputs) != 2 or not op.outputs:
        return False
    sizes = [_size(t.shape) if t is not None else 0 for t in (*op.inputs, op.outputs[0])]
    return sizes == [1, 1, 1] and sum(t is not None and t.is_constant for t in op.inputs) == 1


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def sum_column_lanes(op: Op) -> int | None:
    """The lanes of a RESHAPE of a SUM's column [n, 1] into a row [1, n]: n, else None."""
    x = op.inputs[0] if op.type == "RESHAPE" and op.inputs else None
    if x is None or x.producer is None or x.producer.type != "SUM" or not op.outputs:
        return None
    y = tuple(int(d) for d in op.outputs[0].shape)
    shape = tuple(int(d) for d in x.shape)
    if len(shape) != 2 or shape[1] != 1 or y != (1, shape[0]):
        return None
    return shape[0]


def weights_column(op: Op, mapped: set[int]) -> bool:
    """A RESHAPE of a column [1, K, 1] a CPU op computes into the row [1, K] that only
    FULLY_CONNECTEDs read, as their weights (module docstring: none)."""
    x = op.inputs[0] if op.type == "RESHAPE" and op.inputs else None
    if x is None or x.producer is None or id(x.producer) in mapped or not op.outputs:
        return False
    shape = tuple(int(d) for d in x.shape)
    y = op.outputs[0]
    if len(shape) != 3 or shape[0] != 1 or shape[2] != 1 or tuple(y.shape) != shape[:2]:
        return False
    readers = y.consumers
    return bool(readers) and all(
        r.type == "FULLY_CONNECTED" and len(r.inputs) > 1 and r.inputs[1] is y for r in readers
    )


def constant_digest(op: Op) -> bytes | None:
    """The bytes of a product's constant input (to find constants repeated across products)."""
    x = op.inputs[0] if op.inputs else None
    if x is None or not x.is_constant or x.is_raw:
        return None
    return np.asarray(x.data).tobytes() + str(tuple(x.shape)).encode()


def repeated_constant(op: Op, seen: set[bytes]) -> bool:
    """A later product whose constant's bytes an earlier later product already holds (`seen`,
    updated here): whether the compiler stores it again is undecided (module docstring)."""
    digest = constant_digest(op)
    if digest is None:
        return False
    repeated = digest in seen
    seen.add(digest)
    return repeated
