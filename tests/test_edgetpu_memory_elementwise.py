"""The Edge TPU parameter bytes of elementwise ops of a constant, and undecided channel slices
(`tflfuse.targets.edgetpu.memory_elementwise`), on small inline graphs of the forms compiled
twins show, and on the shared oracle pairs (skipped without ../shared)."""

from __future__ import annotations

import numpy as np
from conftest import ORACLE, needs_oracle
from test_edgetpu_package import yolov8n_twin

from tflfuse.ir import Graph, Op, Quantization, flatbuffer
from tflfuse.targets import capability
from tflfuse.targets.edgetpu.memory import SPLIT_SURE_BYTES, predicted_memory, undecided_line
from tflfuse.targets.edgetpu.memory_elementwise import elementwise_bytes, undecided_channel_slice
from tflfuse.targets.edgetpu.truth import truth_of, twin_compiler_major

MORE = ORACLE.parent / "edgetpu-more"
Q = Quantization(scale=np.array([0.01], np.float32), zero_point=np.array([-128], np.int64))


def _elementwise(kind: str, x_shape: tuple[int, ...], c_shape: tuple[int, ...]) -> Op:
    """`kind`(x, c) of an int8 activation and an int8 constant, the output broadcast."""
    g = Graph("main")
    x = g.add_tensor("x", x_shape, "INT8", quantization=Q)
    values = np.arange(int(np.prod(c_shape)), dtype=np.int64) % 120 + 3
    c = g.add_constant("c", values.astype(np.int8).reshape(c_shape), quantization=Q)
    out = tuple(int(d) for d in np.broadcast_shapes(x_shape, c_shape))
    y = g.add_tensor("y", out, "INT8", quantization=Q)
    return g.add_op(kind, [x, c], [y])


def test_a_forests_threshold_sub_and_scaling_mul_stream_the_constant_as_it_is() -> None:
    """A GEMM random forest's first segment (dev) streams 4,352 bytes: its FULLY_CONNECTED's
    constant [480, 8] (3,840) and its threshold SUB(c [480, 1], x [480, 64]) stored as it is
    (480 bytes, 512 with the padding, not the 30,720 of the output); its MUL by one value holds
    none."""
    g = Graph("main")
    rows = g.add_constant("rows", np.zeros((480, 8), np.int8), quantization=Q)
    w = g.add_tensor("w", (64, 8), "INT8", quantization=Q)
    z = g.add_tensor("z", (480, 64), "INT8", quantization=Q)
    fc = g.add_op("FULLY_CONNECTED", [rows, w, None], [z])
    c = g.add_constant("c", np.zeros((480, 1), np.int8), quantization=Q)
    d = g.add_tensor("d", (480, 64), "INT8", quantization=Q)
    sub = g.add_op("SUB", [c, z], [d])
    e = g.add_tensor("e", (480, 64), "INT8", quantization=Q)
    mul = g.add_op("MUL", [d, g.add_constant("s", np.array(127, np.int8), quantization=Q)], [e])
    assert [elementwise_bytes(op) for op in (sub, mul)] == [512, 0]
    memory = predicted_memory([fc, sub, mul], capability("edgetpu"))
    assert (memory["on_chip_bytes"], memory["off_chip_bytes"]) == (0, 4352)
    assert undecided_line(memory) is None


def test_forms_no_dev_twin_shows_are_said_undecided() -> None:
    """MoveNet Lightning's (a holdout twin: checked, not derived from) MUL of a [48, 48, 1]
    constant and SUB of a [1, 1, 1, 3] mean; an ADD of a constant or of one
    value; a MUL or an ADD of a per-channel constant of more than 128 channels: no dev twin
    shows them, so they are not laid out and
    `check` says so."""
    unshown = [
        _elementwise("MUL", (1, 48, 48, 1), (48, 48, 1)),
        _elementwise("SUB", (1, 192, 192, 3), (1, 1, 1, 3)),
        _elementwise("ADD", (1, 8, 8, 16), (1, 8, 8, 16)),
        _elementwise("ADD", (1, 8, 8, 16), ()),
        _elementwise("MUL", (1, 8, 8, 256), (1, 1, 1, 256)),
        _elementwise("ADD", (1, 8, 256), (256,)),
    ]
    for op in unshown:
        assert elementwise_bytes(op) is None
        line = undecided_line(predicted_memory([op], capability("edgetpu")))
        assert line is not None and "does not cover" in line


