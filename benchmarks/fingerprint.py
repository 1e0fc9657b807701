#!/usr/bin/env python3
"""Fingerprint what tflfuse writes, to prove a refactoring changed nothing.

    .venv/bin/python benchmarks/fingerprint.py -o before.json           # on the old tree
    .venv/bin/python benchmarks/fingerprint.py -o after.json            # on the new tree
    .venv/bin/python benchmarks/fingerprint.py --compare before.json after.json

The quick check (about 5 minutes on 2 cores; run it twice on one tree and the two compare equal):

    .venv/bin/python benchmarks/fingerprint.py --sets runtime sweep -o before.json

It drives the command line only (so it survives any internal reshuffle) of the tree it sits in
(that tree's tflfuse comes first on the children's path) over five sets:
  zoo      every `tflfuse example` architecture, converted with every shipped recipe
  tflite   every float .tflite it is given (the PyTorch exports in ../shared/models/pytorch and,
           with --corpus DIR, other people's models), converted with the int8 recipes and
           optimized for every target
  oracle   the source models of ../shared/oracle: optimized for every target and checked for the
           Edge TPU
  runtime  `convert --runtime` and `optimize --runtime` for the interpreter releases the runtime
           rules lower for (GELU spelled out, TRANSPOSE_CONV's fused activation split off; one
           int8 GELU refused) and one that needs nothing lowered: a transformer encoder (GELU) and
           a small Keras decoder (TRANSPOSE_CONV + RELU), from .keras and from the float .tflite
           the plain route wrote for them
  sweep    a `tflfuse sweep` of 3 cells (ds_cnn x edgetpu, xnnpack-int8, gpu-fp16) on the local
           pool, then resumed: every cell's models and report, and each row's stable fields
and records, per run: the exit code and the first line of stderr, the sha256 of every .tflite
written, the op list of each, and the JSON of `check`/the report/the sweep's rows with what
changes from run to run (timings, paths, peak memory, host, cell keys that hash the code) removed.
`--compare` prints every difference and exits 1 if there is one. Two runs of the same tree must
compare equal (conversion is seeded); a refactoring that keeps behaviour must too. The full run
(the default: every set) takes well over an hour on 2 cores.

Each model also gets a `canonical` digest: the sha256 of what the model computes, written out
without the places a tensor or buffer happens to hold in the file (read with the fingerprinted
tree's own IR). Every subgraph's ops in order, each with its type, version, options and custom
data, its inputs named by the op and output index that writes them (`op3:0`), the subgraph
input (`in0`) or, for a constant or variable, its content (dtype, shape, quantization and a hash
of its data); every tensor's dtype, shape (and signature) and quantization; the names of the
subgraph's inputs and outputs (the model's interface; an inner tensor's name is a label, and
its de-duplicating suffix follows the order tensors were made in), the tensor count,
signatures and metadata. A change that only puts tensors in another order changes the sha256
(and the report's file size, by alignment padding) and not the canonical digest:

    .venv/bin/python benchmarks/fingerprint.py --compare before.json after.json --canonical

accepts a model whose sha256 (and `inspect`'s op list, which names the tensors) differs when its
canonical digest is the same, and a report's `file_bytes` that differs for such a model; it
counts both, and everything else must still be equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared"
RECIPES = ("edgetpu", "xnnpack-int8", "cpu-float", "gpu-fp16")
INT8_RECIPES = ("edgetpu", "xnnpack-int8")
TARGETS = ("edgetpu", "xnnpack", "gpu", "cpu")
ZOO_SIZES = {"mobilenet_v2": 64, "mobilenet_v3_small": 64, "efficientnet_b0": 64}
VOLATILE = {"timings_s", "elapsed_s", "output_dir", "model", "path", "created", "tflfuse_version"}
CELL_TMP = re.compile(r"\S*tflfuse-cell-\d+-[^/\s]+")  # sweep_cell's mkdtemp folder
SETS = ("zoo", "tflite", "oracle", "runtime", "sweep")
# The releases the runtime rules lower for: 2.5.0 lacks GELU (TFLite 2.8) and TRANSPOSE_CONV v4
# (2.12), 2.11.0 only the latter; tensorflow 2.5.0 and ai-edge-litert 1.4.0 are the other
# packages' oldest; ai-edge-litert 2.3.0 needs nothing lowered.
RUNTIMES = (
    "tflite-runtime==2.5.0",
    "tflite-runtime==2.11.0",
    "tensorflow==2.5.0",
    "ai-edge-litert==1.4.0",
    "ai-edge-litert==2.3.0",
)
# (model, recipe, runtime) for `convert --runtime`
RUNTIME_CONVERTS = (
    ("transformer_encoder", "cpu-float", "tflite-runtime==2.5.0"),
    ("transformer_encoder", "xnnpack-int8", "tflite-runtime==2.5.0"),  # refused: an int8 GELU
    ("decoder", "cpu-float", "tflite-runtime==2.5.0"),
    ("decoder", "xnnpack-int8", "tflite-runtime==2.11.0"),
    ("decoder", "edgetpu", "tflite-runtime==2.5.0"),
)
SWEEP_PLAN = """recipes = ["edgetpu", "xnnpack-int8", "gpu-fp16"]
[[model]]
example = "ds_cnn"
"""
# a sweep row's fields that change from run to run (the key hashes tflfuse's own files)
SWEEP_VOLATILE = {"seconds", "peak_rss_mib", "node", "turnaround_s", "cpu_s", "key"}
# A Keras decoder with a TRANSPOSE_CONV whose RELU the converter fuses (v4, TFLite 2.12), seeded.
DECODER = """
import sys, numpy as np, keras
keras.utils.set_random_seed(0)
x = keras.Input((8, 8, 3))
h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
h = keras.layers.Conv2DTranspose(8, 3, strides=2, padding="same", activation="relu")(h)
y = keras.layers.Conv2D(4, 1)(h)
keras.Model(x, y).save(sys.argv[1])
np.save(sys.argv[2], np.random.default_rng(0).uniform(-1, 1, (16, 8, 8, 3)).astype(np.float32))
"""


def child_env() -> dict[str, str]:
    """This tree's tflfuse first on the children's path, whatever the current directory."""
    path = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "3"}


def tflfuse(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tflfuse.cli", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, cwd=cwd, timeout=1800, env=child_env()
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def op_list(path: Path) -> list[str]:
    proc = tflfuse("inspect", str(path), "--json")
    if proc.returncode != 0:
        return [f"inspect failed: {first_line(proc.stderr)}"]
    info = json.loads(proc.stdout)
    return [
        f"{sub['index']}:{op}"
        for sub in info["subgraphs"]
        for op in sub.get("ops", sub.get("op_list", [])) or sorted(sub["op_counts"].items())
    ]


def first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def unpath(text: str, root: str = "") -> str:
    """`text` with the paths that differ between runs and trees named instead: the run's
    folder, a sweep cell's temporary folder, the fingerprinted tree (its recipes' paths)."""
    if root:
        text = text.replace(root, "<tmp>")
    return CELL_TMP.sub("<cell>", text.replace(str(HERE.parent), "<tree>"))


def scrub(value: Any, root: str = "") -> Any:
    """A report with what changes from run to run (timings, paths) taken out."""
    if isinstance(value, dict):
        return {k: scrub(v, root) for k, v in sorted(value.items()) if k not in VOLATILE}
    if isinstance(value, list):
        return [scrub(v, root) for v in value]
    if isinstance(value, str):
        return unpath(value, root)
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return value


def _array_key(a: Any) -> Any:
    if a is None:
        return None
    import numpy as np

    a = np.ascontiguousarray(a)
    return [str(a.dtype), list(a.shape), hashlib.sha256(a.tobytes()).hexdigest()[:16]]


def _quant_key(q: Any) -> Any:
    if q is None or q.is_empty():
        return None
    return {
        "scale": _array_key(q.scale),
        "zero_point": _array_key(q.zero_point),
        "axis": q.axis,
        "min": _array_key(q.min),
        "max": _array_key(q.max),
        "details": None if q.details is None else repr(q.details),
    }


def _tensor_key(t: Any, named: bool = False) -> dict[str, Any]:
    """What a tensor is, wherever the file keeps it (its name only when `named`)."""
    return {
        "name": t.name if named else None,
        "dtype": t.dtype,
        "shape": list(t.shape),
        "signature": None if t.shape_signature is None else list(t.shape_signature),
        "quantization": _quant_key(t.quantization),
        "data": _array_key(t.data),
        "variable": t.is_variable,
    }


def _graph_key(g: Any) -> tuple[dict[str, Any], Callable[[Any], Any]]:
    names: dict[int, str] = {id(t): f"in{i}" for i, t in enumerate(g.inputs)}
    for n, op in enumerate(g.ops):
        for k, t in enumerate(op.outputs):
            names.setdefault(id(t), f"op{n}:{k}")

    def ref(t: Any) -> Any:
        return None if t is None else names.get(id(t)) or _tensor_key(t)

    ops = [
        {
            "type": op.type,
            "custom_code": op.custom_code,
            "custom_options": None if op.custom_options is None else op.custom_options.hex(),
            "version": op.version,
            "options": json.loads(json.dumps(op.options, sort_keys=True, default=repr)),
            "inputs": [ref(t) for t in op.inputs],
            "outputs": [_tensor_key(t) for t in op.outputs],
            "intermediates": [ref(t) for t in op.intermediates],
        }
        for op in g.ops
    ]
    return {
        "name": g.name,
        "inputs": [_tensor_key(t, named=True) for t in g.inputs],
        "outputs": [ref(t) for t in g.outputs],
        "output_names": [t.name for t in g.outputs],
        "tensors": len(g.tensors),
        "ops": ops,
    }, ref


def canonical(path: Path) -> str:
    """The sha256 of the model's canonical form (see the module docstring), read with this
    tree's IR; "unreadable: ..." when the IR cannot read it."""
    sys.path.insert(0, str(HERE.parent))
    from tflfuse.ir import flatbuffer

    try:
        model = flatbuffer.from_bytes(path.read_bytes())
    except Exception as exc:  # a model the IR refuses: say so, the sha256 still compares
        return f"unreadable: {type(exc).__name__}"
    graphs, refs = [], []
    for g in model.subgraphs:
        key, ref = _graph_key(g)
        graphs.append(key)
        refs.append(ref)
    form = {
        "version": model.version,
        "description": model.description,
        "metadata": {k: hashlib.sha256(v).hexdigest() for k, v in sorted(model.metadata.items())},
        "signatures": [
            {
                "key": s.key,
                "subgraph": s.subgraph,
                "inputs": {k: refs[s.subgraph](t) for k, t in sorted(s.inputs.items())},
                "outputs": {k: refs[s.subgraph](t) for k, t in sorted(s.outputs.items())},
            }
            for s in model.signatures
        ],
        "subgraphs": graphs,
    }
    text = json.dumps(form, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def model_entry(path: Path) -> dict[str, Any]:
    return {"sha256": sha256(path), "canonical": canonical(path), "ops": op_list(path)}


def models_in(folder: Path) -> dict[str, Any]:
    return {p.name: model_entry(p) for p in sorted(folder.glob("*.tflite"))}


def record(proc: subprocess.CompletedProcess, out: Path | None, root: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"exit": proc.returncode}
    if proc.returncode != 0:
        entry["error"] = unpath(first_line(proc.stderr), root)
    if out is not None and out.is_dir():
        entry["models"] = models_in(out)
        report = out / "report.json"
        if report.exists():
            entry["report"] = scrub(json.loads(report.read_text()), root)
    elif out is not None and out.is_file():
        entry["models"] = {out.name: model_entry(out)}
    return entry


def noise_calibration(model: Path, dest: Path, seed: int = 0) -> Path | None:
    """Seeded uniform calibration data in the model's input shape (for .tflite without a .npy)."""
    import numpy as np

    proc = tflfuse("inspect", str(model), "--json")
    if proc.returncode != 0:
        return None
    inputs = json.loads(proc.stdout)["subgraphs"][0]["inputs"]
    if len(inputs) != 1:
        return None
    shape = [int(d) for d in inputs[0]["shape"]]
    rng = np.random.default_rng(seed)
    np.save(dest, rng.uniform(-1, 1, (8, *shape[1:])).astype(np.float32))
    return dest


def zoo_cases(work: Path) -> Iterator[tuple[str, list[str], Path]]:
    from tflfuse.examples import zoo

    for name in zoo.BUILDERS:
        model, calib = work / f"{name}.keras", work / f"{name}.npy"
        size = ZOO_SIZES.get(name)
        extra = ["--size", str(size)] if size else []
        proc = tflfuse("example", name, "-o", str(model), "--calib", str(calib), *extra)
        if proc.returncode != 0:
            yield f"zoo/{name}/example", [], work / "missing"
            continue
        for recipe in RECIPES:
            out = work / f"zoo-{name}-{recipe}"
            args = ["convert", str(model), "--recipe", recipe, "--calib", str(calib)]
            yield f"zoo/{name}/{recipe}", [*args, "-o", str(out)], out


def tflite_cases(files: list[Path], work: Path) -> Iterator[tuple[str, list[str], Path]]:
    for path in files:
        calib = path.with_suffix(".npy")
        if not calib.exists():
            calib = noise_calibration(path, work / f"{path.stem}-calib.npy") or calib
        for recipe in INT8_RECIPES:
            for layout in ([], ["--channels-last"]):
                out = work / f"tfl-{path.stem}-{recipe}{'-cl' if layout else ''}"
                args = ["convert", str(path), "--recipe", recipe, "--calib", str(calib), *layout]
                yield (
                    f"tflite/{path.stem}/{recipe}{' cl' if layout else ''}",
                    [*args, "-o", str(out)],
                    out,
                )
        yield from optimize_cases(f"tflite/{path.stem}", path, work)


def optimize_cases(key: str, path: Path, work: Path) -> Iterator[tuple[str, list[str], Path]]:
    for target in TARGETS:
        out = work / f"opt-{path.stem}-{target}.tflite"
        yield (
            f"{key}/optimize-{target}",
            ["optimize", str(path), "-o", str(out), "--target", target],
            out,
        )


def oracle_cases(work: Path) -> Iterator[tuple[str, list[str], Path | None]]:
    for folder in ("edgetpu", "edgetpu-more"):
        for path in sorted((SHARED / "oracle" / folder).rglob("*.tflite")):
            if path.stem.endswith("_edgetpu"):
                continue
            key = f"oracle/{path.relative_to(SHARED / 'oracle')}"
            yield f"{key}/check", ["check", str(path), "--target", "edgetpu", "--json"], None
            yield from optimize_cases(key, path, work)


def runtime_sources(work: Path) -> Iterator[tuple[str, Path | None, Path]]:
    """(name, .keras or None when it could not be built, calibration .npy) for the runtime set."""
    model, calib = work / "transformer_encoder.keras", work / "transformer_encoder.npy"
    proc = tflfuse("example", "transformer_encoder", "-o", str(model), "--calib", str(calib))
    yield "transformer_encoder", model if proc.returncode == 0 else None, calib
    model, calib = work / "decoder.keras", work / "decoder.npy"
    cmd = [sys.executable, "-c", DECODER, str(model), str(calib)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=child_env())
    yield "decoder", model if proc.returncode == 0 else None, calib


def runtime_cases(work: Path) -> Iterator[tuple[str, list[str], Path]]:
    sources = {name: (model, calib) for name, model, calib in runtime_sources(work)}
    for name, recipe, runtime in RUNTIME_CONVERTS:
        model, calib = sources[name]
        if model is None:
            yield f"runtime/{name}/build", [], work / "missing"
            continue
        out = work / f"rt-{name}-{recipe}-{runtime}"
        args = ["convert", str(model), "--recipe", recipe, "--calib", str(calib)]
        yield (
            f"runtime/{name}/{recipe}/{runtime}",
            [*args, "--runtime", runtime, "-o", str(out)],
            out,
        )
    for name, (_, calib) in sources.items():  # the float .tflite the plain route wrote
        stock = work / f"rt-{name}-cpu-float-{RUNTIMES[0]}" / "model_stock.tflite"
        out = work / f"rt-tflite-{name}"
        args = ["convert", str(stock), "--recipe", "xnnpack-int8", "--calib", str(calib)]
        yield (
            f"runtime/{name}.tflite/xnnpack-int8/{RUNTIMES[1]}",
            [*args, "-o", str(out), "--runtime", RUNTIMES[1]],
            out,
        )
        for runtime in RUNTIMES:
            out = work / f"rt-opt-{name}-{runtime}.tflite"
            args = ["optimize", str(stock), "-o", str(out), "--target", "xnnpack"]
            yield f"runtime/{name}/optimize-xnnpack/{runtime}", [*args, "--runtime", runtime], out


def sweep_rows(stdout: str, root: str) -> list[Any]:
    rows = json.loads(stdout)
    return [scrub({k: v for k, v in row.items() if k not in SWEEP_VOLATILE}, root) for row in rows]


def sweep_results(work: Path) -> dict[str, Any]:
    """A 3-cell sweep on the local pool, then resumed (nothing converted again)."""
    plan, out, root = work / "plan.toml", work / "sweep", str(work)
    plan.write_text(SWEEP_PLAN)
    results: dict[str, Any] = {}
    for key, extra in (("sweep/run", []), ("sweep/resume", ["--resume"])):
        argv = ["sweep", str(plan), "-o", str(out), "--engine", "pool", "--jobs", "2", "--json"]
        proc = tflfuse(*argv, *extra)
        entry = record(proc, None, root)
        if proc.returncode == 0:
            entry["rows"] = sweep_rows(proc.stdout, root)
        results[key] = entry
        print(f"{key}: exit {entry['exit']}", file=sys.stderr, flush=True)
    for cell in sorted((out / "cells").glob("*")):
        results[f"sweep/cells/{cell.name}"] = record(subprocess.CompletedProcess([], 0), cell, root)
    return results


def run(args: argparse.Namespace) -> int:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tflfuse-fp-") as tmp:
        work = Path(tmp)
        cases: list[Iterator] = []
        if "zoo" in args.sets:
            cases.append(zoo_cases(work))
        if "tflite" in args.sets:
            files = sorted((SHARED / "models" / "pytorch").glob("*.tflite"))
            if args.corpus:
                files += sorted(Path(args.corpus).rglob("*.tflite"))
            cases.append(tflite_cases(files, work))
        if "oracle" in args.sets:
            cases.append(oracle_cases(work))
        if "runtime" in args.sets:
            cases.append(runtime_cases(work))
        for group in cases:
            for key, argv, out in group:
                if not argv:
                    results[key] = {"exit": "not built"}
                    continue
                proc = tflfuse(*argv)
                entry = record(proc, out, tmp)
                if out is None and proc.returncode == 0:
                    entry["json"] = scrub(json.loads(proc.stdout), tmp)
                results[key] = entry
                print(f"{key}: exit {entry['exit']}", file=sys.stderr, flush=True)
        if "sweep" in args.sets:
            results.update(sweep_results(work))
    Path(args.output).write_text(json.dumps(results, indent=1, sort_keys=True))
    return 0


def diff(a: Any, b: Any, where: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                yield f"{where}/{k}: only in {'after' if k in b else 'before'}"
            else:
                yield from diff(a[k], b[k], f"{where}/{k}")
    elif a != b:
        yield f"{where}: {str(a)[:120]} != {str(b)[:120]}"


def _models(runs: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for key, entry in sorted(runs.items()):
        if isinstance(entry, dict):
            for name, model in sorted(entry.get("models", {}).items()):
                yield f"{key}/models/{name}", model


def _set_canonical_aside(a: dict[str, Any], b: dict[str, Any]) -> tuple[set[str], list[str]]:
    """Take the sha256 and op list out of every model present in both whose canonical digests
    are equal: (those of them that had another sha256, the models without a canonical form)."""
    after = dict(_models(b))
    moved: set[str] = set()
    missing = []
    for where, model in _models(a):
        other = after.get(where)
        if other is None:
            continue
        if "canonical" not in model or "canonical" not in other:
            missing.append(where)
            continue
        if model["canonical"] == other["canonical"]:
            if model.get("sha256") != other.get("sha256"):
                moved.add(where)
            for key in ("sha256", "ops"):
                model.pop(key, None)
                other.pop(key, None)
    return moved, missing


def _sizes_aside(differences: list[str], moved: set[str]) -> tuple[list[str], list[str]]:
    """(the report file sizes that differ in a run whose models moved, the other differences)."""
    runs = {"/" + where.split("/models/")[0] + "/" for where in moved}
    sizes = [
        d
        for d in differences
        if d.split(":")[0].endswith("/file_bytes") and any(d.startswith(r) for r in runs)
    ]
    return sizes, [d for d in differences if d not in sizes]


def _drop_one_sided_canonical(a: dict[str, Any], b: dict[str, Any]) -> None:
    """A fingerprint from before the canonical digest compares with a newer one on the rest."""
    after = dict(_models(b))
    for where, model in _models(a):
        other = after.get(where)
        if other is not None and ("canonical" in model) != ("canonical" in other):
            model.pop("canonical", None)
            other.pop("canonical", None)


def compare(before: Path, after: Path, canonically: bool = False) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    if not canonically:
        _drop_one_sided_canonical(a, b)
    moved, missing = _set_canonical_aside(a, b) if canonically else (set(), [])
    differences = [f"{where}: no canonical digest" for where in missing] + list(diff(a, b))
    sizes: list[str] = []
    if canonically and moved:
        sizes, differences = _sizes_aside(differences, moved)
    for line in differences:
        print(line)
    if canonically:
        print(f"{len(moved)} models with another sha256 and the same canonical form")
        print(f"{len(sizes)} report file sizes differ with them (alignment of the moved buffers)")
    print(f"{len(a)} runs before, {len(b)} after, {len(differences)} differences")
    return 1 if differences else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", default="fingerprint.json")
    parser.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    parser.add_argument("--corpus", help="a folder of other people's .tflite models (+ .npy)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument(
        "--canonical",
        action="store_true",
        help="with --compare: a model whose sha256 differs passes when its canonical form is equal",
    )
    args = parser.parse_args()
    if args.compare:
        return compare(Path(args.compare[0]), Path(args.compare[1]), args.canonical)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
