"""Keras / SavedModel / tf.function -> three .tflite models (fused, unfused, stock) and a report.

The route (see DESIGN.md):
  frozen TF graph --Grappler (the recipe's optimizer list, remapper off)--> optimized graph
  --TFLite MLIR converter--> float .tflite --tflfuse rules (recipe's target)--> fused float
  --ai-edge-quantizer (recipe's mode, calibration data)--> model.tflite
Baselines, with the same inputs and outputs:
  unfused  the same graph converted with every Keras layer output (or, without Keras layers, every
           TF op output) as an extra model output, which stops the converter fusing anything; the
           extra outputs are then trimmed on the IR (outputs and signature set back, dead code
           removed) and verified against the fused float model before it is quantized. When
           ai-edge-quantizer has no int8 config for one of a model's ops (RELU6 in unfused
           MobileNets), that model takes the converter's PTQ instead, so it is fully int8 and not
           padded with QUANTIZE/DEQUANTIZE pairs; the report names the route of each model.
  stock    the plain TFLite converter on the original function with its own PTQ.
Loading is `tflfuse.frontend`. Everything is written to a temporary folder beside OUTPUT_DIR and
renamed at the end, so a failed conversion leaves nothing half-written. TensorFlow is imported
lazily (here, in `frontend`, in `calibration` for images, in `quantize` via ai-edge-quantizer).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tflfuse import calibration as calib_mod
from tflfuse import flatbuffer
from tflfuse import recipe as recipe_mod
from tflfuse.errors import TflfuseError
from tflfuse.frontend import Frontend, every_op_output, load_model
from tflfuse.ir import Model, Signature
from tflfuse.rewrite import DeadCodeElimination

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

FUSED, UNFUSED, STOCK = "model.tflite", "model_unfused.tflite", "model_stock.tflite"


@dataclass
class ConversionResult:
    """Paths of the written models and the report (also written as report.json / report.md)."""

    output_dir: Path
    fused: Path
    unfused: Path
    stock: Path
    report: dict[str, Any] = field(default_factory=dict)


def _tf() -> Any:
    import tensorflow as tf

    return tf


def _note(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"tflfuse: {message}", file=sys.stderr)


# -- Grappler ------------------------------------------------------------------------------------
def run_grappler(frozen: Any, optimizers: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
    """The frozen graph optimized by Grappler with exactly `optimizers` (remapper off), as a
    pruned function with the same inputs and outputs, and node counts before and after."""
    tf = _tf()
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.grappler import tf_optimizer

    graph_def = frozen.graph.as_graph_def()
    meta = tf.compat.v1.train.export_meta_graph(graph_def=graph_def, graph=frozen.graph)
    fetch = meta.collection_def["train_op"]
    for t in frozen.outputs:
        fetch.node_list.value.append(t.name)
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.extend(list(optimizers))
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    rewrite.min_graph_nodes = -1
    optimized = tf_optimizer.OptimizeGraph(config, meta, graph_id=b"tflfuse")
    wrapped = tf.compat.v1.wrap_function(
        lambda: tf.compat.v1.import_graph_def(optimized, name=""), []
    )
    g = wrapped.graph
    pruned = wrapped.prune(
        feeds=[g.get_tensor_by_name(t.name) for t in frozen.inputs],
        fetches=[g.get_tensor_by_name(t.name) for t in frozen.outputs],
    )

    def census(gd: Any) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in gd.node:
            counts[node.op] = counts.get(node.op, 0) + 1
        return counts

    before, after = census(graph_def), census(optimized)
    changed = {
        k: [before.get(k, 0), after.get(k, 0)]
        for k in sorted(set(before) | set(after))
        if before.get(k, 0) != after.get(k, 0)
    }
    info = {
        "optimizers": list(optimizers),
        "remapper": "off",
        "nodes_before": len(graph_def.node),
        "nodes_after": len(optimized.node),
        "changed_node_types": changed,
    }
    return (pruned, wrapped), info


# -- the TFLite converter ------------------------------------------------------------------------
def _flex_ops(message: str) -> list[str]:
    ops = set(re.findall(r"\btf\.([A-Z][A-Za-z0-9_]*)", message))
    ops |= set(re.findall(r"Flex([A-Z][A-Za-z0-9_]*)", message))
    return sorted(ops)


def tflite_convert(
    function: Any,
    trackable: Any = None,
    *,
    select_tf_ops: bool = False,
    target: str = "xnnpack",
    configure: Callable[[Any], None] | None = None,
) -> bytes:
    """Run the MLIR converter on one concrete function (raises a one-line TflfuseError)."""
    tf = _tf()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function], trackable)
    ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if select_tf_ops:
        ops.append(tf.lite.OpsSet.SELECT_TF_OPS)
    converter.target_spec.supported_ops = ops
    if configure is not None:
        configure(converter)
    try:
        return bytes(converter.convert())
    except Exception as exc:  # ConverterError and friends
        text = str(exc)
        names = _flex_ops(text)
        if names:
            hint = (
                "pass --select-tf-ops to keep them as TF (Flex) ops, CPU only"
                if target in ("xnnpack", "cpu")
                else f"the {target} cannot run TF ops; replace them in the model"
            )
            raise TflfuseError(
                f"the model uses TF ops with no TFLite builtin: {', '.join(names)} ({hint})"
            ) from None
        first = next((line for line in text.splitlines() if "error" in line.lower()), text)
        raise TflfuseError(f"the TFLite converter failed: {first.strip()[:300]}") from None


def _name_of(graph_name: str) -> str:
    return graph_name.split(":")[0]


def set_signature(model: Model, front: Frontend, output_graph_names: list[str]) -> None:
    """Order the main graph's outputs as the source model's and give it a serving signature."""
    graph = model.main
    by_name = {t.name: t for t in graph.outputs}
    ordered = []
    for i, gname in enumerate(output_graph_names):
        t = by_name.get(_name_of(gname))
        if t is None:
            t = graph.outputs[i] if i < len(graph.outputs) else None
        if t is None:
            raise TflfuseError(f"converted model lost output {gname}")
        ordered.append(t)
    graph.outputs = ordered
    model.signatures = [
        Signature(
            "serving_default",
            0,
            dict(zip(front.input_names, graph.inputs)),
            dict(zip(front.output_names, ordered)),
        )
    ]


# -- unfused baseline ----------------------------------------------------------------------------
def unfused_function(
    front: Frontend, optimizers: tuple[str, ...]
) -> tuple[Any, Any, list[str], int]:
    """The source function with every Keras layer output (else every TF op output) as an extra
    output, after Grappler: (function, keep-alive, names of the real outputs, extra count)."""
    n_out = len(front.function.outputs)
    frozen = front.wide if front.wide is not None else every_op_output(front.function)
    (pruned, keep), _ = run_grappler(frozen, optimizers)
    wanted = [_name_of(t.name) for t in frozen.outputs[:n_out]]
    return pruned, keep, wanted, len(frozen.outputs) - n_out


def trim_outputs(data: bytes, wanted: list[str], front: Frontend) -> bytes:
    """Keep only the outputs named `wanted` (in that order), drop dead code, set the signature."""
    model = flatbuffer.from_bytes(data, "unfused")
    graph = model.main
    by_name = {t.name: t for t in graph.outputs}
    if not all(w in by_name for w in wanted):
        raise TflfuseError("unfused baseline: the converter renamed the model outputs; cannot trim")
    graph.outputs = [by_name[w] for w in wanted]
    DeadCodeElimination().run(graph)
    graph.toposort()
    model.signatures = [
        Signature(
            "serving_default",
            0,
            dict(zip(front.input_names, graph.inputs)),
            dict(zip(front.output_names, graph.outputs)),
        )
    ]
    model.validate()
    return flatbuffer.to_bytes(model)


# -- the converter's own quantization (stock, and the fallback route) ---------------------------
def ptq_configure(
    recipe: Any, calibration: list[np.ndarray] | None, progress: bool, desc: str, batch: int = 1
) -> Callable[[Any], None]:
    """A converter set-up applying the recipe's quantization with the converter's own PTQ."""
    tf = _tf()
    from tflfuse.quantize import _progress

    def configure(converter: Any) -> None:
        mode = recipe.quant_mode
        if mode == "none":
            return
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if mode == "float16":
            converter.target_spec.supported_types = [tf.float16]
        elif mode == "int8":
            assert calibration is not None
            b = batch
            n = len(calibration[0]) // b

            def representative() -> Any:
                for i in _progress(range(n), n, desc, progress):
                    yield [a[i * b : (i + 1) * b] for a in calibration]

            converter.representative_dataset = representative
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            if recipe.input_type != "float32":
                converter.inference_input_type = getattr(tf, recipe.input_type)
            if recipe.output_type != "float32":
                converter.inference_output_type = getattr(tf, recipe.output_type)

    return configure


def stock_model(
    front: Frontend, recipe: Any, calibration: list[np.ndarray] | None, progress: bool
) -> bytes:
    """The plain converter on the original function with its own quantization."""
    configure = ptq_configure(recipe, calibration, progress, "calibrating stock", front.batch)
    data = tflite_convert(
        front.function,
        None,
        select_tf_ops=recipe.select_tf_ops,
        target=recipe.target,
        configure=configure,
    )
    model = flatbuffer.from_bytes(data, "stock")
    set_signature(model, front, [t.name for t in front.function.outputs])
    return flatbuffer.to_bytes(model)


# -- orchestration -------------------------------------------------------------------------------
def _prepare_output(output_dir: Path) -> Path:
    """A fresh temp folder beside `output_dir` (checked writable before any heavy work)."""
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise TflfuseError(f"{output_dir}: exists and is not a folder")
    parent = output_dir.resolve().parent
    if not parent.is_dir():
        raise TflfuseError(f"{output_dir}: parent folder {parent} does not exist")
    target = output_dir if output_dir.exists() else parent
    if not os.access(target, os.W_OK | os.X_OK):
        raise TflfuseError(f"{output_dir}: cannot write there (permission denied)")
    try:
        return Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=parent))
    except OSError as exc:
        raise TflfuseError(f"{output_dir}: cannot write there: {exc.strerror or exc}") from None


def _publish(tmp: Path, output_dir: Path) -> None:
    output_dir = Path(output_dir)
    if not output_dir.exists():
        os.replace(tmp, output_dir)
        return
    for item in sorted(tmp.iterdir()):
        os.replace(item, output_dir / item.name)
    tmp.rmdir()


def convert_keras(
    model: Any,
    recipe: str | Path = "xnnpack-int8",
    calibration: Any = None,
    output_dir: Path = Path("out"),
    seed: int = 0,
    *,
    batch: int = 1,
    allow_lambda: bool = False,
    progress: bool = True,
    quiet: bool = True,
    verify: bool = True,
    **overrides: Any,
) -> ConversionResult:
    """Convert `model` with `recipe` (name or .toml; `overrides` replace recipe fields) and write
    model.tflite, model_unfused.tflite, model_stock.tflite, report.json and report.md."""
    from tflfuse import report as report_mod

    started = time.perf_counter()
    rec = recipe_mod.load(recipe).override(**overrides) if overrides else recipe_mod.load(recipe)
    if batch < 1:
        raise TflfuseError(f"batch size must be at least 1, not {batch}")
    if rec.quant_mode == "int8" and calibration is None:
        raise TflfuseError(
            f"recipe {rec.name!r} quantizes to int8 and needs calibration data (--calib DATA:"
            " .npy, .npz, a folder of images)"
        )
    output_dir = Path(output_dir)
    tmp = _prepare_output(output_dir)
    try:
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        front = load_model(model, batch=batch, allow_lambda=allow_lambda, quiet=quiet)
        for notice in front.notices:
            _note(notice, quiet)
        timings["load"] = time.perf_counter() - t0
        calib = calib_mod.load(
            calibration,
            front.input_shapes,
            front.input_names,
            samples=rec.samples,
            seed=seed,
            scale=rec.scale,
            offset=rec.offset,
        )
        if calib is not None and len(calib[0]) < front.batch:
            raise TflfuseError(
                f"{len(calib[0])} calibration samples cannot fill one batch of {front.batch}"
            )
        result = _convert(front, rec, calib, tmp, seed, progress, timings, verify)
        result["notices"] = front.notices
        result["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
        result["timings_s"]["total"] = round(time.perf_counter() - started, 3)
        report_mod.write(result, tmp)
        _publish(tmp, output_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ConversionResult(
        output_dir, output_dir / FUSED, output_dir / UNFUSED, output_dir / STOCK, result
    )


# Grappler's CSE puts the inputs of commutative ops in a canonical order, which can hide a
# pattern the converter legalizes by position (seen: Keras' exact GELU, 0.5*x*erfc(-x/sqrt 2),
# then stays a tf.Erfc with no TFLite builtin). Such a model is converted without that pass.
_ORDER_SENSITIVE = ("common_subgraph_elimination",)


def _grappler_and_convert(
    front: Frontend, rec: Any
) -> tuple[tuple[str, ...], Any, Any, dict, bytes]:
    """Grappler with the recipe's optimizers, then the converter to float. If the converter is
    left with TF ops only because of an order-sensitive pass, retry without it and say so."""
    optimizers = tuple(rec.grappler)
    (pruned, keep), info = run_grappler(front.function, optimizers)
    try:
        data = tflite_convert(pruned, keep, select_tf_ops=rec.select_tf_ops, target=rec.target)
        return optimizers, pruned, keep, info, data
    except TflfuseError as first:
        fewer = tuple(o for o in optimizers if o not in _ORDER_SENSITIVE)
        if fewer == optimizers or "no TFLite builtin" not in str(first):
            raise
        (pruned, keep), info = run_grappler(front.function, fewer)
        try:
            data = tflite_convert(pruned, keep, select_tf_ops=rec.select_tf_ops, target=rec.target)
        except TflfuseError:
            raise first from None
        dropped = [o for o in optimizers if o not in fewer]
        info["dropped"] = {
            "optimizers": dropped,
            "reason": f"with them the converter left TF ops ({first}); without them it did not",
        }
        return fewer, pruned, keep, info, data


def _convert(
    front: Frontend,
    rec: Any,
    calib: list[np.ndarray] | None,
    tmp: Path,
    seed: int,
    progress: bool,
    timings: dict[str, float],
    verify: bool = True,
) -> dict[str, Any]:
    tf = _tf()
    from tflfuse.optimize import optimize_bytes
    from tflfuse.quantize import Quantized, aeq_unsupported, float_compute_ops, quantize

    def lap(name: str, t0: float) -> None:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0

    t0 = time.perf_counter()
    optimizers, pruned, keep, grappler, float_data = _grappler_and_convert(front, rec)
    float_model = flatbuffer.from_bytes(float_data, "converter")
    set_signature(float_model, front, [t.name for t in front.function.outputs])
    float_data = flatbuffer.to_bytes(float_model)
    lap("convert_float", t0)  # Grappler, the converter and the signature

    t0 = time.perf_counter()
    fused = optimize_bytes(
        float_data, level=rec.level, target=rec.target, source="converter", verify=verify
    )
    fused_float = fused.data
    lap("fuse", t0)

    t0 = time.perf_counter()
    u_fn, u_keep, wanted, extra_outputs = unfused_function(front, optimizers)
    u_float = tflite_convert(u_fn, u_keep, select_tf_ops=rec.select_tf_ops, target=rec.target)
    unfused_float_data = trim_outputs(u_float, wanted, front)
    lap("unfused", t0)

    eval_inputs = _eval_inputs(front, calib, seed)
    reference = _reference_outputs(front, eval_inputs)
    from tflfuse.verify import compare

    # the fused model may hold declared approximations (e.g. erf GELU in the tanh form for the
    # Edge TPU): the baseline is held to the tolerance its own verification used
    atol = max(1e-5, fused.verification.get("tolerance", {}).get("atol", 1e-5))
    baseline_check = compare(fused_float, unfused_float_data, atol=atol, rtol=1e-4, seed=seed)
    if not baseline_check.ok:
        raise TflfuseError(
            f"unfused baseline differs from the fused float model by {baseline_check.max_abs:.3g};"
            " nothing written"
        )

    t0 = time.perf_counter()
    qkw = {"input_type": rec.input_type, "output_type": rec.output_type, "progress": progress}
    fused_left = aeq_unsupported(fused_float) if rec.quant_mode == "int8" else []
    if not fused_left:
        fused_q = quantize(
            fused_float, rec.quant_mode, calib, desc="calibrating fused", layer_error=True, **qkw
        )
    else:
        # ai-edge-quantizer has no int8 config for these ops, so its model would not be fully
        # int8 (not Edge TPU-valid): use the converter's PTQ and run the rules on the int8 IR.
        configure = ptq_configure(
            rec, calib, progress, "calibrating fused (converter)", front.batch
        )
        data = tflite_convert(
            pruned, keep, select_tf_ops=rec.select_tf_ops, target=rec.target, configure=configure
        )
        qmodel = flatbuffer.from_bytes(data, "converter-int8")
        set_signature(qmodel, front, [t.name for t in front.function.outputs])
        ruled = optimize_bytes(
            flatbuffer.to_bytes(qmodel),
            level=rec.level,
            target=rec.target,
            verify=verify,
            source="converter-int8",
        )
        fused_q = Quantized(
            ruled.data,
            "TFLite converter PTQ, then tflfuse rules on the int8 graph (ai-edge-quantizer has"
            f" no int8 config for {', '.join(fused_left)})",
        )
    fused_q.float_ops = float_compute_ops(flatbuffer.from_bytes(fused_q.data).main)
    unfused_left = aeq_unsupported(unfused_float_data) if rec.quant_mode == "int8" else []
    if not unfused_left:
        unfused_q = quantize(
            unfused_float_data, rec.quant_mode, calib, desc="calibrating unfused", **qkw
        )
    else:
        # Same route change for the baseline, so it is not padded with QUANTIZE/DEQUANTIZE pairs.
        configure = ptq_configure(
            rec, calib, progress, "calibrating unfused (converter)", front.batch
        )
        data = tflite_convert(
            u_fn, u_keep, select_tf_ops=rec.select_tf_ops, target=rec.target, configure=configure
        )
        unfused_q = Quantized(
            trim_outputs(data, wanted, front),
            "TFLite converter PTQ on the output-blocked graph, then trimmed (ai-edge-quantizer"
            f" has no int8 config for {', '.join(unfused_left)})",
        )
    lap("quantize", t0)
    t0 = time.perf_counter()
    stock = stock_model(front, rec, calib, progress)
    lap("stock", t0)

    models = {"fused": fused_q.data, "unfused": unfused_q.data, "stock": stock}
    for name, data in zip((FUSED, UNFUSED, STOCK), models.values()):
        (tmp / name).write_bytes(data)

    from tflfuse import report as report_mod

    agreement = {k: report_mod.agreement(v, eval_inputs, reference) for k, v in models.items()}
    floats = {"fused": fused_float, "unfused": unfused_float_data}
    float_agreement = {
        k: report_mod.agreement(v, eval_inputs, reference) for k, v in floats.items()
    }
    import ai_edge_quantizer  # noqa: F401 - version for the report

    return {
        "source": front.source,
        "recipe": rec.to_dict(),
        "versions": {
            "tensorflow": tf.__version__,
            "ai_edge_quantizer": _version("ai-edge-quantizer"),
            "tflfuse": _version("tflfuse"),
        },
        "inputs": [
            {"name": n, "shape": [front.batch, *s]}
            for n, s in zip(front.input_names, front.input_shapes)
        ],
        "outputs": list(front.output_names),
        "grappler": grappler,
        "rules": {**fused.result.to_dict(), "verification": fused.verification},
        "unfused_route": (
            f"converted with {extra_outputs} extra outputs ("
            + ("every Keras layer output" if front.keras is not None else "every TF op output")
            + ") to block fusion, then trimmed on the IR and dead-code eliminated"
        ),
        "quantization": {
            "mode": rec.quant_mode,
            "fused_route": fused_q.route,
            "unfused_route": unfused_q.route,
            "stock_route": "TFLite converter PTQ" if rec.quant_mode != "none" else "none",
            "float_ops_left": fused_q.float_ops,
            "edgetpu_valid": (not fused_q.float_ops if rec.quant_mode == "int8" else False),
            "calibration_samples": 0 if calib is None else len(calib[0]),
            "seed": seed,
            "layer_error": fused_q.layer_error[:20],
        },
        "models": {k: report_mod.model_facts(v) for k, v in models.items()},
        "float_models": {k: report_mod.model_facts(v) for k, v in floats.items()},
        "agreement": agreement,
        "float_agreement": float_agreement,
        "baseline_check": baseline_check.to_dict(),
        "delegate_check": report_mod.delegate_check(models["fused"], rec.delegate),
        "files": {"fused": FUSED, "unfused": UNFUSED, "stock": STOCK},
    }


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def _eval_inputs(front: Frontend, calib: list[np.ndarray] | None, seed: int) -> list[np.ndarray]:
    """Inputs the three models are checked on: calibration samples, else seeded [-1, 1] noise."""
    b = front.batch
    if calib is not None:
        n = max(16 // b, 1) * b
        return [a[:n] for a in calib]
    rng = np.random.default_rng(seed + 1000)
    n = max(8 // b, 2) * b
    return [rng.uniform(-1, 1, (n, *s)).astype(np.float32) for s in front.input_shapes]


def _reference_outputs(front: Frontend, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Outputs of the source model (the frozen TF function), one array per output."""
    tf = _tf()
    per_sample = []
    b = front.batch
    for i in range(len(inputs[0]) // b):
        xs = [tf.constant(a[i * b : (i + 1) * b]) for a in inputs]
        outs = front.function(*xs)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        per_sample.append([np.asarray(o) for o in outs])
    return [np.concatenate([s[k] for s in per_sample]) for k in range(len(per_sample[0]))]
