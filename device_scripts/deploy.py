#!/usr/bin/env python3
"""Push .tflite models to a device over SSH, benchmark them there, pull the JSON back.

    python device_scripts/deploy.py fused.tflite unfused.tflite --host mendel@coral.local \\
        --delegate edgetpu --runs 200 --json results/coral.json

Runs on the host (needs tflfuse and the OpenSSH client). The device needs Python >= 3.8, numpy
and tflite_runtime or ai_edge_litert; see tflfuse/deploy/packing.py for what is sent and
tflfuse/device/bundle.py for how the device checks it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tflfuse.deploy.deploy import SshTarget, deploy_and_bench
from tflfuse.device.bench import format_table
from tflfuse.errors import TflfuseError
from tflfuse.files import atomic_write_text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help=".tflite files (first = baseline)")
    p.add_argument("--host", required=True, help="[user@]host of the device")
    p.add_argument("--port", type=int, help="SSH port")
    p.add_argument("-i", "--identity", help="SSH private key")
    p.add_argument(
        "--ssh-option", action="append", default=[], metavar="KEY=VALUE", help="ssh -o KEY=VALUE"
    )
    p.add_argument("--remote-dir", default="tflfuse-bench", help="folder on the device")
    p.add_argument("--remote-python", default="python3", help="Python on the device")
    p.add_argument("--recipe", help="recipe name recorded in the manifest")
    p.add_argument("--delegate", default="xnnpack")
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int)
    p.add_argument("-o", "--json", metavar="OUT.json", help="write the device's result here")
    args = p.parse_args(argv)
    if args.json and "=" in args.json and not args.json.endswith(".json"):  # an ssh option
        p.error(f"-o is the output file ({args.json!r}?); ssh options go with --ssh-option")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target = SshTarget(args.host, args.port, args.identity, list(args.ssh_option))
    try:
        result = deploy_and_bench(
            [Path(m) for m in args.models],
            target,
            args.remote_dir,
            recipe=args.recipe,
            remote_python=args.remote_python,
            delegate=args.delegate,
            runs=args.runs,
            warmup=args.warmup,
            threads=args.threads,
        )
        if args.json:
            import json

            atomic_write_text(Path(args.json), json.dumps(result, indent=2) + "\n")
    except TflfuseError as exc:
        print(f"deploy: error: {exc}", file=sys.stderr)
        return 2
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
