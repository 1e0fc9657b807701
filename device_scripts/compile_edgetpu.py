#!/usr/bin/env python3
"""Compile quantized .tflite models for the Coral Edge TPU: MODEL.tflite -> MODEL_edgetpu.tflite.

Prefers `tflfuse compile MODEL --target edgetpu` (which wraps the compiler and compares its log
with tflfuse's prediction); without that command, or with --direct, calls `edgetpu_compiler -s`
itself. `--multiple-subgraphs` lets the compiler build several Edge TPU subgraphs (its `-a`).
The compiler exists only for Debian/Ubuntu x86-64 (Coral's package repository); on a
Raspberry Pi or a Coral board use tflfuse's mapping prediction instead.

    python device_scripts/compile_edgetpu.py fused_int8.tflite stock_int8.tflite -o out/
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tflfuse_has_compile(options: list[str]) -> bool:
    """True when this tflfuse has the `compile` subcommand and it takes `options`."""
    sys.path.insert(0, str(REPO))
    try:
        from tflfuse.cli import build_parser
    except ImportError:
        return False
    finally:
        sys.path.remove(str(REPO))
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # an older tflfuse: fall back quietly
            build_parser().parse_args(["compile", "x.tflite", *options])
    except SystemExit:
        return False
    return True


def compile_command(
    model: Path, out_dir: Path, direct: bool, multiple_subgraphs: bool = False
) -> list[str]:
    options = ["--multiple-subgraphs"] if multiple_subgraphs else []
    if not direct and tflfuse_has_compile(options):
        return [sys.executable, "-m", "tflfuse.cli", "compile", str(model), "--target", "edgetpu",
                "-o", str(out_dir), *options]  # fmt: skip
    compiler = shutil.which("edgetpu_compiler")
    if compiler is None:
        raise FileNotFoundError(
            "edgetpu_compiler not found (Coral ships it for Debian x86-64 only);"
            " use tflfuse's Edge TPU prediction on this machine"
        )
    flags = ["-a"] if multiple_subgraphs else []  # edgetpu_compiler 15.0 and 16.0 have it
    return [compiler, "-s", "-o", str(out_dir), *flags, str(model)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="full-integer quantized .tflite files")
    p.add_argument("-o", "--out-dir", default=".", help="folder for the _edgetpu models and logs")
    p.add_argument("--direct", action="store_true", help="call edgetpu_compiler, not tflfuse")
    p.add_argument(
        "--multiple-subgraphs",
        action="store_true",
        help="allow several Edge TPU subgraphs (edgetpu_compiler -a, experimental)",
    )
    args = p.parse_args(argv)
    out_dir = Path(args.out_dir)
    for model in map(Path, args.models):  # all checked before anything is made
        if not model.is_file():
            print(f"compile_edgetpu: error: {model}: no such model file", file=sys.stderr)
            return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    for model in map(Path, args.models):
        try:
            cmd = compile_command(model, out_dir, args.direct, args.multiple_subgraphs)
        except FileNotFoundError as exc:
            print(f"compile_edgetpu: error: {exc}", file=sys.stderr)
            return 2
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        compiled = out_dir / f"{model.stem}_edgetpu.tflite"
        if proc.returncode != 0 or not compiled.is_file():  # no log of a compile that failed
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            why = lines[-1] if lines else f"exit status {proc.returncode}"
            print(f"compile_edgetpu: error: {model}: {why}", file=sys.stderr)
            return 2
        (out_dir / f"{model.stem}_compile.log").write_text(proc.stdout + proc.stderr)
        print(f"{model} -> {compiled}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
