"""Load what the user gave (keras.Model, .keras, legacy .h5, SavedModel folder, tf.function) as
one frozen TF function with static shapes, the input and output names, and, for Keras models,
the same graph with every layer output as an extra output (for the unfused baseline).

Keras files are checked for code (Lambda layers, serialized functions, custom objects; see
`tflfuse.sources.safety`) from their parsed config before any loader runs, and refused unless the
user allows it; Keras 3 then loads in safe mode as well. A SavedModel is code by nature (not
checked). Keras 3 refuses some legacy Keras 2 .h5 files; tf-keras loads those. A dynamic batch
dimension is pinned (default 1) with a notice. TensorFlow is imported lazily; only
`convert` uses this module.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tflfuse.errors import TflfuseError
from tflfuse.sources.safety import check_keras_file, read_config
from tflfuse.sources.tflite import is_tflite

if TYPE_CHECKING:  # TensorFlow's types: it ships no annotations, so the checker reads them as Any
    import tensorflow as tf

_SKIP_NODES = frozenset({"Const", "Identity", "IdentityN", "Placeholder", "NoOp", "StopGradient"})


@dataclass
class Frontend:
    """The model as one frozen TF function plus what the report and the baselines need."""

    function: Any  # frozen ConcreteFunction, variables inlined as constants
    input_names: list[str]
    input_shapes: list[tuple[int, ...]]  # without the batch dimension
    output_names: list[str]
    batch: int
    source: str
    keras: Any = None  # the Keras model, when there is one
    wide: Any = None  # frozen function: real outputs, then every Keras layer output
    notices: list[str] = field(default_factory=list)


def _tf() -> Any:
    import tensorflow as tf

    return tf


def _is_keras_model(obj: Any) -> bool:
    return any(c.__name__ in ("Model", "Functional", "Sequential") for c in type(obj).__mro__) and (
        hasattr(obj, "layers")
    )


def _load_keras_file(path: Path, allow_lambda: bool) -> Any:
    if not allow_lambda:
        # before any loader runs: legacy .h5 loading (tf-keras) has no safe mode at all
        check_keras_file(path)
    if path.suffix in (".h5", ".hdf5") and read_config(path) is None:
        # read with h5py alone: said in a second, not after TensorFlow's import and a
        # loader's "No model config found in the file at <GFile object at 0x...>"
        raise TflfuseError(
            f"{path}: an HDF5 file with no Keras model in it (no model_config: weights only?);"
            " give the file model.save() wrote"
        )
    import keras

    legacy = path.suffix in (".h5", ".hdf5")
    try:
        return keras.saving.load_model(path, compile=False, safe_mode=not allow_lambda)
    except ValueError as exc:
        text = str(exc)
        if "safe_mode" in text or "Lambda" in text:
            raise TflfuseError(
                f"{path}: holds a Lambda layer (arbitrary Python code); refused in safe mode"
                " (pass --allow-lambda if you trust the file)"
            ) from None
        if not legacy:
            raise TflfuseError(f"{path}: Keras cannot load it: {_first_line(exc, path)}") from None
    except (OSError, TypeError) as exc:
        if not legacy:
            raise TflfuseError(f"{path}: Keras cannot load it: {_first_line(exc, path)}") from None
    return _load_legacy_h5(path)


def _first_line(exc: BaseException, path: Path) -> str:
    """An exception's first line, with the file objects loaders print ("<...GFile object at
    0x7f...>") replaced by the path."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return re.sub(r"<[\w.]+ object at 0x[0-9a-fA-F]+>", str(path), text)


def _load_legacy_h5(path: Path) -> Any:
    """Legacy Keras 2 .h5 files that Keras 3 refuses: load them with tf-keras."""
    try:
        import tf_keras
    except ImportError:
        raise TflfuseError(f"{path}: Keras 3 cannot load it; pip install tf-keras") from None
    try:
        return tf_keras.models.load_model(path, compile=False)
    except (ValueError, OSError, TypeError) as exc:
        raise TflfuseError(f"{path}: cannot load: {_first_line(exc, path)}") from None


def _specs_from_keras(model: Any, batch: int, quiet: bool) -> tuple[list, list[str], list[str]]:
    tf = _tf()
    inputs = model.inputs if getattr(model, "inputs", None) else None
    if not inputs:
        raise TflfuseError("the Keras model has no defined inputs; build it or call it once first")
    specs, names, notices = [], [], []
    for i, t in enumerate(inputs):
        shape = list(t.shape)
        name = getattr(t, "name", "") or f"input_{i}"
        name = re.sub(r"[^A-Za-z0-9_]", "_", name.split(":")[0]) or f"input_{i}"
        if shape and shape[0] is None:
            shape[0] = batch
            notices.append(f"input {name!r}: dynamic batch dimension pinned to {batch}")
        if any(d is None for d in shape[1:]):
            raise TflfuseError(
                f"input {name!r} has dynamic dimensions {tuple(shape)}; only the batch may be"
                " dynamic (give a model with a fixed input size)"
            )
        specs.append(tf.TensorSpec(shape, t.dtype if hasattr(t, "dtype") else tf.float32, name))
        names.append(name)
    return specs, names, notices


