#!/usr/bin/env python3
"""Measure what one kernel costs on this host's runtimes; write the table `tflfuse.targets.cost`
reads.

    python benchmarks/cost_table.py                 # writes delegates/cost_table.json (~2 min)
    python benchmarks/cost_table.py --runs 50 --out /tmp/t.json
    python benchmarks/cost_table.py --kinds PRELU QUANTIZE ...   # merge a few kinds into the table

For every op kind x shape class (small / medium / large work) x dtype (float32, int8) this
builds a one-op .tflite on the IR (no TensorFlow), and times it interleaved with an empty model
(one RESHAPE) under each runtime: XNNPACK ("xnnpack") and the plain built-in kernels ("none").
The entry is the median invoke time minus the empty model's median: what the op adds to a
model's latency. `tflfuse.targets.cost.predict_latency_us` interpolates in `work` (elements written,
or multiply-adds for heavy kernels) between the shape classes measured here.

Variants that behave differently get their own kind: `ADD@bcast` (one operand broadcast along
the last axis), `MEAN@squeeze` (keep_dims=False), `MEAN@last` (over the last axis), `MEAN@rows`
(the same written as a pool, rows as the batch). DEQUANTIZE, QUANTIZE, PRELU, RELU_0_TO_1, RELU
and DEPTH_TO_SPACE price the float island litert-quantizer leaves against the int8 op
`tflfuse.quantize.int8_completion` writes (`cost.int8_completion_refusal`). int8 tensors use
per-tensor scales (weights per channel), as the converter and litert-quantizer write them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tflfuse.device.bench import run_benchmark  # noqa: E402
from tflfuse.device.interpreter import interpreter_package  # noqa: E402
from tflfuse.errors import TflfuseError  # noqa: E402
from tflfuse.ir import (  # noqa: E402
    Graph,
    Model,
    Quantization,
    Tensor,
    flatbuffer,
)
from tflfuse.targets import cost  # noqa: E402

RUNTIMES = ("xnnpack", "none")
DTYPES = ("float32", "int8")
# Rows of a (1, rows, 32) activation: ~512, ~8K and ~64K elements.
ROWS = {"small": 16, "medium": 256, "large": 2048}
CHANNELS = 32


class Builder:
    """One-op graphs in float32 or int8 (per-tensor activation scales)."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.g = Graph("main")
        self.rng = np.random.default_rng(0)

    @property
    def int8(self) -> bool:
        return self.dtype == "int8"

    def act(
        self, shape: tuple[int, ...], scale: float = 0.05, zp: int = 0, name: str = "t"
    ) -> Tensor:
        if not self.int8:
            return self.g.add_tensor(name, shape)
        q = Quantization(np.array([scale], np.float32), np.array([zp], np.int64))
        return self.g.add_tensor(name, shape, "INT8", quantization=q)

    def input(self, shape: tuple[int, ...]) -> Tensor:
        t = self.act(shape, name="input")
        self.g.inputs.append(t)
        return t

    def ints(self, values: Any) -> Tensor:
        return self.g.add_constant("c", np.asarray(values, np.int32), "INT32")

    def weights(self, shape: tuple[int, ...], axis: int) -> Tensor:
        w = self.rng.uniform(-1, 1, shape).astype(np.float32)
        if not self.int8:
            return self.g.add_constant("w", w, "FLOAT32")
        channels = shape[axis]
        q = Quantization(
            np.full(channels, 1 / 127, np.float32), np.zeros(channels, np.int64), axis=axis
        )
        return self.g.add_constant("w", np.round(w * 127).astype(np.int8), "INT8", q)

    def bias(self, n: int, in_scale: float = 0.05) -> Tensor:
        if not self.int8:
            return self.g.add_constant("b", np.zeros(n, np.float32), "FLOAT32")
        scale = np.full(n, in_scale / 127, np.float32)
        q = Quantization(scale, np.zeros(n, np.int64))
        return self.g.add_constant("b", np.zeros(n, np.int32), "INT32", q)

    def const_like(self, shape: tuple[int, ...]) -> Tensor:
        value = self.rng.uniform(0.5, 1.5, shape).astype(np.float32)
        if not self.int8:
            return self.g.add_constant("k", value, "FLOAT32")
        q = Quantization(np.array([0.01], np.float32), np.array([0], np.int64))
        return self.g.add_constant("k", np.round(value / 0.01).astype(np.int8), "INT8", q)

    def op(self, type: str, inputs: list, out: Tensor, **options: Any) -> Model:
        self.g.add_op(type, inputs, [out], options)
        self.g.outputs = [out]
        self.g.validate()
        return Model([self.g])


