"""`tflfuse sweep PLAN.toml -o DIR`: models x recipes x options converted into one table
(tflfuse.convert.sweep), locally or on Ray.
"""

from __future__ import annotations

import argparse

from tflfuse.cli.common import emit_json
from tflfuse.convert import sweep


def run(args: argparse.Namespace) -> int:
    result = sweep.sweep(
        args.plan,
        args.output,
        address=args.address,
        resume=args.resume,
        jobs=args.jobs,
        engine=args.engine,
        progress=not args.json,
    )
    if args.json:
        emit_json(result.rows, "-")
    else:
        print("\n".join(sweep.summary(result)))
    return 0
