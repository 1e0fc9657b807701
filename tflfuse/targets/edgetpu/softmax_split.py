"""The ranges a softmax operand of an attention product is split into before quantizing.

Why. `LegalizeActivationMatmul` spells A.V as MUL products summed by convs. Legalized before
quantizing, each product tensor is calibrated to its largest product: a row of A that peaks
(one weight near 1) sets the step, and a diffuse row's many small weights (about 1/n each, n the
row's length) give products that round to nothing. Split A into ranges, each its own repeat conv,
MUL and sum, and each product tensor gets its own scale: the small weights' products are no
longer rounded at the peaked rows' step.

The ranges. A softmax row (>= 0, summing to 1) of a uniform row holds weights of 1/n; fewer than
n/8 of a row's weights exceed 8/n. So the split points are 1/n and 8/n (`POINTS`, in multiples
of 1/n): [0, 1/n] (the diffuse rows' weights), [1/n, 8/n] (the weights that stand out a
little), [8/n, 1] (the few that carry a peaked row). A point is kept only in [1/256, 1): the
int8 SOFTMAX writes its output at the fixed scale 1/256, so a range under one of its steps holds
at most one code and separates nothing (a 400-token row, YOLO at 640 px, keeps 8/n only), and a
point at 1 or over leaves its upper range empty (A <= 1; a 16-token row keeps 1/16 and 1/2).

The parts, each a 1x1 CONV_2D of the operand's repeat weights w (see attention.py), for a range
[lo, hi] of width r = hi - lo:
    bounded range:  CONV_2D(w 6/r, bias -6 lo/r, fused RELU6) = 6 clip((A - lo)/r, 0, 1)
                    (factor r/6, folded into that part's sum weights)
    last range:     CONV_2D(w, bias -lo, fused RELU) = max(A - lo, 0)   (factor 1)
For A >= 0 the parts times their factors add up to A exactly: clip(A, 0, p1) + clip(A - p1, 0,
p2 - p1) + max(A - p2, 0) = A. Float: exact (the sums are added in another order: round-off).
RELU6 rather than RELU_N1_TO_1: compiled models show CONV_2D with a fused RELU6 mapped (562 INT8
ops in 35 models) and RELU (266 in 101), never RELU_N1_TO_1; MINIMUM has no compiled evidence
(`delegates/edgetpu.toml` [legalization] attention_softmax_split).

int8. Only float products are split (the rule's declared bound, `matmul_int8_steps`, is 0 for
them: they are calibrated after). Once calibrated, part i rounds each of its d products by half
its step s_i, where s_i is set by (range width) x max|V| instead of 1 x max|V|: the small ranges'
products keep 1/r_i times more resolution, and the sums add the parts' errors (at most
sum_i d s_i / 2, against d s / 2 for one product at step s = max|V| / 127). An int8 product (a
stock int8 model given to `optimize`) is not split: its ranges could not be recalibrated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tflfuse.ir import Tensor
from tflfuse.targets.edgetpu.rules import _refusal_of

# The split points in multiples of 1/n (n: the softmax row's length, the product's contracted
# depth): a uniform row's weight, and 8 times it (see the module docstring).
POINTS = (1.0, 8.0)
# No split point under the int8 SOFTMAX output's own step, nor at 1 or over (A <= 1).
SMALLEST_POINT = 1.0 / 256
LARGEST_POINT = 1.0


@dataclass(frozen=True)
class Part:
    """One range [lo, hi] of the operand as a conv of the repeat weights: weights times
    `gain`, bias `bias`, fused `activation`; the part times `factor` is the range's share."""

    lo: float
    hi: float | None  # None: the last range, unbounded above (A <= 1 anyway)
    gain: float
    bias: float
    activation: str
    factor: float


def split_points(n: int) -> tuple[float, ...]:
    """The points a softmax row of length `n` is split at (ascending; empty: no split)."""
    points = (k / n for k in POINTS)
    return tuple(sorted(p for p in points if SMALLEST_POINT <= p < LARGEST_POINT))


def parts(points: tuple[float, ...]) -> list[Part]:
    """The parts of a split at `points` (ascending, > 0): one bounded part per range under the
    last point (RELU6), one unbounded above it (RELU); their shares add up to A for A >= 0."""
    out, lo = [], 0.0
    for hi in points:
        width = hi - lo
        out.append(Part(lo, hi, 6.0 / width, -6.0 * lo / width, "RELU6", width / 6.0))
        lo = hi
    out.append(Part(lo, None, 1.0, -lo, "RELU", 1.0))
    return out


def shares(a: np.ndarray, points: tuple[float, ...]) -> list[np.ndarray]:
    """What each part computes on `a` times its factor (numpy: the parts' arithmetic, for
    tests and for measuring a split's calibrated error)."""
    caps = {"RELU6": 6.0, "RELU": np.inf}
    return [np.clip(a * p.gain + p.bias, 0.0, caps[p.activation]) * p.factor for p in parts(points)]


def table_allows_split(depth: int) -> bool:
    """Whether the Edge TPU table takes the split's own ops: a 1x1 CONV_2D with a fused RELU6
    and with a fused RELU (shaped as a repeat conv of `depth` channels) and a float ADD."""
    x = Tensor("t", (1, depth, 1, 8), "FLOAT32")
    w = [np.zeros((8, 1, 1, 8))]
    for act in ("RELU6", "RELU"):
        options = {"fused_activation_function": act}
        if _refusal_of("CONV_2D", [x], (1, depth, 1, 8), options, w):
            return False
    f = Tensor("t", (1,), "FLOAT32")
    return _refusal_of("ADD", [f, f], (1,)) is None
