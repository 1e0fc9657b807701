"""The TFLite converter's post-training calibration, with the same statistics, faster.

Where tflfuse asks the converter for its own int8 PTQ (the stock baseline of a Keras source, and
the converter-PTQ route of a model litert-quantizer cannot make fully int8, e.g. MobileNetV2's
unfused baseline with its RELU6), the converter calibrates with TensorFlow's logging calibrator
(`tensorflow.lite.python.optimize.calibrator`): an interpreter whose every kernel is wrapped to
log the float32 activations it reads and writes, each value folded into a running min/max by a
scalar loop (`MinMax::Update`). Measured with py-spy --native on MobileNetV2 96 px: 85% of the
calibration's time is that loop, and the unfused baseline's calibration (204 ops, every Keras
layer output kept) was the single largest step of `tflfuse convert` (9.7 of 35 s).

`statistics_by_interpreter()` swaps, for the converter calls it wraps, the calibrator the
converter uses for one that records the very same statistics from TensorFlow's own interpreter
and numpy, and hands the converter the calibrated model it would have got. "The same" is kept
by construction and then checked:

  kernels      TensorFlow's interpreter on the same model, with the builtin kernels and no
               delegate, as the logging interpreter; `num_threads=4`, because the logging
               interpreter leaves the thread count unset and TFLite's Eigen kernels then use a
               pool of 4 threads (`eigen_support`), whose block sizes decide the summation order
               of a convolution (1 or 2 threads measurably round differently; the other
               multithreaded kernels split their outputs, not their sums)
  tensors      per op, its float32 inputs and outputs that have no constant buffer (the
               calibrator's `GetLoggableTensorIndices`), on a model with one subgraph and no
               intermediate tensors (else: the converter's own calibrator)
  values       min and max over the samples, NaN skipped as `MinMax::Update` skips it. The
               calibrator logs an op's inputs again after the kernel ran; where the kernel
               writes in place (its output in its input's buffer: TFLite's in-place ADD/MUL),
               that second log sees the output, so that input's range takes in its output's
               range: found by buffer address on an interpreter planned as the calibrator's is
  check        the converter's own calibrator on the first sample; unless its statistics are
               the ones computed here for that sample (every tensor, every value), the converter's
               own calibrator calibrates on all samples as it would have, and so it does on any
               failure of this route (a dtype or shape it would refuse, a tensor with no value)

The calibrated model is the converter's float model with `quantization = {min: [lo], max: [hi]}`
on each logged tensor, as the calibrator's `AddCalibrationToModel` writes it; the converter then
quantizes it as usual. Checked bit-identical against the converter's own route on the zoo
(tests/test_converter_calibration.py, benchmarks/fingerprint.py). TensorFlow only.
"""

from __future__ import annotations

import contextlib
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the flatbuffer object API TensorFlow ships (no annotations: read as Any)
    from tensorflow.lite.python import schema_py_generated as schema

EIGEN_THREADS = 4  # TFLite's eigen_support default when the interpreter leaves threads unset
_FLOAT32 = 0  # schema TensorType.FLOAT32
_MAX_BYTES = 1 << 30  # larger models may need buffer offsets: the converter's own route


@dataclass
class Record:
    """How the last calibrations went, for tests and benchmarks: one entry per calibration,
    "interpreter" or "converter: why"."""

    routes: list[str] = field(default_factory=list)


last = Record()


@contextlib.contextmanager
def statistics_by_interpreter() -> Iterator[None]:
    """Within the block, the TFLite converter's PTQ calibrations take their statistics from
    TensorFlow's interpreter (see the module docstring). Restores the converter's calibrator on
    exit; with a TensorFlow whose converter is laid out otherwise, changes nothing."""
    try:
        from tensorflow.lite.python import lite
    except ImportError:  # pragma: no cover - TensorFlow is what calls this
        yield
        return
    real = getattr(lite, "_calibrator", None)
    if real is None or not hasattr(real, "Calibrator") or isinstance(real, _Shim):
        yield
        return
    lite._calibrator = _Shim(real)
    try:
        yield
    finally:
        lite._calibrator = real


