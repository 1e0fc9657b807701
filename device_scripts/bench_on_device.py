#!/usr/bin/env python3
"""Benchmark .tflite models on the device with the same protocol as `tflfuse bench`.

Needs only Python >= 3.7, numpy and `tflite_runtime` or `ai_edge_litert` (no TensorFlow).
Runs from a bundle folder (see tflfuse/device/bundle.py), whose manifest it checks first, or from a
tflfuse checkout/install with plain model paths:

    python3 bench_on_device.py --bundle . --expect MANIFEST_SHA256 --json results/bench.json
    python3 bench_on_device.py model_a.tflite model_b.tflite --delegate edgetpu --runs 200

A bundle whose model this device's interpreter cannot build (an op code or version newer than
the installed release: the manifest says so, checked on the host) is refused before anything
loads. The JSON records the interpreter package, its version and, for the Edge TPU, libedgetpu's.

Exit status 0 on success; 2 with one line on stderr for a refused bundle or bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the bundle ships tflfuse/ beside this script; in a checkout the package is one folder up
for _root in (HERE, HERE.parent):
    if (_root / "tflfuse" / "device" / "bench.py").is_file():
        sys.path.insert(0, str(_root))
        break

try:
    from tflfuse.device import bench, bundle
    from tflfuse.errors import TflfuseError
except ImportError as exc:  # a bundle that lost a module: refused in one line like any other
    print(f"bench_on_device: error: bundle is incomplete: a module is missing ({exc})",
          file=sys.stderr)  # fmt: skip
    sys.exit(2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", help=".tflite files (default: the bundle's models)")
    p.add_argument("--bundle", help="bundle folder: verify its manifest, bench its models")
    p.add_argument("--expect", help="sha256 the bundle's manifest.json must have")
    p.add_argument("--delegate", default="xnnpack")
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the result JSON here (default: stdout)")
    p.add_argument("--progress", action="store_true", help="progress bar (needs tqdm)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        models = [Path(m) for m in args.models]
        manifest = None
        interpreter = bundle.device_interpreter(args.delegate)
        runtime_check = None
        if args.bundle:
            root = Path(args.bundle)
            manifest = bundle.verify_bundle(root, args.expect)
            runtime_check = bundle.check_runtime(manifest, interpreter, args.delegate)
            if not models:
                models = [root / m for m in manifest["models"]]
        if not models:
            raise TflfuseError("no models: pass .tflite files or --bundle DIR")
        result = bench.run_benchmark(
            models,
            delegate=args.delegate,
            runs=args.runs,
            warmup=args.warmup,
            threads=args.threads,
            seed=args.seed,
            progress=args.progress,
        )
        result["runner"] = {
            "script": "bench_on_device.py",
            "tflfuse_source": str(Path(bench.__file__).resolve().parents[1]),  # tflfuse/
            "tensorflow_imported": sys.modules.get("tensorflow") is not None,
            "interpreter": interpreter,
        }
        if runtime_check is not None:
            result["runtime_check"] = runtime_check
        if manifest is not None:
            result["bundle"] = {
                "manifest_sha256": bundle.manifest_id(Path(args.bundle)),
                "recipe": manifest.get("recipe"),
                "versions": manifest.get("versions"),
            }
        text = json.dumps(result, indent=2) + "\n"
        if args.json:
            out = Path(args.json)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(text)
            os.replace(str(tmp), str(out))
            print(bench.format_table(result))
        else:
            sys.stdout.write(text)
    except TflfuseError as exc:
        print(f"bench_on_device: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
