#!/usr/bin/env python3
"""Which spelling of the ops the quantizer leaves float runs fastest on each CPU runtime?

    .venv/bin/python benchmarks/int8_completion_bench.py     # ~1 min; writes INT8_COMPLETION.md
    .venv/bin/python benchmarks/int8_completion_bench.py --runs 50 --out /tmp/x.md

litert-quantizer leaves PRELU, RELU_0_TO_1 and DEPTH_TO_SPACE in float between a DEQUANTIZE of
their int8 input and a QUANTIZE of their output (the "island"); `tflfuse.quantize.int8_completion`
can replace the island by one int8 op (the Edge TPU needs that: a float op cuts its graph). On a CPU
the question is only speed, and the answer depends on which kernels the runtime has. This benchmark
builds, on the IR (no TensorFlow), a chain of BLOCKS int8 depthwise convolutions each followed by
the op in every spelling:

  island   DEQUANTIZE -> float op -> QUANTIZE      (what the quantizer leaves; stock keeps it)
  int8     the int8 op int8_completion writes       (PRELU, RELU, DEPTH_TO_SPACE in int8)
  fused    RELU_0_TO_1 only: the convolution before it with fused RELU, writing the island's
           output (what int8_completion writes when the producer can take it)

and times the spellings of one op interleaved (A B A B ..., one thread, medians) under XNNPACK
("xnnpack") and the plain built-in kernels ("none"), in two activation sizes. It also asks the
interpreter which ops XNNPACK took (`delegate_probe.xnnpack_delegated_ops`): an op XNNPACK does
not take splits its partition and runs on the plain kernels. Ratios int8 / island < 1: the int8
spelling is faster. `tflfuse.targets.cost.int8_completion_pays` reads the same numbers from the cost
table (`benchmarks/cost_table.py` measures PRELU, RELU_0_TO_1, DEPTH_TO_SPACE, DEQUANTIZE and
QUANTIZE as one-op models); this file shows them in the context they run in.
"""

from __future__ import annotations

import argparse
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
from tflfuse.ir import (  # noqa: E402
    Graph,
    Model,
    Quantization,
    Tensor,
    flatbuffer,
)
from tflfuse.targets.probe import xnnpack_delegated_ops  # noqa: E402

RUNTIMES = ("xnnpack", "none")
BLOCKS = 8
SIZES = {"small": (16, 16, 32), "large": (64, 64, 32)}  # (H, W, C) of the activations
SPELLINGS = {
    "PRELU": ("island", "int8"),
    "RELU_0_TO_1": ("island", "int8", "fused"),
    "DEPTH_TO_SPACE": ("island", "int8"),
}


def _q(scale: float, zero: int = 0) -> Quantization:
    return Quantization(np.array([scale], np.float32), np.array([zero], np.int64))


class Chain:
    """An int8 chain: input -> (DEPTHWISE_CONV_2D -> the op in one spelling) x BLOCKS."""

    def __init__(self, shape: tuple[int, int, int], seed: int = 0) -> None:
        self.g = Graph("main")
        self.rng = np.random.default_rng(seed)
        self.n = 0
        x = self.g.add_tensor("input", (1, *shape), "INT8", quantization=_q(0.05))
        self.g.inputs = [x]
        self.x = x

    def name(self, what: str) -> str:
        self.n += 1
        return f"{what}_{self.n}"

    def act(self, shape: tuple[int, ...], q: Quantization, dtype: str = "INT8") -> Tensor:
        return self.g.add_tensor(self.name("t"), shape, dtype, quantization=q)

    def depthwise(self, q_out: Quantization, activation: str = "NONE") -> None:
        c = self.x.shape[-1]
        w = np.round(self.rng.uniform(-1, 1, (1, 3, 3, c)) * 127).astype(np.int8)
        wq = Quantization(np.full(c, 1 / 127, np.float32), np.zeros(c, np.int64), axis=3)
        b = Quantization(np.full(c, 0.05 / 127, np.float32), np.zeros(c, np.int64))
        out = self.act(self.x.shape, q_out)
        options = {"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 1,
                   "dilation_h_factor": 1, "dilation_w_factor": 1,
                   "fused_activation_function": activation}  # fmt: skip
        weights = self.g.add_constant(self.name("w"), w, "INT8", wq)
        bias = self.g.add_constant(self.name("b"), np.zeros(c, np.int32), "INT32", b)
        self.g.add_op("DEPTHWISE_CONV_2D", [self.x, weights, bias], [out], options)
        self.x = out

    def island(self, op: str, out_shape: tuple[int, ...], q_out: Quantization, **kw: Any) -> None:
        xf = self.act(self.x.shape, None, "FLOAT32")
        self.g.add_op("DEQUANTIZE", [self.x], [xf])
        yf = self.act(out_shape, None, "FLOAT32")
        inputs = [xf] + ([kw["alpha"]] if "alpha" in kw else [])
        self.g.add_op(op, inputs, [yf], kw.get("options"))
        y = self.act(out_shape, q_out)
        self.g.add_op("QUANTIZE", [yf], [y])
        self.x = y

    def int8(self, op: str, out_shape: tuple[int, ...], q_out: Quantization, **kw: Any) -> None:
        y = self.act(out_shape, q_out)
        inputs = [self.x] + ([kw["alpha"]] if "alpha" in kw else [])
        self.g.add_op(op, inputs, [y], kw.get("options"), version=kw.get("version", 1))
        self.x = y

    def model(self) -> bytes:
        self.g.outputs = [self.x]
        model = Model([self.g])
        model.validate()
        return flatbuffer.to_bytes(model)


