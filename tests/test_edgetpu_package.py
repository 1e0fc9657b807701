"""The Edge TPU package inside a compiled model (targets/edgetpu/package.py), the compiler's
parameter layout (memory.py), and the compile modes (modes.py, `check`, `compile --mode`).

The reader is tested on a package this file writes from the schema's field order (no ../shared
needed) and on the real twins of ../shared/oracle; the layout against the bytes those twins'
packages hold.
"""

from __future__ import annotations

import json
from pathlib import Path

import flatbuffers
import numpy as np
import pytest
from conftest import ORACLE, needs_oracle
from flatbuffers import flexbuffers
from test_edgetpu_compiler import _chain_with_a_custom_op, stand_in  # noqa: F401

from tflfuse.cli import main
from tflfuse.ir import Graph, Model, Op, Quantization, flatbuffer
from tflfuse.targets import capability
from tflfuse.targets.edgetpu.memory import (
    concat_bytes,
    flatten_bytes,
    layer_bytes,
    predicted_memory,
    streamed_layer,
    undecided_line,
)
from tflfuse.targets.edgetpu.modes import compare_modes, crossings
from tflfuse.targets.edgetpu.package import (
    PackageError,
    cocompiled,
    compiler_generation,
    model_packages,
    package_memory,
    parameter_streams,
    read_package,
)
from tflfuse.targets.edgetpu.truth import (
    Truth,
    format_package,
    read_truth,
    truth_of,
    twin_compiler_major,
)

MORE = ORACLE.parent / "edgetpu-more"


# -- a package written here, field by field -------------------------------------------------
def _executable(kind: int, params: int, token: int, layer: str, cycles: int = 0) -> bytes:
    b = flatbuffers.Builder(0)
    name = b.CreateString(layer)
    b.StartObject(12)  # Layer
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependInt32Slot(1, 64, 0)  # size_bytes
    b.PrependInt32Slot(4, 64, 0)  # z_dim
    layer_at = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(layer_at)
    layers = b.EndVector()
    data = b.CreateByteVector(bytes(params))
    b.StartObject(17)  # Executable
    b.PrependUOffsetTRelativeSlot(6, data, 0)
    b.PrependUOffsetTRelativeSlot(8, layers, 0)
    b.PrependInt16Slot(13, kind, 0)
    b.PrependUint64Slot(14, token, 0)
    if cycles:  # estimated_cycles_64bit: compilers before 16 wrote it
        b.PrependInt64Slot(16, cycles, 0)
    b.Finish(b.EndObject())
    return bytes(b.Output())


def _custom_options(executables: list[bytes], runtime: int = 14) -> bytes:
    multi = flatbuffers.Builder(0)
    strings = [multi.CreateByteVector(e) for e in executables]
    multi.StartVector(4, len(strings), 4)
    for s in reversed(strings):
        multi.PrependUOffsetTRelative(s)
    vec = multi.EndVector()
    multi.StartObject(1)
    multi.PrependUOffsetTRelativeSlot(0, vec, 0)
    multi.Finish(multi.EndObject())
    pkg = flatbuffers.Builder(0)
    blob = pkg.CreateByteVector(bytes(multi.Output()))
    pkg.StartObject(8)
    pkg.PrependInt32Slot(0, runtime, 0)
    pkg.PrependUOffsetTRelativeSlot(1, blob, 0)
    pkg.Finish(pkg.EndObject(), file_identifier=b"DWN1")
    fx = flexbuffers.Builder()
    with fx.Map():
        fx.Int("1", 0)
        fx.Key("4")
        fx.String(_Raw(pkg.Output()))  # the compiler writes the package as a string's bytes
    return bytes(fx.Finish())


class _Raw(bytes):
    """Bytes that flexbuffers' `String` writes as they are (it encodes a str to UTF-8)."""

    def encode(self, *_: object) -> bytes:
        return bytes(self)


def test_a_written_package_is_read_back() -> None:
    token = 0x1234_5678_9ABC_DEF0
    options = _custom_options(
        [_executable(2, 576, token, "x"), _executable(1, 43_968, token, "x")], runtime=14
    )
    pkg = read_package(options)
    assert pkg.runtime_version == 14
    assert [e.type for e in pkg.executables] == ["EXECUTION_ONLY", "PARAMETER_CACHING"]
    assert (pkg.cached_bytes, pkg.streamed_bytes) == (43_968, 576)
    assert pkg.caching_tokens == [token]
    assert [layer.name for layer in pkg.inputs] == ["x"] and pkg.inputs[0].shape == (0, 0, 64)


def test_options_without_a_package_are_refused() -> None:
    with pytest.raises(PackageError):
        read_package(b"not a package at all")


# -- the real twins -------------------------------------------------------------------------------
def _pairs() -> list[tuple[Path, Path]]:
    found = []
    for root in (ORACLE, MORE):
        for twin in sorted(root.rglob("*_edgetpu.tflite")) if root.is_dir() else []:
            cpu = twin.with_name(twin.name.replace("_edgetpu.tflite", ".tflite"))
            if cpu.is_file():
                found.append((cpu, twin))
    return found


