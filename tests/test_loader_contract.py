"""The loader's contract with the interpreter (`tflfuse.ir.flatbuffer.from_bytes`), point by point.

Each case is a tiny model with one defect put in through the schema objects, and each test shows
both sides: what tflfuse says, and what ai-edge-litert does with the same bytes. The fuzz tests in
test_fuzz_loader.py check the same contract on mutated real models under random seeds.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from conftest import ORACLE

from tflfuse.errors import ModelError
from tflfuse.ir import Graph, Model, Op, Signature, Tensor, flatbuffer

pytest.importorskip("ai_edge_litert")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from ai_edge_litert.interpreter import Interpreter, OpResolverType

ADD = {"fused_activation_function": "NONE"}
XS = [np.linspace(-1.0, 1.0, 16, dtype=np.float32)[None] * s for s in (1.0, -2.0, 3.0)]


def schema_objects(graph: Graph, signatures: list[Signature] | None = None) -> Any:
    """The model's schema object tree, to put a defect in (tensor i is graph.tensors[i])."""
    model = Model([graph], signatures=signatures or [])
    return flatbuffer.flatbuffer_utils.convert_bytearray_to_object(
        bytearray(flatbuffer.to_bytes(model))
    )


def packed(model_t: Any) -> bytes:
    return bytes(flatbuffer.flatbuffer_utils.convert_object_to_bytearray(model_t))


def refusal(data: bytes) -> str:
    with pytest.raises(ModelError) as info:
        flatbuffer.from_bytes(data, "m.tflite")
    return str(info.value)


def run(data: bytes, resolver: OpResolverType = OpResolverType.AUTO) -> list[np.ndarray]:
    """The first output for each of XS, fed in turn to one interpreter."""
    interpreter = Interpreter(model_content=data, experimental_op_resolver_type=resolver)
    interpreter.allocate_tensors()
    x, y = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    out = []
    for value in XS:
        interpreter.set_tensor(x["index"], value)
        interpreter.invoke()
        out.append(interpreter.get_tensor(y["index"]).copy())
    return out


def vector(name: str) -> Tensor:
    return Tensor(name, (1, 16))


def neg_graph() -> Graph:
    """x -> NEG -> y, tensors [x, y]."""
    x, y = vector("x"), vector("y")
    return Graph("main", [Op("NEG", [x], [y])], [x, y], [x], [y])


# -- point 2: what the interpreter refuses ---------------------------------------------------------
def test_a_tensor_index_out_of_range_is_refused_with_the_interpreters_reason() -> None:
    m = schema_objects(neg_graph())
    m.subgraphs[0].operators[0].inputs[0] = 99
    data = packed(m)
    assert refusal(data) == (
        "m.tflite: not a valid TFLite model: invalid tensor index 99 in the inputs of op 0 (NEG)"
        " of subgraph 0: the subgraph has 2 tensors (the interpreter refuses to allocate it)"
    )
    interpreter = Interpreter(model_content=data)  # it builds, and remembers the bad index
    with pytest.raises(RuntimeError, match="Invalid tensor index 99 in node inputs"):
        interpreter.allocate_tensors()


def test_a_subgraph_output_out_of_range_is_refused_with_the_interpreters_reason() -> None:
    m = schema_objects(neg_graph())
    m.subgraphs[0].outputs[0] = 7
    data = packed(m)
    assert "invalid tensor index 7 in the outputs of subgraph 0" in refusal(data)
    with pytest.raises(RuntimeError, match="Invalid tensor index 7 in outputs"):
        Interpreter(model_content=data).allocate_tensors()


def test_an_omitted_optional_input_loads() -> None:
    """-1 among an op's inputs is an omitted optional input, for the interpreter and here."""
    x, w, y = vector("x"), Tensor("w", (16, 16)), Tensor("y", (1, 16))
    w.data = np.eye(16, dtype=np.float32)
    fc = Op("FULLY_CONNECTED", [x, w, None], [y], ADD)
    data = flatbuffer.to_bytes(Model([Graph("main", [fc], [x, w, y], [x], [y])]))
    assert list(flatbuffer.from_bytes(data).main.ops[0].inputs)[2] is None
    np.testing.assert_allclose(run(data)[1], XS[1])


