"""Issue 25's conversion budget: `tflfuse convert --recipe edgetpu` of a 640-px YOLO26n stays
under 90 s wall and 2 GiB peak RSS on this machine, on both routes a Coral user takes:

  litert           Ultralytics 8.4 `format="tflite"` (litert-torch), NCHW float32 input (and
                   with --channels-last, the NHWC interface that lifts the input's row limit)
  edgetpu-float32  Ultralytics `format="edgetpu"`'s onnx2tf float32 file, NHWC input

Each run is a fresh process (`python -m tflfuse.cli convert MODEL --recipe edgetpu --calib
MODEL.calib.npy -o OUT --json`, the corpus' image-like calibration), so import, load and every
stage count. Runs are interleaved across the models (and `--before SRC`, another tflfuse source
tree run with PYTHONPATH=SRC, e.g. main's `git archive main | tar -x -C SRC`) so machine drift
hits all alike; medians are printed. Wall time moves with the load of a shared machine (the
load average is recorded), the CPU time (user + system, children included: the conversion runs
in a forked child) much less; peak RSS is the largest of the process tree.

    .venv/bin/python benchmarks/convert_budget.py --corpus /work/corpus --repeats 3 \
        --markdown benchmarks/CONVERT_BUDGET.md

Run it from outside the source tree with PYTHONPATH set to the tree measured (the current
directory comes first on `sys.path`, and the shared venv has main installed editable), e.g.
`cd /tmp/x && PYTHONPATH=/work/h-budget python /work/h-budget/benchmarks/convert_budget.py
--before /tmp/main-src --models yolo26n-640.litert yolo26n-640.edgetpu-float32`. Each row also
carries the fused model's Edge TPU mapped count and its largest error against the source
(report `agreement.fused.max_abs`): a change that saves time or memory must keep both.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# (corpus file stem, extra convert flags): both routes, and litert's with the NHWC interface
MODELS = (
    ("yolo26n-640.litert", ()),
    ("yolo26n-640.litert", ("--channels-last",)),
    ("yolo26n-640.edgetpu-float32", ()),
)
LIMIT_S = 90.0
LIMIT_MIB = 2048.0


def _run(cmd: list[str], pythonpath: str | None) -> dict[str, Any]:
    """Wall and CPU seconds and peak RSS (MiB) of one convert, and its report's stage times."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        if status != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{err.read().decode()[-2000:]}")
        report = json.loads(out.read().decode() or "{}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "stages": report.get("timings_s", {}),
        "mapped": (report.get("edgetpu") or {}).get("fused", {}).get("mapped"),
        "max_abs": ((report.get("agreement") or {}).get("fused") or {}).get("max_abs"),
        "fused_mib": ((report.get("models") or {}).get("fused") or {}).get("file_bytes", 0) / 2**20,
    }


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="/work/corpus", help="folder of X.tflite + X.calib.npy")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", help="another tflfuse source tree, run interleaved")
    ap.add_argument("--markdown", help="write the table to this file")
    ap.add_argument("--note", default="", help="a paragraph under the title: what the trees are")
    ap.add_argument("--keep", help="keep each run's output folder here (STEM-TREE-REPEAT), e.g."
                    " to compare the trees' models and reports")  # fmt: skip
    ap.add_argument("--from-log", nargs="+",
                    help="no runs: the table of runs' printed lines, from one or more logs"
                    " (no stage split)")  # fmt: skip
    ap.add_argument("--models", nargs="+",
                    help="the MODELS rows to run, each as its stem and flags ('X.litert',"
                    " 'X.litert --channels-last'; default all)")  # fmt: skip
    args = ap.parse_args()
    if args.from_log:
        runs, repeats = from_log("\n".join(Path(f).read_text() for f in args.from_log))
        table = markdown(runs, repeats, float("nan"), args.note)
        print(table)
        if args.markdown:
            Path(args.markdown).write_text(table)
        return 0
    corpus = Path(args.corpus)
    models = [(s, f) for s, f in MODELS if not args.models or " ".join([s, *f]) in args.models]
    missing = sorted({s for s, _ in models if not (corpus / f"{s}.tflite").is_file()})
    if missing or not models:
        sys.exit(f"not in {corpus}: {', '.join(missing) or 'no model chosen'}")
    trees = [("tflfuse", None)] + ([("before", args.before)] if args.before else [])
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
        where = Path(args.keep or tmp)
        for rep in range(args.repeats):
            for stem, flags in models:
                model = " ".join([stem, *flags])
                for tree, path in trees:
                    out = where / f"{stem}{len(flags)}-{tree}-{rep}"
                    cmd = [sys.executable, "-m", "tflfuse.cli", "convert",
                           str(corpus / f"{stem}.tflite"), "--recipe", "edgetpu",
                           "--calib", str(corpus / f"{stem}.calib.npy"), "-o", str(out),
                           "--json", *flags]  # fmt: skip
                    row = _run(cmd, path)
                    runs.setdefault((model, tree), []).append(row)
                    loads.append(os.getloadavg()[0])
                    print(f"{model} {tree} #{rep}: {row['wall_s']:.1f} s wall,"
                          f" {row['cpu_s']:.1f} s CPU, {row['peak_rss_mib']:.0f} MiB,"
                          f" mapped {row['mapped']}, max error {row['max_abs']}",
                          flush=True)  # fmt: skip
    table = markdown(runs, args.repeats, statistics.median(loads), args.note)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)
    return 0


