"""Edge TPU legalization: a FULLY_CONNECTED whose result is too big, computed in pieces of rows.

Token-mixing and pointwise layers of hybrids (timm's EdgeNeXt through litert-torch) run a
FULLY_CONNECTED over every pixel as a row, [1, H W, C_in] -> [1, H W, C], and reshape the
result back into the map [1, H, W, C]. At 64 x 64 pixels and C = 96 the rows tensor holds 393216
elements in its two innermost dimensions, over the 176400 the compiler is seen to accept
(`delegates/edgetpu.toml` max_row_elements): the FULLY_CONNECTED and the RESHAPE stay on the CPU
and the one Edge TPU segment ends there, although the map itself ([64, 96] innermost) fits.

Each row is computed on its own, so the rows are cut into pieces of k whole map rows (k W
rows): SLICE of the input rows, the same FULLY_CONNECTED (same weights, bias, options and output
quantization), a RESHAPE of the piece into [1, k, W, C] and a CONCATENATION of the pieces into
the map. k is the largest for which every op written is accepted by the op table and, for a
form the forms gate asks about (the RESHAPE that splits rows into a map: `forms.gated`), shown
mapped at its size by compiled evidence; no k, no rewrite.

Exact: every output element is the same sum of the same products, requantized with the same
parameters (int8: bit-identical), or the same float sum. On the float graph (where the `edgetpu`
recipe legalizes first, so that the GELU after it is legalized in float too) the quantizer then
calibrates each piece on its own rows, which may give the pieces their own scales; the
end-to-end check judges the int8 model.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from tflfuse.ir import Op, Tensor
from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, refuse
from tflfuse.rewrite.common import NotApplicable
from tflfuse.targets.capabilities import capability
from tflfuse.targets.edgetpu.headsplit import unshown
from tflfuse.targets.edgetpu.rules import _gated, _kind, _same_scale


def _row_limit() -> int:
    return int(capability("edgetpu")["meta"]["max_row_elements"])


def _rows_shape(t: Tensor) -> tuple[int, int] | None:
    """(rows, width) when `t` is [1, ..., 1, rows, width]."""
    if len(t.shape) < 2 or any(d != 1 for d in t.shape[:-2]):
        return None
    return int(t.shape[-2]), int(t.shape[-1])


def _ones(rank: int, *tail: int) -> tuple[int, ...]:
    return (1,) * (rank - len(tail)) + tuple(tail)


def _piece_refusal(m: Match, k: int, width: int) -> str | None:
    """Why one piece of k map rows would not be shown mapped (None: every op of it is)."""
    reshape = m.root
    fc = cast(Op, reshape.input(0).producer)  # (the pattern's FULLY_CONNECTED)
    x, out = fc.input(0), reshape.output
    rows = k * width
    xp = Tensor("x", _ones(len(x.shape), rows, x.shape[-1]), x.dtype, quantization=x.quantization)
    yp_shape = _ones(len(fc.output.shape), rows, fc.output.shape[-1])
    begin = np.zeros(len(x.shape), np.int32)
    why = unshown("SLICE", [x], xp.shape, {}, [begin, np.array(xp.shape, np.int32)])
    consts = [np.asarray(t.data) for t in fc.inputs[1:] if t is not None]
    why = why or unshown("FULLY_CONNECTED", [xp], yp_shape, fc.options, consts)
    yp = Tensor("y", yp_shape, x.dtype, quantization=fc.output.quantization)
    piece = _ones(len(out.shape), k, width, out.shape[-1])
    return why or unshown("RESHAPE", [yp], piece, {}, [np.array(piece, np.int32)])


class SplitFullyConnectedRows(Rule):
    """RESHAPE(FULLY_CONNECTED(x [1, H W, C_in]) [1, H W, C], [1, H, W, C]), the rows tensor over
    the compiler's row limit  =>  CONCATENATION along H of, per piece of k map rows,
    RESHAPE(FULLY_CONNECTED(SLICE(x, k W rows)), [1, k, W, C])     (module docstring)."""

    quantized_ok = True
    int8_error_steps = 0  # the same sums requantized the same way

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.RESHAPE(p.FULLY_CONNECTED(p.x, p.w, ..., out="y"), p.const("shape"))

    @_gated
    def check(self, m: Match, *, y: Tensor) -> Refusal | int:
        """A refusal, or k, the map rows per piece (the plan)."""
        out = m.root.output
        fc = y.op
        if len(y.consumers) != 1:
            return NotApplicable("not the one reader of a FULLY_CONNECTED")
        if m.graph.is_graph_output(y):
            return NotApplicable("the rows tensor is an output")
        got, limit = _rows_shape(y), _row_limit()
        if got is None or got[0] * got[1] <= limit or len(out.shape) < 3:
            return NotApplicable("the rows tensor is within the row limit")
        rows, c = got
        width, height = int(out.shape[-2]), int(out.shape[-3])
        x = fc.input(0)
        if (
            _rows_shape(x) is None
            or x.shape[-2] != rows
            or out.shape[-1] != c
            or height * width != rows
            or any(d != 1 for d in out.shape[:-3])
        ):
            return NotApplicable("the reshape does not fold the rows into a map")
        if any(t is not None and not t.is_constant for t in fc.inputs[1:]):
            return NotApplicable("computed weights")
        kind = _kind(x)
        if kind is None or _kind(y) != kind:
            return refuse(f"FULLY_CONNECTED on {x.dtype} with per-channel or no quantization")
        if kind == "int" and not _same_scale(out, y):
            return refuse("the reshape requantizes")
        for k in range(height, 0, -1):
            last = height % k
            if not _piece_refusal(m, k, width) and not (last and _piece_refusal(m, last, width)):
                return k
        return refuse(f"no piece of map rows is shown mapped: {_piece_refusal(m, 1, width)}")

    def rewrite(self, m: Match, *, y: Tensor, plan: int) -> None:
        k, out, fc = plan, m.root.output, y.op
        x, width = fc.input(0), int(out.shape[-2])
        b = m.builder(at=fc)
        weights = list(fc.inputs[1:])
        pieces, start = [], 0
        for i in range(math.ceil(out.shape[-3] / k)):
            n = min(k, out.shape[-3] - start)
            begin = (0,) * (len(x.shape) - 2) + (start * width, 0)
            size = _ones(len(x.shape), n * width, x.shape[-1])
            part = b.SLICE(x, b.ints(begin, f"rows{i}/begin"), b.ints(size, f"rows{i}/size"),
                           name=f"rows{i}", like=x)  # fmt: skip
            shape = _ones(len(y.shape), n * width, y.shape[-1])
            row = b.FULLY_CONNECTED(part, *weights, name=f"rows{i}/fc", shape=shape, like=y,
                                    options=dict(fc.options))  # fmt: skip
            piece = _ones(len(out.shape), n, width, out.shape[-1])
            pieces.append(b.RESHAPE(row, b.ints(piece, f"rows{i}/shape"), name=f"rows{i}/map",
                                    like=out))  # fmt: skip
            start += n
        b.replace(m.root, b.CONCATENATION(*pieces, axis=len(out.shape) - 3, like=out))
        if any(op is fc for op in m.graph.ops) and not y.consumers:
            m.graph.remove_op(fc)


ROWS_LEGALIZATION: tuple[Rule, ...] = (SplitFullyConnectedRows(),)
