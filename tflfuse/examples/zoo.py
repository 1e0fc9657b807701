"""Example models built offline (Keras architectures, `weights=None`) for tests, benchmarks and
the README's example. Needs the `convert` extra (TensorFlow); imports it lazily.

A Keras application built with `weights=None` has BatchNorm statistics that shrink activations to
nothing, so every input gives the same output and any equality check is vacuous. `calibrate_bn`
sets every BatchNorm's moving statistics from a batch of data instead (training-mode statistics
with momentum 0), which gives outputs that vary with the input.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from tflfuse.errors import TflfuseError

if TYPE_CHECKING:  # the models' type (Keras ships no annotations: the checker reads it as Any)
    import keras

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _keras() -> Any:
    import keras

    return keras


def sample_inputs(shape: tuple[int, ...], n: int = 8, seed: int = 0) -> np.ndarray:
    """Deterministic inputs in [-1, 1], the range Keras applications expect."""
    return np.random.default_rng(seed).uniform(-1.0, 1.0, (n, *shape)).astype(np.float32)


def calibrate_bn(model: keras.Model, x: np.ndarray) -> keras.Model:
    """Set every BatchNormalization's moving mean/variance to the batch statistics of `x`."""
    keras = _keras()
    layers = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    saved = [layer.momentum for layer in layers]
    for layer in layers:
        layer.momentum = 0.0
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The structure of `inputs`")
        model(x, training=True)
    for layer, momentum in zip(layers, saved):
        layer.momentum = momentum
    return model


def _input(shape: tuple[int, ...]) -> Any:
    """A batch-1 Keras input: static shapes convert without SHAPE/PACK/RESHAPE batch plumbing
    (and the Edge TPU needs static shapes anyway)."""
    return _keras().Input(shape, batch_size=1)


def mobilenet_v2(input_size: int = 96, classes: int = 10, alpha: float = 1.0) -> keras.Model:
    """MobileNetV2: inverted residuals, ReLU6, depthwise convs."""
    keras = _keras()
    return keras.applications.MobileNetV2(
        input_tensor=_input((input_size, input_size, 3)), weights=None, classes=classes, alpha=alpha
    )


def mobilenet_v3_small(input_size: int = 96, classes: int = 10) -> keras.Model:
    """MobileNetV3Small: hard-swish and hard-sigmoid squeeze-excite (MEAN over H,W)."""
    keras = _keras()
    return keras.applications.MobileNetV3Small(
        input_tensor=_input((input_size, input_size, 3)),
        weights=None,
        classes=classes,
        include_preprocessing=False,
    )


def efficientnet_b0(input_size: int = 96, classes: int = 10) -> keras.Model:
    """EfficientNetB0: swish (x * sigmoid(x)) everywhere, squeeze-excite blocks."""
    keras = _keras()
    return keras.applications.EfficientNetB0(
        input_tensor=_input((input_size, input_size, 3)), weights=None, classes=classes
    )


def _conv_bn(
    x: Any, filters: int, kernel: int | tuple[int, int], strides: int = 1, activation: Any = "relu"
) -> Any:
    """Conv (no bias) -> BatchNorm -> activation (a callable, a Keras name, or None)."""
    layers = _keras().layers
    x = layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    if callable(activation):
        return activation(x)
    return layers.Activation(activation)(x) if activation else x


def resnet_v2_style(input_size: int = 64, classes: int = 10, width: int = 16) -> keras.Model:
    """Pre-activation ResNet: BN -> ReLU -> Conv blocks, so BatchNorm never directly follows a
    conv it could fold into (the stock converter leaves it as MUL + ADD)."""
    keras = _keras()
    layers = keras.layers
    inputs = _input((input_size, input_size, 3))
    x = layers.Conv2D(width, 3, padding="same")(inputs)
    for stage, filters in enumerate((width, width * 2, width * 4)):
        strides = 1 if stage == 0 else 2
        pre = layers.ReLU()(layers.BatchNormalization()(x))
        shortcut = x
        if strides != 1 or x.shape[-1] != filters:
            shortcut = layers.Conv2D(filters, 1, strides=strides)(pre)
        y = layers.Conv2D(filters, 3, strides=strides, padding="same")(pre)
        y = layers.ReLU()(layers.BatchNormalization()(y))
        y = layers.Conv2D(filters, 3, padding="same")(y)
        x = layers.Add()([shortcut, y])
    x = layers.ReLU()(layers.BatchNormalization()(x))
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(classes)(x)
    return keras.Model(inputs, outputs, name="resnet_v2_style")


