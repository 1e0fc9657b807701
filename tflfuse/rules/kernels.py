"""Kernel choice: the same maths written so a runtime picks its faster kernel.

The same values in float; in int8 each rounds differently by the steps it declares. Whether
one pays depends on the runtime, so each asks the measured cost table (`tflfuse.targets.cost`,
`delegates/cost_table.json`) for the op's dtype on the target's runtime and fires only where it
is faster there.
"""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Tensor
from tflfuse.rewrite import Builder, Match, OpPattern, PatternBuilder, Refusal, Rule, Value, refuse
from tflfuse.rewrite.common import NotApplicable
from tflfuse.targets import XNNPACK, Target, cost
from tflfuse.targets.edgetpu.rules import (
    LegalizeHardSwish,
    hard_swish_int8_steps,
    spell_out_hard_swish,
)


class MeanKeepDims(Rule):
    """MEAN(x, axes=[1, 2], keep_dims=False)  =>  RESHAPE(MEAN(x, axes=[1, 2], keep_dims=True)).

    Global average pooling of an NHWC tensor. The plain int8 kernels have a fast path only for
    keep_dims=True over H and W; without it the generic reduction is 1.4-2.9x slower on whole
    models (65x on the op alone; delegates/cost_table.json), XNNPACK is as fast either way.
    A float graph may still be quantized (convert fuses in float, then quantizes): there the
    rule fires when the int8 saving outweighs the float cost (a few microseconds).
    The same MEAN, then a reshape that keeps bytes and quantization; in int8 the fast path
    rounds differently from the generic one: each channel by at most one quantization step.
    Measured against the exact mean of the dequantized input it is as accurate, except when
    the input and output zero points differ a lot, where it is biased by about -0.45 step
    (all channels alike: a classifier after it amplifies that; `optimize` verifies).
    """

    quantized_ok = True
    int8_error_steps = 1

    def __init__(self, target: Target = XNNPACK) -> None:
        self.target = target

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MEAN(p.x, p.const("axes"), out="y")

    def check(self, m: Match, *, x: Tensor, axes: Tensor) -> Refusal | None:
        if m.root.options.get("keep_dims", False):
            return NotApplicable("the MEAN keeps its dimensions already")
        rank = len(x.shape)
        reduced = {int(a) % rank for a in np.ravel(np.asarray(axes.data))} if rank else set()
        if rank != 4 or reduced != {1, 2}:
            return NotApplicable("not a mean over H and W of an NHWC tensor")
        if not cost.mean_keep_dims_pays(self.target, cost.op_dtype(m.root), x.shape):
            runtime = cost.runtime_label(self.target)
            return refuse(f"{runtime} run this MEAN as fast without keep_dims (cost table)")
        return None

    def rewrite(self, m: Match, *, y: Tensor, x: Tensor) -> None:
        mean = m.root
        b = m.builder(prefix="", after=mean)
        kept = b.tensor(y.name + "_kept", (x.shape[0], 1, 1, x.shape[3]), y)
        b.set_output(mean, 0, kept)
        mean.options["keep_dims"] = True
        b.RESHAPE(kept, b.ints(y.shape, y.name + "_shape"), out=y, new_shape=list(y.shape))
        b.commit()


