#!/usr/bin/env python3
"""What the per-rewrite int8 check (`tflfuse.verification.rewrite_check`) adds to `optimize` and
`convert`: the same work with and without it, interleaved, medians and ratios.

    python benchmarks/rewrite_check_bench.py --repeats 5 --markdown benchmarks/REWRITE_CHECK.md
    python benchmarks/rewrite_check_bench.py --convert out/edgetpu/model_unfused.tflite

`optimize`: every int8 CPU model of ../shared/oracle (Coral's zoo and public Coral projects, as
`int8_rules_bench.py` takes them; the LibrEdgeTPU templates of one layer each left out) and
each .tflite given with `--model` (e.g. setup.sh's `out/edgetpu/model_unfused.tflite`, or the
corpus' stock int8 conversions), for `--target edgetpu` and `--target xnnpack`, in process:
`optimize_bytes` with the check, then with `rewrite_check.plan` replaced by one that finds no
int8 rewrite to check (the end-to-end check alone, as before: exactly the work the check adds), the
run memo cleared before every run so no run reuses another's interpreter runs. A model where no
int8 rewrite fired has nothing to check and is timed all the same (its ratio is the cost of
asking). `convert`: `tflfuse convert MODEL --recipe edgetpu` as fresh processes (on an int8
.tflite: its int8 rules run and are checked), with and without, interleaved.

Reported: per model and target the median of each variant, their ratio and the rewrites
checked; the ratio of the summed medians (the corpus as one job); for convert the median wall
time of each and their ratio. Goal (issue 26): at most 1.20.
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
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tflfuse.convert.optimize import optimize_bytes  # noqa: E402
from tflfuse.errors import TflfuseError  # noqa: E402
from tflfuse.verification import rewrite_check, run_memo  # noqa: E402

ORACLE = ROOT.parent / "shared" / "oracle"
TARGETS = ("edgetpu", "xnnpack")
PLAN = rewrite_check.plan


def _unchecked(*args: Any, **kwargs: Any) -> None:
    return None  # "no int8 rewrite to check": the end-to-end check alone, as before


def models(extra: list[str]) -> list[tuple[str, bytes]]:
    found = []
    for folder in ("edgetpu", "edgetpu-more"):
        for path in sorted((ORACLE / folder).rglob("*.tflite")):
            if "_edgetpu" in path.name or "LibrEdgeTPU" in str(path):
                continue
            found.append((f"{folder}/{path.name}", path.read_bytes()))
    found += [(f"given/{Path(p).name}", Path(p).read_bytes()) for p in extra]
    return found


def time_optimize(data: bytes, target: str, checked: bool) -> tuple[float, int]:
    rewrite_check.plan = PLAN if checked else _unchecked
    run_memo.clear()
    start = time.perf_counter()
    result = optimize_bytes(data, target=target)
    seconds = time.perf_counter() - start
    rewrite_check.plan = PLAN
    return seconds, len(result.verification.get("rewrites", []))


def bench_optimize(found: list[tuple[str, bytes]], repeats: int) -> list[dict[str, Any]]:
    rows = []
    for label, data in found:
        for target in TARGETS:
            try:
                time_optimize(data, target, True)  # warm-up (and: does it verify here?)
            except TflfuseError as exc:
                print(f"  skip {label} {target}: {exc}", file=sys.stderr)
                continue
            on, off, checked = [], [], 0
            for _ in range(repeats):
                seconds, checked = time_optimize(data, target, True)
                on.append(seconds)
                off.append(time_optimize(data, target, False)[0])
            row = {"model": label, "target": target, "checked": checked,
                   "on": statistics.median(on), "off": statistics.median(off)}  # fmt: skip
            row["ratio"] = row["on"] / row["off"]
            print(f"  {label} {target}: {row['ratio']:.3f} ({checked} checked)", file=sys.stderr)
            rows.append(row)
    return rows


DRIVER = """
import sys
from tflfuse.convert import rewrite_check
if sys.argv[1] == "off":
    rewrite_check.plan = lambda *args, **kwargs: None
from tflfuse.cli import main
sys.exit(main(sys.argv[2:]))
"""


def bench_convert(model: str, repeats: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for variant in ("on", "off"):
                out = Path(tmp) / f"{variant}{i}"
                cmd = [sys.executable, "-c", DRIVER, variant, "convert", model, "--recipe",
                       "edgetpu", "-o", str(out)]  # fmt: skip
                start = time.perf_counter()
                subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
                times[variant].append(time.perf_counter() - start)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    return {"model": Path(model).name, "on": on, "off": off, "ratio": on / off}


def markdown(rows: list[dict[str, Any]], conv: dict[str, Any] | None, repeats: int) -> str:
    lines = [
        "# The per-rewrite int8 check: what it costs",
        "",
        "`python benchmarks/rewrite_check_bench.py` (this file is its output; medians of"
        f" {repeats} interleaved runs each, the run memo cleared before every run).",
        "",
        "| model | target | int8 rewrites checked | with (s) | without (s) | ratio |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['target']} | {r['checked']} | {r['on']:.3f} |"
                     f" {r['off']:.3f} | {r['ratio']:.3f} |")  # fmt: skip
    on, off = sum(r["on"] for r in rows), sum(r["off"] for r in rows)
    busy = [r for r in rows if r["checked"]]
    lines += ["", f"optimize, the corpus as one job: {on:.2f} s with, {off:.2f} s without:"
              f" ratio {on / off:.3f}."]  # fmt: skip
    if busy:
        worst = max(busy, key=lambda r: r["ratio"])
        lines.append(
            f"Models where int8 rewrites were checked: {len(busy)}; ratio of their summed"
            f" medians {sum(r['on'] for r in busy) / sum(r['off'] for r in busy):.3f}, worst"
            f" single model {worst['ratio']:.3f} ({worst['model']}, {worst['target']})."
        )
    if conv:
        lines += ["", f"convert {conv['model']} --recipe edgetpu (fresh processes):"
                  f" {conv['on']:.2f} s with, {conv['off']:.2f} s without: ratio"
                  f" {conv['ratio']:.3f}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", action="append", default=[], help="another int8 .tflite")
    parser.add_argument("--convert", help="an int8 .tflite to time `convert` on")
    parser.add_argument("--markdown", help="write the table here")
    args = parser.parse_args()
    rows = bench_optimize(models(args.model), args.repeats)
    conv = bench_convert(args.convert, args.repeats) if args.convert else None
    text = markdown(rows, conv, args.repeats)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
