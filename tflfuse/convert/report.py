"""The conversion report: facts about each model, agreement with the source model, and the
report.json / report.md files `tflfuse convert` writes, assembled from the records the
conversion's stages left (`tflfuse.convert.records`).

Agreement is measured in output units: an int8/uint8 model's inputs are quantized and its outputs
dequantized with their own scales, so float and integer models are compared on the same scale.
No TensorFlow here (the interpreter comes from `tflfuse.device`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np

from tflfuse import targets
from tflfuse.convert import caveats
from tflfuse.convert.optimize import OptimizeResult
from tflfuse.convert.recipe import Recipe
from tflfuse.convert.records import (
    BaselinesRecord,
    FloatRecord,
    LegalizeRecord,
    LoadRecord,
    ModelAgreement,
    OutputAgreement,
    QuantizedRecord,
    Report,
    UnfusedRecord,
)
from tflfuse.errors import TflfuseError
from tflfuse.ir import Model, flatbuffer
from tflfuse.ir.summary import activation_bytes, parameter_bytes, quantization_summary
from tflfuse.json_types import JSONDict
from tflfuse.quantize.quantize import float_compute_ops
from tflfuse.sources import layout
from tflfuse.sources.layout import LayoutChange
from tflfuse.sources.protocol import Source
from tflfuse.targets.edgetpu.mode_memory import mib
from tflfuse.targets.edgetpu.modes import compare_modes
from tflfuse.verification.runs import run_float

if TYPE_CHECKING:
    from tflfuse.targets.capabilities import Prediction


RUNS_AT_ONCE = 2  # interpreter runs of the report at once (a worker each; the machine has 2 cores)


class ParseOnce:
    """Each distinct model parsed once for the report: every use here only reads it."""

    def __init__(self) -> None:
        self._models: dict[bytes, Model] = {}

    def known(self, data: bytes, model: Model) -> None:
        """`model`, the parse of `data` a stage already holds (flatbuffer.read_back)."""
        self._models[data] = model

    def __call__(self, data: bytes) -> Model:
        model = self._models.get(data)
        if model is None:  # bytes no stage holds the IR of (see `pipeline.report`): parsed here
            model = self._models[data] = flatbuffer.from_bytes(data)
        return model


def model_facts(data: bytes, model: Model) -> JSONDict:
    """Op count and table, activation and parameter bytes, quantization kind, file size (`model`:
    the parse of `data`)."""
    g = model.main
    return {
        "op_count": sum(len(sg.ops) for sg in model.subgraphs),
        "op_counts": g.op_counts(),
        "activation_bytes": sum(activation_bytes(sg) for sg in model.subgraphs),
        "parameter_bytes": sum(parameter_bytes(sg) for sg in model.subgraphs),
        "file_bytes": len(data),
        "quantization": quantization_summary(g)["kind"],
        "io": quantization_summary(g)["io"],
    }


def invoke_failure(exc: BaseException) -> str:
    """The interpreter's failure to run a model, in one clause: the op and the kernel's check
    ("node 61 (DIV) failed to invoke: tflite/kernels/div.cc:262 data[i] != zero_point was not
    true")."""
    text = " ".join(str(exc).split()).removeprefix("the interpreter failed to run the model: ")
    match = re.search(r"Node number (\d+) \((\w+)\) failed to (invoke|prepare)", text)
    if match is None:
        return f"the interpreter failed running it: {text[:200]}"
    check = text[: match.start()].rstrip(" .")
    node, op, step = match.groups()
    return f"op {node} ({op}) failed to {step}" + (f": {check[:160]}" if check else "")


def model_outputs(
    data: bytes, inputs: list[np.ndarray], interface: LayoutChange | None = None
) -> list[np.ndarray]:
    """The model's outputs on the source-layout `inputs`, in output units and the source's
    layout (`interface`, as `agreement` takes it); TflfuseError when it fails to run."""
    if interface is None:
        return run_float(data, inputs)
    return interface.adapt_outputs(run_float(data, interface.adapt_inputs(inputs)))


def agreement(
    data: bytes,
    inputs: list[np.ndarray],
    reference: list[np.ndarray],
    interface: LayoutChange | None = None,
    classifier: Sequence[bool] | None = None,
    outputs: Callable[[], list[np.ndarray]] | None = None,
    known: list[ReferenceFacts] | None = None,
) -> ModelAgreement:
    """Max and mean absolute error against the reference, in output units; top-1 agreement for
    the outputs `classifier` marks as class scores (`tflfuse.convert.caveats.class_scores`; when it
    is not given, every (batch, classes) output). `interface` (a layout.LayoutChange) lays the
    source-layout inputs out for the model and its outputs back, when the two differ.
    `outputs`: what `model_outputs` gives for them, run elsewhere (a future's `result`, which
    raises as the run did); `known`: the reference's `ReferenceFacts`, shared by the models
    measured against it."""
    try:
        got = outputs() if outputs is not None else model_outputs(data, inputs, interface)
    except TflfuseError as exc:
        if "failed to run the model" in str(exc):  # (tflfuse.verification.runs)
            return {"verified": False, "runs": False, "reason": invoke_failure(exc)}
        return {"verified": False, "reason": str(exc)}
    except RuntimeError as exc:  # a kernel that fails at run time (e.g. an int8 DIV by zero)
        return {"verified": False, "runs": False, "reason": invoke_failure(exc)}
    rows: list[OutputAgreement] = []
    out: ModelAgreement = {"verified": True, "samples": len(inputs[0]), "outputs": rows}
    facts = known if known is not None else [ReferenceFacts(r) for r in reference]
    for k, (fact, cand) in enumerate(zip(facts, got)):
        ref = fact.ref
        cand = cand.reshape(ref.shape)
        diff = np.subtract(ref, cand)
        np.abs(diff, out=diff)  # (in place: one array of the output's size, not two)
        row: OutputAgreement = {
            "max_abs": float(diff.max()) if diff.size else 0.0,
            "mean_abs": float(diff.mean()) if diff.size else 0.0,
            "reference_range": fact.reference_range,
            "varies": fact.varies,
        }
        if row["varies"]:
            row["cosine"] = fact.cosine(cand)
            row["spread"] = fact.spread
        scores = classifier[k] if classifier is not None and k < len(classifier) else None
        if scores is None:
            scores = ref.ndim == 2 and ref.shape[1] > 1
        if scores:
            row["top1_agreement"] = float(np.mean(fact.ref_class == cand.argmax(1)))
            row["reference_classes"] = fact.reference_classes
        rows.append(row)
    out["max_abs"] = max((r["max_abs"] for r in rows), default=0.0)
    return out


class ReferenceFacts:
    """One reference output (in float64) and what `agreement` reads of it alone, computed once
    for all the models measured against it (its range, whether it varies, its deviations from
    its mean over the inputs, its classes), each as `agreement` computed it per model."""

    def __init__(self, reference: np.ndarray) -> None:
        self.ref = reference.astype(np.float64)

    @functools.cached_property
    def reference_range(self) -> float:
        ref = self.ref
        return float(ref.max() - ref.min()) if ref.size else 0.0

    @functools.cached_property
    def varies(self) -> bool:
        ref = self.ref
        return bool(len(ref) > 1 and not np.allclose(ref, ref[:1]))

    @functools.cached_property
    def _centered(self) -> np.ndarray:
        return self.ref - self.ref.mean(0)

    @functools.cached_property
    def spread(self) -> float:
        return float(np.sqrt(np.mean(self._centered**2)))

    @functools.cached_property
    def _deviations(self) -> tuple[np.ndarray, np.floating]:
        a = self._centered.ravel().astype(np.float64)
        return a, np.linalg.norm(a)

    def cosine(self, cand: np.ndarray) -> float:
        """`centered_cosine(ref, cand)`, the reference's half computed once."""
        a, norm_a = self._deviations
        b = (cand - cand.mean(0)).ravel().astype(np.float64, copy=False)  # (float64: no copy)
        norm = float(norm_a * np.linalg.norm(b))
        return float(a @ b / norm) if norm > 0 else 0.0

    @functools.cached_property
    def ref_class(self) -> np.ndarray:
        return self.ref.argmax(1)

    @functools.cached_property
    def reference_classes(self) -> int:
        return int(np.unique(self.ref_class).size)


def centered_cosine(ref: np.ndarray, cand: np.ndarray) -> float:
    """How well `cand` follows `ref` over the check inputs (axis 0): the cosine of the two
    outputs' deviations from their own means over the inputs (each element's Pearson-style
    agreement, pooled). 1: the candidate moves with the reference; 0: it ignores the input
    (a constant output) or moves unrelated to it. A plain cosine would not tell: a softmax
    that puts every input at its mean is already close to 1."""
    a = (ref - ref.mean(0)).ravel().astype(np.float64)
    b = (cand - cand.mean(0)).ravel().astype(np.float64)
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norm) if norm > 0 else 0.0


