"""A .tflite from anywhere (litert-torch, onnx2tf, a vendor) as a `tflfuse convert` source.

It enters the pipeline at the float .tflite stage (see docs/ARCHITECTURE.md). What convert can do
with it is decided here, once, with a one-line error for what it cannot:
  float, one subgraph, static shapes   the full route: fuse, quantize, legalize, baselines
  full int8 / uint8                    the int8 rules and legalization only; no re-quantization,
                                       and the input itself is the stock baseline
  float16 weights behind DEQUANTIZE    a float model stored at half size (MediaPipe, vendors):
                                       the weights are widened exactly to float32
                                       (`float16_weights`, checked on the interpreter) and it
                                       takes the full route; the report says so
  dynamic-range weights                refused: those are quantized already, and re-quantizing
                                       them would quantize rounded weights (give the float model)
  several subgraphs, dynamic shapes    refused (control flow and shape-polymorphic models are
                                       beyond the rules, the quantizer and the Edge TPU)
  ops the built-in kernels lack        refused: convert runs the model to calibrate and verify
                                       (the refusal says which kernels have them, if any)
A batch left dynamic only in `shape_signature` (-1 at axis 0, stored shape static) is taken at
the stored size, with a notice. A .tflite has no TF graph to convert unfused or to quantize with
the converter's PTQ: its baselines (`unfused`, the input defused; `stock`, litert-quantizer's
default recipe on the input as given) are conversions, made by `tflfuse.convert.baselines` from
the data this source gives (`float_tflite`, `given`, `widened_data`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import numpy as np

from tflfuse.device.interpreter import make_interpreter
from tflfuse.errors import ModelError, TflfuseError
from tflfuse.ir import Graph, Model, Signature, Tensor, flatbuffer, qparams, summary
from tflfuse.ir.names import check_names
from tflfuse.ir.summary import quantization_summary
from tflfuse.json_types import JSONDict
from tflfuse.sources import float16_weights, layout
from tflfuse.sources.layout import LayoutChange
from tflfuse.sources.recipe_fields import RecipeFields
from tflfuse.verification import verify as verify_mod
from tflfuse.verification.runs import run_float

INT_KINDS = ("int8", "uint8")
_IO_DTYPES = {"FLOAT32", "INT8", "UINT8"}


def is_tflite(model: object) -> bool:
    """True for .tflite bytes (the `TFL3` identifier), a path ending in .tflite, or a file that
    starts like one whatever its name."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model[4:8]) == b"TFL3"
    if isinstance(model, (str, Path)):
        path = Path(model)
        if path.suffix.lower() == ".tflite":
            return True
        try:
            with path.open("rb") as f:
                return path.is_file() and f.read(8)[4:8] == b"TFL3"
        except OSError:
            return False
    return False


def _name(text: str, fallback: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text.split(":")[0]) or fallback


def _dynamic(t: Tensor) -> bool:
    return t.shape_signature is not None and -1 in t.shape_signature


def _static(model: Model, data: bytes, where: str, notices: list[str]) -> None:
    """Refuse dynamic shapes; a dynamic batch over a static stored shape is pinned (notice), and
    so are internal tensors an exporter marked dynamic although every input is static
    (`_inferred_static`)."""
    graph = model.main
    inferred = _inferred_static(graph, data)
    pinned = False
    for t in graph.tensors:
        sig = t.shape_signature
        if sig is None or -1 not in sig:
            continue
        if t in inferred:
            t.shape_signature = inferred[t]
            continue
        if -1 in sig[1:] or len(sig) != len(t.shape):
            kind = "input" if t in graph.inputs else "tensor"
            raise ModelError(
                where,
                f"{kind} {t.name} has dynamic dimensions {list(sig)}; tflfuse converts models"
                " with static shapes only (export with a fixed input size)",
            )
        t.shape_signature = tuple(t.shape)
        pinned = True
    if pinned:
        batch = graph.inputs[0].shape[0] if graph.inputs and graph.inputs[0].shape else 1
        notices.append(f"dynamic batch dimension taken at the stored size {batch}")
    if inferred:
        notices.append(
            f"{len(inferred)} internal tensors the exporter marked dynamic take static shapes:"
            " every input is static, and the interpreter computes those shapes from them"
        )


