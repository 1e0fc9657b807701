"""Numbers for the exporter rules (issue 10, deliverable 3): do they pay, and on which runtime?

Two parts:
  micro   each rule's pattern on a small inline graph, before and after the rule alone, timed
          interleaved (before, after, before, ...) under XNNPACK and under the plain kernels
          (`--delegate none`); medians and after/before ratios.
  models  the litert-torch exports in ../shared/models/pytorch: ops of the input, of the level-2
          pipeline without the exporter rules and with them; for int8 (litert-quantizer's
          default static recipe, the same random calibration for every variant): stock (the input
          quantized as given) against fused, p50 on XNNPACK and plain kernels, error against the
          float input, and the predicted Edge TPU mapping (uint8 I/O) stock vs fused.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/exporter_rules_bench.py [--runs 300]
        [--model-runs 100] [--only micro|models] [--json PATH]

Calibration and timing inputs are seeded random tensors in the model's input shape (the models
have random weights and come without data), so errors compare variants, not task accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tflfuse import targets
from tflfuse.convert.rule_sets import pipeline
from tflfuse.device import bench
from tflfuse.ir import Graph, Model, Signature, Tensor, flatbuffer
from tflfuse.rewrite import DeadCodeElimination, PassManager, Rule, TopologicalSort
from tflfuse.rules import exporter
from tflfuse.rules.algebra import CollapseReshapeChain
from tflfuse.rules.epilogue import FuseActivationIntoProducer
from tflfuse.targets import target as target_named
from tflfuse.verification import runs as runs_module
from tflfuse.verification import verify

MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models" / "pytorch"
EXPORTER_NAMES = tuple(
    sorted(
        {
            r.name
            for t in ("xnnpack", "cpu", "edgetpu")
            for r in exporter.exporter_rules(target_named(t))
        }
    )
)
RNG = np.random.default_rng(0)


# -- small graphs -------------------------------------------------------------------------------
class _G:
    def __init__(self) -> None:
        self.g = Graph("main")

    def input(self, shape) -> Tensor:
        t = self.g.add_tensor("input", shape)
        self.g.inputs.append(t)
        return t

    def c(self, value) -> Tensor:
        arr = np.asarray(value)
        kind = "FLOAT32" if arr.dtype.kind == "f" else "INT32"
        return self.g.add_constant(
            "c", arr.astype(np.float32 if kind == "FLOAT32" else np.int32), kind
        )

    def w(self, *shape) -> Tensor:
        return self.c(RNG.normal(0, 0.2, shape).astype(np.float32))

    def op(self, type: str, inputs, shape, **options) -> Tensor:
        out = self.g.add_tensor(type.lower(), shape)
        self.g.add_op(type, inputs, [out], options)
        return out

    def reshape(self, x, shape) -> Tensor:
        return self.op("RESHAPE", [x, self.c(np.array(shape))], shape, new_shape=list(shape))

    def transpose(self, x, perm) -> Tensor:
        return self.op("TRANSPOSE", [x, self.c(np.array(perm))], [x.shape[p] for p in perm])

    def fc(self, x, out) -> Tensor:
        shape = (*x.shape[:-1], out)
        return self.op(
            "FULLY_CONNECTED",
            [x, self.w(out, x.shape[-1]), self.w(out)],
            shape,
            keep_num_dims=True,
            fused_activation_function="NONE",
        )

    def bin(self, type, a, b) -> Tensor:
        shape = np.broadcast_shapes(a.shape, b.shape)
        opts = {"fused_activation_function": "NONE"} if type in ("ADD", "SUB", "MUL") else {}
        return self.op(type, [a, b], shape, **opts)

    def conv(self, x, cout, act="NONE", k=3) -> Tensor:
        n, h, w, c = x.shape
        return self.op(
            "CONV_2D",
            [x, self.w(cout, k, k, c), self.w(cout)],
            (n, h, w, cout),
            padding="SAME",
            stride_h=1,
            stride_w=1,
            fused_activation_function=act,
        )

    def bytes(self, *outs) -> bytes:
        """The model, with a signature (litert-quantizer needs one)."""
        self.g.outputs = list(outs)
        signature = Signature(
            "serving_default",
            0,
            {f"input_{i}": t for i, t in enumerate(self.g.inputs)},
            {f"output_{i}": t for i, t in enumerate(outs)},
        )
        return flatbuffer.to_bytes(Model([self.g], signatures=[signature]))


def layer_norm_graph(rows: int = 128, width: int = 256) -> bytes:
    """FC -> LayerNorm as litert-torch writes it -> FC."""
    b = _G()
    x = b.fc(b.input((1, rows, width)), width)
    mean = b.op("MEAN", [x, b.c(np.array([0, 2]))], (rows,), keep_dims=False)
    sq = b.bin("SQUARED_DIFFERENCE", x, b.reshape(mean, (1, rows, 1)))
    var = b.op("MEAN", [sq, b.c(np.array([0, 2]))], (rows,), keep_dims=False)
    r = b.op("RSQRT", [b.bin("ADD", var, b.c(np.float32(1e-5)))], (rows,))
    neg = b.bin("SUB", b.c(np.float32(0.0)), b.bin("MUL", r, mean))
    y = b.bin("ADD", b.bin("MUL", x, b.reshape(r, (1, rows, 1))), b.reshape(neg, (1, rows, 1)))
    return b.bytes(b.fc(y, width))


def attention_graph(seq: int = 64, width: int = 128, heads: int = 4) -> bytes:
    """litert-torch's self-attention layout: fused QKV, RESHAPE/TRANSPOSE/SLICE, per-head
    RESHAPE/TRANSPOSE, K^T in five ops, softmax between reshapes, heads merged back."""
    b = _G()
    d = width // heads
    qkv = b.fc(b.input((1, seq, width)), 3 * width)
    t = b.transpose(b.reshape(qkv, (seq, 1, 3, width)), (2, 0, 1, 3))
    parts = []
    for i in range(3):
        part = b.op(
            "SLICE",
            [t, b.c(np.array([i, 0, 0, 0])), b.c(np.array([1, seq, 1, width]))],
            (1, seq, 1, width),
        )
        if i < 2:
            part = b.bin("MUL", part, b.c(np.float32(d**-0.25)))
        h = b.transpose(b.reshape(part, (seq, heads, d)), (1, 0, 2))
        if i == 1:
            h = b.reshape(
                b.transpose(b.reshape(h, (1, heads, seq, d)), (0, 1, 3, 2)), (heads, d, seq)
            )
        parts.append(h)
    s = b.op("BATCH_MATMUL", [parts[0], parts[1]], (heads, seq, seq), adj_x=False, adj_y=False)
    p = b.reshape(
        b.op("SOFTMAX", [b.reshape(s, (1, heads, seq, seq))], (1, heads, seq, seq), beta=1.0),
        (heads, seq, seq),
    )
    o = b.op("BATCH_MATMUL", [p, parts[2]], (heads, seq, d), adj_x=False, adj_y=False)
    o = b.reshape(b.transpose(b.reshape(o, (1, heads, seq, d)), (2, 0, 1, 3)), (seq, width))
    return b.bytes(b.fc(o, width))


def padded_pool_graph(size: int) -> bytes:
    """conv+RELU -> PADV2(lowest) -> MAX_POOL_2D 3x3/2 VALID -> conv (PyTorch MaxPool2d(3,2,1))."""
    b = _G()
    x = b.conv(b.input((1, size, size, 32)), 32, act="RELU")
    lowest = np.float32(np.finfo(np.float32).min)
    pad = b.op(
        "PADV2",
        [x, b.c(np.array([[0, 0], [1, 1], [1, 1], [0, 0]])), b.c(lowest)],
        (1, size + 2, size + 2, 32),
    )
    o = (size + 2 - 3) // 2 + 1
    y = b.op(
        "MAX_POOL_2D",
        [pad],
        (1, o, o, 32),
        padding="VALID",
        stride_h=2,
        stride_w=2,
        filter_height=3,
        filter_width=3,
        fused_activation_function="NONE",
    )
    return b.bytes(b.conv(y, 32))


def strided_depthwise_graph(size: int = 64, channels: int = 96) -> bytes:
    """conv+RELU6 -> PAD(1, 1) -> DEPTHWISE_CONV_2D 3x3/2 VALID -> conv (MobileNetV2 as
    litert-torch writes its strided blocks)."""
    b = _G()
    x = b.conv(b.input((1, size, size, channels)), channels, act="RELU6", k=1)
    pad = b.op(
        "PAD",
        [x, b.c(np.array([[0, 0], [1, 1], [1, 1], [0, 0]]))],
        (1, size + 2, size + 2, channels),
    )
    o = size // 2
    y = b.op(
        "DEPTHWISE_CONV_2D",
        [pad, b.w(1, 3, 3, channels), b.w(channels)],
        (1, o, o, channels),
        padding="VALID",
        stride_h=2,
        stride_w=2,
        depth_multiplier=1,
        fused_activation_function="RELU6",
    )
    return b.bytes(b.conv(y, channels, k=1))


def batch_matmul_graph(rows: int = 64, k: int = 256, n: int = 256) -> bytes:
    b = _G()
    x = b.op("RELU", [b.input((1, rows, k))], (1, rows, k))
    return b.bytes(b.op("BATCH_MATMUL", [x, b.w(k, n)], (1, rows, n), adj_x=False, adj_y=False))


def clamp_graph(size: int = 32) -> bytes:
    b = _G()
    x = b.conv(b.input((1, size, size, 32)), 32)
    y = b.bin("MINIMUM", b.bin("MAXIMUM", x, b.c(np.float32(0.0))), b.c(np.float32(6.0)))
    return b.bytes(b.conv(y, 32))


def _apply(data: bytes, rules: list[Rule]) -> bytes:
    model = flatbuffer.from_bytes(data)
    PassManager([*rules, DeadCodeElimination(), TopologicalSort()]).run(model)
    return flatbuffer.to_bytes(model)


def _ops(data: bytes) -> int:
    return len(flatbuffer.from_bytes(data).main.ops)


def _xnnpack_partitions(data: bytes) -> int | None:
    """How many XNNPACK partitions the model is cut into (None if the interpreter won't say
    or XNNPACK fails to prepare it)."""
    from tflfuse.device.interpreter import make_interpreter
    from tflfuse.errors import TflfuseError

    try:
        interp = make_interpreter(data, delegate="xnnpack")
    except TflfuseError:
        return None
    details = getattr(interp, "_get_ops_details", None)
    if details is None:
        return None
    return sum(1 for op in details() if op["op_name"] == "DELEGATE")


def _time(
    paths: list[Path], names: list[str], runs: int, delegates=("xnnpack", "none")
) -> dict[str, Any]:
    from tflfuse.errors import TflfuseError

    out: dict[str, Any] = {}
    for delegate in delegates:
        try:
            r = bench.run_benchmark(
                paths,
                delegate=delegate,
                runs=runs,
                warmup=20,
                threads=1,
                names=names,
                progress=False,
            )
        except TflfuseError as exc:  # e.g. XNNPACK fails to prepare one of them
            out[delegate] = {"error": str(exc), "ratio": {n: float("nan") for n in names[1:]}}
            for path in paths:
                keep = Path(tempfile.gettempdir()) / f"exporter_bench_failed_{path.name}"
                keep.write_bytes(path.read_bytes())
            continue
        p50 = [m["latency_ms"]["p50"] for m in r["models"]]
        out[delegate] = {
            "p50_ms": dict(zip(names, p50)),
            "ratio": {n: p / p50[0] for n, p in zip(names[1:], p50[1:])},
        }
    return out


def micro(runs: int, work: Path) -> list[dict[str, Any]]:
    cases = [
        ("ShortenLayerNorm", layer_norm_graph(), [exporter.ShortenLayerNorm()]),
        (
            "attention layout (SliceBeforeLayout, SinkReshapeBelowScalarOp, "
            "CanonicalizeLayoutChain, SoftmaxThroughReshape)",
            attention_graph(),
            [
                exporter.SliceBeforeLayout(),
                exporter.SinkReshapeBelowScalarOp(),
                exporter.CanonicalizeLayoutChain(),
                exporter.SoftmaxThroughReshape(),
                CollapseReshapeChain(),
            ],
        ),
        (
            "LegalizePadV2BeforeMaxPool -> PAD",
            padded_pool_graph(64),
            [exporter.LegalizePadV2BeforeMaxPool()],
        ),
        (
            "LegalizePadV2BeforeMaxPool -> SAME",
            padded_pool_graph(65),
            [exporter.LegalizePadV2BeforeMaxPool()],
        ),
        (
            "BatchMatmulToFullyConnected",
            batch_matmul_graph(),
            [exporter.BatchMatmulToFullyConnected()],
        ),
        (
            "FoldPadByWidenedKernel (3x3/2 depthwise -> 4x4 SAME)",
            strided_depthwise_graph(),
            [exporter.FoldPadByWidenedKernel()],
        ),
        (
            "RecognizeClamp (+ fused into the conv)",
            clamp_graph(),
            [exporter.RecognizeClamp(), FuseActivationIntoProducer()],
        ),
    ]
    rows = []
    for i, (name, before, rules) in enumerate(cases):
        after = _apply(before, rules)
        agreement = verify.compare(before, after, atol=1e-4, rtol=1e-4)
        paths = [work / f"micro{i}_before.tflite", work / f"micro{i}_after.tflite"]
        paths[0].write_bytes(before)
        paths[1].write_bytes(after)
        row = {
            "rule": name,
            "ops_before": _ops(before),
            "ops_after": _ops(after),
            "xnnpack_partitions": [_xnnpack_partitions(before), _xnnpack_partitions(after)],
            "max_abs_error": agreement.max_abs,
            "varies": agreement.varies,
            "timing": _time(paths, ["before", "after"], runs),
        }
        # the same two graphs after litert-quantizer (the int8 recipes rewrite in float first)
        calib = _calibration(before, 16)
        q_paths = [work / f"micro{i}_before_int8.tflite", work / f"micro{i}_after_int8.tflite"]
        for p, d in zip(q_paths, (before, after)):
            p.write_bytes(_quantize(d, calib, "int8"))
        row["int8_xnnpack_partitions"] = [_xnnpack_partitions(p.read_bytes()) for p in q_paths]
        row["int8_timing"] = _time(q_paths, ["before", "after"], runs)
        print(_micro_line(row), flush=True)
        rows.append(row)
    return rows


def _micro_line(row: dict[str, Any]) -> str:
    t, q = row["timing"], row["int8_timing"]
    return (
        f"{row['rule']}: ops {row['ops_before']} -> {row['ops_after']}, XNNPACK partitions "
        f"{row['xnnpack_partitions'][0]} -> {row['xnnpack_partitions'][1]}, after/before p50 "
        f"float xnnpack {t['xnnpack']['ratio']['after']:.3f}, plain "
        f"{t['none']['ratio']['after']:.3f}; int8 (partitions {row['int8_xnnpack_partitions']}) "
        f"xnnpack {q['xnnpack']['ratio']['after']:.3f}, plain {q['none']['ratio']['after']:.3f}"
        f" (float max abs err {row['max_abs_error']:.2g})"
    )


# -- the pytorch models -------------------------------------------------------------------------
def _optimize(data: bytes, target: str, with_exporter: bool) -> tuple[bytes, dict[str, int]]:
    model = flatbuffer.from_bytes(data)
    disabled = () if with_exporter else EXPORTER_NAMES
    result = PassManager(pipeline(2, target_named(target)), disabled=disabled).run(model)
    return flatbuffer.to_bytes(model), result.fired()


def _calibration(data: bytes, n: int = 32) -> list[np.ndarray]:
    shape = flatbuffer.from_bytes(data).main.inputs[0].shape
    return [np.random.default_rng(1).uniform(-1, 1, (n, *shape[1:])).astype(np.float32)]


def _quantize(data: bytes, calib, io: str) -> bytes:
    from tflfuse.quantize import quantize

    return quantize.quantize(
        data, "int8", calib, input_type=io, output_type=io, progress=False
    ).data


def _mapped(data: bytes) -> dict[str, Any]:
    p = targets.predict_edgetpu(flatbuffer.from_bytes(data))
    cut = next((o for o in p.ops if o.runs_on == "cpu" and "More than one" not in o.status), None)
    cpu_kinds = sorted(
        {o.op for o in p.ops if o.runs_on == "cpu" and "More than one" not in o.status}
    )
    return {
        "mapped": p.mapped,
        "ops": len(p.ops),
        "first_cpu_op": None if cut is None else f"{cut.index} {cut.op}: {cut.reason}",
        "unmappable_kinds": cpu_kinds,
    }


def _error(float_model: bytes, int8_model: bytes) -> dict[str, float]:
    from tflfuse.device.interpreter import make_interpreter

    inputs = verify.seeded_inputs(make_interpreter(float_model), 7, 4)
    ref = runs_module.run(float_model, inputs)
    got = runs_module.run(int8_model, inputs)
    diffs = [
        np.abs(r.astype(np.float64) - g.astype(np.float64))
        for rs, gs in zip(ref, got)
        for r, g in zip(rs, gs)
    ]
    return {
        "max_abs": float(max(d.max() for d in diffs)),
        "mean_abs": float(np.mean([d.mean() for d in diffs])),
    }


RUNTIMES = {"xnnpack": "xnnpack", "cpu": "none"}  # CPU target -> the delegate that runs it


def models(runs: int, work: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(MODELS.glob("*.tflite")):
        data = path.read_bytes()
        calib = _calibration(data)
        row: dict[str, Any] = {"model": path.stem, "ops_input": _ops(data)}
        floats = {}
        for target in ("xnnpack", "cpu", "edgetpu"):
            without, _ = _optimize(data, target, False)
            fused, fired = _optimize(data, target, True)
            row[target] = {
                "ops_without_exporter_rules": _ops(without),
                "ops_fused": _ops(fused),
                "exporter_rules_fired": {k: v for k, v in fired.items() if k in EXPORTER_NAMES},
                "float_agreement": verify.compare(data, fused, atol=1e-4, rtol=1e-4).to_dict(),
            }
            floats[target] = (without, fused)
        # Edge TPU: uint8 I/O, as the edgetpu recipe quantizes
        without, fused = floats["edgetpu"]
        stock_u8, fused_u8 = _quantize(data, calib, "uint8"), _quantize(fused, calib, "uint8")
        without_u8 = fused_u8 if without == fused else _quantize(without, calib, "uint8")
        row["edgetpu"]["int8_ops"] = {"stock": _ops(stock_u8), "fused": _ops(fused_u8)}
        row["edgetpu"]["mapped"] = {
            "stock": _mapped(stock_u8),
            "fused_without_exporter_rules": _mapped(without_u8),
            "fused": _mapped(fused_u8),
        }
        # CPU int8: float I/O here so errors against the float input read directly
        stock = _quantize(data, calib, "float32")
        for target, delegate in RUNTIMES.items():
            without, fused = floats[target]
            same = without == fused
            fused_q = _quantize(fused, calib, "float32")
            without_q = fused_q if same else _quantize(without, calib, "float32")
            row[target]["int8_ops"] = {
                "stock": _ops(stock),
                "without_exporter_rules": _ops(without_q),
                "fused": _ops(fused_q),
            }
            row[target]["int8_error_vs_float"] = {
                "stock": _error(data, stock),
                "fused": _error(data, fused_q),
            }
            if same:  # nothing of ours fired: the same graph, nothing to time
                row[target]["int8_timing"] = None
                continue
            names = ["stock", "without_exporter_rules", "fused"]
            paths = [work / f"{path.stem}_{target}_{k}.tflite" for k in names]
            for p, d in zip(paths, (stock, without_q, fused_q)):
                p.write_bytes(d)
            row[target]["int8_timing"] = _time(paths, names, runs, (delegate,))
        print(_model_line(row), flush=True)
        rows.append(row)
    return rows


def _model_line(row: dict[str, Any]) -> str:
    parts = [f"{row['model']}: float ops {row['ops_input']}"]
    for target, delegate in (*RUNTIMES.items(), ("edgetpu", None)):
        x = row[target]
        text = (
            f"{target} {x['ops_without_exporter_rules']} without exporter rules / "
            f"{x['ops_fused']} with; int8 ops stock {x['int8_ops']['stock']} fused "
            f"{x['int8_ops']['fused']}"
        )
        t = x.get("int8_timing", "")
        if t is None:
            text += ", exporter rules fired nothing: not timed"
        elif t:
            r = t[delegate]["ratio"]
            text += (
                f", int8 p50 / stock on {delegate}: {r['without_exporter_rules']:.3f} without,"
                f" {r['fused']:.3f} with"
            )
        if target == "edgetpu":
            st, fu = x["mapped"]["stock"], x["mapped"]["fused"]
            text += f", mapped stock {st['mapped']}/{st['ops']}, fused {fu['mapped']}/{fu['ops']}"
        parts.append(text)
    return "\n  ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300, help="timed runs per model (micro)")
    ap.add_argument("--model-runs", type=int, default=100, help="timed runs per model (models)")
    ap.add_argument("--only", choices=("micro", "models"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"environment": bench.environment()}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.only in (None, "micro"):
            out["micro"] = micro(args.runs, work)
        if args.only in (None, "models"):
            if MODELS.is_dir():
                out["models"] = models(args.model_runs, work)
            else:
                print(f"{MODELS} is absent: model part skipped", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
