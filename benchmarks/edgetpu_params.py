#!/usr/bin/env python3
"""Edge TPU parameter bytes of the fused attention models: what streams over USB every inference.

The attention legalization writes constant kernels (sums of ones, 0/1 copy convs) that the Edge
TPU lays out per op; the memory predictor counts each op's parameters on its own. This converts
the corpus's attention models with one or more tflfuse trees and tabulates, side by side,
machine-independent numbers only:

- the predicted parameters of the mapped ops and the off-chip (streamed) part, from `tflfuse check
  --target edgetpu` run by THIS tree on every tree's fused model (one predictor for all);
- ops in the fused model, ops predicted mapped in one segment;
- constant bytes read per op type (each op counted on its own, shared constants again per op, as
  the Edge TPU lays them out): the DEPTHWISE_CONV_2D and CONV_2D ones, and the total;
- convert's own check of the fused model (the report's agreement: max abs error, cosine).

    nice python benchmarks/edgetpu_params.py --trees main=/work/main branch=. \\
        --keep /tmp/params-runs [--models deit_tiny_patch16_224.litert ...] \\
        [--markdown benchmarks/EDGETPU_PARAMS.md --note "..."]

Each run's numbers are kept as KEEP/MODEL-TREE.json (a run found there is not converted again),
so trees can be run at different times and tabulated together (`--table-only`).
Conversions use `--recipe edgetpu --calib MODEL.calib.npy --accept-accuracy-loss` (the corpus's
random-weight classifiers lose their top-1 to int8 whoever quantizes them: attention_corpus.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

MODELS = (
    "deit_tiny_patch16_224.litert",
    "mobilevit_xxs.litert",
    "yolo26n-320.litert",
    "yolo26n-640.litert",
    "yolo11n-320.litert",
    "efficientformer_l1.litert",
    "levit_128s.litert",
)
ROOT = Path(__file__).resolve().parent.parent
_MIB = re.compile(r"^(Estimated parameters of mapped ops|Off-chip memory used for streaming"
                  r" uncached model parameters): ([\d.]+)(MiB|KiB)", re.M)  # fmt: skip
_OPS = re.compile(r"^(Total number of operations|Number of operations that will run on Edge TPU):"
                  r" (\d+)", re.M)  # fmt: skip


def _env(tree: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def convert(tree: str, corpus: Path, stem: str, out: Path) -> dict[str, Any]:
    """Convert `stem` with `tree`'s tflfuse; the report's fields this table reads."""
    corpus, out = corpus.resolve(), out.resolve()
    cmd = [sys.executable, "-m", "tflfuse.cli", "convert", str(corpus / f"{stem}.tflite"),
           "--recipe", "edgetpu", "--calib", str(corpus / f"{stem}.calib.npy"), "-o", str(out),
           "--accept-accuracy-loss", "--force", "--json"]  # fmt: skip
    if stem == SYNTHETIC:  # its float check fails for every tree (round-off over its bound)
        cmd.append("--no-verify")
    t0, c0 = time.perf_counter(), _children_cpu()
    # the tree's own folder as the working directory: `python -m` puts it first on sys.path
    done = subprocess.run(cmd, env=_env(tree), cwd=tree, capture_output=True, text=True)
    row: dict[str, Any] = {"convert_s": round(time.perf_counter() - t0, 1)}
    row["convert_cpu_s"] = round(_children_cpu() - c0, 1)
    if done.returncode != 0:
        row["convert_error"] = done.stderr.strip().splitlines()[-1:] or ["failed"]
        return row
    report = json.loads(done.stdout or "{}")
    fused = (report.get("agreement") or {}).get("fused") or {}
    legal = report.get("legalization") or {}
    row["int8_legalization"] = {"kept": legal.get("kept"), "fired": legal.get("fired")}
    outputs = fused.get("outputs") or [{}]
    row.update(max_abs=fused.get("max_abs"), cosine=min(o.get("cosine", 1.0) for o in outputs))
    row["commit"] = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                                   capture_output=True, text=True).stdout.strip()  # fmt: skip
    return row


def constant_bytes(model: Path) -> dict[str, Any]:
    """Ops per type and constant bytes read per op type (each op on its own)."""
    from tflfuse.ir.flatbuffer import load

    graph = load(str(model)).main
    ops: dict[str, int] = {}
    consts: dict[str, int] = {}
    for op in graph.ops:
        ops[op.type] = ops.get(op.type, 0) + 1
        size = sum(np.asarray(t.data).nbytes for t in op.inputs if t is not None and t.is_constant)
        consts[op.type] = consts.get(op.type, 0) + int(size)
    return {"ops": ops, "const_bytes": consts}


def predicted(model: Path) -> dict[str, Any]:
    """`tflfuse check --target edgetpu` of THIS tree: parameters (MiB) and ops mapped."""
    cmd = [sys.executable, "-m", "tflfuse.cli", "check", str(model.resolve()), "--target"]
    cmd.append("edgetpu")
    text = subprocess.run(cmd, env=_env(str(ROOT)), cwd=ROOT, capture_output=True, text=True).stdout
    mib = {k: float(v) / (1024 if unit == "KiB" else 1) for k, v, unit in _MIB.findall(text)}
    ops = {k: int(v) for k, v in _OPS.findall(text)}
    return {
        "params_mib": mib.get("Estimated parameters of mapped ops"),
        "streamed_mib": mib.get("Off-chip memory used for streaming uncached model parameters"),
        "total_ops": ops.get("Total number of operations"),
        "mapped_ops": ops.get("Number of operations that will run on Edge TPU"),
    }


def run(tree: str, label: str, corpus: Path, stem: str, keep: Path) -> dict[str, Any]:
    """One model by one tree, kept as KEEP/STEM-LABEL.json (read back when present)."""
    saved = keep / f"{stem}-{label}.json"
    if saved.is_file():
        return json.loads(saved.read_text())
    out = keep / f"{stem}-{label}"
    row = {"model": stem, "tree": label, **convert(tree, corpus, stem, out)}
    fused = out / "model.tflite"
    if fused.is_file():
        row.update(constant_bytes(fused), **predicted(fused))
    saved.write_text(json.dumps(row, indent=1))
    return row


SYNTHETIC = "synthetic_deit_attention"


def write_synthetic(folder: Path) -> None:
    """A DeiT-tiny-shaped attention, one input x [1, 3, 197, 64] (3 heads, 197 tokens, depth
    64): SOFTMAX(TANH(x) . x^T) . LOGISTIC(x), with 16 calibration samples (seed 1) beside it,
    as FOLDER/synthetic_deit_attention.{tflite,calib.npy}: a small stand-in where a whole
    model's conversion takes too long."""
    from tflfuse.ir import Graph, Model, flatbuffer

    g = Graph("main")

    def t(name: str, shape: tuple[int, ...]):
        return g.add_tensor(name, shape, "FLOAT32")

    x = t("x", (1, 3, 197, 64))
    a, v, bt = t("a", x.shape), t("v", x.shape), t("bt", (1, 3, 64, 197))
    s, p, y = t("s", (1, 3, 197, 197)), t("p", (1, 3, 197, 197)), t("y", x.shape)
    perm = g.add_constant("perm", np.array([0, 1, 3, 2], np.int32), "INT32")
    g.add_op("TANH", [x], [a])
    g.add_op("LOGISTIC", [x], [v])
    g.add_op("TRANSPOSE", [x, perm], [bt])
    g.add_op("BATCH_MATMUL", [a, bt], [s], {"adj_x": False, "adj_y": False})
    g.add_op("SOFTMAX", [s], [p], {"beta": 1.0})
    g.add_op("BATCH_MATMUL", [p, v], [y], {"adj_x": False, "adj_y": False})
    g.inputs, g.outputs = [x], [y]
    (folder / f"{SYNTHETIC}.tflite").write_bytes(flatbuffer.to_bytes(Model([g])))
    calib = np.random.default_rng(1).uniform(-2, 2, (16, 3, 197, 64)).astype(np.float32)
    np.save(folder / f"{SYNTHETIC}.calib.npy", calib)


