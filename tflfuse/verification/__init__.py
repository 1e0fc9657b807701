"""Verification: is a rewritten model still the same function? Interpreter runs over samples
(`runs`, memoized once per conversion in `run_memo`), output comparison (`verify`), the float32
round-off bound (`roundoff`), the int8 check of each rewrite where it stands (`rewrite_check`) and
the one verified-apply service every stage that rewrites goes through (`verified`). Above the IR,
the engine and the device floor; no TensorFlow.
"""

from __future__ import annotations
