"""Fuzz the loader with mutated real models: every case is a clean ModelError or a valid graph that
saves again — never another exception, never a hang — and the loader keeps its contract with the
interpreter (`tflfuse.ir.flatbuffer.from_bytes`), checked against the installed ai-edge-litert."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import SHARED, oracle_models, wheel_models
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from irgraphs import conv, fully_connected, model_of, unary
from litert_oracle import Litert

from tflfuse.errors import ModelError
from tflfuse.ir import Graph, flatbuffer

CASE_SECONDS = 20

# Files written by 2019-era (TF 1.x) converters: empty mutating-variable vectors, no signature defs,
# only the deprecated 8-bit op codes. inat_bird is the one a strict loader once called corrupt.
CONVERTER_ERA = (
    SHARED / "oracle" / "edgetpu" / "mobilenet_v1_0.25_128_quant.tflite",
    SHARED
    / "oracle"
    / "edgetpu-more"
    / "google-coral__tflite"
    / "python__examples__classification__models__mobilenet_v2_1.0_224_inat_bird_quant"
    / "mobilenet_v2_1.0_224_inat_bird_quant.tflite",
)


def tiny_model() -> bytes:
    g = Graph("main")
    x = g.add_tensor("x", (1, 4, 4, 2))
    c = conv(g, x, 3)
    r = unary(g, "RELU6", c.output)
    flat = g.add_tensor("flat", (1, 48))
    shape = g.add_constant("shape", np.array([1, 48], "int32"))
    g.add_op("RESHAPE", [r.output, shape], [flat], {"new_shape": [1, 48]})
    fc = fully_connected(g, flat, 5)
    return flatbuffer.to_bytes(model_of(g, [x], [fc.output]))


def seeds() -> dict[str, bytes]:
    out = {"tiny": tiny_model()}
    for path in oracle_models(compiled=False):
        if path.stat().st_size < 20_000:
            out[path.stem] = path.read_bytes()
    for path in CONVERTER_ERA:
        if path.is_file():
            out[path.stem] = path.read_bytes()
    wake = wheel_models("pymicro-wakeword")
    if wake:
        out[wake[0].stem] = wake[0].read_bytes()
    return out


SEEDS = seeds()


class Case:
    """A mutated model, shown in a failure report as its seed and the steps that made it (its
    bytes would fill the screen)."""

    def __init__(self, seed: str, steps: tuple[str, ...], data: bytes) -> None:
        self.seed, self.steps, self.data = seed, steps, data

    def __repr__(self) -> str:
        return f"Case({self.seed!r}, {list(self.steps)!r}, <{len(self.data)} bytes>)"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # hypothesis's printer
        printer.text(repr(self))


@st.composite
def mutated(draw: st.DrawFn) -> Case:
    """A seed's bytes with 1-8 byte-level mutations: bit flips, bytes and 32-bit words set,
    truncation, duplicated runs."""
    name = draw(st.sampled_from(sorted(SEEDS)))
    data = bytearray(SEEDS[name])
    steps = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "set", "int", "cut", "dup"]))
        at = draw(st.integers(0, len(data) - 1)) if data else 0
        if kind == "flip" and data:
            bit = draw(st.integers(0, 7))
            data[at] ^= 1 << bit
            steps.append(f"flip bit {bit} of byte {at}")
        elif kind == "set" and data:
            data[at] = draw(st.integers(0, 255))
            steps.append(f"byte {at} = {data[at]}")
        elif kind == "int" and len(data) > at + 4:  # offsets and lengths are 32-bit words
            word = draw(st.sampled_from([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000, len(data)]))
            data[at : at + 4] = word.to_bytes(4, "little")
            steps.append(f"word at {at} = {word:#x}")
        elif kind == "cut":
            data = data[: draw(st.integers(0, len(data)))]
            steps.append(f"cut to {len(data)} bytes")
        elif kind == "dup" and data:
            end = min(len(data), at + draw(st.integers(1, 64)))
            data[at:at] = data[at:end]
            steps.append(f"repeat bytes {at}..{end}")
    return Case(name, tuple(steps), bytes(data))


class HangError(Exception):
    pass


def _alarm(signum, frame):  # pragma: no cover - only on a hang
    raise HangError()


def load_or_clean_error(data: bytes) -> None:
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        try:
            model = flatbuffer.from_bytes(data, "fuzz.tflite")
        except ModelError as exc:
            assert str(exc).startswith("fuzz.tflite: ")
            assert "\n" not in str(exc)
            return
        model.validate()
        flatbuffer.from_bytes(flatbuffer.to_bytes(model))  # a valid graph saves and reloads
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_models_load_cleanly_or_fail_cleanly(case: Case) -> None:
    load_or_clean_error(case.data)


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_every_truncation_of_a_seed_is_handled(name: str) -> None:
    data = SEEDS[name]
    step = max(1, len(data) // 200)
    for end in range(0, len(data), step):
        load_or_clean_error(data[:end])


def test_seeds_are_valid_models() -> None:
    for data in SEEDS.values():
        flatbuffer.from_bytes(data).validate()


def test_seeds_include_converter_era_models() -> None:
    if not all(p.is_file() for p in CONVERTER_ERA):
        pytest.skip("../shared/oracle is absent")
    assert {p.stem for p in CONVERTER_ERA} <= set(SEEDS)
    inat = SEEDS[CONVERTER_ERA[1].stem]
    # what makes it converter-era: the schema objects carry empty mutating-variable vectors
    model_t = flatbuffer.flatbuffer_utils.convert_bytearray_to_object(bytearray(inat))
    vectors = [op.mutatingVariableInputs for op in model_t.subgraphs[0].operators]
    assert any(v is not None and len(v) == 0 for v in vectors)
    assert not model_t.signatureDefs


def test_fuzz_covers_more_than_the_tiny_model() -> None:
    if not oracle_models() and not wheel_models("pymicro-wakeword"):
        pytest.skip("no real models available here")
    assert len(SEEDS) >= 2


# -- the loader's contract with the interpreter (tflfuse.ir.flatbuffer.from_bytes, points 1, 2, 4)
# ---- What the interpreter says when it refuses a model tflfuse loads: each is a check that belongs
# to running a model, not reading it (point 4). A message outside this list, on a model tflfuse
# loads, is a contract break to decide, not noise.
LAXER = re.compile(
    "|".join(
        (
            r"not a valid Flatbuffer buffer",  # the verifier; the object API reads what it can
            r"schema version",  # carried through untouched
            r"is invalidly specified in schema",  # a constant buffer shorter than its shape
            r"invalid quantization parameters",  # scale / zero-point counts, quantized dimension
            r"variable tensor with buffer",
            r"Did not get tensors in subgraph",  # no tensor vector: loads as an empty subgraph
            r"Didn't find op for builtin opcode",  # an op version this interpreter lacks
            r"unresolved custom op",
            r"Missing exported method name",  # a signature without a key
            r"codec can't decode",  # a name that is not UTF-8 (the loader keeps its bytes)
            r"failed to prepare|failed to invoke",  # a kernel or a delegate
            r"XNNPACK|XNNPack",
            r"lacks data|Tensor data is null",  # a tensor nothing writes, read or output
            r"No buffers in the model",  # no buffer table: loads when no tensor names a buffer
        )
    )
)
# What the interpreter says about the structure the loader checks itself (point 2): on a model
# tflfuse loads, none of it may appear.
STRUCTURAL = re.compile(
    r"Invalid tensor index -?\d+ in |inconsistent model|is both input \d+ and output"
    r"|Invalid subgraph index|exceeds max tensor index|tensor_index < context_.tensors_size"
)
# Point 1: what the interpreter may run but gives no defined result; each is checked on the file.
UNDEFINED_REASONS = (
    "has no defined result",
    "one lifetime per tensor",
    "reads and writes tensor",
    "reaches a kernel's scratch tensor",
)


@pytest.fixture(scope="module")
def litert() -> Iterator[Litert]:
    pytest.importorskip("ai_edge_litert")
    oracle = Litert(timeout=CASE_SECONDS)
    yield oracle
    oracle.close()


def file_order_breaks(data: bytes) -> bool:
    """Read from the schema objects, without tflfuse: does some op read a tensor that a later op
    writes (not a graph input, not a variable) or that it writes itself, or is some tensor written
    twice?"""
    model_t = flatbuffer.flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    for sg in model_t.subgraphs or []:
        tensors = sg.tensors or []
        first_reader_may_precede = set(_ints(sg.inputs)) | {
            i for i, t in enumerate(tensors) if t.isVariable
        }
        writer: dict[int, int] = {}
        for k, op in enumerate(sg.operators or []):
            for i in _ints(op.outputs):
                if i in writer:
                    return True
                writer[i] = k
        for k, op in enumerate(sg.operators or []):
            if set(_ints(op.inputs)) & set(_ints(op.outputs)):
                return True
            for i in _ints(op.inputs):
                if writer.get(i, -1) > k and i not in first_reader_may_precede:
                    return True
    return False


def names_a_missing_tensor(data: bytes) -> bool:
    """Read from the schema objects: does a signature name a tensor its subgraph does not have?"""
    model_t = flatbuffer.flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    for sig in model_t.signatureDefs or []:
        if sig.subgraphIndex < len(model_t.subgraphs or []):
            count = len(model_t.subgraphs[sig.subgraphIndex].tensors or [])
            maps = (sig.inputs or []) + (sig.outputs or [])
            if any(t.tensorIndex >= count for t in maps):
                return True
    return False


def _ints(values: Any) -> list[int]:
    return [] if values is None else [int(v) for v in values]


def holds_to_the_contract(data: bytes, litert: Litert) -> None:
    """tflfuse refuses only what the interpreter cannot run (naming the tensor index it names) or
    what file order leaves undefined; where it loads what the interpreter refuses, the reason is a
    running-time check (LAXER), never the structure the loader checks itself."""
    try:
        flatbuffer.from_bytes(data, "fuzz.tflite")
    except ModelError as exc:
        reason = str(exc)
        assert reason.startswith("fuzz.tflite: ") and "\n" not in reason
        if any(words in reason for words in UNDEFINED_REASONS):  # point 1
            assert file_order_breaks(data) or names_a_missing_tensor(data), reason
            return
        verdict = litert.run(data)  # point 2
        assert verdict.refuses, f"tflfuse refused ({reason}); the interpreter: {verdict}"
        index = re.search(r"invalid tensor index (-?\d+) in", reason)
        named = re.findall(r"Invalid tensor index (-?\d+) in", verdict.message)
        if index and named and index[1] != "-1":  # the builder passes -1 (the API refuses it)
            assert index[1] in named, (reason, verdict)
        return
    verdict = litert.run(data)  # point 4
    if verdict.stage in ("ok", "io", "crashed", "hung"):
        return  # a kernel that crashes or loops on a model is the runtime's, not the reader's
    assert not STRUCTURAL.search(verdict.message), verdict
    assert LAXER.search(verdict.message), verdict


REWIRINGS = (
    "op input",
    "op output",
    "alias",
    "graph input",
    "graph output",
    "swap ops",
    "signature",
    "intermediates",
    "metadata",
)


@st.composite
def rewired(draw: st.DrawFn) -> Case:
    """A seed whose wiring is changed in the schema objects and packed again: tensor indices of
    ops, subgraphs, signatures and intermediates, op order, metadata buffers. These pass the
    flatbuffer verifier, so the interpreter's own checks decide."""
    name = draw(st.sampled_from(sorted(SEEDS)))
    m = flatbuffer.flatbuffer_utils.convert_bytearray_to_object(bytearray(SEEDS[name]))
    steps = []
    for _ in range(draw(st.integers(1, 3))):
        g = draw(st.integers(0, len(m.subgraphs) - 1))
        sg = m.subgraphs[g]
        ops, n = sg.operators or [], len(sg.tensors or [])
        index = st.integers(-2, n + 2)
        kind = draw(st.sampled_from(REWIRINGS))
        k = draw(st.integers(0, len(ops) - 1)) if ops else None
        op = ops[k] if k is not None else None
        where = f"subgraph {g} op {k}"
        if kind in ("op input", "op output", "alias") and op is not None:
            vector = op.inputs if kind == "op input" else op.outputs
            if vector is None or not len(vector):
                continue
            used = sorted({i for o in ops for i in _ints(o.inputs) + _ints(o.outputs) if i >= 0})
            value = draw(st.sampled_from(used) if kind == "alias" else index)
            at = draw(st.integers(0, len(vector) - 1))
            vector[at] = value
            steps.append(f"{where} {'input' if kind == 'op input' else 'output'} {at} = {value}")
        elif kind in ("graph input", "graph output"):
            vector = sg.inputs if kind == "graph input" else sg.outputs
            if vector is not None and len(vector):
                at, value = draw(st.integers(0, len(vector) - 1)), draw(index)
                vector[at] = value
                steps.append(f"subgraph {g} {kind.split()[1]} {at} = {value}")
        elif kind == "swap ops" and len(ops) > 1:
            a, b = draw(st.integers(0, len(ops) - 1)), draw(st.integers(0, len(ops) - 1))
            ops[a], ops[b] = ops[b], ops[a]
            steps.append(f"subgraph {g} ops {a} <-> {b}")
        elif kind == "signature" and m.signatureDefs:
            sig = draw(st.sampled_from(m.signatureDefs))
            maps = (sig.inputs or []) + (sig.outputs or [])
            if maps and draw(st.booleans()):
                entry, value = draw(st.sampled_from(maps)), draw(st.integers(0, n + 2))
                entry.tensorIndex = value
                steps.append(f"signature tensor {entry.name!r} = {value}")
            else:
                sig.subgraphIndex = draw(st.integers(0, len(m.subgraphs) + 1))
                steps.append(f"signature subgraph = {sig.subgraphIndex}")
        elif kind == "intermediates" and op is not None:
            value = draw(index)
            op.intermediates = np.array([value], dtype=np.int32)
            steps.append(f"{where} intermediates = [{value}]")
        elif kind == "metadata" and m.metadata:
            entry = draw(st.sampled_from(m.metadata))
            entry.buffer = draw(st.integers(0, len(m.buffers) + 2))
            steps.append(f"metadata {entry.name!r} buffer = {entry.buffer}")
    data = bytes(flatbuffer.flatbuffer_utils.convert_object_to_bytearray(m))
    return Case(name, tuple(steps), data)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=mutated())
def test_mutated_bytes_keep_the_contract_with_the_interpreter(litert: Litert, case: Case) -> None:
    holds_to_the_contract(case.data, litert)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=rewired())
def test_rewired_models_keep_the_contract_with_the_interpreter(litert: Litert, case: Case) -> None:
    holds_to_the_contract(case.data, litert)
