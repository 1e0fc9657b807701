"""The host side of running models: verification runs (`runs`, `verify`, `roundoff`) and device
bundles (`packing` on the host, `deploy` over SSH). The device side that ships in bundles is
`tflfuse.device`.
"""

from __future__ import annotations
