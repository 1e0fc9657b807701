"""`tflfuse convert MODEL -o OUTDIR`: the recipe with its override flags, then the conversion
through tflfuse.api, then a summary of its report.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tflfuse import api
from tflfuse.cli.common import emit_json, fmt_bytes
from tflfuse.convert import recipe as recipe_mod
from tflfuse.convert.report import stock_on_runtime
from tflfuse.errors import UsageError
from tflfuse.files import check_input
from tflfuse.quantize.calibration import split_pick

# recipe field -> the flag that overrides it (recipe errors name the flag, not the file)
_RECIPE_FLAGS = {
    "quant_mode": "--quant",
    "input_type": "--input-type",
    "output_type": "--output-type",
    "target": "--target",
    "level": "--level",
    "samples": "--samples",
    "scale": "--scale",
    "offset": "--offset",
    "runtime": "--runtime",
}


def _recipe_from_args(args: argparse.Namespace) -> Any:
    """The recipe named by --recipe with the override flags applied (errors name the flag)."""
    overrides = {f: getattr(args, flag[2:].replace("-", "_")) for f, flag in _RECIPE_FLAGS.items()}
    return recipe_mod.load(args.recipe).override(labels=_RECIPE_FLAGS, **overrides)


def run(args: argparse.Namespace) -> int:
    if args.batch < 1:
        raise UsageError(f"--batch must be at least 1, not {args.batch}")
    if args.output == "":
        raise UsageError("-o: the output folder name is empty")
    recipe = _recipe_from_args(args)
    model = check_input(args.model, folder_ok=True)
    if args.calib is not None:
        check_input(split_pick(args.calib)[0], "calibration", folder_ok=True)
    result = api.convert(
        str(model),
        Path(args.output),
        recipe=recipe,
        calibration=args.calib,
        force=args.force,
        seed=args.seed,
        batch=args.batch,
        allow_lambda=args.allow_lambda,
        channels_last=args.channels_last,
        progress=not args.json,
        notes=True,  # the pipeline's notes go to stderr even under --json
        verify=not args.no_verify,
        disabled=tuple(args.disable),
        accept_accuracy_loss=args.accept_accuracy_loss,
    )
    r = result.report
    if args.json:  # (files of OUTDIR tflfuse did not write, and kept, under "kept")
        emit_json({**r, "kept": result.kept} if result.kept else r, "-")
        return 0
    print(f"{result.output_dir}: recipe {r['recipe']['name']}, {r['quantization']['fused_route']}")
    for name, m in r["models"].items():
        a = r["agreement"][name]
        err = f"max abs error {a['max_abs']:.3g}" if a.get("verified") else "not verified"
        print(
            f"  {r['files'][name]:<22} {m['op_count']:>4} ops, activations"
            f" {fmt_bytes(m['activation_bytes'])}, {m['quantization']}, {err}"
        )
    d = r["delegate_check"]
    if d.get("checked"):
        print(f"  {d['delegate']}: {d['mapped']} ops mapped, {d['cpu']} on the CPU")
    if r.get("runtime"):
        made_for = r["runtime"]["made_for"]
        print(f"  made for {made_for}: every op version the fused and unfused models need is there")
        print(f"  {stock_on_runtime(r)}")
    cut = r.get("edgetpu", {}).get("fused", {}).get("cut")
    if cut:
        print(f"  Edge TPU cut at op {cut['index']} {cut['op']}: {cut['reason']}")
    print(f"  report: {result.output_dir / 'report.md'}")
    if result.kept:
        print(f"  kept {len(result.kept)} files tflfuse did not write: {', '.join(result.kept)}")
    return 0