def _inferred_static(graph: Graph, data: bytes) -> dict[Tensor, tuple[int, ...]]:
    """{tensor: its static shape} for the internal tensors an exporter left dynamic (-1 beyond
    the batch in `shape_signature`) in a model whose inputs are all static: onnx2tf 2.6 marks
    the tensors after a SLICE whose size reads "to the end" (-1), and everything shaped from
    them, though each has one shape for the one input shape (a MobileViT: 117 of them).

    The shapes are propagated from the inputs by the interpreter's own shape functions (each
    kernel's Prepare at allocation, a dynamic tensor's at its first run): the model is run once
    on zeros and every tensor's shape read. Each must keep its rank and every dimension the
    signature fixes, and equal the stored shape (what the exporter computed): a disagreement
    leaves the tensor dynamic (refused by `_static`). Empty when an input is dynamic, when no
    internal tensor is, or when the interpreter cannot run the model (`_runnable` says why)."""
    dynamic = [
        t
        for t in graph.tensors
        if _dynamic(t) and -1 in cast("tuple[int, ...]", t.shape_signature)[1:]
    ]
    if not dynamic or any(t in dynamic for t in graph.inputs):
        return {}
    try:
        interp = make_interpreter(data, delegate="none")
        for d in interp.get_input_details():
            interp.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
        interp.invoke()
        shapes = {
            d["index"]: tuple(int(n) for n in d["shape"]) for d in interp.get_tensor_details()
        }
    except (TflfuseError, ValueError, RuntimeError):
        return {}
    index = {t: i for i, t in enumerate(graph.tensors)}
    out = {}
    for t in dynamic:
        shape = shapes.get(index[t])
        signature = cast("tuple[int, ...]", t.shape_signature)  # dynamic: it has one
        fixed = all(s == -1 or s == n for s, n in zip(signature, shape or ()))
        if shape is not None and shape == tuple(t.shape) and fixed:
            out[t] = shape
    return out


def _every_read_written(graph: Graph, where: str) -> None:
    """Refuse, in one line, a tensor an op reads that no op writes and that is neither a model
    input, a constant nor a variable: the interpreter builds such a model and fails at its first
    run ("Input tensor N lacks data", subgraph.cc), so nothing can calibrate, verify or convert
    it (stock conversion neither); a model output no op writes, likewise ("Tensor data is
    null"). onnx2tf 2.6 writes such a file for EdgeNeXt. As the interpreter does, an empty
    tensor and the shape operand of a RESHAPE that is not a vector (read for its shape only)
    are let pass."""
    index = {id(t): i for i, t in enumerate(graph.tensors)}
    inputs = {id(t) for t in graph.inputs}
    for k, op in enumerate(graph.ops):
        for slot, t in enumerate(op.inputs):
            if t is None or t.producer is not None or id(t) in inputs:
                continue
            if t.is_constant or t.is_variable or t.size == 0:
                continue
            if op.type == "RESHAPE" and slot == 1 and len(t.shape) != 1:
                continue
            raise ModelError(
                where,
                f"tensor {index.get(id(t), '?')} {t.name!r} is read by op {k} ({op.type}) but"
                " written by no op, and is neither a model input nor a constant: a broken"
                ' export the interpreter cannot run ("lacks data"), so no conversion can'
                " (re-export the model)",
            )
    for t in graph.outputs:
        if t.producer is None and id(t) not in inputs and not t.is_constant and t.size:
            raise ModelError(
                where,
                f"output tensor {index.get(id(t), '?')} {t.name!r} is written by no op, and is"
                " neither a model input nor a constant: a broken export the interpreter cannot"
                " run, so no conversion can (re-export the model)",
            )


def _signed(model: Model, notices: list[str]) -> None:
    """Give a model without a signature one (litert-quantizer needs it), and order a signature's
    inputs and outputs as the graph's: calibration arrays follow the signature (the quantizer)
    and the interpreter follows the graph, so the two orders must be one."""
    g = model.main
    for s in model.signatures:
        for side, tensors in (("inputs", g.inputs), ("outputs", g.outputs)):
            named = getattr(s, side)
            by_tensor = {t: k for k, t in named.items()}
            if set(by_tensor) == set(tensors):
                setattr(s, side, {by_tensor[t]: t for t in tensors})
    if model.signatures:
        return
    model.signatures = [
        Signature(
            "serving_default",
            0,
            {_name(t.name, f"input_{i}"): t for i, t in enumerate(g.inputs)},
            {_name(t.name, f"output_{i}"): t for i, t in enumerate(g.outputs)},
        )
    ]
    notices.append("the model had no signature: serving_default made from its inputs and outputs")


def _runnable(data: bytes, model: Model, where: str) -> None:
    """The built-in kernels must run the model: convert calibrates and verifies by running it."""
    try:
        make_interpreter(data, delegate="none")
    except TflfuseError as exc:
        custom = sorted({op.custom_code or "?" for op in model.main.ops if op.type == "CUSTOM"})
        if not custom:
            raise ModelError(
                where, f"cannot run it here ({exc}); tflfuse runs the model to calibrate and verify"
            ) from None
        raise ModelError(where, _missing_kernels(data, custom)) from None