def _frozen(fn: Any, specs: list | None) -> Any:
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    concrete = fn.get_concrete_function(*specs) if specs is not None else fn
    return convert_variables_to_constants_v2(concrete)


def _pin_batch(frozen: Any, batch: int) -> Any:
    """A frozen function whose inputs have batch `batch` (the graph re-imported behind fixed-shape
    placeholders; outputs keep their structure)."""
    tf = _tf()
    graph_def = frozen.graph.as_graph_def()
    in_names = [t.name for t in frozen.inputs]
    out_names = [t.name for t in frozen.outputs]
    specs = [
        tf.TensorSpec([batch, *t.shape.as_list()[1:]], t.dtype, t.name.split(":")[0])
        for t in frozen.inputs
    ]

    def body(*xs: Any) -> Any:
        return tf.compat.v1.import_graph_def(
            graph_def, input_map=dict(zip(in_names, xs)), return_elements=out_names, name=""
        )

    wrapped = tf.compat.v1.wrap_function(body, specs)
    structure = frozen.structured_outputs
    if isinstance(structure, dict):
        keys = sorted(structure)
        order = [out_names.index(structure[k].name) for k in keys]
        fetches = {k: wrapped.outputs[i] for k, i in zip(keys, order)}
        return wrapped.prune(wrapped.inputs, fetches)
    return wrapped


def _keras_frontend(model: Any, source: str, batch: int, quiet: bool) -> Frontend:
    """Trace and freeze the Keras model once, with every layer output as an extra output when the
    layers allow it (the unfused baseline needs them); the source function is that graph pruned
    back to the real outputs, so tracing and freezing, the slow part, happen only once."""
    tf = _tf()
    specs, names, notices = _specs_from_keras(model, batch, quiet)
    wide = _layer_outputs(model)
    traced = wide if wide is not None else model

    def call(*xs: Any) -> Any:
        out = traced(list(xs) if len(xs) > 1 else xs[0], training=False)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    frozen = _frozen(tf.function(call), specs)
    n_out = len(model.outputs) if wide is not None else len(frozen.outputs)
    function = _prune_outputs(frozen, n_out) if wide is not None else frozen
    out_names = list(getattr(model, "output_names", None) or [])
    if len(out_names) != n_out:
        out_names = [f"output_{i}" for i in range(n_out)]
    return Frontend(
        function,
        names,
        [tuple(int(d) for d in s.shape[1:]) for s in specs],
        out_names,
        batch,
        source,
        keras=model,
        notices=notices,
        wide=frozen if wide is not None else None,
    )


def _prune_outputs(frozen: Any, n_out: int) -> Any:
    """The frozen function restricted to its first `n_out` outputs (unused ops pruned away)."""
    tf = _tf()
    graph_def = frozen.graph.as_graph_def()
    wrapped = tf.compat.v1.wrap_function(
        lambda: tf.compat.v1.import_graph_def(graph_def, name=""), []
    )
    g = wrapped.graph
    pruned = wrapped.prune(
        feeds=[g.get_tensor_by_name(t.name) for t in frozen.inputs],
        fetches=[g.get_tensor_by_name(t.name) for t in frozen.outputs[:n_out]],
    )
    pruned._tflfuse_keepalive = wrapped  # the pruned function reads the wrapped graph
    return pruned


def _function_frontend(fn: Any, source: str, batch: int) -> Frontend:
    tf = _tf()
    concrete = fn
    if hasattr(fn, "get_concrete_function"):
        sig = getattr(fn, "input_signature", None)
        if not sig:
            raise TflfuseError(f"{source}: a tf.function needs an input_signature to be converted")
        notices = []
        specs = []
        for i, s in enumerate(sig):
            shape = list(s.shape)
            if shape and shape[0] is None:
                shape[0] = batch
                notices.append(f"input {i}: dynamic batch dimension pinned to {batch}")
            specs.append(tf.TensorSpec(shape, s.dtype, s.name))
        concrete = fn.get_concrete_function(*specs)
    else:
        notices = []
    frozen = _frozen(concrete, None)
    if any(t.shape.rank and t.shape[0] is None for t in frozen.inputs):
        frozen = _pin_batch(frozen, batch)
        notices.append(f"dynamic batch dimension pinned to {batch}")
    shapes = []
    for t in frozen.inputs:
        dims = t.shape.as_list()
        if any(d is None for d in dims):
            raise TflfuseError(
                f"{source}: input {t.name} has dynamic dimensions {dims}; only the batch may be"
                " dynamic"
            )
        shapes.append(tuple(dims[1:]))
    names = [re.sub(r"[^A-Za-z0-9_]", "_", t.name.split(":")[0]) for t in frozen.inputs]
    structured = getattr(concrete, "structured_outputs", None)
    if isinstance(structured, dict):
        out_names = sorted(structured)
    else:
        out_names = [f"output_{i}" for i in range(len(frozen.outputs))]
    batch_used = int(frozen.inputs[0].shape[0]) if frozen.inputs else batch
    return Frontend(frozen, names, shapes, out_names, batch_used, source, notices=notices)


