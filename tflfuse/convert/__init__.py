"""The conversion pipeline (`tflfuse convert`, `pipeline`) and the optimize pipeline
(`tflfuse optimize`, `optimize`): recipes, calibration data, quantization (the only other
TensorFlow/quantizer user, lazily), int8 completion, the report and the comparison.
`tflfuse.convert(...)` is the API function (see tflfuse/__init__.py); import the stages
from their modules.
"""

from __future__ import annotations