@needs_oracle()
def test_every_shared_twin_has_a_readable_package_naming_its_segment_tensors() -> None:
    pairs = _pairs()
    assert pairs
    for _, twin in pairs:
        compiled = flatbuffer.load(twin)
        packages = model_packages(compiled)
        custom = [op for op in compiled.main.ops if op.custom_code == "edgetpu-custom-op"]
        assert len(packages) == len(custom) and all(packages)
        for pkg, op in zip(packages, custom):
            kinds = {e.type for e in pkg.executables}
            assert kinds <= {"PARAMETER_CACHING", "EXECUTION_ONLY", "STAND_ALONE"}
            assert len(pkg.caching_tokens) <= 1  # one token per package
            names = {t.name for t in op.inputs if t is not None}
            assert {layer.name for layer in pkg.inputs} <= names
            # every output of the custom op is a layer (an LSTM's package also outputs its state)
            assert {t.name for t in op.outputs} <= {layer.name for layer in pkg.outputs}


@needs_oracle()
def test_lstm_twin_caches_and_streams_as_its_package_says() -> None:
    twin = flatbuffer.load(ORACLE / "keras_lstm_mnist_ptq_edgetpu.tflite")
    memory = package_memory(twin)
    assert memory is not None
    assert memory["executables_by_type"] == {"parameter_caching": 1, "execution_only": 1}
    assert memory["on_chip_bytes"] + memory["off_chip_bytes"] > 0
    assert memory["off_chip_bytes"] < memory["on_chip_bytes"]


@needs_oracle()
@pytest.mark.parametrize(
    "name",
    ["deeplabv3_mnv2_dm05_pascal_quant", "posenet_mobilenet_v1_075_353_481_16_quant_decoder"],
)
def test_layout_gives_the_packages_bytes(name: str) -> None:
    """The compiler's layout (channel groups, 4-byte input chunks, per-channel header words)
    applied to the ops the twin maps gives the bytes its package holds, to the byte."""
    cpu = flatbuffer.load(ORACLE / f"{name}.tflite")
    truth = truth_of(cpu, flatbuffer.load(ORACLE / f"{name}_edgetpu.tflite"))
    mapped = [op for i, op in enumerate(cpu.main.ops) if i not in set(truth.cpu_ops)]
    predicted = predicted_memory(mapped, capability("edgetpu"))
    assert truth.memory is not None
    actual = truth.memory["on_chip_bytes"] + truth.memory["off_chip_bytes"]
    assert predicted["parameter_bytes"] == actual
    assert predicted["parameter_bytes"] != predicted["tensor_bytes"]  # not the raw tensors


@pytest.mark.skipif(not MORE.is_dir(), reason="../shared/oracle/edgetpu-more is absent")
def test_check_json_on_a_compiled_model_shows_the_package(
    capsys: pytest.CaptureFixture[str],
) -> None:
    twin = next(MORE.rglob("dense_256_edgetpu.tflite"))
    assert main(["check", str(twin), "--target", "edgetpu", "--json"]) == 0
    package = json.loads(capsys.readouterr().out)["compiled"]["package"]
    cpu = flatbuffer.load(twin.with_name("dense_256.tflite"))
    fc = next(op for op in cpu.main.ops if op.type == "FULLY_CONNECTED")
    assert package["on_chip_bytes"] == layer_bytes(fc)  # 256 x 256 weights + 8 B per output
    assert package["executables"] == 2 and len(package["caching_tokens"]) == 1
    assert main(["check", str(twin), "--target", "edgetpu"]) == 0
    text = capsys.readouterr().out
    assert "On-chip memory used for caching model parameters: 67,584 B" in text


@needs_oracle()
def test_score_reads_memory_of_every_pair() -> None:
    from tflfuse.targets.edgetpu.truth import find_pairs, score_pair

    scores = [score_pair(p) for p in find_pairs(ORACLE, all_dev=True)]
    assert all(s.memory is not None for s in scores)
    assert any(s.memory["layout_exact"] for s in scores)
    truth = read_truth(find_pairs(ORACLE, all_dev=True)[0])
    assert truth.memory is not None and truth.memory["readable_packages"] == truth.segments


# -- layout on tiny layers -------------------------------------------------------------------------
def _fc(outputs: int, inputs: int, per_channel: bool, bias: bool) -> Model:
    g = Graph("main")
    q = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))
    x = g.add_tensor("x", (1, inputs), "INT8", quantization=q)
    scales = np.linspace(0.01, 0.02, outputs if per_channel else 1).astype(np.float32)
    wq = Quantization(scale=scales, zero_point=np.zeros(scales.size, np.int64))
    w = g.add_constant("w", np.ones((outputs, inputs), np.int8), quantization=wq)
    b = g.add_constant("b", np.arange(outputs, dtype=np.int32)) if bias else None
    y = g.add_tensor("y", (1, outputs), "INT8", quantization=q)
    g.add_op("FULLY_CONNECTED", [x, w, b], [y])
    g.inputs, g.outputs = [x], [y]
    return Model([g])