def _missing_kernels(data: bytes, custom: list[str]) -> str:
    """Which kernels the model's custom ops have, in one clause, and why convert needs more.

    XNNPACK (applied by the default interpreter) takes some of MediaPipe's custom ops
    (Convolution2DTransposeBias, MaxPoolingWithArgmax2D, MaxUnpooling2D) for float tensors; the
    built-in and reference kernels have none of them. Calibration alone could run there
    (litert-quantizer's calibrator does: with every tensor kept, XNNPACK takes the ops one by
    one), but convert checks everything it writes on the built-in and reference kernels: every
    rewrite, the defused baseline (bit-identical on the reference kernels) and the error of the
    three models. Moved to XNNPACK, those checks would compare XNNPACK's kernel for the op with
    itself, and the int8 models would still compute that op in float (the Edge TPU cuts there).
    So such a model is refused, with the truth about where it runs (`bench` and `check` take it
    as given).
    """
    several = len(custom) > 1
    ops = f"custom op{'s' if several else ''} {', '.join(custom)}"
    if all(c.startswith("Flex") for c in custom):
        return (
            f"cannot run it here ({ops}: {'TensorFlow ops' if several else 'a TensorFlow op'},"
            " which no ai-edge-litert kernel runs);"
            " tflfuse runs the model to calibrate and verify (export it with TFLite builtin ops)"
        )
    try:
        make_interpreter(data, delegate="xnnpack")
    except TflfuseError:
        return (
            f"cannot run it here ({ops} without a kernel in ai-edge-litert, built-in or"
            " XNNPACK); tflfuse runs the model to calibrate and verify"
        )
    return (
        f"cannot convert it: {ops} {'have' if several else 'has'} a kernel only in XNNPACK"
        " (the default interpreter runs the model; the built-in and reference kernels cannot),"
        " and tflfuse checks every model it writes on those kernels"
    )


