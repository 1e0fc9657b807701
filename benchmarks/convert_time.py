"""Wall time of `tflfuse convert` against the stock TFLite converter alone (MobileNetV2, int8).

Both run as fresh processes from the same saved .keras file and the same calibration .npy, so
interpreter start-up, TensorFlow import and model loading count for both:
  tflfuse  `tflfuse convert MODEL --recipe xnnpack-int8 --calib C.npy -o OUT` (fused, unfused and
           stock models, verification, report)
  stock    load the .keras file, `TFLiteConverter.from_keras_model` with full-int8 PTQ
Runs are interleaved (stock, tflfuse, stock, tflfuse, ...) so machine drift hits both alike; the
medians and their ratio are printed (goal: tflfuse adds at most 30%).

    .venv/bin/python benchmarks/convert_time.py --repeats 5 --size 96 --samples 100
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STOCK_SCRIPT = """
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import keras
from tflfuse import zoo
model = keras.saving.load_model(sys.argv[1], compile=False)
calib = np.load(sys.argv[2])
data = zoo.to_tflite(model, int8=True, calibration=calib, io_type="int8")
open(sys.argv[3], "wb").write(data)
"""


def _time(cmd: list[str]) -> float:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--size", type=int, default=96, help="MobileNetV2 input size")
    ap.add_argument("--samples", type=int, default=100, help="calibration samples")
    ap.add_argument("--json", help="also write the numbers to this file")
    args = ap.parse_args()

    import numpy as np

    from tflfuse import zoo

    python = sys.executable
    tflfuse_cmd = str(Path(python).with_name("tflfuse"))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = zoo.build("mobilenet_v2", input_size=args.size)
        model.save(work / "mnv2.keras")
        calib = zoo.sample_inputs((args.size, args.size, 3), n=args.samples, seed=5)
        np.save(work / "calib.npy", calib)
        (work / "stock.py").write_text(STOCK_SCRIPT)
        times: dict[str, list[float]] = {"stock": [], "tflfuse": []}
        for i in range(args.repeats):
            times["stock"].append(
                _time(
                    [
                        python,
                        str(work / "stock.py"),
                        str(work / "mnv2.keras"),
                        str(work / "calib.npy"),
                        str(work / "stock.tflite"),
                    ]
                )
            )
            times["tflfuse"].append(
                _time(
                    [
                        tflfuse_cmd,
                        "convert",
                        str(work / "mnv2.keras"),
                        "--recipe",
                        "xnnpack-int8",
                        "--calib",
                        str(work / "calib.npy"),
                        "-o",
                        str(work / f"out{i}"),
                        "--json",
                    ]
                )
            )
            print(
                f"repeat {i + 1}: stock {times['stock'][-1]:.1f} s,"
                f" tflfuse {times['tflfuse'][-1]:.1f} s",
                file=sys.stderr,
            )
        report = json.loads((work / "out0" / "report.json").read_text())
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "model": f"MobileNetV2 {args.size}px, int8, {args.samples} calibration samples",
        "repeats": args.repeats,
        "median_s": med,
        "ratio_tflfuse_over_stock": med["tflfuse"] / med["stock"],
        "all_s": times,
        "tflfuse_stage_s": report["timings_s"],
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