def _classifier_outputs(
    start: FloatRecord, source: Source, reference: list[np.ndarray], parse: ParseOnce
) -> list[bool]:
    """Which outputs of the source are class scores (tflfuse.convert.caveats.class_scores),
    judged on the float model the rules started from."""
    producers = caveats.output_producers(parse(start.data))
    sizes = [int(np.prod(s)) for s in source.input_shapes]
    only = len(reference) == 1
    return [
        caveats.class_scores(ref.shape, producers[k] if k < len(producers) else None, sizes, only)
        for k, ref in enumerate(reference)
    ]


def warnings(
    loaded: LoadRecord,
    legalization: LegalizeRecord,
    reference: list[np.ndarray],
    classifier: list[bool],
    agree: dict,
) -> list:
    """Every caveat of this conversion, one line each (tflfuse.convert.caveats)."""
    names = list(loaded.source.output_names)
    why = legalization.dropped
    dropped = [] if why is None else [f"the int8 legalization was not kept: {why}"]
    return [
        *caveats.calibration_warnings(loaded.calib, list(loaded.source.input_names)),
        *caveats.reference_warnings(reference, names, classifier),
        *caveats.error_warnings(agree, names),
        *dropped,
    ]


def delegate_check(model: Model, delegate: str) -> JSONDict:
    """Where the fused model's ops run on the recipe's delegate (tflfuse.targets)."""
    try:
        found = targets.find(delegate)  # the recipe's delegate: a name, checked here
        if found is None:
            choices = ", ".join(targets.names(predicts=True))
            raise TflfuseError(f"unknown target {delegate!r} (choose from {choices})")
        prediction = targets.predict(model, found)
    except (TflfuseError, AttributeError, KeyError, ValueError) as exc:
        return {"delegate": delegate, "checked": False, "reason": str(exc)}
    return {
        "delegate": delegate,
        "checked": True,
        "mapped": prediction.mapped,
        "cpu": prediction.cpu,
        "table": [list(row) for row in prediction.table()],
    }


