"""Example models built offline (Keras architectures, `weights=None`) for tests, benchmarks and
the README's example. Needs the `convert` extra (TensorFlow); imports it lazily.

A Keras application built with `weights=None` has BatchNorm statistics that shrink activations to
nothing, so every input gives the same output and any equality check is vacuous. `calibrate_bn`
sets every BatchNorm's moving statistics from a batch of data instead (training-mode statistics
with momentum 0), which gives outputs that vary with the input.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _keras() -> Any:
    import keras

    return keras


def sample_inputs(shape: tuple[int, ...], n: int = 8, seed: int = 0) -> np.ndarray:
    """Deterministic inputs in [-1, 1], the range Keras applications expect."""
    return np.random.default_rng(seed).uniform(-1.0, 1.0, (n, *shape)).astype(np.float32)


def calibrate_bn(model: Any, x: np.ndarray) -> Any:
    """Set every BatchNormalization's moving mean/variance to the batch statistics of `x`."""
    keras = _keras()
    layers = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    saved = [layer.momentum for layer in layers]
    for layer in layers:
        layer.momentum = 0.0
    model(x, training=True)
    for layer, momentum in zip(layers, saved):
        layer.momentum = momentum
    return model


def mobilenet_v2(input_size: int = 96, classes: int = 10) -> Any:
    keras = _keras()
    return keras.applications.MobileNetV2(
        input_shape=(input_size, input_size, 3), weights=None, classes=classes
    )


def efficientnet_b0(input_size: int = 96, classes: int = 10) -> Any:
    keras = _keras()
    return keras.applications.EfficientNetB0(
        input_shape=(input_size, input_size, 3), weights=None, classes=classes
    )


BUILDERS: dict[str, Callable[..., Any]] = {
    "mobilenet_v2": mobilenet_v2,
    "efficientnet_b0": efficientnet_b0,
}


def build(name: str, **kwargs: Any) -> Any:
    """A Keras model of architecture `name` with calibrated BatchNorm statistics."""
    model = BUILDERS[name](**kwargs)
    return calibrate_bn(model, sample_inputs(tuple(model.input_shape[1:]), n=8, seed=1))


def to_tflite(
    model: Any,
    *,
    int8: bool = False,
    calibration: np.ndarray | None = None,
    io_type: str = "float32",
) -> bytes:
    """Plain TFLite conversion (the 'stock' route): float, or full int8 with the converter's PTQ."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if int8:
        data = calibration
        if data is None:
            data = sample_inputs(tuple(model.input_shape[1:]), n=16, seed=2)

        def representative() -> Any:
            for sample in data:
                yield [sample[None]]

        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if io_type != "float32":
            converter.inference_input_type = getattr(tf, io_type)
            converter.inference_output_type = getattr(tf, io_type)
    return bytes(converter.convert())