def inception_style(input_size: int = 64, classes: int = 10, width: int = 16) -> keras.Model:
    """Inception modules: several 1x1 conv siblings read the same tensor (horizontal fusion
    candidates), their branches concatenated on channels."""
    keras = _keras()
    layers = keras.layers
    inputs = _input((input_size, input_size, 3))
    x = _conv_bn(inputs, width, 3, strides=2)
    for _ in range(2):
        b1 = _conv_bn(x, width, 1)
        b2 = _conv_bn(_conv_bn(x, width, 1), width, 3)
        b3 = _conv_bn(_conv_bn(_conv_bn(x, width // 2, 1), width, 3), width, 3)
        b4 = _conv_bn(layers.AveragePooling2D(3, strides=1, padding="same")(x), width, 1)
        x = layers.Concatenate()([b1, b2, b3, b4])
        x = layers.MaxPooling2D(2)(x)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(classes)(x)
    return keras.Model(inputs, outputs, name="inception_style")


def transformer_encoder(
    seq_len: int = 16, dim: int = 32, heads: int = 2, classes: int = 10, blocks: int = 2
) -> keras.Model:
    """A small transformer encoder on float token embeddings: Q/K/V Dense projections read the
    same tensor, scaled dot-product attention, a GELU MLP, LayerNorm after each residual. Only
    built-in activations, so the model saves as .keras and loads again in safe mode."""
    keras = _keras()
    layers, ops = keras.layers, keras.ops
    head_dim = dim // heads
    inputs = _input((seq_len, dim))
    x = inputs
    for _ in range(blocks):
        q, k, v = (layers.Dense(dim)(x) for _ in range(3))

        def split(t: Any) -> Any:
            t = layers.Reshape((seq_len, heads, head_dim))(t)
            return layers.Permute((2, 1, 3))(t)

        q, k, v = split(q), split(k), split(v)
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * (1.0 / head_dim**0.5)
        attn = ops.matmul(layers.Softmax(axis=-1)(scores), v)
        attn = layers.Reshape((seq_len, dim))(layers.Permute((2, 1, 3))(attn))
        x = layers.LayerNormalization()(layers.Add()([x, layers.Dense(dim)(attn)]))
        mlp = layers.Dense(dim * 2, activation="gelu")(x)
        x = layers.LayerNormalization()(layers.Add()([x, layers.Dense(dim)(mlp)]))
    x = layers.GlobalAveragePooling1D()(x)
    outputs = layers.Dense(classes)(x)
    return keras.Model(inputs, outputs, name="transformer_encoder")


def ds_cnn(classes: int = 12, width: int = 32, frames: int = 49, features: int = 10) -> keras.Model:
    """DS-CNN keyword spotter (Hello Edge): depthwise-separable convs on a 49x10 MFCC map."""
    keras = _keras()
    layers = keras.layers
    inputs = _input((frames, features, 1))
    x = _conv_bn(inputs, width, (10, 4), strides=2)
    for _ in range(4):
        x = layers.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
        x = layers.ReLU()(layers.BatchNormalization()(x))
        x = _conv_bn(x, width, 1)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(classes)(x)
    return keras.Model(inputs, outputs, name="ds_cnn")


def yolo_style(
    input_size: int = 96, classes: int = 4, anchors: int = 3, width: int = 16
) -> keras.Model:
    """A YOLO-style detector: Conv-BN-LeakyReLU(0.1) blocks, one hard-swish block, a 1x1
    detection head on the last grid and a class head through GlobalAveragePooling (MEAN),
    flattened and concatenated into one output."""
    keras = _keras()
    layers = keras.layers

    def leaky(t: Any) -> Any:
        return layers.LeakyReLU(negative_slope=0.1)(t)

    def hard_swish(t: Any) -> Any:
        return layers.Activation("hard_swish")(t)

    inputs = _input((input_size, input_size, 3))
    x = _conv_bn(inputs, width, 3, strides=2, activation=leaky)
    for stage, filters in enumerate((width * 2, width * 4, width * 4)):
        act = hard_swish if stage == 1 else leaky
        x = _conv_bn(x, filters, 3, strides=2, activation=act)
        y = _conv_bn(x, filters // 2, 1, activation=leaky)
        y = _conv_bn(y, filters, 3, activation=leaky)
        x = layers.Add()([x, y])
    grid = layers.Conv2D(anchors * (5 + classes), 1)(x)
    boxes = layers.Flatten()(grid)
    scene = layers.Dense(classes)(layers.GlobalAveragePooling2D()(x))
    outputs = layers.Concatenate()([boxes, scene])
    return keras.Model(inputs, outputs, name="yolo_style")


BUILDERS: dict[str, Callable[..., Any]] = {
    "mobilenet_v2": mobilenet_v2,
    "mobilenet_v3_small": mobilenet_v3_small,
    "efficientnet_b0": efficientnet_b0,
    "resnet_v2_style": resnet_v2_style,
    "inception_style": inception_style,
    "transformer_encoder": transformer_encoder,
    "ds_cnn": ds_cnn,
    "yolo_style": yolo_style,
}


def seed(value: int) -> None:
    """Seed Keras's weight initializers (a `weights=None` model is then the same every run)."""
    import keras

    keras.utils.set_random_seed(value)


def build(name: str, **kwargs: float) -> keras.Model:
    """A Keras model of architecture `name` with calibrated BatchNorm statistics."""
    if name not in BUILDERS:
        raise TflfuseError(f"unknown zoo model {name!r} (choose from {', '.join(BUILDERS)})")
    model = BUILDERS[name](**kwargs)
    return calibrate_bn(model, sample_inputs(tuple(model.input_shape[1:]), n=8, seed=1))


def to_tflite(
    model: keras.Model,
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