class _Shim(types.SimpleNamespace):
    """What lite.py reads from its calibrator module: the real `add_intermediate_tensors` and a
    `Calibrator` that records statistics by interpreter."""

    def __init__(self, real: Any) -> None:
        super().__init__(add_intermediate_tensors=real.add_intermediate_tensors)
        self.real = real

        def make(model: bytes, by_name: Any = None, by_func: Any = None) -> _Calibrator:
            return _Calibrator(real, model, by_name, by_func)

        self.Calibrator = make


class _Calibrator:
    """The converter's Calibrator, with `calibrate` recording by interpreter (checked against
    the real one on the first sample); every other method is the real calibrator's."""

    def __init__(self, real: Any, model: bytes, by_name: Any, by_func: Any) -> None:
        self._module = real
        self._model = bytes(model)
        self._custom = bool(by_name) or bool(by_func)
        self._args = (by_name, by_func)
        self._real = real.Calibrator(model, by_name, by_func)  # (raises as the converter's would)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def calibrate(self, dataset_gen: Callable[[], Any]) -> bytes:
        samples = list(dataset_gen())
        why = self._refusal(samples)
        if why is None:
            try:
                calibrated, why = self._by_interpreter(samples)
            except Exception as exc:  # any failure: the converter's own route decides
                calibrated, why = None, f"{type(exc).__name__}: {exc}"
            if calibrated is not None:
                last.routes.append("interpreter")
                return calibrated
        last.routes.append(f"converter: {why}")
        return self._real.calibrate(lambda: iter(samples))

    def _refusal(self, samples: list[Any]) -> str | None:
        if self._custom:
            return "custom op registerers"
        if not samples:
            return "no samples"
        if not all(isinstance(s, list) for s in samples):
            return "samples keyed by signature"
        if len(self._model) > _MAX_BYTES:
            return "model over 1 GiB"
        first = [np.shape(a) for a in samples[0]]
        if any([np.shape(a) for a in s] != first for s in samples):
            return "samples of different shapes"
        return None

    def _by_interpreter(self, samples: list[list[np.ndarray]]) -> tuple[bytes | None, str]:
        from tensorflow.lite.tools import flatbuffer_utils

        model_t = flatbuffer_utils.convert_bytearray_to_object(bytearray(self._model))
        why = _unsupported(model_t)
        if why:
            return None, why
        logged = loggable_tensors(model_t)
        shared = in_place_pairs(self._model, model_t, samples[0])
        per_sample = ranges(self._model, logged, shared, samples)
        first, lo, hi = next(per_sample), None, None
        for s_lo, s_hi in (first, *per_sample):
            lo = s_lo if lo is None else np.minimum(lo, s_lo)
            hi = s_hi if hi is None else np.maximum(hi, s_hi)
        assert lo is not None and hi is not None
        if not np.all(lo <= hi):
            return None, "a tensor with no value but NaN"
        expected = statistics_of(
            self._module.Calibrator(self._model, *self._args).calibrate(lambda: iter(samples[:1]))
        )
        mine = {
            k: (first[0][j], first[1][j])
            for j, k in enumerate(logged)
            if first[0][j] <= first[1][j]
        }
        if expected != mine:
            return None, "first-sample statistics differ from the converter's calibrator"
        return with_statistics(model_t, logged, lo, hi), ""


def _unsupported(model_t: Any) -> str:
    if len(model_t.subgraphs or []) != 1:
        return "several subgraphs"
    for op in model_t.subgraphs[0].operators or []:
        if op.intermediates is not None and len(op.intermediates):
            return "ops with intermediate tensors (LSTM)"
    return ""


def loggable_tensors(model_t: schema.ModelT) -> list[int]:
    """Indices of the tensors the logging calibrator records: every op's float32 inputs and
    outputs with no constant data (sorted)."""
    graph, buffers = model_t.subgraphs[0], model_t.buffers or []

    def logged(i: int) -> bool:
        if i < 0:
            return False
        t = graph.tensors[i]
        buf = buffers[t.buffer] if 0 <= t.buffer < len(buffers) else None
        empty = buf is None or buf.data is None or len(buf.data) == 0
        return empty and t.type == _FLOAT32

    found: set[int] = set()
    for op in graph.operators or []:
        for i in (*_indices(op.inputs), *_indices(op.outputs)):
            if logged(i):
                found.add(i)
    return sorted(found)


