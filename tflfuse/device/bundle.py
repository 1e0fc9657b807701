"""Device bundles: the models to benchmark, the code that times them, and a manifest.

A bundle is a folder that runs on its own on a device with Python >= 3.8, numpy and
`tflite_runtime` or `ai_edge_litert` (no TensorFlow, no tflfuse install):
    manifest.json          format, sha256 and size of every other file, recipe, versions, models
    bench_on_device.py     the entry point (device_scripts/bench_on_device.py)
    tflfuse/               the few modules the protocol needs (SHIPPED_MODULES)
    models/*.tflite
The device checks the bundle against its manifest before running anything and refuses a
corrupt one (a file missing, changed or added) or a mismatched one (the host expected another
manifest: a stale or foreign bundle). The identity of a bundle is the sha256 of manifest.json.

The manifest also carries, per model, the verdict of `tflfuse.targets.runtimes` for every
interpreter release tflfuse knows (None: it runs; else the one-line refusal), computed on the host.
The device looks up its own interpreter package and version (`device_interpreter`) and refuses
early, in one line, a model its interpreter cannot build (`check_runtime`), before loading anything.

This module is shipped in the bundle: Python 3.7 syntax, standard library only.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import json
import os
import platform
import re
from pathlib import Path
from typing import TYPE_CHECKING

from tflfuse.device.interpreter import interpreter_module
from tflfuse.errors import TflfuseError

if TYPE_CHECKING:  # for the type checker only (a device's Python may lack TypedDict)
    from collections.abc import Mapping
    from typing import TypedDict

    from tflfuse.json_types import JSONDict

    class DeviceInterpreter(TypedDict):
        package: str  # ai_edge_litert, tflite_runtime or tensorflow
        version: str | None
        runtime: str | None  # the runtime table's name, e.g. tflite-runtime==2.11.0
        libedgetpu: str | None  # with an edgetpu delegate


MANIFEST = "manifest.json"
FORMAT = "tflfuse-bundle/1"
SHIPPED_MODULES = (  # paths in the package: the device side and what it imports
    "__init__.py",
    "version.py",
    "errors.py",
    "device/__init__.py",
    "device/interpreter.py",
    "device/bench.py",
    "device/bundle.py",
)
ENTRY_POINT = "bench_on_device.py"


class BundleError(TflfuseError):
    """A bundle that does not match its manifest (or the manifest the host expected)."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_id(bundle_dir: Path) -> str:
    """The bundle's identity: sha256 of its manifest.json."""
    path = Path(bundle_dir) / MANIFEST
    if not path.is_file():
        raise BundleError(f"{bundle_dir}: no {MANIFEST}: not a tflfuse bundle")
    return sha256_file(path)