def _prelu(spelling: str, shape: tuple[int, int, int]) -> bytes:
    chain = Chain(shape)
    c = shape[-1]
    alpha = chain.rng.uniform(0.05, 0.5, (1, 1, c)).astype(np.float32)
    for _ in range(BLOCKS):
        chain.depthwise(_q(0.1, 0))
        if spelling == "island":
            a = chain.g.add_constant(chain.name("alpha"), alpha, "FLOAT32")
            chain.island("PRELU", chain.x.shape, _q(0.06, -40), alpha=a)
        else:
            values = np.round(alpha / (alpha.max() / 127)).astype(np.int8)
            a = chain.g.add_constant(chain.name("alpha"), values, "INT8", _q(alpha.max() / 127))
            chain.int8("PRELU", chain.x.shape, _q(0.06, -40), alpha=a)
    return chain.model()


def _relu_0_to_1(spelling: str, shape: tuple[int, int, int]) -> bytes:
    chain = Chain(shape)
    for _ in range(BLOCKS):
        if spelling == "fused":
            chain.depthwise(_q(1 / 255, -128), activation="RELU")
            continue
        chain.depthwise(_q(0.05, 0))
        if spelling == "island":
            chain.island("RELU_0_TO_1", chain.x.shape, _q(1 / 255, -128))
        else:
            chain.int8("RELU", chain.x.shape, _q(1 / 255, -128), version=2)
    return chain.model()


def _depth_to_space(spelling: str, shape: tuple[int, int, int]) -> bytes:
    """DEPTH_TO_SPACE(2) then SPACE_TO_DEPTH(2) back (int8 in every spelling), so the chain
    keeps its shape; only the DEPTH_TO_SPACE differs."""
    chain = Chain(shape)
    h, w, c = shape
    for _ in range(BLOCKS):
        chain.depthwise(_q(0.1, 0))
        up = (1, 2 * h, 2 * w, c // 4)
        if spelling == "island":
            chain.island("DEPTH_TO_SPACE", up, _q(0.1, 0), options={"block_size": 2})
        else:
            chain.int8("DEPTH_TO_SPACE", up, _q(0.1, 0), options={"block_size": 2}, version=2)
        chain.int8("SPACE_TO_DEPTH", (1, h, w, c), _q(0.1, 0), options={"block_size": 2},
                   version=2)  # fmt: skip
    return chain.model()


OPS: dict[str, Callable[[str, tuple[int, int, int]], bytes]] = {
    "PRELU": _prelu,
    "RELU_0_TO_1": _relu_0_to_1,
    "DEPTH_TO_SPACE": _depth_to_space,
}


def measure(runs: int, warmup: int, folder: Path, log: Callable[[str], None]) -> list[dict]:
    rows = []
    for op, build in OPS.items():
        for size, shape in SIZES.items():
            paths = []
            delegated = {}
            for spelling in SPELLINGS[op]:
                data = build(spelling, shape)
                path = folder / f"{op}_{size}_{spelling}.tflite"
                path.write_bytes(data)
                paths.append(path)
                model = flatbuffer.from_bytes(data)
                taken = xnnpack_delegated_ops(data)
                delegated[spelling] = (len(taken), len(model.main.ops))
            for runtime in RUNTIMES:
                log(f"{op} {size} on {runtime}")
                result = run_benchmark(
                    paths, delegate=runtime, runs=runs, warmup=warmup, threads=1,
                    names=[p.stem.rsplit("_", 1)[-1] for p in paths], progress=False,
                )  # fmt: skip
                p50 = {m["name"]: m["latency_ms"]["p50"] for m in result["models"]}
                rows.append({"op": op, "size": size, "shape": shape, "runtime": runtime,
                             "p50_ms": p50, "xnnpack_delegated": delegated})  # fmt: skip
    return rows


def render(rows: list[dict], args: argparse.Namespace, minutes: float) -> str:
    lines = [
        "# int8 completion: island or int8 op, per CPU runtime",
        "",
        f"`python benchmarks/int8_completion_bench.py --runs {args.runs}` ({minutes:.1f} min;"
        f" {platform.machine()}, {interpreter_package()}, one thread). Each model: an int8"
        f" chain of {BLOCKS} depthwise 3x3 convolutions, each followed by the op in one spelling;"
        " the spellings of one op timed interleaved; p50 in ms. `island`: DEQUANTIZE -> float op"
        " -> QUANTIZE (what litert-quantizer leaves, and stock keeps); `int8`: the one int8 op"
        " `tflfuse.quantize.int8_completion` writes (PRELU, RELU, DEPTH_TO_SPACE). int8/island < 1:"
        " the int8 op is faster. `fused` (RELU_0_TO_1): the convolution with fused RELU writing the"
        " island's output, no op in between. `XNNPACK took`: ops the interpreter handed to"
        " XNNPACK, of all.",
        "",
        "| op | activations | runtime | island p50 | int8 p50 | int8 / island | fused / island |"
        " XNNPACK took: island | int8 | fused |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        h, w, c = r["shape"]
        p50, took = r["p50_ms"], r["xnnpack_delegated"]
        fused = f"**{p50['fused'] / p50['island']:.2f}**" if "fused" in p50 else ""
        took_cells = [
            f"{took[k][0]}/{took[k][1]}" if k in took else "" for k in ("island", "int8", "fused")
        ]
        lines.append(
            f"| {r['op']} | {h}x{w}x{c} | {r['runtime']} | {p50['island']:.3f} |"
            f" {p50['int8']:.3f} | **{p50['int8'] / p50['island']:.2f}** | {fused} |"
            f" {' | '.join(took_cells)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--out", type=Path, default=HERE / "INT8_COMPLETION.md")
    args = p.parse_args(argv)

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(args.runs, args.warmup, Path(tmp), log)
    text = render(rows, args, (time.perf_counter() - started) / 60)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