def test_layout_pads_outputs_and_adds_header_words() -> None:
    # 256 outputs: 4 groups of 64; 64 input chunks x 64 outputs x 4 B each, and per output a
    # float scale + the weights' zero point (per-channel, no bias) = 8 B
    fc = _fc(256, 256, per_channel=True, bias=False).main.ops[0]
    assert layer_bytes(fc) == 256 * 256 + 256 * 8
    # one output is padded to 16; per-tensor without bias: no header
    assert layer_bytes(_fc(1, 256, per_channel=False, bias=False).main.ops[0]) == 16 * 256
    # 3 outputs, a bias: padded to 16 outputs x (4 B bias + 128 chunks x 4 B)
    assert layer_bytes(_fc(3, 512, per_channel=False, bias=True).main.ops[0]) == 16 * (4 + 512)
    # 100 outputs: two whole groups of 64; 10 inputs are 3 chunks of 4
    assert layer_bytes(_fc(100, 10, per_channel=False, bias=True).main.ops[0]) == 2 * 64 * (4 + 12)


def _zero_bias_dense(outputs: int, map_shape: tuple[int, ...]) -> Op:
    """A UINT8 FULLY_CONNECTED with an all-zero bias reading `map_shape` (iwatake2222's dense
    stacks, whose 1.0 twins pinned both rules below)."""
    g = Graph("main")
    q = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([128], np.int64))
    inputs = int(np.prod(map_shape))
    x = g.add_tensor("x", map_shape, "UINT8", quantization=q)
    w = g.add_constant("w", np.ones((outputs, inputs), np.uint8), quantization=q)
    b = g.add_constant("b", np.zeros(outputs, np.int32))
    y = g.add_tensor("y", (1, outputs), "UINT8", quantization=q)
    g.add_op("FULLY_CONNECTED", [x, w, b], [y])
    return g.ops[0]


def test_compilers_before_15_store_a_zero_bias_and_a_map_is_read_by_taps() -> None:
    """100 outputs are two groups of 64; 16 stores no word for a zero bias, 1.x one per padded
    output (4 x 128 bytes more); a dense layer reading [1, 2, 2, 3] is 4 taps of 3 channels,
    each padded to a 4-byte chunk (16 bytes per output, not 12)."""
    flat = _zero_bias_dense(100, (1, 100))
    assert layer_bytes(flat) == 128 * 100
    assert layer_bytes(flat, compiler_major=1) == 128 * (100 + 4)
    assert layer_bytes(flat, compiler_major=15) == 128 * 100
    mapped = _zero_bias_dense(100, (1, 2, 2, 3))
    assert layer_bytes(mapped) == 128 * 16
    assert layer_bytes(mapped, compiler_major=1) == 128 * (16 + 4)


def test_compilers_before_15_leave_the_split_undecided_sooner() -> None:
    """A stack of 101 dense layers of 1,322,112 bytes streams its end in its 1.0 twin: above
    1,040,896 bytes the split of a compiler before 15 is undecided, for 16 only above
    `SPLIT_SURE_BYTES`."""
    table = capability("edgetpu")
    stack = [_zero_bias_dense(100, (1, 100)) for _ in range(90)]
    assert undecided_line(predicted_memory(stack, table)) is None
    line = undecided_line(predicted_memory(stack, table, compiler_major=1))
    assert line is not None and "streams although it fits" in line
    assert undecided_line(predicted_memory(stack[:70], table, compiler_major=1)) is None


# -- modes and crossings ---------------------------------------------------------------------------
def test_modes_count_crossings_and_choose_multi_for_a_chain(tmp_path: Path) -> None:
    model = flatbuffer.load(_chain_with_a_custom_op(tmp_path))
    choice = compare_modes(model)
    single, multi = choice.of("single"), choice.of("multi")
    assert single is not None and multi is not None
    assert (single.mapped, single.segments) == (1, 1)
    assert (multi.mapped, multi.segments) == (2, 2)
    # RELU -> MyOp crosses to the CPU (32 B) in both; MyOp -> RELU back to the Edge TPU with -a
    assert (single.crossings.count, single.crossings.bytes) == (1, 32)
    assert (multi.crossings.to_cpu, multi.crossings.to_edgetpu, multi.crossings.bytes) == (1, 1, 64)
    assert choice.chosen.mode == "multi" and choice.chosen.flags == ["-a"]
    assert crossings(model.main, [True, True, True]).count == 0


def test_check_prints_the_modes_and_the_best_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _chain_with_a_custom_op(tmp_path)
    assert main(["check", str(path), "--target", "edgetpu"]) == 0
    text = capsys.readouterr().out
    assert "Best mode: edgetpu_compiler -a chain.tflite" in text
    assert main(["check", str(path), "--target", "edgetpu", "--json"]) == 0
    modes = json.loads(capsys.readouterr().out)["compile_modes"]
    assert modes["best"] == "multi" and [m["mode"] for m in modes["modes"]] == ["single", "multi"]


