"""Does a Keras file carry code? Decided from its parsed model config, before any loader runs.

Loading a Keras model can run Python the file brings or names: a legacy `.h5` goes through
tf-keras, which has no safe mode, and Keras 3's safe mode covers only some of it. So tflfuse reads
the config itself (the `model_config` attribute of an `.h5`, `config.json` inside a `.keras` zip),
parses it as JSON (any formatting, any nesting: models inside models, layers inside wrappers) and
walks every object in it. A file carries code when any object is:

- a layer that calls a function the file holds or names: `Lambda` (marshalled bytecode),
  `TorchModuleWrapper` (a pickled torch module), `JaxLayer` / `FlaxLayer`, and a tf-keras
  `TFOpLambda` / `SlicingOpLambda` (a TensorFlow API function looked up by name, `io.write_file`
  or `io.gfile.remove` as well as `math.add`) unless its function is pure arithmetic: under
  `__operators__.`, `math.`, `nn.`, or one of a few array ops (`PURE_TF_OPS`). Those are what
  `x + 3`, `x * y`, `x[:, 0]`, `tf.reshape` in a tf.keras model become (legacy MobileNetV3 is
  full of them), and they only build graph ops that the converter sees;
- a serialized function: `__lambda__` (Keras 3 bytecode), `function` objects (a custom or
  registered activation, loss, initializer...), or any object with `function_type` (tf-keras);
- a custom object: a `registered_name` of the form `package>Name` (a class or function
  registered with `register_keras_serializable`: whatever Python is registered under that name
  runs), or a `module` outside Keras itself (`keras`, `tf_keras`), which Keras imports to find
  the class.

Not code: built-in Keras layers, initializers, regularizers, constraints, dtype policies and
activations named by string; unknown class names without a module (old Keras 2 files): the
loaders look those up only among classes already registered and otherwise refuse the file. The
top-level `compile_config` / `training_config` is not read (tflfuse loads with compile=False).
A file whose config cannot be read or parsed is refused too: what cannot be checked is not
trusted. A SavedModel is not checked at all: it is a TensorFlow graph that TensorFlow executes to
load and trace it, code by nature, so only trusted SavedModels should be converted.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tflfuse.errors import TflfuseError
from tflfuse.json_types import JSON

CODE_LAYERS = frozenset({"Lambda", "TorchModuleWrapper", "JaxLayer", "FlaxLayer"})
TF_OP_LAYERS = frozenset({"TFOpLambda", "SlicingOpLambda"})
PURE_TF_NAMESPACES = ("__operators__.", "math.", "nn.")
PURE_TF_OPS = frozenset(
    {
        "reshape",
        "transpose",
        "concat",
        "stack",
        "unstack",
        "split",
        "squeeze",
        "expand_dims",
        "cast",
        "clip_by_value",
        "identity",
        "pad",
        "tile",
        "gather",
        "where",
        "shape",
        "ones_like",
        "zeros_like",
        "image.resize",
        "compat.v1.transpose",
        "compat.v1.squeeze",
        "compat.v1.gather",
    }
)
CODE_OBJECTS = frozenset({"__lambda__", "function"})
TRUSTED_MODULES = ("keras", "tf_keras")


@dataclass(frozen=True)
class CodeFinding:
    """One object in a model config that would run code: what it is and where."""

    what: str  # e.g. "Lambda layer 'lam'"
    where: str  # a path into the config, e.g. "config/layers[2]/config/layers[1]"

    def __str__(self) -> str:
        return f"{self.what} at {self.where}"


class CodeInFileError(TflfuseError):
    """The file carries code and the user did not allow it."""


def _trusted_module(module: Any) -> bool:
    if module is None:
        return True
    if not isinstance(module, str):
        return False
    return any(module == m or module.startswith(m + ".") for m in TRUSTED_MODULES)


def _pure_tf_function(function: Any) -> bool:
    if not isinstance(function, str):
        return False
    return function in PURE_TF_OPS or function.startswith(PURE_TF_NAMESPACES)


def _name_of(obj: dict) -> str:
    config = obj.get("config")
    name = config.get("name") if isinstance(config, dict) else None
    return f" {name!r}" if isinstance(name, str) else ""


def _judge(obj: dict) -> str | None:
    """What makes this one config object code, or None."""
    cls = obj.get("class_name")
    if isinstance(cls, str):
        if cls in CODE_LAYERS:
            return f"{cls} layer{_name_of(obj)}"
        if cls in TF_OP_LAYERS:
            config = obj.get("config")
            function = config.get("function") if isinstance(config, dict) else None
            if not _pure_tf_function(function):
                return f"{cls} layer{_name_of(obj)} calling tf.{function}"
            return None
        if cls in CODE_OBJECTS:
            return f"serialized Python function ({cls})"
        registered = obj.get("registered_name")
        if isinstance(registered, str) and ">" in registered:
            return f"custom object {registered!r}"
        if "module" in obj and not _trusted_module(obj.get("module")):
            return f"{cls} from module {obj.get('module')!r}"
    if "function_type" in obj:
        return "serialized Python function (function_type)"
    return None


def find_code(config: JSON) -> list[CodeFinding]:
    """Every object in a parsed model config that would run code (see the module docstring),
    outermost first; what lies inside a finding is not listed again. Iterative: a hostile file
    could nest deeper than Python's recursion limit."""
    findings: list[CodeFinding] = []
    stack: list[tuple[str, Any]] = [("", config)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            what = _judge(value)
            if what is not None:
                findings.append(CodeFinding(what, path or "top level"))
                continue
            for key, item in reversed(list(value.items())):
                if not path and key in ("compile_config", "training_config"):
                    continue
                stack.append((f"{path}/{key}" if path else str(key), item))
        elif isinstance(value, list):
            for i in reversed(range(len(value))):
                stack.append((f"{path}[{i}]", value[i]))
    return findings


def read_config(path: Path) -> JSON:
    """The parsed model config of a `.keras` (zip) or `.h5` file, by content, not by suffix;
    None for an `.h5` without a model (weights only). TflfuseError when it cannot be read."""
    path = Path(path)
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                text = z.read("config.json")
        except KeyError:
            raise TflfuseError(
                f"{path}: a zip file without config.json, not a .keras model"
            ) from None
        except (zipfile.BadZipFile, OSError) as exc:
            raise TflfuseError(f"{path}: cannot read the .keras archive: {exc}") from None
        return _parse(path, text)
    try:
        import h5py
    except ImportError:
        raise TflfuseError(
            f"{path}: h5py is needed to check the file for code before loading it"
        ) from None
    try:
        if not h5py.is_hdf5(path):
            raise TflfuseError(f"{path}: neither a .keras archive nor an HDF5 (.h5) file")
        with h5py.File(path, "r") as f:
            text = f.attrs.get("model_config")
    except OSError as exc:
        raise TflfuseError(f"{path}: not a readable .h5 file: {exc}") from None
    if text is None:
        return None
    return _parse(path, text)


def _parse(path: Path, text: Any) -> Any:
    if hasattr(text, "tobytes") and not isinstance(text, (bytes, str)):
        text = text.tobytes()  # numpy bytes scalar
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        return json.loads(str(text))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise TflfuseError(
            f"{path}: the model config is not valid JSON ({exc}); it cannot be checked for code"
        ) from None


def check_keras_file(path: Path) -> None:
    """Raise CodeInFileError (one line) when the Keras file at `path` carries code."""
    config = read_config(path)
    findings = find_code(config) if config is not None else []
    if findings:
        more = f" and {len(findings) - 1} more" if len(findings) > 1 else ""
        raise CodeInFileError(
            f"{path}: carries code ({findings[0]}{more}); loading it would run it, refused"
            " (pass --allow-lambda if you trust the file)"
        )
