"""Whole-model refusals of `edgetpu_compiler`: the compiles that write no model at all.

The messages found in compiler output quoted by users (google-coral/edgetpu issues) and what
tflfuse predicts of each:

- **"ERROR: Didn't find op for builtin opcode 'OP' version 'N' ... Model could not be parsed"**
  (gh34, gh340, gh879): the compiler parses the model with the TensorFlow Lite op registry it was
  built with. Decided where the evidence brackets the registry (`[compiler_parse]` in
  delegates/edgetpu.toml, with the first TFLite release of each op version from
  delegates/runtimes.toml): compiler 16 parsed ADD v4 (first in 2.6.0) and refused QUANTIZE v3
  (first in 2.7.0), so an op version first released in 2.7.0 or later fails and one from 2.6.0 or
  before parses; between the bounds of an older compiler the failure is undecided.
- **"Invalid model: X.tflite / Model not quantized"** (gh168, gh313): predicted when no tensor of
  the model is quantized to 8 bits (the message's own reading). gh313 reports it for a model
  the user had quantized with TF 2.4; what else triggers it is not known.
- **"Compilation failed due to large activation tensors in model"** (gh439, gh449, gh557, gh608,
  gh653, gh671, gh686): not predicted; see `modes.failure_note` for what the evidence cannot
  decide. "Internal compiler error. Aborting!" (gh49, gh100, gh211) has no cause the reports
  show (gh211: the same model compiled on a later try).

No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass

from tflfuse.ir import Model
from tflfuse.targets import runtimes
from tflfuse.targets.capabilities import capability
from tflfuse.targets.edgetpu.predict import compiler_version_key

_EIGHT_BIT = frozenset({"INT8", "UINT8"})


@dataclass
class Failure:
    """A whole-model refusal: `decided` when the evidence says the compile fails, else the
    failure is possible and undecided."""

    kind: str  # "parse" or "not_quantized"
    decided: bool
    message: str

    def line(self) -> str:
        head = (
            "edgetpu_compiler fails" if self.decided else "undecided whether edgetpu_compiler fails"
        )
        return f"{head}: {self.message}"


def _release_key(release: str) -> tuple[int, int, int]:
    """A first release as a sortable key ('' = in no release the table knows: the newest)."""
    return runtimes.version_key(release) if release else (10**6, 0, 0)


def parse_failures(model: Model, compiler_version: str | None = None) -> list[Failure]:
    """The op versions the compiler's op registry lacks (decided) or may lack (undecided)."""
    major = str(compiler_version_key(compiler_version or "16")[0])
    bounds = capability("edgetpu").get("compiler_parse", {}).get(major)
    if not bounds:
        return []
    parsed = _release_key(bounds.get("parsed_up_to", "0.0.0"))
    refused = _release_key(bounds["refused_from"])
    since = runtimes.table().since
    found: dict[tuple[str, int], Failure] = {}
    for graph in model.subgraphs:
        for op in graph.ops:
            firsts = since.get(op.type, ())
            if op.type == "CUSTOM" or (op.type, op.version) in found:
                continue
            first = firsts[op.version - 1] if 0 < op.version <= len(firsts) else ""
            key = _release_key(first)
            if key <= parsed:
                continue
            where = f"first in TFLite {first}" if first else "in no TFLite release known here"
            text = (
                f"Didn't find op for builtin opcode '{op.type}' version '{op.version}'"
                f" ({where}; compiler {major} parses up to"
                f" {bounds.get('parsed_up_to', '?')} and refuses from {bounds['refused_from']})"
            )
            found[(op.type, op.version)] = Failure("parse", key >= refused, text)
    return list(found.values())


def not_quantized(model: Model) -> Failure | None:
    """'Model not quantized' when no tensor of the model is quantized to 8 bits."""
    for graph in model.subgraphs:
        for t in graph.tensors:
            if t.dtype in _EIGHT_BIT and t.is_quantized:
                return None
    return Failure("not_quantized", True, "Invalid model / Model not quantized (no int8 tensor)")


def whole_model_failures(model: Model, compiler_version: str | None = None) -> list[Failure]:
    """Every whole-model refusal predicted for `model`, decided ones first."""
    found = parse_failures(model, compiler_version)
    nq = not_quantized(model)
    if nq is not None:
        found.append(nq)
    return sorted(found, key=lambda f: not f.decided)
