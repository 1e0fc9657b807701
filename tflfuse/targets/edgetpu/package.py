"""The Edge TPU package inside a compiled model's `edgetpu-custom-op`, read without the runtime.

Each `edgetpu-custom-op` carries, in its custom options, a FlexBuffer map (libedgetpu
`tflite/custom_op_data.cc`: key "1" the op data version, "4" the serialized package, "3" a
deprecated parameter-caching executable, "5" the execution preference, "6"/"7" further chips and
executables). The package is a DarwiNN `Package` flatbuffer (file identifier "DWN1"; schema:
google-coral/libedgetpu `executable/executable.fbs`) whose `serialized_multi_executable` holds
the executables, each an `Executable` flatbuffer with its type, its parameter stream and its
input/output layers.

What the compiler's console prints comes from here: a PARAMETER_CACHING executable's parameters
are what it loads once into the 8 MiB on-chip SRAM ("On-chip memory used for caching model
parameters"); an EXECUTION_ONLY or STAND_ALONE executable's parameters are streamed from the
host on every inference ("Off-chip memory used for streaming uncached model parameters").
Executables sharing a `parameter_caching_token` (models compiled together) share the cache.
Each executable also says what its activations need: `used_narrow_memory_bytes_per_tile` (the
on-chip activation memory each tile uses: at most 196,596 bytes, just under 192 KiB, on the 115
twins at hand) and `scratch_size_bytes` (activations kept in host memory: 672 bytes in the
LSTM's, 409,600 to 1,393,920 in 3 others, beside 2.0 to 3.5 MB of cached parameters); and the
size of its instruction bitstreams (Coral's documentation: the cache is what remains of the SRAM
after "a small amount" reserved for the executable). benchmarks/EDGETPU_SPLIT.md sets these
beside the split.

The accessors below are written from the schema's field order (a flatbuffer table's field i sits
at vtable slot 4 + 2 i; a union takes two slots, its type then its value); no generated code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from struct import error as struct_error
from typing import Any, TypedDict

from flatbuffers import encode, flexbuffers
from flatbuffers import number_types as fb_types
from flatbuffers.table import Table

from tflfuse.ir import Model
from tflfuse.json_types import JSONDict

CUSTOM_OP = "edgetpu-custom-op"
EXECUTABLE_TYPES = ("STAND_ALONE", "PARAMETER_CACHING", "EXECUTION_ONLY")
_PACKAGE_KEY = "4"
_PACKAGE_ID = b"DWN1"

# field numbers, from executable.fbs
_PKG_RUNTIME, _PKG_MULTI, _PKG_COMPILER, _PKG_IDENTIFIER = 0, 1, 4, 7
_EXE_NAME, _EXE_BATCH, _EXE_SCRATCH, _EXE_CODE, _EXE_PARAMS = 1, 3, 4, 5, 6
_EXE_INPUTS, _EXE_OUTPUTS, _EXE_CHIP, _EXE_TYPE, _EXE_TOKEN = 8, 9, 10, 13, 14
_EXE_CYCLES_32, _EXE_NARROW, _EXE_DRAM, _EXE_CYCLES = 11, 12, 15, 16
_LAYER_NAME, _LAYER_SIZE, _LAYER_Y, _LAYER_X, _LAYER_Z = 0, 1, 2, 3, 4
_LAYER_TYPE, _LAYER_COUNT = 6, 9  # field 7/8 is the AnyLayer union (type, value)
_DATA_TYPES = {0: "UINT8", 1: "UINT16", 2: "INT32", 3: "BFLOAT16", 4: "FLOAT16", 5: "FLOAT32"}
_DATA_TYPES.update({8: "INT8", 9: "INT16"})


class PackageError(ValueError):
    """The custom op's options hold no package this reader understands."""


# -- minimal flatbuffer accessors --------------------------------------------------------------
def _root(buf: bytes | bytearray) -> Table:
    data = bytearray(buf)
    return Table(data, encode.Get(fb_types.UOffsetTFlags.packer_type, data, 0))


def _slot(t: Table, i: int) -> int:
    return t.Offset(4 + 2 * i)


def _scalar(t: Table, i: int, flags: Any, default: int = 0) -> int:
    slot = _slot(t, i)
    return int(t.Get(flags, slot + t.Pos)) if slot else default


def _bytes(t: Table, i: int) -> bytes | None:
    slot = _slot(t, i)
    if not slot:
        return None
    start = t.Vector(slot)
    return bytes(t.Bytes[start : start + t.VectorLen(slot)])


def _vector_length(t: Table, i: int) -> int:
    slot = _slot(t, i)
    return t.VectorLen(slot) if slot else 0


def _text(t: Table, i: int) -> str | None:
    raw = _bytes(t, i)
    return None if raw is None else raw.decode("utf-8", "replace")


