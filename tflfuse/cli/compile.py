"""`tflfuse compile MODEL`: edgetpu_compiler run on the model, its placement compared with the
prediction (tflfuse.targets.edgetpu.compiler).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tflfuse.cli.common import emit_json
from tflfuse.targets.edgetpu import compiler as edgetpu_compiler


def run(args: argparse.Namespace) -> int:
    result = edgetpu_compiler.compile_model(
        Path(args.model),
        Path(args.out_dir) if args.out_dir else None,
        num_segments=args.num_segments,
        search_delegate=args.search_delegate,
        multiple_subgraphs=args.multiple_subgraphs,
        mode=args.mode,
    )
    if args.json:
        emit_json(result.to_dict(), "-")
    else:
        print(edgetpu_compiler.format_comparison(result))
    return 0
