#!/usr/bin/env python3
"""Where an int8 model's error against its float export comes from: families of its ops run in
float ("islands"), the rest on the int8 kernels, paired per input against the all-int8 model.

    /work/main/.venv/bin/python benchmarks/float_islands.py --stem mobilevit_xxs.litert \
        --model stock=DIR/model_stock.tflite --model fused=DIR/model.tflite \
        [--family attention='Attention_attn'] [--eval 32] [--md benchmarks/FLOAT_ISLANDS.md]

An island's ops compute in float: each int8 input it reads from outside is DEQUANTIZEd, its int8
constants are dequantized (per channel where they are), and each output read outside is
QUANTIZEd back to the int8 parameters the model gave it. What the island removes is the
rounding of every tensor inside it (an island of one op whose output is read outside removes
nothing: an int8 kernel rounds once, at its output, as the QUANTIZE does). Families:

  lnvar        LayerNorm's variance: from a SQUARED_DIFFERENCE (or the MUL of a tensor by
               itself) along its one-reader chain to the RSQRT (the squares, their row mean,
               the epsilon ADD, and the reshapes between)
  swish        LOGISTIC and the MULs reading it (SiLU; GELU's sloped/cubic forms' last ops)
  all          every op (what is left: the input's and the output's rounding, the weights')
  NAME=REGEX   (--family) the ops whose output tensor name matches REGEX, the moves among them
               included (a diagnostic: names are the exporter's)

Measured on `--eval` image-like inputs calibration never saw (seed 99, the first 8
YOLO_EDGETPU.md's): per input the rms error of the first output over the float output's rms;
for each family the mean over inputs with its standard error, and the mean reduction paired
against the model all in int8 (positive: that family's roundings add that much). Accuracy only:
no timing claim.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import yolo_edgetpu  # noqa: E402  (eval inputs, running a model)

from tflfuse.ir import Model, Op, Tensor, flatbuffer  # noqa: E402

CORPUS = Path(os.environ.get("TFLFUSE_CORPUS") or "/work/corpus")
INTS = ("INT8", "UINT8")
Chooser = Callable[[Op], bool]


def _dequantized(t: Tensor) -> Tensor:
    """A float constant holding `t`'s int8/int32 values dequantized (per channel along its
    quantized axis)."""
    q = t.quantization
    assert q is not None and q.scale is not None
    data = np.asarray(t.data).astype(np.float64)
    scale = np.asarray(q.scale, np.float64)
    zero = np.asarray(q.zero_point if q.zero_point is not None else 0, np.float64)
    if scale.size > 1:
        shape = [1] * data.ndim
        shape[q.axis] = -1
        scale = scale.reshape(shape)
        zero = zero.reshape(shape) if zero.size > 1 else zero.reshape(-1)[0]
    return Tensor(t.name + "/float", t.shape, "FLOAT32", ((data - zero) * scale).astype(np.float32))


def _floatable(op: Op) -> bool:
    ins_ok = all(t is None or t.dtype in (*INTS, "INT32", "FLOAT32") for t in op.inputs)
    return (
        op.type not in ("QUANTIZE", "DEQUANTIZE")
        and ins_ok
        and all(o.dtype in INTS for o in op.outputs)
    )


def with_island(model: Model, chosen: Chooser) -> Model:
    """`model` (rewritten in place) with the ops `chosen` picks computing in float."""
    g = model.main
    out: list[Op] = []
    twin: dict[int, Tensor] = {}  # an int8 tensor -> its float value inside the island

    def new(name: str, like: Tensor, data: np.ndarray | None = None) -> Tensor:
        t = Tensor(f"island{len(g.tensors)}/{name}", like.shape, "FLOAT32", data)
        g.tensors.append(t)
        return t

    def read(t: Tensor | None) -> Tensor | None:
        if t is None or t.dtype not in (*INTS, "INT32"):
            return t
        if t.is_constant:
            q = t.quantization
            if q is None or q.scale is None:
                return t
            c = _dequantized(t)
            g.tensors.append(c)
            return c
        if id(t) not in twin:
            twin[id(t)] = new("dequantized", t)
            out.append(Op("DEQUANTIZE", [t], [twin[id(t)]]))
        return twin[id(t)]

    for op in list(g.ops):
        if not (chosen(op) and _floatable(op)):
            out.append(op)
            continue
        ins = [read(t) for t in op.inputs]
        pairs = [(o, new("out", o)) for o in op.outputs]
        op.disconnect()
        out.append(Op(op.type, ins, [f for _, f in pairs], dict(op.options)))
        for o, f in pairs:
            twin[id(o)] = f
            out.append(Op("QUANTIZE", [f], [o]))  # kept where read outside (pruned below)
    g.ops = [
        op
        for op in out
        if not (
            op.type == "QUANTIZE"
            and op.inputs[0] is not None
            and op.inputs[0].name.startswith("island")
            and not op.outputs[0].consumers
            and op.outputs[0] not in g.outputs
        )
    ]
    kept = {id(t) for op in g.ops for t in (*op.inputs, *op.outputs) if t is not None}
    g.tensors = [t for t in g.tensors if id(t) in kept or t in g.inputs or t in g.outputs]
    return model


def lnvar_chain(model: Model) -> set[str]:
    """Output names of LayerNorm's variance ops: from a square along one-reader ops to RSQRT."""
    names: set[str] = set()
    for op in model.main.ops:
        square = op.type == "SQUARED_DIFFERENCE" or (
            op.type == "MUL" and len(op.inputs) == 2 and op.inputs[0] is op.inputs[1]
        )
        if not square:
            continue
        t = op.outputs[0]
        chain = [t.name]
        while len(t.consumers) == 1 and t.consumers[0].type != "RSQRT":
            t = t.consumers[0].outputs[0]
            chain.append(t.name)
        if len(t.consumers) == 1:  # it reached an RSQRT
            names.update([*chain, t.consumers[0].outputs[0].name])
    return names


