"""`tflfuse compare FOLDER`: a conversion's unfused, stock and fused models side by side
(tflfuse.convert.compare); every output checked before the benchmark.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from tflfuse.cli.common import emit_json
from tflfuse.convert.compare import compare, format_table, read_conversion
from tflfuse.device.bench import check_arguments, plot_latencies
from tflfuse.device.interpreter import check_delegate_name
from tflfuse.errors import UsageError
from tflfuse.files import check_destination, same_file


def run(args: argparse.Namespace) -> int:
    # everything that could fail after the benchmark is checked before it
    check_arguments(runs=args.runs, warmup=args.warmup, threads=args.threads, prefix="--")
    check_delegate_name(args.delegate)
    _, paths = read_conversion(args.folder)
    for flag, out in (("--json", args.json), ("--plot", args.plot)):
        if out and out != "-":
            if any(same_file(p, Path(out)) for p in paths.values()):
                raise UsageError(f"{out}: output would overwrite a model")
            check_destination(Path(out), f"{flag} output")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install 'tflfuse[plot]'")
    result = compare(
        args.folder,
        delegate=args.delegate,
        runs=args.runs,
        warmup=args.warmup,
        threads=args.threads,
        progress=not args.no_progress,
    )
    if args.plot:
        plot_latencies(result["benchmark"], args.plot)
    if args.json == "-":
        emit_json(result, "-")
        return 0
    if args.json:
        emit_json(result, args.json)
    print(format_table(result))
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