def test_compile_mode_auto_passes_the_chosen_flags(
    stand_in: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = _chain_with_a_custom_op(stand_in)
    out = stand_in / "auto"
    assert main(["compile", str(model), "-o", str(out), "--mode", "auto"]) == 0
    assert "-a" in (stand_in / "argv.txt").read_text().split()
    text = capsys.readouterr().out
    assert "--mode auto chose multi" in text and "prediction and compiler agree" in text
    assert main(["compile", str(model), "-o", str(out), "--mode", "single", "--json"]) == 0
    assert "-a" not in (stand_in / "argv.txt").read_text().split()
    assert json.loads(capsys.readouterr().out)["agrees"] is True


@needs_oracle()
def test_compile_sets_predicted_memory_beside_the_package(
    stand_in: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The stand-in returns the real compiler's twin of deeplab: the prediction's cached bytes
    are the package's, and `compile` prints both."""
    model = ORACLE / "deeplabv3_mnv2_dm05_pascal_quant.tflite"
    assert main(["compile", str(model), "-o", str(stand_in / "o"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    package = report["twin"]["package"]
    assert package["on_chip_bytes"] == report["prediction"]["memory"]["on_chip_bytes"]
    assert package["off_chip_bytes"] == report["prediction"]["memory"]["off_chip_bytes"] == 0
    assert main(["compile", str(model), "-o", str(stand_in / "o")]) == 0
    text = capsys.readouterr().out
    cached = f"{package['on_chip_bytes']:,} B cached"
    assert f"parameter memory: predicted {cached}" in text
    assert f"parameter memory in the compiled package: {cached}" in text


def test_an_activation_larger_than_any_compiled_is_said_undecided(tmp_path: Path) -> None:
    def relu(shape: tuple[int, ...]) -> Model:
        qp = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))
        g = Graph("main")
        x = g.add_tensor("x", shape, "UINT8", quantization=qp)
        y = g.add_tensor("y", shape, "UINT8", quantization=qp)
        g.add_op("RELU", [x], [y])
        g.inputs, g.outputs = [x], [y]
        return Model([g])

    limit = capability("edgetpu")["meta"]["largest_activation_compiled"]
    big = compare_modes(relu((1, 1000, 1000, 12)))  # 12,000,000 bytes
    assert limit < 12_000_000 and len(big.notes) == 1 and "undecided" in big.notes[0]
    assert compare_modes(relu((1, 100, 100, 12))).notes == []


def test_a_cpu_op_between_two_joined_mapped_ops_makes_two_segments() -> None:
    """x -> RELU a -> CUSTOM b -> ADD(a, b): the ADD reads the RELU directly and through the CPU
    op, so one custom op holding both would wait on itself: -a makes two segments."""
    qp = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))
    g = Graph("main")
    x, a, b, y = (g.add_tensor(n, (1, 4, 4, 2), "UINT8", quantization=qp) for n in "xaby")
    g.add_op("RELU", [x], [a])
    g.add_op("CUSTOM", [a], [b], custom_code="MyOp")
    g.add_op("ADD", [a, b], [y])
    g.inputs, g.outputs = [x], [y]
    multi = compare_modes(Model([g])).of("multi")
    assert multi is not None and (multi.mapped, multi.segments) == (2, 2)
    assert (multi.crossings.to_cpu, multi.crossings.to_edgetpu) == (1, 1)


def test_a_classifier_softmax_is_laid_out_by_compiler_generation() -> None:
    model = _fc(10, 512, per_channel=False, bias=True)
    g = model.main
    fc = g.ops[0]
    q = Quantization(scale=np.array([1 / 256], np.float32), zero_point=np.array([-128], np.int64))
    probs = g.add_tensor("p", (1, 10), "INT8", quantization=q)
    g.add_op("SOFTMAX", [fc.outputs[0]], [probs])
    g.outputs = [probs]
    table = capability("edgetpu")
    head = layer_bytes(fc)
    assert head == 16 * (4 + 512)
    # three sections of 16 bytes per class, 10 classes padded to 12: 3 x 192
    assert predicted_memory(list(g.ops), table)["parameter_bytes"] == head + 576
    # 15.0: two sections; 1.x/2.x: none
    older = predicted_memory(list(g.ops), table, compiler_major=15)
    assert older["parameter_bytes"] == head + 384
    assert predicted_memory(list(g.ops), table, compiler_major=2)["parameter_bytes"] == head
    # 15 is shown laying out 2 and 5 classes only (a 3-class one holds 128 bytes fewer)
    line = undecided_line(older)
    assert line is not None and "class count" in line
    assert undecided_line(predicted_memory(list(g.ops), table)) is None


def test_the_report_tables_the_modes_and_names_the_flags(tmp_path: Path) -> None:
    from tflfuse.convert import report

    data = _chain_with_a_custom_op(tmp_path).read_bytes()
    section = {name: report.edgetpu_cut(flatbuffer.from_bytes(data)) for name in ("fused", "stock")}
    for v in section.values():
        v.pop("_prediction")
    text = "\n".join(report._edgetpu_lines(section))
    assert "| fused | multi (best) | `-a` | 2/3 | 2 | 2 | 64 |" in text
    assert "| stock | single | `(none)` | 1/3 | 1 | 1 | 32 |" in text
    assert "Compile the fused model with `edgetpu_compiler -a fused.tflite`." in text


def test_the_package_form_names_the_compiler_generation() -> None:
    """16 writes no cycle estimate; 15.0 writes one and needs runtime 12; runtime 10 is older."""
    token = 7
    sixteen = [_executable(2, 64, token, "x"), _executable(1, 128, token, "x")]
    fifteen = [_executable(2, 64, token, "x", cycles=1234), _executable(1, 128, token, "x")]
    assert compiler_generation(read_package(_custom_options(sixteen, runtime=14))) == 16
    assert compiler_generation(read_package(_custom_options(sixteen, runtime=12))) == 16
    assert compiler_generation(read_package(_custom_options(fifteen, runtime=12))) == 15
    assert compiler_generation(read_package(_custom_options(fifteen, runtime=10))) is None


def _single_output_conv(inputs: int, kernel: int, outputs: int = 1) -> Model:
    g = Graph("main")
    q = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))
    x = g.add_tensor("x", (1, 8, 8, inputs), "INT8", quantization=q)
    wq = Quantization(scale=np.array([0.01], np.float32), zero_point=np.array([0], np.int64))
    w = g.add_constant("w", np.ones((outputs, kernel, kernel, inputs), np.int8), quantization=wq)
    b = g.add_constant("b", np.full(outputs, 5, np.int32))
    y = g.add_tensor("y", (1, 8, 8, outputs), "INT8", quantization=q)
    g.add_op("CONV_2D", [x, w, b], [y])
    g.inputs, g.outputs = [x], [y]
    return Model([g])


