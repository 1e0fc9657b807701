"""Where convert hands a stage's IR to the next instead of bytes, the next stage sees what the
parse of those bytes would give it (`flatbuffer.read_back`), and so makes the same model.

`describe` is strict: every field, the type of shapes and option values, the dtype of every
array, which tensors share one constant array, each tensor's producer and readers in order, and
the graphs' tensor-name counters (a rule naming a new tensor asks them). The models: a hostile
graph (a version below what its operands need, an op wired to a tensor the graph never
registered, readers out of file order, float64 scales and options, a shared constant, a list
shape), and the Coral oracle's int8 models through the two handovers convert makes: the
already-int8 route's I/O types to the int8 rules, and the int8 rules to `--runtime`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import SHARED, needs_oracle, oracle_models
from irgraphs import conv, unary

from tflfuse.convert.optimize import optimize_bytes
from tflfuse.convert.rule_sets import pipeline
from tflfuse.ir import Graph, Model, Op, Quantization, Tensor, flatbuffer
from tflfuse.quantize.quantize import aeq_unsupported, set_io_types
from tflfuse.rules.runtime import runtime_legalization
from tflfuse.targets import find, runtimes
from tflfuse.verification import verified


def _array(a: Any) -> Any:
    return None if a is None else (type(a).__name__, a.dtype.str, a.shape, a.tobytes())


def _quant(q: Quantization | None) -> Any:
    if q is None:
        return None
    vectors = (q.scale, q.zero_point, q.min, q.max)
    return (*[_array(v) for v in vectors], repr(q.axis), repr(q.details))


def describe(model: Model) -> list[Any]:
    """Everything a stage could read in `model`, with types, as comparable values."""
    out: list[Any] = [model.description, model.version, model.metadata, repr(model.extra)]
    for g in model.subgraphs:
        at = {t: i for i, t in enumerate(g.tensors)}
        pos = {op: i for i, op in enumerate(g.ops)}
        first: dict[int, int] = {}  # a constant array -> the first tensor holding it
        taken = g.tensors[0].name if g.tensors else ""
        out.append((g.name, repr(g.extra), g.unique_name(taken), g.unique_name(taken)))
        for t in g.tensors:
            out.append(
                (
                    t.name,
                    repr(t.shape),
                    t.dtype,
                    repr(t.shape_signature),
                    t.is_variable,
                    repr(t.extra),
                    _array(t.data),
                    None if t.data is None else first.setdefault(id(t.data), at[t]),
                    _quant(t.quantization),
                    pos.get(t.producer),
                    [pos.get(op) for op in t.consumers],
                )
            )
        for op in g.ops:
            out.append(
                (
                    op.type,
                    op.version,
                    op.custom_code,
                    op.custom_options,
                    op.options_type,
                    repr(op.options),
                    [t and at[t] for t in op.inputs],
                    [at[t] for t in op.outputs],
                    [at[t] for t in op.intermediates],
                    repr(op.extra),
                )
            )
        out.append(([at[t] for t in g.inputs], [at[t] for t in g.outputs]))
    for s in model.signatures:
        ts = model.subgraphs[s.subgraph].tensors
        out.append((s.key, s.subgraph, {k: ts.index(t) for k, t in s.inputs.items()}))
        out.append({k: ts.index(t) for k, t in s.outputs.items()})
    return out


def assert_read_back(model: Model) -> bytes:
    """`model`'s bytes, unchanged by `read_back`, which leaves `model` as their parse reads."""
    data = flatbuffer.to_bytes(model)
    flatbuffer.read_back(model)
    assert flatbuffer.to_bytes(model) == data
    assert describe(model) == describe(flatbuffer.from_bytes(data))
    return data


