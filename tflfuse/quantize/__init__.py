"""Quantization: the quantize stage (`quantize`, TensorFlow's converter and the litert quantizer,
lazily), calibration data (`calibration`, which decodes image folders with tf.io), the ranges the
calibration measured (`calibrated_ranges`) and int8 completion of what the quantizer left in
float (`int8_completion`). The one floor besides the Keras source where TensorFlow may be
imported (inside functions); above the rules, the targets and verification.
"""

from __future__ import annotations