def test_a_conv_of_one_output_is_padded_to_four_outputs_and_an_fc_to_sixteen() -> None:
    # BodyPix's segmentation head: 1x1, 384 inputs, a bias: 4 outputs x (4 B bias + 96 chunks
    # x 4 B) = 1,552, padded to 1,600 (padded to 16 outputs it would be 6,208)
    assert layer_bytes(_single_output_conv(384, 1).main.ops[0]) == 1600
    # a FULLY_CONNECTED of one output (its bias 0: no header word) keeps 16 padded outputs
    assert layer_bytes(_fc(1, 384, per_channel=False, bias=True).main.ops[0]) == 16 * 384
    # a YOLOv8 class head of 4 classes (1x1, 64 inputs): 4 x (4 + 64) = 272, padded to 320
    assert layer_bytes(_single_output_conv(64, 1, outputs=4).main.ops[0]) == 320
    # 5 outputs are padded to 16: 16 x 68 = 1,088; 2 are too, but no dev twin shows it
    assert layer_bytes(_single_output_conv(64, 1, outputs=5).main.ops[0]) == 1088
    two = _single_output_conv(64, 1, outputs=2).main.ops[0]
    assert layer_bytes(two) == 1088
    line = undecided_line(predicted_memory([two], capability("edgetpu")))
    assert line is not None and "2 or 3 outputs" in line


def _head_transpose(h: int, w: int, c: int, perm: tuple[int, ...] = (0, 3, 1, 2)) -> Op:
    """YOLOv8's detect head: [1, H, W, C] transposed to [1, C, H, W], joined to [1, C, H x W]."""
    g = Graph("main")
    q = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))
    x = g.add_tensor("x", (1, h, w, c), "INT8", quantization=q)
    p = g.add_constant("perm", np.array(perm, np.int32))
    t = g.add_tensor("t", tuple((1, h, w, c)[i] for i in perm), "INT8", quantization=q)
    s = g.add_constant("shape", np.array([1, c, h * w], np.int32))
    y = g.add_tensor("y", (1, c, h * w), "INT8", quantization=q)
    g.add_op("TRANSPOSE", [x, p], [t])
    g.add_op("RESHAPE", [t, s], [y])
    g.inputs, g.outputs = [x], [y]
    return g.ops[0]


def test_a_caching_token_shared_by_different_models_marks_a_cocompile() -> None:
    """One token over two models of different bytes: compiled together; over two copies of one
    model (same bytes): not."""

    def memory(token: str, on: int, off: int = 0) -> dict[str, object]:
        return {"caching_tokens": [token], "on_chip_bytes": on, "off_chip_bytes": off}

    memories = {
        "birds": memory("0x1", 2_323_456, 1_623_872),
        "dummy": memory("0x1", 16_320),
        "copy_a": memory("0x2", 518_656),
        "copy_b": memory("0x2", 518_656),
        "alone": memory("0x3", 566_912),
    }
    assert cocompiled(memories) == {"birds", "dummy"}