def verify_bundle(bundle_dir: Path, expected_id: str | None = None) -> JSONDict:
    """The manifest, once every file is present with its recorded sha256 and nothing was
    added; BundleError (one line) otherwise. `expected_id` pins the manifest itself."""
    bundle_dir = Path(bundle_dir)
    actual_id = manifest_id(bundle_dir)
    if expected_id is not None and actual_id != expected_id:
        raise BundleError(
            f"bundle mismatch: manifest sha256 {actual_id[:12]}... is not the expected"
            f" {expected_id[:12]}... (a stale or foreign bundle)"
        )
    try:
        manifest = json.loads((bundle_dir / MANIFEST).read_text())
    except ValueError as exc:
        raise BundleError(f"{MANIFEST} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise BundleError(f"unsupported bundle format {found!r} (this runner reads {FORMAT})")
    files = manifest.get("files", {})
    for rel, info in sorted(files.items()):
        path = bundle_dir / rel
        if not path.is_file():
            raise BundleError(f"bundle is incomplete: {rel} is missing")
        if path.stat().st_size != info["bytes"] or sha256_file(path) != info["sha256"]:
            raise BundleError(f"bundle is corrupt: {rel} does not match its sha256")
    for root, dirs, names in os.walk(bundle_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            rel = (Path(root) / name).relative_to(bundle_dir).as_posix()
            if rel != MANIFEST and rel not in files and not _is_output(rel):
                raise BundleError(f"bundle has a file its manifest does not list: {rel}")
    for model in manifest.get("models", []):
        if model not in files:
            raise BundleError(f"manifest names model {model} but records no checksum for it")
    return manifest


def _is_output(rel: str) -> bool:
    """Files a run may leave in the bundle folder (results), which the manifest cannot list."""
    return rel.startswith("results/")


# -- which interpreter runs the models -----------------------------------------------------------
RUNTIME_CHECK_FORMAT = 1
_FAMILIES = {"tflite_runtime": "tflite-runtime", "ai_edge_litert": "ai-edge-litert",
             "tensorflow": "tensorflow"}  # fmt: skip


def _version_key(version: str) -> tuple:
    parts = [int(p) for p in re.findall(r"\d+", version)[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def libedgetpu_version() -> str | None:
    """The Edge TPU runtime's own version string (`edgetpu_version()` of libedgetpu), or None
    when the library is not there."""
    library = {"Darwin": "libedgetpu.1.dylib", "Windows": "edgetpu.dll"}.get(
        platform.system(), "libedgetpu.so.1"
    )
    try:
        lib = ctypes.CDLL(library)
        lib.edgetpu_version.restype = ctypes.c_char_p
        raw = lib.edgetpu_version()
    except (OSError, AttributeError):
        return None
    return raw.decode("utf-8", "replace") if raw else None


def device_interpreter(delegate: str = "") -> DeviceInterpreter:
    """{"package", "version", "runtime" (the table's name, e.g. tflite-runtime==2.11.0),
    "libedgetpu"} of the interpreter this device runs (the package the bench will use)."""
    module = interpreter_module()
    package = module.__name__.split(".")[0]
    top = importlib.import_module(package)
    version = getattr(top, "__version__", None)
    if version is None and package == "tensorflow":
        version = getattr(getattr(top, "version", None), "VERSION", None)
    version = str(version) if version else None
    family = _FAMILIES.get(package, package)
    info: DeviceInterpreter = {
        "package": package,
        "version": version,
        "runtime": "{}=={}".format(family, ".".join(map(str, _version_key(version))))
        if version
        else None,
        "libedgetpu": libedgetpu_version() if delegate.startswith("edgetpu") else None,
    }
    return info


def check_runtime(
    manifest: Mapping[str, object], interpreter: DeviceInterpreter, delegate: str
) -> JSONDict:
    """Device side: BundleError (one line) when the manifest says a model cannot run on this
    interpreter release; else what was checked. Only the exact release (major.minor.patch) can
    refuse: for a release tflfuse has no data on, a known older one of the same package that
    runs the model is taken as a pass, anything else is reported as not checked."""
    table = manifest.get("runtime_check")
    runtime = interpreter.get("runtime")
    if not isinstance(table, dict) or table.get("format") != RUNTIME_CHECK_FORMAT:
        return {"checked": False, "reason": "the bundle carries no runtime check"}
    if not runtime:
        return {"checked": False, "reason": "the interpreter does not say its version"}
    mode = "edgetpu" if delegate.startswith("edgetpu") else "plain"
    family, _, version = runtime.partition("==")
    seen = {}
    for model, entry in sorted(table.get("models", {}).items()):
        verdicts = entry.get(mode) or entry.get("plain") or {}
        if runtime in verdicts:
            if verdicts[runtime]:
                raise BundleError(f"{model}: {verdicts[runtime]}")
            seen[model] = runtime
            continue
        older = [
            name
            for name in verdicts
            if name.partition("==")[0] == family
            and _version_key(name.partition("==")[2]) <= _version_key(version)
        ]
        older.sort(key=lambda name: _version_key(name.partition("==")[2]))
        if older and verdicts[older[-1]] is None:
            seen[model] = older[-1]
    if len(seen) < len(table.get("models", {})):
        return {"checked": False, "runtime": runtime, "reason": "no data for this release"}
    return {"checked": True, "runtime": runtime, "as": seen, "delegate": mode}
