"""Kernel choice: the same maths written so a runtime picks its faster kernel.

These rewrites change no numbers (they only move bytes); whether one pays depends on the
runtime, so each asks the measured cost table (`tflfuse.cost`, `delegates/cost_table.json`)
for the op's dtype on the target's runtime and fires only where it is faster there.
"""

from __future__ import annotations

import numpy as np

from tflfuse import cost
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, refuse
from tflfuse.rules.common import NotApplicable


class MeanKeepDims(Rule):
    """MEAN(x, axes=[1, 2], keep_dims=False)  =>  RESHAPE(MEAN(x, axes=[1, 2], keep_dims=True)).

    Global average pooling of an NHWC tensor. The plain int8 kernels have a fast path only for
    keep_dims=True over H and W; without it the generic reduction is 1.4-2.9x slower on whole
    models (65x on the op alone; delegates/cost_table.json), XNNPACK is as fast either way.
    A float graph may still be quantized (convert fuses in float, then quantizes): there the
    rule fires when the int8 saving outweighs the float cost (a few microseconds).
    The same MEAN, then a reshape that keeps bytes and quantization; in int8 the fast path
    rounds its sum differently from the generic one: at most one quantization step.
    """

    quantized_ok = True
    int8_error_steps = 1

    def __init__(self, target: str = "xnnpack") -> None:
        self.target = target

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.MEAN(p.x, p.const("axes"), out="y")

    def check(self, m: Match) -> Refusal | None:
        if m.root.options.get("keep_dims", False):
            return NotApplicable("the MEAN keeps its dimensions already")
        rank = len(m.x.shape)
        axes = {int(a) % rank for a in np.ravel(m.axes.data)} if rank else set()
        if rank != 4 or axes != {1, 2}:
            return NotApplicable("not a mean over H and W of an NHWC tensor")
        if not cost.mean_keep_dims_pays(self.target, cost.op_dtype(m.root), m.x.shape):
            runtime = cost.runtime_label(self.target)
            return refuse(f"{runtime} run this MEAN as fast without keep_dims (cost table)")
        return None

    def rewrite(self, m: Match) -> None:
        g, mean, y = m.graph, m.root, m.y
        kept = g.add_tensor(y.name + "_kept", (m.x.shape[0], 1, 1, m.x.shape[3]), y.dtype,
                            quantization=y.quantization)  # fmt: skip
        mean.outputs = [kept]
        mean.options["keep_dims"] = True
        shape = g.add_constant(y.name + "_shape", np.asarray(y.shape, np.int32), "INT32")
        g.add_op("RESHAPE", [kept, shape], [y], {"new_shape": list(y.shape)}, after=mean)
