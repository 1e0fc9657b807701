"""Numbers for the fusion rules (issue 3): op counts and XNNPACK latency, tflfuse vs stock.

For each zoo model: the stock float conversion, and tflfuse's level-2 xnnpack pipeline applied to
it (verified against stock on seeded inputs). Latency: both models interleaved (stock, fused,
stock, ...) under XNNPACK, medians and fused/stock ratios (`tflfuse.bench`). MobileNetV2 is also
defused (`tflfuse.rules.defuse.Defuse`) and optimized back, to show the rules recover every
fusion the stock converter made.

    .venv/bin/python benchmarks/rules_bench.py [--runs 300] [--threads 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tflfuse.convert.optimize import optimize_bytes
from tflfuse.device import bench
from tflfuse.examples import zoo
from tflfuse.ir import flatbuffer
from tflfuse.rewrite import PassManager
from tflfuse.rules.defuse import Defuse
from tflfuse.targets import cost
from tflfuse.verification import verify

OUT = Path(__file__).resolve().parent / "out" / "rules"
MODELS = ("resnet_v2_style", "inception_style", "transformer_encoder")


def _ops(data: bytes) -> int:
    return sum(len(g.ops) for g in flatbuffer.from_bytes(data).subgraphs)


def defused_mobilenet(size: int) -> dict[str, Any]:
    stock = zoo.to_tflite(zoo.build("mobilenet_v2", input_size=size))
    model = flatbuffer.from_bytes(stock)
    PassManager([Defuse()]).run(model)
    defused = flatbuffer.to_bytes(model)
    back = optimize_bytes(defused, target="xnnpack").data
    return {
        "model": f"mobilenet_v2_{size}",
        "stock_ops": _ops(stock),
        "defused_ops": _ops(defused),
        "refused_ops": _ops(back),
        "defused_vs_stock": verify.compare(stock, defused).to_dict(),
        "refused_vs_stock": verify.compare(stock, back).to_dict(),
    }


def compare_model(name: str, runs: int, warmup: int, threads: int | None) -> dict[str, Any]:
    stock = zoo.to_tflite(zoo.build(name))
    result = optimize_bytes(stock, target="xnnpack")
    fused = result.data
    OUT.mkdir(parents=True, exist_ok=True)
    paths = [OUT / f"{name}_stock.tflite", OUT / f"{name}_fused.tflite"]
    paths[0].write_bytes(stock)
    paths[1].write_bytes(fused)
    timing = bench.run_benchmark(
        paths,
        delegate="xnnpack",
        runs=runs,
        warmup=warmup,
        threads=threads,
        names=["stock", "fused"],
        progress=True,
    )
    s, f = timing["models"]
    before = cost.model_cost(flatbuffer.from_bytes(stock))
    after = cost.model_cost(flatbuffer.from_bytes(fused))
    return {
        "model": name,
        "stock_ops": _ops(stock),
        "fused_ops": _ops(fused),
        "op_reduction": 1 - _ops(fused) / _ops(stock),
        "rules_fired": result.result.fired(),
        "verification": result.verification,
        "cost": cost.cost_delta(before, after),
        "stock_p50_ms": s["latency_ms"]["p50"],
        "fused_p50_ms": f["latency_ms"]["p50"],
        "p50_ratio": f["ratio_to_first"]["p50"],
        "p90_ratio": f["ratio_to_first"]["p90"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mobilenet-size", type=int, default=224)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--json", type=Path, default=OUT / "rules_bench.json")
    args = parser.parse_args(argv)

    report: dict[str, Any] = {"mobilenet": defused_mobilenet(args.mobilenet_size), "models": []}
    for name in args.models:
        report["models"].append(compare_model(name, args.runs, args.warmup, args.threads))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))

    mb = report["mobilenet"]
    print(
        f"{mb['model']}: stock {mb['stock_ops']} ops, defused {mb['defused_ops']}, "
        f"re-fused {mb['refused_ops']} (max abs vs stock "
        f"{mb['refused_vs_stock']['max_abs']:.2g})"
    )
    print(
        f"{'model':<22} {'stock':>6} {'fused':>6} {'fewer':>7} {'p50 stock':>10} "
        f"{'p50 fused':>10} {'ratio':>6}"
    )
    for m in report["models"]:
        print(
            f"{m['model']:<22} {m['stock_ops']:>6} {m['fused_ops']:>6} "
            f"{m['op_reduction']:>7.1%} {m['stock_p50_ms']:>10.4f} {m['fused_p50_ms']:>10.4f} "
            f"{m['p50_ratio']:>6.3f}"
        )
    print(f"written {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