class MeanLastAxisAsRows(Rule):
    """MEAN(x (1, R, C), axis=-1, keep_dims=True)  =>
    RESHAPE (1, R, 1) <- MEAN(RESHAPE(x) (R, 1, C, 1), axes=[1, 2], keep_dims=True).

    LayerNorm's two means. The plain int8 kernels reduce the last axis generically, 4-9x slower
    than their pooling fast path, which the same numbers reach with the rows as the batch
    (delegates/cost_table.json: MEAN@last vs MEAN@rows); XNNPACK is slower that way, so only
    where the table says it pays. The same sums; int8 rounds at most one step differently.
    """

    quantized_ok = True
    int8_error_steps = 1

    def __init__(self, target: Target = XNNPACK) -> None:
        self.target = target

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MEAN(p.x, p.const("axes"), out="y")

    def check(self, m: Match, *, x: Tensor, axes: Tensor) -> Refusal | None:
        shape = tuple(x.shape)
        reduced = [int(a) % len(shape) for a in np.ravel(np.asarray(axes.data))] if shape else []
        if (
            len(shape) != 3
            or shape[0] != 1
            or reduced != [2]
            or not m.root.options.get("keep_dims")
        ):
            return NotApplicable("not a mean over the last axis of a (1, R, C) tensor")
        if shape[1] == 1:
            return NotApplicable("a single row")
        if not cost.mean_last_as_rows_pays(self.target, cost.op_dtype(m.root), *shape[1:]):
            runtime = cost.runtime_label(self.target)
            return refuse(f"{runtime} reduce the last axis as fast as a pool (cost table)")
        return None

    def rewrite(self, m: Match, *, x: Tensor, y: Tensor) -> None:
        mean = m.root
        rows, cols = x.shape[1], x.shape[2]

        def reshape(b: Builder, src: Tensor | Value, dst: Tensor | Value) -> None:
            shape = b.ints(dst.shape, dst.name + "_shape")
            b.RESHAPE(src, shape, out=dst, new_shape=list(dst.shape))

        before = m.builder(prefix="")  # the rows go in before the MEAN, the result after it
        pooled_in = before.tensor(x.name + "_rows", (rows, 1, cols, 1), x)
        pooled = before.tensor(y.name + "_rows", (rows, 1, 1, 1), y)
        reshape(before, x, pooled_in)
        before.set_input(mean, 0, pooled_in)
        before.set_input(mean, 1, before.ints([1, 2], y.name + "_axes"))
        before.set_output(mean, 0, pooled)
        before.commit()
        after = m.builder(prefix="", after=mean)
        reshape(after, pooled.made, y)
        after.commit()


_INT_RANGE = {"INT8": (-128, 127), "UINT8": (0, 255)}


class SpellOutInt8HardSwish(Rule):
    """HARD_SWISH(x), int8  =>  MUL(MUL(x, ADD(x, 3, fused RELU6)), 1/6): the Edge TPU's form
    (targets/edgetpu/rules.py `spell_out_hard_swish`), here where a runtime is faster with it.

    The TFLite XNNPACK delegate takes int8 ADD and MUL but not int8 HARD_SWISH, which then
    runs on the built-in kernel, about 5x slower than the three delegated ops
    (delegates/cost_table.json); the float rules do the opposite (RecognizeHardSwish), as
    float HARD_SWISH is delegated.
    """

    quantized_ok = True
    int8_error_steps = LegalizeHardSwish.int8_error_steps  # the same ops, the same roundings

    def __init__(self, target: Target = XNNPACK) -> None:
        self.target = target

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.HARD_SWISH(p.x, out="y")

    def check(self, m: Match, *, x: Tensor, y: Tensor) -> Refusal | None:
        if x.dtype not in _INT_RANGE or y.dtype != x.dtype:
            return NotApplicable("not an int8 HARD_SWISH")
        for t in (x, y):
            q = t.quantization
            if q is None or q.scale is None or q.per_channel:
                return refuse("the HARD_SWISH is not quantized per tensor")
        if not cost.spelled_hard_swish_pays(self.target, int(np.prod(y.shape))):
            runtime = cost.runtime_label(self.target)
            return refuse(f"{runtime} run the int8 HARD_SWISH as fast (cost table)")
        return None

    def int8_error(self, m: Match, *, x: Tensor, y: Tensor) -> int:
        """The spelled form's bound for this match's scales (hard_swish_int8_steps)."""
        return hard_swish_int8_steps(x, y)

    def rewrite(self, m: Match) -> None:
        spell_out_hard_swish(m)