def families(model: Model, regexes: dict[str, str]) -> dict[str, set[int]]:
    """The module docstring's families of `model`: each the ids of its ops (taken before any
    island rewrites the graph)."""
    ops = model.main.ops
    lnvar = lnvar_chain(model)
    logistic = {id(op) for op in ops if op.type == "LOGISTIC"}
    out = {
        "lnvar": {id(op) for op in ops if op.outputs[0].name in lnvar},
        "swish": logistic
        | {
            id(op)
            for op in ops
            if op.type == "MUL"
            and any(t is not None and id(t.producer) in logistic for t in op.inputs)
        },
    }
    for name, pattern in regexes.items():
        rx = re.compile(pattern)
        out[name] = {id(op) for op in ops if rx.search(op.outputs[0].name)}
    out["all"] = {id(op) for op in ops}
    return out


def errors(path: Path, data: bytes | None, ref: list, xs: np.ndarray) -> list[float]:
    """Per input: rms error of the first output over the float output's rms."""
    if data is not None:
        path.write_bytes(data)
    got = yolo_edgetpu.run_model(path, xs)
    rel = [
        float(np.sqrt(((g[0] - r[0]) ** 2).mean() / max((r[0] ** 2).mean(), 1e-24)))
        for r, g in zip(ref, got)
    ]
    if data is not None:
        path.unlink()
    return rel


def measure(label: str, path: Path, regexes: dict[str, str], ref, xs, scratch: Path) -> dict:
    """{family: per-input errors} for one int8 model ("none": all int8)."""
    rows = {"none": errors(path, None, ref, xs)}
    names = [*families(flatbuffer.load(path), regexes)]
    for name in names:
        model = flatbuffer.load(path)
        chosen = families(model, regexes)[name]
        island = with_island(model, lambda op, ids=chosen: id(op) in ids)
        rows[name] = errors(
            scratch / f"{label}.{name}.tflite", flatbuffer.to_bytes(island), ref, xs
        )
        print(f"[{time.strftime('%H:%M:%S')}] {label} {name}", file=sys.stderr, flush=True)
    return rows


def lines(stem: str, measured: dict[str, dict[str, list[float]]]) -> list[str]:
    out = [
        f"### {stem}",
        "",
        "| int8 model | ops in float | rms error (mean +- s.e.) | removed, paired (mean +- s.e.) |",
        "|---|---|---|---|",
    ]
    for label, rows in measured.items():
        base = np.array(rows["none"])
        for name, vals in rows.items():
            e = np.array(vals)
            d = base - e
            se = lambda v: float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0  # noqa: E731
            removed = "" if name == "none" else f"{d.mean():+.4f} +- {se(d):.4f}"
            shown = "none (all int8)" if name == "none" else name
            out.append(f"| {label} | {shown} | {e.mean():.4f} +- {se(e):.4f} | {removed} |")
    return [*out, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stem", required=True, help="the float export's stem in the corpus")
    parser.add_argument("--model", action="append", required=True, help="LABEL=PATH (int8)")
    parser.add_argument("--family", action="append", default=[], help="NAME=REGEX")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--eval", type=int, default=32)
    parser.add_argument("--scratch", type=Path, default=HERE / "out" / "float_islands")
    parser.add_argument("--json", type=Path, help="write the per-input errors here")
    parser.add_argument("--md", type=Path, help="write the table here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    args.scratch.mkdir(parents=True, exist_ok=True)
    side = args.corpus / f"{args.stem}.json"
    xs = yolo_edgetpu.eval_inputs(json.loads(side.read_text()), args.eval)
    ref = yolo_edgetpu.run_model(side.with_suffix(".tflite"), xs)
    regexes = dict(f.split("=", 1) for f in args.family)
    measured = {}
    for item in args.model:
        label, path = item.split("=", 1)
        measured[label] = measure(label, Path(path), regexes, ref, xs, args.scratch)
    if args.json:
        args.json.write_text(json.dumps(measured, indent=1) + "\n")
    table = lines(args.stem, measured)
    print("\n".join(table))
    if args.md:
        command = "python benchmarks/float_islands.py " + " ".join(argv or sys.argv[1:])
        head = [
            "# Which roundings an int8 model's error comes from (float islands)",
            "",
            f"Generated by `{command}` in {(time.perf_counter() - started) / 60:.1f} min on"
            f" {args.corpus} (random weights, `benchmarks/attention_corpus.py`), {args.eval}"
            " image-like inputs calibration never saw (seed 99). Columns and families: this"
            " script's docstring.",
            "",
        ]
        args.md.write_text("\n".join(head + table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