def hostile() -> Model:
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 3))
    c = conv(g, x, 4, name="c")
    c2 = conv(g, x, 4, name="c2")
    c2.inputs[1].data = c.inputs[1].data  # one constant array, two tensors
    y = unary(g, "RELU", c.outputs[0]).outputs[0]
    y.shape = [1, 8, 8, 4]  # a list: the loader reads tuples
    g.ops[-3:] = [g.ops[-1], g.ops[-3], g.ops[-2]]  # readers of c out of file order
    g.ops[0:3] = [g.ops[1], g.ops[2], g.ops[0]]
    q = g.add_tensor("q", (1, 8, 8, 4), "INT8")
    q.quantization = Quantization(np.array([0.1]), np.array([3], np.int32))  # float64, int32
    g.add_op("QUANTIZE", [y], [q])
    scaled = Quantization(np.array([0.1]), np.array([3]))
    leaky = g.add_tensor("leaky", (1, 8, 8, 4), "INT8", quantization=scaled)
    g.add_op("LEAKY_RELU", [q], [leaky], {"alpha": 0.1})  # alpha float64
    out = Tensor("out", (1, 8, 8, 4))  # never registered in g
    g.ops.append(Op("DEQUANTIZE", [leaky], [out]))
    for _ in range(3):
        g.add_tensor("x", (1,))  # the name counter moves on
    g.inputs, g.outputs = [x], [out, c2.outputs[0]]
    model = Model([g])  # (not validated: `out` is not registered)
    assert max(op.version for op in g.ops) == 1
    return model


def test_read_back_leaves_a_rewritten_model_as_its_parse() -> None:
    model = hostile()
    assert_read_back(model)
    assert [op.version for op in model.main.ops if op.type == "DEQUANTIZE"] == [2]


INT8 = [p for p in oracle_models(compiled=False) if "quant" in p.name or "ptq" in p.name]


@needs_oracle()
@pytest.mark.parametrize("path", INT8, ids=lambda p: p.stem)
@pytest.mark.parametrize("target", ["edgetpu", "xnnpack"])
def test_the_stages_after_a_handover_make_what_they_make_on_the_parse(path, target) -> None:
    """The already-int8 route's I/O types, then the int8 rules, then a runtime's legalization
    (tflite-runtime 2.5.0): each stage given the IR the one before left makes the bytes, the
    rule events and the runtime check it makes given the parse of that stage's bytes."""
    model = flatbuffer.load(path)
    set_io_types(model, "float32", "uint8")
    data = assert_read_back(model)
    chosen = find(target)
    assert chosen is not None
    rules = pipeline(2, chosen, quantized=True) or pipeline(2, chosen)
    handed = verified.apply(data, lambda: [rules], model=model)
    parsed = verified.apply(data, lambda: [rules])
    assert handed.data == parsed.data
    assert repr(handed.result.events) == repr(parsed.result.events)
    data = assert_read_back(handed.model)
    edgetpu = find("edgetpu")  # (legalize counts its mapped ops on the IR it hands on)
    assert edgetpu.predict(handed.model).mapped == edgetpu.predict(parsed.model).mapped
    runtime = runtimes.resolve("tflite-runtime==2.5.0")
    stages = [runtime_legalization(runtime)]
    lowered = verified.apply(data, lambda: stages, model=handed.model)
    again = verified.apply(data, lambda: stages)
    assert lowered.data == again.data
    assert lowered.result.fired() == again.result.fired()
    a, b = runtimes.check(lowered.model, runtime), runtimes.check(again.model, runtime)
    assert (a.runtime_ok, a.runtime_ok or a.refusal()) == (
        b.runtime_ok,
        b.runtime_ok or b.refusal(),
    )


FLOAT = [p for p in (SHARED / "models" / "pytorch").glob("encoder.tflite")] + [
    p for p in oracle_models(compiled=False) if p.stem == "split_concat"
]


@pytest.mark.parametrize("path", FLOAT, ids=lambda p: p.stem)
def test_the_fused_float_model_is_handed_to_quantize_as_parsed(path) -> None:
    """`fuse` hands its IR to `quantize`, which reads it (the ops litert-quantizer lacks, the
    signature), and on a float recipe to `--runtime`, which rewrites it: after `read_back` it is
    the parse of the fused model's bytes, and the runtime's legalization makes the same model."""
    fused = optimize_bytes(path.read_bytes(), target="xnnpack", verify=False)
    assert_read_back(fused.model)
    assert aeq_unsupported(fused.data, fused.model) == aeq_unsupported(fused.data)
    stages = [runtime_legalization(runtimes.resolve("tflite-runtime==2.5.0"))]
    lowered = verified.apply(fused.data, lambda: stages, model=fused.model)
    again = verified.apply(fused.data, lambda: stages)
    assert (lowered.data, lowered.result.fired()) == (again.data, again.result.fired())