def markdown(
    runs: dict[tuple[str, str], list[dict[str, Any]]], repeats: int, load: float, note: str = ""
) -> str:
    lines = [
        "# Converting a 640-px YOLO26n for the Edge TPU: time and memory (issue 25's budget)",
        "",
        *([note, ""] if note else []),
        f"`benchmarks/convert_budget.py`: `tflfuse convert --recipe edgetpu` in a fresh process,"
        f" {repeats} interleaved repeats, medians; {_load(load)} on 2 shared cores."
        f" Budget: {LIMIT_S:.0f} s wall, {LIMIT_MIB / 1024:.0f} GiB peak RSS.",
        "",
        "| model | tree | wall s | CPU s | peak RSS MiB | within budget | mapped (one segment)"
        " | fused max error | fused file MiB |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for (model, tree), rows in runs.items():
        wall, cpu, rss = (_median(rows, k) for k in ("wall_s", "cpu_s", "peak_rss_mib"))
        ok = "yes" if wall < LIMIT_S and rss < LIMIT_MIB else "no"
        error = rows[-1].get("max_abs")
        shown = "" if error is None else f"{error:.4g}"
        size = rows[-1].get("fused_mib")
        size_shown = "" if size is None else f"{size:.1f}"
        lines.append(f"| {model} | {tree} | {wall:.1f} | {cpu:.1f} | {rss:.0f} | {ok} |"
                     f" {rows[-1]['mapped']} | {shown} | {size_shown} |")  # fmt: skip
    lines += _ratios(runs)
    stages = sorted({s for rows in runs.values() for r in rows for s in r["stages"]})
    keys = list(runs)
    lines += ["", "Stage split (median seconds, the report's `timings_s`):", "",
              "| stage | " + " | ".join(f"{m} ({t})" for m, t in keys) + " |",
              "|---|" + "---:|" * len(keys)]  # fmt: skip
    for s in stages:
        cells = [statistics.median(r["stages"].get(s, 0.0) for r in runs[k]) for k in keys]
        lines.append(f"| {s} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


_LINE = re.compile(
    r"^(?P<model>.+) (?P<tree>\S+) #(?P<rep>\d+): (?P<wall>[\d.]+) s wall, (?P<cpu>[\d.]+) s CPU,"
    r" (?P<rss>\d+) MiB, mapped (?P<mapped>\S+), max error (?P<err>\S+)$"
)


def from_log(text: str) -> tuple[dict[tuple[str, str], list[dict[str, Any]]], int]:
    """The runs a benchmark printed (one line each, as `main` prints them) and the most runs of
    one model and tree: for runs cut short, whose table was never written."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    repeats = 0
    for line in text.splitlines():
        found = _LINE.match(line.strip())
        if found is None:
            continue
        g = found.groupdict()
        row = {"wall_s": float(g["wall"]), "cpu_s": float(g["cpu"]),
               "peak_rss_mib": float(g["rss"]), "mapped": g["mapped"],
               "max_abs": None if g["err"] == "None" else float(g["err"]),
               "fused_mib": None, "stages": {}}  # fmt: skip
        runs.setdefault((g["model"], g["tree"]), []).append(row)
    repeats = max((len(rows) for rows in runs.values()), default=0)
    return runs, repeats


def _load(load: float) -> str:
    return "load average not recorded" if load != load else f"median load average {load:.1f}"


def _ratios(runs: dict[tuple[str, str], list[dict[str, Any]]]) -> list[str]:
    """Per model run on both trees: tflfuse / before of the median wall, CPU and peak RSS."""
    pairs = [m for m, t in runs if t == "tflfuse" and (m, "before") in runs]
    if not pairs:
        return []
    lines = ["", "Ratios, this tree / before (medians):", "",
             "| model | wall | CPU | peak RSS |", "|---|---:|---:|---:|"]  # fmt: skip
    for model in pairs:
        new, old = runs[(model, "tflfuse")], runs[(model, "before")]
        cells = [_median(new, k) / _median(old, k) for k in ("wall_s", "cpu_s", "peak_rss_mib")]
        lines.append(f"| {model} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
