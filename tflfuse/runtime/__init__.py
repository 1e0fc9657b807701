"""The interpreter side: the interpreter factory (`interpreter`), the benchmark protocol
(`bench`), device bundles (`bundle` on the device, `packing` on the host, `deploy` over
SSH), and verification runs (`runs`, `verify`, `roundoff`). The device side
(`interpreter`, `bench`, `bundle`) ships in bundles and imports only numpy, the
interpreter package and the standard library: keep this file empty of imports.
"""

from __future__ import annotations
