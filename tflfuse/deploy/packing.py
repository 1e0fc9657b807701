"""Write a device bundle (host side): the models, the modules the protocol needs,
bench_on_device.py and a manifest with each model's runtime verdicts. The device side of
a bundle (checking it, running it) is `tflfuse.device.bundle`, which ships in it.
"""

from __future__ import annotations

import json
import platform
import shutil
import time
from pathlib import Path
from typing import Any

from tflfuse.device.bundle import (
    ENTRY_POINT,
    FORMAT,
    MANIFEST,
    RUNTIME_CHECK_FORMAT,
    SHIPPED_MODULES,
    sha256_file,
)
from tflfuse.device.interpreter import interpreter_package
from tflfuse.errors import TflfuseError
from tflfuse.ir import flatbuffer
from tflfuse.json_types import JSONDict
from tflfuse.resources import data_file
from tflfuse.targets import runtimes
from tflfuse.version import __version__

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # tflfuse/


def _entry_point_source() -> bytes:
    """bench_on_device.py from the package data."""
    source = data_file("device_scripts", ENTRY_POINT)
    if source is None:
        raise TflfuseError(f"{ENTRY_POINT} is not installed with tflfuse (a broken install?)")
    return source.read_bytes()


def make_bundle(
    models: list[Path],
    out_dir: Path,
    *,
    recipe: str | None = None,
    extra: JSONDict | None = None,
) -> Path:
    """Write a bundle for `models` into the empty or absent folder `out_dir`; its manifest path."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise TflfuseError(f"{out_dir}: bundle folder is not empty")
    paths = [Path(m) for m in models]
    names = [p.name for p in paths]
    for p in paths:
        if not p.is_file():
            raise TflfuseError(f"{p}: no such model file")
    if len(set(names)) != len(names):
        raise TflfuseError("two models share a file name; a bundle keeps names unique")
    (out_dir / "models").mkdir(parents=True, exist_ok=True)
    (out_dir / "tflfuse").mkdir(exist_ok=True)
    for p in paths:
        shutil.copyfile(p, out_dir / "models" / p.name)
    for module in SHIPPED_MODULES:
        (out_dir / "tflfuse" / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_PACKAGE_DIR / module, out_dir / "tflfuse" / module)
    (out_dir / ENTRY_POINT).write_bytes(_entry_point_source())
    files = {}
    for path in sorted(out_dir.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            rel = path.relative_to(out_dir).as_posix()
            files[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    manifest: JSONDict = {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "recipe": recipe,
        "models": ["models/" + n for n in names],
        "files": files,
        "versions": {
            "tflfuse": __version__,
            "host_python": platform.python_version(),
            "host_interpreter": interpreter_package(),
        },
    }
    manifest["runtime_check"] = _runtime_verdicts(paths, names)
    if extra:
        manifest["extra"] = extra
    target = out_dir / MANIFEST
    target.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return target


def _runtime_verdicts(paths: list[Path], names: list[str]) -> dict[str, Any]:
    """Host side: per model, {runtime: None or refusal} for every release tflfuse knows; a
    compiled Edge TPU model also with the Edge TPU delegate loaded (`edgetpu`)."""
    models: dict[str, Any] = {}
    for path, name in zip(paths, names):
        model = flatbuffer.load(path)
        entry = {"plain": runtimes.verdicts(model)}
        if any(n.custom == runtimes.EDGETPU_CUSTOM_OP for n in runtimes.needs(model)):
            entry["edgetpu"] = runtimes.verdicts(model, delegate="edgetpu")
        models["models/" + name] = entry
    return {"format": RUNTIME_CHECK_FORMAT, "models": models}
