"""`tflfuse bench MODEL...`: models timed interleaved (tflfuse.device.bench); every output
checked before the benchmark, so a wrong path costs no run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

from tflfuse.cli.common import emit_json
from tflfuse.device.bench import check_arguments, format_table, plot_latencies, run_benchmark
from tflfuse.device.interpreter import check_delegate_name
from tflfuse.errors import UsageError
from tflfuse.files import check_destination, check_input, same_file


def run(args: argparse.Namespace) -> int:
    # everything that could fail after the benchmark is checked before it
    check_arguments(runs=args.runs, warmup=args.warmup, threads=args.threads, prefix="--")
    check_delegate_name(args.delegate)
    for m in args.models:  # a FIFO or a device would block or never end (missing: bench says)
        if os.path.lexists(m):
            check_input(m)
    for flag, out in (("--json", args.json), ("--plot", args.plot)):
        if out is not None and out != "-":
            if any(same_file(Path(m), Path(out)) for m in args.models):
                raise UsageError(f"{out}: output would overwrite a model")
            check_destination(Path(out), f"{flag} output")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install 'tflfuse[plot]'")
    result = run_benchmark(
        args.models,
        delegate=args.delegate,
        runs=args.runs,
        warmup=args.warmup,
        threads=args.threads,
        seed=args.seed,
        progress=not args.no_progress,
    )
    if args.plot:
        plot_latencies(result, args.plot)
    if args.json == "-":
        emit_json(result, "-")
        return 0
    if args.json:
        emit_json(result, args.json)
    print(format_table(result))
    return 0
