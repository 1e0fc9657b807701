"""Interpreter factory: ai_edge_litert, else tflite_runtime, else tf.lite, with a chosen delegate.

Only numpy and one interpreter package are needed, so the device side (a Coral board with
`tflite_runtime` and no TensorFlow, often Python 3.8) can use it: this module is shipped in the
device bundle and must stay Python 3.8 syntax. Delegates:
  xnnpack        the default CPU path (XNNPACK applied by the interpreter)
  none           plain builtin kernels, no default delegate
  ref            reference kernels (slow, for correctness checks)
  edgetpu[:DEV]  the Coral Edge TPU through libedgetpu (Coral's pycoral when it is importable;
                 PyPI's `pycoral` is an unrelated package); DEV e.g. `usb:0` or `pci:0`
  gpu            the TFLite GPU delegate library, where one is installed
  external:PATH  any delegate shared library, loaded with `load_delegate(PATH)`
A delegate that cannot load is a one-line TflfuseError, never a silent CPU fallback.
"""

from __future__ import annotations

import ctypes
import importlib
import math
import platform
import warnings
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from tflfuse.errors import TflfuseError

if TYPE_CHECKING:  # read by the type checker only: a device's Python may lack Protocol
    from collections.abc import Callable, Sequence
    from typing import Protocol, TypedDict

    class QuantizationParameters(TypedDict):
        scales: np.ndarray
        zero_points: np.ndarray
        quantized_dimension: int

    class TensorDetails(TypedDict):
        """One entry of `get_input_details()` / `get_output_details()` / `get_tensor_details()`."""

        name: str
        index: int
        shape: np.ndarray
        shape_signature: np.ndarray
        dtype: type[np.generic]
        quantization: tuple[float, int]
        quantization_parameters: QuantizationParameters
        sparsity_parameters: dict[str, object]

    class OpDetails(TypedDict):
        """One entry of `_get_ops_details()`: the op's index, name and tensor indices."""

        index: int
        op_name: str
        inputs: np.ndarray
        outputs: np.ndarray

    class Interpreter(Protocol):
        """What tflfuse asks of an interpreter (ai_edge_litert's, tflite_runtime's, tf.lite's)."""

        def allocate_tensors(self) -> None: ...
        def invoke(self) -> None: ...
        def get_input_details(self) -> list[TensorDetails]: ...
        def get_output_details(self) -> list[TensorDetails]: ...
        def get_tensor_details(self) -> list[TensorDetails]: ...
        def set_tensor(self, tensor_index: int, value: np.ndarray) -> None: ...
        def get_tensor(self, tensor_index: int) -> np.ndarray: ...
        def tensor(self, tensor_index: int) -> Callable[[], np.ndarray]: ...
        def resize_tensor_input(
            self, input_index: int, tensor_size: Sequence[int] | np.ndarray, strict: bool = False
        ) -> None: ...
        def _get_ops_details(self) -> list[OpDetails]: ...

    # A loaded delegate (the interpreter package's `Delegate`, or pycoral's): opaque to tflfuse
    Delegate = object

_PACKAGES = (
    "ai_edge_litert.interpreter",
    "tflite_runtime.interpreter",
    "tensorflow.lite.python.interpreter",
)
_RESOLVERS = {"xnnpack": "AUTO", "none": "BUILTIN_WITHOUT_DEFAULT_DELEGATES", "ref": "BUILTIN_REF"}
DELEGATES = ("xnnpack", "none", "ref", "edgetpu", "gpu", "external:PATH")

_EDGETPU_LIBRARY = {
    "Linux": "libedgetpu.so.1",
    "Darwin": "libedgetpu.1.dylib",
    "Windows": "edgetpu.dll",
}
_GPU_LIBRARIES = (
    "libtensorflowlite_gpu_delegate.so",
    "libtensorflowlite_gpu_gl.so",
    "libLiteRtGpuAccelerator.so",
)


def interpreter_module() -> ModuleType:
    """The first interpreter package that imports (raises TflfuseError when none does)."""
    for name in _PACKAGES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        return module
    raise TflfuseError(
        "no TFLite interpreter found: pip install ai-edge-litert (or tflite-runtime on a device)"
    )


def interpreter_package() -> str:
    """Name and version of the interpreter package in use, e.g. 'ai_edge_litert 2.3.0'."""
    module = interpreter_module()
    top = module.__name__.split(".")[0]
    try:
        from importlib.metadata import version  # Python 3.8+ (a device may run 3.7)

        dist = {"ai_edge_litert": "ai-edge-litert", "tflite_runtime": "tflite-runtime"}
        return f"{top} {version(dist.get(top, top))}"
    except Exception:  # metadata is best-effort (vendored or system packages)
        return top


def check_delegate_name(delegate: str) -> None:
    """Raise TflfuseError unless `delegate` is one this module knows."""
    kind = delegate.split(":", 1)[0]
    if kind in _RESOLVERS or kind in ("edgetpu", "gpu"):
        return
    if kind == "external" and delegate[len("external:") :]:
        return
    raise TflfuseError(f"unknown delegate {delegate!r} (choose from {', '.join(DELEGATES)})")


