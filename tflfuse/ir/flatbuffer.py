""".tflite bytes <-> `tflfuse.ir.Model`: the only module that touches the flatbuffer schema.

Reading goes through the schema object API and `flatbuffer_utils` shipped in ai-edge-litert (a
dependency; no TensorFlow below the sources), so buffers stored by offset and large custom options
are resolved by the library that defines them. Writing packs a `ModelT` and aligns every constant
buffer to 16 bytes, as the TFLite converter does. Models whose constants do not fit in a 2 GiB
flatbuffer are written with buffers stored by offset after the flatbuffer.

Reading has two stages, and a failure says which one failed. Unpacking the bytes into the schema
objects (and resolving buffers stored by offset) is parsing: anything wrong there, or an index or
type code that points nowhere, becomes a `ModelError` naming the file: a corrupt model is user
input, not a bug, and must never surface as a traceback. Turning the unpacked objects into the IR is
tflfuse's own code: an unexpected exception there is a tflfuse bug and surfaces as `LoaderBugError`
(naming the step and the exception), never as "corrupt file", so a bug cannot hide behind the user's
file. Which files load is a contract with the interpreter, written out in `from_bytes`: what it
runs loads, except a graph whose file order gives it no defined result.
"""

from __future__ import annotations

import functools
import itertools
import re
import struct
import sys
from pathlib import Path
from typing import Any

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema  # the one place the schema comes from
from ai_edge_litert.tools import flatbuffer_utils

from tflfuse.errors import LoaderBugError, ModelError
from tflfuse.files import atomic_write_bytes
from tflfuse.ir.graph import (
    NUMPY_DTYPES,
    Graph,
    IRError,
    Model,
    Op,
    Quantization,
    Signature,
    Tensor,
)
from tflfuse.ir.op_versions import required

FILE_IDENTIFIER = b"TFL3"
_FLATBUFFER_LIMIT = 2**31 - 2**24  # leave room for the non-buffer part of the model
_BUFFER_ALIGNMENT = 16
_ENUM_FIELDS = {"fusedActivationFunction": "activation", "padding": "padding"}


# -- schema enums as name tables ---------------------------------------------------------------
def _enum(cls: type) -> dict[int, str]:
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


OP_NAMES = _enum(schema.BuiltinOperator)
OP_CODES = {v: k for k, v in OP_NAMES.items()}
TYPE_NAMES = _enum(schema.TensorType)
TYPE_CODES = {v: k for k, v in TYPE_NAMES.items()}
_OPTIONS_NAMES = _enum(schema.BuiltinOptions)
_OPTIONS2_NAMES = _enum(schema.BuiltinOptions2)
_ENUMS = {
    "activation": _enum(schema.ActivationFunctionType),
    "padding": _enum(schema.Padding),
}
_ENUM_CODES = {kind: {v: k for k, v in table.items()} for kind, table in _ENUMS.items()}

# Ops whose options table is not simply CamelCase(op name) + "Options".
_OPTIONS_FOR_OP = {
    "AVERAGE_POOL_2D": "Pool2DOptions",
    "MAX_POOL_2D": "Pool2DOptions",
    "L2_POOL_2D": "Pool2DOptions",
    "MEAN": "ReducerOptions",
    "SUM": "ReducerOptions",
    "REDUCE_MAX": "ReducerOptions",
    "REDUCE_MIN": "ReducerOptions",
    "REDUCE_PROD": "ReducerOptions",
    "REDUCE_ANY": "ReducerOptions",
    "MAXIMUM": "MaximumMinimumOptions",
    "MINIMUM": "MaximumMinimumOptions",
    "CONCATENATION": "ConcatenationOptions",
    "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
    "CONV_2D": "Conv2DOptions",
    "CONV_3D": "Conv3DOptions",
    "L2_NORMALIZATION": "L2NormOptions",
    "SELECT_V2": "SelectV2Options",
    "BATCH_MATMUL": "BatchMatMulOptions",
    "PADV2": "PadV2Options",
}


def options_type_for(op_type: str) -> str | None:
    """The BuiltinOptions table an op of this type carries, or None if it takes none."""
    if op_type in _OPTIONS_FOR_OP:
        return _OPTIONS_FOR_OP[op_type]
    camel = "".join(part.capitalize() for part in op_type.split("_")) + "Options"
    return camel if camel in _OPTIONS_NAMES.values() else None


@functools.cache
def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


@functools.cache
def _camel_fields(cls: type) -> dict[str, str]:
    """snake_case -> camelCase attribute names of one options class."""
    return {_snake(k): k for k in vars(cls())}


def _options_to_dict(obj: Any) -> dict[str, Any]:
    out = {}
    for key, value in vars(obj).items():
        kind = _ENUM_FIELDS.get(key)
        if kind is not None and value in _ENUMS[kind]:
            value = _ENUMS[kind][value]
        elif isinstance(value, np.ndarray):
            value = value.tolist()
        out[_snake(key)] = value
    return out


