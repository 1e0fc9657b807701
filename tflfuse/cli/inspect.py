"""`tflfuse inspect MODEL`: the op table, counts, bytes and quantization of a .tflite."""

from __future__ import annotations

import argparse

from tflfuse.cli.common import emit_json, fmt_bytes
from tflfuse.files import check_input
from tflfuse.ir import flatbuffer
from tflfuse.ir.summary import TensorBrief, model_summary


def _shape(t: TensorBrief | None) -> str:
    if t is None:
        return "-"
    mark = "c" if t.get("constant") else ""
    return f"{mark}{t['dtype'].lower()}{t['shape']}"


def run(args: argparse.Namespace) -> int:
    summary = model_summary(flatbuffer.load(check_input(args.model)))
    if args.json:
        emit_json({"model": args.model, **summary}, "-")
        return 0
    print(f"{args.model}")
    for g in summary["subgraphs"]:
        q = g["quantization"]
        print(
            f"\nsubgraph {g['index']} {g['name']!r}: {g['op_count']} ops,"
            f" {g['tensor_count']} tensors,"
            f" parameters {fmt_bytes(g['parameter_bytes'])},"
            f" activations {fmt_bytes(g['activation_bytes'])}, quantization {q['kind']}"
        )
        print(f"  {'#':>4}  {'op':<24} {'act':<6} {'inputs':<46} outputs")
        for row in g["ops"]:
            ins = ", ".join(_shape(t) for t in row["inputs"])
            outs = ", ".join(_shape(t) for t in row["outputs"])
            act = row.get("fused_activation", "")
            act = "" if act == "NONE" else act
            print(f"  {row['index']:>4}  {row['op']:<24} {act:<6} {ins:<46} {outs}")
        counts = ", ".join(f"{k} {v}" for k, v in g["op_counts"].items())
        print(f"  op counts: {counts}")
    return 0
