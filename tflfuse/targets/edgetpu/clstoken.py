"""Edge TPU legalization of a class token: a constant joined to the tokens, then one added.

ViT-style classifiers (timm's ViT and DeiT, through litert-torch or onnx2tf) prepend a class
token to the patch tokens, CONCATENATION([cls, x]) along the token axis, and add the position
embedding next, a constant of the joined shape. The compiler refuses a CONCATENATION whose
constant input is not all zeros (`delegates/edgetpu.toml`, `predict._check_concat`): the one Edge
TPU segment ends right after the patch embedding, and every legalization after it (the head
splits, the products of two activations) stays off, as it would still run on the CPU.

    CONCATENATION([c, x]) + p  =>  CONCATENATION([0, x]) + p'

with p' = p (broadcast to the joined shape) plus c where c sits. Exact in float: where c sat,
0 + (c + p) is c + p, the same float32 sum the source computes at run time; elsewhere p' is p.
The zeros are the constant input the compiler's table accepts. Float only (the stage before
quantization; the quantizer calibrates the result like any tensor). Fires only where the
CONCATENATION it writes is accepted by the compiler's table and, for a form the forms gate asks
about, shown mapped by compiled evidence (`headsplit.unshown`).
"""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, refuse
from tflfuse.rewrite.common import NotApplicable, float_constant, is_float
from tflfuse.targets.edgetpu.headsplit import unshown


def _plan(m: Match, x: Tensor, shift: Tensor) -> Refusal | tuple[int, int, np.ndarray]:
    """The joined tensor's axis, the place of its constant input, and p' (module docstring)."""
    cat = x.producer
    if cat is None or cat.type != "CONCATENATION":
        return NotApplicable("the ADD does not read a CONCATENATION")
    if len(cat.inputs) != 2 or cat.fused_activation != "NONE":
        return NotApplicable("not a CONCATENATION of two inputs without an activation")
    consts = [i for i, t in enumerate(cat.inputs) if t is not None and t.is_constant]
    if len(consts) != 1:
        return NotApplicable("not one constant and one computed input")
    where = consts[0]
    c = float_constant(cat.inputs[where])
    p = float_constant(shift)
    if c is None or p is None or not is_float(x) or not is_float(m.root.output):
        return NotApplicable("not a float constant joined and a float constant added")
    if not np.any(c):
        return NotApplicable("the constant joined is all zeros already")
    if len(x.consumers) != 1 or m.graph.is_graph_output(x):
        return refuse("the joined tensor is read elsewhere too")
    shape = tuple(x.shape)
    if tuple(m.root.output.shape) != shape:
        return refuse("the added constant broadcasts the joined tensor")
    axis = int(cat.options.get("axis", 0)) % len(shape)
    other = cat.input(1 - where)
    zeros = Tensor("zeros", tuple(c.shape), "FLOAT32", data=np.zeros_like(c))
    ins = [zeros, other] if where == 0 else [other, zeros]
    why = unshown("CONCATENATION", ins, shape, {"axis": axis})
    if why:
        return refuse(f"the CONCATENATION it would write is not shown mapped ({why})")
    full = np.array(np.broadcast_to(p, shape), np.float32)
    begin = 0 if where == 0 else shape[axis] - c.shape[axis]
    place = tuple(slice(begin, begin + c.shape[axis]) if k == axis else slice(None)
                  for k in range(len(shape)))  # fmt: skip
    full[place] = full[place] + c.astype(np.float32)  # the float32 sum the source computes
    return axis, where, full


class MoveClassTokenIntoAdd(Rule):
    """float: CONCATENATION([c, x]) + p, c and p constant, c not all zeros  =>
    CONCATENATION([0, x]) + (p + c where c sits): exact, and a CONCATENATION whose constant
    input is all zeros, which the compiler's table accepts (module docstring)."""

    int8_error_steps = 0  # float only: the same float32 values

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.ADD(p.x, p.const("shift"))

    def check(self, m: Match, *, x: Tensor, shift: Tensor) -> Refusal | tuple[int, int, np.ndarray]:
        """A refusal, or the axis, the constant's place and the new constant added."""
        return _plan(m, x, shift)

    def rewrite(self, m: Match, *, plan: tuple[int, int, np.ndarray], x: Tensor) -> None:
        axis, where, full = plan
        cat = x.producer
        assert cat is not None  # (the check read it)
        c = cat.input(where)
        other = cat.input(1 - where)
        b = m.builder()
        zeros = b.const(np.zeros(c.shape, np.float32), "zeros", "FLOAT32")
        ins = [zeros, other] if where == 0 else [other, zeros]
        joined = b.CONCATENATION(*ins, axis=axis)
        act = m.root.fused_activation
        b.replace(m.root, b.ADD(joined, b.const(full, "shift"), fused_activation_function=act))


CLASS_TOKEN_LEGALIZATION: tuple[Rule, ...] = (MoveClassTokenIntoAdd(),)