def _options_from_dict(options_type: str, values: dict[str, Any]) -> Any:
    cls = getattr(schema, options_type + "T", None)
    if cls is None:
        raise IRError(f"unknown options table {options_type!r}")
    obj = cls()
    fields = _camel_fields(cls)
    for key, value in values.items():
        attr = fields.get(key)
        if attr is None:
            raise IRError(f"{options_type} has no field {key!r}")
        kind = _ENUM_FIELDS.get(attr)
        if kind is not None and isinstance(value, str):
            value = _ENUM_CODES[kind][value]
        setattr(obj, attr, value)
    return obj


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else value.decode("utf-8", "surrogateescape")


def _utf8(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


# -- reading -----------------------------------------------------------------------------------
def read_model_bytes(path: str | Path) -> bytes:
    """The bytes of a model file; a missing, unreadable or directory path raises ModelError."""
    p = Path(path)
    try:
        if not p.exists():
            raise ModelError(p, "no such file")
        if p.is_dir():
            raise ModelError(p, "is a directory, not a .tflite file")
        if not p.is_file():  # a FIFO would block the read forever, /dev/zero never end it
            raise ModelError(p, "not a regular file (a FIFO, device or socket)")
        return p.read_bytes()
    except OSError as exc:
        raise ModelError(p, f"cannot read: {exc.strerror or exc}") from None


def load(path: str | Path) -> Model:
    """Read a .tflite file into a Model; any problem with the file raises ModelError."""
    return from_bytes(read_model_bytes(path), source=path)


def from_bytes(data: bytes | bytearray, source: str | Path = "<bytes>") -> Model:
    """Parse .tflite bytes into a Model.

    Corrupt or foreign bytes raise ModelError; a failure inside tflfuse's own conversion of a
    well-formed file raises LoaderBugError (a bug to report, not a problem with the file).

    What loads is what the interpreter runs (ai-edge-litert 2.3; the LiteRT sources behind each
    point are tflite/core/interpreter_builder.cc, tflite/core/subgraph.cc and
    tflite/arena_planner.cc, the same at v2.2.0 and at f6745779):

    1. Every model the interpreter builds, allocates and runs loads, except where what it runs
       has no defined result. The interpreter runs ops in file order ("Invocations are always
       done in node order"; it never sorts them) and plans one arena lifetime per tensor, from its
       first writer to its last reader. So tflfuse refuses, naming the ops,
       - an op that reads a tensor a later op writes (unless it is a graph input or a variable):
         the built-in kernels read the previous invoke's value or uninitialized memory there,
         and XNNPACK, which orders by data flow, computes another;
       - an op that reads the tensor it writes: the builder refuses that for an op with
         parameters ("Tensor i is both input and output") and runs any other in place, where the
         result depends on the order its kernel reads and writes;
       - a tensor written twice (by two ops, or twice by one): after the tensor's last read its
         memory belongs to another tensor, which a second write overwrites;
       - a signature naming a tensor the file does not have: its runner refuses it, unless the
         index reaches a scratch tensor a kernel added at run time (an LSTM adds six).
    2. Everything else tflfuse refuses, the interpreter refuses too, and the message says what it
       says: bytes the flatbuffer parser cannot read, an unknown op or tensor type code, an opcode
       or buffer index out of range (it fails to build); a tensor index out of range among an op's
       or a subgraph's inputs or outputs (the builder reports "Invalid tensor index", marks the
       subgraph inconsistent and refuses to allocate or run it; tflfuse refuses the file even when
       nothing runs that subgraph). -1 is an omitted optional op input; the builder lets it pass
       among a subgraph's inputs and outputs and an op's outputs too, but no kernel writes and no
       API feeds or reads it there, so tflfuse refuses it. A signature naming a subgraph the model
       does not have is refused as its runner refuses it; an intermediate index out of range on
       an LSTM op, as its kernels read intermediates.
    3. Where the interpreter never looks, neither does tflfuse: a tensor naming buffer 0 has no
       data, whatever that buffer holds; an intermediate index out of range on any op but an LSTM
       is dropped (the builder does not check intermediates and no other kernel reads them); a
       metadata entry whose buffer does not exist reads as empty (the builder skips it).
    4. tflfuse is laxer where a check belongs to running a model rather than reading it: kernel
       and delegate preparation (shapes, operand counts, quantization a kernel cannot take), a
       tensor nothing writes ("lacks data" at invoke), and the builder's checks of values the IR
       carries through untouched (the flatbuffer verifier, the schema version, a constant buffer
       shorter than its shape, scale and zero-point counts, a variable with a buffer, a model
       without a buffer table, an op version or custom op this interpreter lacks). convert and
       optimize run the interpreter on what they load.

    tests/test_fuzz_loader.py checks points 1, 2 and 4 against the installed interpreter on mutated
    real models, under random seeds; tests/test_loader_contract.py shows every point on a tiny
    model, with what the interpreter does.
    """
    if len(data) == 0:
        raise ModelError(source, "file is empty")
    if len(data) < 8:
        raise ModelError(source, f"file is truncated ({len(data)} bytes)")
    ident = bytes(data[4:8])
    if ident != FILE_IDENTIFIER:
        raise ModelError(
            source, f"not a TFLite model (file identifier {ident!r}, expected {FILE_IDENTIFIER!r})"
        )
    try:
        model_t = _unpack(bytearray(data))
    except _CorruptError as exc:
        raise ModelError(source, f"not a valid TFLite model: {exc}") from None
    except Exception as exc:  # the bytes are untrusted input: any parser failure is theirs
        raise ModelError(source, f"not a valid TFLite model ({_describe(exc)})") from None
    try:
        model = _model_from_object(model_t)
        model.validate()
    except (IRError, _CorruptError) as exc:
        raise ModelError(source, f"not a valid TFLite model: {exc}") from None
    except Exception as exc:
        raise LoaderBugError(source, _where(exc), exc) from exc
    return model


def _unpack(data: bytearray) -> Any:
    """The schema object tree of the bytes, buffers and custom options stored by offset read in.

    This is `flatbuffer_utils.read_model_from_bytearray` without its buffer compaction, which
    indexes a table of buffers that real models may leave empty (a graph without constants) and
    turns every index into a numpy scalar; tflfuse renumbers buffers itself when it writes.
    """
    model_t = flatbuffer_utils.convert_bytearray_to_object(data)
    if sys.byteorder == "big":  # pragma: no cover - no big-endian machine runs the tests
        flatbuffer_utils.byte_swap_tflite_model_obj(model_t, "little", "big")
    for i, buffer in enumerate(_seq(model_t.buffers)):
        if buffer.offset:
            buffer.data = _slice(data, buffer.offset, buffer.size, f"buffer {i}")
            buffer.offset = buffer.size = 0
    for sg in _seq(model_t.subgraphs):
        for op in _seq(sg.operators):
            if op.largeCustomOptionsOffset:
                op.customOptions = _slice(
                    data, op.largeCustomOptionsOffset, op.largeCustomOptionsSize, "custom options"
                )
                op.largeCustomOptionsOffset = op.largeCustomOptionsSize = 0
    return model_t


def _slice(data: bytearray, offset: int, size: int, what: str) -> np.ndarray:
    if offset < 0 or size < 0 or offset + size > len(data):
        raise _CorruptError(
            f"{what} stored at bytes {offset}..{offset + size}, past the end ({len(data)} bytes)"
        )
    return np.frombuffer(data, dtype=np.uint8, count=size, offset=offset)


def _where(exc: Exception) -> str:
    """The innermost tflfuse function an exception passed through, for a bug report."""
    tb, name = exc.__traceback__, "from_bytes"
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "").startswith("tflfuse"):
            name = tb.tb_frame.f_code.co_name
        tb = tb.tb_next
    return name