class EdgeTPUCut(TypedDict, total=False):
    """One model's part of the report's `edgetpu` section (`edgetpu_cut`)."""

    mapped: int
    ops: int
    notes: list[str]
    cut: JSONDict  # index, op, status, reason of the op the compiler is predicted to cut at
    cpu_ops: list[str]
    other_readings: list[JSONDict]
    compile_modes: JSONDict
    _prediction: Prediction  # (popped before the report is written)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def edgetpu_cut(parsed: Model) -> EdgeTPUCut:
    """Where the Edge TPU compiler is predicted to cut the model (tflfuse.targets) and why, with
    the Prediction itself under `_prediction` (for the section's channels-last effect; popped
    before the report is written)."""
    prediction = targets.predict_edgetpu(parsed)
    out: EdgeTPUCut = {
        "mapped": prediction.mapped,
        "ops": len(prediction.ops),
        "notes": list(prediction.notes),
    }
    # ops after the cut name it in their reason; without any, the first CPU op is the cut
    marks = [re.match(r"after the cut at op (\d+)", o.reason) for o in prediction.ops]
    index = next((int(m.group(1)) for m in marks if m), None)
    cpu = [o for o in prediction.ops if o.runs_on == "cpu"]
    cut = next((o for o in cpu if o.index == index), cpu[0] if cpu else None)
    if cut is not None:
        out["cut"] = {"index": cut.index, "op": cut.op, "status": cut.status, "reason": cut.reason}
    out["cpu_ops"] = sorted({o.op for o in prediction.ops if o.runs_on == "cpu"})
    if prediction.other_readings:  # where the evidence cannot decide the compiler's placement
        out["other_readings"] = [
            {**r.to_dict(), "where": r.where} for r in prediction.other_readings
        ]
    out["compile_modes"] = compare_modes(parsed).to_dict()
    out["_prediction"] = prediction
    return out


