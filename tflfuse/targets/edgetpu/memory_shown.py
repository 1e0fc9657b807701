"""Parameter bytes of Edge TPU ops whose layout is only known at the shapes compiled models show.

A TRANSPOSE or a PACK mapped to the Edge TPU holds lane selections (blocks of one-hot bytes) and
constants in the parameter streams, in a pattern the compiled models do not pin down for every
shape. Each entry below was located in the parameter streams of dev twins (between the sections
of the layers around the op, `tflfuse.targets.edgetpu.memory`); any other shape is not laid out
(None), and `check` says the memory is undecided. No TensorFlow here.
"""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Op

# TRANSPOSE by (input shape, perm) -> bytes.
# - YOLOv8's detect head: [1, H, W, C] to [1, C, H, W], joined by a RESHAPE into [1, C, H x W]
#   (`_joined`): 12,864 bytes at 20 x 20 for C = 68 and C = 144 alike (3 dev twins), 37,120
#   at C = 70, 18,496 at 10 x 10 x 144.
# - The GEMM random forests' transposes: [2, 2] by (1, 0) and [1, 4, 2] by (2, 1, 0) hold none
#   (4 dev twins of one Edge TPU subgraph, their bytes all the FULLY_CONNECTEDs' and the
#   PACK's); with 300 and 1,000 samples, [2, N] by (1, 0) and [1, 4, N] by (2, 1, 0) hold two
#   64-byte blocks between them, cached (2 dev twins; one block a selection of 4 lanes): counted
#   on the [1, 4, N] one. The forest of 300 samples in three subgraphs transposes [2, 300] and
#   [4, 300] by (1, 0) after its SUM: the same two blocks (one a selection of 4 lanes), its
#   last subgraph's 192 bytes exact with its product's tile (1 dev twin).
# - The GEMM forests of 64 samples in three subgraphs, each [R, 64] transposed by (1, 0) into a
#   product's weights hold lane selections (one-hot blocks, 64-byte aligned) whose count the
#   twins show only at these R; the streams repeat one period per tree, so each is located
#   exactly: [15, 64] 353 blocks (22,592 bytes) and [16, 64] 354 (22,656), read from a CPU op
#   through a RESHAPE (32 each in one dev twin: its two cached subgraphs, 755,712 and 750,656
#   bytes, exact with the products' tiles); [4, 64] after the SUM 273 (17,472: that twin's
#   tail, and a dev forest of one tree whose last subgraph's 17,536 bytes are it and one tile,
#   the first 272 blocks byte for byte the same in both; so its [2, 64] holds none, as
#   [2, 300] and [2, 1000] do). Other R at 64 samples (the holdout's 256 samples too) are not
#   shown: a pattern, not a formula, so not laid out.
TRANSPOSE_SHOWN: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {
    ((1, 20, 20, 68), (0, 3, 1, 2)): 12_864,
    ((1, 20, 20, 144), (0, 3, 1, 2)): 12_864,
    ((1, 20, 20, 70), (0, 3, 1, 2)): 37_120,
    ((1, 10, 10, 144), (0, 3, 1, 2)): 18_496,
    ((2, 2), (1, 0)): 0,
    ((1, 4, 2), (2, 1, 0)): 0,
    ((2, 300), (1, 0)): 0,
    ((1, 4, 300), (2, 1, 0)): 128,
    ((2, 1000), (1, 0)): 0,
    ((1, 4, 1000), (2, 1, 0)): 128,
    ((4, 300), (1, 0)): 128,
    ((2, 64), (1, 0)): 0,
    ((4, 64), (1, 0)): 17_472,
    ((15, 64), (1, 0)): 22_592,
    ((16, 64), (1, 0)): 22_656,
}
# A PACK along axis 0 of a [1, 1] activation and a [1, 1] constant: a 64-byte block holding the
# constant, streamed although the model fits, and a 64-byte lane selection, cached (7 dev twins
# of the GEMM random forests: each streams exactly the constant's block and the first
# FULLY_CONNECTED's constant, `memory.streamed_bytes`, and caches the rest).
PACK_CONSTANT_BYTES = 128
PACK_STREAMED_BYTES = 64


def _perm(op: Op) -> tuple[int, ...] | None:
    perm = op.inputs[1] if len(op.inputs) > 1 else None
    if perm is None or not perm.is_constant:
        return None
    return tuple(int(v) for v in np.asarray(perm.data).reshape(-1))


def _joined(op: Op) -> bool:
    """A 4-D TRANSPOSE [1, H, W, C] -> [1, C, H, W] read by one RESHAPE to [1, C, H x W]."""
    readers = op.outputs[0].consumers
    if len(readers) != 1 or readers[0].type != "RESHAPE":
        return False
    _, h, w, c = (int(d) for d in op.input(0).shape)  # TRANSPOSE(x, perm)
    return tuple(readers[0].outputs[0].shape) == (1, c, h * w)


def transpose_bytes(op: Op) -> int | None:
    """A TRANSPOSE's parameter bytes at a form and shape a dev twin shows (`TRANSPOSE_SHOWN`),
    else None (every other mapped TRANSPOSE of the compiled models holds bytes of a pattern the
    evidence does not pin down)."""
    x = op.inputs[0] if op.inputs else None
    perm = _perm(op)
    if x is None or perm is None or not op.outputs:
        return None
    shape = tuple(int(d) for d in x.shape)
    if len(shape) == 4 and not _joined(op):
        return None
    return TRANSPOSE_SHOWN.get((shape, perm))


def _constant_pack(op: Op) -> bool:
    present = [t for t in op.inputs if t is not None]
    if op.type != "PACK" or len(op.inputs) != 2 or len(present) != 2:
        return False
    if int((op.options or {}).get("axis", 0)) != 0:
        return False
    shapes = [tuple(t.shape) for t in present]
    constants = sorted(t.is_constant for t in present)
    return shapes == [(1, 1), (1, 1)] and constants == [False, True]


def pack_bytes(op: Op) -> int | None:
    """A PACK's parameter bytes: `PACK_CONSTANT_BYTES` for the form the dev twins show, 0 for a
    PACK of activations only (no constant to hold), None otherwise."""
    if _constant_pack(op):
        return PACK_CONSTANT_BYTES
    if all(t is not None and not t.is_constant for t in op.inputs):
        return 0
    return None


def pack_streamed_bytes(op: Op) -> int:
    """The bytes of this op the dev twins stream although they fit: the constant of the PACK
    form `pack_bytes` lays out; 0 for any other op."""
    return PACK_STREAMED_BYTES if _constant_pack(op) else 0
