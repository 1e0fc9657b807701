"""The TensorFlow route of `tflfuse convert`: a Keras model, SavedModel or tf.function as a source.

  frozen TF graph --Grappler (the recipe's optimizer list, remapper off)--> optimized graph
  --TFLite MLIR converter--> float .tflite (the stage where a .tflite from elsewhere enters)
Baselines, with the same inputs and outputs:
  unfused  the same graph converted with every Keras layer output (or, without Keras layers, every
           TF op output) as an extra model output, which stops the converter fusing anything; the
           extra outputs are then trimmed on the IR (outputs and signature set back, dead code
           removed). When litert-quantizer has no int8 config for one of its ops (RELU6 in
           unfused MobileNets), it takes the converter's PTQ instead, so it is fully int8.
  stock    the plain TFLite converter on the original function with its own PTQ.
`KerasSource` wraps a loaded `Frontend` with these steps; `convert` calls them stage by stage.
TensorFlow is imported lazily.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from tflfuse.errors import TflfuseError
from tflfuse.ir import Model, Signature, flatbuffer
from tflfuse.json_types import JSONDict
from tflfuse.quiet import progress_bar
from tflfuse.rewrite import DeadCodeElimination
from tflfuse.sources.keras import Frontend, every_op_output
from tflfuse.sources.keras_calibration import statistics_by_interpreter
from tflfuse.sources.layout import LayoutChange
from tflfuse.sources.recipe_fields import RecipeFields
from tflfuse.targets import XNNPACK, Target

if TYPE_CHECKING:  # TensorFlow's types: it ships no annotations, so the checker reads them as Any
    import tensorflow as tf


def _tf() -> Any:
    import tensorflow as tf

    return tf


# -- Grappler ------------------------------------------------------------------------------------
def run_grappler(
    frozen: tf.types.experimental.ConcreteFunction, optimizers: tuple[str, ...]
) -> tuple[tuple[tf.types.experimental.ConcreteFunction, object], JSONDict]:
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
    info: JSONDict = {
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
    function: tf.types.experimental.ConcreteFunction,
    trackable: object = None,
    *,
    select_tf_ops: bool = False,
    target: Target = XNNPACK,
    configure: Callable[[tf.lite.TFLiteConverter], None] | None = None,
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
        with statistics_by_interpreter():  # (its PTQ calibration, the same statistics faster)
            return bytes(converter.convert())
    except Exception as exc:  # ConverterError and friends
        text = str(exc)
        names = _flex_ops(text)
        if names:
            hint = (
                "tflfuse converts to TFLite builtins only; replace them in the model"
                if target.on_cpu
                else f"the {target.name} cannot run TF ops; replace them in the model"
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
) -> tuple[tf.types.experimental.ConcreteFunction, object, list[str], int]:
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
    recipe: RecipeFields,
    calibration: list[np.ndarray] | None,
    progress: bool,
    desc: str,
    batch: int = 1,
) -> Callable[[tf.lite.TFLiteConverter], None]:
    """A converter set-up applying the recipe's quantization with the converter's own PTQ."""
    tf = _tf()

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
                for i in progress_bar(range(n), n, desc, progress):
                    yield [a[i * b : (i + 1) * b] for a in calibration]

            converter.representative_dataset = representative
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            if recipe.input_type != "float32":
                converter.inference_input_type = getattr(tf, recipe.input_type)
            if recipe.output_type != "float32":
                converter.inference_output_type = getattr(tf, recipe.output_type)

    return configure


def stock_model(
    front: Frontend, recipe: RecipeFields, calibration: list[np.ndarray] | None, progress: bool
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


# Grappler's CSE puts the inputs of commutative ops in a canonical order, which can hide a
# pattern the converter legalizes by position (seen: Keras' exact GELU, 0.5*x*erfc(-x/sqrt 2),
# then stays a tf.Erfc with no TFLite builtin). Such a model is converted without that pass.
_ORDER_SENSITIVE = ("common_subgraph_elimination",)


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


def _eval_noise(shapes: list[tuple[int, ...]], batch: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + 1000)
    n = max(8 // batch, 2) * batch
    return [rng.uniform(-1, 1, (n, *s)).astype(np.float32) for s in shapes]


class KerasSource:
    """A Keras model, SavedModel or tf.function taken through TensorFlow to a float .tflite
    (a `tflfuse.sources.protocol.Source`).

    The steps keep what the later ones need (the Grappler-optimized function for the converter's
    PTQ, the output-blocked function for the unfused baseline), so nothing is traced twice."""

    kind = "tensorflow"
    quantized = False  # the source computes in float: convert quantizes it

    def __init__(self, front: Frontend) -> None:
        self.front = front
        self.name = front.source
        self.input_names = list(front.input_names)
        self.input_shapes = list(front.input_shapes)
        self.output_names = list(front.output_names)
        self.batch = front.batch
        self.notices = list(front.notices)
        self.graph_info: dict[str, Any] = {}
        self.layout: LayoutChange | None = None  # the rules' models keep the source's interface
        self._optimizers: tuple[str, ...] = ()
        self._pruned: Any = None
        self._keep: Any = None
        self._unfused: tuple[Any, Any, list[str]] | None = None

    # -- TF graph and float .tflite ----------------------------------------------------------
    def tf_graph(self, rec: RecipeFields) -> None:
        """Grappler with the recipe's optimizers (remapper off); the node counts for the report
        in `graph_info`."""
        self._optimizers = tuple(rec.grappler)
        (self._pruned, self._keep), self.graph_info = run_grappler(
            self.front.function, self._optimizers
        )

    def float_tflite(self, rec: RecipeFields) -> bytes:
        """The converter on the optimized graph, outputs ordered and signed as the source's. If it
        is left with TF ops only because of an order-sensitive Grappler pass, retry without it."""
        try:
            data = self._convert(rec)
        except TflfuseError as first:
            fewer = tuple(o for o in self._optimizers if o not in _ORDER_SENSITIVE)
            if fewer == self._optimizers or "no TFLite builtin" not in str(first):
                raise
            dropped = [o for o in self._optimizers if o not in fewer]
            self._optimizers = fewer
            (self._pruned, self._keep), self.graph_info = run_grappler(self.front.function, fewer)
            try:
                data = self._convert(rec)
            except TflfuseError:
                raise first from None
            self.graph_info["dropped"] = {
                "optimizers": dropped,
                "reason": f"with them the converter left TF ops ({first}); without them it did not",
            }
        return self._signed(data, "converter")

    def _convert(self, rec: RecipeFields, configure: Callable[[Any], None] | None = None) -> bytes:
        return tflite_convert(
            self._pruned,
            self._keep,
            select_tf_ops=rec.select_tf_ops,
            target=rec.target,
            configure=configure,
        )

    def _signed(self, data: bytes, what: str) -> bytes:
        model = flatbuffer.from_bytes(data, what)
        set_signature(model, self.front, [t.name for t in self.front.function.outputs])
        return flatbuffer.to_bytes(model)

    # -- baselines -----------------------------------------------------------------------------
    def unfused_float(
        self, rec: RecipeFields, fused_float: bytes, verify: bool = True
    ) -> tuple[bytes, str]:
        """The output-blocked graph converted and trimmed back to the real outputs (checked by
        convert's unfused stage, unless `verify` is off)."""
        fn, keep, wanted, extra = unfused_function(self.front, self._optimizers)
        self._unfused = (fn, keep, wanted)
        data = tflite_convert(fn, keep, select_tf_ops=rec.select_tf_ops, target=rec.target)
        what = "every Keras layer output" if self.front.keras is not None else "every TF op output"
        route = (
            f"converted with {extra} extra outputs ({what}) to block fusion, then trimmed on the"
            " IR and dead-code eliminated"
        )
        return trim_outputs(data, wanted, self.front), route

    def converter_ptq(
        self, which: str, rec: RecipeFields, calib: list[np.ndarray] | None, progress: bool
    ) -> bytes:
        """`which` ("fused" or "unfused") quantized with the converter's own PTQ, without rules:
        the route for a model litert-quantizer cannot make fully int8."""
        configure = ptq_configure(
            rec, calib, progress, f"calibrating {which} (converter)", self.batch
        )
        if which == "fused":
            return self._signed(self._convert(rec, configure), "converter-int8")
        assert self._unfused is not None, "unfused_float runs before converter_ptq"
        fn, keep, wanted = self._unfused
        data = tflite_convert(
            fn, keep, select_tf_ops=rec.select_tf_ops, target=rec.target, configure=configure
        )
        return trim_outputs(data, wanted, self.front)

    def stock(
        self, rec: RecipeFields, calib: list[np.ndarray] | None, progress: bool
    ) -> tuple[bytes, str]:
        """What the user gets without tflfuse: the plain converter on the original function with
        its own quantization (int8: its own PTQ and calibration on the same data, with the
        recipe's I/O types through inference_input_type / inference_output_type), as written."""
        if rec.quant_mode == "none":
            route = "the TFLite converter (float), as it writes the model"
        else:
            route = f"the TFLite converter's own {rec.quant_mode} quantization"
            if rec.quant_mode == "int8":
                route += (
                    " (its PTQ, calibrated on the same data; inference_input_type"
                    f" {rec.input_type}, inference_output_type {rec.output_type})"
                )
            route += " on the original function, ops as the converter wrote them"
        return stock_model(self.front, rec, calib, progress), route

    # -- the function all three models are measured against ------------------------------------
    def eval_inputs(self, calib: list[np.ndarray] | None, seed: int) -> list[np.ndarray]:
        """Calibration samples, else seeded [-1, 1] noise (whole batches)."""
        b = self.batch
        if calib is not None:
            n = max(16 // b, 1) * b
            return [a[:n] for a in calib]
        return _eval_noise(self.input_shapes, b, seed)

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return _reference_outputs(self.front, inputs)

    def describe(self) -> JSONDict:
        return {"kind": self.kind, "entered_at": "load (TensorFlow)", "quantized_input": False}