class TfliteSource:
    """A checked .tflite, entering `convert` at the float stage (or the int8 one, see above): a
    `tflfuse.sources.protocol.Source`."""

    kind = "tflite"

    def __init__(
        self,
        data: bytes,
        name: str,
        model: Model,
        notices: list[str],
        *,
        given: bytes | None = None,
        widened: float16_weights.Widened | None = None,
    ) -> None:
        self.given = data if given is None else given  # as given: the reference, stock's input
        self.widened = widened  # float16 weights widened to float32 (None: there were none)
        self.name = name
        self.notices = notices
        self.layout: LayoutChange | None = None
        self.graph_info: dict[str, Any] = {}  # no TF graph: no Grappler
        g = model.main
        sig = model.signatures[0]
        self.quantized = quantization_summary(g)["kind"] in INT_KINDS
        self.input_names = list(sig.inputs)
        self.output_names = list(sig.outputs)
        self.batch = max(int(g.inputs[0].shape[0]), 1) if g.inputs and g.inputs[0].shape else 1
        self.input_shapes = [tuple(int(d) for d in t.shape[1:]) for t in sig.inputs.values()]
        self._data = data

    # -- the float .tflite stage ----------------------------------------------------------------
    def tf_graph(self, rec: RecipeFields) -> None:
        """No TF graph: nothing for Grappler (`graph_info` stays empty)."""

    def float_tflite(self, rec: RecipeFields) -> bytes:
        """The model the rules start from: as given, or channels-last when asked for."""
        return self.layout.data if self.layout is not None else self._data

    def use_channels_last(self, seed: int, verify: bool = True) -> LayoutChange:
        """Switch to the NHWC interface (layout.channels_last), verified against the input
        (unless `verify` is off: --no-verify)."""
        change = layout.channels_last(self._data, self.name)
        if not verify:
            self.layout = change
            return change
        inputs = self.eval_inputs(None, seed)
        worst = layout.verify(self._data, change, inputs)
        if not worst <= 1e-6:
            raise TflfuseError(
                f"{self.name}: --channels-last changed the outputs by {worst:.3g}; nothing written"
            )
        self.layout = change
        return change

    # -- baselines (made by convert.baselines from this source's data) --------------------------
    def unfused_float(
        self, rec: RecipeFields, fused_float: bytes, verify: bool = True
    ) -> tuple[bytes, str] | None:
        """None: a .tflite has no unfused graph of its own; convert defuses its float model."""
        return None

    def converter_ptq(
        self, which: str, rec: RecipeFields, calib: list[np.ndarray] | None, progress: bool
    ) -> bytes | None:
        return None  # no TF function behind a .tflite: litert-quantizer is the only route

    def stock(
        self, rec: RecipeFields, calib: list[np.ndarray] | None, progress: bool
    ) -> tuple[bytes, str] | None:
        """None: the stock model of a .tflite is litert-quantizer's on the input, which convert
        makes (convert.baselines.litert_stock)."""
        return None

    @property
    def widened_data(self) -> bytes:
        """The input with its float16 weights widened to float32 (as given when it had none)."""
        return self._data

    # -- the function all three models are measured against -------------------------------------
    def eval_inputs(self, calib: list[np.ndarray] | None, seed: int) -> list[np.ndarray]:
        """Calibration samples (original layout), else seeded [-1, 1] noise (whole batches)."""
        b = self.batch
        if calib is not None:
            n = max(16 // b, 1) * b
            return [a[:n] for a in calib]
        rng = np.random.default_rng(seed + 1000)
        n = max(8 // b, 2) * b
        return [rng.uniform(-1, 1, (n, *s)).astype(np.float32) for s in self.input_shapes]

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The input model's outputs (dequantized when it is int8), in its own layout."""
        return run_float(self.given, inputs)

    def describe(self) -> JSONDict:
        out: JSONDict = {
            "kind": self.kind,
            "entered_at": "int8 rules (already quantized)" if self.quantized else "float .tflite",
            "quantized_input": self.quantized,
        }
        if self.widened is not None:
            w = self.widened
            out["float16_weights"] = {"constants": w.constants, "sparse": w.sparse}
        return out


def load(model: bytes | str | Path) -> TfliteSource:
    """A checked TfliteSource, or a one-line `FILE: problem` error saying what tflfuse cannot do."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        data, where = bytes(model), "<bytes>"
    else:
        where = str(model)
        data = flatbuffer.read_model_bytes(model)
    parsed = flatbuffer.from_bytes(data, where)
    notices: list[str] = []
    if len(parsed.subgraphs) > 1:
        raise ModelError(
            where,
            f"has {len(parsed.subgraphs)} subgraphs (control flow or several entry points);"
            " tflfuse converts single-subgraph models only",
        )
    graph = parsed.main
    if not graph.inputs or not graph.outputs:
        raise ModelError(where, "the model has no inputs or no outputs")
    odd = sorted({t.dtype for t in (*graph.inputs, *graph.outputs)} - _IO_DTYPES)
    if odd:
        raise ModelError(
            where,
            f"inputs or outputs of type {', '.join(odd)}; tflfuse converts float32, int8"
            " or uint8 models",
        )
    kind = quantization_summary(graph)["kind"]
    if kind not in ("float", "float16", *INT_KINDS):
        raise ModelError(
            where,
            f"already quantized ({kind}); tflfuse quantizes float models and legalizes full int8"
            " ones (give the float model)",
        )
    if kind in INT_KINDS:  # an unusable scale aborts some interpreters: refuse it first
        qparams.check(parsed, where)
    check_names(parsed, where)  # (litert-quantizer decodes every name strictly)
    _every_read_written(parsed.main, where)
    _static(parsed, data, where, notices)
    _signed(parsed, notices)
    data = flatbuffer.to_bytes(parsed)
    _runnable(data, parsed, where)
    given, widened = data, None
    if kind == "float16":
        widened, data = _widen_float16(parsed, data, where)
        notices.append(widened.describe() + " (verified: the same outputs)")
    if kind in INT_KINDS:
        notices.append(
            f"the input is already {kind}: the int8 rules and legalization run on it, with no"
            " re-quantization (it is its own stock baseline)"
        )
    read = flatbuffer.from_bytes(data, where)
    return TfliteSource(data, where, read, notices, given=given, widened=widened)


def _widen_float16(
    parsed: Model, given: bytes, where: str
) -> tuple[float16_weights.Widened, bytes]:
    """The model with its float16 weights widened to float32 (float16_weights), checked to give
    the very outputs of the model as given; one line when something float16 is left."""
    widened = float16_weights.widen(parsed)
    left = summary.count(parsed.main)
    if left or quantization_summary(parsed.main)["kind"] != "float":
        raise ModelError(
            where,
            "float16 values tflfuse cannot widen (read other than through DEQUANTIZE);"
            " give the float32 model",
        )
    data = flatbuffer.to_bytes(parsed)
    check = verify_mod.compare(given, data, atol=0.0, rtol=0.0)
    if not check.ok:
        raise ModelError(
            where,
            f"widening its float16 weights changed the outputs by {check.max_abs:.3g} (a bug in"
            " tflfuse); nothing written",
        )
    return widened, data