def _tables(t: Table, i: int) -> list[Table]:
    slot = _slot(t, i)
    if not slot:
        return []
    start = t.Vector(slot)
    return [Table(t.Bytes, t.Indirect(start + 4 * k)) for k in range(t.VectorLen(slot))]


def _strings(t: Table, i: int) -> list[bytes]:
    slot = _slot(t, i)
    if not slot:
        return []
    start = t.Vector(slot)
    return [bytes(t.String(start + 4 * k)) for k in range(t.VectorLen(slot))]


# -- the package -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layer:
    """An input or output of an executable, as the Edge TPU lays it out."""

    name: str
    size_bytes: int  # padded, for batch 1
    shape: tuple[int, int, int]  # (y, x, z)
    data_type: str
    executions: int = 1  # executed this many times per inference

    def to_dict(self) -> JSONDict:
        return {
            "name": self.name,
            "size_bytes": self.size_bytes,
            "yxz": list(self.shape),
            "data_type": self.data_type,
            "executions_per_inference": self.executions,
        }


@dataclass(frozen=True)
class Executable:
    """One DarwiNN executable: its type, its parameter stream's size and its layers."""

    type: str  # one of EXECUTABLE_TYPES
    parameter_bytes: int
    caching_token: int
    scratch_bytes: int  # activations kept off chip (host memory), for batch 1
    name: str | None = None
    # the on-chip activation ("narrow") memory each tile uses, below 192 KiB on every twin at hand
    narrow_bytes_per_tile: int = 0
    instruction_bytes: int = 0  # the encoded instruction bitstreams
    batch_size: int = 0
    chip: str | None = None
    estimated_cycles: int = 0
    parameters_in_dram: bool = False
    cycle_estimate_written: bool = False  # field 11 or 16 present: compilers before 16 wrote one
    inputs: tuple[Layer, ...] = ()
    outputs: tuple[Layer, ...] = ()

    def to_dict(self) -> JSONDict:
        return {
            "type": self.type,
            "parameter_bytes": self.parameter_bytes,
            "caching_token": f"{self.caching_token:#018x}",
            "scratch_bytes": self.scratch_bytes,
            "narrow_bytes_per_tile": self.narrow_bytes_per_tile,
            "instruction_bytes": self.instruction_bytes,
            "estimated_cycles": self.estimated_cycles,
            "inputs": [layer.to_dict() for layer in self.inputs],
            "outputs": [layer.to_dict() for layer in self.outputs],
        }


@dataclass(frozen=True)
class Package:
    """The package of one `edgetpu-custom-op` (one Edge TPU segment)."""

    runtime_version: int
    compiler_version: str | None
    executables: tuple[Executable, ...] = field(default_factory=tuple)
    model_identifier: str | None = None

    def of_type(self, kind: str) -> list[Executable]:
        return [e for e in self.executables if e.type == kind]

    @property
    def cached_bytes(self) -> int:
        """Parameters loaded once into the on-chip cache (PARAMETER_CACHING executables)."""
        return sum(e.parameter_bytes for e in self.of_type("PARAMETER_CACHING"))

    @property
    def streamed_bytes(self) -> int:
        """Parameters sent on every inference (EXECUTION_ONLY and STAND_ALONE executables)."""
        return sum(e.parameter_bytes for e in self.executables if e.type != "PARAMETER_CACHING")

    @property
    def compiler_major(self) -> int | None:
        """The edgetpu_compiler generation the package's form shows (`compiler_generation`)."""
        return compiler_generation(self)

    @property
    def caching_tokens(self) -> list[int]:
        return sorted({e.caching_token for e in self.executables if e.caching_token})

    @property
    def inputs(self) -> tuple[Layer, ...]:
        return next((e.inputs for e in self.executables if e.type != "PARAMETER_CACHING"), ())

    @property
    def outputs(self) -> tuple[Layer, ...]:
        return next((e.outputs for e in self.executables if e.type != "PARAMETER_CACHING"), ())

    def to_dict(self) -> JSONDict:
        counts = {kind: len(self.of_type(kind)) for kind in EXECUTABLE_TYPES}
        return {
            "runtime_version": self.runtime_version,
            "compiler_version": self.compiler_version,
            "executables": len(self.executables),
            "executables_by_type": {k.lower(): n for k, n in counts.items() if n},
            "on_chip_bytes": self.cached_bytes,
            "off_chip_bytes": self.streamed_bytes,
            "caching_tokens": [f"{t:#018x}" for t in self.caching_tokens],
            "inputs": [layer.to_dict() for layer in self.inputs],
            "outputs": [layer.to_dict() for layer in self.outputs],
            "executable_list": [e.to_dict() for e in self.executables],
        }