def _edgetpu_section(
    models: dict[str, bytes], change: LayoutChange | None, parse: ParseOnce
) -> dict[str, Any]:
    """Stock against fused on the Edge TPU: mapped ops, the cut and its reason, and what the
    channels-last interface (`change`) changed for the mapping."""
    per = {k: edgetpu_cut(parse(models[k])) for k in ("fused", "stock")}
    section: dict[str, Any] = {}
    if change is not None:
        section["channels_last"] = layout.edgetpu_effect(
            parse(models["stock"]),
            per["stock"]["_prediction"],
            per["fused"]["_prediction"],
            change,
        )
    for k, v in per.items():
        v.pop("_prediction")
        section[k] = v
    return section


def _measured(
    loaded: LoadRecord,
    start: FloatRecord,
    groups: dict[str, dict[str, bytes]],
    eval_inputs: list[np.ndarray],
    parse: ParseOnce,
) -> tuple[list[np.ndarray], list[bool], dict[str, ModelAgreement], dict[str, ModelAgreement]]:
    """The source's outputs, which of them are class scores, and the agreement of each model
    of `groups` ("models": the written ones, "floats": the float ones) with the source. The
    models run `RUNS_AT_ONCE` at a time while the source runs here: independent interpreters,
    so each gives the outputs a run alone gives; they are measured in order, and each run's
    outputs are let go once measured."""
    src = loaded.source
    pool = ThreadPoolExecutor(RUNS_AT_ONCE)
    try:
        runs = {
            (group, k): pool.submit(model_outputs, v, eval_inputs, loaded.interface(k))
            for group, models in groups.items()
            for k, v in models.items()
        }
        reference = src.reference(eval_inputs)
        scores = _classifier_outputs(start, src, reference, parse)

        known = [ReferenceFacts(r) for r in reference]

        def measure(group: str, k: str, v: bytes) -> ModelAgreement:
            outputs = runs.pop((group, k)).result
            interface = loaded.interface(k)
            return agreement(v, eval_inputs, reference, interface, scores, outputs, known)

        agree, float_agree = (
            {k: measure(group, k, v) for k, v in groups[group].items()}
            for group in ("models", "floats")
        )
    finally:  # (on a failure, the runs not started are not started)
        pool.shutdown(cancel_futures=True)
    return reference, scores, agree, float_agree


def assemble(
    rec: Recipe,
    loaded: LoadRecord,
    start: FloatRecord,
    fused: OptimizeResult,
    unfused: UnfusedRecord,
    quantized: QuantizedRecord,
    legalization: LegalizeRecord,
    written: BaselinesRecord,
    *,
    seed: int,
    parse: ParseOnce | None = None,
) -> Report:
    """The report of one conversion from the recipe and the records its stages left
    (tflfuse.convert.records): sources and routes, each model's facts, agreement with the
    source, rules, quantization, the int8 legalization and the delegate check. `seed`: the
    conversion's; `parse` parses each model once (the caller may share it)."""
    parse = parse if parse is not None else ParseOnce()
    src = loaded.source
    eval_inputs = src.eval_inputs(loaded.calib, seed)
    models = written.models
    floats = {"fused": fused.data, "unfused": unfused.data}
    reference, scores, agree, float_agree = _measured(
        loaded, start, {"models": models, "floats": floats}, eval_inputs, parse
    )
    change = src.layout
    out: Report = {
        "source": src.name,
        "source_kind": src.describe(),
        "recipe": rec.to_dict(),
        "versions": {
            "tensorflow": _version("tensorflow"),
            "litert_quantizer": _version("litert-quantizer"),
            "tflfuse": _version("tflfuse"),
        },
        "inputs": [
            {"name": n, "shape": [src.batch, *s]} for n, s in zip(src.input_names, src.input_shapes)
        ],
        "outputs": list(src.output_names),
        "interface": change.to_dict() if change is not None else {"interface_change": False},
        "grappler": start.grappler,
        "rules": {**fused.result.to_dict(), "verification": fused.verification},
        "unfused_route": unfused.route,
        "quantization": _quantization(rec, loaded, quantized, written, seed, parse),
        "legalization": legalization.to_dict(),
        "models": {k: model_facts(v, parse(v)) for k, v in models.items()},
        "float_models": {k: model_facts(v, parse(v)) for k, v in floats.items()},
        "agreement": agree,
        "float_agreement": float_agree,
        "baseline_check": unfused.check,
        "class_score_outputs": [n for n, c in zip(src.output_names, scores) if c],
        "warnings": warnings(loaded, legalization, reference, scores, agree),
        "delegate_check": delegate_check(parse(models["fused"]), rec.delegate),
        "files": {
            "fused": "model.tflite",
            "unfused": "model_unfused.tflite",
            "stock": "model_stock.tflite",
        },
        "notices": list(src.notices),
    }
    if compiled_target(rec) is not None:  # (the Edge TPU: the one compiled target)
        out["edgetpu"] = _edgetpu_section(models, change, parse)
    return out


