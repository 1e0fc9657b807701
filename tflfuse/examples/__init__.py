"""Example models built offline: Keras architectures with `weights=None` (`zoo`) and a small
CNN trained on scikit-learn's digits (`digits`). They import Keras lazily.
"""

from __future__ import annotations
