"""The converter's PTQ with statistics recorded by interpreter gives the converter's own model.

A small residual CNN (conv, BatchNorm, ReLU, an ADD the interpreter runs in place, a dense
head) is quantized by the TFLite converter twice from the same frozen function: once as the
converter does alone, once through `tf_route.tflite_convert` (whose calibration records its
statistics by interpreter). The two models must be the same bytes, and the record must show
the interpreter route was taken (not a silent fallback). The first-sample check is shown to
bite: without the in-place rule the statistics differ, and the converter's own calibrator is
used, giving again the very same model.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tflfuse.sources import keras_calibration as cc  # noqa: E402
from tflfuse.sources import keras_route as tf_route  # noqa: E402


def _residual_function(seed: int = 3):
    import keras

    keras.utils.set_random_seed(seed)
    x = keras.Input((24, 24, 3), batch_size=1)
    y = keras.layers.Conv2D(16, 3, padding="same")(x)
    y = keras.layers.BatchNormalization()(y, training=False)
    y = keras.layers.ReLU()(y)
    z = keras.layers.Conv2D(16, 3, padding="same")(y)
    y = keras.layers.Add()([y, z])  # read by nothing else: the interpreter adds in place
    y = keras.layers.Conv2D(8, 1)(y)
    y = keras.layers.GlobalAveragePooling2D()(y)
    y = keras.layers.Dense(5)(y)
    model = keras.Model(x, y)
    fn = tf.function(lambda a: model(a, training=False))
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    return convert_variables_to_constants_v2(
        fn.get_concrete_function(tf.TensorSpec((1, 24, 24, 3), tf.float32))
    )


def _calibration(n: int = 12) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.uniform(-1, 1, (n, 24, 24, 3)).astype(np.float32)]


class _Recipe:
    quant_mode, input_type, output_type = "int8", "int8", "int8"


def _converters_own(function, calibration) -> bytes:
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function], None)
    tf_route.ptq_configure(_Recipe(), calibration, False, "x")(converter)
    return bytes(converter.convert())


def _ours(function, calibration) -> bytes:
    configure = tf_route.ptq_configure(_Recipe(), calibration, False, "x")
    return tf_route.tflite_convert(function, None, configure=configure)


@pytest.fixture(scope="module")
def residual():
    function = _residual_function()
    calibration = _calibration()
    return function, calibration, _converters_own(function, calibration)


def test_statistics_by_interpreter_give_the_converters_own_model(residual) -> None:
    function, calibration, expected = residual
    cc.last.routes.clear()
    got = _ours(function, calibration)
    assert cc.last.routes == ["interpreter"]
    assert got == expected
    # the model is worth comparing: its int8 output follows the input
    from tflfuse.verification.runs import run_float

    out = run_float(got, [calibration[0][:4]])[0]
    assert np.ptp(out, axis=0).max() > 0


def test_the_in_place_add_widens_its_inputs_range(residual, monkeypatch) -> None:
    """Without the in-place rule the first-sample check fails, and the converter calibrates
    itself: the same model again, by the slow route."""
    function, calibration, expected = residual
    from tensorflow.lite.python.optimize import calibrator as real

    model = real.add_intermediate_tensors(tf_route.tflite_convert(function, None))
    from tensorflow.lite.tools import flatbuffer_utils

    model_t = flatbuffer_utils.convert_bytearray_to_object(bytearray(model))
    pairs = cc.in_place_pairs(model, model_t, [calibration[0][:1]])
    ops = model_t.subgraphs[0].operators
    codes = model_t.operatorCodes
    kinds = {
        max(codes[op.opcodeIndex].builtinCode, codes[op.opcodeIndex].deprecatedBuiltinCode)
        for op in ops
        for a, b in pairs
        if a in op.inputs and b in op.outputs
    }
    assert pairs and kinds == {0}  # BuiltinOperator.ADD
    monkeypatch.setattr(cc, "in_place_pairs", lambda *a: [])
    cc.last.routes.clear()
    got = _ours(function, calibration)
    assert cc.last.routes == [
        "converter: first-sample statistics differ from the converter's calibrator"
    ]
    assert got == expected


def test_a_failure_of_the_interpreter_route_falls_back(residual, monkeypatch) -> None:
    function, calibration, expected = residual

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(cc, "ranges", broken)
    cc.last.routes.clear()
    assert _ours(function, calibration) == expected
    assert cc.last.routes == ["converter: RuntimeError: boom"]


def test_the_converters_calibrator_is_restored() -> None:
    from tensorflow.lite.python import lite

    before = lite._calibrator
    with cc.statistics_by_interpreter():
        assert lite._calibrator is not before
        with cc.statistics_by_interpreter():  # (nested: no second layer)
            inner = lite._calibrator
    assert lite._calibrator is before
    assert isinstance(inner, cc._Shim)
