"""The version of tflfuse, on its own so that any module (and a device bundle) can read it
without importing the package's API. Shipped in device bundles: Python 3.7, stdlib.
"""

from __future__ import annotations

__version__ = "0.1.0"