def test_a_per_channel_mul_and_add_hold_a_word_per_channel_streamed() -> None:
    """IanisRusitoru/CoralModel's twin (issue 27's fourth round, dev, compiler 16) scales its
    input by MUL(x [1, 256, 256, 3], c [3]) and ADD(x, c [3]): 3 float words in one 64-byte
    block and 3 int32 words in the next, 128 bytes streamed. Octogonapus/edgetpu-test's
    (dev, compiler 1.0) MUL(x [1, 128], c [128]) and ADD(x, c [128]) stream 4,096 bytes: 4
    words to a block, 32 blocks each. Both shapes of the constant, [C] and [1, 1, 1, C], are
    per channel; one value per position is not."""
    ops = [
        _elementwise("MUL", (1, 256, 256, 3), (3,)),
        _elementwise("ADD", (1, 256, 256, 3), (3,)),
        _elementwise("MUL", (1, 128), (128,)),
        _elementwise("ADD", (1, 128), (128,)),
        _elementwise("MUL", (1, 8, 8, 16), (1, 1, 1, 16)),
        _elementwise("ADD", (1, 8, 8, 5), (5,)),
    ]
    assert [elementwise_bytes(op) for op in ops] == [64, 64, 2048, 2048, 256, 128]
    memory = predicted_memory(ops[:4], capability("edgetpu"))
    assert (memory["on_chip_bytes"], memory["off_chip_bytes"]) == (0, 128 + 4096)
    assert undecided_line(memory) is None
    assert elementwise_bytes(_elementwise("MUL", (1, 4, 4, 1), (1, 4, 4, 1))) is None


def test_a_constant_broadcast_over_some_positions_is_widened_to_the_output() -> None:
    """YOLOv5n's decode (Sandhya1708/modelnew, dev): MUL(x [1, N, 3, 2], anchors [1, 1, 3, 2])
    and ADD(x, grid [1, N, 1, 2]), N = 400 and 1,600, stream N x 6 bytes each, padded to 64:
    24,064 in all, its whole EXECUTION_ONLY stream. A per-channel [1, 2] of one value in both
    channels is not in it: undecided. A constant varying along every axis, or broadcast along
    every position axis (per channel), is another form."""
    ops = [
        _elementwise(kind, (1, n, 3, 2), shape)
        for n in (400, 1600)
        for kind, shape in (("MUL", (1, 1, 3, 2)), ("ADD", (1, n, 1, 2)))
    ]
    assert [elementwise_bytes(op) for op in ops] == [2432, 2432, 9600, 9600]
    memory = predicted_memory(ops, capability("edgetpu"))
    assert (memory["on_chip_bytes"], memory["off_chip_bytes"]) == (0, 24_064)
    g = Graph("main")
    x = g.add_tensor("x", (1, 400, 3, 2), "INT8", quantization=Q)
    ones = g.add_constant("c", np.full((1, 2), 127, np.int8), quantization=Q)
    y = g.add_tensor("y", (1, 400, 3, 2), "INT8", quantization=Q)
    assert elementwise_bytes(g.add_op("MUL", [x, ones], [y])) is None
    assert elementwise_bytes(_elementwise("ADD", (1, 8, 8, 4), (1, 8, 8, 4))) is None
    assert elementwise_bytes(_elementwise("SUB", (1, 400, 3, 2), (1, 1, 3, 2))) is None


def test_a_sub_of_one_value_from_several_elements_holds_none() -> None:
    """Two dev forests of 64 and 300 samples stream exactly their first product's constant
    beside SUB(c [1, 1], x [1, N]): that SUB holds none (MoveNet Lightning's, a holdout twin,
    SUB of one value from [1, 192, 192, 3] holds none too); an ADD of one value stays
    undecided."""
    for shape in ((1, 64), (1, 300), (1, 192, 192, 3)):
        assert elementwise_bytes(_elementwise("SUB", shape, (1, 1)[: min(2, len(shape))])) == 0
    assert elementwise_bytes(_elementwise("SUB", (1, 192, 192, 3), ())) == 0
    assert elementwise_bytes(_elementwise("ADD", (1, 64), (1, 1))) is None


