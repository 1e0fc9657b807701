"""Wall time of `tflfuse convert` against the stock TFLite converter alone (MobileNetV2, int8).

Both run as fresh processes from the same saved .keras file and the same calibration .npy, so
interpreter start-up, TensorFlow import and model loading count for both:
  stock    load the .keras file, `TFLiteConverter.from_keras_model` with full-int8 PTQ
  tflfuse  `tflfuse convert MODEL --recipe xnnpack-int8 --calib C.npy -o OUT` (fused, unfused and
           stock models, verification, report)
  before   (with --before SRC) the same command from another tflfuse source tree, e.g. main's
           (`git archive main | tar -x -C SRC`), run with PYTHONPATH=SRC in the same environment
Runs are interleaved (stock, tflfuse[, before], stock, ...) so machine drift hits all alike; the
medians, their ratios, the median of each repeat's own ratio to the stock run just before it
(drift cancels within a pair) and the median of each conversion stage (the report's
`timings_s`) are printed. Each run's CPU time (user + system, children included) and peak RSS
are recorded too: on a shared machine the wall time moves with the load, the CPU time much
less. Goal: tflfuse adds at most 30% to stock's wall time.

`--tflite MODEL.tflite --calib C.npy` also times `tflfuse convert` on a .tflite (e.g. the corpus'
yolo11n export), interleaved with the rest: wall, CPU, peak RSS and stage split; with `--before`
the same .tflite from the other tree too ("tflite_before").

    .venv/bin/python benchmarks/convert_time.py --repeats 3 --size 96 --samples 100 \
        --markdown benchmarks/CONVERT_TIME.md
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
from typing import Any

STOCK_SCRIPT = """
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import keras
from tflfuse.examples import zoo
model = keras.saving.load_model(sys.argv[1], compile=False)
calib = np.load(sys.argv[2])
data = zoo.to_tflite(model, int8=True, calibration=calib, io_type="int8")
open(sys.argv[3], "wb").write(data)
"""


def _run(cmd: list[str], log: Path, pythonpath: str | None = None) -> dict[str, float]:
    """Wall seconds, CPU seconds (user + system of the process tree) and peak RSS (MiB) of one
    command; exits with its stderr when it fails."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    with log.open("w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{log.read_text()[-2000:]}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
    }


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _stages(reports: list[dict[str, float]]) -> dict[str, float]:
    keys = [k for k in reports[0] if all(k in r for r in reports)]
    return {k: round(statistics.median(r[k] for r in reports), 2) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", type=int, default=96, help="MobileNetV2 input size")
    ap.add_argument("--samples", type=int, default=100, help="calibration samples")
    ap.add_argument("--before", help="another tflfuse source tree to time as 'before'")
    ap.add_argument("--tflite", help="also time `tflfuse convert` on this .tflite")
    ap.add_argument("--calib", help="calibration .npy for --tflite")
    ap.add_argument("--tflite-recipe", default="xnnpack-int8")
    ap.add_argument("--json", help="also write the numbers to this file")
    ap.add_argument("--markdown", help="also write the numbers as a Markdown table to this file")
    args = ap.parse_args()
    if args.tflite and not args.calib:
        ap.error("--tflite needs --calib")

    import numpy as np

    from tflfuse.examples import zoo

    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = zoo.build("mobilenet_v2", input_size=args.size)
        model.save(work / "mnv2.keras")
        calib = zoo.sample_inputs((args.size, args.size, 3), n=args.samples, seed=5)
        np.save(work / "calib.npy", calib)
        (work / "stock.py").write_text(STOCK_SCRIPT)
        keras_in = [str(work / "mnv2.keras"), "--recipe", "xnnpack-int8"]
        keras_in += ["--calib", str(work / "calib.npy")]
        stock_args = [str(work / n) for n in ("mnv2.keras", "calib.npy", "stock.tflite")]
        runs: dict[str, Any] = {
            "stock": [python, str(work / "stock.py"), *stock_args],
            "tflfuse": [python, "-m", "tflfuse.cli", "convert", *keras_in],
        }
        if args.before:
            runs["before"] = [python, "-m", "tflfuse.cli", "convert", *keras_in]
        if args.tflite:
            runs["tflite"] = [python, "-m", "tflfuse.cli", "convert", args.tflite]
            runs["tflite"] += ["--recipe", args.tflite_recipe, "--calib", args.calib]
            if args.before:  # the same .tflite from the other tree, interleaved with the rest
                runs["tflite_before"] = list(runs["tflite"])
        rows: dict[str, list[dict[str, float]]] = {k: [] for k in runs}
        stages: dict[str, list[dict[str, float]]] = {k: [] for k in runs if k != "stock"}
        for i in range(args.repeats):
            for name, cmd in runs.items():
                out = work / f"{name}{i}"
                full = cmd if name == "stock" else [*cmd, "-o", str(out), "--json"]
                pythonpath = args.before if name in ("before", "tflite_before") else None
                rows[name].append(_run(full, work / f"{name}{i}.log", pythonpath))
                if name != "stock":
                    report = json.loads((out / "report.json").read_text())
                    stages[name].append(report["timings_s"])
            print(
                f"repeat {i + 1}: "
                + ", ".join(f"{k} {v[-1]['wall_s']:.1f} s" for k, v in rows.items()),
                file=sys.stderr,
            )
    med = {k: {m: round(_median(v, m), 2) for m in v[0]} for k, v in rows.items()}
    wall, cpu = med["tflfuse"]["wall_s"] / med["stock"]["wall_s"], med["tflfuse"]["cpu_s"]
    result: dict[str, Any] = {
        "model": f"MobileNetV2 {args.size}px, int8, {args.samples} calibration samples",
        "repeats": args.repeats,
        "median": med,
        "ratio_wall_tflfuse_over_stock": round(wall, 3),
        "ratio_cpu_tflfuse_over_stock": round(cpu / med["stock"]["cpu_s"], 3),
        "stage_s_median": {k: _stages(v) for k, v in stages.items()},
        "all": rows,
        "all_stages": stages,
        "load_average": os.getloadavg(),
    }
    paired = {  # each repeat's ratio to the stock run just before it: drift cancels within a pair
        k: round(statistics.median(r["wall_s"] / s["wall_s"] for r, s in zip(v, rows["stock"])), 3)
        for k, v in rows.items()
        if k in ("tflfuse", "before")
    }
    result["ratio_wall_paired_median"] = paired
    if "before" in med:
        result["ratio_wall_before_over_stock"] = round(
            med["before"]["wall_s"] / med["stock"]["wall_s"], 3
        )
        result["ratio_cpu_before_over_stock"] = round(
            med["before"]["cpu_s"] / med["stock"]["cpu_s"], 3
        )
    if args.tflite:
        result["tflite"] = f"{Path(args.tflite).name}, recipe {args.tflite_recipe}"
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        write_markdown(Path(args.markdown), markdown(result))
    return 0


BEGIN, END = "<!-- measured: convert_time.py writes from here -->", "<!-- measured: to here -->"


def write_markdown(path: Path, table: str) -> None:
    """The tables into `path`: between the BEGIN/END markers when the file has them (the text
    around them is kept), else as the whole file."""
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        body = table.split("\n", 2)[2]  # (without the title)
        path.write_text(f"{head}{BEGIN}\n{body}{END}{tail}")
    else:
        path.write_text(table)


def markdown(r: dict[str, Any]) -> str:
    """The numbers as CONVERT_TIME.md shows them."""
    med = r["median"]
    lines = [
        "# Conversion time: tflfuse against the stock converter",
        "",
        f"`benchmarks/convert_time.py`: {r['model']}; {r['repeats']} interleaved repeats, medians"
        f" (load average at the end {', '.join(f'{x:.1f}' for x in r['load_average'])}, 2"
        " cores shared).",
        "",
        "| run | wall s | CPU s | peak RSS MiB | wall / stock | paired wall / stock"
        " | CPU / stock |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    paired = r.get("ratio_wall_paired_median", {})
    for name, m in med.items():
        own = name in ("stock", "tflite", "tflite_before")
        ratio = "" if own else f"{m['wall_s'] / med['stock']['wall_s']:.2f}"
        cpu = "" if own else f"{m['cpu_s'] / med['stock']['cpu_s']:.2f}"
        pair = f"{paired[name]:.2f}" if name in paired else ""
        label = f"{r['tflite']} ({name})" if name.startswith("tflite") else name
        lines.append(
            f"| {label} | {m['wall_s']:.1f} | {m['cpu_s']:.1f} | {m['peak_rss_mib']:.0f} |"
            f" {ratio} | {pair} | {cpu} |"
        )
    lines += ["", "Stage split (median seconds, the report's `timings_s`):", ""]
    names = list(r["stage_s_median"])
    stages = [k for k in r["stage_s_median"][names[0]] if k != "total"] + ["total"]
    lines.append("| stage | " + " | ".join(names) + " |")
    lines.append("|---|" + "---:|" * len(names))
    for s in stages:
        cells = [f"{r['stage_s_median'][n].get(s, 0.0):.2f}" for n in names]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