def _quantization(
    rec: Recipe,
    loaded: LoadRecord,
    quantized: QuantizedRecord,
    written: BaselinesRecord,
    seed: int,
    parse: ParseOnce,
) -> dict[str, Any]:
    """The report's quantization section: the mode, each model's route, the ops the fused model
    still computes in float, the calibration and the worst per-tensor errors."""
    src = loaded.source
    float_ops = float_compute_ops(parse(written.fused).main)
    int8 = rec.quant_mode == "int8" or src.quantized
    return {
        "mode": "int8 (input already quantized)" if src.quantized else rec.quant_mode,
        "fused_route": quantized.fused.route,
        "unfused_route": written.unfused.route,
        "stock_route": written.stock_route,
        "float_ops_left": float_ops,
        "edgetpu_valid": (not float_ops) if int8 else False,
        "calibration_samples": 0 if loaded.calib is None else len(loaded.calib[0]),
        "seed": seed,
        "layer_error": quantized.fused.layer_error[:20],
    }


def compiled_target(rec: Recipe) -> targets.Target | None:
    """The target an ahead-of-time compiler maps that the recipe builds for (or, failing that,
    checks against as its delegate): the report then shows the compiler's predicted mapping and
    where it cuts. The Edge TPU is the one such target (`Target.compiler`), so the section is its
    own (`_edgetpu_section`)."""
    for found in (rec.target, targets.find(rec.delegate)):
        if found is not None and found.compiler is not None:
            return found
    return None


def write(report: Report, folder: Path) -> None:
    folder = Path(folder)
    # (a name that is not UTF-8, a model path for one, is written with backslash escapes)
    text = json.dumps(report, indent=2, default=str) + "\n"
    (folder / "report.json").write_text(text, encoding="utf-8", errors="backslashreplace")
    (folder / "report.md").write_text(markdown(report), encoding="utf-8", errors="backslashreplace")


def stock_on_runtime(r: Report) -> str:
    """Whether the stock model (as its route writes it: not lowered) runs on `--runtime`."""
    section = r.get("runtime") or {}
    stock = section.get("stock") or {}
    if stock.get("runtime_ok", True):
        return f"The stock model runs there too ({r['files']['stock']})."
    return (
        f"The stock model ({r['files']['stock']}, as the plain route writes it) does not:"
        f" {stock.get('refusal')}."
    )


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def markdown(r: Report) -> str:
    """report.md: the report's sections, in the order a reader checks a conversion."""
    lines = _summary_lines(r)
    lines += _models_lines(r["models"])
    lines += _agreement_lines(r)
    lines += _grappler_lines(r.get("grappler") or {})
    lines += _rules_lines(r["rules"])
    lines += _quantization_lines(r["quantization"])
    lines += _legalization_lines(r.get("legalization") or {})
    lines += _edgetpu_lines(r.get("edgetpu"))
    lines += _delegate_lines(r["delegate_check"])
    lines += ["", f"Unfused baseline: {r['unfused_route']}."]
    lines += ["", f"Stock baseline: {r['quantization']['stock_route']}.", ""]
    return "\n".join(lines) + "\n"