def _indices(values: Any) -> list[int]:
    return [] if values is None else [int(i) for i in values]


def _interpreter(model: bytes, preserve: bool, sample: Sequence[np.ndarray]) -> Any:
    """TensorFlow's interpreter as the logging calibrator runs (builtin kernels, no delegate, the
    Eigen pool it gets), inputs sized like the calibration sample, tensors allocated."""
    import tensorflow as tf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (tf.lite.Interpreter's deprecation notice)
        interp = tf.lite.Interpreter(
            model_content=model,
            experimental_op_resolver_type=(
                tf.lite.experimental.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
            ),
            experimental_preserve_all_tensors=preserve,
            num_threads=EIGEN_THREADS,
        )
    for d, a in zip(interp.get_input_details(), sample):
        if list(d["shape"]) != list(np.shape(a)):
            interp.resize_tensor_input(d["index"], list(np.shape(a)))
    interp.allocate_tensors()
    return interp


def in_place_pairs(
    model: bytes, model_t: schema.ModelT, sample: Sequence[np.ndarray]
) -> list[tuple]:
    """(input, output) tensor pairs of one op that share a buffer in an interpreter planned as
    the logging one (no preserved tensors): the kernel writes its output over that input."""
    interp = _interpreter(model, False, sample)

    def address(i: int) -> int | None:
        try:
            a = interp.tensor(i)()
        except ValueError:
            return None
        return a.ctypes.data if a.size else None

    pairs = []
    for op in model_t.subgraphs[0].operators or []:
        outs = {address(o): o for o in _indices(op.outputs) if o >= 0}
        outs.pop(None, None)
        for i in _indices(op.inputs):
            at = address(i) if i >= 0 else None
            if at is not None and at in outs:
                pairs.append((i, outs[at]))
    return pairs


def ranges(
    model: bytes, logged: list[int], shared: list[tuple], samples: list[list[np.ndarray]]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per sample, (min, max) of every logged tensor in `logged` order, as the logging
    calibrator sees them (NaN skipped: +inf/-inf when a tensor held nothing but NaN; an input
    written over in place takes in its output's range)."""
    interp = _interpreter(model, True, samples[0])
    details = interp.get_input_details()
    where = {k: j for j, k in enumerate(logged)}
    merged = [(where[a], where[b]) for a, b in shared if a in where and b in where]
    views = [interp.tensor(k) for k in logged]
    for sample in samples:
        for d, a in zip(details, sample):
            interp.set_tensor(d["index"], a)
        interp.invoke()
        lo = np.full(len(logged), np.inf, np.float32)
        hi = np.full(len(logged), -np.inf, np.float32)
        for j, view in enumerate(views):
            a = view()
            if not a.size:
                continue
            low, high = a.min(), a.max()
            if np.isnan(low) or np.isnan(high):
                finite = a[~np.isnan(a)]
                if not finite.size:
                    continue
                low, high = finite.min(), finite.max()
            lo[j], hi[j] = low, high
        for into, other in merged:
            lo[into], hi[into] = min(lo[into], lo[other]), max(hi[into], hi[other])
        yield lo, hi


def statistics_of(calibrated: bytes) -> dict[int, tuple[np.float32, np.float32]]:
    """{tensor index: (min, max)} of a calibrated model's main subgraph."""
    from tensorflow.lite.tools import flatbuffer_utils

    model_t = flatbuffer_utils.convert_bytearray_to_object(bytearray(calibrated))
    out = {}
    for i, t in enumerate(model_t.subgraphs[0].tensors or []):
        q = t.quantization
        if q is not None and q.min is not None and len(q.min) and q.max is not None:
            out[i] = (np.float32(q.min[0]), np.float32(q.max[0]))
    return out


def with_statistics(
    model_t: schema.ModelT, logged: list[int], lo: np.ndarray, hi: np.ndarray
) -> bytes:
    """The model with {min: [lo], max: [hi]} as the quantization of each logged tensor (what
    the calibrator's AddCalibrationToModel writes), serialized."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    tensors = model_t.subgraphs[0].tensors
    for j, k in enumerate(logged):
        q = schema.QuantizationParametersT()
        q.min, q.max = [float(lo[j])], [float(hi[j])]
        tensors[k].quantization = q
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model_t))