def source_kind(model: object) -> str:
    """ "tflite" for a .tflite (path or bytes: it enters `convert` at the float stage, see
    `tflfuse.sources.tflite`), else "tensorflow" (everything `load_model` takes)."""
    return "tflite" if is_tflite(model) else "tensorflow"


def load_model(
    model: object, *, batch: int = 1, allow_lambda: bool = False, quiet: bool = True
) -> Frontend:
    """A Frontend for a keras.Model, a .keras/.h5 path, a SavedModel folder or a tf.function."""
    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.exists():
            raise TflfuseError(f"{path}: no such file or folder")
        if path.is_dir():
            if not (path / "saved_model.pb").exists():
                raise TflfuseError(f"{path}: a folder but not a SavedModel (no saved_model.pb)")
            tf = _tf()
            try:
                loaded = tf.saved_model.load(str(path))
            except Exception as exc:  # TF raises many types here
                raise TflfuseError(
                    f"{path}: cannot load SavedModel: {str(exc).splitlines()[0]}"
                ) from None
            signatures = getattr(loaded, "signatures", {})
            if "serving_default" not in signatures:
                raise TflfuseError(f"{path}: the SavedModel has no serving_default signature")
            front = _function_frontend(signatures["serving_default"], str(path), batch)
            front.notices.insert(0, "SavedModel: using its serving_default signature")
            return front
        if path.suffix not in (".keras", ".h5", ".hdf5"):
            raise TflfuseError(
                f"{path}: expected a .tflite, .keras or .h5 file or a SavedModel folder"
            )
        return _keras_frontend(_load_keras_file(path, allow_lambda), str(path), batch, quiet)
    if _is_keras_model(model):
        return _keras_frontend(model, type(model).__name__, batch, quiet)
    if hasattr(model, "get_concrete_function") or hasattr(model, "structured_outputs"):
        return _function_frontend(model, getattr(model, "__name__", "tf.function"), batch)
    raise TflfuseError(
        f"cannot convert a {type(model).__name__}: give a keras.Model, a .keras/.h5 file, a"
        " SavedModel folder, a tf.function with an input_signature or a .tflite (path or bytes)"
    )


def _layer_outputs(model: Any) -> Any | None:
    """A Keras model returning `model`'s outputs followed by every layer output (None when the
    model has no single-output layer graph, e.g. a subclassed model)."""
    if not hasattr(model, "layers") or not getattr(model, "outputs", None):
        return None
    originals = list(model.outputs)
    original_ids = {id(t) for t in originals}
    extra = []
    for layer in model.layers:
        if type(layer).__name__ == "InputLayer":
            continue
        try:
            outs = layer.output
        except (AttributeError, ValueError):
            return None  # a subclassed model or a layer used twice: no single output
        for t in outs if isinstance(outs, (list, tuple)) else [outs]:
            if id(t) not in original_ids:
                extra.append(t)
    # a Sequential cannot take outputs=: build a functional Model of the same Keras package
    # (Keras 3 or tf-keras, whichever made the model)
    package = sys.modules.get(type(model).__module__.split(".")[0])
    for make in (type(model), getattr(package, "Model", None)):
        if make is None:
            continue
        try:
            return make(inputs=model.inputs, outputs=originals + extra)
        except Exception:  # any failure: try the next way, then graph outputs
            continue
    return None


def every_op_output(
    frozen: tf.types.experimental.ConcreteFunction,
) -> tf.types.experimental.ConcreteFunction:
    """The frozen function with every float TF op output added as an output (no Keras layers)."""
    tf = _tf()
    graph_def = frozen.graph.as_graph_def()
    graph = frozen.graph
    read = {t.name for op in graph.get_operations() for t in op.inputs}
    extra = []
    for op in graph.get_operations():
        if op.type in _SKIP_NODES:
            continue
        for t in op.outputs:
            # only tensors another op reads: side outputs (FusedBatchNorm's batch statistics)
            # would keep a training-only op alive
            if t.name in read and t.dtype == tf.float32 and t.shape.is_fully_defined():
                extra.append(t.name)
    outs = [t.name for t in frozen.outputs]
    fetch = outs + [n for n in extra if n not in outs]
    wrapped = tf.compat.v1.wrap_function(
        lambda: tf.compat.v1.import_graph_def(graph_def, name=""), []
    )
    g = wrapped.graph
    return wrapped.prune(
        feeds=[g.get_tensor_by_name(t.name) for t in frozen.inputs],
        fetches=[g.get_tensor_by_name(n) for n in fetch],
    )