def _summary_lines(r: Report) -> list[str]:
    """The title, the recipe in one sentence, then notices, warnings and an interface change."""
    rec = r["recipe"]
    q = r["quantization"]
    lines = [
        f"# tflfuse conversion: {r['source']}",
        "",
        f"Recipe **{rec['name']}** ({rec['description']}); target `{rec['target']}`, delegate"
        f" `{rec['delegate']}`; quantization `{q['mode']}`, I/O {rec['input_type']} ->"
        f" {rec['output_type']}. TensorFlow {r['versions']['tensorflow']}, litert-quantizer"
        f" {r['versions']['litert_quantizer']}.",
        "",
    ]
    made_for = r.get("runtime")
    if made_for:
        lines += [f"Made for **{made_for['made_for']}**: every op version model.tflite and"
                  f" model_unfused.tflite need is there (`--runtime`). {stock_on_runtime(r)}",
                  ""]  # fmt: skip
    kind = r.get("source_kind", {})
    if kind.get("kind") == "tflite":
        lines.append(f"Source: a .tflite, entered at the {kind.get('entered_at')} stage.")
    for notice in r.get("notices", []):
        lines.append(f"- notice: {notice}")
    if r.get("warnings"):
        lines += ["", "## Warnings", "", *(f"- {w}" for w in r["warnings"])]
    iface = r.get("interface", {})
    if iface.get("interface_change"):
        lines += ["", "**Interface change** (--channels-last): " + "; ".join(iface["details"])]
    return lines