def compiler_generation(package: Package) -> int | None:
    """Which edgetpu_compiler wrote `package`, from its form (its version string is only "cl/"):
    16 when it needs runtime 12 or later and no executable that runs carries a cycle estimate,
    15 when they carry one (64-bit) and it needs runtime 12; None for runtime 10/11 (1.x/2.x).
    On the twins whose compiler log survives: 16.0 wrote runtime 14 and no estimate (123 of 123),
    15.0 runtime 12 with an estimate (3 of 3), 1.0 runtime 10 with or without one (43). A twin of
    runtime 12 without an estimate is 16 asked for an older runtime (`-m 12`): Coral's MoveNet
    and LSTM twins, which map what only 16 maps. The form read as 15 is not 15's alone: a twin
    found in issue 27's fourth round (cmpss94068/tensorflowlite's SSD detector) has it beside a
    log of 2.1.302470888, and the MobileNetV2 compiled next to it, without a log, lays out no
    softmax, as 2.x does (256 bytes fewer than 15's two sections). So 15 here means "15.0, or
    2.x": `benchmarks/edgetpu_oracle_score.py` says so of a twin without a log where the two
    layouts differ."""
    if package.runtime_version < 12:
        return None
    running = [e for e in package.executables if e.type != "PARAMETER_CACHING"]
    if not running:
        return None
    return 15 if any(e.cycle_estimate_written for e in running) else 16


def _layer(t: Table) -> Layer:
    dims = tuple(_scalar(t, i, fb_types.Int32Flags) for i in (_LAYER_Y, _LAYER_X, _LAYER_Z))
    return Layer(
        name=_text(t, _LAYER_NAME) or "",
        size_bytes=_scalar(t, _LAYER_SIZE, fb_types.Int32Flags),
        shape=(dims[0], dims[1], dims[2]),
        data_type=_DATA_TYPES.get(_scalar(t, _LAYER_TYPE, fb_types.Int16Flags), "?"),
        executions=_scalar(t, _LAYER_COUNT, fb_types.Int32Flags, 1),
    )


def _executable(raw: bytes) -> Executable:
    t = _root(raw)
    kind = _scalar(t, _EXE_TYPE, fb_types.Int16Flags)
    if not 0 <= kind < len(EXECUTABLE_TYPES):
        raise PackageError(f"unknown executable type {kind}")
    return Executable(
        type=EXECUTABLE_TYPES[kind],
        parameter_bytes=_vector_length(t, _EXE_PARAMS),
        caching_token=_scalar(t, _EXE_TOKEN, fb_types.Uint64Flags),
        scratch_bytes=_scalar(t, _EXE_SCRATCH, fb_types.Int32Flags),
        name=_text(t, _EXE_NAME),
        narrow_bytes_per_tile=_scalar(t, _EXE_NARROW, fb_types.Int32Flags),
        instruction_bytes=sum(_vector_length(code, 0) for code in _tables(t, _EXE_CODE)),
        batch_size=_scalar(t, _EXE_BATCH, fb_types.Int32Flags),
        chip=_text(t, _EXE_CHIP),
        estimated_cycles=_scalar(t, _EXE_CYCLES, fb_types.Int64Flags),
        parameters_in_dram=bool(_scalar(t, _EXE_DRAM, fb_types.BoolFlags)),
        cycle_estimate_written=bool(_slot(t, _EXE_CYCLES_32) or _slot(t, _EXE_CYCLES)),
        inputs=tuple(_layer(x) for x in _tables(t, _EXE_INPUTS)),
        outputs=tuple(_layer(x) for x in _tables(t, _EXE_OUTPUTS)),
    )


def _package_bytes(custom_options: bytes) -> bytes:
    """Key "4" of the custom op's FlexBuffer map (compilers 15/16), else the bytes from the
    first "DWN1" identifier on (older layouts keep the package unframed)."""
    try:
        root = flexbuffers.GetRoot(bytearray(custom_options)).AsMap
        for key, value in zip(root.Keys, root.Values):
            if key.AsKey == _PACKAGE_KEY and value.IsString:
                return bytes(value.AsStringBytes)
    except (IndexError, KeyError, ValueError, TypeError, OverflowError, struct_error):
        pass
    at = custom_options.find(_PACKAGE_ID)
    if at < 4:
        raise PackageError("no DarwiNN package (file identifier DWN1) in the custom options")
    return custom_options[at - 4 :]