def _loadable(library: str) -> str | None:
    """None when the shared library opens, else why not. Checked before `load_delegate`, whose
    failure path prints an ignored exception from `Delegate.__del__` in some releases."""
    try:
        ctypes.CDLL(library)
    except OSError as exc:
        return str(exc).strip() or "cannot open it"
    return None


def _load(module: Any, library: str, options: dict | None, what: str) -> Any:
    problem = _loadable(library)
    if problem:
        raise TflfuseError(f"cannot load the {what} delegate ({library}): {problem}")
    try:
        return module.load_delegate(library, options or {})
    except (ValueError, OSError, RuntimeError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TflfuseError(f"cannot load the {what} delegate ({library}): {detail}") from None


def _edgetpu_delegate(module: Any, device: str | None) -> Any:
    options = {"device": device} if device else None
    try:  # Coral's own pycoral, when present, knows the platform's library name
        from pycoral.utils import edgetpu as coral
    except ImportError:
        coral = None
    if coral is not None and hasattr(coral, "load_edgetpu_delegate"):
        try:
            return coral.load_edgetpu_delegate(options)
        except (ValueError, OSError, RuntimeError) as exc:
            raise TflfuseError(f"cannot load the edgetpu delegate (pycoral): {exc}") from None
    library = _EDGETPU_LIBRARY.get(platform.system(), "libedgetpu.so.1")
    return _load(module, library, options, "edgetpu")


def _gpu_delegate(module: Any) -> Any:
    for library in _GPU_LIBRARIES:
        if _loadable(library) is None:
            return _load(module, library, None, "gpu")
    raise TflfuseError(
        f"no GPU delegate library found (tried {', '.join(_GPU_LIBRARIES)});"
        " pass external:PATH to name one"
    )


def load_delegates(delegate: str) -> list[Delegate]:
    """The delegate objects to hand the interpreter for `delegate` (empty for CPU paths)."""
    check_delegate_name(delegate)
    kind, _, rest = delegate.partition(":")
    if kind in _RESOLVERS:
        return []
    module = interpreter_module()
    if kind == "edgetpu":
        return [_edgetpu_delegate(module, rest or None)]
    if kind == "gpu":
        return [_gpu_delegate(module)]
    if not Path(rest).exists():
        raise TflfuseError(f"cannot load the external delegate: {rest} does not exist")
    return [_load(module, rest, None, "external")]


def unusable_scale(interp: Interpreter) -> str | None:
    """The first integer tensor whose quantization scale is not finite and > 0, said in words
    (read from the tensor details, before allocate_tensors); None when every scale is usable."""
    for d in interp.get_tensor_details():
        scales = (d.get("quantization_parameters") or {}).get("scales")
        if scales is None or not len(scales) or d["dtype"] in (np.float32, np.float16):
            continue
        for s in scales:
            if not (math.isfinite(float(s)) and s > 0):
                return f"tensor {d['name']!r} has quantization scale {float(s):g}"
    return None


def make_interpreter(
    model: bytes | str | Path,
    delegate: str = "xnnpack",
    threads: int | None = None,
    keep_all: bool = False,
) -> Interpreter:
    """An allocated interpreter for a model given as bytes or a path; `keep_all`: every
    intermediate tensor stays readable after `invoke` (experimental_preserve_all_tensors)."""
    module = interpreter_module()
    delegates = load_delegates(delegate)
    kind = delegate.split(":", 1)[0]
    source = (
        {"model_content": bytes(model)}
        if isinstance(model, (bytes, bytearray))
        else {"model_path": str(model)}
    )
    kwargs: dict[str, Any] = {"num_threads": threads}
    if delegates:
        kwargs["experimental_delegates"] = delegates
    if keep_all:
        kwargs["experimental_preserve_all_tensors"] = True
    resolvers = getattr(module, "OpResolverType", None)  # absent in old tflite_runtime builds
    if resolvers is not None and kind in _RESOLVERS:
        kwargs["experimental_op_resolver_type"] = getattr(resolvers, _RESOLVERS[kind])
    elif kind in ("none", "ref"):
        raise TflfuseError(f"delegate {kind!r} needs an interpreter with OpResolverType")
    try:
        with warnings.catch_warnings():  # keep_all: its "for debugging purposes" warning
            warnings.simplefilter("ignore", UserWarning)
            interp = module.Interpreter(**source, **kwargs)
        bad = unusable_scale(interp)
        if bad:  # some builds abort the process in allocate_tensors on such a scale
            raise TflfuseError(f"the interpreter was not given the model: {bad}")
        interp.allocate_tensors()
    except (ValueError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "edgetpu-custom-op" in first and kind != "edgetpu":
            first += " (a compiled _edgetpu model runs only with --delegate edgetpu)"
        raise TflfuseError(f"the interpreter refused the model: {first}") from None
    return interp