def _binary(type: str, broadcast: bool) -> Callable[[Builder, int], Model]:
    def build(b: Builder, rows: int) -> Model:
        x = b.input((1, rows, CHANNELS))
        other = b.const_like((1, rows, 1) if broadcast else (1, rows, CHANNELS))
        options = {"fused_activation_function": "NONE"} if type in ("ADD", "SUB", "MUL") else {}
        return b.op(type, [x, other], b.act((1, rows, CHANNELS), 0.1), **options)

    return build


def _unary(type: str, out_q: tuple[float, int] = (0.05, 0), **options: Any) -> Callable:
    def build(b: Builder, rows: int) -> Model:
        x = b.input((1, rows, CHANNELS))
        return b.op(type, [x], b.act((1, rows, CHANNELS), *out_q), **options)

    return build


def _mean(keep_dims: bool) -> Callable[[Builder, int], Model]:
    def build(b: Builder, rows: int) -> Model:
        side = max(int(np.sqrt(rows)), 1)
        x = b.input((1, side, rows // side, CHANNELS))
        shape = (1, 1, 1, CHANNELS) if keep_dims else (1, CHANNELS)
        return b.op("MEAN", [x, b.ints([1, 2])], b.act(shape), keep_dims=keep_dims)

    return build


def _reduce_last(b: Builder, rows: int) -> Model:
    x = b.input((1, rows, CHANNELS))
    return b.op("MEAN", [x, b.ints([2])], b.act((1, rows, 1)), keep_dims=True)


def _mean_rows(b: Builder, rows: int) -> Model:
    """MEAN@last written as a pool: (rows, 1, C, 1) averaged over axes 1, 2."""
    x = b.input((rows, 1, CHANNELS, 1))
    return b.op("MEAN", [x, b.ints([1, 2])], b.act((rows, 1, 1, 1)), keep_dims=True)


def _fc(b: Builder, rows: int) -> Model:
    x = b.input((rows, CHANNELS))
    w = b.weights((CHANNELS, CHANNELS), axis=0)
    return b.op(
        "FULLY_CONNECTED",
        [x, w, b.bias(CHANNELS)],
        b.act((rows, CHANNELS), 0.1),
        fused_activation_function="NONE",
        keep_num_dims=False,
    )


def _conv(k: int, depthwise: bool = False) -> Callable[[Builder, int], Model]:
    def build(b: Builder, rows: int) -> Model:
        side = max(int(np.sqrt(rows)), 1)
        x = b.input((1, side, rows // side, CHANNELS))
        out = b.act((1, side, rows // side, CHANNELS), 0.1)
        options = {"padding": "SAME", "stride_h": 1, "stride_w": 1,
                   "dilation_h_factor": 1, "dilation_w_factor": 1,
                   "fused_activation_function": "NONE"}  # fmt: skip
        if depthwise:
            w = b.weights((1, k, k, CHANNELS), axis=3)
            return b.op("DEPTHWISE_CONV_2D", [x, w, b.bias(CHANNELS)], out, depth_multiplier=1,
                        **options)  # fmt: skip
        w = b.weights((CHANNELS, k, k, CHANNELS), axis=0)
        return b.op("CONV_2D", [x, w, b.bias(CHANNELS)], out, **options)

    return build


def _transpose(b: Builder, rows: int) -> Model:
    x = b.input((1, rows, 2, CHANNELS // 2))
    return b.op("TRANSPOSE", [x, b.ints([0, 2, 1, 3])], b.act((1, 2, rows, CHANNELS // 2)))


def _reshape(b: Builder, rows: int) -> Model:
    x = b.input((1, rows, CHANNELS))
    shape = [rows, CHANNELS]
    return b.op("RESHAPE", [x, b.ints(shape)], b.act(tuple(shape)), new_shape=shape)


def _softmax(b: Builder, rows: int) -> Model:
    x = b.input((1, rows, CHANNELS))
    return b.op("SOFTMAX", [x], b.act((1, rows, CHANNELS), 1 / 256, -128), beta=1.0)


def _island_part(kind: str) -> Callable[[Builder, int], Model]:
    """DEQUANTIZE (int8 in, float out: measured as float32) or QUANTIZE (float in, int8 out:
    measured as int8): the two ends of the float island litert-quantizer leaves around an op
    it has no int8 config for (`tflfuse.quantize.int8_completion`)."""

    def build(b: Builder, rows: int) -> Model:
        q = Quantization(np.array([0.05], np.float32), np.array([0], np.int64))
        shape = (1, rows, CHANNELS)
        x = b.g.add_tensor("input", shape, "INT8" if kind == "DEQUANTIZE" else "FLOAT32",
                           quantization=q if kind == "DEQUANTIZE" else None)  # fmt: skip
        b.g.inputs.append(x)
        out = b.g.add_tensor("y", shape, "FLOAT32" if kind == "DEQUANTIZE" else "INT8",
                             quantization=None if kind == "DEQUANTIZE" else q)  # fmt: skip
        return b.op(kind, [x], out)

    return build


def _prelu(b: Builder, rows: int) -> Model:
    """PRELU with one alpha per channel (1, 1, C), as MediaPipe's models have it; int8 alpha
    with one symmetric scale, as `int8_completion.QuantizePrelu` writes it."""
    x = b.input((1, rows, CHANNELS))
    alpha = b.rng.uniform(0.05, 0.5, (1, 1, CHANNELS)).astype(np.float32)
    if b.int8:
        scale = float(alpha.max()) / 127
        q = Quantization(np.array([scale], np.float32), np.array([0], np.int64))
        a = b.g.add_constant("alpha", np.round(alpha / scale).astype(np.int8), "INT8", q)
    else:
        a = b.g.add_constant("alpha", alpha, "FLOAT32")
    return b.op("PRELU", [x, a], b.act((1, rows, CHANNELS), 0.04, -30))


def _depth_to_space(b: Builder, rows: int) -> Model:
    side = max(int(np.sqrt(rows)), 1)
    x = b.input((1, side, rows // side, CHANNELS))
    out = b.act((1, 2 * side, 2 * (rows // side), CHANNELS // 4))
    return b.op("DEPTH_TO_SPACE", [x], out, block_size=2)


def _batch_matmul(b: Builder, rows: int) -> Model:
    seq = max(int(np.sqrt(rows * 2)), 2)
    x = b.input((1, 2, seq, 16))
    y = b.act((1, 2, seq, 16), name="y")
    b.g.inputs.append(y)
    return b.op("BATCH_MATMUL", [x, y], b.act((1, 2, seq, seq), 0.5), adj_x=False, adj_y=True)


# kind -> (builder, dtypes it is measured in)
KINDS: dict[str, tuple[Callable[[Builder, int], Model], tuple[str, ...]]] = {
    "ADD": (_binary("ADD", False), DTYPES),
    "ADD@bcast": (_binary("ADD", True), DTYPES),
    "SUB": (_binary("SUB", False), DTYPES),
    "SUB@bcast": (_binary("SUB", True), DTYPES),
    "MUL": (_binary("MUL", False), DTYPES),
    "MUL@bcast": (_binary("MUL", True), DTYPES),
    "SQUARED_DIFFERENCE@bcast": (_binary("SQUARED_DIFFERENCE", True), DTYPES),
    "RSQRT": (_unary("RSQRT"), ("float32",)),  # int8 inputs may be <= 0: the kernel fails
    "NEG": (_unary("NEG"), ("float32",)),
    "LOGISTIC": (_unary("LOGISTIC", (1 / 256, -128)), DTYPES),
    "TANH": (_unary("TANH", (1 / 128, 0)), DTYPES),
    "HARD_SWISH": (_unary("HARD_SWISH"), DTYPES),
    "GELU": (_unary("GELU", approximate=False), DTYPES),
    "SOFTMAX": (_softmax, DTYPES),
    "MEAN": (_mean(True), DTYPES),
    "MEAN@squeeze": (_mean(False), DTYPES),
    "MEAN@last": (_reduce_last, DTYPES),
    "MEAN@rows": (_mean_rows, DTYPES),
    "FULLY_CONNECTED": (_fc, DTYPES),
    "CONV_2D": (_conv(1), DTYPES),
    "CONV_2D@3x3": (_conv(3), DTYPES),
    "DEPTHWISE_CONV_2D": (_conv(3, depthwise=True), DTYPES),
    "BATCH_MATMUL": (_batch_matmul, DTYPES),
    "TRANSPOSE": (_transpose, DTYPES),
    "RESHAPE": (_reshape, DTYPES),
    # int8 completion (tflfuse.targets.cost.int8_completion_refusal): the island's parts and the
    # int8 ops
    "DEQUANTIZE": (_island_part("DEQUANTIZE"), ("float32",)),
    "QUANTIZE": (_island_part("QUANTIZE"), ("int8",)),
    "PRELU": (_prelu, DTYPES),
    "RELU_0_TO_1": (_unary("RELU_0_TO_1"), ("float32",)),
    "RELU": (_unary("RELU", (1 / 255, -128)), ("int8",)),  # requantizing, as the completion's
    "DEPTH_TO_SPACE": (_depth_to_space, DTYPES),
}


def measure(
    runs: int, warmup: int, folder: Path, log: Callable[[str], None], kinds: set[str] | None = None
) -> list[dict]:
    """Entries for every kind (or only `kinds`), each dtype, shape class and runtime."""
    entries = []
    for dtype in DTYPES:
        for shape_class, rows in ROWS.items():
            paths, names, work = [], [], {}
            empty = Builder(dtype)
            path = folder / f"empty_{dtype}_{shape_class}.tflite"
            path.write_bytes(flatbuffer.to_bytes(_reshape(empty, 16)))
            paths.append(path)
            names.append("(empty)")
            for kind, (build, dtypes) in KINDS.items():
                if dtype not in dtypes or (kinds is not None and kind not in kinds):
                    continue
                model = build(Builder(dtype), rows)
                op = model.main.ops[0]
                work[kind] = cost.work(op)
                path = folder / f"{kind.replace('@', '_')}_{dtype}_{shape_class}.tflite"
                path.write_bytes(flatbuffer.to_bytes(model))
                paths.append(path)
                names.append(kind)
            for runtime in RUNTIMES:
                log(f"{dtype} {shape_class} on {runtime}: {len(paths)} models")
                try:
                    result = run_benchmark(paths, delegate=runtime, runs=runs, warmup=warmup,
                                           threads=1, names=names, progress=False)  # fmt: skip
                except (TflfuseError, RuntimeError, ValueError) as exc:
                    log(f"  failed: {exc}")
                    continue
                p50 = {m["name"]: m["latency_ms"]["p50"] * 1000 for m in result["models"]}
                base = p50.pop("(empty)")
                for kind, us in p50.items():
                    entries.append({"kind": kind, "dtype": dtype, "runtime": runtime,
                                    "shape_class": shape_class, "work": work[kind],
                                    "us": round(max(us - base, 0.0), 3)})  # fmt: skip
    return entries


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=500)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--out", default=str(HERE.parent / "delegates" / "cost_table.json"))
    p.add_argument(
        "--kinds",
        nargs="+",
        choices=sorted(KINDS),
        help="measure only these kinds and merge them into --out (its other entries are kept;"
        " a decision compares kinds measured in one run)",
    )
    args = p.parse_args(argv)

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    kinds = set(args.kinds) if args.kinds else None
    with tempfile.TemporaryDirectory() as tmp:
        entries = measure(args.runs, args.warmup, Path(tmp), log, kinds)
    merged_from = None
    if kinds is not None and Path(args.out).is_file():
        old = json.loads(Path(args.out).read_text())
        entries = [e for e in old["entries"] if e["kind"] not in kinds] + entries
        merged_from = {k: old[k] for k in ("command", "runs", "minutes") if k in old}
    table = {
        "about": "Per-op latency added to a model (median invoke minus an empty model's), by op"
        " kind, dtype, runtime and work (elements written, or multiply-adds). Written by"
        " benchmarks/cost_table.py; read by tflfuse.targets.cost.",
        "command": "python benchmarks/cost_table.py"
        + (f" --kinds {' '.join(sorted(kinds))}" if kinds else ""),
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "interpreter": interpreter_package(),
        "runs": args.runs,
        "minutes": round((time.perf_counter() - started) / 60, 1),
        **({"other_kinds_from": merged_from} if merged_from else {}),
        "entries": entries,
    }
    Path(args.out).write_text(json.dumps(table, indent=1) + "\n")
    log(f"{len(entries)} entries in {table['minutes']} min: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