def _gemm_pack_and_transpose() -> list[Op]:
    """The GEMM random forests' forms: PACK of a [1, 1] score and a [1, 1] constant, its RESHAPE
    to [2, 1], a TRANSPOSE of [2, 2] scores."""
    g = Graph("main")
    q = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))
    x = g.add_tensor("x", (1, 1), "INT8", quantization=q)
    c = g.add_constant("c", np.array([[3]], np.int8), quantization=q)
    p = g.add_tensor("p", (2, 1, 1), "INT8", quantization=q)
    g.add_op("PACK", [x, c], [p], options={"values_count": 2, "axis": 0})
    r = g.add_tensor("r", (2, 1), "INT8", quantization=q)
    g.add_op("RESHAPE", [p, g.add_constant("s", np.array([2, 1], np.int32))], [r])
    scores = g.add_tensor("scores", (2, 2), "INT8", quantization=q)
    t = g.add_tensor("t", (2, 2), "INT8", quantization=q)
    g.add_op("TRANSPOSE", [scores, g.add_constant("perm", np.array([1, 0], np.int32))], [t])
    return list(g.ops)


def test_a_pack_of_a_constant_streams_its_block_and_a_small_transpose_holds_none() -> None:
    """The PACK holds 128 bytes: its constant's block streamed, a lane selection cached."""
    pack, reshape, transpose = _gemm_pack_and_transpose()
    assert (layer_bytes(pack), layer_bytes(reshape), layer_bytes(transpose)) == (128, 0, 0)
    memory = predicted_memory([pack, reshape, transpose], capability("edgetpu"))
    assert (memory["on_chip_bytes"], memory["off_chip_bytes"]) == (64, 64)
    assert undecided_line(memory) is None


def _sum_then_reshape(n: int) -> list[Op]:
    g = Graph("main")
    q = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))
    x = g.add_tensor("x", (n, 3), "INT8", quantization=q)
    col = g.add_tensor("col", (n, 1), "INT8", quantization=q)
    g.add_op("SUM", [x, g.add_constant("axis", np.array([1], np.int32))], [col])
    row = g.add_tensor("row", (1, n), "INT8", quantization=q)
    g.add_op("RESHAPE", [col, g.add_constant("s", np.array([1, n], np.int32))], [row])
    return list(g.ops)


def test_a_reshape_of_a_sum_column_into_a_row_is_a_lane_selection() -> None:
    """The GEMM forests' [4, 1] -> [1, 4] after a SUM holds a zero block and 4 one-hot lanes (320
    bytes, a dev forest of one tree) and [2, 1] -> [1, 2] 192 (the benchmarked dev forests);
    other lengths are laid out so but undecided; the same RESHAPE of a QUANTIZE's output holds
    none (shown)."""
    table = capability("edgetpu")
    for n, size in ((4, 320), (2, 192)):
        ops = _sum_then_reshape(n)
        assert layer_bytes(ops[1]) == size
        assert undecided_line(predicted_memory(ops[1:], table)) is None
    ops = _sum_then_reshape(3)
    line = undecided_line(predicted_memory(ops[1:], table))
    assert line is not None and "column into a row" in line
    ops[0].type = "QUANTIZE"
    assert layer_bytes(ops[1]) == 0
    assert undecided_line(predicted_memory(ops[1:], table)) is None


def _flatten(channels: int) -> Op:
    g = Graph("main")
    q = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))
    x = g.add_tensor("x", (1, 6, 6, channels), "INT8", quantization=q)
    s = g.add_constant("shape", np.array([1, 36 * channels], np.int32))
    y = g.add_tensor("y", (1, 36 * channels), "INT8", quantization=q)
    g.add_op("RESHAPE", [x, s], [y])
    return g.ops[0]


def test_a_flatten_of_channels_not_a_multiple_of_4_is_undecided() -> None:
    """The dev twins flatten maps of 8, 64 and 164 channels with no bytes; 114 is shown by none."""
    table = capability("edgetpu")
    assert undecided_line(predicted_memory([_flatten(164)], table)) is None
    assert predicted_memory([_flatten(164)], table)["parameter_bytes"] == 0
    line = undecided_line(predicted_memory([_flatten(114)], table))
    assert line is not None and "multiple of 4" in line


def yolov8n_twin() -> tuple[Truth, list[Op]]:
    """MaxwellHogan's YOLOv8n pair (shared, edgetpu-more): the twin's truth (its package read)
    and the ops it maps; the test skips when the pair is absent."""
    folder = MORE / "MaxwellHogan__coral_wifi_webserver"
    cpu_path = next(folder.rglob("yolov8n_full_integer_quant.tflite"), None)
    if cpu_path is None:
        pytest.skip("the YOLOv8n pair is not in ../shared/oracle/edgetpu-more")
    cpu = flatbuffer.load(cpu_path)
    truth = truth_of(cpu, flatbuffer.load(cpu_path.with_name(f"{cpu_path.stem}_edgetpu.tflite")))
    assert truth.memory is not None
    return truth, [op for i, op in enumerate(cpu.main.ops) if i not in set(truth.cpu_ops)]


