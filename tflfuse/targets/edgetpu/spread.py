"""The attention product laid out as [1, d, n_c, m_c]: its sums carry m_c kernels, not n_c m_c.

`attention`'s full form (both operands repeated to [1, d, 1, n_c m_c], a same-shape MUL, a d x 1
depthwise sum of ones) maps in one segment, but the Edge TPU lays out each op's own kernel and
stores a depthwise conv's weights as 4 bytes per tap and channel (`memory.layer_bytes`): every
piece's sum holds 4 d n_c m_c bytes, and the repeat convs n_c m_c (n_c + m_c) more. Summed over
a model's pieces that is what streams from host memory on every inference (YOLO26n-320: 37.7 MiB,
YOLO26n-640: 413 MiB; benchmarks/EDGETPU_PARAMS.md).

The spread form puts the product's columns on the channels and its rows on a spatial axis:

    x   = RESHAPE(X[rows]^T, [1, d, n_c, 1])                     X's rows along the width
    xr  = CONV_2D 1x1 (x, ones [m_c, 1, 1, 1])                   [1, d, n_c, m_c]: 4 m_c bytes
    y   = RESHAPE(Y[cols]^T, [1, d1, d2, m_c])                   d laid out as a plane d1 x d2
    yc  = CONCATENATION(y, y, ..) along the channels, n_c copies  (a tree of 2-4 inputs)
    yr  = RESHAPE(yc, [1, d, n_c, m_c])                          yr[k, i, j] = Y[j, k]
    t   = MUL(xr, yr)                                            same shapes
    c   = DEPTHWISE_CONV_2D d x 1 (t, ones)                      [1, 1, n_c, m_c]: 4 d m_c bytes
    C   = RESHAPE(c, [1, n_c, 1, m_c])

The copies of Y are made once per column chunk and the conv of X once per row chunk; only the MUL,
the sum and the last RESHAPE are per piece. Y's plane is there for the compiler's evidence: a
RESHAPE between two 3-dimension tensors (nt=3>3) is shown mapped up to 408,000 elements, one from
2 to 3 dimensions (nt=2>3) only up to 86,016 (`delegates/edgetpu_forms.toml`); a prime d has no
plane (d2 = 1, the smaller bound). Every op is asked of the op table and of the forms gate at its
size (`site_refusal`), whether or not the predictor gates its form: only shown forms are written.

Exactness: the same products and the same sums as the full form (float: identical; int8: the
copies and the 0/1 weights exact), so the full form's int8 bound (`matmul_int8_steps`) holds.

The choice (`choose`): per product, the full form's and the spread form's ops and parameter bytes
(the memory predictor's layout of the distinct ops they write), and the form of least estimated
time: STREAM_MS_PER_MIB per MiB of parameters plus OP_MS per op. Coral gives no per-op figure;
both constants are bounds read from Coral's benchmark table (docs/edgetpu/benchmarks, quoted in
the constants' comments). No TensorFlow here.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from tflfuse.ir import Graph, Op
from tflfuse.targets.edgetpu.forms import gate
from tflfuse.targets.edgetpu.memory import layer_bytes
from tflfuse.targets.edgetpu.predict import edgetpu_shape_refusal

# Milliseconds per MiB of parameters streamed: Coral's benchmark table (coral.ai/docs/edgetpu/
# benchmarks) gives Inception v1 (6.6 M int8 parameters, cached) 3.6 ms and Inception v4 (42.7 M,
# about 35 MB over the 8 MiB cache) 100 ms, the same on USB 3.0 and on the Dev Board; its 12 GOPs
# take ~3 ms at 4 TOPS, so ~96 ms are the stream: 2.8 ms per MB, 2.9 per MiB.
STREAM_MS_PER_MIB = 2.9
# Milliseconds per op: no Coral document gives one. An upper bound: MobileNet v1 (31 ops) runs in
# 2.2 ms on the same table, so no op costs more than 2.2 / 31 = 0.071 ms with its compute.
OP_MS = 0.071
# Pieces per head the spread form may take (its ops grow with them; past this the convert's
# graph-wide passes slow down more than its bytes are worth on the models measured).
MOST_PIECES = 128
# Chunkings shown mapped that `layout` costs before taking the cheapest (from the fewest pieces).
TRIED = 12


@dataclass(frozen=True)
class Cost:
    """What one form writes for one product: ops and parameter bytes (predictor's layout)."""

    ops: int
    bytes: int

    @property
    def ms(self) -> float:
        return self.bytes / 2**20 * STREAM_MS_PER_MIB + self.ops * OP_MS


def plane(d: int) -> tuple[int, int]:
    """(d1, d2): d = d1 d2 with d2 its smallest factor > 1 (d2 = 1 for a prime)."""
    f = next((f for f in range(2, math.isqrt(d) + 1) if d % f == 0), None)
    return (d, 1) if f is None else (d // f, f)


def padded(d: int) -> int:
    """The depth the form sums over: d, or d + 1 for a prime d > 3 (one row of zeros, padded
    onto both operands, adds nothing to any sum): a prime has no plane, and the 2-to-3-dims
    RESHAPE it would need is shown only a fifth as large (DeiT's 197 tokens: 198 = 99 x 2)."""
    return d + 1 if d > 3 and plane(d)[1] == 1 else d


def copy_joins(n: int) -> list[list[int]]:
    """How CONCATENATIONs of 2-4 inputs make n copies of one tensor: each join's inputs (in
    copies), in the order they are made. Blocks of 4^k copies first (each join of four of the
    last), then n's base-4 digits, from the largest, joined 4 at a time onto the sum so far."""
    joins, block = [], 1
    while block * 4 <= n:
        joins.append([block] * 4)
        block *= 4
    digits, rest, size = [], n, block
    while size >= 1:
        digits += [size] * (rest // size)
        rest %= size
        size //= 4
    acc, i = digits[0], 1
    while i < len(digits):
        group = [acc, *digits[i : i + 3]]
        joins.append(group)
        acc, i = sum(group), i + 3
    return joins


@dataclass(frozen=True)
class Ask:
    """One op the rewrite would write: type, activation input shapes, output shape, constants."""

    kind: str
    ins: tuple[tuple[int, ...], ...]
    out: tuple[int, ...]
    consts: tuple[np.ndarray, ...] = ()
    options: tuple[tuple[str, object], ...] = ()


def _scratch(ask: Ask, dtype: str) -> Op:
    g = Graph("scratch")
    ins = [g.add_tensor(f"in{i}", s, dtype) for i, s in enumerate(ask.ins)]
    for i, c in enumerate(ask.consts):
        is_bias = ask.kind in ("CONV_2D", "DEPTHWISE_CONV_2D") and i == 1
        ins.append(g.add_constant(f"c{i}", c.astype(np.int32 if is_bias else np.int8)))
    options = {"fused_activation_function": "NONE", **dict(ask.options)}
    if ask.kind == "RESHAPE":  # its shape, as written
        ins.append(g.add_constant("shape", np.array(ask.out, np.int32)))
    if ask.kind == "PAD":  # its paddings, as written
        ins.append(g.add_constant("paddings", np.asarray(options.pop("paddings"), np.int32)))
    out = g.add_tensor("out", ask.out, dtype)
    return g.add_op(ask.kind, ins, [out], options)


def ask_refusal(ask: Ask, dtype: str) -> str | None:
    """Why the op would not be shown mapped: the op table's refusal, or the forms gate's answer
    when it is not "mapped" (asked as quantized); None when both map it."""
    op = _scratch(ask, dtype)
    why = edgetpu_shape_refusal(op)
    if why:
        return why
    verdict = gate(op, as_quantized=True)
    return None if verdict.answer == "mapped" else f"{verdict.answer}: {verdict.reason}"


def ask_bytes(ask: Ask) -> int:
    """The op's parameter bytes in the compiler's layout (0 where it has none)."""
    return layer_bytes(_scratch(ask, "INT8")) or 0


def spread_asks(d: int, n_c: int, m_c: int, parts: tuple[int, int]) -> dict[str, list[Ask]]:
    """The ops of one spread piece, by how often they are written: "row" once per row chunk,
    "col" once per column chunk, "piece" once per piece. `parts`: (X's, Y's) softmax ranges."""
    dp = padded(d)
    d1, d2 = plane(dp)
    wide = (1, dp, n_c, m_c)
    bias = np.zeros(m_c)
    x_conv = Ask("CONV_2D", ((1, dp, n_c, 1),), wide, (np.ones((m_c, 1, 1, 1)), bias))
    row = [x_conv] * parts[0]
    col = [Ask("RESHAPE", ((1, dp, 1, m_c),), (1, d1, d2, m_c))]
    if dp != d:  # a row of zeros under each operand's piece
        pads = np.array([[0, 0], [0, dp - d], [0, 0], [0, 0]])
        row.insert(0, Ask("PAD", ((1, d, n_c, 1),), (1, dp, n_c, 1), (), (("paddings", pads),)))
        col.insert(0, Ask("PAD", ((1, d, 1, m_c),), (1, dp, 1, m_c), (), (("paddings", pads),)))
    for join in copy_joins(n_c):
        ins = tuple((1, d1, d2, k * m_c) for k in join)
        col.append(Ask("CONCATENATION", ins, (1, d1, d2, sum(join) * m_c), options=(("axis", 3),)))
    col.append(Ask("RESHAPE", ((1, d1, d2, n_c * m_c),), wide))
    if parts[1] > 1:  # the ranges of Y: a 1x1 conv of the identity per range, on the copies
        eye = np.eye(m_c).reshape(m_c, 1, 1, m_c)
        col += [Ask("CONV_2D", (wide,), wide, (eye, bias))] * parts[1]
    piece = [
        Ask("MUL", (wide, wide), wide),
        Ask("DEPTHWISE_CONV_2D", (wide,), (1, 1, n_c, m_c), (np.ones((1, dp, 1, m_c)), bias),
            (("depth_multiplier", 1),)),
    ] * (parts[0] * parts[1])  # fmt: skip
    piece += [Ask("ADD", ((1, 1, n_c, m_c),) * 2, (1, 1, n_c, m_c))] * (parts[0] * parts[1] - 1)
    piece.append(Ask("RESHAPE", ((1, 1, n_c, m_c),), (1, n_c, 1, m_c)))
    return {"row": row, "col": col, "piece": piece}


def site_refusal(d: int, sizes: list[tuple[int, int]], parts: tuple[int, int]) -> str | None:
    """Why some op of the spread form at these (n_c, m_c) sizes would not be shown mapped."""
    seen: set[tuple] = set()
    for n_c, m_c in sizes:
        for asks in spread_asks(d, n_c, m_c, parts).values():
            for ask in asks:
                key = (ask.kind, ask.ins, ask.out, len(ask.consts))
                if key in seen:
                    continue
                seen.add(key)
                why = ask_refusal(ask, "INT8")
                if why:
                    return f"a {ask.kind} of the spread form would not be shown mapped: {why}"
    return None


def spread_cost(d: int, rows: list[int], cols: list[int], parts: tuple[int, int]) -> Cost:
    """Ops and bytes of one head's product in the spread form (its row and column chunk sizes):
    X's convs once per row chunk and column width, Y's copies once per column chunk and row
    height, the rest per piece."""
    ops = total = 0

    def add(asks: list[Ask]) -> None:
        nonlocal ops, total
        ops += len(asks)
        total += sum(ask_bytes(a) for a in asks)

    for n_c in rows:
        for m_c in sorted(set(cols)):
            add(spread_asks(d, n_c, m_c, parts)["row"])
    for m_c in cols:
        for n_c in sorted(set(rows)):
            add(spread_asks(d, n_c, m_c, parts)["col"])
    for n_c in rows:
        for m_c in cols:
            add(spread_asks(d, n_c, m_c, parts)["piece"])
    return Cost(ops, total)


def full_cost(d: int, rows: list[int], cols: list[int], parts: tuple[int, int]) -> Cost:
    """Ops and bytes of one head's product in `attention`'s full form: per piece the repeat
    convs of X and Y (one per range), the MULs, the d x 1 depthwise sums, the ADDs, a RESHAPE."""
    ops = total = 0
    for n_c in rows:
        for m_c in cols:
            wide = (1, d, 1, n_c * m_c)
            w, bias = n_c * m_c, np.zeros(n_c * m_c)
            asks = [Ask("CONV_2D", ((1, d, 1, n_c),), wide, (np.ones((w, 1, 1, n_c)), bias))]
            asks *= parts[0]
            asks += [Ask("CONV_2D", ((1, d, 1, m_c),), wide,
                         (np.ones((w, 1, 1, m_c)), bias))] * parts[1]  # fmt: skip
            sums = [Ask("DEPTHWISE_CONV_2D", (wide,), (1, 1, 1, w),
                        (np.ones((1, d, 1, w)), bias), (("depth_multiplier", 1),))]  # fmt: skip
            asks += [Ask("MUL", (wide, wide), wide), *sums] * (parts[0] * parts[1])
            asks += [Ask("ADD", ((1, 1, 1, w),) * 2, (1, 1, 1, w))] * (parts[0] * parts[1] - 1)
            asks.append(Ask("RESHAPE", ((1, 1, 1, w),), (1, n_c, 1, m_c)))
            ops += len(asks)
            total += sum(ask_bytes(a) for a in asks)
    return Cost(ops, total)


def chunk_sizes(length: int, most: int) -> list[int]:
    """Sizes of the fewest near-equal chunks of `length` that hold at most `most` each (the
    larger first): the chunks `attention` cuts a product's rows and columns into."""
    count = max(1, math.ceil(length / max(1, most)))
    base, extra = divmod(length, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


@functools.cache
def layout(
    d: int, n: int, m: int, parts: tuple[int, int], most_rows: int, most_cols: int
) -> tuple[int, int] | None:
    """(n_c, m_c) of least estimated time (`spread_cost`, `Cost.ms`) among the chunkings for
    which every op of the spread form is shown mapped (`site_refusal`), rows within `most_rows`
    and columns within `most_cols` (the TRANSPOSE limit where an operand's rows must be
    transposed), in at most MOST_PIECES pieces; tried from the fewest pieces, TRIED of them
    shown mapped. None when none is."""
    tried: set[tuple[int, int, int]] = set()
    for k_r in range(1, min(n, MOST_PIECES) + 1):
        n_c = max(chunk_sizes(n, math.ceil(n / k_r)))
        for k_c in range(1, min(m, MOST_PIECES // k_r) + 1):
            m_c = max(chunk_sizes(m, math.ceil(m / k_c)))
            if n_c <= most_rows and m_c <= most_cols and m_c <= 4096:
                tried.add((len(chunk_sizes(n, n_c)) * len(chunk_sizes(m, m_c)), n_c, m_c))
    best: tuple[float, int, int] | None = None
    shown = 0
    for _, n_c, m_c in sorted(tried):
        sizes = [(a, b) for a in set(chunk_sizes(n, n_c)) for b in set(chunk_sizes(m, m_c))]
        if site_refusal(d, sizes, parts) is not None:
            continue
        ms = spread_cost(d, chunk_sizes(n, n_c), chunk_sizes(m, m_c), parts).ms
        best = min(best or (ms, n_c, m_c), (ms, n_c, m_c))
        shown += 1
        if shown >= TRIED:
            break
    return None if best is None else (best[1], best[2])


def choose(
    d: int, full: tuple[list[int], list[int]], n: int, m: int, parts: tuple[int, int],
    most: tuple[int, int],
) -> tuple[int, int] | None:  # fmt: skip
    """The spread form's (n_c, m_c) where it takes less estimated time (`Cost.ms`) than the
    full form's chunks `full` (row and column sizes), else None."""
    found = layout(d, n, m, parts, *most)
    if found is None:
        return None
    before = full_cost(d, *full, parts)
    after = spread_cost(d, chunk_sizes(n, found[0]), chunk_sizes(m, found[1]), parts)
    return found if after.ms < before.ms else None
