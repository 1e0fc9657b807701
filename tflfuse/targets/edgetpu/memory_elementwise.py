"""Parameter bytes of elementwise ops of a constant, and channel slices the layout cannot decide.

An elementwise op the Edge TPU computes with a constant operand keeps that constant in the
parameter streams (one byte per stored element, the int8 value offset by 128 as the compiler
stores weights, each op's section padded to 64 bytes), streamed on every inference. Each form
below was located byte by byte in the parameter streams of dev twins
(`tflfuse.targets.edgetpu.package`); any other form is not laid out (None), and `check` says
the memory is undecided:

- A MUL of a one-element constant: none (the GEMM random forests' MUL by one value).
- A SUB of a one-element constant from an activation of more than one element: none (two dev
  forests of 64 and 300 samples, SUB(c [1, 1], x [1, N]): their first subgraph streams exactly
  their FULLY_CONNECTED's constant, 64 bytes; the holdout MoveNet Lightning's SUB of one value
  from [1, 192, 192, 3] holds none as well). From a one-element activation it is one cached
  block (`memory_forest.one_element_sub`).
- A SUB of a constant [..., N, 1] broadcast along the channel axis: the constant as it is, not
  widened to the output (a dev forest's threshold SUB(c [480, 1], x [480, 64]): 480 bytes, 512
  with the padding, right after the FULLY_CONNECTED's constant in its stream, both streamed);
  the same with one channel, a constant of the output's shape (the benchmarked forests'
  SUB(c [N, 1], x [N, 1]), N = 8, 384, 800, 2,624: their first subgraph's bytes exact).

- A MUL or an ADD of a per-channel constant (one value per channel of the activation, every
  other axis 1) of at most 128 channels: a 4-byte word per channel, 4 channels to a 64-byte
  block, streamed. Two twins found by issue 27's fourth round show it, both dev:
  IanisRusitoru/CoralModel (compiler 16) scales its input by MUL(x [1, 256, 256, 3], c [3])
  and ADD(x, c [3]): its EXECUTION_ONLY stream opens with the MUL's 3 float words in one block
  and the ADD's 3 int32 words in the next, 128 bytes beside its streamed FULLY_CONNECTED;
  Octogonapus/edgetpu-test (compiler 1.0, two commits of one graph) follows a dense layer
  with MUL(x [1, 128], c [128]) and ADD(x, c [128]) and streams 4,096 bytes: per op 32 blocks
  each of 4 words and 48 zero bytes. More channels no twin shows.

- A MUL or an ADD of a constant that varies along the channels and along some other axes
  of a rank-4 output, broadcast along the rest: the constant widened to the output, a byte
  an element, padded to 64, streamed. YOLOv5n's decode (Sandhya1708/modelnew, found by issue
  27's fourth round, dev): MUL(x [1, N, 3, 2], anchors [1, 1, 3, 2]) and ADD(x, grid
  [1, N, 1, 2]) for N = 400 and 1,600 fill its EXECUTION_ONLY stream exactly, each as N x 6
  bytes (2,432 and 9,600 with the padding; 24,064 in all), anchors before grid. Its MULs by
  a per-channel [1, 2] of one value in both channels are not in that stream: where such a
  uniform constant is kept no twin shows (undecided).

Not shown by a dev twin, so left undecided: an ADD of any other constant, a MUL of a constant
of more than one value not per channel (or of more than 128 channels), a SUB of a per-channel
constant (the holdout MoveNet's, below, agrees with the MUL's and ADD's form; it is checked,
not derived from).
A holdout twin (Coral's MoveNet Lightning, checked, not derived from) streams 2,368 bytes beside
2,862,656 cached: its [48, 48, 1] MUL constant as it is (2,304) and its [1, 1, 1, 3] SUB mean as
4 bytes a channel (64), its MUL and SUB by one value none; the forms a dev twin must show before
they are laid out. (The previous round's notes, on local pairs no longer at hand, said an ADD's
or a MUL's constant is stored widened to the output's size.)

A slice of the channel axis (SLICE, STRIDED_SLICE, SPLIT, SPLIT_V) starting at an offset that is
not a multiple of 4 is undecided: the layout stores channels in 4-byte chunks
(`memory.CHUNK`), the dev twins slice channels only into one-channel pieces (Coral's
split_concat: a SPLIT of 6 channels into ones, whose 192 bytes are the CONCATENATION's lanes),
and none shows what a slice across a chunk holds (the holdout YOLOv8n slices at multiples of 16
and holds none there, as the layout counts). No TensorFlow here.
"""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Op, Tensor

ELEMENTWISE = ("ADD", "SUB", "MUL")
SECTION = 64  # each op's section is padded to this many bytes
CHUNK = 4  # channels per 4-byte chunk: a slice starting elsewhere is undecided
PER_BLOCK = 4  # channels of a per-channel MUL's or ADD's constant to one 64-byte block
PER_CHANNEL_SHOWN = 128  # the most channels a twin shows in that form
_SLICES = ("SLICE", "STRIDED_SLICE", "SPLIT", "SPLIT_V")


def _pad(n: int, m: int) -> int:
    return -(-n // m) * m


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) if shape else 1