def _seq(values: Any) -> list:
    """A vector field of the object API (None, list or ndarray) as a list; never truth-tested."""
    return [] if values is None else list(values)


def _describe(exc: Exception) -> str:
    """What a parser exception says about the bytes, for a user."""
    if isinstance(exc, UnicodeDecodeError):
        return "corrupt flatbuffer: a name is not valid UTF-8"
    if isinstance(exc, (struct.error, IndexError, ValueError, OverflowError)):
        return "corrupt flatbuffer: an offset or length points outside the file"
    if isinstance(exc, MemoryError):
        return "corrupt flatbuffer: a length is absurdly large"
    return f"corrupt flatbuffer: a table has the wrong layout ({type(exc).__name__})"


class _CorruptError(Exception):
    """An index or size inside the flatbuffer points nowhere."""


def _at(items: list, index: int, what: str) -> Any:
    if not isinstance(index, (int, np.integer)) or not 0 <= index < len(items):
        raise _CorruptError(f"{what} index {index} out of range (0..{len(items) - 1})")
    return items[index]


def _model_from_object(m: Any) -> Model:
    buffers = _seq(m.buffers)
    codes = []
    for code in _seq(m.operatorCodes):
        number = max(code.builtinCode, code.deprecatedBuiltinCode)
        if number not in OP_NAMES:
            raise _CorruptError(f"unknown builtin operator code {number}")
        codes.append((OP_NAMES[number], _text(code.customCode) or None, code.version or 1))

    shared: dict[tuple, np.ndarray] = {}  # tensors sharing a buffer share one array
    subgraphs = [
        _graph_from_object(sg, i, codes, buffers, shared) for i, sg in enumerate(_seq(m.subgraphs))
    ]
    metadata = {}
    for entry in _seq(m.metadata):
        # the interpreter skips an entry whose buffer does not exist (ReadAllMetadata): empty here
        buf = buffers[entry.buffer] if 0 <= entry.buffer < len(buffers) else None
        data = buf.data if buf is not None else None
        metadata[_text(entry.name)] = bytes(data) if data is not None else b""
    signatures = [_signature_from_object(sig, subgraphs) for sig in _seq(m.signatureDefs)]
    extra = {
        k: v
        for k, v in (
            ("externalBufferGroups", m.externalBufferGroups),
            ("externalBuffers", m.externalBuffers),
        )
        if v
    }
    return Model(subgraphs, _text(m.description), m.version, metadata, signatures, extra)


