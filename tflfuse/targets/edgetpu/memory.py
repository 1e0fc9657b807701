"""The parameter bytes `edgetpu_compiler` writes for the ops it maps: the compiler's own layout.

Read from the parameter streams of compiled packages (`tflfuse.targets.edgetpu.package`), by
finding each layer's weights in them (the comment above [meta] in `delegates/edgetpu.toml`):

- CONV_2D, FULLY_CONNECTED, and a DEPTHWISE_CONV_2D that reads one channel (a depth multiplier
  makes it a convolution): output channels in groups of 64; a layer of at most 64 outputs is
  one group padded to a multiple of 16, a larger one is padded to whole groups of 64; a
  CONV_2D of one or of four outputs is padded to 4 (BodyPix's segmentation head of 384 inputs:
  1,600 bytes, not 6,208, in its 4 dev twins; LibrEdgeTPU's 3x3 and 1x1 ones; a YOLOv8 head of
  4 classes: 320 bytes, not 1,088, read in their streams; 2 or 3 outputs are undecided), a
  FULLY_CONNECTED of one to 16 (edgetpu-tcn, dev).
  Per group and per kernel tap, the input channels in chunks of 4 bytes for every (padded) output: a
  1x1 layer of 256 inputs and 64 outputs stores 64 chunks x 64 outputs x 4 = 16,384 bytes; a
  FULLY_CONNECTED reading a map [1, H, W, C] as H x W taps of C channels (`fc_taps`).
  Before each group, a header per padded output channel: its float scale when the weights'
  per-channel scales differ, its int32 bias when the bias is not all zero (compilers before 15:
  whenever there is a bias), and one more word when the weights are quantized per channel (the
  weights' zero point in the stream, which stores int8 weights offset by 128).
- DEPTHWISE_CONV_2D: per channel, 4 bytes per kernel tap and the same header.
- Each layer's section padded to 64 bytes.
- A SOFTMAX, by the compiler's generation (`softmax_bytes`; the package's form names the
  generation of a compiled twin: `package.compiler_generation`).
- Lane selections (a zero block and a 64-byte one-hot block per lane): a RESHAPE flattening a
  one-channel map (`flatten_bytes`), a CONCATENATION of one-channel tensors (`concat_bytes`);
  a TRANSPOSE or a PACK at the forms and shapes dev twins show (`memory_shown`).
- Streamed although the model fits (`streamed_bytes`): a FULLY_CONNECTED of more than 8192
  inputs, the first FULLY_CONNECTED of computed weights (the GEMM forests), a PACK's constant.
- An elementwise SUB, MUL or ADD of a constant at the forms dev twins show (one value per
  position; a word per channel, 4 channels to a block; a constant broadcast over some
  positions widened to the output), streamed; a channel slice starting off a multiple of 4
  said undecided (`memory_elementwise`).
- The GEMM forests' later products of a constant input in 4 x 4 tiles, a one-element SUB's
  cached block, a SUM column's lanes, a CPU op's row read as a column at the lengths dev twins
  show (`memory_forest`), their [R, 64] transposes at the R shown (`memory_shown`); a constant
  repeated across products said undecided.

Applied to the ops each twin maps (`benchmarks/edgetpu_oracle_score.py`), on the 115 pairs at
hand whose package parses (shared, fetch-more, Coral's test data and edgetpu repositories, a
YOLOv5n; a holdout copy of a dev pair counted as dev: 70 dev, 45 holdout): the total exact dev
66/70, holdout 40/45; cached and streamed both exact dev 63/70, holdout 37/45; the streamed
bytes exact dev 64/70, holdout 39/45 (before the forests of 64 and 300 samples were laid out:
63, 40; 60, 37; 64, 39. The previous round, on 316
pairs of local sets no longer at hand: the total exact on 284, dev 135/149, holdout 149/167;
both exact on 264, dev 126, holdout 138); what the layout does not cover is in the comment above
[meta] in `delegates/edgetpu.toml`, and `undecided_line` says it of a model. Issue 27's fourth
round added 23 pairs found in public repositories (local sets, 137 parsed in all; each new set
holdout but the 6 pairs rules were drawn from: a per-channel MUL/ADD, a decode's widened
constants, the split bound): on chip and streamed exact dev 64/76 -> 67/76, holdout 49/61
(unchanged); streamed exact dev 66 -> 70, holdout 53 -> 56 (one YOLOv5n-seg model compiled
twice, held out, and another export of the dev YOLOv5n's graph); on the 115 earlier pairs
nothing else moved. Issue 27's fifth round made every miss flagged
(benchmarks/EDGETPU_MEMORY_MISSES.md, written by the score): compiler 15's split is undecided
above `SPLIT_SURE_BYTES_15` (the held-out classifier that streamed below the bound, now dev for
memory: dev 67/77, holdout 49/60 both exact; not flagged: holdout 1 -> 0), and a compiler before
15 lays out only the op types its twins show (`OLD_LAYOUT_SHOWN`). Co-compiled twins
(`package.cocompiled`) are scored apart: their split depends on the models compiled with them.
No TensorFlow here.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from tflfuse.ir import Op
from tflfuse.targets.capabilities import CapabilityTable
from tflfuse.targets.edgetpu.memory_elementwise import (
    elementwise_bytes,
    holds_constant,
    undecided_channel_slice,
)
from tflfuse.targets.edgetpu.memory_forest import (
    SELECTION,
    SUM_COLUMNS_SHOWN,
    one_element_sub,
    repeated_constant,
    row_to_column_bytes,
    selection_bytes,
    sum_column_lanes,
    tiled_constant_bytes,
    undecided_row_to_column,
    undecided_tiles,
    weights_column,
)
from tflfuse.targets.edgetpu.memory_shown import pack_bytes, pack_streamed_bytes, transpose_bytes

GROUP = 64  # output channels per group
SMALL_PAD = 16  # a layer of at most GROUP outputs is padded to a multiple of this
SINGLE_CONV_PAD = 4  # ... except a CONV_2D of one or of this many outputs, padded to this
CHUNK = 4  # input channels per 4-byte chunk
ALIGN = 64  # every layer's section starts on this boundary
# A FULLY_CONNECTED of more inputs than this streams (`streamed_layer`); the dev twins cache one
# of WIDE_FC_CACHED and stream one of WIDE_FC_STREAMED: between the two the width is undecided.
WIDE_FC_INPUTS = 8192
WIDE_FC_CACHED = 6272
WIDE_FC_STREAMED = 16384
# Up to this many parameter bytes every fully laid-out dev twin compiled by 15 or 16 caches all
# it does not stream by `streamed_layer`: the largest such dev twin is Coral's iNat-birds
# MobileNetV2 compiled by 16 in HanChangHun/Segments-Runner (3,947,328 bytes, all cached; found
# by issue 27's fourth round, dev: its caching token is shared by no other twin at hand), then
# Coral's MobileNetV2s compiled by 15 (3,900,864 bytes, all cached, 3 dev twins); above it no
# dev twin is at hand, so the split is said undecided there. (The third round's local sets, no
# longer here, held the same iNat twin streaming 1,623,872 bytes in a co-compile with a
# 16,320-byte dummy and caching all in two other commits.) Derived from dev pairs only. The
# holdout half disagrees below it: Coral's demo-manufacturing classifier (compiler 15,
# 3,094,912 bytes) streams 598,080, a miss `check` does not flag. The previous
# bound, 3,000,000, was read off that holdout pair; it is not used, so the holdout stays a test.
# Activations do not explain it (benchmarks/EDGETPU_SPLIT.md): a dev twin of the same graph by
# compiler 15 (5 classes, 3,095,040 bytes, a slightly larger input activation) caches all, and
# the demo streams its early 1x1 convolutions, not its last layers: a budget the model does not
# set (a co-compile with the demo's detector would, but its twin is not at hand).
SPLIT_SURE_BYTES = 3_947_328
# Compiler 15 is not held to that bound (issue 27's fifth round): Coral's demo-manufacturing
# classifier (15.0.340273435 by its log, 3,094,912 bytes) streams 598,080 where a dev twin of
# the same MobileNetV2 graph by 15 (108d9849 in the score, 5 classes, 3,095,040 bytes) caches
# all, so one graph compiled by 15 splits two ways: its split is not a function of the model
# from there on. Up to this many bytes every twin of compiler 15 at hand caches all it does not
# stream by `streamed_layer` (the largest dev one below the demo: 2,729,344 bytes); above it the
# split is said undecided. The demo pair, held out until then, is scored as dev for memory
# (`benchmarks/edgetpu_oracle_score.py`: MEMORY_DEV).
SPLIT_SURE_BYTES_15 = 2_729_344
# Compilers older than this generation store a bias word even for an all-zero bias.
BIAS_ALWAYS_BEFORE = 15
# Compilers before 15 cache less: their dev twins cache all of MobileNetV2 (3,900,864 bytes) but
# stream a stack of 101 dense layers from its 80th layer on (1,040,896 cached of 1,322,112); at
# most the bytes that stack cached, every dev twin of theirs caches all it holds.
OLD_SPLIT_SURE_BYTES = 1_040_896
# The op types a compiler before 15 is shown laying out (their twins' bytes exact): at hand, two
# dev twins of 1.0 (FULLY_CONNECTED, MUL, ADD, SOFTMAX); in the third round's 1.0 twins (see the
# docstring: MobileNetV2s, dense stacks), CONV_2D, DEPTHWISE_CONV_2D, AVERAGE_POOL_2D, RESHAPE,
# QUANTIZE. The one twin of theirs at hand mapping a CONCATENATION and a LOGISTIC (an SSD
# detector by 2.1.302470888, dev) holds 31,040 bytes more than the layout: what such an op
# holds for them is said undecided (`_undecided_old_layout`).
OLD_LAYOUT_SHOWN = frozenset(
    {
        "ADD",
        "AVERAGE_POOL_2D",
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "FULLY_CONNECTED",
        "MUL",
        "QUANTIZE",
        "RESHAPE",
        "SOFTMAX",
    }
)
_LAID_OUT = ("CONV_2D", "FULLY_CONNECTED", "DEPTHWISE_CONV_2D")


def _pad(n: int, m: int) -> int:
    return -(-n // m) * m


def header_words(op: Op, compiler_major: int = 16) -> int:
    """32-bit words the compiler stores per (padded) output channel before a group's weights.
    Compilers before 15 store the bias word whether or not the bias is all zero (dev: stacks of
    100 dense layers of zero bias hold 4 bytes more per padded output, 51,776 in all, and
    MobileNetV2s of zero bias 69,568, in their 1.0 twins; `BIAS_ALWAYS_BEFORE`)."""
    w = op.input(1)  # a laid-out op's weights
    q = w.quantization
    scales = np.asarray(q.scale).reshape(-1) if q is not None and q.scale is not None else None
    per_channel = scales is not None and scales.size > 1
    distinct = scales is not None and per_channel and np.unique(scales).size > 1
    bias = op.inputs[2] if len(op.inputs) > 2 else None
    nonzero_bias = bias is not None and (bias.is_raw or bool(np.any(np.asarray(bias.data))))
    bias_word = nonzero_bias or (bias is not None and compiler_major < BIAS_ALWAYS_BEFORE)
    return int(distinct) + int(bias_word) + int(per_channel)


def _convolution(outputs: int, taps: int, inputs: int, words: int, small: int = SMALL_PAD) -> int:
    total = 0
    for start in range(0, outputs, GROUP):
        real = min(GROUP, outputs - start)
        padded = _pad(real, small) if outputs <= GROUP else GROUP
        total += 4 * words * padded + taps * _pad(inputs, CHUNK) * padded
    return _pad(total, ALIGN)


def _softmax_form(op: Op) -> tuple[str, int] | None:
    """What a SOFTMAX normalises, as (form, channels): "fc" over the outputs of a
    FULLY_CONNECTED it reads; "conv" over a CONV_2D's channels read through a RESHAPE that only
    drops unit dims (MobileNet v1's [1, 1, 1, 1001] logits); "map" over a map of one channel
    flattened by a RESHAPE (LibrEdgeTPU's trackers: [1, H, W, 1] to [1, H x W]), laid out as
    that one channel. None for any other softmax (not laid out)."""
    x = op.inputs[0] if op.inputs else None
    producer = x.producer if x is not None else None
    if x is None or producer is None or not x.shape:
        return None
    if producer.type == "FULLY_CONNECTED":
        return "fc", int(x.shape[-1])
    if producer.type != "RESHAPE" or not producer.inputs:
        return None
    source = producer.input(0)  # RESHAPE(x, shape)
    kept = [d for d in source.shape if d != 1]
    if kept == [d for d in x.shape if d != 1]:
        conv = source.producer is not None and source.producer.type == "CONV_2D"
        return ("conv", int(x.shape[-1])) if conv else None
    if len(source.shape) == 4 and source.shape[-1] == 1 and len(kept) == 2:
        return "map", 1
    return None


def softmax_bytes(op: Op, compiler_major: int = 16) -> int:
    """A SOFTMAX (`_softmax_form`), by the compiler that lays it out: sections of 16 bytes per
    channel (the channels padded to 4), each section padded to 64 bytes.

    - 16: three sections, for INT8 and UINT8 (dev: 2 classes 192 bytes in 5 files, 5 classes 384
      in 2, 10 classes 576 in 3; UINT8 965 classes 46,464 in Coral's iNat birds compiled by 16),
      and one 64-byte block more over a CONV_2D's logits (MobileNet v1 of 1001 classes: 48,256
      bytes in the 5 dev twins whose package form is 16's, 0 in the 15.0 ones); over a flattened
      one-channel map, none (LibrEdgeTPU's trackers: their 192 bytes are the lanes of the
      CONCATENATION after it, `concat_bytes`, as in split_concat, which has no softmax).
    - 15: two sections, over a FULLY_CONNECTED's INT8 outputs only (dev: 2 classes 128, 5
      classes 256; UINT8 ones lay out none).
    - older (1.x, 2.x): none.
    Other softmaxes are not laid out (0; see the comment above the table's [meta])."""
    form = _softmax_form(op)
    x = op.inputs[0] if op.inputs else None
    if form is None or x is None or x.dtype not in ("INT8", "UINT8") or compiler_major < 15:
        return 0
    kind, channels = form
    section = _pad(16 * _pad(channels, 4), ALIGN)
    if compiler_major == 15:
        return 2 * section if x.dtype == "INT8" and kind == "fc" else 0
    if kind == "map":
        return 0
    return 3 * section + (ALIGN if kind == "conv" else 0)


def _lanes(n: int) -> int:
    """A zero block and one 64-byte one-hot lane selection per lane (at most 16 lanes)."""
    return ALIGN * (1 + min(n, 16))


def flatten_bytes(op: Op) -> int:
    """A RESHAPE that flattens a one-channel map ([1, H, W, 1] to [1, H x W]) an Edge TPU op
    computed: `_lanes(H x W)`, read in the parameter streams of LibrEdgeTPU's colour trackers
    (after a CONV_2D, 64x64 and 128x128: 1,088 bytes, 9 dev twins) and looming templates (after
    an AVERAGE_POOL_2D, 3x3: 640 bytes, 2 dev twins). The same flatten of a QUANTIZE of the input
    (its bright trackers) holds none."""
    x = op.inputs[0] if op.type == "RESHAPE" and op.inputs else None
    if x is None or x.producer is None or x.producer.type == "QUANTIZE" or len(x.shape) != 4:
        return 0
    kept = [d for d in x.shape if d != 1]
    if x.shape[-1] != 1 or len(kept) != 2 or len(op.outputs[0].shape) != 2:
        return 0
    return _lanes(kept[0] * kept[1])


def concat_bytes(op: Op) -> int:
    """A CONCATENATION of one-channel tensors along their last axis: `_lanes(inputs)` (the
    trackers' [1, 1] scores joined: 192 bytes; split_concat's two [1, 8, 8, 1]: 192; dev)."""
    if op.type != "CONCATENATION" or not op.inputs or not op.outputs[0].shape:
        return 0
    rank = len(op.outputs[0].shape)
    axis = int((op.options or {}).get("axis", -1))
    if axis % rank != rank - 1 or any(t is None or t.shape[-1:] != (1,) for t in op.inputs):
        return 0
    return _lanes(len(op.inputs))


def computed_weights(op: Op) -> bool:
    """A FULLY_CONNECTED whose weights an op computes and whose input is the constant."""
    x = op.inputs[0] if op.inputs else None
    w = op.inputs[1] if len(op.inputs) > 1 else None
    return x is not None and x.is_constant and w is not None and not w.is_constant


def constant_input_bytes(op: Op) -> int:
    """A FULLY_CONNECTED of a constant [M, K] input and computed weights stores the constant as
    it is, M x K bytes, the whole padded to 64 (read in the streams of the GEMM random-forest
    twins, dev: [480, 8] 3,840 bytes, [800, 2] and [8, 2] found whole; [1, 8], [2, 1], [4, 2]
    64 bytes each, where a block of at most 4 rows is stored with each row padded to 16, the
    same 64 bytes). The first such layer streams, later ones are cached (`streamed_bytes`)."""
    shape = tuple(op.input(0).shape)  # FULLY_CONNECTED(x, w, b)
    rows, depth = shape[-2:] if len(shape) >= 2 else (1, shape[0] if shape else 1)
    return _pad(int(rows) * int(depth), ALIGN)


def fc_taps(op: Op, inputs: int) -> tuple[int, int]:
    """(taps, channels) a FULLY_CONNECTED is laid out as: one tap of all its inputs, but when it
    reads a map [1, H, W, C] without a RESHAPE, H x W taps of C channels, each tap's channels
    padded to 4 bytes (dev: a dense layer reading [1, 2, 2, 3] holds 16 bytes per output, not
    12, in its 1.0 twin)."""
    shape = tuple(op.inputs[0].shape) if op.inputs and op.inputs[0] is not None else ()
    if len(shape) == 4 and shape[0] == 1 and shape[1] * shape[2] * shape[3] == inputs:
        return int(shape[1] * shape[2]), int(shape[3])
    return 1, inputs


def layer_bytes(op: Op, compiler_major: int = 16) -> int | None:
    """Parameter bytes of one mapped op in the compiler's layout; 0 for ops without weights the
    layout is known for, None for an op with constant operands the layout does not cover.
    `compiler_major`: the edgetpu_compiler generation (`header_words`)."""
    if op.type in ("RESHAPE", "CONCATENATION"):
        lanes = sum_column_lanes(op)
        return flatten_bytes(op) + concat_bytes(op) + (_lanes(lanes) if lanes else 0)
    if op.type == "TRANSPOSE":
        return transpose_bytes(op)
    if op.type == "PACK":
        return pack_bytes(op)
    if op.type == "FULLY_CONNECTED" and computed_weights(op):
        return constant_input_bytes(op)
    if one_element_sub(op):
        return SELECTION  # `memory_forest`: one block, cached
    if holds_constant(op):
        return elementwise_bytes(op)
    if op.type not in _LAID_OUT:
        weights = [t for t in op.inputs if t is not None and t.is_constant and t.dtype != "INT32"]
        return None if weights else 0  # e.g. an LSTM's gates, an ADD of a constant
    w = op.inputs[1] if len(op.inputs) > 1 else None
    if w is None or not w.is_constant or len(w.shape) not in (2, 4):
        return None
    words = header_words(op, compiler_major)
    if op.type == "CONV_2D":
        outputs, kh, kw, inputs = w.shape
        small = SINGLE_CONV_PAD if outputs in (1, SINGLE_CONV_PAD) else SMALL_PAD
        return _convolution(outputs, kh * kw, inputs, words, small)
    if op.type == "FULLY_CONNECTED":
        outputs, inputs = w.shape
        taps, depth = fc_taps(op, inputs)
        return _convolution(outputs, taps, depth, words)
    _, kh, kw, channels = w.shape
    x = op.input(0)
    if x.shape[-1] == 1 and channels > 1:  # a depth multiplier: a convolution
        return _convolution(channels, kh * kw, 1, words)
    return _pad(channels * (4 * kh * kw + 4 * words), ALIGN)


def streamed_layer(op: Op) -> bool:
    """Whether the compiler streams this layer's parameters even when the model fits the cache:
    a FULLY_CONNECTED of more than WIDE_FC_INPUTS inputs (dev: LibrEdgeTPU's trackers stream
    their [1, 16384] ones and cache the [1, 4096] ones, edgetpu-tcn streams its [1, 94400] one,
    RPS caches its [512, 6272] one; holdout: [10, 9504] and [10, 13104] streamed)."""
    w = op.inputs[1] if op.type == "FULLY_CONNECTED" and len(op.inputs) > 1 else None
    return w is not None and w.is_constant and len(w.shape) == 2 and w.shape[1] > WIDE_FC_INPUTS


def streamed_bytes(op: Op, size: int, first_computed: bool) -> int:
    """The bytes of one mapped op (of `size` laid out) streamed although the model fits: a
    `streamed_layer` whole; the first FULLY_CONNECTED of computed weights in execution order
    (`first_computed`) its constant (dev: the GEMM random forests of one subgraph stream exactly
    it, a one-hot row selecting a feature, and cache the later ones' rows; in every twin it is
    also the one whose weights are the model's input); a PACK of a constant its constant's block
    (`memory_shown.pack_streamed_bytes`); an elementwise op's constant whole
    (`memory_elementwise`: a dev forest streams its SUB's beside its FULLY_CONNECTED's constant;
    the holdout MoveNet Lightning streams exactly its MUL's and SUB's)."""
    if streamed_layer(op) or (holds_constant(op) and not one_element_sub(op)):
        return size
    if first_computed and op.type == "FULLY_CONNECTED" and computed_weights(op):
        return size
    return min(size, pack_streamed_bytes(op))


def _undecided_width(op: Op) -> bool:
    w = op.inputs[1] if op.type == "FULLY_CONNECTED" and len(op.inputs) > 1 else None
    if w is None or not w.is_constant or len(w.shape) != 2:
        return False
    return WIDE_FC_CACHED < w.shape[1] < WIDE_FC_STREAMED


# The class counts whose softmax compiler 15 is shown laying out (dev: 2 classes 128 bytes, 5
# classes 256); a 3-class one holds 128 bytes fewer than two sections (RPS, dev).
SOFTMAX_15_SHOWN = (2, 5)


def _undecided_softmax(op: Op, compiler_major: int) -> bool:
    """A SOFTMAX of a form no compiled model lays out (16), or of a class count compiler 15 is
    not shown laying out."""
    form = _softmax_form(op)
    if compiler_major >= 16:
        return form is None
    return compiler_major == 15 and form is not None and form[1] not in SOFTMAX_15_SHOWN


def _undecided_old_layout(op: Op, compiler_major: int) -> bool:
    """An op of a type no twin of a compiler before 15 shows laid out (`OLD_LAYOUT_SHOWN`),
    mapped by such a compiler."""
    return compiler_major < BIAS_ALWAYS_BEFORE and op.type not in OLD_LAYOUT_SHOWN


def _split_sure_bytes(compiler_major: int) -> int:
    """Up to how many parameter bytes the compiler is shown caching all it does not stream by
    `streamed_layer` (`SPLIT_SURE_BYTES`, `SPLIT_SURE_BYTES_15`, `OLD_SPLIT_SURE_BYTES`)."""
    if compiler_major >= 16:
        return SPLIT_SURE_BYTES
    return SPLIT_SURE_BYTES_15 if compiler_major == 15 else OLD_SPLIT_SURE_BYTES


def _undecided_small_conv(op: Op) -> bool:
    """A CONV_2D of 2 or 3 outputs: the dev twins pad one output and four outputs to 4, and no
    dev twin shows 2 or 3 (laid out padded to 16, and said undecided)."""
    w = op.inputs[1] if op.type == "CONV_2D" and len(op.inputs) > 1 else None
    return w is not None and len(w.shape) == 4 and w.shape[0] in (2, 3)


def _undecided_flatten(op: Op) -> bool:
    """A RESHAPE flattening a map [1, H, W, C] of several positions and channels whose C is not
    a multiple of 4: the dev twins flatten C = 8, 64 and 164 (and one channel, `flatten_bytes`)
    with no parameter bytes, and show no other C."""
    x = op.inputs[0] if op.type == "RESHAPE" and op.inputs else None
    if x is None or len(x.shape) != 4 or not op.outputs or len(op.outputs[0].shape) != 2:
        return False
    _, h, w, c = (int(d) for d in x.shape)
    return h * w > 1 and c > 1 and c % CHUNK != 0


def _undecided_reshape(op: Op) -> bool:
    """A RESHAPE turning an innermost axis of 1 into one of several elements (a column into a
    row: the GEMM forests' [4, 1] to [1, 4] after a SUM, [2, 1, 1] to [1, 1, 2] after a PACK)
    of a tensor an Edge TPU op computed: their twins hold bytes no rule accounts for. The
    flatten of a one-channel map (`flatten_bytes`) and a RESHAPE of a QUANTIZE's output (none)
    are shown."""
    x = op.inputs[0] if op.type == "RESHAPE" and op.inputs else None
    if x is None or not x.shape or not op.outputs or not op.outputs[0].shape:
        return False
    y = op.outputs[0]
    if x.shape[-1] != 1 or y.shape[-1] <= 1 or x.producer is None:
        return False
    if sum_column_lanes(op) in SUM_COLUMNS_SHOWN:
        return False  # `memory_forest`: a lane selection
    one_channel_map = len(x.shape) == 4 and len(y.shape) == 2
    return not one_channel_map and x.producer.type != "QUANTIZE"


def predicted_memory(
    mapped_ops: list[Op], table: CapabilityTable, compiler_major: int = 16
) -> dict[str, int]:
    """Parameter bytes of the mapped ops in the compiler's layout, and how they split between the
    on-chip cache and streaming: `streamed_layer`s stream, the rest is cached up to the cache's
    size (from the table) and streams beyond it. What the evidence leaves undecided is counted
    in `undecided_*` keys (`undecided_line` says it in words).
    `compiler_major`: the edgetpu_compiler predicted (a SOFTMAX is laid out by generation)."""
    total = streamed = raw = 0
    keys: tuple[str, ...] = ("layers_not_laid_out", "undecided_softmax", "undecided_fc_width")
    keys += ("undecided_small_conv", "undecided_flatten", "undecided_reshape")
    keys += ("undecided_channel_slice", "undecided_tiles", "undecided_row_to_column")
    keys += ("undecided_repeated", "undecided_old_layout")
    counts = dict.fromkeys(keys, 0)
    seen: set[int] = set()
    constants: set[bytes] = set()  # later products' constants, to find repeated ones
    first_computed = True
    mapped = {id(op) for op in mapped_ops}
    for op in mapped_ops:
        size = layer_bytes(op, compiler_major)
        if not first_computed and op.type == "FULLY_CONNECTED" and computed_weights(op):
            size = tiled_constant_bytes(op) + selection_bytes(op, mapped)  # `memory_forest`
            counts["undecided_tiles"] += undecided_tiles(op)
            counts["undecided_repeated"] += repeated_constant(op, constants)
        if size is not None:
            size += row_to_column_bytes(op, mapped)  # `memory_forest`: lanes, at N shown
        if op.type == "SOFTMAX":
            size = softmax_bytes(op, compiler_major)
            counts["undecided_softmax"] += _undecided_softmax(op, compiler_major)
        if size is None:
            counts["layers_not_laid_out"] += 1
            size = 0
        total += size
        streamed += streamed_bytes(op, size, first_computed)
        first_computed = first_computed and not (
            op.type == "FULLY_CONNECTED" and computed_weights(op)
        )
        counts["undecided_fc_width"] += _undecided_width(op)
        counts["undecided_small_conv"] += _undecided_small_conv(op)
        counts["undecided_flatten"] += _undecided_flatten(op)
        counts["undecided_reshape"] += _undecided_reshape(op) and not weights_column(op, mapped)
        counts["undecided_channel_slice"] += undecided_channel_slice(op)
        counts["undecided_row_to_column"] += undecided_row_to_column(op, mapped)
        counts["undecided_old_layout"] += _undecided_old_layout(op, compiler_major)
        for t in op.inputs:
            if t is not None and t.is_constant and id(t) not in seen:
                seen.add(id(t))
                raw += int(cast(np.ndarray, t.data).nbytes) if not t.is_raw else 0
    cache = int(table["meta"]["parameter_cache_bytes"])
    on_chip = min(total - streamed, cache)
    memory = {
        "parameter_bytes": total,
        "tensor_bytes": raw,
        "cache_bytes": cache,
        "on_chip_bytes": on_chip,
        "off_chip_bytes": total - on_chip,
    }
    if total > _split_sure_bytes(compiler_major):
        counts["undecided_split"] = 1
    memory.update({key: int(n) for key, n in counts.items() if n})
    return memory


# what each of `predicted_memory`'s undecided counts leaves open, in the order the line says it
_UNDECIDED_REASONS = {
    "undecided_softmax": "a softmax of a form or class count no compiled model lays out",
    "undecided_fc_width": (
        f"whether a FULLY_CONNECTED of {WIDE_FC_CACHED:,} to {WIDE_FC_STREAMED:,} inputs is"
        " cached or streamed"
    ),
    "undecided_small_conv": "how a CONV_2D of 2 or 3 outputs is padded (to 4 or to 16)",
    "undecided_reshape": "what a RESHAPE turning a column into a row holds",
    "undecided_flatten": "what flattening a map whose channels are not a multiple of 4 holds",
    "undecided_tiles": "how a later product of a constant of more than 4 rows tiles it",
    "undecided_row_to_column": "what a RESHAPE of a row read from a CPU op into a column holds",
    "undecided_channel_slice": "what a slice of channels starting off a multiple of 4 holds",
    "undecided_repeated": (
        "whether a constant repeated in several matrix products is stored once or each time"
        " (compiled models show both)"
    ),
    "undecided_old_layout": (
        "what a compiler before 15 stores for an op of a type no twin of theirs shows laid out"
        f" (shown: {', '.join(sorted(OLD_LAYOUT_SHOWN))})"
    ),
}


def undecided_counts(memory: dict[str, int]) -> dict[str, int]:
    """The counts of `predicted_memory` that say what the evidence leaves undecided (its
    `layers_not_laid_out` and `undecided_*` keys), the rest left out: what a caller carries
    beside the bytes, and hands back to `undecided_line`."""
    return {
        key: int(n)
        for key, n in memory.items()
        if n and (key == "layers_not_laid_out" or key.startswith("undecided_"))
    }


def undecided_line(memory: dict[str, int]) -> str | None:
    """One line naming what the evidence cannot decide of `predicted_memory`'s numbers, or None
    when every layer is laid out by a rule the compiled models show."""
    reasons = []
    if memory.get("layers_not_laid_out"):
        n = memory["layers_not_laid_out"]
        reasons.append(
            f"{n} layer{'s' * (n > 1)} whose parameters the layout does not cover (counted as 0)"
        )
    reasons += [why for key, why in _UNDECIDED_REASONS.items() if memory.get(key)]
    if memory.get("undecided_split"):
        reasons.append(
            f"which layers a model of more than {SPLIT_SURE_BYTES:,} parameter bytes"
            f" ({SPLIT_SURE_BYTES_15:,} for compiler 15, {OLD_SPLIT_SURE_BYTES:,} before it)"
            " streams although it fits the cache (the compiler's budget is not a function of"
            " the model's parameters and activations: 1.09 to 8.0 MiB in public console"
            " outputs, and one MobileNetV2 graph compiled by 15 is cached whole in one twin and"
            " streams 598,080 bytes in another: benchmarks/EDGETPU_SPLIT.md)"
        )
    return "memory: exact layout undecided: " + "; ".join(reasons) if reasons else None