def _constant_operand(op: Op) -> tuple[Tensor, Tensor] | None:
    """(constant, activation) of an elementwise op of one constant int8/uint8 operand."""
    if op.type not in ELEMENTWISE or len(op.inputs) != 2:
        return None
    a, b = op.inputs
    if a is None or b is None or a.is_constant == b.is_constant:
        return None
    const, x = (a, b) if a.is_constant else (b, a)
    if const.dtype not in ("INT8", "UINT8"):
        return None
    return const, x


def holds_constant(op: Op) -> bool:
    """Whether `op` is an elementwise ADD/SUB/MUL of a constant (laid out here or undecided)."""
    return _constant_operand(op) is not None


def elementwise_bytes(op: Op) -> int | None:
    """The parameter bytes of an elementwise op of a constant in a form a dev twin shows (see
    the module's docstring), None for a form none shows. 0 for an op without a constant."""
    found = _constant_operand(op)
    if found is None:
        return 0
    const, _ = found
    shape = tuple(int(d) for d in const.shape)
    out = tuple(int(d) for d in op.outputs[0].shape) if op.outputs else ()
    n = _size(shape)
    if n == 1:
        several = _size(out) > 1  # a one-element SUB is `memory_forest.one_element_sub`'s
        return 0 if op.type == "MUL" or (op.type == "SUB" and several) else None
    channels = out[-1] if out else 0
    if op.type == "SUB" and shape[-1:] == (1,) and channels >= 1 and n * channels == _size(out):
        return _pad(n, SECTION)  # one value per position
    if op.type not in ("MUL", "ADD"):
        return None
    if per_channel(shape, out) and n <= PER_CHANNEL_SHOWN:
        if np.unique(np.asarray(const.data)).size == 1:
            return None  # one value in every channel: no twin shows where it is kept
        return SECTION * -(-n // PER_BLOCK)  # a word per channel, 4 to a block
    if widened_over_positions(shape, out):
        return _pad(_size(out), SECTION)  # the constant broadcast to the output, a byte each
    return None


def widened_over_positions(shape: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Whether a constant of `shape` varies along the output's channels and along some of its
    other axes but not all, broadcast along the rest: the forms YOLOv5n's decode shows, a MUL of
    [1, 1, 3, 2] and an ADD of [1, N, 1, 2] on [1, N, 3, 2] (rank 4 only)."""
    if len(shape) != len(out) or len(out) != 4 or shape[-1] != out[-1] or out[-1] <= 1:
        return False
    if any(c not in (1, o) for c, o in zip(shape, out, strict=True)):
        return False
    varied = [c > 1 for c, o in zip(shape[:-1], out[:-1], strict=True) if o > 1]
    return any(varied) and not all(varied)


def per_channel(shape: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Whether a constant of `shape` holds one value per channel of an output `out`: its
    last axis the output's channels, every other axis 1."""
    return (
        len(out) >= 2
        and len(shape) >= 1
        and shape[-1] == out[-1] > 1
        and all(d == 1 for d in shape[:-1])
    )


def _starts(op: Op) -> tuple[list[int], list[int]] | None:
    """(start offsets, widths) of the pieces a slice op takes along the last axis of its input,
    None when it slices another axis or its offsets are not constant."""
    values = [
        np.asarray(t.data).reshape(-1) if t is not None and t.is_constant else None
        for t in op.inputs
    ]
    if op.type == "SPLIT" and len(op.inputs) == 2 and values[0] is not None:
        x, axis, n = op.input(1), int(values[0][0]), len(op.outputs)
        if axis % max(len(x.shape), 1) != len(x.shape) - 1 or n == 0:
            return None
        width = int(x.shape[-1]) // n
        return [k * width for k in range(n)], [width] * n
    if op.type == "SPLIT_V" and len(op.inputs) == 3 and values[2] is not None:
        x, axis = op.input(0), int(values[2][0])
        if axis % max(len(x.shape), 1) != len(x.shape) - 1:
            return None
        widths = [int(o.shape[-1]) for o in op.outputs]
        return [int(s) for s in np.cumsum([0, *widths[:-1]])], widths
    if op.type in ("SLICE", "STRIDED_SLICE") and len(op.inputs) >= 2 and values[1] is not None:
        x, begin = op.input(0), [int(v) for v in values[1]]
        if len(begin) != len(x.shape) or not x.shape:
            return None
        last = len(begin) - 1
        masked = (
            op.type == "STRIDED_SLICE" and int((op.options or {}).get("begin_mask", 0)) >> last & 1
        )
        start = 0 if masked else begin[last] % int(x.shape[-1])
        return [start], [int(op.outputs[0].shape[-1]) if op.outputs[0].shape else 1]
    return None


def undecided_channel_slice(op: Op) -> bool:
    """A slice of the channel axis of a map of several channels taking a piece from an offset
    not a multiple of `CHUNK` (no twin shows what it holds), but for a SPLIT into one-channel
    pieces (split_concat's, dev: none)."""
    if op.type not in _SLICES or not op.inputs or not op.outputs:
        return False
    x = op.inputs[1] if op.type == "SPLIT" and len(op.inputs) > 1 else op.inputs[0]
    if x is None or not x.shape or int(x.shape[-1]) <= 1:
        return False
    found = _starts(op)
    if found is None:
        return False
    one_channel_split = op.type == "SPLIT" and all(w == 1 for w in found[1])
    return not one_channel_split and any(s % CHUNK != 0 for s in found[0])