def _signature_from_object(sig: Any, subgraphs: list[Graph]) -> Signature:
    """A SignatureDef. One naming a subgraph the model does not have is refused as its runner
    refuses it ("Invalid subgraph index"). One naming a tensor the file does not have is refused
    too: the runner refuses it ("Invalid tensor index") unless kernels have added scratch tensors
    that far at run time (an LSTM adds six), and then it feeds or reads that scratch memory."""
    key = _text(sig.signatureKey)
    if not 0 <= sig.subgraphIndex < len(subgraphs):
        raise _CorruptError(
            f"signature {key!r} names subgraph {sig.subgraphIndex}, and the model has"
            f" {len(subgraphs)} (the interpreter's signature runner refuses it)"
        )
    tensors = subgraphs[sig.subgraphIndex].tensors

    def named(maps: Any, kind: str) -> dict[str, Tensor]:
        out = {}
        for t in _seq(maps):
            if not 0 <= t.tensorIndex < len(tensors):
                raise _CorruptError(
                    f"signature {key!r} {kind} {_text(t.name)!r} names tensor {t.tensorIndex},"
                    f" and subgraph {sig.subgraphIndex} has {len(tensors)} tensors: the"
                    " interpreter's signature runner refuses it, or reaches a kernel's scratch"
                    " tensor, which has no defined result"
                )
            out[_text(t.name)] = tensors[t.tensorIndex]
        return out

    return Signature(
        key=key,
        subgraph=sig.subgraphIndex,
        inputs=named(sig.inputs, "input"),
        outputs=named(sig.outputs, "output"),
    )


# Ops whose kernels read `intermediates` (tflite/kernels/lstm.cc, unidirectional_sequence_lstm.cc);
# every other kernel ignores them, and the interpreter never checks them when it builds a node.
_READS_INTERMEDIATES = frozenset({"LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM"})


def _tensor_indices(values: Any, count: int, where: str, *, optional: bool = False) -> list[int]:
    """Tensor indices of one list, checked as the interpreter checks them (CheckTensorIndices):
    -1 is an omitted optional input; any other index outside the subgraph's tensors is refused."""
    out = [int(i) for i in _seq(values)]
    for i in out:
        if optional and i == -1:
            continue
        if not 0 <= i < count:
            raise _CorruptError(
                f"invalid tensor index {i} in {where}: the subgraph has {count} tensors (the"
                " interpreter refuses to allocate it)"
            )
    return out


def _graph_from_object(sg: Any, index: int, codes: list, buffers: list, shared: dict) -> Graph:
    tensor_objects = _seq(sg.tensors)
    count = len(tensor_objects)
    here = f"subgraph {index}"
    # the interpreter's order: the subgraph's inputs and outputs, its tensors, then each node
    input_indices = _tensor_indices(sg.inputs, count, f"the inputs of {here}")
    output_indices = _tensor_indices(sg.outputs, count, f"the outputs of {here}")
    tensors = [_tensor_from_object(t, buffers, shared) for t in tensor_objects]
    wiring = []
    for k, o in enumerate(_seq(sg.operators)):
        op_type = _at(codes, o.opcodeIndex, "operator code")[0]
        what = f"op {k} ({op_type}) of {here}"
        ins = _tensor_indices(o.inputs, count, f"the inputs of {what}", optional=True)
        outs = _tensor_indices(o.outputs, count, f"the outputs of {what}")
        inter = [int(i) for i in _seq(o.intermediates)]
        if any(not 0 <= i < count for i in inter):
            if op_type in _READS_INTERMEDIATES:
                _tensor_indices(inter, count, f"the intermediates of {what}, which it reads")
            inter = [i for i in inter if 0 <= i < count]  # nothing reads them: dropped
        wiring.append((ins, outs, inter))
    _check_execution_order(sg, index, codes, wiring, set(input_indices))

    ops = []
    for o, (ins, outs, inter) in zip(_seq(sg.operators), wiring):
        op_type, custom_code, version = codes[o.opcodeIndex]
        options_type = _OPTIONS_NAMES.get(o.builtinOptionsType) if o.builtinOptionsType else None
        options = _options_to_dict(o.builtinOptions) if o.builtinOptions is not None else {}
        extra: dict[str, Any] = {}
        if o.builtinOptions2Type:
            extra["options2_type"] = _OPTIONS2_NAMES.get(o.builtinOptions2Type)
            extra["options2"] = o.builtinOptions2
        if len(_seq(o.mutatingVariableInputs)):  # a numpy bool array: len, never truth
            extra["mutating_variable_inputs"] = [bool(v) for v in o.mutatingVariableInputs]
        if o.customOptionsFormat:
            extra["custom_options_format"] = o.customOptionsFormat
        custom = (
            bytes(np.asarray(o.customOptions, dtype=np.uint8))
            if o.customOptions is not None
            else None
        )
        ops.append(
            Op(
                op_type,
                [None if i == -1 else tensors[i] for i in ins],
                [tensors[i] for i in outs],
                options,
                version=version,
                custom_code=custom_code,
                custom_options=custom,
                options_type=options_type,
                intermediates=[tensors[i] for i in inter],
                extra=extra,
            )
        )
    return Graph(
        name=_text(sg.name) or ("main" if index == 0 else f"subgraph_{index}"),
        ops=ops,
        tensors=tensors,
        inputs=[tensors[i] for i in input_indices],
        outputs=[tensors[i] for i in output_indices],
        extra={"had_name": bool(sg.name), "debug_metadata_index": sg.debugMetadataIndex},
    )


