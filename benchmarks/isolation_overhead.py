"""What running native code in a child process (`tflfuse.isolation`) costs `tflfuse convert`.

Two measurements, both interleaved (on, off, on, off, ...) so machine drift hits both alike:
  fork     `isolation.run` of a function returning a convert-sized report (pickled back through
           the pipe) against calling it in-process, in this process (numpy and tflfuse loaded,
           as the CLI has them when it forks); median of many calls
  convert  `tflfuse convert MODEL --recipe xnnpack-int8` as a fresh process with
           TFLFUSE_ISOLATION=1 (the default) and =0; medians and their ratio
The model is a .tflite (default: ../shared/models/pytorch/mobilenet_v2.tflite, a litert-torch
export, when it is there, else conv/depthwise blocks built in the IR; --model for another),
calibrated on seeded random data.

    .venv/bin/python benchmarks/isolation_overhead.py --repeats 5 [--model m.tflite] [--md OUT.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _fork_cost(calls: int) -> tuple[float, float]:
    """Median ms of isolation.run(work) and of work() in-process, interleaved."""
    from tflfuse import isolation

    report = {f"op_{i}": {"rule": "FuseActivationIntoProducer", "error": 0.0} for i in range(2000)}
    assert isolation.available(), "TensorFlow is loaded in this process: no fork"
    forked, direct = [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        isolation.run(lambda: report, what="bench")
        forked.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        (lambda: report)()
        direct.append(time.perf_counter() - t0)
    return statistics.median(forked) * 1e3, statistics.median(direct) * 1e3


def _model(folder: Path) -> Path:
    """A float .tflite of 6 (conv -> depthwise -> conv) blocks (32x32x16)."""
    from irgraphs import conv, depthwise, model_of, to_bytes

    from tflfuse.ir import Graph

    g = Graph("main")
    x = g.add_tensor("x", (1, 32, 32, 3))
    t = conv(g, x, 16, act="RELU6", name="stem").outputs[0]
    for i in range(6):
        e = conv(g, t, 48, k=1, act="RELU6", name=f"e{i}").outputs[0]
        d = depthwise(g, e, act="RELU6", name=f"d{i}").outputs[0]
        t = conv(g, d, 16, k=1, name=f"p{i}").outputs[0]
    path = folder / "blocks.tflite"
    path.write_bytes(to_bytes(model_of(g, [x], [t])))
    return path


def _convert_once(model: Path, calib: Path, out: Path, isolated: bool) -> float:
    env = {**os.environ, "TFLFUSE_ISOLATION": "1" if isolated else "0"}
    cmd = [sys.executable, "-m", "tflfuse.cli", "convert", str(model), "--calib", str(calib)]
    cmd += ["-o", str(out), "--force", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"convert failed:\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="convert runs per setting")
    ap.add_argument("--calls", type=int, default=50, help="isolation.run calls timed")
    ap.add_argument("--model", type=Path, help="a float .tflite (default: built in the IR)")
    ap.add_argument("--md", type=Path, help="also write the table to this Markdown file")
    args = ap.parse_args()

    fork_ms, direct_ms = _fork_cost(args.calls)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shared = Path(__file__).resolve().parents[2] / "shared/models/pytorch/mobilenet_v2.tflite"
        model = args.model or (shared if shared.is_file() else _model(folder))
        from tflfuse.ir import flatbuffer

        shape = flatbuffer.load(model).main.inputs[0].shape[1:]
        calib = folder / "calib.npy"
        np.save(calib, np.random.default_rng(0).uniform(-1, 1, (32, *shape)).astype(np.float32))
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            for isolated in (True, False):
                times[isolated].append(_convert_once(model, calib, folder / "out", isolated))
    on, off = statistics.median(times[True]), statistics.median(times[False])
    lines = [
        "| measurement | isolated (child) | in-process | ratio |",
        "|---|---:|---:|---:|",
        f"| isolation.run of a 2000-entry report, median of {args.calls} (ms) |"
        f" {fork_ms:.2f} | {direct_ms:.4f} | - |",
        f"| `tflfuse convert {model.name} --recipe xnnpack-int8`, median of {args.repeats} (s)"
        f" | {on:.2f} | {off:.2f} | {on / off:.3f} |",
    ]
    text = "\n".join(lines)
    print(text)
    print(
        "runs (s): isolated",
        [round(t, 2) for t in times[True]],
        "in-process",
        [round(t, 2) for t in times[False]],
    )
    if args.md:
        args.md.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
