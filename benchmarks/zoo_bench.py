#!/usr/bin/env python3
"""The model-zoo benchmark: unfused vs stock vs fused, float32 and int8, XNNPACK and plain kernels.

    .venv/bin/python benchmarks/zoo_bench.py            # all zoo models, ~15-20 min on 2 cores
    .venv/bin/python benchmarks/zoo_bench.py --models ds_cnn yolo_style --runs 30

For every architecture in `tflfuse.examples.zoo.BUILDERS` (built offline, `weights=None`, calibrated
BatchNorm): `convert_keras` with the `cpu-float` and `xnnpack-int8` recipes gives the three
models (unfused, stock, fused) in float32 and int8; `edgetpu` gives the Edge TPU pair whose
predicted mapping is compared (stock vs fused). Each (model, precision, delegate) triple is timed
interleaved with `tflfuse.device.bench.run_benchmark`. Writes `benchmarks/RESULTS.md`, two PNG
plots beside it, and the raw JSON to `benchmarks/out/zoo.json` (not committed).

Latency numbers depend on the machine; the ratios between models timed together are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tflfuse.device.bench import run_benchmark  # noqa: E402
from tflfuse.device.interpreter import interpreter_package  # noqa: E402
from tflfuse.errors import TflfuseError  # noqa: E402
from tflfuse.examples import zoo  # noqa: E402
from tflfuse.ir import flatbuffer  # noqa: E402
from tflfuse.targets import target as target_named  # noqa: E402

VARIANTS = ("unfused", "stock", "fused")
PRECISIONS = {"float32": "cpu-float", "int8": "xnnpack-int8"}
DELEGATES = ("xnnpack", "none")
# The rule pipeline a runtime's fused model is made with: XNNPACK, and the plain built-in
# kernels ("none"), whose fast and slow int8 kernels differ (delegates/cost_table.json).
TARGET_OF_DELEGATE = {"xnnpack": "xnnpack", "none": "cpu"}
CALIBRATION_SAMPLES = 32


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def convert_one(
    model: Any, recipe: str, calib: Any, out: Path, target: str | None = None
) -> dict[str, Any]:
    from tflfuse.convert.pipeline import convert_keras

    t0 = time.perf_counter()
    result = convert_keras(
        model, recipe=recipe, calibration=calib, output_dir=out, seed=0, progress=False,
        target=target, force=True,  # the previous run's models are replaced
    )  # fmt: skip
    report = result.report
    paths = {"fused": result.fused, "unfused": result.unfused, "stock": result.stock}
    return {
        "recipe": recipe,
        "target": report["recipe"].get("target"),
        "paths": {k: str(v) for k, v in paths.items()},
        "seconds": time.perf_counter() - t0,
        "timings_s": report.get("timings_s", {}),
        "facts": {
            k: {
                "op_count": report["models"][k]["op_count"],
                "activation_bytes": report["models"][k]["activation_bytes"],
            }
            for k in VARIANTS
        },
        "max_abs_error": {k: report["agreement"][k].get("max_abs") for k in VARIANTS},
        "top1_agreement": {
            k: (report["agreement"][k].get("outputs") or [{}])[0].get("top1_agreement")
            for k in VARIANTS
        },
        "reference_range": (report["agreement"]["fused"].get("outputs") or [{}])[0].get(
            "reference_range"
        ),
    }


def edgetpu_prediction(paths: dict[str, str]) -> dict[str, Any]:
    from tflfuse.targets import predict

    out = {}
    for variant in ("stock", "fused"):
        p = predict(flatbuffer.load(paths[variant]), target_named("edgetpu"))
        out[variant] = {"mapped": p.mapped, "total": len(p.ops), "cpu": p.cpu}
    return out


def time_models(paths: dict[str, str], delegate: str, runs: int, warmup: int) -> dict[str, Any]:
    ordered = [paths[v] for v in VARIANTS]
    result = run_benchmark(
        ordered, delegate=delegate, runs=runs, warmup=warmup, threads=1, names=VARIANTS,
        progress=False,
    )  # fmt: skip
    return {
        m["name"]: {
            "p50": m["latency_ms"]["p50"],
            "p90": m["latency_ms"]["p90"],
            "p99": m["latency_ms"]["p99"],
            "arena_bytes_estimate": m.get("arena_bytes_estimate"),
        }
        for m in result["models"]
    }


def bench_model(name: str, out_root: Path, args: argparse.Namespace) -> dict[str, Any]:
    log(f"{name}: build")
    (out_root / name).mkdir(parents=True, exist_ok=True)
    model = zoo.build(name)
    calib = zoo.sample_inputs(tuple(model.input_shape[1:]), n=CALIBRATION_SAMPLES, seed=7)
    row: dict[str, Any] = {"model": name, "input": list(model.input_shape), "precisions": {}}
    for precision, recipe in PRECISIONS.items():
        log(f"{name}: convert {recipe}")
        data = calib if precision == "int8" else None
        conv = convert_one(model, recipe, data, out_root / name / precision)
        conv["latency_ms"], conv["predicted"], conv["targets"] = {}, {}, {}
        for delegate in DELEGATES:
            target = TARGET_OF_DELEGATE[delegate]
            made = conv
            if target != conv["target"]:
                log(f"{name}: convert {recipe} for target {target}")
                made = convert_one(model, recipe, data, out_root / name / f"{precision}-{target}",
                                   target=target)  # fmt: skip
                kept = ("facts", "max_abs_error", "top1_agreement", "paths")
                conv["targets"][target] = {k: made[k] for k in kept}
            log(f"{name}: time {precision} on {delegate}")
            conv["latency_ms"][delegate] = time_models(made["paths"], delegate, args.runs,
                                                       args.warmup)  # fmt: skip
            conv["predicted"][delegate] = predictions(made["paths"])
        row["precisions"][precision] = conv
    if not args.no_edgetpu:
        log(f"{name}: convert edgetpu")
        try:
            conv = convert_one(model, "edgetpu", calib, out_root / name / "edgetpu")
            row["edgetpu"] = {"prediction": edgetpu_prediction(conv["paths"]),
                              "seconds": conv["seconds"]}  # fmt: skip
        except TflfuseError as exc:
            row["edgetpu"] = {"error": str(exc)}
    return row


# -- report --------------------------------------------------------------------------------------
def _kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}"


def _top1(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _err(x: float | None) -> str:
    return "-" if x is None else f"{x:.2g}"


def ratio_table(rows: list[dict[str, Any]], precision: str) -> list[str]:
    """p50 latency ratios fused/unfused and fused/stock per delegate, and op-count ratios."""
    lines = [
        "",
        f"## Ratios ({precision})",
        "",
        "p50 latency ratios (< 1: fused is faster) and op-count ratios.",
        "",
        "| model | fused/unfused XNNPACK | fused/stock XNNPACK | fused/unfused none"
        " | fused/stock none | ops fused/unfused | ops fused/stock |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["precisions"].get(precision)
        if not p:
            continue
        lat, ops = p["latency_ms"], p["facts"]
        cells = [
            _ratio(lat[d]["fused"]["p50"], lat[d][base]["p50"])
            for d in DELEGATES
            for base in ("unfused", "stock")
        ]
        cells += [
            _ratio(ops["fused"]["op_count"], ops["unfused"]["op_count"]),
            _ratio(ops["fused"]["op_count"], ops["stock"]["op_count"]),
        ]
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    return lines


def findings(rows: list[dict[str, Any]]) -> list[str]:
    """Facts computed from this run (so they stay true when the file is regenerated)."""
    faster, slower, worse_error = [], [], []
    for r in rows:
        p = r["precisions"].get("int8")
        if not p:
            continue
        ratios = {
            d: p["latency_ms"][d]["fused"]["p50"] / p["latency_ms"][d]["stock"]["p50"]
            for d in DELEGATES
        }
        text = f"{r['model']} ({', '.join(f'{d} {v:.2f}' for d, v in ratios.items())})"
        if all(v <= 0.95 for v in ratios.values()):
            faster.append(text)
        elif any(v >= 1.05 for v in ratios.values()):
            slower.append(text)
        err = p["max_abs_error"]
        if err["fused"] and err["stock"] and err["fused"] > 2 * err["stock"]:
            worse_error.append(f"{r['model']} ({err['fused']:.2g} vs {err['stock']:.2g})")
    tpu = [
        f"{r['model']} ({e['stock']['mapped']}/{e['stock']['total']} ->"
        f" {e['fused']['mapped']}/{e['fused']['total']})"
        for r in rows
        if "prediction" in r.get("edgetpu", {})
        for e in [r["edgetpu"]["prediction"]]
        if e["fused"]["mapped"] / max(e["fused"]["total"], 1)
        > e["stock"]["mapped"] / max(e["stock"]["total"], 1) + 0.05
    ]
    none = "none"
    return [
        "",
        "## Findings of this run (computed)",
        "",
        *worst_lines(rows),
        "- int8 fused at least 5% faster than stock on both runtimes:"
        f" {'; '.join(faster) or none}.",
        f"- int8 fused at least 5% slower than stock on a runtime: {'; '.join(slower) or none}.",
        "- int8 fused max error more than twice stock's (quantization route, not fusion, when"
        f" unfused shows the same error): {'; '.join(worse_error) or none}.",
        f"- Edge TPU predicted mapping clearly better fused than stock: {'; '.join(tpu) or none}.",
    ]


def worst_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The worst fused/stock p50 ratio per precision and runtime (goal: <= 1.00)."""
    lines = []
    for precision in PRECISIONS:
        for d in DELEGATES:
            ratios = [
                (
                    p["latency_ms"][d]["fused"]["p50"] / p["latency_ms"][d]["stock"]["p50"],
                    r["model"],
                )
                for r in rows
                for p in [r["precisions"].get(precision)]
                if p
            ]
            if ratios:
                value, model = max(ratios)
                lines.append(f"- worst fused/stock, {precision} on {d}: {value:.2f} ({model}).")
    return lines


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None for fewer than 3 points."""
    if len(a) < 3:
        return None
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else None


def predictions(paths: dict[str, str]) -> dict[str, dict[str, float]]:
    """What the cost model predicts per variant: before (static counts: kernels, activation
    traffic) and after (latency from the measured table, per runtime)."""
    from tflfuse.targets import cost

    out = {}
    for v in VARIANTS:
        model = flatbuffer.load(paths[v])
        static = cost.model_cost(model)
        out[v] = {
            "kernels": static["kernels"],
            "traffic": static["read_bytes"] + static["write_bytes"],
            **{f"table_{d}": cost.predict_latency_us(model, d) for d in DELEGATES},
        }
    return out


def cost_model_lines(rows: list[dict[str, Any]]) -> list[str]:
    """How well each predictor ranks the measured ratios over the zoo (Spearman's rho)."""
    lines = [
        "",
        "## Cost model vs measurement",
        "",
        "Spearman's rho between a predicted and the measured p50 ratio over every (model,"
        " precision) of this run (1: the same ranking). before = the static cost model"
        " (kernel count; activation bytes read and written), after = latency predicted from"
        " `delegates/cost_table.json` (`python benchmarks/cost_table.py`).",
        "",
        "| ratio | runtime | points | before: kernels | before: traffic | after: table |",
        "|---|---|---|---|---|---|",
    ]
    for base in ("stock", "unfused"):
        for d in DELEGATES:
            measured, pred = [], {"kernels": [], "traffic": [], f"table_{d}": []}
            for r in rows:
                for p in r["precisions"].values():
                    if d not in p.get("predicted", {}):
                        continue
                    lat = p["latency_ms"][d]
                    measured.append(lat["fused"]["p50"] / lat[base]["p50"])
                    for key in pred:
                        f, b = p["predicted"][d]["fused"][key], p["predicted"][d][base][key]
                        pred[key].append(f / b if b else 1.0)
            rho = [spearman(v, measured) for v in pred.values()]
            cells = ["-" if x is None else f"{x:.2f}" for x in rho]
            lines.append(f"| fused/{base} | {d} | {len(measured)} | " + " | ".join(cells) + " |")
    for d in DELEGATES:
        keys = ("kernels", "traffic", f"table_{d}")
        points = [
            (p["latency_ms"][d][v]["p50"], [p["predicted"][d][v][k] for k in keys])
            for r in rows
            for p in r["precisions"].values()
            if d in p.get("predicted", {})
            for v in VARIANTS
        ]
        measured = [m for m, _ in points]
        rho = [spearman([pr[i] for _, pr in points], measured) for i in range(len(keys))]
        cells = ["-" if x is None else f"{x:.2f}" for x in rho]
        lines.append(
            f"| p50 itself (every model) | {d} | {len(points)} | " + " | ".join(cells) + " |"
        )
    return lines


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Model-zoo benchmark",
        "",
        f"Regenerate: `{meta['command']}` ({meta['minutes']:.1f} min here). Machine:"
        f" {meta['machine']}, {meta['cpu_count']} cores, {meta['interpreter']}, Python"
        f" {meta['python']}. One interpreter thread; {meta['runs']} timed runs after"
        f" {meta['warmup']} warm-up, the three variants interleaved (unfused, stock, fused)."
        f" The machine was shared with other jobs (load average {meta['load']}): where stock"
        " and fused are the same graph (equal op counts), their ratio shows the run's noise.",
        "",
        "Models: `tflfuse.examples.zoo` architectures built offline with `weights=None` and"
        " calibrated BatchNorm (so outputs vary with the input). unfused = the network as written"
        " (fusion blocked), stock = the plain TFLite converter (its PTQ for int8), fused = tflfuse."
        f" int8 = recipe `xnnpack-int8` ({CALIBRATION_SAMPLES} calibration samples), float32 ="
        " recipe `cpu-float`. Error = max |output - Keras output| on the report's check inputs;"
        " top-1 = how often the arg-max class agrees with Keras (classifiers). The fused model"
        " is made for the runtime that times it: `--target xnnpack` for XNNPACK, `--target cpu`"
        " for the plain kernels (`none`); op-count ratios are the XNNPACK target's."
        " Latencies are milliseconds on this machine; compare ratios, not absolute times.",
    ]
    lines += findings(rows)
    for precision in ("int8", "float32"):
        lines += ratio_table(rows, precision)
    lines += cost_model_lines(rows)
    tpu_rows = [r for r in rows if r.get("edgetpu")]
    lines += (
        []
        if not tpu_rows
        else [
            "",
            "## Predicted Edge TPU mapping (recipe `edgetpu`, uint8 I/O)",
            "",
            'Ops the compiler would map, predicted by `tflfuse.targets.predict(model, "edgetpu")`'
            " (the compiler cannot run here).",
            "",
            "| model | stock mapped / ops | fused mapped / ops |",
            "|---|---|---|",
        ]
    )
    for r in tpu_rows:
        e = r["edgetpu"]
        if "error" in e:
            lines.append(f"| {r['model']} | not measured: {e['error']} | |")
            continue
        s, f = e["prediction"]["stock"], e["prediction"]["fused"]
        lines.append(
            f"| {r['model']} | {s['mapped']} / {s['total']} | {f['mapped']} / {f['total']} |"
        )
    lines += [
        "",
        "## All measurements",
        "",
        "| model | precision | variant | ops | activations KiB | convert s | max error | top-1"
        " | XNNPACK p50 | XNNPACK p90 | none p50 | none p90 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for precision, p in r["precisions"].items():
            lat, cpu = p["latency_ms"], p.get("targets", {}).get("cpu")
            for v in (*VARIANTS, "fused (cpu)") if cpu else VARIANTS:
                stock_s = p["timings_s"].get("stock")
                seconds = (
                    f"{p['seconds']:.1f}" if v == "fused" else f"{stock_s:.1f}" if v == "stock"
                    and stock_s is not None else "-"
                )  # fmt: skip
                facts, key = (cpu, "fused") if v == "fused (cpu)" else (p, v)
                times = [lat[d][key][q] for d in DELEGATES for q in ("p50", "p90")]
                if cpu and v == "fused":
                    times[2:] = [None, None]  # plain kernels ran the cpu-target model
                if v == "fused (cpu)":
                    times[:2] = [None, None]
                cells = ["-" if t is None else f"{t:.3f}" for t in times]
                lines.append(
                    f"| {r['model']} | {precision} | {v} | {facts['facts'][key]['op_count']} | "
                    f"{_kib(facts['facts'][key]['activation_bytes'])} | {seconds} | "
                    f"{_err(facts['max_abs_error'][key])} | {_top1(facts['top1_agreement'][key])}"
                    " | " + " | ".join(cells) + " |"
                )
    lines += [
        "",
        "convert s: for `fused`, the whole `convert_keras` call (Grappler, converter, rules,"
        " unfused baseline, quantization of all three, verification); for `stock`, the plain"
        " converter's share of it. `fused (cpu)`: the same recipe with `--target cpu`, the"
        " pipeline for the plain built-in kernels; the `none` columns time it (and that"
        " conversion's unfused and stock models, the same graphs as above).",
        "",
        "![p50 latency ratios](zoo_latency_ratios.png)",
        "",
        "![op counts](zoo_op_counts.png)",
        "",
    ]
    return "\n".join(lines)


def plots(rows: list[dict[str, Any]], folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = [r for r in rows if "int8" in r["precisions"]]
    names = [r["model"] for r in rows]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    series = [
        ("fused/unfused XNNPACK", "xnnpack", "unfused"),
        ("fused/stock XNNPACK", "xnnpack", "stock"),
        ("fused/unfused none", "none", "unfused"),
        ("fused/stock none", "none", "stock"),
    ]
    width = 0.2
    for i, (label, d, base) in enumerate(series):
        vals = [
            r["precisions"]["int8"]["latency_ms"][d]["fused"]["p50"]
            / r["precisions"]["int8"]["latency_ms"][d][base]["p50"]
            for r in rows
        ]
        ax.bar(x + (i - 1.5) * width, vals, width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=20, ha="right")
    ax.set_ylabel("p50 latency ratio (int8)")
    ax.set_title("fused vs baselines, int8, 1 thread (< 1: fused faster)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "zoo_latency_ratios.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for i, v in enumerate(VARIANTS):
        vals = [r["precisions"]["int8"]["facts"][v]["op_count"] for r in rows]
        ax.bar(x + (i - 1) * 0.27, vals, 0.27, label=v)
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=20, ha="right")
    ax.set_ylabel("ops (int8 model)")
    ax.set_title("op count per variant, int8")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "zoo_op_counts.png", dpi=110)
    plt.close(fig)


def write_results(rows: list[dict[str, Any]], meta: dict[str, Any], folder: Path) -> None:
    measured = [r for r in rows if r["precisions"]]
    text = markdown(measured, meta)
    failed = [r for r in rows if not r["precisions"]]
    if failed:
        text += "\n## Not measured\n\n" + "".join(f"- {r['model']}: {r['error']}\n" for r in failed)
    (folder / "RESULTS.md").write_text(text)
    if measured:
        plots(measured, folder)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(zoo.BUILDERS), choices=list(zoo.BUILDERS))
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--no-edgetpu", action="store_true", help="skip the Edge TPU prediction")
    p.add_argument("--out", default=str(HERE / "out"), help="models and raw JSON")
    p.add_argument("--results", default=str(HERE), help="folder for RESULTS.md and the plots")
    p.add_argument(
        "--render-only", action="store_true", help="rewrite RESULTS.md from OUT/zoo.json"
    )
    args = p.parse_args(argv)
    out_root, results = Path(args.out), Path(args.results)
    if args.render_only:
        saved = json.loads((out_root / "zoo.json").read_text())
        write_results(saved["rows"], saved["meta"], results)
        return 0
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    out_root.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": "python benchmarks/zoo_bench.py"
        + ("" if args.models == list(zoo.BUILDERS) else " --models " + " ".join(args.models)),
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "interpreter": interpreter_package(),
        "python": platform.python_version(),
        "runs": args.runs,
        "warmup": args.warmup,
    }
    rows = []
    for name in args.models:
        try:
            rows.append(bench_model(name, out_root, args))
        except TflfuseError as exc:
            log(f"{name}: not measured: {exc}")
            rows.append({"model": name, "precisions": {}, "error": str(exc)})
        meta["minutes"] = (time.perf_counter() - started) / 60
        meta["load"] = f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
        saved = {"meta": meta, "rows": rows}
        (out_root / "zoo.json").write_text(json.dumps(saved, indent=2, default=str))
    write_results(rows, meta, results)
    log(f"done in {meta['minutes']:.1f} min: {results / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