def test_a_buffer_index_out_of_range_is_refused_as_the_builder_refuses_it() -> None:
    m = schema_objects(neg_graph())
    m.subgraphs[0].tensors[0].buffer = 5
    data = packed(m)
    assert "tensor 'x' names buffer 5, and the model has 1 buffers" in refusal(data)
    with pytest.raises(ValueError, match="Tensor 0 specifies out of range buffer 5"):
        Interpreter(model_content=data)


def test_a_signature_naming_a_missing_tensor_is_refused_as_its_runner_refuses_it() -> None:
    """(Past the file's tensors the runner may instead reach a kernel's scratch tensor: an LSTM
    adds six at run time. Either way the signature has no defined meaning.)"""
    g = neg_graph()
    x, y = g.tensors
    m = schema_objects(g, [Signature("serving_default", 0, {"x": x}, {"y": y})])
    m.signatureDefs[0].outputs[0].tensorIndex = 9
    data = packed(m)
    assert "signature 'serving_default' output 'y' names tensor 9" in refusal(data)
    interpreter = Interpreter(model_content=data)
    interpreter.allocate_tensors()
    interpreter.invoke()  # the subgraph itself runs ...
    runner = interpreter.get_signature_runner("serving_default")
    with pytest.raises(ValueError, match="Invalid tensor index 9"):  # ... its signature does not
        runner(x=XS[0])


def test_past_the_files_tensors_a_signature_may_reach_a_kernels_scratch_tensor() -> None:
    """The LSTM kernel adds six scratch tensors at run time, so a signature naming tensor 29 of a
    29-tensor subgraph runs: it feeds the kernel's scratch memory. tflfuse refuses it."""
    path = ORACLE / "keras_lstm_mnist_ptq.tflite"
    if not path.is_file():
        pytest.skip("../shared/oracle is absent")
    m = flatbuffer.flatbuffer_utils.convert_bytearray_to_object(bytearray(path.read_bytes()))
    assert len(m.subgraphs[0].tensors) == 29
    m.signatureDefs[0].inputs[0].tensorIndex = 29
    data = packed(m)
    assert "names tensor 29, and subgraph 0 has 29 tensors" in refusal(data)
    interpreter = Interpreter(model_content=data)
    interpreter.allocate_tensors()
    assert len(interpreter.get_tensor_details()) == 35  # 29 in the file, 6 the kernel added
    runner = interpreter.get_signature_runner()
    (name, detail), *_ = runner.get_input_details().items()
    runner(**{name: np.zeros(detail["shape"], detail["dtype"])})  # runs, on scratch memory


def test_a_dangling_intermediate_on_an_lstm_is_refused() -> None:
    """The LSTM kernels read `intermediates` (integer LSTM scales); an index past the tensor
    table would be read out of bounds."""
    x, y = vector("x"), vector("y")
    lstm = Op("UNIDIRECTIONAL_SEQUENCE_LSTM", [x], [y])
    m = schema_objects(Graph("main", [lstm], [x, y], [x], [y]))
    m.subgraphs[0].operators[0].intermediates = np.array([5], dtype=np.int32)
    assert "invalid tensor index 5 in the intermediates of op 0" in refusal(packed(m))


# -- point 3: where the interpreter never looks ----------------------------------------------------
def test_a_dangling_intermediate_elsewhere_is_dropped_as_no_kernel_reads_it() -> None:
    m = schema_objects(neg_graph())
    m.subgraphs[0].operators[0].intermediates = np.array([1, 42], dtype=np.int32)
    data = packed(m)
    model = flatbuffer.from_bytes(data)
    assert [t.name for t in model.main.ops[0].intermediates] == ["y"]  # 42 dropped
    again = flatbuffer.to_bytes(model)
    for a, b in zip(run(data), run(again)):  # the interpreter ran both alike
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(run(again)[2], -XS[2])


def test_buffer_0_means_no_data_whatever_it_holds() -> None:
    """The builder gives a tensor naming buffer 0 no data (ParseTensors), so a model that put
    bytes there still has x as its input, not a constant."""
    m = schema_objects(neg_graph())
    m.buffers[0].data = np.frombuffer(np.ones(16, np.float32).tobytes(), np.uint8)
    data = packed(m)
    assert flatbuffer.from_bytes(data).main.inputs[0].data is None
    np.testing.assert_array_equal(run(data)[1], -XS[1])  # the interpreter reads x as fed


