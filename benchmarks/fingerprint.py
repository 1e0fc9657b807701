#!/usr/bin/env python3
"""Fingerprint what tflfuse writes, to prove a refactoring changed nothing.

    .venv/bin/python benchmarks/fingerprint.py -o before.json           # on the old tree
    .venv/bin/python benchmarks/fingerprint.py -o after.json            # on the new tree
    .venv/bin/python benchmarks/fingerprint.py --compare before.json after.json

It drives the command line only (so it survives any internal reshuffle) over three sets:
  zoo      every `tflfuse example` architecture, converted with every shipped recipe
  tflite   every float .tflite it is given (the PyTorch exports in ../shared/models/pytorch and,
           with --corpus DIR, other people's models), converted with the int8 recipes and
           optimized for every target
  oracle   the source models of ../shared/oracle: optimized for every target and checked for the
           Edge TPU
and records, per run: the exit code and the first line of stderr, the sha256 of every .tflite
written, the op list of each, and the JSON of `check`/the report with its timings removed.
`--compare` prints every difference and exits 1 if there is one. Two runs of the same tree must
compare equal (conversion is seeded); a refactoring that keeps behaviour must too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared"
RECIPES = ("edgetpu", "xnnpack-int8", "cpu-float", "gpu-fp16")
INT8_RECIPES = ("edgetpu", "xnnpack-int8")
TARGETS = ("edgetpu", "xnnpack", "gpu", "cpu")
ZOO_SIZES = {"mobilenet_v2": 64, "mobilenet_v3_small": 64, "efficientnet_b0": 64}
VOLATILE = {"timings_s", "elapsed_s", "output_dir", "model", "path", "created", "tflfuse_version"}


def tflfuse(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tflfuse.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=1800)


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


def scrub(value: Any, root: str = "") -> Any:
    """A report with what changes from run to run (timings, paths) taken out."""
    if isinstance(value, dict):
        return {k: scrub(v, root) for k, v in sorted(value.items()) if k not in VOLATILE}
    if isinstance(value, list):
        return [scrub(v, root) for v in value]
    if isinstance(value, str) and root:
        return value.replace(root, "<tmp>")
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return value


def models_in(folder: Path) -> dict[str, Any]:
    return {
        p.name: {"sha256": sha256(p), "ops": op_list(p)} for p in sorted(folder.glob("*.tflite"))
    }


def record(proc: subprocess.CompletedProcess, out: Path | None, root: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"exit": proc.returncode}
    if proc.returncode != 0:
        entry["error"] = first_line(proc.stderr).replace(root, "<tmp>")
    if out is not None and out.is_dir():
        entry["models"] = models_in(out)
        report = out / "report.json"
        if report.exists():
            entry["report"] = scrub(json.loads(report.read_text()), root)
    elif out is not None and out.is_file():
        entry["models"] = {out.name: {"sha256": sha256(out), "ops": op_list(out)}}
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


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    differences = list(diff(a, b))
    for line in differences:
        print(line)
    print(f"{len(a)} runs before, {len(b)} after, {len(differences)} differences")
    return 1 if differences else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", default="fingerprint.json")
    parser.add_argument("--sets", nargs="+", default=["zoo", "tflite", "oracle"])
    parser.add_argument("--corpus", help="a folder of other people's .tflite models (+ .npy)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(Path(args.compare[0]), Path(args.compare[1]))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