def test_yolov8n_twin_holds_the_layout_with_its_head_transpose() -> None:
    """MaxwellHogan's YOLOv8n twin (compiler 16; 80 classes, its head transpose of
    [1, 20, 20, 144] mapped): the layout with `TRANSPOSE_SHOWN` gives its 3,492,544 bytes."""
    truth, mapped = yolov8n_twin()
    assert truth.memory is not None
    assert any(op.type == "TRANSPOSE" for op in mapped)
    memory = predicted_memory(mapped, capability("edgetpu"), twin_compiler_major(truth))
    on, off = truth.memory["on_chip_bytes"], truth.memory["off_chip_bytes"]
    assert (memory["on_chip_bytes"], memory["off_chip_bytes"]) == (on, off) == (3_492_544, 0)


def test_a_head_transpose_is_laid_out_only_at_a_shape_a_twin_shows() -> None:
    """Located in the dev twins' streams: 12,864 bytes at 20 x 20 (68 and 144 channels alike),
    37,120 at 20 x 20 x 70, 18,496 at 10 x 10 x 144; any other shape or permutation is not laid
    out and `check` says so."""
    assert layer_bytes(_head_transpose(20, 20, 68)) == 12_864
    assert layer_bytes(_head_transpose(20, 20, 144)) == 12_864
    assert layer_bytes(_head_transpose(10, 10, 144)) == 18_496
    assert layer_bytes(_head_transpose(20, 20, 65)) is None
    assert layer_bytes(_head_transpose(20, 20, 68, perm=(0, 3, 2, 1))) is None
    line = undecided_line(predicted_memory([_head_transpose(40, 40, 68)], capability("edgetpu")))
    assert line is not None and "does not cover" in line


def test_a_wide_fully_connected_streams_although_the_model_fits() -> None:
    table = capability("edgetpu")
    wide = _fc(1, 16384, per_channel=False, bias=False).main.ops[0]
    narrow = _fc(1, 4096, per_channel=False, bias=False).main.ops[0]
    assert streamed_layer(wide) and not streamed_layer(narrow)
    memory = predicted_memory([wide, narrow], table)
    assert (memory["on_chip_bytes"], memory["off_chip_bytes"]) == (16 * 4096, 16 * 16384)
    assert undecided_line(memory) is None
    between = _fc(1, 9504, per_channel=False, bias=False).main.ops[0]
    line = undecided_line(predicted_memory([between], table))
    assert line is not None and line.startswith("memory: exact layout undecided:")


@pytest.mark.parametrize(
    ("where", "name", "rule_bytes"),
    [
        # compiler 16's softmax over MobileNet v1's 1001 logits: 3 x 16,064 + 64
        (ORACLE, "mobilenet_v1_0.25_128_quant", 48_256),
        # the colour tracker: its wide FULLY_CONNECTEDs stream, a flatten and a concatenation
        # hold lane selections (1,088 + 192 bytes); no rule of a compiler generation
        (MORE / "ricardodeazambuja__LibrEdgeTPU", "color_blue_128x128", 0),
    ],
)
def test_predicted_memory_is_the_packages_to_the_byte(
    where: Path, name: str, rule_bytes: int
) -> None:
    """On real twins, the layout (for the compiler the package's form shows) gives the bytes the
    package caches and streams; laid out for a compiler before 15 it is `rule_bytes` short, and
    without the lane selections 1,280 bytes short where the model has them."""
    cpu_path = next(where.rglob(f"{name}.tflite"), None) if where.is_dir() else None
    if cpu_path is None:
        pytest.skip(f"{name} is not in ../shared/oracle")
    cpu = flatbuffer.load(cpu_path)
    truth = truth_of(cpu, flatbuffer.load(cpu_path.with_name(f"{name}_edgetpu.tflite")))
    assert truth.memory is not None and twin_compiler_major(truth) == 16
    mapped = [op for i, op in enumerate(cpu.main.ops) if i not in set(truth.cpu_ops)]
    memory = predicted_memory(mapped, capability("edgetpu"), twin_compiler_major(truth))
    on, off = truth.memory["on_chip_bytes"], truth.memory["off_chip_bytes"]
    assert (memory["on_chip_bytes"], memory["off_chip_bytes"]) == (on, off)
    older = predicted_memory(mapped, capability("edgetpu"), compiler_major=2)
    assert older["parameter_bytes"] == on + off - rule_bytes
    lanes = sum(flatten_bytes(op) + concat_bytes(op) for op in mapped)
    assert lanes == (1088 + 192 if rule_bytes == 0 else 0)


@needs_oracle()
def test_a_runtime_12_twin_without_a_cycle_estimate_is_named_compiler_16() -> None:
    """Coral's LSTM twin needs runtime 12 yet maps what only 16 maps: its package's form says 16."""
    from tflfuse.targets.edgetpu.truth import compiled_summary

    summary = compiled_summary(flatbuffer.load(ORACLE / "keras_lstm_mnist_ptq_edgetpu.tflite"))
    assert summary["runtime_version"] == 12
    assert "edgetpu_compiler 16 asked for runtime 12" in str(summary["compiler"])


