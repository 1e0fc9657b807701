"""The baselines `convert` makes from a source's models, where the source has no route of its own.

A .tflite (`sources.tflite`) brings no TF graph to convert unfused or to quantize with the
converter's PTQ, so its baselines are conversions of the input itself, made here:
  unfused  the input defused (`rules.defuse`: fused activations and float biases split off),
           checked on the reference kernels, where splitting an epilogue off changes no rounding:
           expected bit-identical there (`verified.on_reference_kernels`); the same for an int8
           stock model defused when litert-quantizer cannot make the unfused int8 one
  stock    litert-quantizer's default static int8 recipe on the input as given, in the op order
           the quantizer writes, with only its I/O given the recipe's types in place (what a user
           gets without tflfuse; for float16 weights, which it cannot quantize through their
           DEQUANTIZE, on the widened input, and the route says so)
"""

from __future__ import annotations

import numpy as np

from tflfuse.convert.recipe import Recipe
from tflfuse.device.interpreter import make_interpreter
from tflfuse.errors import TflfuseError
from tflfuse.json_types import JSONDict
from tflfuse.quantize.quantize import Quantized, quantize
from tflfuse.rewrite import TopologicalSort
from tflfuse.rules import defuse as defuse_mod
from tflfuse.sources.protocol import Source
from tflfuse.sources.tflite import TfliteSource
from tflfuse.verification import verified

DEFUSED_ROUTE = "the input defused (rules.defuse: fused activations and float biases split off)"


def defused(
    data: bytes, name: str, what: str, verify: bool = True
) -> tuple[bytes, str | None, JSONDict | None]:
    """(`data` through rules.defuse, how it was checked against `data`: a clause for the route,
    the agreement), or a one-line TflfuseError naming the check (`what`) and what it measured.
    `verify=False` (--no-verify): not checked (None, None)."""
    candidate = verified.apply(data, lambda: [(defuse_mod.Defuse(), TopologicalSort())], name=name)
    if not verify:
        return candidate.data, None, None
    failure, record = verified.judge(candidate, check=verified.on_reference_kernels)
    if failure is not None:
        raise TflfuseError(
            f"{name}: the {what} check (the input against its defused copy, reference kernels)"
            f" failed: {failure}; nothing written (--no-verify skips the check)"
        )
    if record["identical"]:
        return candidate.data, "verified bit-identical to it on the reference kernels", record
    how = (
        f"verified against it on the reference kernels (max abs {record['max_abs']:.3g}, within"
        " float32 round-off)"
    )
    return candidate.data, how, record


def defused_input(
    source: Source, rec: Recipe, verify: bool = True
) -> tuple[bytes, str, JSONDict | None]:
    """The unfused float baseline of a .tflite: its float model (in the interface convert gives
    the fused one) defused, with the route and the check (None: --no-verify)."""
    data, how, record = defused(source.float_tflite(rec), source.name, "defused baseline", verify)
    if how is None:
        return data, f"{DEFUSED_ROUTE}, not checked (--no-verify)", None
    return data, f"{DEFUSED_ROUTE}, {how}", record


def litert_stock(
    source: TfliteSource, rec: Recipe, calib: list[np.ndarray] | None, progress: bool
) -> tuple[bytes, str]:
    """What the user gets without tflfuse from a .tflite: litert-quantizer's default recipe for
    the mode on the input as given, in the op order the quantizer writes. Only the I/O types are
    set to the recipe's, in place (quantize.set_io_types moves no op); the route says how."""
    if source.quantized or rec.quant_mode == "none":
        kind = "already quantized" if source.quantized else "float"
        return source.given, f"the input as given ({kind}, its own I/O types)"

    def stock_of(data: bytes) -> Quantized:
        return quantize(
            data,
            rec.quant_mode,
            calib,
            input_type=rec.input_type,
            output_type=rec.output_type,
            desc="calibrating stock",
            progress=progress,
        )

    recipe = {"int8": "static_wi8_ai8", "dynamic": "dynamic_wi8_afp32"}.get(rec.quant_mode)
    calibrated = (
        ", calibrated on the same data with the same range rule as the fused model (the"
        " global min/max of every tensor)"
        if rec.quant_mode == "int8"
        else ""
    )
    io = _io_route(rec.input_type, rec.output_type) if rec.quant_mode == "int8" else ""
    how = f"no tflfuse rule{calibrated}; ops in the order the quantizer wrote them{io}"
    default = f"with its default recipe{f' ({recipe})' if recipe else ''}"
    if source.widened is None:
        q = stock_of(source.given)
        return q.data, f"{q.route} {default} on the input as given, {how}"
    # litert-quantizer 0.11 fails on weights behind DEQUANTIZE, or quantizes them as
    # activations into a model the interpreter refuses; a later one may read them
    try:
        q = stock_of(source.given)
        make_interpreter(q.data, delegate="none")
    except Exception as exc:  # any failure of the quantizer or its result on this form
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        q = stock_of(source.widened_data)
        return q.data, (
            f"{q.route} {default} on the input with its float16 weights widened to float32"
            f" (on the input as given it fails: {type(exc).__name__}"
            f"{': ' + why if why else ''}), {how}"
        )
    return q.data, f"{q.route} {default} on the input as given (float16 weights), {how}"


def _io_route(input_type: str, output_type: str) -> str:
    """What giving the quantizer's float-I/O model the recipe's I/O types changed (nothing moves:
    quantize.set_io_types)."""
    if input_type == output_type == "float32":
        return "; float I/O as the quantizer leaves it"
    parts = []
    for side, io, op in (("input", input_type, "QUANTIZE"), ("output", output_type, "DEQUANTIZE")):
        if io == "int8":
            parts.append(f"its {side} {op} removed ({side} int8)")
        elif io == "uint8":
            parts.append(
                f"its {side} {op} replaced in place by a QUANTIZE between uint8 and int8 (same"
                " scale, zero point + 128)"
            )
    return f"; I/O {input_type} -> {output_type} for the recipe: " + ", ".join(parts)