def _check_execution_order(
    sg: Any, index: int, codes: list, wiring: list, graph_inputs: set[int]
) -> None:
    """Refuse a graph whose file order gives it no defined result.

    The interpreter runs ops in file order ("Invocations are always done in node order",
    subgraph.cc) and its arena planner gives each tensor one lifetime, from its first writer to its
    last reader (arena_planner.cc). A read before the write therefore sees the previous invoke's
    value or uninitialized memory (and XNNPACK, which orders by data flow, computes something
    else); a second write can land, after the tensor's last read, in memory another tensor owns.
    Graph inputs (allocated for the whole run) and variables (persistent state) may be read first.
    An op may not read the tensor it writes: the builder refuses that for ops with parameters
    (CheckInputAndOutputForOverlap) and runs the others in place, which only some kernels survive.
    """
    names = [_text(t.name) for t in _seq(sg.tensors)]
    variables = {i for i, t in enumerate(_seq(sg.tensors)) if t.isVariable}

    def op(k: int) -> str:
        return f"op {k} ({codes[_seq(sg.operators)[k].opcodeIndex][0]})"

    for k, (ins, outs, _) in enumerate(wiring):
        both = sorted(set(ins) & set(outs))
        if both:
            i = both[0]
            raise _CorruptError(
                f"{op(k)} of subgraph {index} reads and writes tensor {i} {names[i]!r}: the"
                f' interpreter refuses that for an op with parameters ("Tensor {i} is both input'
                ' and output") and runs any other in place, where the result depends on the'
                " order its kernel reads and writes"
            )
    writer: dict[int, int] = {}
    for k, (_, outs, _) in enumerate(wiring):
        for i in outs:
            if i in writer:
                again = "twice" if writer[i] == k else f"and again by {op(k)}"
                raise _CorruptError(
                    f"tensor {i} {names[i]!r} of subgraph {index} is written by {op(writer[i])}"
                    f" {again}: the interpreter plans one lifetime per tensor, from its first"
                    " writer to its last reader, so a second write can land in another tensor's"
                    " memory"
                )
            writer[i] = k
    for k, (ins, _, _) in enumerate(wiring):
        for i in ins:
            j = writer.get(i)
            if j is not None and j > k and i not in graph_inputs and i not in variables:
                raise _CorruptError(
                    f"{op(k)} of subgraph {index} reads tensor {i} {names[i]!r} before {op(j)}"
                    " writes it: the interpreter runs ops in file order, so that read sees stale"
                    " or uninitialized memory and the model has no defined result"
                )


def _tensor_from_object(t: Any, buffers: list, shared: dict) -> Tensor:
    dtype = TYPE_NAMES.get(t.type)
    if dtype is None:
        raise _CorruptError(f"unknown tensor type {t.type}")
    shape = tuple(int(d) for d in _seq(t.shape))
    buf = None
    if t.buffer != 0:  # buffer 0 means "no data", whatever it holds (ParseTensors)
        if not t.buffer < len(buffers):
            raise _CorruptError(
                f"tensor {_text(t.name)!r} names buffer {t.buffer}, and the model has"
                f" {len(buffers)} buffers (the interpreter refuses to build it)"
            )
        buf = buffers[t.buffer]
    data = None
    if buf is not None and buf.data is not None and len(buf.data) > 0:
        key = (t.buffer, dtype, shape)
        data = shared.get(key)
        if data is None:
            data = _array(buf.data, dtype, shape)
            shared[key] = data
    extra: dict[str, Any] = {}
    if t.sparsity is not None:
        extra["sparsity"] = t.sparsity
    if t.variantTensors:
        extra["variant_tensors"] = t.variantTensors
    if t.hasRank:
        extra["has_rank"] = True
    if t.externalBuffer:
        extra["external_buffer"] = t.externalBuffer
    return Tensor(
        _text(t.name),
        shape,
        dtype,
        data,
        _quantization_from_object(t.quantization),
        shape_signature=None if t.shapeSignature is None else [int(d) for d in t.shapeSignature],
        is_variable=bool(t.isVariable),
        extra=extra,
    )