def _strided_slice(channels: int, begin: int, size: int, begin_mask: int = 0) -> Op:
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, channels), "INT8", quantization=Q)
    b = g.add_constant("b", np.array([0, 0, 0, begin], np.int32))
    e = g.add_constant("e", np.array([1, 8, 8, begin + size], np.int32))
    s = g.add_constant("s", np.ones(4, np.int32))
    y = g.add_tensor("y", (1, 8, 8, size), "INT8", quantization=Q)
    return g.add_op("STRIDED_SLICE", [x, b, e, s], [y], {"begin_mask": begin_mask})


def _split(channels: int, widths: list[int]) -> Op:
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, channels), "INT8", quantization=Q)
    outs = [
        g.add_tensor(f"y{k}", (1, 8, 8, w), "INT8", quantization=Q) for k, w in enumerate(widths)
    ]
    if len(set(widths)) == 1:
        return g.add_op("SPLIT", [g.add_constant("axis", np.array(3, np.int32)), x], outs)
    sizes = g.add_constant("sizes", np.array(widths, np.int32))
    return g.add_op("SPLIT_V", [x, sizes, g.add_constant("axis", np.array(3, np.int32))], outs)


def test_a_channel_slice_off_a_multiple_of_4_is_undecided() -> None:
    """split_concat's SPLIT into one channel each is shown (dev), and slices at multiples of 4
    stay as the layout counts them (none); a slice starting at channel 6 or a SPLIT_V of 3 + 5
    is said undecided."""
    assert not undecided_channel_slice(_strided_slice(32, 16, 16))
    assert not undecided_channel_slice(_strided_slice(32, 6, 8, begin_mask=8))  # starts at 0
    assert undecided_channel_slice(_strided_slice(32, 6, 8))
    assert not undecided_channel_slice(_split(6, [1] * 6))
    assert not undecided_channel_slice(_split(64, [32, 32]))
    assert undecided_channel_slice(_split(8, [3, 5]))
    assert undecided_channel_slice(_split(12, [3, 3, 3, 3]))
    line = undecided_line(predicted_memory([_strided_slice(32, 6, 8)], capability("edgetpu")))
    assert line is not None and "slice of channels" in line


def test_the_split_bound_comes_from_dev_twins() -> None:
    """Up to the largest dev twin (Coral's iNat birds by compiler 16, 3,947,328 bytes, all
    cached, a local pair of issue 27's fourth round; before it Coral's MobileNetV2s by compiler
    15, 3,900,864 bytes, one of them in the shared set) the split is decided; above it `check`
    says it is not. Compiler 15 has its own bound (`test_compiler_15_splits_one_graph_two_ways`)."""
    assert SPLIT_SURE_BYTES == 3_947_328
    g = Graph("main")
    x = g.add_tensor("x", (1, 1024), "INT8", quantization=Q)
    ops = []
    for k in range(4):  # 1024 x 1024 dense layers: 1 MiB each, zero bias, one scale
        w = g.add_constant(f"w{k}", np.ones((1024, 1024), np.int8), quantization=Q)
        y = g.add_tensor(f"y{k}", (1, 1024), "INT8", quantization=Q)
        ops.append(g.add_op("FULLY_CONNECTED", [x, w, None], [y]))
        x = y
    table = capability("edgetpu")
    assert undecided_line(predicted_memory(ops[:3], table)) is None  # 3,145,728 bytes
    line = undecided_line(predicted_memory(ops, table))  # 4,194,304 bytes
    assert line is not None and "streams although it fits" in line


def _dense_stack(layers: int, width: int = 1024) -> list[Op]:
    """`layers` dense layers of width x width int8 weights, zero bias, one scale: width**2
    parameter bytes each."""
    g = Graph("main")
    x = g.add_tensor("x", (1, width), "INT8", quantization=Q)
    ops = []
    for k in range(layers):
        w = g.add_constant(f"w{k}", np.ones((width, width), np.int8), quantization=Q)
        y = g.add_tensor(f"y{k}", (1, width), "INT8", quantization=Q)
        ops.append(g.add_op("FULLY_CONNECTED", [x, w, None], [y]))
        x = y
    return ops


