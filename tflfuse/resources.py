"""Where tflfuse's data files are: recipes, delegate tables and device scripts.

The top-level folders of the checkout (`converters/`, `delegates/`, `device_scripts/`) are the
source of truth. A built wheel carries a copy of them as package data in `tflfuse/data/<folder>/`
(setup.py's build step makes it), found here with `importlib.resources`. A checkout or an
editable install has no such copy and reads the top-level folders directly. No TensorFlow here.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable
else:  # pragma: no cover - Python 3.10
    from importlib.abc import Traversable

FOLDERS = ("converters", "delegates", "device_scripts")


def _checkout_folder(folder: str) -> Path | None:
    """`folder` at the top of the source checkout this package runs from, if it does."""
    root = Path(__file__).resolve().parent.parent
    candidate = root / folder
    if (root / "pyproject.toml").is_file() and candidate.is_dir():
        return candidate
    return None


def data_dir(folder: str) -> Traversable:
    """The shipped copy of `folder` (one of FOLDERS); a missing folder is an empty Traversable
    whose `is_dir()` is False, so callers report 'not found' instead of crashing."""
    if folder not in FOLDERS:
        raise ValueError(f"unknown data folder {folder!r} (one of {', '.join(FOLDERS)})")
    packaged = resources.files("tflfuse") / "data" / folder
    if packaged.is_dir():
        return packaged
    return _checkout_folder(folder) or packaged


def data_file(folder: str, name: str) -> Traversable | None:
    """One file of a data folder, or None when it is not shipped."""
    path = data_dir(folder) / name
    return path if path.is_file() else None


def data_names(folder: str, suffix: str = "") -> list[str]:
    """Sorted file names in a data folder (those ending with `suffix`)."""
    folder_path = data_dir(folder)
    if not folder_path.is_dir():
        return []
    return sorted(p.name for p in folder_path.iterdir() if p.is_file() and p.name.endswith(suffix))