def read_package(custom_options: bytes) -> Package:
    """The package in one edgetpu-custom-op's options; PackageError when there is none or it
    does not parse (compilers 1.x/2.0 wrote an older layout)."""
    raw = _package_bytes(bytes(custom_options))
    if raw[4:8] != _PACKAGE_ID:
        raise PackageError("the package has no DWN1 identifier")
    try:
        pkg = _root(raw)
        multi = _bytes(pkg, _PKG_MULTI)
        executables = tuple(_executable(s) for s in _strings(_root(multi), 0)) if multi else ()
        return Package(
            runtime_version=_scalar(pkg, _PKG_RUNTIME, fb_types.Int32Flags),
            compiler_version=_text(pkg, _PKG_COMPILER),
            executables=executables,
            model_identifier=_text(pkg, _PKG_IDENTIFIER),
        )
    except (IndexError, ValueError, TypeError, struct_error) as exc:
        raise PackageError(f"the package does not parse ({type(exc).__name__})") from None


def parameter_streams(compiled: Model) -> dict[str, bytes]:
    """The parameter bytes of a compiled model by executable type, each type's streams joined
    in segment order (PARAMETER_CACHING: what is cached on chip; the others: what is streamed),
    to find where the compiler put a layer's weights (benchmarks/edgetpu_split.py). Custom ops
    holding no package this reader understands are skipped."""
    found: dict[str, bytes] = {}
    for op in compiled.main.ops:
        if op.custom_code != CUSTOM_OP:
            continue
        try:
            multi = _bytes(_root(_package_bytes(bytes(op.custom_options or b""))), _PKG_MULTI)
            for serialized in _strings(_root(multi), 0) if multi else []:
                t = _root(serialized)
                kind = EXECUTABLE_TYPES[_scalar(t, _EXE_TYPE, fb_types.Int16Flags)]
                found[kind] = found.get(kind, b"") + (_bytes(t, _EXE_PARAMS) or b"")
        except (PackageError, IndexError, ValueError, TypeError, struct_error):
            continue
    return found


def model_packages(compiled: Model) -> list[Package | None]:
    """The package of each edgetpu-custom-op of the main subgraph, in order (None where the
    options hold no package this reader understands)."""
    found: list[Package | None] = []
    for op in compiled.main.ops:
        if op.custom_code != CUSTOM_OP:
            continue
        try:
            found.append(read_package(bytes(op.custom_options or b"")))
        except PackageError:
            found.append(None)
    return found


class PackageMemory(TypedDict):
    """`package_memory`: what a compiled model's packages say of its parameter memory."""

    segments: int  # custom ops holding a package
    readable_packages: int
    compiler_major: int | None  # None when the packages disagree
    on_chip_bytes: int
    off_chip_bytes: int
    executables: int
    executables_by_type: dict[str, int]
    caching_tokens: list[str]
    packages: list[JSONDict | None]  # each package's `to_dict`, None where it does not read


def package_memory(compiled: Model) -> PackageMemory | None:
    """What the compiler's console says of parameter memory, read from the compiled model:
    bytes cached on chip and streamed (summed over its segments), executables by type, their
    caching tokens. None when no custom op holds a readable package."""
    packages = model_packages(compiled)
    readable = [p for p in packages if p is not None]
    if not readable:
        return None
    counts = {k: sum(len(p.of_type(k)) for p in readable) for k in EXECUTABLE_TYPES}
    majors = {p.compiler_major for p in readable}
    return {
        "segments": len(packages),
        "readable_packages": len(readable),
        "compiler_major": majors.pop() if len(majors) == 1 else None,
        "on_chip_bytes": sum(p.cached_bytes for p in readable),
        "off_chip_bytes": sum(p.streamed_bytes for p in readable),
        "executables": sum(counts.values()),
        "executables_by_type": {k.lower(): n for k, n in counts.items() if n},
        "caching_tokens": sorted({f"{t:#018x}" for p in readable for t in p.caching_tokens}),
        "packages": [p.to_dict() if p is not None else None for p in packages],
    }


def cocompiled(memories: Mapping[str, PackageMemory]) -> set[str]:
    """The compiled models, of `memories` (`package_memory` of each, by any key), that were
    compiled together with another: `edgetpu_compiler` gives the models of one invocation one
    caching token, shared by their executables, and they share the on-chip cache, so how much of
    each is cached depends on the others. A token also recurs in copies of one model (the same
    twin committed twice, a model and its variant with a decoder op), so a token marks a
    co-compile only where the models holding it differ in parameter bytes (dev: Coral's
    cocompilation test data; an iNat-birds twin that streams 1,623,872 bytes shares its token
    with a 16,320-byte dummy, the same model compiled alone streams none)."""
    totals: dict[str, set[int]] = {}
    for memory in memories.values():
        for token in memory.get("caching_tokens", []):
            total = int(memory["on_chip_bytes"]) + int(memory["off_chip_bytes"])
            totals.setdefault(token, set()).add(total)
    return {
        key
        for key, memory in memories.items()
        if any(len(totals[token]) > 1 for token in memory.get("caching_tokens", []))
    }
