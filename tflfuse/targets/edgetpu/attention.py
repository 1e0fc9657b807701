"""Edge TPU legalization of attention: the product of two activations.

The compiler has no op for the product of two computed tensors: BATCH_MATMUL is outside its
table, and FULLY_CONNECTED maps only with constant weights (every FULLY_CONNECTED with computed
weights in the compiled pairs reads a constant as its first operand). Attention's Q.K^T and A.V
(YOLO11's C2PSA, YOLO26, ViT/DeiT, MobileViT, PyTorch's MultiheadAttention) therefore cut the one
Edge TPU segment. The rules here spell that product in ops of the table.

The decomposition (one place; `delegates/edgetpu.toml` [legalization] `attention` records it).
For one batch b (a head) C = X . Y^T, X [n, d] and Y [m, d] (rows of the right operand after its
adj/transpose), C[i, j] = sum_k X[i, k] Y[j, k]:

    x   = RESHAPE(X[rows], [1, n_c, 1, d])               an image: rows down, d channels
    xr  = CONV_2D 1x1 (x, R)                             R[(j, k'), k] = (k == k'): x repeated
                                                         m_c times along the channels, exact
    v   = RESHAPE(Y[cols], [1, 1, 1, m_c d])             the m_c rows of Y as one vector
    t   = MUL(xr, v)                                     t[i, (j, k)] = X[i, k] Y[j, k]
    c   = CONV_2D 1x1 (t, B)                            B[j', (j, k)] = (j == j'): the sum over
                                                         k, C[i, j] for m_c columns
      or  CONV_2D 1x1 (RESHAPE(t, [1, n_c, m_c, d]), 1)  the same sum with d ones, one output
                                                         channel (the grid)

and the pieces are joined (CONCATENATION along the columns, then the rows and heads) and reshaped
to the product's shape. Why this one:
  * replication and reduction are 1x1 CONV_2Ds with constant 0/1 weights, the best evidenced
    op (delegates/edgetpu_forms.toml: `CONV_2D ... k=1x1`, mapped in hundreds of compiled
    models, one-output-channel ones included); weights 0 and 1 are exact in int8;
  * the contracted axis ends in the channels, so the sum is a conv: a SUM over the innermost
    axis, or one over a spatial axis, is a reduction form no compiled model shows;
  * the one product of two activations is a MUL whose second operand is one vector per channel
    (squeeze-and-excitation's broadcast), one op per chunk however many rows. No compiled model
    scanned shows a MUL of two activations broadcast against each other mapped (forms:
    /work/evidence/FORMS-SUMMARY.md), this one included: `check` and the predictor call it
    undecided (the forms gate), count it on the CPU, and give the reading where it maps. A
    MUL of two activations of the same shape is shown mapped, so up to FULL_PIECES pieces a
    head both operands are made full instead (the full form: [1, d, 1, n_c m_c], each repeated
    by a 1x1 conv, the sum a d x 1 depthwise conv of ones: only shown forms). Its kernels, laid
    out per op, stream from host memory on every inference (4 d n_c m_c bytes a sum); where
    that costs more time than the ops it saves, the same products are laid out as
    [1, d, n_c, m_c] (`spread`: X's conv of ones, Y's copies, sums of m_c kernels), chosen per
    product by `spread.choose` (its constants and their sources are in that module).
  * the exporters' head split and merge TRANSPOSEs ([1, N, H, d] <-> [1, H, N, d]; no compiled
    model shows those 4-D permutations mapped) are read through: each head's rows are a SLICE
    of the split's input, and the heads are joined in the merge's order, so both go.
  * onnx2tf's q^T k with the keys' tokens on a batch axis ([1, H, d, N] @ [N, H, d, 1] ->
    [N, H, N, 1], then a TRANSPOSE back to [1, H, N, N]) is read as the plain product written
    into that TRANSPOSE's output (`_columns_on_batch`): both go.
Chunks keep every tensor within the compiler's limits (edgetpu.toml [meta] and the RESHAPE and
TRANSPOSE rows): m_c d within the row limit (and the TRANSPOSE limit when Y arrives as [d, m]),
the replication weights m_c d^2 and the blocks m_c^2 d within PARAMETER_BUDGET, and on the grid
n_c m_c d within the RESHAPE limit; the way of summing that needs fewer pieces is taken (blocks
for attention's Q.K^T: 46 ops for two heads of 400 tokens, where the grid needs 194). A large
contracted depth is costly: the repeat weights grow as d^2, so when C^T = Y . X^T needs fewer
pieces it is built instead and turned back per head (a TRANSPOSE): A.V over 400 tokens with 64
value channels, 108 ops for two heads instead of 550. A depthwise repeat (depth_multiplier 8 is
seen mapped) would grow as d; not done.

Exactness. Float: the same products, summed in another order (round-off only). int8 (a stock
int8 model given to `optimize`): the copies and the 0/1 weights are exact (a conv with weights
1 at scale 1 and the input's output scale multiplies by exactly 1), the product t is quantized
over the range every product of X's and Y's representable values spans (no clamping), and the
reduction rounds once into the original output's scale. Each element of t is off by half its
step s_t, so the sum by d s_t / 2: `matmul_int8_steps` declares ceil(d s_t / (2 s_out)) + 1
steps for the match (the kernel's one rounding against ours). Over MAX_INT8_STEPS (4) the
product is left whole: on attention's wide operands the bound reached 12 and 53 steps (YOLO11n's
C2PSA, onnx2tf's int8) and DeiT's int8 output lost all likeness (cosine 0.006 against 0.835 for
stock), a check that passes everything. Legalized before quantizing, the product is calibrated.

The softmax operand, legalized before quantizing (`split_of`). Calibrated, each product
tensor rounds at a step set by its largest product (a row that peaks), so a diffuse softmax
row's many small products round to nothing (LeViT-128S's first A.V, simulated: SNR 6.9
against stock's 478). A softmax output A (>= 0, rows summing to 1) is therefore split into
ranges at 1/n and 8/n (n its row's length; no point under the int8 softmax's step 1/256 nor at
1 or over): its repeat conv is written once per range (a fused RELU6 clips a bounded range, a
fused RELU the last), each with its MUL and sum (the range's factor folded into the sum), the
sums ADDed: exact in float, and each product gets its own calibrated scale. The ranges, their
exactness and why RELU6: `softmax_split`. Measured (benchmarks/attention_accuracy.py,
ATTENTION_ACCURACY.md): the fused models' error against the float model beside stock's, with
one range, two (8/n) and three.
An int8 product (a stock int8 model) is not split: its parts could not be recalibrated, and the
split's worst case is still ~ d s_small / 2 + (1/r) s_large / 2, over MAX_INT8_STEPS.

Not split here: a SOFTMAX whose own tensor is over the limits (more than 3 dimensions > 1, or
the row limit). Cut into per-head pieces it would be exact, but its result keeps its shape: the
CONCATENATION writing it, and every op reading it, would stay refused. The attention models
measured have none ([1, H, N, M] softmaxes within the row limit up to N = 420); the fix would
rewrite the whole chain (Q.K^T, softmax, A.V) per head.

`LegalizeNeg` (float NEG => MUL by -1) is here for the LayerNorm of Keras attention blocks.

Every rule is gated like the other legalizations (`after_the_cut`): an op that reads what the
CPU computes after the segment is left as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from tflfuse.ir import Graph, Op, Quantization, Tensor
from tflfuse.rewrite import (
    Builder,
    Match,
    OpPattern,
    PatternBuilder,
    Refusal,
    Rule,
    Value,
    refuse,
)
from tflfuse.rewrite.common import NotApplicable
from tflfuse.targets.capabilities import capability
from tflfuse.targets.edgetpu import softmax_split, spread
from tflfuse.targets.edgetpu.gelu import GELU_LEGALIZATION
from tflfuse.targets.edgetpu.headsplit import HEAD_SPLIT_LEGALIZATION
from tflfuse.targets.edgetpu.rows import ROWS_LEGALIZATION

# the other legalizations' gate and quantization helpers (one definition, in rules.py)
from tflfuse.targets.edgetpu.rules import (
    _gated,
    _kind,
    _quant,
    _range_q,
    _refusal_of,
    _scale_zp,
    lifts_the_cut,
)
from tflfuse.targets.edgetpu.sumconv import SUM_CONV_LEGALIZATION

# Bytes of replication weights (m_c d^2, int8) one chunk may use: an eighth of the 8 MiB
# parameter cache, so that the product leaves room for the model's own weights.
PARAMETER_BUDGET = 1 << 20
# Pieces per head up to which both operands are repeated (shown forms only; more ops). The
# other ways hang on a MUL broadcast between two activations that no compiled model shows, so
# this one is preferred up to 512 tokens a head (512^2 products in pieces of SUM_CHANNELS: 64;
# a 640-px YOLO's 20x20 map, 400 tokens, needs 40); past that the ops it writes (about six a
# piece) outgrow the model's own.
FULL_PIECES = 64
# Channels of the summing DEPTHWISE_CONV_2D: ai-edge-litert 2.3's float kernel (the one every
# verification runs) hangs on a depthwise conv of 4900 channels or more with a tall kernel
# ([1, 8, 1, 4900]: no answer in minutes; 4800 and below: microseconds), which stalled a
# YOLO11n convert; 4096 keeps every piece well under it.
SUM_CHANNELS = 4096


def _limits() -> tuple[int, int, int]:
    """(row limit, RESHAPE element limit, TRANSPOSE element limit) from edgetpu.toml."""
    table = capability("edgetpu")
    ops = table["ops"]
    return (
        int(table["meta"]["max_row_elements"]),
        int(ops["RESHAPE"]["max_elements"]),
        int(ops["TRANSPOSE"]["max_elements"]),
    )


def _chunks(length: int, most: int) -> list[tuple[int, int]]:
    """[start, stop) pieces of `length`, as few as hold at most `most` each, near equal
    (`spread.chunk_sizes`)."""
    out, start = [], 0
    for size in spread.chunk_sizes(length, most):
        out.append((start, start + size))
        start += size
    return out


# -- the operands ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Operand:
    """A matmul operand as rows: `tensor`'s last two axes are [rows, k] (`rows_last`) or
    [k, rows]; its leading axes are the batch (all ones: shared by every batch)."""

    tensor: Tensor
    rows_last: bool
    view: tuple[int, ...] | None = None  # the shape it is read as (a RESHAPE), else its own
    perm: tuple[int, ...] | None = None  # read through a TRANSPOSE: its axis i is tensor's perm[i]

    @property
    def shape(self) -> tuple[int, ...]:
        if self.perm is not None:
            return tuple(self.tensor.shape[p] for p in self.perm)
        return self.view if self.view is not None else tuple(self.tensor.shape)

    @property
    def lead(self) -> tuple[int, ...]:
        return tuple(self.shape[:-2])

    @property
    def batch(self) -> int:
        return int(np.prod(self.lead, dtype=np.int64)) if self.lead else 1

    @property
    def rows(self) -> int:
        return self.shape[-2] if self.rows_last else self.shape[-1]

    @property
    def depth(self) -> int:
        return self.shape[-1] if self.rows_last else self.shape[-2]

    def axes(self) -> tuple[int, int]:
        """The axes of the tensor sliced that hold the rows and the contracted depth."""
        r = len(self.shape)
        rows, depth = (r - 2, r - 1) if self.rows_last else (r - 1, r - 2)
        if self.perm is not None:
            return self.perm[rows], self.perm[depth]
        return rows, depth

    @property
    def in_order(self) -> bool:
        """A slice of it is [rows, depth] in memory order (no TRANSPOSE needed)."""
        rows, depth = self.axes()
        return rows < depth


def _fold_broadcast_rows(
    x: Operand, y: Operand, out_shape: tuple[int, ...]
) -> tuple[Operand, Operand, tuple[int, ...]]:
    """onnx2tf writes q^T k as [h, N, 1, d] @ [h, 1, d, N] -> [h, N, 1, N]: one row per batch
    entry, the right operand broadcast along that axis. Read as [h, N, d] @ [h, d, N] ->
    [h, N, N] (the same elements in the same order); other operands as they are."""
    lead = out_shape[:-2]
    if x.perm is not None or y.perm is not None:
        return x, y, out_shape
    if not (len(x.lead) == len(y.lead) == len(lead) >= 1 and x.rows == 1 == out_shape[-2]):
        return x, y, out_shape
    if x.lead[-1] != lead[-1] or lead[-1] == 1 or y.lead[-1] != 1:
        return x, y, out_shape
    folded = Operand(x.tensor, True, (*x.lead[:-1], lead[-1], x.depth))
    other = Operand(y.tensor, y.rows_last, (*y.lead[:-1], *y.shape[-2:]))
    return folded, other, (*lead[:-1], lead[-1], out_shape[-1])


def _columns_on_batch(
    graph: Graph, x: Operand, y: Operand, out: Tensor
) -> tuple[Operand, Operand, tuple[int, ...], Op] | None:
    """onnx2tf also writes q^T k with k's tokens on a batch axis and one column each,
    [1, H, d, N] (adj_x) @ [N, H, d, 1] -> [N, H, N, 1] (k read through a TRANSPOSE), then
    TRANSPOSEs that to the plain product [1, H, N, N]: out[j, h, i, 0] = sum_k X[h, i, k]
    Y[j, h, k]. Read as X [1, H, N, d] . Y [1, H, N, d]^T written straight into that
    TRANSPOSE's output (which goes with the product). Returns (x, y as rows, the product's
    shape, the TRANSPOSE), or None when the product is not of that form."""
    shape, lead = tuple(out.shape), len(out.shape) - 2
    if lead < 1 or y.view is not None or y.rows != 1 or shape[-1] != 1:
        return None
    if len(x.lead) != lead or len(y.lead) != lead or x.lead[0] != 1 or y.lead[0] != shape[0]:
        return None
    if shape[0] < 2 or not (x.lead[1:] == y.lead[1:] == shape[1:lead]) or x.rows != shape[-2]:
        return None
    reader = _sole_reader(graph, out)
    if reader is None or reader.type != "TRANSPOSE" or len(reader.inputs) < 2:
        return None
    perm_t, product = reader.inputs[1], (1, *shape[1:lead], x.rows, shape[0])
    if reader.inputs[0] is not out or perm_t is None or not perm_t.is_constant:
        return None
    perm = [int(v) % len(shape) for v in np.asarray(perm_t.data).reshape(-1)]
    if perm != [lead + 1, *range(1, lead), lead, 0] or tuple(reader.output.shape) != product:
        return None
    q = cast(Quantization, reader.output.quantization)  # (read only when `out` is quantized)
    if out.is_quantized and not q.same_as(out.quantization):
        return None
    rank = len(y.shape)
    own = y.perm if y.perm is not None else tuple(range(rank))
    rows, depth = (rank - 2, rank - 1) if y.rows_last else (rank - 1, rank - 2)
    as_rows = (own[rows], *(own[a] for a in range(1, lead)), own[0], own[depth])
    return x, Operand(y.tensor, True, perm=as_rows), product, reader


def _through_transpose(t: Tensor, rows_last: bool) -> Operand:
    """The operand, read before a TRANSPOSE (through a RESHAPE that only regroups the leading
    axes): each head's rows are sliced from the TRANSPOSE's input directly, which the exporters'
    head splits ([1, N, H, d] -> [1, H, N, d]) and K^T make a plain slice, and the TRANSPOSE is
    left to whoever else reads it (dead code otherwise)."""
    source, op = t, t.producer
    if op is not None and op.type == "RESHAPE" and op.inputs[0] is not None:
        inner = op.inputs[0]
        same_lead = inner.size == t.size and len(inner.shape) >= 2
        if same_lead and tuple(inner.shape[-2:]) == tuple(t.shape[-2:]):
            source, op = inner, inner.producer
    if op is None or op.type != "TRANSPOSE" or len(op.inputs) < 2 or op.inputs[1] is None:
        return Operand(t, rows_last)
    perm_t, x = op.inputs[1], op.inputs[0]
    if not perm_t.is_constant or x is None or len(x.shape) < 2:
        return Operand(t, rows_last)
    rank = len(x.shape)
    perm = tuple(int(v) % rank for v in np.asarray(perm_t.data).reshape(-1))
    if sorted(perm) != list(range(rank)):
        return Operand(t, rows_last)
    quantized = [q for q in (x.quantization, source.quantization, t.quantization) if q]
    if x.is_quantized and not all(q.same_as(x.quantization) for q in quantized):
        return Operand(t, rows_last)
    return Operand(x, rows_last, perm=perm)


# -- the plan --------------------------------------------------------------------------------------
@dataclass
class MatmulPlan:
    """What `check` worked out: C[b] = X[b] . Y[b]^T, in chunks of n_c rows and m_c columns."""

    x: Operand
    y: Operand
    batch: int
    activation: str
    rows: list[tuple[int, int]] = field(default_factory=list)
    cols: list[tuple[int, int]] = field(default_factory=list)
    per_batch_reshape: bool = False
    kind: str = "float"
    block_sum: bool = False
    full: bool = False  # both operands repeated to [1, d, 1, n_c m_c]: shown forms only
    spread: bool = False  # the full form laid out as [1, d, n_c, m_c] (`spread`): fewer bytes
    swapped: bool = False  # computes C^T = Y . X^T per head, then transposes it
    merge: list[Op] | None = (
        None  # the heads' merge TRANSPOSE it writes directly ([H, N, E] -> [N, H, E])
    )
    into: Op | None = None  # the TRANSPOSE whose output is the plain product (`_columns_on_batch`)
    # ("x" | "y", points): that softmax operand split into ranges at `points` (softmax_split)
    split: tuple[str, tuple[float, ...]] | None = None

    @property
    def pieces(self) -> int:
        return len(self.rows) * len(self.cols)

    @property
    def n(self) -> int:
        return self.x.rows

    @property
    def m(self) -> int:
        return self.y.rows

    @property
    def d(self) -> int:
        return self.x.depth


def _layout(plan: MatmulPlan, block: bool) -> tuple[list, list] | None:
    """(row chunks, column chunks) for one way of summing: `block` (a 1x1 conv of 0/1 blocks
    on [1, n_c, 1, m_c d]: m_c^2 d weights, no reshape) or the grid (RESHAPE to
    [1, n_c, m_c, d] and a conv of d ones: n_c m_c d within the RESHAPE limit). None when no
    column fits."""
    row_limit, reshape_limit, transpose_limit = _limits()
    d, n, m = plan.d, plan.n, plan.m
    widest = min(row_limit, PARAMETER_BUDGET // d)  # m_c d: the row, and m_c d^2 repeat weights
    if not plan.y.in_order:
        widest = min(widest, transpose_limit)
    m_c = min(m, widest // d, math.isqrt(PARAMETER_BUDGET // d) if block else reshape_limit // d)
    if m_c < 1:
        return None
    cols = _chunks(m, m_c)
    m_c = max(b - a for a, b in cols)
    tallest = n if block else reshape_limit // (m_c * d)
    if not plan.x.in_order:
        tallest = min(tallest, transpose_limit // d)
    return _chunks(n, max(1, tallest)), cols


def _layout_full(plan: MatmulPlan) -> tuple[list, list] | None:
    """(row chunks, column chunks) with both operands repeated: n_c m_c channels within the row
    limit, repeat weights n_c m_c (n_c + m_c) within PARAMETER_BUDGET, transposed operand
    pieces within the TRANSPOSE limit; None past FULL_PIECES pieces per head."""
    row_limit, _, transpose_limit = _limits()
    d, n, m = plan.d, plan.n, plan.m
    best = None
    for n_c in sorted({min(n, c) for c in (8, 16, 32, 48, 64, 80, 96, 128, 256, n)}):
        rows = _chunks(n, n_c)
        n_c = max(b - a for a, b in rows)
        if plan.x.in_order and n_c * d > transpose_limit:
            continue
        m_c = min(m, row_limit // n_c, transpose_limit // d if plan.y.in_order else m)
        m_c = min(m_c, SUM_CHANNELS // n_c)
        while m_c > 0 and n_c * m_c * (n_c + m_c) > PARAMETER_BUDGET:
            m_c -= 1
        if m_c < 1:
            continue
        cols = _chunks(m, m_c)
        if best is None or len(rows) * len(cols) < len(best[0]) * len(best[1]):
            best = (rows, cols)
    if best is None or len(best[0]) * len(best[1]) > FULL_PIECES:
        return None
    return best


def _plan_chunks(plan: MatmulPlan, out: Tensor) -> Refusal | None:
    """Fill in the chunks and the final reshape: both operands repeated (shown forms only)
    when that needs at most FULL_PIECES pieces per head, else the way of summing that needs
    fewer pieces; a refusal when no chunking fits the limits."""
    reshape_limit = _limits()[1]
    ways = []
    full = _layout_full(plan)
    if full is not None:
        ways.append((0, False, *full, True))
    for block in (True, False):
        layout = _layout(plan, block)
        if layout is not None:
            rows, cols = layout
            ways.append((len(rows) * len(cols), not block, rows, cols, block))
    if not ways:
        return refuse(f"a contracted depth of {plan.d} leaves no column that fits the limits")
    _, _, plan.rows, plan.cols, plan.block_sum = min(ways)
    plan.full = full is not None
    n, m = plan.n, plan.m
    if plan.batch * n * m > reshape_limit:
        lead = [a for a in out.shape[:-2] if a > 1]
        if n * m > reshape_limit or len(lead) > 1:
            return refuse(
                f"its {list(out.shape)} result is larger than one RESHAPE the compiler maps"
                f" ({reshape_limit} elements) per head"
            )
        plan.per_batch_reshape = True
    return _pieces_refusal(plan)


def _fewer_pieces(plan: MatmulPlan, swapped: MatmulPlan, out: Tensor) -> MatmulPlan | Refusal:
    """The plan, or C^T = Y . X^T transposed back per head when that needs fewer pieces (the
    repeat weights grow with the columns: A.V's are the few value channels once swapped)."""
    refusal = _plan_chunks(plan, out)
    n, m = plan.n, plan.m
    if n * m > _limits()[2] or n == 1 or m == 1:
        return refusal or plan
    if _plan_chunks(swapped, out) is not None:
        return refusal or plan
    why = _refusal_of("TRANSPOSE", [Tensor("t", (m, n), out.dtype)], (n, m),
                      consts=[np.array([1, 0], np.int32)])  # fmt: skip
    if why is None and (refusal is not None or swapped.pieces < plan.pieces):
        return swapped
    return refusal or plan


# An op the decomposition would write, asked of the table: (type, inputs, output shape, constants)
_Ask = tuple[str, list[Tensor], tuple[int, ...], list[np.ndarray]]


def _parts_count(plan: MatmulPlan) -> tuple[int, int]:
    """The softmax ranges of (X, Y): (1, 1) unsplit."""
    if plan.split is None:
        return 1, 1
    count = len(softmax_split.parts(plan.split[1]))
    return (count, 1) if plan.split[0] == "x" else (1, count)


def _spread_if_cheaper(plan: MatmulPlan) -> None:
    """A full plan laid out by `spread` instead, where that form's ops are all shown mapped and
    its estimated time (parameters streamed, ops) is less (`spread.choose`)."""
    if not plan.full:
        return
    transpose_limit, d = _limits()[2], plan.d
    most = (
        transpose_limit // d if plan.x.in_order else plan.n,
        transpose_limit // d if plan.y.in_order else plan.m,
    )
    sizes = ([b - a for a, b in plan.rows], [b - a for a, b in plan.cols])
    found = spread.choose(d, sizes, plan.n, plan.m, _parts_count(plan), most)
    if found is not None:
        plan.rows, plan.cols = _chunks(plan.n, found[0]), _chunks(plan.m, found[1])
        plan.spread = True


def _pieces_refusal(plan: MatmulPlan) -> Refusal | None:
    """Ask the table about each distinct piece the rewrite writes (a scratch graph): the rule
    never trades the refused BATCH_MATMUL for other refused ops."""
    dtype = "INT8" if plan.kind == "int" else "FLOAT32"
    d = plan.d

    def t(*shape: int) -> Tensor:
        return Tensor("t", tuple(shape), dtype)

    for n_c in {b - a for a, b in plan.rows}:
        for m_c in {b - a for a, b in plan.cols}:
            if plan.full:
                wide = (1, d, 1, n_c * m_c)
                asks: list[_Ask] = [
                    ("CONV_2D", [t(1, d, 1, n_c)], wide, [np.zeros((n_c * m_c, 1, 1, n_c))]),
                    ("MUL", [t(*wide), t(*wide)], wide, []),
                    ("DEPTHWISE_CONV_2D", [t(*wide)], (1, 1, 1, n_c * m_c),
                     [np.ones((1, d, 1, n_c * m_c))]),
                ]  # fmt: skip
                why = _first_refusal(asks)
                if why:
                    return why
                continue
            w_rep = np.zeros((m_c * d, 1, 1, d), np.float32)
            wide = (1, n_c, 1, m_c * d)
            asks = [
                ("CONV_2D", [t(1, n_c, 1, d)], wide, [w_rep]),
                ("MUL", [t(*wide), t(1, 1, 1, m_c * d)], wide, []),
            ]
            if plan.block_sum:
                block = np.zeros((m_c, 1, 1, m_c * d), np.float32)
                asks.append(("CONV_2D", [t(*wide)], (1, n_c, 1, m_c), [block]))
            else:
                asks.append(("RESHAPE", [t(*wide)], (1, n_c, m_c, d), []))
                ones = np.ones((1, 1, 1, d), np.float32)
                asks.append(("CONV_2D", [t(1, n_c, m_c, d)], (1, n_c, m_c, 1), [ones]))
            for op_type, ins, shape, consts in asks:
                reason = _refusal_of(op_type, ins, shape, {"fused_activation_function": "NONE"},
                                     consts)  # fmt: skip
                if reason:
                    return refuse(
                        f"a {op_type} of the decomposition would stay on the CPU: {reason}"
                    )
    return None


def _softmax_rows(op: Operand) -> bool:
    """The operand is a SOFTMAX's output (through RESHAPEs that keep its last axis) read with
    the softmax's axis as the contracted depth: its rows are >= 0 and sum to 1."""
    t = op.tensor
    if op.axes()[1] != len(op.shape if op.perm is None else t.shape) - 1:  # the depth is last
        return False
    if op.view is not None and op.view[-1] != t.shape[-1]:
        return False
    while t.producer is not None and t.producer.type == "RESHAPE":
        source = t.producer.input(0)  # RESHAPE(x, shape)
        if not source.shape or source.shape[-1] != t.shape[-1]:
            return False
        t = source
    return t.producer is not None and t.producer.type == "SOFTMAX"


def split_of(plan: MatmulPlan) -> tuple[str, tuple[float, ...]] | None:
    """("x" | "y", points) when the float product reads a softmax A whose small weights matter
    on an operand repeated by a conv (X; Y too when both are): legalized before quantizing, one
    product tensor A V is calibrated to its largest product, so a diffuse row's many small
    products round to nothing. Split at `points` (softmax_split: 1/n and 8/n, none under the
    int8 softmax's step 1/256 nor at 1 or over), each range gets its own product tensor and
    scale. Only a softmax: its range [0, 1] and rows summing to 1 are known before calibration
    (the parts are exact only for A >= 0). None otherwise, or where the table refuses a part
    (CONV_2D with a fused RELU6 / RELU, the ADD)."""
    if plan.kind != "float" or plan.activation != "NONE":
        return None
    points = softmax_split.split_points(plan.d)
    if not points:
        return None
    sides = [("x", plan.x)] + ([("y", plan.y)] if plan.full else [])
    side = next((name for name, op in sides if _softmax_rows(op)), None)
    if side is None or not softmax_split.table_allows_split(plan.d):
        return None
    return side, points


def _first_refusal(asks: list[_Ask]) -> Refusal | None:
    for op_type, ins, shape, consts in asks:
        why = _refusal_of(op_type, ins, shape, {"fused_activation_function": "NONE"}, consts)
        if why:
            return refuse(f"a {op_type} of the decomposition would stay on the CPU: {why}")
    return None


def _lead_ok(operand: Operand, lead: tuple[int, ...]) -> bool:
    """The operand's batch is the product's (same leading axes, once leading ones are
    dropped) or it is shared (all ones)."""
    if operand.batch == 1:
        return True
    drop = [a for a in operand.lead if a != 1]
    return drop == [a for a in lead if a != 1]


def _kinds_refusal(*tensors: Tensor) -> tuple[str, Refusal | None]:
    kinds = {_kind(t) for t in tensors}
    kind = kinds.pop() if len(kinds) == 1 else None
    if kind is None:
        return "", refuse("its operands and result are not all float or all per-tensor int8")
    if kind == "int" and any(t.dtype != "INT8" for t in tensors):
        return "", refuse("uint8 operands: only float and int8 products are spelled out")
    return kind, None


def _activation_refusal(op_activation: str) -> Refusal | None:
    allowed = capability("edgetpu")["ops"]["CONV_2D"].get(
        "fused_activations", capability("edgetpu")["meta"]["default_fused_activations"]
    )
    if op_activation not in allowed:
        return refuse(f"its fused {op_activation} has no CONV_2D form the compiler maps")
    return None


# -- building ------------------------------------------------------------------------------------
class _Spell:
    """Builds the decomposition of one match (see the module docstring)."""

    def __init__(self, m: Match, plan: MatmulPlan, sums_wait: bool = False) -> None:
        self.m, self.p, self.sums_wait = m, plan, sums_wait
        self.b: Builder = m.builder()
        self.out = m.root.output
        self.int8 = plan.kind == "int"
        self._weights: dict[tuple[str, int], tuple[Value, Value]] = {}
        self._made: dict[tuple[str, int, int], Value] = {}
        self._spread: dict[tuple[str, int, int, int], list[tuple[Value, float]]] = {}

    # constants --------------------------------------------------------------------------------
    def _conv_weights(
        self,
        key: str,
        value: np.ndarray,
        q_in: Quantization | None,
        depthwise: bool = False,
        bias_value: float = 0.0,
    ):
        """(weights, bias) of a 0/1 conv, made once per shape: float, or int8 1 at scale 1
        with an int32 zero bias at the input's scale (`bias_value`: float only, the split)."""
        cache = (key, value.shape[-1] if depthwise else value.shape[0])
        if cache in self._weights:
            return self._weights[cache]
        cout = cache[1]
        if not self.int8:
            w = self.b.const(value.astype(np.float32), f"{key}{cout}/w")
            bias = self.b.const(np.full(cout, bias_value, np.float32), f"{key}{cout}/b")
        else:
            w = self.b.const(value.astype(np.int8), f"{key}{cout}/w", "INT8", _quant(1.0, 0))
            s_in = _scale_zp_q(q_in)
            bias = self.b.const(np.zeros(cout, np.int32), f"{key}{cout}/b", "INT32",
                                _quant(s_in, 0))  # fmt: skip
        self._weights[cache] = (w, bias)
        return w, bias

    def _conv(self, x: Value, w_b, name: str, shape, quant, act: str = "NONE") -> Value:
        w, bias = w_b
        return self.b.CONV_2D(
            x, w, bias, name=name, shape=shape, quant=quant, padding="VALID", stride_w=1,
            stride_h=1, dilation_w_factor=1, dilation_h_factor=1, fused_activation_function=act,
        )  # fmt: skip

    # operand pieces ----------------------------------------------------------------------------
    def _rows(self, op: Operand, batch: int, lo: int, hi: int, name: str) -> Value | Tensor:
        """Rows lo:hi of the operand at `batch`, in [rows, k] memory order (a SLICE, and a
        TRANSPOSE of the 2-D piece when its rows come after its depth)."""
        piece = self._slice(op, batch, lo, hi, name)
        if op.in_order:
            return piece
        q = op.tensor.quantization
        flat = self._reshape(piece, [op.depth, hi - lo], f"{name}/flat", q)
        return self.b.TRANSPOSE(flat, self.b.ints([1, 0], f"{name}/perm"), name=f"{name}/rows",
                                quant=q)  # fmt: skip

    def _slice(self, op: Operand, batch: int, lo: int, hi: int, name: str) -> Value | Tensor:
        """Rows lo:hi of the operand at `batch` as they lie in memory (a SLICE when that is not
        the whole tensor): [rows, k] when `op.in_order`, else [k, rows]."""
        t = self._viewed(op)
        index = [int(i) for i in np.unravel_index(batch % op.batch, op.lead)] if op.lead else []
        if op.rows_last:
            begin, size = [*index, lo, 0], [*([1] * len(index)), hi - lo, op.depth]
        else:
            begin, size = [*index, 0, lo], [*([1] * len(index)), op.depth, hi - lo]
        if op.perm is not None:  # logical axis i is the tensor's axis perm[i]
            begin, size = _permuted(begin, op.perm), _permuted(size, op.perm)
        if list(size) == list(t.shape):
            return t
        return self.b.SLICE(t, self.b.ints(begin, f"{name}/begin"),
                            self.b.ints(size, f"{name}/size"), name=name,
                            quant=op.tensor.quantization)  # fmt: skip

    def _viewed(self, op: Operand) -> Tensor | Value:
        """The operand's tensor, reshaped to its view once when it has one."""
        if op.view is None or tuple(op.view) == tuple(op.tensor.shape):
            return op.tensor
        key = ("view", id(op.tensor), 0)
        if key not in self._made:
            name = f"view{len(self._made)}"
            self._made[key] = self._reshape(op.tensor, list(op.view), name, op.tensor.quantization)
        return self._made[key]

    def _reshape(self, x, shape, name: str, quant) -> Value:
        return self.b.RESHAPE(x, self.b.ints(shape, f"{name}/shape"), name=name, quant=quant)

    # the product -------------------------------------------------------------------------------
    def _product_quant(self) -> Quantization | None:
        """int8: the range every product of X's and Y's representable values spans."""
        if not self.int8:
            return None
        xl, xh = self.p.x.tensor.real_range()
        yl, yh = self.p.y.tensor.real_range()
        corners = [xl * yl, xl * yh, xh * yl, xh * yh]
        return _range_q(self.out, min(corners), max(corners))

    def _image(self, batch: int, r: int, r0: int, r1: int) -> Value:
        """X's rows r0:r1 at `batch` as an image [1, n_c, 1, d] (made once)."""
        key = ("x", batch % self.p.x.batch, r)
        if key not in self._made:
            q, d = self.p.x.tensor.quantization, self.p.d
            xs = self._rows(self.p.x, batch, r0, r1, f"h{batch}/x{r}")
            self._made[key] = self._reshape(xs, [1, r1 - r0, 1, d], f"h{batch}/x{r}/img", q)
        return self._made[key]

    def _vector(self, batch: int, c: int, c0: int, c1: int) -> Value:
        """Y's rows c0:c1 at `batch` as one vector [1, 1, 1, m_c d] (made once)."""
        key = ("y", batch % self.p.y.batch, c)
        if key not in self._made:
            q, size = self.p.y.tensor.quantization, (c1 - c0) * self.p.d
            ys = self._rows(self.p.y, batch, c0, c1, f"h{batch}/y{c}")
            self._made[key] = self._reshape(ys, [1, 1, 1, size], f"h{batch}/y{c}/vector", q)
        return self._made[key]

    def _repeated(self, img: Value, m_c: int, tag: str) -> list[tuple[Value, float]]:
        """The image's channels repeated m_c times: a 1x1 CONV_2D with 0/1 weights (two when
        X is split, see `_parts`)."""
        d, q = self.p.d, self.p.x.tensor.quantization
        rep = np.tile(np.eye(d, dtype=np.float32), (m_c, 1)).reshape(m_c * d, 1, 1, d)
        shape = (1, img.shape[1], 1, m_c * d)
        return self._parts(img, rep, "repeat", q, f"{tag}/repeat", shape, "x")

    def _parts(self, img: Value, w: np.ndarray, key: str, q, name: str, shape, side: str):
        """[(repeat, factor)]: the 1x1 repeat conv, or for the split softmax operand A (`side`)
        one conv per range (softmax_split.parts: weights w times a gain, a bias, a fused RELU6
        or RELU; its factor folded into its sum): for A >= 0 the parts times their factors add
        up to A exactly, and each product gets its own calibrated scale (see `split_of`)."""
        if self.p.split is None or self.p.split[0] != side:
            return [(self._conv(img, self._conv_weights(key, w, q), name, shape, q), 1.0)]
        out = []
        for i, part in enumerate(softmax_split.parts(self.p.split[1])):
            weights = self._conv_weights(f"{key}_r{i}", w * part.gain, q, bias_value=part.bias)
            conv = self._conv(img, weights, f"{name}/range{i}", shape, q, part.activation)
            out.append((conv, part.factor))
        return out

    def _added(self, sums: list[Value], name: str) -> Value:
        """The parts' sums added in turn (one: itself), the op's activation on the last ADD."""
        total = sums[0]
        for i, s in enumerate(sums[1:], 1):
            act = self.p.activation if i == len(sums) - 1 else "NONE"
            total = self.b.ADD(total, s, name=name if i == len(sums) - 1 else f"{name}{i}",
                               quant=self.out.quantization,
                               fused_activation_function=act)  # fmt: skip
        return total

    def batch_result(self, batch: int) -> Value:
        """C[batch] as [1, n, m, 1] or, summed by blocks, [1, n, 1, m] (column chunks joined
        along the axis of m, rows along axis 1)."""
        p, qt = self.p, self._product_quant()
        if p.spread:
            return self._pieces_result(batch, qt, self._spread_piece)
        if p.full:
            return self._pieces_result(batch, qt, self._full_piece)
        row_pieces = []
        for r, (r0, r1) in enumerate(p.rows):
            img, n_c = self._image(batch, r, r0, r1), r1 - r0
            repeated: dict[int, list[tuple[Value, float]]] = {}
            col_pieces = []
            for c, (c0, c1) in enumerate(p.cols):
                m_c, tag = c1 - c0, f"h{batch}/r{r}c{c}"
                if m_c not in repeated:
                    repeated[m_c] = self._repeated(img, m_c, tag)
                vec = self._vector(batch, c, c0, c1)
                sums = []
                for i, (part, factor) in enumerate(repeated[m_c]):
                    t = f"{tag}/part{i}" if len(repeated[m_c]) > 1 else tag
                    prod = self.b.MUL(part, vec, name=f"{t}/product", quant=qt)
                    sums.append(self._sum(prod, n_c, m_c, t, qt, factor))
                col_pieces.append(self._added(sums, f"{tag}/parts"))
            row_pieces.append(self._join(col_pieces, 3 if p.block_sum else 2, f"h{batch}/r{r}"))
        return self._join(row_pieces, 1, f"h{batch}")

    def _pieces_result(self, batch: int, qt, piece) -> Value:
        """C[batch] as [1, n, 1, m] from `piece` (`_full_piece`: both operands repeated per
        piece; `_spread_piece`: laid out by `spread`), column pieces joined along the axis of
        m, rows along axis 1."""
        row_pieces = []
        for r, (r0, r1) in enumerate(self.p.rows):
            cols = [
                piece(batch, (r, r0, r1), (c, c0, c1), qt) for c, (c0, c1) in enumerate(self.p.cols)
            ]
            row_pieces.append(self._join(cols, 3, f"h{batch}/r{r}"))
        return self._join(row_pieces, 1, f"h{batch}")

    def _depth_image(self, op: Operand, batch: int, span, which: str, shape=None) -> Value:
        """The operand's rows lo:hi at `batch` as [1, d, 1, rows] (rows in the channels; a 2-D
        TRANSPOSE when they lie as [rows, d]), or as `shape` (the same [d, rows] in order)."""
        _, lo, hi = span
        own = [1, self.p.d, 1, hi - lo]
        shape = own if shape is None else list(shape)
        key = (f"{which}d" if shape == own else f"{which}d{shape}", batch % op.batch, span[0])
        if key not in self._made:
            name, q, d = f"h{batch}/{which}{span[0]}", op.tensor.quantization, self.p.d
            piece: Value | Tensor = self._slice(op, batch, lo, hi, name)
            if op.in_order:
                flat = self._reshape(piece, [hi - lo, d], f"{name}/flat", q)
                piece = self.b.TRANSPOSE(flat, self.b.ints([1, 0], f"{name}/perm"),
                                         name=f"{name}/t", quant=q)  # fmt: skip
            img = f"{name}/img" if shape == own else f"{name}/plane"
            self._made[key] = self._reshape(piece, shape, img, q)
        return self._made[key]

    def _spread_piece(self, batch: int, rows, cols, qt) -> Value:
        """C[rows, cols] as [1, n_c, 1, m_c]: X's rows along the width repeated over m_c
        channels by a 1x1 conv of ones, Y's copies (`_spread_y`), a MUL of the same shape
        [1, d, n_c, m_c], and the sum over d a d x 1 depthwise conv of ones (m_c channels)."""
        (r, r0, r1), (c, c0, c1) = rows, cols
        n_c, m_c, tag = r1 - r0, c1 - c0, f"h{batch}/r{r}c{c}"
        key, dp = ("sx", batch % self.p.x.batch, r, m_c), spread.padded(self.p.d)
        if key not in self._spread:
            xq = self.p.x.tensor.quantization
            col = self._depth_image(self.p.x, batch, rows, "x", (1, self.p.d, n_c, 1))
            col = self._padded(col, dp, f"{tag}/x_pad", xq)
            ones = np.ones((m_c, 1, 1, 1), np.float32)
            self._spread[key] = self._parts(col, ones, "sx", xq, f"{tag}/x_spread",
                                            (1, dp, n_c, m_c), "x")  # fmt: skip
        xr, yr = self._spread[key], self._spread_y(batch, cols, n_c, tag)
        sums = []
        for i, ((a, fa), (b, fb)) in enumerate((a, b) for a in xr for b in yr):
            t = f"{tag}/part{i}" if len(xr) * len(yr) > 1 else tag
            prod = self.b.MUL(a, b, name=f"{t}/product", quant=qt)
            n = len(xr) * len(yr)
            sums.append(self._depthwise_sum(prod, m_c, t, qt, fa * fb, n, n_c, depth=dp))
        summed = self._added(sums, f"{tag}/parts")
        return self._reshape(summed, [1, n_c, 1, m_c], f"{tag}/c", self.out.quantization)

    def _padded(self, x: Value, depth: int, name: str, q) -> Value:
        """x [1, d, w, c] with depth - d rows of zeros under it (PAD; x itself when none)."""
        rows = depth - x.shape[1]
        if rows == 0:
            return x
        pads = np.array([[0, 0], [0, rows], [0, 0], [0, 0]], np.int32)
        shape = (1, depth, *x.shape[2:])
        return self.b.PAD(x, self.b.const(pads, f"{name}/paddings", "INT32"), name=name,
                          shape=shape, quant=q)  # fmt: skip

    def _spread_y(self, batch: int, cols, n_c: int, tag: str) -> list[tuple[Value, float]]:
        """Y's rows c0:c1 as [1, d, n_c, m_c] (yr[k, i, j] = Y[j, k]): its [d, m_c] laid out
        as the plane [1, d1, d2, m_c], n_c copies joined along the channels by CONCATENATIONs
        of 2-4 inputs (`spread.copy_joins`), reshaped; then the softmax ranges of a split Y
        (a 1x1 conv of the identity each). Made once per column chunk and row height."""
        c, c0, c1 = cols
        key = ("sy", batch % self.p.y.batch, c, n_c)
        if key in self._spread:
            return self._spread[key]
        yq, d, m_c = self.p.y.tensor.quantization, spread.padded(self.p.d), c1 - c0
        d1, d2 = spread.plane(d)
        if d == self.p.d:
            first = self._depth_image(self.p.y, batch, cols, "y", (1, d1, d2, m_c))
        else:  # a prime depth: a row of zeros, then the plane
            image = self._depth_image(self.p.y, batch, cols, "y")
            first = self._reshape(self._padded(image, d, f"{tag}/y_pad", yq), [1, d1, d2, m_c],
                                  f"{tag}/y_plane", yq)  # fmt: skip
        blocks = {1: first}
        for i, join in enumerate(spread.copy_joins(n_c)):
            joined = [blocks[k] for k in join]
            blocks[sum(join)] = self.b.CONCATENATION(*joined, axis=3, name=f"{tag}/y_copies{i}",
                                                     quant=yq)  # fmt: skip
        wide = self._reshape(blocks[n_c], [1, d, n_c, m_c], f"{tag}/y_spread", yq)
        if self.p.split is None or self.p.split[0] != "y":
            self._spread[key] = [(wide, 1.0)]
        else:
            eye = np.eye(m_c, dtype=np.float32).reshape(m_c, 1, 1, m_c)
            self._spread[key] = self._parts(wide, eye, "sy", yq, f"{tag}/y_range",
                                            (1, d, n_c, m_c), "y")  # fmt: skip
        return self._spread[key]

    def _full_piece(self, batch: int, rows, cols, qt) -> Value:
        """C[rows, cols] as [1, n_c, 1, m_c]: X^T and Y^T as [1, d, 1, .] images, each repeated
        by a 1x1 conv of 0/1 weights to the (i, j) channels, a MUL of the same shape, and the
        sum over d a d x 1 depthwise conv of ones."""
        (r, r0, r1), (c, c0, c1) = rows, cols
        n_c, m_c, d, tag = r1 - r0, c1 - c0, self.p.d, f"h{batch}/r{r}c{c}"
        xq, yq = self.p.x.tensor.quantization, self.p.y.tensor.quantization
        xi = self._depth_image(self.p.x, batch, rows, "x")
        yi = self._depth_image(self.p.y, batch, cols, "y")
        wide = (1, d, 1, n_c * m_c)
        wx = np.kron(np.eye(n_c, dtype=np.float32), np.ones((m_c, 1), np.float32))
        wy = np.tile(np.eye(m_c, dtype=np.float32), (n_c, 1))
        xr = self._parts(xi, wx.reshape(-1, 1, 1, n_c), f"rx{n_c}_", xq, f"{tag}/x_repeat",
                         wide, "x")  # fmt: skip
        yr = self._parts(yi, wy.reshape(-1, 1, 1, m_c), f"ry{m_c}_", yq, f"{tag}/y_repeat",
                         wide, "y")  # fmt: skip
        sums = []
        for i, ((a, fa), (b, fb)) in enumerate((a, b) for a in xr for b in yr):
            t = f"{tag}/part{i}" if len(xr) * len(yr) > 1 else tag
            prod = self.b.MUL(a, b, name=f"{t}/product", quant=qt)
            sums.append(self._depthwise_sum(prod, n_c * m_c, t, qt, fa * fb, len(xr) * len(yr)))
        summed = self._added(sums, f"{tag}/parts")
        return self._reshape(summed, [1, n_c, 1, m_c], f"{tag}/c", self.out.quantization)

    def _depthwise_sum(
        self,
        prod: Value,
        width: int,
        tag: str,
        qt,
        factor: float,
        parts: int,
        rows: int = 1,
        depth: int | None = None,
    ) -> Value:
        """The sum over d of a [1, d, rows, width] product: a d x 1 depthwise conv of `factor`s
        (the op's activation on it when it is the only part). With int8 next (`sums_wait`) a
        float SUM over axis 1 (then a MUL by `factor`), which sumconv's rules turn into that
        conv once quantized: no float interpreter packs its d x width kernel."""
        d = self.p.d if depth is None else depth
        act = self.p.activation if parts == 1 else "NONE"
        if self.sums_wait and not self.int8 and act == "NONE":
            summed = self.b.SUM(prod, self.b.ints([1], f"{tag}/sum/axis"), keep_dims=True,
                                name=f"{tag}/sum", shape=(1, 1, rows, width))  # fmt: skip
            if factor == 1.0:
                return summed
            return self.b.MUL(summed, self.b.scalar(factor, f"{tag}/sum/factor", like=summed),
                              name=f"{tag}/sum/scaled")  # fmt: skip
        ones, bias = self._conv_weights(f"dsum{d}_{factor:.9g}_",
                                        np.full((1, d, 1, width), factor, np.float32), qt,
                                        depthwise=True)  # fmt: skip
        return self.b.DEPTHWISE_CONV_2D(
            prod, ones, bias, name=f"{tag}/sum", shape=(1, 1, rows, width),
            quant=self.out.quantization, padding="VALID", stride_w=1, stride_h=1,
            depth_multiplier=1, dilation_w_factor=1, dilation_h_factor=1,
            fused_activation_function=act,
        )  # fmt: skip

    def _sum(self, prod: Value, n_c: int, m_c: int, tag: str, qt, factor: float = 1.0) -> Value:
        """sum_k t[i, (j, k)] (times `factor`, a split's part): a conv of 0/1 blocks
        ([1, n_c, 1, m_c]), or RESHAPE to the grid [1, n_c, m_c, d] and a conv of d ones
        ([1, n_c, m_c, 1])."""
        d, q_out = self.p.d, self.out.quantization
        act = self.p.activation if self.p.split is None else "NONE"
        key = "" if factor == 1.0 else f"{factor:.9g}_"
        if self.p.block_sum:
            blocks = np.kron(np.eye(m_c, dtype=np.float32), np.ones((1, d), np.float32)) * factor
            w = self._conv_weights(f"blocks{key}", blocks.reshape(m_c, 1, 1, m_c * d), qt)
            return self._conv(prod, w, f"{tag}/sum", (1, n_c, 1, m_c), q_out, act)
        grid = self._reshape(prod, [1, n_c, m_c, d], f"{tag}/grid", qt)
        ones = self._conv_weights(f"sum{key}", np.full((1, 1, 1, d), factor, np.float32), qt)
        return self._conv(grid, ones, f"{tag}/sum", (1, n_c, m_c, 1), q_out, act)

    def _join(self, pieces: list[Value], axis: int, name: str) -> Value:
        if len(pieces) == 1:
            return pieces[0]
        return self.b.CONCATENATION(*pieces, axis=axis, name=name, quant=self.out.quantization)

    def _transposed_back(self, r: Value, batch: int) -> Value:
        """A swapped plan's C^T of one head, as C [1, n, 1, m]."""
        n, m, q = self.p.y.rows, self.p.x.rows, self.out.quantization
        flat = self._reshape(r, [m, n], f"h{batch}/transposed", q)
        turned = self.b.TRANSPOSE(flat, self.b.ints([1, 0], f"h{batch}/perm"),
                                  name=f"h{batch}/turned", quant=q)  # fmt: skip
        return self._reshape(turned, [1, n, 1, m], f"h{batch}/turned/img", q)

    def build(self) -> None:
        p, out = self.p, self.out
        results = [self.batch_result(i) for i in range(p.batch)]
        if p.swapped:
            results = [self._transposed_back(r, i) for i, r in enumerate(results)]
        if p.merge is not None:  # the heads' merge TRANSPOSE: join them as it lays them out
            flat = [
                self._reshape_to(r, [1, p.n, 1, p.m], f"h{i}/flat") for i, r in enumerate(results)
            ]
            last = p.merge[-1].output
            merged = self._reshape_to(self._join(flat, 2, "heads"), last.shape, "merged")
            merged.tensor = last
            self.b.commit(remove=[*p.merge, self.m.root])
            return
        if p.into is not None:  # the plain product is the TRANSPOSE's output; both go
            last = p.into.output
            value = self._result(results, tuple(last.shape))
            value.tensor = last
            self.b.commit(remove=[p.into, self.m.root])
            return
        self.b.replace(self.m.root, self._result(results, tuple(out.shape)))

    def _result(self, results: list[Value], shape: tuple[int, ...]) -> Value:
        """The heads' results joined as `shape`: one RESHAPE of them all, or one per head
        joined along the head axis (`per_batch_reshape`)."""
        if not self.p.per_batch_reshape:
            return self._reshape_to(self._join(results, 1, "heads"), shape, "result")
        axis = next(i for i, a in enumerate(shape[:-2]) if a > 1)
        piece_shape = [1 if i == axis else a for i, a in enumerate(shape)]
        pieces = [self._reshape_to(r, piece_shape, f"h{i}/result") for i, r in enumerate(results)]
        return self.b.CONCATENATION(*pieces, axis=axis, quant=self.out.quantization)

    def _reshape_to(self, x: Value, shape, name: str) -> Value:
        return self._reshape(x, list(shape), name, self.out.quantization)


@lifts_the_cut
def read_through(op: Op, graph: Graph | None = None) -> bool:
    """A TRANSPOSE or RESHAPE whose output reaches only products of two activations, through
    more TRANSPOSEs and RESHAPEs at most: the legalization reads its operands through them
    (`Operand.perm`, `Operand.view`: each head's rows are sliced from the first one's input),
    and they go with the product. The gate (`after_the_cut`) must not count them as a cut:
    onnx2tf puts the heads or the keys on a batch axis ([H, N, 1, d], [N, H, d, 1]: a dimension
    > 1 outside the 3 innermost, which the predictor refuses), and those would otherwise hold
    back the one rule that removes them (the Ultralytics route of YOLO26n-320: cut there at
    800/859, and of YOLO11n-320 at 296/520)."""
    if op.type not in _READ_THROUGH or not op.outputs or op.outputs[0] is None:
        return False
    return _reaches_products_only(op.outputs[0], graph)


_READ_THROUGH = ("TRANSPOSE", "RESHAPE")


def _reaches_products_only(t: Tensor, graph: Graph | None) -> bool:
    readers = t.consumers
    if not readers or (graph is not None and graph.is_graph_output(t)):
        return False
    return all(_product_or_through(r, graph) for r in readers)


def _product_or_through(r: Op, graph: Graph | None) -> bool:
    """`r` is a product of two activations, or a TRANSPOSE / RESHAPE reaching only such."""
    if r.type == "BATCH_MATMUL":
        return len(r.inputs) >= 2 and all(x is not None and not x.is_constant for x in r.inputs[:2])
    out = r.outputs[0] if r.outputs else None
    return r.type in _READ_THROUGH and out is not None and _reaches_products_only(out, graph)


def _sole_reader(graph: Graph, t: Tensor) -> Op | None:
    readers = t.consumers
    return readers[0] if len(readers) == 1 and not graph.is_graph_output(t) else None


def _merge_transpose(graph: Graph, out: Tensor) -> list[Op] | None:
    """The TRANSPOSE that merges the product's heads, [.., H, N, E] -> [.., N, H, E] (over the
    dimensions > 1), when it is the product's one reader (after a RESHAPE that only adds or
    drops dimensions of 1) and keeps its quantization: the pieces can be joined in that order
    directly, and the TRANSPOSE (whose form no compiled model shows mapped) goes. Returns the
    ops that go ([RESHAPE,] TRANSPOSE)."""
    op, gone = _sole_reader(graph, out), []
    if op is not None and op.type == "RESHAPE" and op.inputs[0] is out:
        same = [a for a in op.output.shape if a > 1] == [a for a in out.shape if a > 1]
        q = cast(Quantization, op.output.quantization)  # (read only when `out` is quantized)
        if not same or (out.is_quantized and not q.same_as(out.quantization)):
            return None
        gone.append(op)
        op = _sole_reader(graph, op.output)
    t = gone[-1].output if gone else out
    if op is None or op.type != "TRANSPOSE" or len(op.inputs) < 2 or op.inputs[0] is not t:
        return None
    perm_t = op.inputs[1]
    if perm_t is None or not perm_t.is_constant or len(t.shape) < 3:
        return None
    if t.is_quantized and not cast(Quantization, op.output.quantization).same_as(t.quantization):
        return None
    rank = len(t.shape)
    perm = [int(v) % rank for v in np.asarray(perm_t.data).reshape(-1)]
    big = [i for i, a in enumerate(t.shape) if a > 1]
    heads = [i for i in big if i < rank - 2]
    if len(heads) != 1 or rank - 2 not in big or rank - 1 not in big:
        return None
    order = [i for i in perm if i in big]
    return [*gone, op] if order == [rank - 2, heads[0], rank - 1] else None


def _permuted(values: list[int], perm: tuple[int, ...]) -> list[int]:
    """`values` given per logical axis, placed on the tensor's axes (axis perm[i] gets i's)."""
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = values[i]
    return out


def _scale_zp_q(q: Quantization | None) -> float:
    return float(np.asarray(q.scale).reshape(-1)[0]) if q is not None else 1.0


def matmul_int8_steps(plan: MatmulPlan, out: Tensor) -> int:
    """Steps of the output an int8 product spelled out may differ from the kernel's: the d
    roundings of the products (half of s_t each) and the two final roundings (ours and the
    kernel's). 0 on a float product."""
    if plan.kind != "int":
        return 0
    xl, xh = plan.x.tensor.real_range()
    yl, yh = plan.y.tensor.real_range()
    corners = [xl * yl, xl * yh, xh * yl, xh * yh]
    s_t = float(cast(np.ndarray, _range_q(out, min(corners), max(corners)).scale)[0])
    s_out = _scale_zp(out)[0]
    return math.ceil(plan.d * s_t / (2.0 * s_out) - 1e-9) + 1


# -- the rules -----------------------------------------------------------------------------------
MAX_INT8_STEPS = 4  # an int8 product's declared error, in steps of its output (LegalizeGeluInt8's)


class _MatmulRule(Rule):
    """What both product rules share: the plan, its int8 bound and the rewrite."""

    quantized_ok = True
    int8_error_steps = 2  # at least; `int8_error` gives the match's (matmul_int8_steps)
    float_form_waits_for_int8 = True  # its depthwise sums: float SUMs, int8 ones in sumconv

    def __init__(self, sums_wait: bool = False) -> None:
        self.sums_wait = sums_wait

    def waiting_for_int8(self) -> Rule:
        return type(self)(sums_wait=True)

    def int8_error(self, m: Match, *, plan: MatmulPlan) -> int:
        return matmul_int8_steps(plan, m.root.output)

    @staticmethod
    def _bounded(m: Match, plan: MatmulPlan | Refusal) -> MatmulPlan | Refusal:
        """The plan, or a refusal where its int8 spelling may differ from the kernel by more
        than MAX_INT8_STEPS of the output (the product's step spans every representable
        product, so on wide operands the bound covers much of the output's range: such a
        rewrite would pass a check that says nothing). A float product is calibrated later."""
        if not isinstance(plan, MatmulPlan):
            return plan
        steps = matmul_int8_steps(plan, m.root.output)
        if steps > MAX_INT8_STEPS:
            return refuse(
                f"its int8 spelling may differ by {steps} steps of the output"
                f" (at most {MAX_INT8_STEPS} kept); legalized before quantizing it is calibrated"
            )
        return plan

    def rewrite(self, m: Match, *, plan: MatmulPlan) -> None:
        _Spell(m, plan, self.sums_wait).build()


class LegalizeActivationMatmul(_MatmulRule):
    """BATCH_MATMUL(a, b), both computed  =>  per head and chunk:
    CONV_2D(MUL(CONV_2D 1x1 repeat(RESHAPE(a_rows)), RESHAPE(b_rows)) reshaped, ones), joined.

    C[h, i, j] = sum_k a[h, i, k] b[h, k, j] (adj_x / adj_y transpose an operand; a TRANSPOSE
    that swaps an operand's last two axes is read through). See the module docstring for the
    decomposition, why it was chosen, its chunks and its int8 bound.
    """

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.BATCH_MATMUL(p.a, p.b)

    @_gated
    def check(self, m: Match, *, a: Tensor, b: Tensor) -> Refusal | MatmulPlan:
        """A refusal, or the plan (operands as rows, chunks)."""
        return self._bounded(m, self._plan(m, a, b))

    @staticmethod
    def _plan(m: Match, a: Tensor, b: Tensor) -> MatmulPlan | Refusal:
        out = m.root.output
        if a.is_constant or b.is_constant:
            return NotApplicable("an operand is constant (BatchMatmulToFullyConnected's case)")
        kind, refusal = _kinds_refusal(a, b, out)
        if refusal:
            return refusal
        if len(a.shape) < 2 or len(b.shape) < 2 or len(out.shape) < 2:
            return refuse("an operand has fewer than 2 dimensions")
        rows_x, rows_y = not m.root.options.get("adj_x", False), bool(m.root.options.get("adj_y"))
        x, y = _through_transpose(a, rows_x), _through_transpose(b, rows_y)
        shape = tuple(out.shape)
        lead = shape[:-2]
        into = None
        if not (_lead_ok(x, lead) and _lead_ok(y, lead)):
            columns = _columns_on_batch(m.graph, x, y, out)
            if columns is not None:  # onnx2tf's columns on a batch axis
                x, y, shape, into = columns
            else:  # onnx2tf's rows on a batch axis
                x, y, shape = _fold_broadcast_rows(Operand(a, rows_x), Operand(b, rows_y), shape)
            lead = shape[:-2]
        batch = int(np.prod(lead, dtype=np.int64)) if lead else 1
        if not (_lead_ok(x, lead) and _lead_ok(y, lead)):
            return refuse("its operands broadcast their batch dimensions")
        if x.depth != y.depth or (x.rows, y.rows) != tuple(shape[-2:]):
            return refuse("operand shapes do not give the product's shape")
        plan = _fewer_pieces(
            MatmulPlan(x, y, batch, "NONE", kind=kind),
            MatmulPlan(y, x, batch, "NONE", kind=kind, swapped=True),
            Tensor("product", shape, out.dtype),
        )
        if isinstance(plan, MatmulPlan):
            plan.split = split_of(plan)
            _spread_if_cheaper(plan)
        if isinstance(plan, MatmulPlan) and into is not None:
            plan.into = into
            return plan
        if isinstance(plan, MatmulPlan) and plan.per_batch_reshape and shape != out.shape:
            return refuse(
                "its rows are spread over a batch axis and each head needs its own reshape"
            )
        if isinstance(plan, MatmulPlan) and not plan.per_batch_reshape and shape == out.shape:
            plan.merge = _merge_transpose(m.graph, out)
        return plan


class LegalizeComputedFullyConnected(_MatmulRule):
    """FULLY_CONNECTED(x, W) with computed weights W [m, d]  =>  the product of
    LegalizeActivationMatmul with X = x's rows and Y = W (already rows), the fused activation
    (RELU, RELU6, RELU_N1_TO_1) on the summing conv.

    onnx2tf writes some MatMuls of two activations this way. A bias must be absent or zero.
    """

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.FULLY_CONNECTED(p.x, p.w, ...)

    @_gated
    def check(self, m: Match, *, x: Tensor, w: Tensor) -> Refusal | MatmulPlan:
        """A refusal, or the plan (operands as rows, chunks)."""
        return self._bounded(m, self._plan(m, x, w))

    @staticmethod
    def _plan(m: Match, x: Tensor, w: Tensor) -> MatmulPlan | Refusal:
        out = m.root.output
        if w.is_constant:
            return NotApplicable("constant weights: the compiler maps it")
        if x.is_constant:
            return refuse("the constant is the data operand")
        kind, refusal = _kinds_refusal(x, w, out)
        if refusal:
            return refusal
        bias = m.root.inputs[2] if len(m.root.inputs) > 2 else None
        if bias is not None and (not bias.is_constant or np.any(np.asarray(bias.data) != 0)):
            return refuse("the product has a bias")
        if len(w.shape) != 2 or not x.shape or x.shape[-1] != w.shape[1]:
            return refuse(f"weights {list(w.shape)} do not match data {list(x.shape)}")
        refusal = _activation_refusal(m.root.fused_activation)
        if refusal:
            return refusal
        rows = x.size // x.shape[-1]
        if out.size != rows * w.shape[0]:
            return refuse("the output is not rows x weights")
        lead = tuple(x.shape[:-2])
        xs = Operand(x, True) if len(x.shape) >= 2 else None
        if xs is None:
            return refuse("the data operand is a vector")
        batch = int(np.prod(lead, dtype=np.int64)) if lead else 1
        plan = MatmulPlan(xs, Operand(w, True), batch, m.root.fused_activation, kind=kind)
        virtual = Tensor("fc", (*x.shape[:-1], w.shape[0]), out.dtype)
        return _plan_chunks(plan, virtual) or plan


def spread_decision(graph: Graph, op: Op) -> tuple[spread.Cost, spread.Cost | None, bool] | None:
    """How `LegalizeActivationMatmul` decides between the full and the spread form for `op` (a
    product of two activations in `graph`), per head: the full form's cost, the spread form's
    (None where no chunking of it is shown mapped) and whether the spread form is taken. None
    where the rule writes neither form (refused, or the per-channel MUL ways). For benchmarks
    (benchmarks/edgetpu_params.py): the rule itself decides in `_spread_if_cheaper`."""
    if op.type != "BATCH_MATMUL" or len(op.inputs) < 2:
        return None
    a, b = op.input(0), op.input(1)
    plan = LegalizeActivationMatmul._plan(Match(graph, op, {}, [op]), a, b)
    full = _layout_full(plan) if isinstance(plan, MatmulPlan) and plan.full else None
    if not isinstance(plan, MatmulPlan) or full is None:
        return None
    parts, d = _parts_count(plan), plan.d
    before = spread.full_cost(d, [y - x for x, y in full[0]], [y - x for x, y in full[1]], parts)
    transpose_limit = _limits()[2]
    most = (
        transpose_limit // d if plan.x.in_order else plan.n,
        transpose_limit // d if plan.y.in_order else plan.m,
    )
    found = spread.layout(d, plan.n, plan.m, parts, *most)
    after = None
    if found is not None:
        rows, cols = _chunks(plan.n, found[0]), _chunks(plan.m, found[1])
        after = spread.spread_cost(d, [y - x for x, y in rows], [y - x for x, y in cols], parts)
    return before, after, plan.spread


# -- the LayerNorm around attention ----------------------------------------------------------
class LegalizeNeg(Rule):
    """NEG(x)  =>  MUL(x, -1).

    Keras's LayerNormalization converts with a NEG (of the mean), which is outside the Edge TPU
    table (so it cuts every attention block of a Keras model) and which litert-quantizer cannot
    quantize (the `edgetpu` recipe then falls back to the converter's PTQ). A MUL by a constant
    scalar is in the table and mapped in compiled models. Exact in float. Float only: the int8
    NEG kernel negates the integer codes whatever the quantization (-128 wraps to -128), which
    a MUL would not reproduce; legalized before quantizing, the MUL is quantized like any other.
    """

    int8_error_steps = 0  # float-only

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.NEG(p.x)

    @_gated
    def check(self, m: Match) -> Refusal | None:
        """The float test is the pattern's; what is left is where the cut falls."""
        return None

    def rewrite(self, m: Match, *, x: Tensor) -> None:
        b = m.builder()
        b.replace(m.root, b.MUL(x, b.scalar(-1.0, "minus_one", like=x)))


ATTENTION_LEGALIZATION: tuple[Rule, ...] = (
    *HEAD_SPLIT_LEGALIZATION,
    *ROWS_LEGALIZATION,
    *GELU_LEGALIZATION,
    LegalizeActivationMatmul(),
    LegalizeComputedFullyConnected(),
    *SUM_CONV_LEGALIZATION,  # (int8: the products' sums written as SUMs before quantizing)
    LegalizeNeg(),
)
