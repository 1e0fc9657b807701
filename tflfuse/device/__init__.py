"""The device side: the interpreter factory (`interpreter`), the benchmark protocol (`bench`) and
the bundle check (`bundle`). Shipped in device bundles (`bundle.SHIPPED_MODULES`) and run there
on Python 3.7 with numpy and an interpreter package only: the lowest floor above the base, it
imports nothing else of tflfuse. Keep this file empty of imports.
"""

from __future__ import annotations
