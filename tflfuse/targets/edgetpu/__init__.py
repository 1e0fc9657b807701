"""The Edge TPU: the mapping predictor (`predict`), the `edgetpu_compiler` wrapper
(`compiler`, `compiler_log`), compiled twins as ground truth (`truth`), the Model Explorer
overlay (`overlay`) and the legalization rules that rewrite ops it does not map (`rules`).
"""

from __future__ import annotations
