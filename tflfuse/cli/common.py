"""What the commands share when they print: JSON on stdout or into a file, sizes in bytes.

The standard library and tflfuse.files only: every command imports it, `--help` does not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tflfuse.files import atomic_write_text


def emit_json(payload: object, destination: str | None) -> None:
    """Write JSON to stdout ('-') or atomically to a file (numpy values as lists, bytes as hex,
    anything else json cannot write as its str)."""
    text = json.dumps(payload, indent=2, default=_json_default) + "\n"
    if destination in (None, "-"):
        sys.stdout.write(text)
    else:
        atomic_write_text(Path(destination), text)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return str(value)


def fmt_bytes(n: float) -> str:
    """A size for people: '512 B', '1.5 KiB', '14.2 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