def test_compiler_15_splits_one_graph_two_ways() -> None:
    """Compiler 15 streamed 598,080 of one MobileNetV2 graph's 3,094,912 bytes (Coral's
    demo-manufacturing classifier, by its log) and cached all of the same graph's 3,095,040
    in a dev twin: above `SPLIT_SURE_BYTES_15` (2,729,344, the largest twin of 15 caching all
    below it) its split is undecided, where 16's is still decided."""
    from tflfuse.targets.edgetpu.memory import SPLIT_SURE_BYTES_15

    assert SPLIT_SURE_BYTES_15 == 2_729_344 < SPLIT_SURE_BYTES
    table = capability("edgetpu")
    ops = _dense_stack(3)  # 3,145,728 bytes
    assert predicted_memory(ops, table, 16).get("undecided_split") is None
    fifteen = predicted_memory(ops, table, 15)
    assert fifteen["undecided_split"] == 1 and fifteen["off_chip_bytes"] == 0
    line = undecided_line(fifteen)
    assert line is not None and "2,729,344 for compiler 15" in line
    assert predicted_memory(ops[:2], table, 15).get("undecided_split") is None  # 2,097,152


def test_an_older_compiler_lays_out_only_the_op_types_its_twins_show() -> None:
    """Compilers before 15 are shown laying out convolutions, dense layers, ADD, MUL, pools,
    RESHAPE, SOFTMAX; the one twin of theirs mapping a CONCATENATION and a LOGISTIC (a 2.1 SSD)
    holds more than the layout: those are undecided for them, and decided for 15 and 16."""
    g = Graph("main")
    a = g.add_tensor("a", (1, 8, 8, 4), "INT8", quantization=Q)
    b = g.add_tensor("b", (1, 8, 8, 4), "INT8", quantization=Q)
    y = g.add_tensor("y", (1, 8, 8, 8), "INT8", quantization=Q)
    concat = g.add_op("CONCATENATION", [a, b], [y], {"axis": 3})
    z = g.add_tensor("z", (1, 8, 8, 8), "INT8", quantization=Q)
    sigmoid = g.add_op("LOGISTIC", [y], [z])
    table = capability("edgetpu")
    old = predicted_memory([concat, sigmoid], table, 2)
    assert old["undecided_old_layout"] == 2 and old["parameter_bytes"] == 0
    line = undecided_line(old)
    assert line is not None and "a compiler before 15" in line
    for major in (15, 16):
        assert "undecided_old_layout" not in predicted_memory([concat, sigmoid], table, major)
    assert "undecided_old_layout" not in predicted_memory(_dense_stack(1, 64), table, 2)


@needs_oracle()
def test_split_concats_one_channel_split_is_decided_and_exact() -> None:
    """Coral's split_concat twin (shared, dev): a SPLIT of 6 channels into ones at offsets 1 to
    5 is mapped; the layout gives its package's 192 bytes and says nothing undecided."""
    cpu = flatbuffer.load(ORACLE / "split_concat.tflite")
    truth = truth_of(cpu, flatbuffer.load(ORACLE / "split_concat_edgetpu.tflite"))
    assert truth.memory is not None
    mapped = [op for i, op in enumerate(cpu.main.ops) if i not in set(truth.cpu_ops)]
    assert any(op.type == "SPLIT" for op in mapped)
    memory = predicted_memory(mapped, capability("edgetpu"), twin_compiler_major(truth))
    assert (memory["on_chip_bytes"], memory["off_chip_bytes"]) == (192, 0)
    assert truth.memory["on_chip_bytes"] + truth.memory["off_chip_bytes"] == 192
    assert undecided_line(memory) is None


def test_yolov8ns_aligned_channel_slices_hold_nothing() -> None:
    """MaxwellHogan's YOLOv8n twin (shared, holdout: checked, not derived from): 12 mapped
    STRIDED_SLICEs of channels at multiples of 16, none undecided, and its 3,492,544 bytes."""
    truth, mapped = yolov8n_twin()
    assert truth.memory is not None
    slices = [op for op in mapped if op.type == "STRIDED_SLICE"]
    assert len(slices) >= 12 and not any(undecided_channel_slice(op) for op in slices)
    memory = predicted_memory(mapped, capability("edgetpu"), twin_compiler_major(truth))
    assert memory.get("undecided_channel_slice") is None
    assert memory["parameter_bytes"] == truth.memory["on_chip_bytes"] == 3_492_544
