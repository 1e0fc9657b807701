"""Edge TPU legalization: a broadcast between two activations spelled in forms compiled models show.

No compiled model shows the compiler mapping a MUL, ADD or SUB of two activations where one is
broadcast against the other (`delegates/edgetpu_forms.toml`: the squeeze-excite scale
[1, 1, 1, C] times the map [1, H, W, C] is never seen mapped; tensorflow/tpu#556 says
EfficientNet-EdgeTPU left squeeze-excitation out), so the forms gate predicts such an op
undecided. Compiled models do show TILE of a channel vector over a plane mapped (Coral's
DeepLab test data: [1, 1, 1, 128] -> [1, 33, 33, 128]) and MUL/ADD/SUB of two activations of the
same shape mapped (YOLO's swish: up to [1, 320, 320, 16]). So the broadcast operand is tiled to
the output's shape and the op reads two tensors of one shape: every op written is of a form a
compiled model shows mapped at its size, or the rule does not fire.

int8 only: TILE copies codes (its output keeps its input's quantization) and the op computes the
same requantization of the same codes, element for element: bit-identical. On a float graph
the rule waits for quantization (`NotApplicable`), where the tiled tensor gets its input's scale.
"""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, refuse
from tflfuse.rewrite.common import NotApplicable
from tflfuse.targets.edgetpu.forms import gate
from tflfuse.targets.edgetpu.headsplit import unshown
from tflfuse.targets.edgetpu.rules import _gated, _kind

_OPS = ("MUL", "ADD", "SUB")


class TileBroadcastOperand(Rule):
    """int8: OP(x, s), OP in MUL/ADD/SUB, s an activation broadcast against x  =>
    OP(x, TILE(s, out_shape / s_shape))     (operands in their order)

    The squeeze-excite MUL of MobileNetV3/EfficientNet-style nets, and any elementwise op whose
    computed operand is broadcast over some axes. TILE's multiples are the output's shape over the
    broadcast operand's, so the op's two operands have the output's shape: out[i] = OP(x[i],
    s[i mod s_shape]) is unchanged. Fires only where the original op's form is not shown mapped
    and both ops written are (the module docstring gives the evidence).
    """

    quantized_ok = True
    int8_error_steps = 0  # TILE copies codes; the op requantizes the same codes

    def __init__(self, op_type: str = "MUL") -> None:
        if op_type not in _OPS:
            raise ValueError(f"TileBroadcastOperand takes one of {', '.join(_OPS)}")
        self.op_type = op_type

    @property
    def name(self) -> str:
        return f"TileBroadcastOperand{self.op_type.title()}"

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return getattr(p, self.op_type)(p.a, p.b)

    @_gated
    def check(self, m: Match, *, a: Tensor, b: Tensor) -> Refusal | tuple[int, list[int]]:
        """A refusal, or which operand to tile (0 or 1) and its multiples (the plan)."""
        op, out = m.root, m.root.output
        if a.is_constant or b.is_constant:
            return NotApplicable("an operand is a constant")
        if _kind(a) == "float" or _kind(out) == "float":
            return NotApplicable("float graph: tiled after quantization, one scale for the copies")
        if _kind(a) != "int" or _kind(b) != "int" or _kind(out) != "int":
            return refuse(f"{op.type} on per-channel or unquantized tensors")
        small = [i for i, t in enumerate((a, b)) if tuple(t.shape) != tuple(out.shape)]
        if len(small) != 1:
            return NotApplicable("not one operand broadcast against the other")
        which = small[0]
        s = (a, b)[which]
        if len(s.shape) != len(out.shape) or any(
            d != 1 and d != o for d, o in zip(s.shape, out.shape)
        ):
            return NotApplicable("the broadcast operand has another rank")
        if gate(op).answer == "mapped":
            return NotApplicable("the broadcast form is shown mapped as it is")
        multiples = [o // d for d, o in zip(s.shape, out.shape)]
        tiled = Tensor("tiled", tuple(out.shape), s.dtype, quantization=s.quantization)
        why = unshown(
            "TILE", [s], tiled.shape, {}, [np.asarray(multiples, np.int32)], every_form=True
        )
        if why:
            return refuse(f"its TILE is not shown mapped ({why})")
        operands = [tiled, b] if which == 0 else [a, tiled]
        why = unshown(op.type, operands, out.shape, op.options, every_form=True)
        if why:
            return refuse(f"the {op.type} of two same-shape tensors is not shown mapped ({why})")
        return which, multiples

    def rewrite(self, m: Match, *, a: Tensor, b: Tensor, plan: tuple[int, list[int]]) -> None:
        which, multiples = plan
        s = (a, b)[which]
        bld = m.builder()
        tiled = bld.TILE(s, bld.ints(multiples, "multiples"), name="tiled",
                         shape=m.root.output.shape, like=s)  # fmt: skip
        operands = (tiled, b) if which == 0 else (a, tiled)
        bld.replace(m.root, bld.op(m.root.type, *operands, options=dict(m.root.options)))


BROADCAST_LEGALIZATION: tuple[Rule, ...] = tuple(TileBroadcastOperand(t) for t in _OPS)
