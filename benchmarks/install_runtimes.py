#!/usr/bin/env python3
"""Install real TFLite interpreters, one venv each, for the runtime matrix and its tests.

    python benchmarks/install_runtimes.py DEST [SPEC ...]

Each SPEC is `package==version` (tflite-runtime or ai-edge-litert); without one, the default set
below. A venv goes to DEST/<package>-<version>/ with `numpy` and the package, made with the
oldest pyenv Python that has a wheel for it (tflite-runtime 2.7-2.11 wheels exist for Python
3.7, 2.12-2.14 from 3.8; ai-edge-litert from 3.9/3.10). Each venv gets a `runtime.json`
({"package", "version", "python"}) the tests and `benchmarks/runtime_matrix.py` read; point them
at DEST with the environment variable TFLFUSE_RUNTIMES. An existing venv with its runtime.json is
kept. Nothing is downloaded but through pip from the package index.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT = (
    "tflite-runtime==2.7.0",
    "tflite-runtime==2.8.0",
    "tflite-runtime==2.9.1",
    "tflite-runtime==2.10.0",
    "tflite-runtime==2.11.0",
    "tflite-runtime==2.12.0",
    "tflite-runtime==2.13.0",
    "tflite-runtime==2.14.0",
    "ai-edge-litert==1.2.0",
    "ai-edge-litert==1.4.0",
    "ai-edge-litert==2.1.6",
)
# the Pythons each runtime is installed with, first that exists wins (Coral's Mendel: 3.7)
PYTHONS = {
    "tflite-runtime": ("3.7", "3.8", "3.9"),
    "ai-edge-litert": ("3.11", "3.10", "3.12"),
}
NUMPY = {"3.7": "numpy<1.22", "3.8": "numpy<1.25", "3.9": "numpy<2"}


def pyenv_python(minor: str) -> Path | None:
    """The pyenv interpreter for a minor version (e.g. '3.7'), if installed."""
    try:
        root = subprocess.run(
            ["pyenv", "root"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    for folder in sorted(Path(root, "versions").glob(f"{minor}.*"), reverse=True):
        candidate = folder / "bin" / "python"
        if candidate.is_file():
            return candidate
    return None


def install(spec: str, dest: Path) -> str:
    package, _, version = spec.partition("==")
    if package not in PYTHONS or not version:
        return f"{spec}: not a package==version of {', '.join(PYTHONS)}"
    venv = dest / f"{package}-{version}"
    if (venv / "runtime.json").is_file():
        return f"{spec}: present ({venv})"
    minors = PYTHONS[package]
    if package == "tflite-runtime" and tuple(int(p) for p in version.split(".")[:2]) >= (2, 12):
        minors = tuple(m for m in minors if m != "3.7")
    for minor in minors:
        python = pyenv_python(minor)
        if python is None:
            continue
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([str(python), "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        numpy = NUMPY.get(minor, "numpy")
        done = subprocess.run([*pip, numpy, spec], capture_output=True, text=True)
        if done.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            continue
        info = {"package": package, "version": version, "python": minor}
        (venv / "runtime.json").write_text(json.dumps(info) + "\n")
        return f"{spec}: installed with Python {minor} ({venv})"
    return f"{spec}: no Python here has a wheel for it (tried {', '.join(minors)})"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    dest = Path(argv[0]).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    for spec in argv[1:] or DEFAULT:
        print(install(spec, dest), flush=True)
    print(f"export TFLFUSE_RUNTIMES={dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
