"""Edge TPU legalization of L2_NORMALIZATION: the sum of squares as two 1 x 1 convolutions.

EdgeNeXt's cross-covariance attention normalizes q and k over their N tokens
(F.normalize(dim=-1): L2_NORMALIZATION of [1, heads, d, N], N up to 1024). Coral's op list
names L2_NORMALIZATION, but no compiled model shows it mapped (`forms.gated`: undecided), and
litert-quantizer leaves it float: the one Edge TPU segment ends at the first one.

    L2_NORMALIZATION(x)  =>  xr * RSQRT(MAXIMUM(CONV_1x1(CONV_1x1(xr * xr, ones N -> 1),
                                                          ones 1 -> N), eps^2)),
                             xr = x viewed [1, R, 1, N] (R rows of N)

The first convolution sums each row's N squares into one channel, the second writes that sum
into every one of the row's N channels (weights 1: the value copied), so that every MUL reads
two operands of one shape (a form compiled models show) rather than a column against rows. Two
convolutions of N weights each, where one of N x N (`rowmean.ReplicateRowMean`'s form) would
hold a million weights at N = 1024. TFLite's kernel computes x / max(sqrt(S), 1e-6); x rsqrt(
max(S, 1e-12)) is the same up to float round-off (S summed in another order, rsqrt for 1 /
sqrt). Float only: the quantizer calibrates the result. Every op written is asked of the
compiler's table and, for a form the forms gate asks about, of compiled evidence.
"""

from __future__ import annotations

import math

import numpy as np

from tflfuse.ir import Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, refuse
from tflfuse.rewrite.common import NotApplicable, is_float
from tflfuse.targets.edgetpu.headsplit import unshown
from tflfuse.targets.edgetpu.rules import _gated

EPS = 1e-6  # TFLite's L2_NORMALIZATION: x / max(||x||, EPS)
CONV = {"padding": "VALID", "stride_w": 1, "stride_h": 1, "dilation_w_factor": 1,
        "dilation_h_factor": 1}  # fmt: skip


def _writes(
    rows: int, n: int
) -> list[tuple[str, list[tuple[int, ...]], tuple[int, ...], dict, list]]:
    view, col = (1, rows, 1, n), (1, rows, 1, 1)
    ones_in = np.ones((1, 1, 1, n), np.float32)
    ones_out = np.ones((n, 1, 1, 1), np.float32)
    return [
        ("MUL", [view, view], view, {}, []),
        ("CONV_2D", [view], col, CONV, [ones_in, np.zeros(1, np.float32)]),
        ("CONV_2D", [col], view, CONV, [ones_out, np.zeros(n, np.float32)]),
        ("RSQRT", [view], view, {}, []),
    ]


class SpellOutL2Normalization(Rule):
    """float: L2_NORMALIZATION(x)  =>  x * RSQRT(MAXIMUM(row sum of x * x, replicated, eps^2))
    (module docstring). The same function up to float round-off."""

    int8_error_steps = 0  # float only: the quantizer calibrates what it writes

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.L2_NORMALIZATION(p.x)

    @_gated
    def check(self, m: Match, *, x: Tensor) -> Refusal | None:
        if not is_float(x) or not is_float(m.root.output):
            return NotApplicable("int8: left to the int8 kernel (int8_completion)")
        if m.root.fused_activation not in ("NONE", ""):
            return refuse(f"a fused {m.root.fused_activation} after the normalization")
        if len(x.shape) < 1 or x.shape[-1] < 2:
            return NotApplicable("a normalization over one element")
        rows, n = math.prod(x.shape[:-1]), int(x.shape[-1])
        for op_type, shapes, out, options, consts in _writes(rows, n):
            ins = [Tensor("t", s, "FLOAT32") for s in shapes]
            why = unshown(op_type, ins, out, options, consts)
            if why:
                return refuse(
                    f"the {op_type} {list(out)} it would write is not shown mapped ({why})"
                )
        return None

    def rewrite(self, m: Match, *, x: Tensor) -> None:
        rows, n = math.prod(x.shape[:-1]), int(x.shape[-1])
        view, col = (1, rows, 1, n), (1, rows, 1, 1)
        b = m.builder()
        xr = b.RESHAPE(x, b.ints(view, "rows_shape"), name="rows", shape=view)
        sq = b.MUL(xr, xr, name="squares")
        s = b.CONV_2D(sq, b.const(np.ones((1, 1, 1, n), np.float32), "sum_weights"),
                      b.const(np.zeros(1, np.float32), "sum_bias"), name="sum", shape=col,
                      **CONV)  # fmt: skip
        full = b.CONV_2D(s, b.const(np.ones((n, 1, 1, 1), np.float32), "copy_weights"),
                         b.const(np.zeros(n, np.float32), "copy_bias"), name="sum_per_element",
                         shape=view, **CONV)  # fmt: skip
        floor = b.MAXIMUM(
            full, b.const(np.full((1, 1, 1, 1), EPS * EPS, np.float32), "eps2"), name="floor"
        )
        y = b.MUL(xr, b.RSQRT(floor, name="inverse_norm"), name="normalized")
        b.replace(m.root, b.RESHAPE(y, b.ints(tuple(x.shape), "shape"), shape=tuple(x.shape)))


L2_NORM_LEGALIZATION: tuple[Rule, ...] = (SpellOutL2Normalization(),)