def _mib(v: float | None) -> str:
    return "" if v is None else f"{v:.3f}" if v < 0.1 else f"{v:.1f}"


def markdown(rows: list[dict[str, Any]], labels: list[str], note: str) -> str:
    lines = [
        "# Edge TPU parameter bytes of the fused attention models (issue 25)",
        "",
        *([note, ""] if note else []),
        "`benchmarks/edgetpu_params.py`: `tflfuse convert --recipe edgetpu --accept-accuracy-loss`"
        " per tree, then one predictor (`tflfuse check --target edgetpu` of the tree that writes"
        " this table) on every fused model. Parameters: the predictor's estimate for the mapped"
        " ops, and the part streamed from host memory on every inference. Constant bytes: each"
        " op's constant inputs, counted per op (the Edge TPU lays out each op's own). Machine-"
        "independent numbers only.",
        "",
        "| model | tree | params MiB | streamed MiB | DW const MiB | CONV const MiB |"
        " DW ops | CONV ops | MEAN ops | ops | mapped (one segment) | max abs | cosine |"
        " convert CPU s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for stem in dict.fromkeys(r["model"] for r in rows):
        for label in labels:
            r = next((r for r in rows if r["model"] == stem and r["tree"] == label), None)
            if r is None:
                continue
            if "ops" not in r:
                lines.append(f"| {stem} | {label} | failed: {r.get('convert_error')} |")
                continue
            cb, ops = r["const_bytes"], r["ops"]
            err = "" if r.get("max_abs") is None else f"{r['max_abs']:.4g}"
            cos = "" if r.get("cosine") is None else f"{r['cosine']:.4f}"
            lines.append(
                f"| {stem} | {label} {r.get('commit', '')} | {_mib(r.get('params_mib'))} |"
                f" {_mib(r.get('streamed_mib'))} |"
                f" {_mib(cb.get('DEPTHWISE_CONV_2D', 0) / 2**20)} |"
                f" {_mib(cb.get('CONV_2D', 0) / 2**20)} | {ops.get('DEPTHWISE_CONV_2D', 0)} |"
                f" {ops.get('CONV_2D', 0)} | {ops.get('MEAN', 0)} | {sum(ops.values())} |"
                f" {r.get('mapped_ops')}/{r.get('total_ops')} | {err} | {cos} |"
                f" {r.get('convert_cpu_s', '')} |"
            )
    return "\n".join(lines) + "\n"


def decisions(models: dict[str, Path]) -> str:
    """The attention rule's choice per product of each float model (`spread_decision`, as the
    rule plans it on the source graph): per head, the full form's and the spread form's ops,
    parameter MiB (the predictor's layout) and estimated ms (spread.Cost.ms)."""
    from tflfuse.ir.flatbuffer import load
    from tflfuse.targets.edgetpu import spread
    from tflfuse.targets.edgetpu.attention import spread_decision

    lines = [
        "",
        "## The choice per product (per head; `spread.choose`)",
        "",
        f"Estimated time = {spread.STREAM_MS_PER_MIB} ms per MiB of parameters (all counted as"
        f" streamed) + {spread.OP_MS} ms per op (`tflfuse/targets/edgetpu/spread.py` says where"
        " both constants come from: Coral's benchmark table; no Coral document gives a per-op"
        " figure, so the op cost is an upper bound). Products with the same shapes are one row.",
        "",
        "| model | product (a @ b) | count | full: ops, MiB, ms | spread: ops, MiB, ms | taken |",
        "|---|---|---:|---|---|---|",
    ]
    for stem, path in models.items():
        graph = load(str(path)).main
        rows: dict[str, list] = {}
        for op in graph.ops:
            found = spread_decision(graph, op)
            if found is None:
                continue
            key = f"{list(op.input(0).shape)} @ {list(op.input(1).shape)}"
            rows.setdefault(key, [found, 0])[1] += 1
        for key, ((full, after, taken), count) in rows.items():
            cell = "none shown" if after is None else _cost_cell(after)
            lines.append(f"| {stem} | {key} | x{count} | {_cost_cell(full)} | {cell} |"
                         f" {'spread' if taken else 'full'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _cost_cell(cost: Any) -> str:
    return f"{cost.ops}, {cost.bytes / 2**20:.3f}, {cost.ms:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="/work/corpus")
    ap.add_argument("--trees", nargs="+", required=True, help="LABEL=PATH of tflfuse trees")
    stems = f"corpus stems, or {SYNTHETIC} (written to --keep: `write_synthetic`)"
    ap.add_argument("--models", nargs="+", default=list(MODELS), help=stems)
    ap.add_argument("--keep", required=True, help="folder for the runs (read back when there)")
    ap.add_argument("--table-only", action="store_true", help="tabulate the kept runs only")
    ap.add_argument("--markdown", help="write the table to this file")
    ap.add_argument("--note", default="")
    ap.add_argument("--decisions", action="store_true", help="add the choice per product")
    args = ap.parse_args()
    keep = Path(args.keep)
    keep.mkdir(parents=True, exist_ok=True)
    trees = [t.split("=", 1) for t in args.trees]
    rows = []
    for stem in args.models:  # trees interleaved per model
        corpus = Path(args.corpus)
        if stem == SYNTHETIC:
            write_synthetic(keep)
            corpus = keep
        for label, path in trees:
            saved = keep / f"{stem}-{label}.json"
            if args.table_only and not saved.is_file():
                continue
            row = run(path, label, corpus, stem, keep)
            print(json.dumps({k: v for k, v in row.items() if k not in ("ops", "const_bytes")}),
                  flush=True)  # fmt: skip
            rows.append(row)
    table = markdown(rows, [label for label, _ in trees], args.note)
    if args.decisions:
        paths = {
            stem: (Path(args.keep) if stem == SYNTHETIC else Path(args.corpus)) / f"{stem}.tflite"
            for stem in args.models
        }
        table += decisions({stem: path for stem, path in paths.items() if path.is_file()})
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