def _models_lines(models: dict[str, Any]) -> list[str]:
    """The table of the written models: ops, activation and parameter bytes, file size."""
    lines = [
        "",
        "## Models",
        "",
        "| model | ops | activation bytes | parameter bytes | file | quantization |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, m in models.items():
        lines.append(
            f"| {name} | {m['op_count']} | {_kib(m['activation_bytes'])} |"
            f" {_kib(m['parameter_bytes'])} | {_kib(m['file_bytes'])} | {m['quantization']} |"
        )
    return lines


def _agreement_lines(r: Report) -> list[str]:
    """Each model's error against the source, and which outputs top-1 was computed for."""
    lines = [
        "",
        "## Agreement with the source model",
        "",
        "| model | max abs error | mean abs error | top-1 agreement |",
        "|---|---:|---:|---:|",
    ]
    for group in ("agreement", "float_agreement"):
        for name, a in r[group].items():
            label = name if group == "agreement" else f"{name} (float, before quantization)"
            if not a.get("verified"):
                lines.append(f"| {label} | not run: {a.get('reason')} | | |")
                continue
            o = a["outputs"][0]
            lines.append(f"| {label} | {a['max_abs']:.3g} | {o['mean_abs']:.3g} | {_top1(o)} |")
    scores = r.get("class_score_outputs")
    if scores is not None:
        lines += [
            "",
            "Top-1 is computed for class-score outputs only: shaped (batch, C >= 2), not the size"
            " of an input (a reconstruction), and written by SOFTMAX / LOG_SOFTMAX, or by a"
            " FULLY_CONNECTED / BATCH_MATMUL head that is the model's only output. Here:"
            f" {', '.join(scores) or 'none'}.",
        ]
    return lines


def _rules_lines(rules: dict[str, Any]) -> list[str]:
    """The rules that fired, with counts, and the first 30 refusals."""
    lines = ["", "## Rules", ""]
    fired = rules.get("fired", {})
    lines.append("Fired: " + (", ".join(f"{k} x{v}" for k, v in fired.items()) or "none"))
    checked = rewrites_checked(rules.get("verification") or {})
    if checked:
        lines.append(checked)
    for ref in rules.get("refusals", [])[:30]:
        lines.append(f"- refused {ref.get('rule')} at {ref.get('where')!r}: {ref.get('reason')}")
    return lines


def rewrites_checked(verification: Mapping[str, object]) -> str:
    """One sentence on the per-rewrite int8 check (verification.rewrite_check), '' when none ran."""
    # (the entries as verification.rewrite_check writes them: JSON objects)
    checked = cast("list[dict[str, Any]]", verification.get("rewrites") or [])
    skipped = cast("list[dict[str, Any]]", verification.get("rewrites_not_checked") or [])
    if not checked and not skipped:
        return ""
    text = f"int8 rewrites checked where they stand: {len(checked)}"
    if checked:
        worst = max(checked, key=lambda e: (e["seen_steps"] - e["allowed_steps"], e["seen_steps"]))
        ok = all(e["ok"] for e in checked)
        text += (
            f", {'each within' if ok else 'not all within'} its rule's steps (closest:"
            f" {worst['seen_steps']} of {worst['allowed_steps']} at {worst['tensor']!r})"
        )
    if skipped:
        text += f"; {len(skipped)} not checked alone ({skipped[0]['reason']})"
    return text + "."


def _quantization_lines(q: dict[str, Any]) -> list[str]:
    """The quantization routes, ops left in float and the ten worst tensors."""
    lines = [
        "",
        "## Quantization",
        "",
        f"Fused: {q['fused_route']}; unfused: {q['unfused_route']}; stock:"
        f" {q['stock_route']}. Calibration samples: {q['calibration_samples']} (seed"
        f" {q['seed']}).",
    ]
    if q["float_ops_left"]:
        lines.append(f"Ops still in float: {', '.join(sorted(set(q['float_ops_left'])))}.")
    if q["layer_error"] and "error" in q["layer_error"][0]:
        lines += ["", f"Per-tensor quantization error: {q['layer_error'][0]['error']}."]
    elif q["layer_error"]:
        lines += [
            "",
            "Worst per-tensor quantization error (litert-quantizer validator):",
            "",
            "| tensor | kind | metrics |",
            "|---|---|---|",
        ]
        for row in q["layer_error"][:10]:
            metrics = ", ".join(
                f"{k} {v:.3g}"
                for k, v in row.items()
                if k not in ("tensor", "kind") and isinstance(v, float)
            )
            lines.append(f"| {row.get('tensor', '')} | {row.get('kind', '')} | {metrics} |")
    return lines


def _delegate_lines(d: dict[str, Any]) -> list[str]:
    """How many ops the recipe's delegate takes, or why that was not checked."""
    lines = ["", "## Delegate check", ""]
    if d.get("checked"):
        lines.append(f"{d['delegate']}: {d['mapped']} ops mapped, {d['cpu']} on the CPU.")
    else:
        lines.append(f"{d['delegate']}: not checked ({d.get('reason')}).")
    return lines


def _top1(row: OutputAgreement) -> str:
    if "top1_agreement" not in row:
        return "-"
    if row.get("reference_classes") == 1:
        return f"{row['top1_agreement']:.3f} (one class: says nothing)"
    return f"{row['top1_agreement']:.3f}"


def _grappler_lines(g: dict[str, Any]) -> list[str]:
    if not g:
        return ["", "## Grappler", "", "Not run: the source is a .tflite (no TF graph)."]
    lines = [
        "",
        "## Grappler",
        "",
        f"Optimizers: {', '.join(g['optimizers'])} (remapper {g['remapper']}). Nodes"
        f" {g['nodes_before']} -> {g['nodes_after']}.",
        "",
    ]
    if g.get("dropped"):
        dropped = g["dropped"]
        lines += [f"Dropped {', '.join(dropped['optimizers'])}: {dropped['reason']}.", ""]
    for op, (b, a) in g["changed_node_types"].items():
        lines.append(f"- {op}: {b} -> {a}")
    return lines


def _legalization_lines(leg: dict[str, Any]) -> list[str]:
    lines = ["", "## int8 legalization", ""]
    if not leg.get("ran"):
        return [*lines, f"Not run: {leg.get('reason', 'not an int8 recipe')}."]
    fired = leg.get("fired", {})
    done = ", ".join(f"{k} x{v}" for k, v in fired.items()) or "nothing fired"
    if leg.get("reordered"):
        done += "; ops reordered (topological order)"
    kept = "kept (verified)" if leg.get("kept") else f"not kept: {leg.get('reason')}"
    checked = rewrites_checked(leg.get("verification") or {})
    if checked and leg.get("kept"):
        kept += f". {checked.rstrip('.')}"
    mapped = leg.get("edgetpu_mapped")
    tpu = f" Edge TPU mapped ops {mapped[0]} -> {mapped[1]}." if mapped else ""
    return [*lines, f"On the quantized fused model: {done}; {kept}.{tpu}"]


def _edgetpu_lines(section: dict[str, Any] | None) -> list[str]:
    if not section:
        return []
    lines = ["", "## Edge TPU mapping (predicted)", "", "| model | mapped | cut at | why |"]
    lines.append("|---|---:|---|---|")
    for name in ("fused", "stock"):
        p = section[name]
        cut = p.get("cut")
        where = f"op {cut['index']} {cut['op']}" if cut else "no cut"
        why = f"{cut['status']}: {cut['reason']}" if cut else "every op mapped"
        mapped = f"{p['mapped']}/{p['ops']}" + "".join(
            f" (or {r['mapped']}/{p['ops']} on the other reading of {r['where']}: undecided by"
            " the evidence)"
            for r in p.get("other_readings", [])
        )
        lines.append(f"| {name} | {mapped} | {where} | {why} |")
    cpu = section["fused"].get("cpu_ops")
    if cpu:
        lines += ["", f"Op types left on the CPU in the fused model: {', '.join(cpu)}."]
    if section.get("channels_last"):
        lines += ["", f"Channels-last: {section['channels_last']}."]
    for name in ("fused", "stock"):
        for reading in section[name].get("other_readings", []):
            lines += ["", f"{name}: {reading['reading']}."]
    return lines + _mode_lines(section)


def _mode_lines(section: dict[str, Any]) -> list[str]:
    """The compile modes of the fused and stock models (`targets.edgetpu.modes`): mapped ops,
    segments, CPU <-> Edge TPU crossings and their bytes, parameters cached and streamed per
    inference, and the mode to compile with and why."""
    rows = [(name, section[name].get("compile_modes")) for name in ("fused", "stock")]
    if not any(modes for _, modes in rows):
        return []
    lines = [
        "",
        "| model | mode | flags | mapped | segments | crossings | bytes crossing | parameters"
        " cached | streamed per inference |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, modes in rows:
        for m in (modes or {}).get("modes", []):
            best = " (best)" if m["mode"] == modes["best"] else ""
            lines.append(
                f"| {name} | {m['mode']}{best} | `{' '.join(m['flags']) or '(none)'}` |"
                f" {m['mapped']}/{m['ops']} | {m['segments']} | {m['crossings']} |"
                f" {m['crossing_bytes']:,} | {m.get('cached_bytes', 0):,} |"
                f" {m.get('streamed_bytes', 0):,} |"
            )
    fused = section["fused"].get("compile_modes")
    if fused:
        flags = " ".join(["edgetpu_compiler", *fused["best_flags"], "fused.tflite"])
        lines += ["", f"Compile the fused model with `{flags}`."]
        if fused.get("why"):
            lines.append(f"Why: {fused['why']}.")
        lines += _streamed_lines(fused, section["stock"].get("compile_modes"))
        lines += [f"Note: {n}." for n in fused.get("notes", [])]
    return lines


def _best(modes: dict[str, Any]) -> dict[str, Any] | None:
    return next((m for m in modes.get("modes", []) if m["mode"] == modes.get("best")), None)


def _streamed_lines(fused: dict[str, Any], stock: dict[str, Any] | None) -> list[str]:
    """Parameters streamed per inference, predicted, by the fused model beside stock's (each in
    its best mode), and one warning line when fused streams more: where a legalization that
    adds parameters may not pay on the Edge TPU."""
    ours, theirs = _best(fused), _best(stock) if stock else None
    if ours is None or "streamed_bytes" not in ours:
        return []
    line = f"Parameters streamed per inference (predicted, best mode): fused {_streamed(ours)}"
    if theirs is None or "streamed_bytes" not in theirs:
        return [line + "."]
    line += f", stock {_streamed(theirs)}."
    more = ours["streamed_bytes"] - theirs["streamed_bytes"]
    if more <= 0:
        return [line]
    return [
        line,
        f"Warning: the fused model streams {more:,} bytes more parameters per inference than"
        " stock: a legalization that adds parameters may not pay on the Edge TPU.",
    ]


def _streamed(mode: dict[str, Any]) -> str:
    """A mode's streamed bytes, its flags, and whether its layout is undecided in part."""
    n = int(mode["streamed_bytes"])
    flags = " ".join(mode["flags"]) or "one segment"
    undecided = (
        "; layout undecided in part" if mode.get("parameter_memory", {}).get("undecided") else ""
    )
    return f"{n:,} bytes ({mib(n)}, {flags}{undecided})"
