"""`tflfuse convert`: a model in, three .tflite models (fused, unfused, stock) and a report out.

The pipeline is a list of stages, each a small function over one `Recipe` and one `Context`:

  load -> TF graph -> float .tflite -> fuse -> unfused -> quantize -> legalize -> runtime
  -> baselines -> report

Each stage leaves one typed record on the Context (`tflfuse.convert.records`), which the later
stages and the report read. A source (`tflfuse.sources.protocol.Source`) is either a Keras model /
SavedModel / tf.function (`tflfuse.sources.keras_route.KerasSource`: TF graph by Grappler, float
.tflite by the converter) or a .tflite from anywhere (`tflfuse.sources.tflite.TfliteSource`),
which enters at the float stage; an int8 .tflite skips quantization. Models:
  fused    the recipe's rules on the float graph (exact float arithmetic), quantized with
           litert-quantizer, then the int8 legalization of the target (Edge TPU: the rules that
           need int8 tensors, e.g. SplitOversizedTranspose); every step is verified
  unfused  the network as written (output-blocked conversion, or the input defused), verified
  stock    what the user gets without tflfuse: the converter's own PTQ (TF route) or
           litert-quantizer's recipe on the .tflite as given
Everything is written to a temporary folder and published at the end (`tflfuse.files`), so a
failed or interrupted conversion leaves nothing half-written. TensorFlow is imported lazily.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from tflfuse import isolation
from tflfuse.convert import baselines as baselines_mod
from tflfuse.convert import recipe as recipe_mod
from tflfuse.convert import report as report_mod
from tflfuse.convert import usefulness
from tflfuse.convert.optimize import OptimizeResult, check_options, optimize_bytes, runtime_section
from tflfuse.convert.recipe import Recipe
from tflfuse.convert.records import (
    BaselinesRecord,
    FloatRecord,
    LegalizeRecord,
    LoadRecord,
    ModelAgreement,
    QuantizedRecord,
    Report,
    RuntimeRecord,
    UnfusedRecord,
)
from tflfuse.convert.rule_sets import pipeline
from tflfuse.errors import ModelError, TflfuseError
from tflfuse.files import check_input, discard, prepare_output, publish
from tflfuse.ir import Model, flatbuffer
from tflfuse.quantize import calibration as calib_mod
from tflfuse.quantize import quantize as quantize_mod
from tflfuse.quantize.calibration import CalibrationSource
from tflfuse.quantize.quantize import Quantized, aeq_unsupported, set_io_types
from tflfuse.rewrite import Pass, Rule
from tflfuse.rules.runtime import runtime_legalization
from tflfuse.sources import tflite as tflite_frontend
from tflfuse.sources.keras import (
    load_model,  # also what tests import from here
    source_kind,
)
from tflfuse.sources.keras_route import KerasSource
from tflfuse.sources.protocol import Source
from tflfuse.targets import runtimes
from tflfuse.targets.runtimes import resolve
from tflfuse.verification import verified
from tflfuse.verification import verify as verify_mod

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

FUSED, UNFUSED, STOCK = "model.tflite", "model_unfused.tflite", "model_stock.tflite"
MODELS = ("fused", "unfused", "stock")


@dataclass
class ConversionResult:
    """Paths of the written models and the report (also written as report.json / report.md)."""

    output_dir: Path
    fused: Path
    unfused: Path
    stock: Path
    report: Report = field(default_factory=Report)
    kept: list[str] = field(default_factory=list)  # entries of output_dir tflfuse did not write


@dataclass(frozen=True)
class Options:
    """How to run a conversion (what to convert to is the recipe's)."""

    seed: int = 0
    batch: int = 1
    allow_lambda: bool = False
    progress: bool = True
    quiet: bool = True
    channels_last: bool = False
    verify: bool = True  # False (--no-verify): models this host cannot run, written unchecked
    disabled: tuple[str, ...] = ()  # rules turned off (--disable), float and int8 alike
    accept_accuracy_loss: bool = False  # keep a model tflfuse.convert.usefulness calls useless


@dataclass
class Context:
    """What the stages hand on to each other: what the user gave and how to run it, then one
    typed record per stage (tflfuse.convert.records), each set by its own stage. A record is
    absent until its stage ran: reading it earlier is an AttributeError naming it, not a default
    that would hide a stage run out of order."""

    model: Any  # what the user gave
    calibration: CalibrationSource  # as given
    options: Options
    folder: Path  # the temporary output folder
    timings: dict[str, float] = field(default_factory=dict)
    # the stages' records (tflfuse.convert.records), in the order the stages set them
    loaded: LoadRecord = field(init=False, repr=False)  # the source and its calibration data
    float_model: FloatRecord = field(init=False, repr=False)  # what the rules start from
    fused: OptimizeResult = field(init=False, repr=False)  # the recipe's rules on it, verified
    unfused: UnfusedRecord = field(init=False, repr=False)  # the float baseline and its check
    quantized: QuantizedRecord = field(init=False, repr=False)
    legalization: LegalizeRecord = field(init=False, repr=False)  # the int8 rules
    runtime: RuntimeRecord | None = None  # --runtime only
    baselines: BaselinesRecord = field(init=False, repr=False)  # the three models as written
    report: Report = field(default_factory=Report)
    # the quantized fused model's IR as the stage before left it, with the bytes it is the parse
    # of (flatbuffer.read_back): the next stage takes it instead of parsing them again
    handed: tuple[bytes, Model] | None = field(default=None, repr=False)
    # each written model parsed once by the report, and read again by the usefulness judgement
    parsed: report_mod.ParseOnce = field(default_factory=report_mod.ParseOnce, repr=False)

    @property
    def source(self) -> Source:
        """The source the load stage made."""
        return self.loaded.source


def _note(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"tflfuse: {message}", file=sys.stderr)


# -- stages ----------------------------------------------------------------------------------------
def load(rec: Recipe, ctx: Context) -> None:
    """The source (a .tflite, or a model TensorFlow loads) and its calibration data."""
    opts = ctx.options
    if source_kind(ctx.model) == "tflite":
        if opts.batch != 1:
            raise TflfuseError(
                "--batch pins a dynamic batch of a Keras/SavedModel source; a .tflite keeps its"
                " stored batch"
            )
        tflite_source = tflite_frontend.load(ctx.model)
        if opts.channels_last:
            change = tflite_source.use_channels_last(opts.seed, opts.verify)
            tflite_source.notices.append(
                "interface change (--channels-last): " + "; ".join(change.details)
            )
        src: Source = tflite_source
    else:
        if opts.channels_last:
            raise TflfuseError("--channels-last applies to .tflite inputs (NCHW PyTorch exports)")
        front = load_model(
            ctx.model, batch=opts.batch, allow_lambda=opts.allow_lambda, quiet=opts.quiet
        )
        src = KerasSource(front)
    # (its notices are printed once the conversion succeeded: see convert)
    needs_calib = rec.quant_mode == "int8" and not src.quantized
    if needs_calib and ctx.calibration is None:
        raise _no_calibration(rec)
    given = needs_calib or ctx.calibration is not None
    calib = _calibration(rec, src, ctx.calibration, opts.seed) if given else None
    if calib is not None and len(calib[0]) < src.batch:
        raise TflfuseError(
            f"{len(calib[0])} calibration samples cannot fill one batch of {src.batch}"
        )
    ctx.loaded = LoadRecord(src, calib)


def _no_calibration(rec: Recipe) -> TflfuseError:
    return TflfuseError(
        f"recipe {rec.name!r} quantizes to int8 and needs calibration data (--calib DATA:"
        " .npy, .npz, a folder of images)"
    )


def _calibration(
    rec: Recipe, src: Source, calibration: CalibrationSource, seed: int
) -> list[np.ndarray] | None:
    """Calibration arrays (from `calibration`, as given) in the source's own layout. With
    --channels-last, data already laid out NHWC is accepted too (and put back in the source's
    layout)."""
    load_args: dict[str, Any] = dict(
        samples=rec.samples, seed=seed, scale=rec.scale, offset=rec.offset
    )
    layout = src.layout
    try:
        return calib_mod.load(calibration, src.input_shapes, src.input_names, **load_args)
    except TflfuseError:
        if layout is None:
            raise
        shapes = [
            (s[1], s[2], s[0]) if i in layout.inputs else s for i, s in enumerate(src.input_shapes)
        ]
        try:
            nhwc = calib_mod.load(calibration, shapes, src.input_names, **load_args)
        except TflfuseError:
            pass
        else:
            return layout.restore_inputs(nhwc) if nhwc is not None else None
        raise


def tf_graph(rec: Recipe, ctx: Context) -> None:
    """Grappler on the TF graph (nothing for a .tflite source); the source keeps its record
    (`graph_info`), which the float stage hands on."""
    ctx.source.tf_graph(rec)


def float_tflite(rec: Recipe, ctx: Context) -> None:
    """The float .tflite the rules start from (the converter's, or the one given), and the
    source's Grappler record as it stands after it (an optimizer dropped is said there)."""
    data = ctx.source.float_tflite(rec)
    ctx.float_model = FloatRecord(data, ctx.source.graph_info)


def fuse(rec: Recipe, ctx: Context) -> None:
    """The recipe's rules for its target on the float graph, verified."""
    ctx.fused = optimize_bytes(
        ctx.float_model.data,
        level=rec.level,
        target=rec.target,
        disabled=ctx.options.disabled,
        verify=ctx.options.verify,
        source=ctx.source.name,
        runtime=rec.runtime or None,  # GELU etc. spelled out in float, before quantizing
        before_int8=rec.quant_mode == "int8" and not ctx.source.quantized,
        int8_completes=rec.attention_sum_after_int8,  # (sumconv: the sums' int8 form)
    )


def unfused(rec: Recipe, ctx: Context) -> None:
    """The unfused float baseline, checked against the fused float model: float outputs within
    the float32 round-off of both (tflfuse.verification.roundoff) plus the fused model's declared
    approximations (e.g. erf GELU in the tanh form for the Edge TPU), the bound its own
    verification used. A source with no unfused graph of its own (a .tflite) is defused here
    (convert.baselines), checked against the model the fused one was verified against, and not
    checked twice. --no-verify skips the check and the report says so."""
    verify = ctx.options.verify
    made = ctx.source.unfused_float(rec, ctx.fused.data, verify=verify)
    checked = None
    if made is None:  # a .tflite: its float model defused, checked on the reference kernels
        data, route, checked = baselines_mod.defused_input(ctx.source, rec, verify)
    else:
        data, route = made
    before_int8 = rec.quant_mode == "int8" and not ctx.source.quantized  # (as `fuse`)
    data, route = _lowered_for_runtime(rec, ctx, data, route, before_int8=before_int8)
    if not verify:
        ctx.unfused = UnfusedRecord(data, route, {"verified": False, "reason": "--no-verify"})
        return
    if checked is not None:  # (a .tflite defused: checked against the input the fused model was)
        ctx.unfused = UnfusedRecord(data, route, checked)
        return
    atol = verified.PROPAGATION * sum(e.error for e in ctx.fused.result.events)
    steps = 1 + len(ctx.fused.result.events)
    check = verify_mod.compare(
        ctx.fused.data,
        data,
        atol=atol,
        rtol=0.0,
        int_atol=steps,
        seed=ctx.options.seed,
        roundoff=True,
    )
    if not check.ok:
        raise TflfuseError(
            f"{ctx.source.name}: the unfused baseline check (the fused float model against the"
            f" unfused one) failed: {verified.describe_failure(check)}; nothing written"
            " (--no-verify skips the check)"
        )
    ctx.unfused = UnfusedRecord(data, route, check.to_dict())


def quantize(rec: Recipe, ctx: Context) -> None:
    """Fused and unfused quantized with litert-quantizer (the recipe's mode). A model with ops
    it has no int8 config for takes the converter's PTQ where there is a TF graph (so it is fully
    int8); without one (a .tflite) the unfused baseline is the stock model defused."""
    fused, unfused = ctx.fused.data, ctx.unfused.data
    if ctx.source.quantized:
        route = f"already int8: not re-quantized; I/O {rec.input_type} -> {rec.output_type}"
        fused_io, ir = _with_io_types(fused, rec, flatbuffer.read_back(ctx.fused.model))
        ctx.quantized = QuantizedRecord(
            Quantized(fused_io, route), Quantized(_with_io_types(unfused, rec)[0], route)
        )
        ctx.handed = (fused_io, ir)
        return
    if rec.quant_mode == "none":
        ctx.quantized = QuantizedRecord(
            Quantized(fused, "none (float32)"), Quantized(unfused, "none (float32)")
        )
        ctx.handed = (fused, flatbuffer.read_back(ctx.fused.model))
        return
    fused_q, _, by_converter = _quantize_one(rec, ctx, "fused", fused)
    unfused_q, left, _ = _quantize_one(rec, ctx, "unfused", unfused)
    assert fused_q is not None  # (only the unfused baseline is left to the baselines stage)
    if fused_q.model is not None:  # its IR, handed on to the int8 rules (and not kept here)
        ctx.handed, fused_q.model = (fused_q.data, fused_q.model), None
    if unfused_q is not None:
        unfused_q.model = None
    ctx.quantized = QuantizedRecord(
        fused_q,
        unfused_q,
        rules_pending=by_converter,  # the converter's PTQ ran no rules: the int8 stage runs them
        unfused_left=", ".join(left) if unfused_q is None else "",
    )


def _quantize_one(
    rec: Recipe, ctx: Context, which: str, data: bytes
) -> tuple[Quantized | None, list[str], bool]:
    """One model quantized, the ops litert-quantizer has no int8 config for, and whether the
    converter's PTQ made it instead. None for an unfused baseline `baselines` makes from the
    stock model."""
    calib = ctx.loaded.inputs_for(which, ctx.loaded.calib)
    # (only read, by both): the fused float model's IR as `fuse` left it, or a parse
    held = ctx.fused.model if data is ctx.fused.data else None
    # (the unfused baseline is bytes: the converter's, or the defused route's)
    parsed = flatbuffer.read_back(held) if held is not None else flatbuffer.from_bytes(data)
    left = aeq_unsupported(data, parsed) if rec.quant_mode == "int8" else []
    if left:
        fallback = ctx.source.converter_ptq(which, rec, calib, ctx.options.progress)
        if fallback is not None:
            then = ", then the target's rules on the int8 graph" if which == "fused" else ""
            route = (
                f"TFLite converter PTQ{then} (litert-quantizer has no int8 config for"
                f" {', '.join(left)})"
            )
            return Quantized(fallback, route), left, True
        if which == "unfused":
            return None, left, False
    # (a fused .tflite with such ops: the quantizer leaves them in float; the report names them)
    quantized = quantize_mod.quantize(
        data,
        rec.quant_mode,
        calib,
        input_type=rec.input_type,
        output_type=rec.output_type,
        desc=f"calibrating {which}",
        progress=ctx.options.progress,
        layer_error=which == "fused",
        complete_int8=True,  # PRELU, RELU_0_TO_1 int8 too (int8_completion), fused and unfused
        verify=ctx.options.verify,
        target=rec.target,  # where the int8 op pays (an int8 PRELU on XNNPACK does not)
        parsed=parsed,
        share_ranges=True,  # copies and concatenation parts round once (stock: as it is)
    )
    return quantized, left, False


def _with_io_types(data: bytes, rec: Recipe, model: Model | None = None) -> tuple[bytes, Model]:
    """An int8 model with the recipe's I/O types (float, int8 or uint8 boundaries), and its IR
    as the parse of those bytes reads (flatbuffer.read_back). `model`: the IR of `data` as its
    parse reads it, rewritten here (the fused model's, which `fuse` hands on)."""
    if model is None:  # the unfused baseline: bytes from the defused route, no IR kept
        model = flatbuffer.from_bytes(data, "int8")
    set_io_types(model, rec.input_type, rec.output_type)
    data = flatbuffer.to_bytes(model)
    return data, flatbuffer.read_back(model)


def _fused_ir(ctx: Context, name: str) -> Model:
    """The quantized fused model's IR: the one the stage before handed on with its bytes, or
    their parse. Taken once: the caller rewrites it in place."""
    handed, ctx.handed = ctx.handed, None
    data = ctx.quantized.fused.data
    if handed is not None and handed[0] is data:
        return handed[1]
    # bytes no IR is held for: the converter PTQ's, or those an int8 legalization that was not
    # kept leaves (it rewrote the IR in place)
    return flatbuffer.from_bytes(data, name)


def int8_rules(rec: Recipe, rules_pending: bool) -> tuple[Rule | Pass, ...]:
    """The rules run on the quantized fused model. For a target with a legalization (the Edge
    TPU), that legalization (the rules' int8 forms and SplitOversizedTranspose, which acts only
    on int8 tensors); for the other targets, their whole pipeline again, where the int8-only
    rules fire (e.g. HARD_SWISH spelled out for XNNPACK, which takes no int8 HARD_SWISH; MEAN
    keep_dims on the plain kernels). When the float rules could not be kept (the converter-PTQ
    route), the target's whole pipeline."""
    if rec.level <= 0:
        return ()
    legalization = () if rules_pending else pipeline(rec.level, rec.target, quantized=True)
    return legalization or pipeline(rec.level, rec.target)


def legalize(rec: Recipe, ctx: Context) -> None:
    """The int8 rules on the fused model, verified like `optimize` verifies (each output within
    the int8 error its rewrites declare); a result outside tolerance is not kept, and the report
    says so."""
    q = ctx.quantized.fused
    is_int8 = rec.quant_mode == "int8" or ctx.source.quantized
    rules = int8_rules(rec, ctx.quantized.rules_pending) if is_int8 else ()
    if not rules:
        ctx.legalization = LegalizeRecord(ran=False, reason="no int8 rules for this recipe")
        return
    model = _fused_ir(ctx, "quantized")
    before = [op.type for op in model.main.ops]  # (what the passes start from)
    compiled = rec.target if rec.target.compiler else None
    mapped_before = compiled.predict(model).mapped if compiled is not None else 0
    candidate = verified.apply(q.data, lambda: [rules], disabled=ctx.options.disabled, model=model)
    result, data = candidate.result, candidate.data
    off = set(ctx.options.disabled)
    summary = {
        "rules": sorted({p.name for p in rules} - off),
        "disabled": sorted({p.name for p in rules} & off),
        **result.to_dict(),
    }
    after = [op.type for op in model.main.ops]
    # passes leave no rewrite events: say what they changed (op counts, order)
    summary["ops_before"], summary["ops_after"] = len(before), len(after)
    summary["reordered"] = before != after and sorted(before) == sorted(after)
    failure, verification = verified.judge(candidate, ctx.options.verify)
    model = flatbuffer.read_back(candidate.model)  # (after the check, which reads it as made)
    if compiled is not None:  # its compiler's mapping is the question
        summary[f"{compiled.name}_mapped"] = [mapped_before, compiled.predict(model).mapped]
    summary["verification"] = verification
    if failure is not None:
        # not kept: the model stays as quantized (on the converter-PTQ route: without rules)
        ctx.legalization = LegalizeRecord(ran=True, kept=False, reason=failure, details=summary)
    else:
        q.data = data
        ctx.handed = (data, model)
        ctx.legalization = LegalizeRecord(ran=True, kept=True, details=summary)


def runtime(rec: Recipe, ctx: Context) -> None:
    """`--runtime R`: the fused model (int8 too) lowered to R's op versions by the runtime
    legalization, verified like `legalize`; a model R cannot run is refused in one line (nothing
    is written). The report says which runtime the model was made for."""
    if not rec.runtime:
        return
    target = resolve(rec.runtime)
    q = ctx.quantized.fused
    model = _fused_ir(ctx, "quantized")
    candidate = verified.apply(
        q.data, lambda: [runtime_legalization(target)], name="quantized", model=model
    )
    result = candidate.result
    section = runtime_section(candidate.model, target, ctx.source.name)  # (refuses: raises)
    if result.changed:
        failure, section["verification"] = verified.judge(candidate, ctx.options.verify)
        if failure is not None:
            raise TflfuseError(
                f"{ctx.source.name}: runtime legalization: {failure}; nothing written"
            )
        q.data = candidate.data
        ctx.handed = (q.data, flatbuffer.read_back(candidate.model))  # (after the check)
    fired = {**ctx.fused.result.fired(), **result.fired()}
    section["fired"] = {k: v for k, v in fired.items() if k in _RUNTIME_RULES}
    ctx.runtime = RuntimeRecord(section)


_RUNTIME_RULES = ("SpellOutGelu", "SplitTransposeConvActivation")


def baselines(rec: Recipe, ctx: Context) -> None:
    """The stock model, and the unfused int8 baseline where quantize could not make it."""
    loaded = ctx.loaded
    made = ctx.source.stock(rec, loaded.calib, ctx.options.progress)
    if made is None:  # a .tflite: litert-quantizer's default recipe on the input
        given = cast(tflite_frontend.TfliteSource, ctx.source)  # (the source with no stock route)
        made = baselines_mod.litert_stock(given, rec, loaded.calib, ctx.options.progress)
    stock, stock_route = made
    unfused = ctx.quantized.unfused
    if unfused is None:
        left = ctx.quantized.unfused_left
        if loaded.interface("unfused") is None:
            base, what = stock, "the stock model"
        else:  # the stock model keeps the source's interface: quantize the one convert gives
            base = quantize_mod.quantize(
                ctx.float_model.data,
                rec.quant_mode,
                loaded.inputs_for("unfused", loaded.calib),
                input_type=rec.input_type,
                output_type=rec.output_type,
                desc="calibrating unfused",
                progress=ctx.options.progress,
            ).data
            what = "the input (channels-last) quantized as stock is"
        unchecked = ""
        try:
            defused_base = _defused(base, ctx.source.name, ctx.options.verify)
        except TflfuseError as exc:  # the defused check runs stock: it may fail in the kernels
            if "failed to run the model" not in str(exc):
                raise
            models = {"fused": ctx.quantized.fused.data, "stock": stock}
            _refuse_what_does_not_run(ctx.source.name, _agreements(ctx, models))
            # fused runs: the unfused baseline is stock defused, unchecked (stock cannot run)
            defused_base = _defused(base, ctx.source.name, verify=False)
            unchecked = f"; not checked: stock fails in the interpreter ({exc})"
        unfused = Quantized(
            defused_base,
            f"{what}, then defused (litert-quantizer has no int8 config for {left} once they"
            f" are split off){unchecked}",
        )
    unfused = _unfused_for_runtime(rec, ctx, unfused)
    ctx.baselines = BaselinesRecord(ctx.quantized.fused.data, unfused, stock, stock_route)


def _lowered_for_runtime(
    rec: Recipe,
    ctx: Context,
    data: bytes,
    route: str,
    *,
    check: bool = False,
    before_int8: bool = False,
) -> tuple[bytes, str]:
    """`--runtime R`: the unfused baseline lowered to R's op versions as the fused model is
    (GELU spelled out in float before quantizing, ...; verified), so that both run where the
    user deploys. `check`: the model as it will be written, refused in one line when R cannot
    run it; `before_int8`: the model is quantized next (GELU in ops litert-quantizer takes). The
    stock model stays as its route writes it (the report says whether R runs it)."""
    if not rec.runtime:
        return data, route
    target = resolve(rec.runtime)
    name = f"{ctx.source.name} (the unfused baseline)"
    stages = [runtime_legalization(target, before_int8=before_int8)]
    candidate = verified.apply(data, lambda: stages, name=name)
    if check:
        runtime_section(candidate.model, target, name)  # (refuses: raises)
    if not candidate.result.changed:
        return data, route
    failure, _ = verified.judge(candidate, ctx.options.verify)
    if failure is not None:
        raise TflfuseError(f"{name}: runtime legalization: {failure}; nothing written")
    fired = ", ".join(f"{rule} x{n}" for rule, n in candidate.result.fired().items())
    return candidate.data, f"{route}; for {target.name}: {fired}"


def _unfused_for_runtime(rec: Recipe, ctx: Context, unfused: Quantized) -> Quantized:
    """The quantized unfused baseline as `_lowered_for_runtime` leaves it, refused in one line
    when `--runtime` cannot run it."""
    data, route = _lowered_for_runtime(rec, ctx, unfused.data, unfused.route, check=True)
    return dataclasses.replace(unfused, data=data, route=route)


def _defused(data: bytes, name: str, verify: bool = True) -> bytes:
    """`data` defused, checked on the reference kernels (raises when the check fails)."""
    return baselines_mod.defused(data, name, "defused int8 baseline", verify)[0]


def report(rec: Recipe, ctx: Context) -> None:
    """Write the models, measure them against the source and assemble the report."""
    models = ctx.baselines.models
    for name, data in zip((FUSED, UNFUSED, STOCK), (models[m] for m in MODELS)):
        (ctx.folder / name).write_bytes(data)
    parse = ctx.parsed  # (the fused model's IR as the last stage handed it on, or its parse)
    if ctx.handed is not None and ctx.handed[0] is models["fused"]:
        parse.known(*ctx.handed)
    try:
        ctx.report = report_mod.assemble(
            rec,
            ctx.loaded,
            ctx.float_model,
            ctx.fused,
            ctx.unfused,
            ctx.quantized,
            ctx.legalization,
            ctx.baselines,
            seed=ctx.options.seed,
            parse=parse,
        )
    except TflfuseError as exc:  # a model fails in the interpreter beyond the agreement
        if "failed to run the model" not in str(exc):
            raise
        _refuse_what_does_not_run(ctx.source.name, _agreements(ctx, models))
        raise
    said = _refuse_what_does_not_run(ctx.source.name, ctx.report["agreement"])
    if said:
        ctx.report["warnings"] = [*ctx.report.get("warnings", []), said]
    if ctx.runtime is not None:
        section = dict(ctx.runtime.section)
        for name in MODELS:  # which of the three the runtime runs (only fused is required to)
            check = runtimes.check(parse(models[name]), rec.runtime)
            section[name] = {"runtime_ok": check.runtime_ok, "refusal": check.refusal() or None}
        ctx.report["runtime"] = section


def _agreements(ctx: Context, models: dict[str, bytes]) -> dict[str, ModelAgreement]:
    """Each of the three models against the source on the report's inputs (whether it runs)."""
    src, loaded = ctx.source, ctx.loaded
    inputs = src.eval_inputs(loaded.calib, ctx.options.seed)
    reference = src.reference(inputs)
    return {
        k: report_mod.agreement(v, inputs, reference, loaded.interface(k))
        for k, v in models.items()
    }


_STOCK = "stock (litert-quantizer's int8 of the same file)"


def _refuse_what_does_not_run(source: str, agreement: Mapping[str, ModelAgreement]) -> str | None:
    """One line when the model tflfuse made fails in the interpreter (nothing is written): the
    file, which of the three models fail and how, and whether stock, litert-quantizer's int8 of
    the same file, fails too (then the cause is the int8 quantization itself, e.g. an int8 DIV
    whose divisor's range reaches 0, not a rewrite). When fused runs and only the baselines
    fail, the sentence the report warns with (None when all three run)."""
    fused, stock = agreement.get("fused", {}), agreement.get("stock", {})
    unfused = "" if agreement.get("unfused", {}).get("runs", True) else ", and so does unfused"
    if fused.get("runs", True):
        if stock.get("runs", True):
            return None
        return (
            f"{_STOCK} fails in the interpreter: {stock.get('reason')}{unfused}; the int8 model"
            " tflfuse made (fused) runs"
        )
    if stock.get("runs", True):
        also = f"{_STOCK} runs"
    else:
        same = stock.get("reason") == fused.get("reason")
        also = f"{_STOCK} fails " + ("the same way" if same else f"too ({stock.get('reason')})")
    raise ModelError(
        source,
        f"the int8 model tflfuse made (fused) fails in the interpreter: {fused.get('reason')};"
        f" {also}{unfused}; nothing written",
    )


# what native code each stage runs, for the one line a crash there becomes (tflfuse.isolation)
_NATIVE_WORK = {
    "load": "loading the model",
    "tf_graph": "TensorFlow's Grappler",
    "float_tflite": "the TFLite converter",
    "fuse": "the interpreter, verifying the fused model",
    "unfused": "the TFLite converter and the interpreter, for the unfused baseline",
    "quantize": "litert-quantizer or the converter's quantization",
    "legalize": "the interpreter, verifying the int8 rules",
    "baselines": "the stock baseline's quantization",
    "report": "the interpreter, measuring the three models",
}

STAGES: tuple[Callable[[Recipe, Context], None], ...] = (
    load,
    tf_graph,
    float_tflite,
    fuse,
    unfused,
    quantize,
    legalize,
    runtime,
    baselines,
    report,
)


# -- output folder ---------------------------------------------------------------------------------
def convert(
    model: object,
    recipe: str | Path | Recipe = "xnnpack-int8",
    calibration: CalibrationSource = None,
    output_dir: Path = Path("out"),
    seed: int = 0,
    *,
    batch: int = 1,
    allow_lambda: bool = False,
    progress: bool = True,
    quiet: bool = True,
    channels_last: bool = False,
    force: bool = False,
    verify: bool = True,
    disabled: tuple[str, ...] = (),
    accept_accuracy_loss: bool = False,
    **overrides: object,
) -> ConversionResult:
    """Convert `model` (a keras.Model, .keras/.h5 file, SavedModel folder, tf.function, or a
    .tflite given as a path or bytes) with `recipe` (name, .toml or Recipe; `overrides` replace
    recipe fields) and write model.tflite, model_unfused.tflite, model_stock.tflite,
    report.json and report.md to `output_dir` (an existing non-empty one only with `force`, which
    replaces the files an earlier tflfuse result wrote there and keeps every other file; see
    `tflfuse.files`). `verify=False` writes models this host cannot run without the numeric
    checks (the report says so); `disabled` names rules to turn off, as `optimize --disable`
    does. A fused model whose outputs carry nothing of the source's (`tflfuse.convert.usefulness`)
    is refused unless `accept_accuracy_loss`."""
    started = time.perf_counter()
    rec = recipe if isinstance(recipe, Recipe) else recipe_mod.load(recipe)
    rec = rec.override(None, **overrides) if overrides else rec
    if batch < 1:
        raise TflfuseError(f"batch size must be at least 1, not {batch}")
    if isinstance(model, (str, Path)):
        _check_path(model)
    # Only a .tflite can be int8 already; any other source needs calibration data for int8, and
    # that is said before anything is loaded or written.
    if rec.quant_mode == "int8" and calibration is None and source_kind(model) != "tflite":
        raise _no_calibration(rec)
    check_options(level=rec.level, target=rec.target, disabled=tuple(disabled))
    options = Options(
        seed,
        batch,
        allow_lambda,
        progress,
        quiet,
        channels_last,
        verify,
        tuple(disabled),
        accept_accuracy_loss,
    )
    output_dir = Path(output_dir)
    written = (FUSED, UNFUSED, STOCK, "report.json", "report.md")
    tmp = prepare_output(output_dir, force=force, names=written)
    ctx = Context(model, calibration, options, tmp)
    try:
        # native code (converter, quantizer, interpreter) runs in a child: a crash there is one
        # line naming the stage, and the temp folder is removed here whatever happened
        ctx.report = isolation.run(lambda: _run_stages(rec, ctx, started), what=_name_of(model))
        kept = publish(tmp, output_dir, force=force)
    except BaseException as exc:
        discard(tmp)
        if isinstance(exc, OSError) and exc.filename is None and exc.errno in _FULL:
            raise TflfuseError(f"{output_dir}: cannot write the result: {exc.strerror}") from None
        raise
    for notice in ctx.report.get("notices", []):
        _note(notice, quiet)
    for warning in ctx.report.get("warnings", []):  # (after success, like the notices)
        _note(f"warning: {warning}", quiet)
    return ConversionResult(
        output_dir, output_dir / FUSED, output_dir / UNFUSED, output_dir / STOCK, ctx.report, kept
    )


# a write refused for want of room (a full disk, a quota, a file size limit): OSErrors that name
# no file when they come from writing one
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _check_path(model: str | Path) -> None:
    """A model path that is no file (a FIFO would block the first read, a device never end it)
    or whose name is too long, refused before anything opens it; a missing one is said by the
    loader, after the other arguments are checked."""
    try:
        os.stat(model)
    except FileNotFoundError:
        return
    except OSError:
        pass
    check_input(model, folder_ok=True)


def _run_stages(rec: Recipe, ctx: Context, started: float) -> Report:
    """Every stage in turn, then the report written into the temp folder; returns the report."""
    for stage in STAGES:
        work = _NATIVE_WORK.get(stage.__name__)
        isolation.stage(f"the {stage.__name__} stage" + (f" ({work})" if work else ""))
        t0 = time.perf_counter()
        stage(rec, ctx)
        ctx.timings[stage.__name__] = time.perf_counter() - t0
    ctx.report["timings_s"] = {k: round(v, 3) for k, v in ctx.timings.items()}
    ctx.report["timings_s"]["total"] = round(time.perf_counter() - started, 3)
    _judge_usefulness(ctx)
    report_mod.write(ctx.report, ctx.folder)
    return ctx.report


def _judge_usefulness(ctx: Context) -> None:
    """Refuse a fused model whose outputs carry nothing of the source's where the data shows they
    could (tflfuse.convert.usefulness), unless the user accepts it: then the report says so."""
    # (the report's section as `report.agreement` wrote it)
    agreement = ctx.report.get("agreement", {})
    fused: ModelAgreement = agreement.get("fused") or {}
    written = ctx.baselines.models
    steps = usefulness.output_steps(ctx.parsed(written["fused"]))  # (as the report parsed them)
    names = list(ctx.loaded.source.output_names)
    if usefulness.useless(fused, steps, names, FUSED) is None:
        return
    stock: ModelAgreement = agreement.get("stock") or {}  # its own figure, said too
    stock_data = written.get("stock")
    stock_steps = usefulness.output_steps(ctx.parsed(stock_data)) if stock_data else None
    verdict = usefulness.useless(fused, steps, names, FUSED, stock, stock_steps)
    if verdict is None:
        return
    if not ctx.options.accept_accuracy_loss:
        raise TflfuseError(
            f"{verdict}: nothing written (check the calibration data; --accept-accuracy-loss"
            " keeps the model)"
        )
    ctx.report["accuracy_loss_accepted"] = verdict
    ctx.report.setdefault("warnings", []).append(f"kept with --accept-accuracy-loss: {verdict}")


def _name_of(model: Any) -> str:
    """The model as messages name it: its path, or what kind of object it is."""
    if isinstance(model, (str, Path)):
        return str(model)
    if isinstance(model, (bytes, bytearray, memoryview)):
        return "<.tflite bytes>"
    return str(getattr(model, "name", None) or type(model).__name__)


convert_keras = convert  # the name the Keras route had; every source kind goes through convert
