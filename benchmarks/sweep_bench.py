#!/usr/bin/env python3
"""How much `tflfuse sweep` adds to the conversions it runs; writes benchmarks/SWEEP.md.

    .venv/bin/python benchmarks/sweep_bench.py                 # 8 cells, 2 rounds
    .venv/bin/python benchmarks/sweep_bench.py --rounds 3 --no-cluster

The 8 cells: four small IR-built .tflite models (the tests' conv -> conv, widths 8..32) x the
edgetpu and xnnpack-int8 recipes, with their calibration data. Small on purpose: a conversion
is ~10 s here, mostly imports, so what the engine adds per cell shows the most. Each round, in
turn: the 8 standalone `tflfuse convert` runs one after the other (their summed wall time is the
baseline), then a local sweep of the same cells with one worker and with two, on each engine
(the local pool; Ray started in-process, when Ray is installed). Medians over the rounds of
sweep wall time / summed standalone time. Then, when Ray is installed, a sweep of the 8 cells
on a two-node Ray cluster on 127.0.0.1 (one CPU each, tests/raycluster.py): its per-cell
overhead is a cell's turnaround (handed to Ray -> its result back in the driver) minus its
conversion's own wall time, median and max over the cells. This machine is shared (2 cores):
the load average is recorded beside the numbers.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

from tests.test_sweep import tiny  # noqa: E402

RECIPES = ("edgetpu", "xnnpack-int8")
WIDTHS = (8, 16, 24, 32)


def inputs(folder: Path) -> Path:
    """The models, their calibration data and PLAN.toml in `folder`; returns the plan."""
    rng = np.random.default_rng(0)
    np.save(folder / "calib.npy", rng.uniform(-1, 1, (8, 8, 8, 3)).astype(np.float32))
    text = f"recipes = {list(RECIPES)!r}\n".replace("'", '"')
    for w in WIDTHS:
        (folder / f"w{w}.tflite").write_bytes(tiny(w))
        text += f'[[model]]\npath = "w{w}.tflite"\ncalib = "calib.npy"\n'
    plan = folder / "plan.toml"
    plan.write_text(text)
    return plan


def tflfuse(*argv: str, env: dict[str, str] | None = None) -> float:
    """Wall seconds of one `python -m tflfuse.cli ...` (fails loudly)."""
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tflfuse.cli", *argv],
        check=True,
        cwd=HERE.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    return time.perf_counter() - t0


def standalone(folder: Path) -> float:
    total = 0.0
    for w in WIDTHS:
        for recipe in RECIPES:
            out = folder / f"alone-{w}-{recipe}"
            total += tflfuse(
                "convert",
                str(folder / f"w{w}.tflite"),
                "--recipe",
                recipe,
                "--calib",
                str(folder / "calib.npy"),
                "-o",
                str(out),
                "--json",
            )
            shutil.rmtree(out)
    return total


def local_sweep(plan: Path, engine: str, jobs: int, folder: Path) -> float:
    out = folder / f"sweep-{engine}-{jobs}"
    seconds = tflfuse(
        "sweep", str(plan), "-o", str(out), "--engine", engine, "--jobs", str(jobs), "--json"
    )
    shutil.rmtree(out)
    return seconds


def cluster_overhead(plan: Path, folder: Path) -> dict[str, float]:
    import json

    from tests.raycluster import Cluster

    with Cluster(nodes=2, cpus=1) as cluster:
        out = folder / "sweep-cluster"
        env = {**os.environ, **cluster.env}
        wall = tflfuse(
            "sweep", str(plan), "-o", str(out), "--address", cluster.address, "--json", env=env
        )
        rows = json.loads((out / "sweep.json").read_text())
    over = [r["turnaround_s"] - r["seconds"] for r in rows]
    return {
        "wall": wall,
        "nodes": len({r["node"] for r in rows}),
        "converted": sum(r["status"] == "converted" for r in rows),
        "overhead_median": statistics.median(over),
        "overhead_max": max(over),
        "cells_seconds": sum(r["seconds"] for r in rows),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-cluster", action="store_true")
    ap.add_argument("--out", type=Path, default=HERE / "SWEEP.md")
    args = ap.parse_args()
    engines = ["pool"] + (["ray"] if importlib.util.find_spec("ray") else [])
    runs: dict[str, list[float]] = {}
    loads = []
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        folder = Path(tmp)
        plan = inputs(folder)
        for r in range(args.rounds):
            base = standalone(folder)
            runs.setdefault("standalone", []).append(base)
            for engine in engines:
                for jobs in (1, 2):
                    seconds = local_sweep(plan, engine, jobs, folder)
                    runs.setdefault(f"{engine} x{jobs}", []).append(seconds / base)
                    print(
                        f"round {r + 1}: {engine} x{jobs}: {seconds:.1f} s"
                        f" ({seconds / base:.2f} x {base:.1f} s)"
                    )
            loads.append(os.getloadavg()[0])
        cluster = None
        if "ray" in engines and not args.no_cluster:
            cluster = cluster_overhead(plan, folder)
            print(f"cluster: {cluster}")
    write(args.out, runs, loads, cluster)
    return 0


def write(
    path: Path, runs: dict[str, list[float]], loads: list[float], cluster: dict | None
) -> None:
    base = statistics.median(runs.pop("standalone"))
    lines = [
        "# `tflfuse sweep`: what the engine adds",
        "",
        "Written by `benchmarks/sweep_bench.py` (see its docstring). 8 cells: 4 small .tflite"
        " models x edgetpu, xnnpack-int8. Baseline: the 8 standalone `tflfuse convert` runs one"
        f" after the other, median sum {base:.1f} s. Load average while measuring:"
        f" {min(loads):.1f}–{max(loads):.1f} (2 cores, shared).",
        "",
        "| local sweep | workers | wall / summed standalone (median) | rounds |",
        "|---|---:|---:|---|",
    ]
    for name, ratios in runs.items():
        engine, jobs = name.split(" x")
        label = "local pool" if engine == "pool" else "Ray started in-process"
        rounds = ", ".join(f"{x:.2f}" for x in ratios)
        lines.append(f"| {label} | {jobs} | {statistics.median(ratios):.2f} | {rounds} |")
    lines += [
        "",
        "Ray started in the sweep's own process pays its start (15-20 s on this loaded machine)"
        " once per sweep, which small sweeps do not earn back; so on one machine the local pool"
        " is the default and `--engine ray` asks for Ray.",
    ]
    if cluster:
        lines += [
            "",
            "Two-node Ray cluster on 127.0.0.1 (one CPU each):"
            f" {cluster['converted']}/8 converted on {cluster['nodes']} nodes, sweep wall"
            f" {cluster['wall']:.1f} s for"
            f" {cluster['cells_seconds']:.1f} s of conversions; per-cell overhead (turnaround -"
            f" conversion) median {cluster['overhead_median']:.2f} s,"
            f" max {cluster['overhead_max']:.2f} s.",
        ]
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