def test_a_metadata_entry_without_its_buffer_reads_as_empty() -> None:
    model = Model([neg_graph()], metadata={"note": b"hello"})
    m = flatbuffer.flatbuffer_utils.convert_bytearray_to_object(
        bytearray(flatbuffer.to_bytes(model))
    )
    m.metadata[0].buffer = 77
    data = packed(m)
    assert flatbuffer.from_bytes(data).metadata == {"note": b""}
    np.testing.assert_array_equal(run(data)[0], -XS[0])  # the interpreter skips the entry


# -- point 1: file order with no defined result ----------------------------------------------------
def test_a_read_before_the_write_is_refused_because_runtimes_disagree_on_it() -> None:
    """ADD reads t before NEG writes it. The interpreter runs ops in file order: its plain kernels
    add the previous invoke's t; XNNPACK, which orders by data flow, adds this invoke's."""
    x, t, y = vector("x"), vector("t"), vector("y")
    ops = [Op("ADD", [x, t], [y], ADD), Op("NEG", [x], [t])]
    data = flatbuffer.to_bytes(Model([Graph("main", ops, [x, t, y], [x], [y])]))
    assert refusal(data) == (
        "m.tflite: not a valid TFLite model: op 0 (ADD) of subgraph 0 reads tensor 1 't' before"
        " op 1 (NEG) writes it: the interpreter runs ops in file order, so that read sees stale or"
        " uninitialized memory and the model has no defined result"
    )
    xnnpack = run(data, OpResolverType.AUTO)
    plain = run(data, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    np.testing.assert_array_equal(xnnpack[1], XS[1] - XS[1])  # this invoke's t
    np.testing.assert_array_equal(plain[1], XS[1] - XS[0])  # the previous invoke's t


def test_a_second_write_after_the_last_read_lands_in_another_tensors_memory() -> None:
    """NEG writes t, ADD reads it (its last read), RELU writes t again, and the arena has by then
    given t's memory to u: the model's output is not what file order says."""
    x, t, u, v, w = (vector(n) for n in "xtuvw")
    ops = [
        Op("NEG", [x], [t]),
        Op("ADD", [t, x], [u], ADD),  # u = 0
        Op("RELU", [x], [v]),
        Op("ADD", [u, x], [w], ADD),  # w = x, by file order
    ]
    m = schema_objects(Graph("main", ops, [x, t, u, v, w], [x], [w]))
    m.subgraphs[0].operators[2].outputs[0] = 1  # RELU writes t as well
    data = packed(m)
    assert refusal(data) == (
        "m.tflite: not a valid TFLite model: tensor 1 't' of subgraph 0 is written by op 0 (NEG)"
        " and again by op 2 (RELU): the interpreter plans one lifetime per tensor, from its first"
        " writer to its last reader, so a second write can land in another tensor's memory"
    )
    for resolver in (OpResolverType.AUTO, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES):
        got = run(data, resolver)[2]
        assert not np.allclose(got, XS[2]), resolver  # u was overwritten with relu(x)
        np.testing.assert_allclose(got, XS[2] + np.maximum(XS[2], 0))


def test_an_op_with_parameters_that_writes_its_own_input_is_refused_by_both() -> None:
    x, y, z = vector("x"), vector("y"), vector("z")
    m = schema_objects(Graph("main", [Op("ADD", [x, z], [y], ADD)], [x, y, z], [x], [y]))
    m.subgraphs[0].operators[0].inputs[1] = 1  # ADD(x, y) -> y
    data = packed(m)
    assert "op 0 (ADD) of subgraph 0 reads and writes tensor 1 'y'" in refusal(data)
    with pytest.raises(RuntimeError, match="Tensor 1 is both input 1 and output 0"):
        Interpreter(model_content=data).allocate_tensors()


def test_graph_inputs_and_variables_may_be_read_before_their_write() -> None:
    """A graph input lives for the whole run, so an op may read it before a later op writes it:
    file order gives that a defined result, and it loads."""
    x, y, z = vector("x"), vector("y"), vector("z")
    ops = [Op("NEG", [x], [y]), Op("RELU", [y], [x]), Op("ADD", [x, y], [z], ADD)]
    data = flatbuffer.to_bytes(Model([Graph("main", ops, [x, y, z], [x], [z])]))
    assert len(flatbuffer.from_bytes(data).main.ops) == 3
    np.testing.assert_allclose(run(data)[2], np.maximum(-XS[2], 0) - XS[2])