def _array(raw: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """A constant's bytes as an array of its type and shape, or raw uint8 when they do not fit."""
    flat = np.frombuffer(bytes(raw) if not isinstance(raw, np.ndarray) else raw, dtype=np.uint8)
    np_dtype = NUMPY_DTYPES.get(dtype)
    if np_dtype is None or any(d < 0 for d in shape):
        return flat
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if count * np_dtype.itemsize != flat.size:
        return flat
    return flat.view(np_dtype).reshape(shape)


def _quantization_from_object(q: Any) -> Quantization | None:
    if q is None:
        return None

    def arr(v: Any, dt: str) -> np.ndarray | None:
        return None if v is None else np.asarray(v, dtype=dt)

    return Quantization(
        scale=arr(q.scale, "<f4"),
        zero_point=arr(q.zeroPoint, "<i8"),
        axis=int(q.quantizedDimension),
        min=arr(q.min, "<f4"),
        max=arr(q.max, "<f4"),
        details=q.details if q.detailsType else None,
    )


def read_back(model: Model) -> Model:
    """`model`, in place, as `from_bytes(to_bytes(model))` would read it back, so that a stage may
    hand its IR to the next stage instead of bytes to parse: each builtin op at the version it is
    written at (`to_bytes` fits versions, the loader keeps them as read), each tensor an op or the
    graph names registered in the graph's tensors (the writer numbers them last), constants as
    the loader types them (empty ones none), quantization vectors and options as a file stores
    them (float32 scales, every field of the options table), and fresh tensor-name counters. The
    serialized bytes do not change; tests/test_ir_handover.py shows the stages after it give what
    they give on the parse."""
    arrays: dict[tuple, np.ndarray | None] = {}
    for index, graph in enumerate(model.subgraphs):
        had_name = graph.extra.get("had_name", True) and bool(graph.name)
        if not had_name:
            graph.name = "main" if index == 0 else f"subgraph_{index}"
        debug = graph.extra.get("debug_metadata_index", -1)
        graph.extra = {"had_name": had_name, "debug_metadata_index": debug}
        _read_back_tensors(graph, arrays)
        for op in graph.ops:
            if op.type != "CUSTOM":
                op.version = max(op.version, required(op))
            options_type = op.options_type or (options_type_for(op.type) if op.options else None)
            if options_type is not None:
                op.options_type = options_type
                table = _options_from_dict(options_type, op.options)
                op.options = {k: _as_stored(v) for k, v in _options_to_dict(table).items()}
        graph._names = itertools.count()
    return model


def _read_back_tensors(graph: Graph, arrays: dict[tuple, np.ndarray | None]) -> None:
    registered = set(graph.tensors)
    for op in graph.ops:
        for t in (*op.inputs, *op.outputs, *op.intermediates, *graph.inputs, *graph.outputs):
            if t is not None and t not in registered:
                registered.add(t)
                graph.tensors.append(t)
    for t in graph.tensors:
        t.shape = tuple(int(d) for d in t.shape)
        if t.shape_signature is not None:
            t.shape_signature = tuple(int(d) for d in t.shape_signature)
        t.producer, t._uses = None, []  # (rewired below in file order, as the loader wires)
        if t.data is not None:
            key = (id(t.data), t.dtype, t.shape)
            if key not in arrays:
                raw = np.ascontiguousarray(t.data).reshape(-1).view(np.uint8)
                arrays[key] = _array(raw, t.dtype, t.shape) if raw.size else None
            t.data = arrays[key]
        q = t.quantization
        if q is not None:  # one per tensor, as read
            t.quantization = Quantization(
                scale=None if q.scale is None else _vector(q.scale, "<f4"),
                zero_point=None if q.zero_point is None else _vector(q.zero_point, "<i8"),
                axis=int(q.axis),
                min=None if q.min is None else _vector(q.min, "<f4"),
                max=None if q.max is None else _vector(q.max, "<f4"),
                details=q.details,
            )
    for op in graph.ops:
        for t in op.inputs:
            if t is not None:
                t._uses.append(op)
        for t in op.outputs:
            t.producer = op


def _as_stored(value: Any) -> Any:
    """An option's value as the loader reads it: a float at float32 precision, a plain number."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return float(np.float32(value))
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


# -- writing -----------------------------------------------------------------------------------
def save(model: Model, path: str | Path) -> int:
    """Write the model atomically (temp file + rename). Returns the number of bytes written."""
    data = to_bytes(model)
    atomic_write_bytes(Path(path), data)
    return len(data)


def to_bytes(
    model: Model, *, buffers_by_offset: bool | None = None, fit_versions: bool = True
) -> bytes:
    """Serialize a Model; `buffers_by_offset=None` stores buffers by offset only when needed.
    Every builtin op is written at least at the version its operands and options need
    (`ir.op_versions`); `fit_versions=False` writes each op's own version, as it was read."""
    writer = _Writer(model, fit_versions)
    model_t = writer.build()
    total = sum(len(b.data) for b in model_t.buffers if b.data is not None)
    if buffers_by_offset is None:
        buffers_by_offset = total > _FLATBUFFER_LIMIT
    if not buffers_by_offset:
        return bytes(_pack(model_t))
    return _pack_with_offsets(model_t)


class _AlignedBufferT(schema.BufferT):
    """A Buffer whose data vector starts on a 16-byte boundary (kernels may read it in place)."""

    def Pack(self, builder: flatbuffers.Builder) -> int:  # noqa: N802 - schema API name
        data = None
        if self.data is not None:
            payload = self.data.tobytes()
            builder.StartVector(1, len(payload), _BUFFER_ALIGNMENT)
            builder.head -= len(payload)
            builder.Bytes[builder.head : builder.head + len(payload)] = payload
            builder.vectorNumElems = len(payload)
            data = builder.EndVector()
        schema.BufferStart(builder)
        if data is not None:
            schema.BufferAddData(builder, data)
        schema.BufferAddOffset(builder, self.offset)
        schema.BufferAddSize(builder, self.size)
        return schema.BufferEnd(builder)


def _pack(model_t: Any) -> bytearray:
    builder = flatbuffers.Builder(1024)
    builder.Finish(model_t.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return builder.Output()


def _pack_with_offsets(model_t: Any) -> bytes:
    """Constants go after the flatbuffer; each Buffer records its offset and size."""
    payloads = []
    for b in model_t.buffers:
        if b.data is not None and len(b.data):
            payloads.append(b.data)
            b.data, b.offset, b.size = None, 1, 1  # placeholders so the fields are written
        else:
            payloads.append(None)
    head = _pack(model_t)
    packed = schema.Model.GetRootAs(head, 0)
    tail = bytearray()
    start = -(-len(head) // _BUFFER_ALIGNMENT) * _BUFFER_ALIGNMENT
    for i, payload in enumerate(payloads):
        if payload is None:
            continue
        pad = (-(start + len(tail))) % _BUFFER_ALIGNMENT
        tail += b"\0" * pad
        flatbuffer_utils.update_packed_buffer(
            packed.Buffers(i), offset=start + len(tail), size=payload.size
        )
        tail += payload.tobytes()
    return bytes(head) + b"\0" * (start - len(head)) + bytes(tail)


class _Writer:
    """IR -> ModelT, assigning tensor, buffer and opcode indices."""

    def __init__(self, model: Model, fit_versions: bool = True) -> None:
        self.model = model
        self.fit_versions = fit_versions
        self.buffers: list[Any] = [_AlignedBufferT()]
        self.buffer_of: dict[int, int] = {}
        self.codes: list[Any] = []
        self.code_of: dict[tuple, int] = {}

    def build(self) -> Any:
        m = schema.ModelT()
        m.version = self.model.version
        m.description = _utf8(self.model.description) if self.model.description else None
        m.subgraphs = []
        indices = []
        for graph in self.model.subgraphs:
            sg, index_of = self._subgraph(graph)
            m.subgraphs.append(sg)
            indices.append(index_of)
        m.operatorCodes = self.codes
        m.metadata = []
        for name, payload in self.model.metadata.items():
            entry = schema.MetadataT()
            entry.name = _utf8(name)
            entry.buffer = self._buffer(np.frombuffer(payload, dtype=np.uint8), key=None)
            m.metadata.append(entry)
        m.metadata = m.metadata or None
        m.signatureDefs = [
            self._signature(s, indices[s.subgraph]) for s in self.model.signatures
        ] or None
        m.buffers = self.buffers
        for key, value in self.model.extra.items():
            setattr(m, key, value)
        return m

    def _buffer(self, data: np.ndarray | None, key: int | None) -> int:
        if data is None:
            return 0
        if key is not None and key in self.buffer_of:
            return self.buffer_of[key]
        b = _AlignedBufferT()
        b.data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.buffers.append(b)
        index = len(self.buffers) - 1
        if key is not None:
            self.buffer_of[key] = index
        return index

    def _opcode(self, op: Op) -> int:
        # at least the version its operands need (litert-quantizer writes 1 for an int8 GELU)
        fit = self.fit_versions and op.type != "CUSTOM"
        version = max(op.version, required(op)) if fit else op.version
        key = (op.type, op.custom_code, version)
        if key not in self.code_of:
            if op.type not in OP_CODES:
                raise IRError(f"unknown op type {op.type!r}")
            c = schema.OperatorCodeT()
            c.builtinCode = OP_CODES[op.type]
            c.deprecatedBuiltinCode = min(
                c.builtinCode, schema.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES
            )
            c.customCode = _utf8(op.custom_code) if op.custom_code else None
            c.version = version
            self.code_of[key] = len(self.codes)
            self.codes.append(c)
        return self.code_of[key]

    def _subgraph(self, graph: Graph) -> tuple[Any, dict[Tensor, int]]:
        ordered = list(graph.tensors)
        index_of = {t: i for i, t in enumerate(ordered)}
        referenced = (
            [
                t
                for op in graph.ops
                for t in (*op.inputs, *op.outputs, *op.intermediates)
                if t is not None
            ]
            + graph.inputs
            + graph.outputs
        )
        for t in referenced:  # tolerate a rule that wired a tensor it did not register
            if t not in index_of:
                index_of[t] = len(ordered)
                ordered.append(t)
        sg = schema.SubGraphT()
        sg.name = _utf8(graph.name) if graph.extra.get("had_name", True) else None
        sg.debugMetadataIndex = graph.extra.get("debug_metadata_index", -1)
        sg.tensors = [self._tensor(t) for t in ordered]
        sg.inputs = [index_of[t] for t in graph.inputs]
        sg.outputs = [index_of[t] for t in graph.outputs]
        sg.operators = [self._operator(op, index_of) for op in graph.ops]
        return sg, index_of

    def _tensor(self, t: Tensor) -> Any:
        o = schema.TensorT()
        o.name = _utf8(t.name)
        o.shape = _vector(t.shape, "<i4")
        o.type = TYPE_CODES[t.dtype]
        o.buffer = self._buffer(t.data, key=id(t.data) if t.data is not None else None)
        o.isVariable = t.is_variable
        o.shapeSignature = (
            _vector(t.shape_signature, "<i4") if t.shape_signature is not None else None
        )
        o.quantization = _quantization_to_object(t.quantization)
        o.sparsity = t.extra.get("sparsity")
        o.variantTensors = t.extra.get("variant_tensors")
        o.hasRank = t.extra.get("has_rank", False)
        o.externalBuffer = t.extra.get("external_buffer", 0)
        return o

    def _operator(self, op: Op, index_of: dict[Tensor, int]) -> Any:
        o = schema.OperatorT()
        o.opcodeIndex = self._opcode(op)
        o.inputs = _vector([-1 if t is None else index_of[t] for t in op.inputs], "<i4")
        o.outputs = _vector([index_of[t] for t in op.outputs], "<i4")
        options_type = op.options_type or (options_type_for(op.type) if op.options else None)
        if options_type is not None:
            o.builtinOptionsType = getattr(schema.BuiltinOptions, options_type)
            o.builtinOptions = _options_from_dict(options_type, op.options)
        if op.extra.get("options2_type"):
            o.builtinOptions2Type = getattr(schema.BuiltinOptions2, op.extra["options2_type"])
            o.builtinOptions2 = op.extra["options2"]
        if op.custom_options is not None:
            o.customOptions = np.frombuffer(op.custom_options, dtype=np.uint8)
        o.customOptionsFormat = op.extra.get("custom_options_format", 0)
        o.mutatingVariableInputs = op.extra.get("mutating_variable_inputs")
        o.intermediates = [index_of[t] for t in op.intermediates] or None
        return o

    def _signature(self, s: Signature, index_of: dict[Tensor, int]) -> Any:
        o = schema.SignatureDefT()
        o.signatureKey = _utf8(s.key)
        o.subgraphIndex = s.subgraph

        def maps(named: dict[str, Tensor]) -> list:
            out = []
            for name, t in named.items():
                tm = schema.TensorMapT()
                tm.name = _utf8(name)
                tm.tensorIndex = index_of[t]
                out.append(tm)
            return out

        o.inputs = maps(s.inputs)
        o.outputs = maps(s.outputs)
        return o


def _quantization_to_object(q: Quantization | None) -> Any:
    if q is None:
        return None
    o = schema.QuantizationParametersT()
    # numpy vectors take the builder's fast path (lists are packed element by element)
    o.scale = None if q.scale is None else _vector(q.scale, "<f4")
    o.zeroPoint = None if q.zero_point is None else _vector(q.zero_point, "<i8")
    o.min = None if q.min is None else _vector(q.min, "<f4")
    o.max = None if q.max is None else _vector(q.max, "<f4")
    o.quantizedDimension = q.axis
    if q.details is not None:
        o.details = q.details
        o.detailsType = _details_type(q.details)
    return o


def _vector(values: Any, dtype: str) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=dtype).reshape(-1)


def _details_type(details: Any) -> int:
    name = type(details).__name__.removesuffix("T")
    return getattr(schema.QuantizationDetails, name)
