#!/usr/bin/env python3
"""The Edge TPU legalization gate, before -> after: what refusing a legalization behind an op that
never maps changes (ops, predicted Edge TPU mapping, p50 on XNNPACK and on the plain kernels).

    .venv/bin/python benchmarks/edgetpu_gate_bench.py            # ../shared/models/pytorch/encoder

Each model is converted twice with `--recipe edgetpu` (the same seeded noise calibration as
benchmarks/pytorch_bench.py): once as tflfuse does it (every legalization refused where the op it
rewrites reads what the CPU computes after the Edge TPU segment: `rules.edgetpu.after_the_cut`),
once with that gate switched off (the function replaced by one that never refuses: the pipeline
as it was before the gate). Stock and both fused models are timed interleaved, one thread,
`--repeats` times with the order rotated; p50 is the median of the repeats' p50, ratios the
median of the repeats' ratios. Writes benchmarks/EDGETPU_GATE.md (models are not kept in git).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from pytorch_bench import MODELS_DIR, calibration  # noqa: E402

from tflfuse.device.bench import run_benchmark  # noqa: E402
from tflfuse.device.interpreter import interpreter_package  # noqa: E402
from tflfuse.ir import flatbuffer  # noqa: E402
from tflfuse.targets import predict_edgetpu  # noqa: E402

VARIANTS = ("stock", "gate off", "gate on")
DELEGATES = ("none", "xnnpack")


def convert_both(src: Path, out: Path, samples: int) -> dict[str, Any]:
    """The conversion with the gate (tflfuse as it is) and without it; paths and facts."""
    import tflfuse.targets.edgetpu.rules as legalization
    from tflfuse.convert.pipeline import convert

    calib = calibration(src, samples, seed=7)
    gate = legalization.after_the_cut
    results = {}
    for name, off in (("gate off", True), ("gate on", False)):
        legalization.after_the_cut = (lambda m: None) if off else gate
        try:
            results[name] = convert(src, "edgetpu", calib, out / name.replace(" ", "_"),
                                    seed=0, progress=False, force=True)  # fmt: skip
        finally:
            legalization.after_the_cut = gate
    paths = {"stock": results["gate on"].stock, **{k: r.fused for k, r in results.items()}}
    facts = {}
    for k, path in paths.items():
        model = flatbuffer.load(path)
        p = predict_edgetpu(model)
        report = results["gate on" if k == "stock" else k].report
        facts[k] = {
            "ops": len(model.main.ops),
            "mapped": p.mapped,
            "max_abs": report["agreement"]["stock" if k == "stock" else "fused"].get("max_abs"),
            "rules": report["rules"].get("fired", {}),
            "refused": [
                r["reason"]
                for r in report["rules"].get("refusals", [])
                if "after the Edge TPU segment" in r.get("reason", "")
            ],
        }
    return {"paths": paths, "facts": facts}


def timed(paths: dict[str, Path], delegate: str, runs: int, repeats: int) -> dict[str, Any]:
    per: dict[str, list[float]] = {v: [] for v in VARIANTS}
    ratios: list[float] = []
    for rep in range(repeats):
        order = list(VARIANTS[rep % 3 :] + VARIANTS[: rep % 3])
        if rep % 2:
            order.reverse()
        result = run_benchmark([str(paths[v]) for v in order], delegate=delegate, runs=runs,
                               warmup=20, threads=1, names=order, progress=False)  # fmt: skip
        p50 = {m["name"]: m["latency_ms"]["p50"] for m in result["models"]}
        for v in VARIANTS:
            per[v].append(p50[v])
        ratios.append(p50["gate on"] / p50["gate off"])
    out: dict[str, Any] = {v: float(np.median(per[v])) for v in VARIANTS}
    out["on/off"] = float(np.median(ratios))
    out["ratios"] = ratios
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["encoder"])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--out", type=Path, default=HERE / "out" / "edgetpu_gate")
    args = parser.parse_args(argv)
    started, load0 = time.perf_counter(), os.getloadavg()[0]
    lines = [
        "# The Edge TPU legalization gate: before -> after",
        "",
    ]
    rows = []
    for name in args.models:
        src = MODELS_DIR / f"{name}.tflite"
        both = convert_both(src, args.out / name, args.samples)
        lat = {d: timed(both["paths"], d, args.runs, args.repeats) for d in DELEGATES}
        rows.append((name, both["facts"], lat))
    lines += [
        f"Generated by `python benchmarks/edgetpu_gate_bench.py {' '.join(argv or sys.argv[1:])}`"
        f" on {platform.machine()} ({os.cpu_count()} cores, shared: load {load0:.1f} at the"
        f" start, {os.getloadavg()[0]:.1f} at the end), {interpreter_package()};"
        f" {args.repeats} repeats (order rotated) of {args.runs} interleaved runs, one thread;"
        f" {(time.perf_counter() - started) / 60:.1f} min. `gate off`: tflfuse's pipeline with"
        " `rules.edgetpu.after_the_cut` switched off (as before the gate); `gate on`: as"
        " tflfuse converts now. Edge TPU: ops predicted mapped (compiler 16, one segment).",
        "",
        "| model | variant | ops | Edge TPU mapped | max abs error vs the source |"
        " p50 ms plain kernels | p50 ms XNNPACK |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, facts, lat in rows:
        for v in VARIANTS:
            f = facts[v]
            lines.append(
                f"| {name} | {v} | {f['ops']} | {f['mapped']}/{f['ops']} | {f['max_abs']:.3g} |"
                f" {lat['none'][v]:.3f} | {lat['xnnpack'][v]:.3f} |"
            )
    lines += ["", "p50 gate on / gate off (median of the repeats' ratios):", ""]
    for name, facts, lat in rows:
        lines.append(
            f"- {name}: plain kernels {lat['none']['on/off']:.2f}, XNNPACK"
            f" {lat['xnnpack']['on/off']:.2f}; legalizations refused by the gate:"
            f" {len(facts['gate on']['refused'])}"
            + "".join(f"\n  - {r}" for r in facts["gate on"]["refused"])
        )
    text = "\n".join(lines) + "\n"
    (HERE / "EDGETPU_GATE.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