def test_a_fully_connected_of_a_constant_input_stores_the_constant_as_it_is() -> None:
    """The GEMM random-forest form: a constant [M, K] input times computed weights; the
    constant's M x K bytes, the whole padded to 64 (a dev forest's [480, 8]: 3,840 bytes in its
    stream, not the 7,680 of rows padded to 16); the first such layer streams, the next is
    cached, its constant in 4 x 4 tiles (`memory_forest`: [2, 5] two tiles) and, its weights
    read from an op the Edge TPU does not map (the TRANSPOSE left out), one block more."""
    g = Graph("main")
    q = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([-128], np.int64))
    const = g.add_constant("c", np.zeros((5, 20), np.int8), quantization=q)
    w = g.add_tensor("w", (1000, 20), "INT8", quantization=q)
    y = g.add_tensor("y", (5, 1000), "INT8", quantization=q)
    g.add_op("FULLY_CONNECTED", [const, w, None], [y])
    rows = g.add_constant("r", np.zeros((2, 5), np.int8), quantization=q)
    yt = g.add_tensor("yt", (1000, 5), "INT8", quantization=q)
    g.add_op("TRANSPOSE", [y, g.add_constant("perm", np.array([1, 0], np.int32))], [yt])
    z = g.add_tensor("z", (2, 1000), "INT8", quantization=q)
    g.add_op("FULLY_CONNECTED", [rows, yt, None], [z])
    g.inputs, g.outputs = [w], [z]
    first, transpose, second = g.ops
    assert layer_bytes(first) == 128  # 5 rows of 20 bytes = 100, padded to 128
    assert layer_bytes(second) == 64
    memory = predicted_memory([first, second], capability("edgetpu"))
    assert (memory["on_chip_bytes"], memory["off_chip_bytes"]) == (128 + 64, 128)
    assert undecided_line(memory) is None
    # a TRANSPOSE of [5, 1000] no twin shows is not laid out
    line = undecided_line(predicted_memory([first, transpose, second], capability("edgetpu")))
    assert line is not None and "does not cover" in line


@needs_oracle()
def test_the_package_says_what_the_activations_need() -> None:
    """libedgetpu's executable.fbs: `used_narrow_memory_bytes_per_tile` (field 12) and
    `scratch_size_bytes` (field 4) of the executable that runs; the LSTM keeps 672 bytes of
    activations in host memory, MobileNet v1 none; both sizes are those of Coral's twins."""
    lstm = model_packages(flatbuffer.load(ORACLE / "keras_lstm_mnist_ptq_edgetpu.tflite"))[0]
    mobilenet = model_packages(
        flatbuffer.load(ORACLE / "mobilenet_v1_0.25_128_quant_edgetpu.tflite")
    )[0]
    assert lstm is not None and mobilenet is not None
    (run,) = [e for e in lstm.executables if e.type == "EXECUTION_ONLY"]
    assert (run.narrow_bytes_per_tile, run.scratch_bytes) == (4_876, 672)
    (run,) = [e for e in mobilenet.executables if e.type == "EXECUTION_ONLY"]
    assert (run.narrow_bytes_per_tile, run.scratch_bytes) == (8_996, 0)
    assert all(e.instruction_bytes > 0 for e in (*lstm.executables, *mobilenet.executables))
    memory = package_memory(flatbuffer.load(ORACLE / "keras_lstm_mnist_ptq_edgetpu.tflite"))
    assert memory is not None
    lines = format_package(dict(memory))
    assert any("4,876 B of on-chip memory per tile, 672 B in host memory" in x for x in lines)


@needs_oracle()
def test_the_streams_show_which_layers_the_demo_classifier_streams() -> None:
    """Coral's demo-manufacturing classifier (compiler 15) streams 598,080 of its 3,094,912
    parameter bytes: the bias words the layout puts before each layer's weights place its
    first convolution (112 x 112) in the streamed executable and its last one (1280 outputs)
    and every depthwise layer in the cached one (benchmarks/EDGETPU_SPLIT.md)."""
    base = MORE / "google-coral__demo-manufacturing" / "models__classifier"
    cpu = flatbuffer.load(base / "classifier.tflite")
    streams = parameter_streams(flatbuffer.load(base / "classifier_edgetpu.tflite"))
    assert {k: len(v) for k, v in streams.items()} == {
        "EXECUTION_ONLY": 598_080,
        "PARAMETER_CACHING": 2_496_832,
    }

    def kept(op: Op) -> str:
        key = np.asarray(op.input(2).data).astype("<i4")[:4].tobytes()
        return "".join(sorted(k for k, v in streams.items() if key in v))

    convs = [op for op in cpu.main.ops if op.type == "CONV_2D"]
    assert kept(convs[0]) == "EXECUTION_ONLY" and convs[0].outputs[0].shape[1] == 112
    assert kept(convs[-2]) == "PARAMETER_CACHING" and convs[-2].outputs[0].shape[-1] == 1280
    depthwise = [op for op in cpu.main.ops if op.type == "DEPTHWISE_CONV_2D"]
    assert depthwise and {kept(op) for op in depthwise} == {"PARAMETER_CACHING"}
