"""A real, offline example: a small CNN trained on scikit-learn's digits (1,797 labelled 8x8
images shipped inside the sklearn wheel). It gives real calibration data and a real accuracy to
measure quantization against, which a random-weight network cannot. Needs the `convert` extra
and scikit-learn; imports them lazily.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the model's type (Keras ships no annotations: the checker reads it as Any)
    import keras

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


@dataclass
class DigitsSplit:
    """Images scaled to [-1, 1], NHWC (N, 8, 8, 1), with integer labels."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_split(seed: int = 0, test_size: float = 0.3) -> DigitsSplit:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x.reshape(-1, 8, 8, 1) / 16.0 * 2.0 - 1.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=test_size, random_state=seed, stratify=y)
    return DigitsSplit(xtr, ytr.astype(np.int64), xte, yte.astype(np.int64))


def train_cnn(split: DigitsSplit, *, epochs: int = 12, seed: int = 0) -> keras.Model:
    """Conv-BN-ReLU x2, global average pooling, dense softmax; ~97% test accuracy in seconds."""
    import keras

    keras.utils.set_random_seed(seed)
    inp = keras.Input((8, 8, 1), name="digits")
    x = keras.layers.Conv2D(16, 3, padding="same")(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(32, 3, padding="same", strides=2)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(10, activation="softmax", name="probs")(x)
    model = keras.Model(inp, out)
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(split.x_train, split.y_train, epochs=epochs, batch_size=32, verbose=0)
    return model


def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.asarray(probs).argmax(-1) == labels))
