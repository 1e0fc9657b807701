"""Every op tflfuse writes carries the version its operand types need (issue 26).

litert-quantizer writes version 1 for every op, and rules make new ops; the writer raises each op
to what `GetBuiltinOperatorVersion` (op_version.cc) gives it, from `[versions]` in
`delegates/runtimes.toml` (`tflfuse.ir.op_versions`). Here: the builtins tflfuse emits, collected
from the rules, legalizations and int8 stages (the op types their code builds and the ones their
patterns rewrite), are each written in a float and an int8 form, and each comes back at the
version the table gives, one the table's releases know and the installed interpreter resolves.
The table itself is checked against the TensorFlow Lite converter: on every converter-made model
in ../shared it gives the version the converter wrote, or less (never more).
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from tflfuse.convert.rule_sets import pipeline
from tflfuse.ir import Graph, Model, Quantization, flatbuffer
from tflfuse.ir.flatbuffer import OP_CODES
from tflfuse.ir.op_versions import known, required
from tflfuse.rules.runtime import runtime_legalization
from tflfuse.targets import TARGETS, runtimes
from tflfuse.targets import target as target_named

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
# where tflfuse makes or edits ops: rules, the Edge TPU legalizations, quantize and completion
EMITTERS = (
    *sorted((ROOT / "tflfuse" / "rules").glob("*.py")),
    *sorted((ROOT / "tflfuse" / "targets" / "edgetpu").glob("*.py")),
    ROOT / "tflfuse" / "quantize" / "quantize.py",
    ROOT / "tflfuse" / "quantize" / "int8_completion.py",
)
BUILDS = ("op", "add_op", "split", "_replace")  # calls that take an op type as a string


def built_in_source(path: Path) -> set[str]:
    """Op types the file's code builds: `b.MUL(...)`, `b.op("RELU", ...)`, `add_op("PAD", ...)`,
    and the values of its tables of op types (an activation's op)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in OP_CODES:
                found.add(name)
            if name in BUILDS:
                found |= {a.value for a in node.args[:2] if isinstance(a, ast.Constant)}
        if isinstance(node, ast.Dict):
            found |= {v.value for v in node.values if isinstance(v, ast.Constant)}
    return {t for t in found if isinstance(t, str) and t in OP_CODES and t != "CUSTOM"}


def rewritten_by_rules() -> set[str]:
    """The op types every pipeline's rules match at their root (ops they edit in place)."""
    passes = [p for t in TARGETS for level in (1, 2) for p in pipeline(level, target_named(t))]
    passes += [p for t in TARGETS for p in pipeline(2, target_named(t), quantized=True)]
    passes += list(runtime_legalization(runtimes.resolve("tflite-runtime==2.5.0")))
    return {t for p in passes if hasattr(p, "compiled") for t in p.compiled().types}


def emitted() -> list[str]:
    found = set().union(*(built_in_source(p) for p in EMITTERS)) | rewritten_by_rules()
    return sorted(t for t in found if t in OP_CODES and t != "CUSTOM")


EMITTED = emitted()


def test_the_collection_finds_what_the_rules_are_known_to_make() -> None:
    assert {"GELU", "HARD_SWISH", "MUL", "ADD", "CONV_2D", "TRANSPOSE_CONV", "PRELU"} <= set(
        EMITTED
    ), EMITTED
    assert {"RELU6", "DEPTH_TO_SPACE", "QUANTIZE", "AVERAGE_POOL_2D"} <= set(EMITTED)


def test_every_builtin_tflfuse_emits_is_in_the_version_table() -> None:
    missing = [op for op in EMITTED if op not in known()]
    assert not missing, (
        f"add these to OP_VERSIONS/ALWAYS_1 (benchmarks/runtimes_data.py): {missing}"
    )


# -- one op of each type, float and int8 ----------------------------------------------------------
def _q(scale: float = 0.05, zero: int = 0, channels: int = 1) -> Quantization:
    return Quantization(np.full(channels, scale, np.float32), np.full(channels, zero, np.int64))


def one_op(op_type: str, int8: bool) -> Model:
    """A graph holding one `op_type` op whose operands are float32, or int8 with scales (the
    shapes are plausible, the op need not run: only its operand types are read)."""
    g = Graph("main")
    dtype = "INT8" if int8 else "FLOAT32"
    quant = _q() if int8 else None
    x = g.add_tensor("x", (1, 4, 4, 4), dtype, quantization=quant)
    y = g.add_tensor("y", (1, 4, 4, 4), dtype, quantization=_q(0.04, 3) if int8 else None)
    w_data = np.ones((4, 1, 1, 4), np.int8 if int8 else np.float32)
    w = g.add_constant("w", w_data, dtype, _q(0.01, 0, 4) if int8 else None)
    if op_type == "QUANTIZE":
        x = g.add_tensor("xf", (1, 4, 4, 4))
    if op_type == "DEQUANTIZE":
        x = g.add_tensor("xq", (1, 4, 4, 4), "INT8", quantization=_q())
        y = g.add_tensor("yf", (1, 4, 4, 4))
    if op_type in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
        bias = g.add_constant("b", np.zeros(4, np.int32 if int8 else np.float32))
        inputs = [x, w, bias]
    elif op_type == "TRANSPOSE_CONV":
        inputs = [g.add_constant("shape", np.array([1, 4, 4, 4], np.int32)), w, x]
    elif op_type == "SPLIT":
        inputs = [g.add_constant("axis", np.array(3, np.int32)), x]
    elif op_type in ("MUL", "ADD", "SUB", "DIV", "SQUARED_DIFFERENCE", "PRELU", "MAXIMUM"):
        inputs = [x, g.add_tensor("x2", (1, 4, 4, 4), dtype, quantization=quant)]
    else:
        inputs = [x]
    g.add_op(op_type, inputs, [y])
    g.inputs, g.outputs = [t for t in inputs if not t.is_constant], [y]
    return Model([g])


@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
def test_every_emitted_builtin_is_written_at_the_version_its_operands_need(int8: bool) -> None:
    litert = runtimes.resolve("ai-edge-litert==2.3.0")  # the interpreter installed here
    table = runtimes.table()
    for op_type in EMITTED:
        model = one_op(op_type, int8)
        model.main.ops[0].version = 1  # as litert-quantizer labels every op
        need = required(model.main.ops[0])
        written = flatbuffer.from_bytes(flatbuffer.to_bytes(model)).main.ops[0].version
        assert written == need, (op_type, int8, written, need)
        assert need <= len(table.since.get(op_type, [])), (op_type, need, "unknown version")
        assert need in litert.versions.get(op_type, ()), (op_type, need, "not registered")
        float_need = required(one_op(op_type, False).main.ops[0])
        assert need >= float_need, (op_type, need, float_need)
        # `tflfuse check` reads it as written: no "the file says vN" left
        assert all(not n.declared for n in runtimes.needs(flatbuffer.from_bytes(
            flatbuffer.to_bytes(model)))), op_type  # fmt: skip


def test_the_int8_versions_of_the_usual_ops_are_the_converters() -> None:
    """What the stock converter writes for these int8 ops (its MobileNet and the zoo's)."""
    expected = {"CONV_2D": 3, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 4, "ADD": 2, "MUL": 2,
                "GELU": 2, "SOFTMAX": 2, "MEAN": 2, "RELU6": 2, "AVERAGE_POOL_2D": 2,
                "HARD_SWISH": 1, "RESHAPE": 1, "QUANTIZE": 1}  # fmt: skip
    got = {op: required(one_op(op, True).main.ops[0]) for op in expected}
    assert got == expected


def test_a_version_an_op_already_carries_is_never_lowered() -> None:
    model = one_op("RESIZE_NEAREST_NEIGHBOR", True)
    model.main.ops[0].version = 3  # half_pixel_centers, as the converter wrote it
    assert flatbuffer.from_bytes(flatbuffer.to_bytes(model)).main.ops[0].version == 3


def converter_models() -> list[Path]:
    if not SHARED.is_dir():
        return []
    return [p for p in sorted(SHARED.rglob("*.tflite")) if "_edgetpu" not in p.name]


@pytest.mark.skipif(not converter_models(), reason="needs ../shared (the oracle models)")
def test_the_table_never_asks_more_than_the_converter_wrote() -> None:
    """On the models of ../shared that a TensorFlow Lite converter wrote (Coral's zoo, public
    Coral projects, litert-torch exports), `required` equals the version field or is below it
    (an older converter's extra features); the hand-made LibrEdgeTPU templates label int8
    ops v1 and are left out."""
    equal = total = 0
    for path in converter_models():
        if "LibrEdgeTPU" in str(path):
            continue
        try:
            model = flatbuffer.load(path)
        except Exception:  # hostile or corrupt files: not the question here
            continue
        for graph in model.subgraphs:
            for op in graph.ops:
                if op.type == "CUSTOM":
                    continue
                total += 1
                equal += required(op) == op.version
                assert required(op) <= op.version, (path.name, op.type, op.version)
    assert total > 500 and equal / total > 0.95, (equal, total)
