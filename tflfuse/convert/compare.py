"""The three models of one conversion side by side: the numbers that decide which one to ship.

`tflfuse convert` writes `model_unfused.tflite` (the network as written), `model_stock.tflite`
(the plain converter) and `model.tflite` (fused) into one folder with `report.json`. `compare`
reads them back and gives each its op count, its latency on this host (the three timed together,
interleaved, by `tflfuse.bench`), the ops the Edge TPU compiler would map (`tflfuse.targets`,
predicted offline: the compiler does not run here) and its error against the source model (from
the report, which computed it against the Keras/TensorFlow reference when it converted).

Op counts and the mapping are read from the model files, not the report, so a file changed since
the conversion is measured as it is now.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from tflfuse import files, targets
from tflfuse.convert.records import Report
from tflfuse.device.bench import check_arguments, run_benchmark
from tflfuse.errors import TflfuseError
from tflfuse.ir import flatbuffer

if TYPE_CHECKING:
    from tflfuse.device.bench import BenchResult

VARIANTS = ("unfused", "stock", "fused")
DEFAULT_FILES = {
    "fused": "model.tflite",
    "unfused": "model_unfused.tflite",
    "stock": "model_stock.tflite",
}


class Comparison(TypedDict):
    """What `compare` found (JSON-ready): the conversion's source, recipe, quantization mode and
    I/O types as its report says, a row per model (facts, latency, error) and the benchmark."""

    source: str | None
    recipe: str | None
    quantization: str | None
    io: list[str | None]
    rows: list[dict[str, Any]]
    benchmark: BenchResult
    files_checked: bool


def read_conversion(folder: str | Path) -> tuple[Report, dict[str, Path]]:
    """The report of a `tflfuse convert` output folder and the paths of its three models."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise TflfuseError(
            f"{folder}: is a file, not a folder (give the -o folder of tflfuse convert)"
        )
    if not folder.is_dir():
        raise TflfuseError(f"{folder}: no such folder (give the -o folder of tflfuse convert)")
    report_path = folder / "report.json"
    try:
        report = json.loads(report_path.read_text())
    except FileNotFoundError:
        raise TflfuseError(f"{folder}: no report.json (not a tflfuse convert folder)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TflfuseError(f"{report_path}: cannot read the report ({exc})") from None
    if not isinstance(report, dict):
        raise TflfuseError(f"{report_path}: not a tflfuse report")
    files = {**DEFAULT_FILES, **(report.get("files") or {})}
    paths = {k: folder / str(files[k]) for k in VARIANTS}
    for k, p in paths.items():
        if not p.is_file():
            raise TflfuseError(f"{p}: the {k} model is missing")
    _check_manifest(folder, [report_path, *paths.values()])
    return cast(Report, report), paths


def _check_manifest(folder: Path, used: list[Path]) -> bool:
    """The report and the three models as `convert` wrote them (their SHA-256 in the result's
    manifest), or a one-line refusal naming the files changed since: the report's errors belong
    to the models it was written with, and a replaced model measured beside them would mix two
    conversions. False when the folder has no manifest (an older tflfuse; nothing to check)."""
    manifest = files.read_manifest(folder)
    if manifest is None:
        return False
    changed = [
        p.name for p in used if p.name not in manifest or files.sha256_of(p) != manifest[p.name]
    ]
    if changed:
        raise TflfuseError(
            f"{folder}: {', '.join(changed)} changed since tflfuse convert wrote"
            f" {'it' if len(changed) == 1 else 'them'} (not as in {files.MANIFEST}); the report's"
            " errors are of the models it wrote: convert again, or compare the files with"
            " tflfuse bench"
        )
    return True


def _error(report: Mapping[str, Any], variant: str) -> dict[str, Any]:
    agreement = (report.get("agreement") or {}).get(variant) or {}
    outputs = agreement.get("outputs") or [{}]
    return {
        "max_abs_error": agreement.get("max_abs"),
        "mean_abs_error": max((o.get("mean_abs", 0.0) for o in outputs), default=None),
        "top1_agreement": outputs[0].get("top1_agreement"),
        "output_range": max((o.get("reference_range", 0.0) for o in outputs), default=None),
        "samples": agreement.get("samples"),
    }


def compare(
    folder: str | Path,
    *,
    delegate: str = "xnnpack",
    runs: int = 300,
    warmup: int = 10,
    threads: int | None = None,
    progress: bool = True,
) -> Comparison:
    """Facts and one interleaved benchmark of a conversion's three models (JSON-ready)."""
    check_arguments(runs=runs, warmup=warmup, threads=threads)
    report, paths = read_conversion(folder)
    rows: dict[str, dict[str, Any]] = {}
    for k in VARIANTS:
        model = flatbuffer.load(paths[k])
        edgetpu = targets.predict(model, targets.EDGETPU)
        rows[k] = {
            "model": k,
            "file": str(paths[k]),
            "ops": len(model.main.ops),
            "edgetpu_mapped": edgetpu.mapped,
            "edgetpu_ops": len(edgetpu.ops),
            "edgetpu_other_readings": [r.to_dict() for r in edgetpu.other_readings],
            **_error(report, k),
        }
    bench = run_benchmark(
        [paths[k] for k in VARIANTS],
        delegate=delegate,
        runs=runs,
        warmup=warmup,
        threads=threads,
        names=list(VARIANTS),
        progress=progress,
    )
    timed = {m["name"]: m["latency_ms"] for m in bench["models"]}
    for k, row in rows.items():
        row["p50_ms"] = timed[k]["p50"]
        row["p90_ms"] = timed[k]["p90"]
        stock = timed["stock"]["p50"]
        row["p50_vs_stock"] = timed[k]["p50"] / stock if stock > 0 else None
    recipe = report.get("recipe") or {}
    return {
        "source": report.get("source"),
        "recipe": recipe.get("name"),
        "quantization": (report.get("quantization") or {}).get("mode"),
        "io": [recipe.get("input_type"), recipe.get("output_type")],
        "rows": [rows[k] for k in VARIANTS],
        "benchmark": bench,
        # read_conversion refused files changed since convert; none to check without a manifest
        "files_checked": files.read_manifest(Path(folder)) is not None,
    }


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _err(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if value >= 1e-3 or value == 0 else f"{value:.1e}"


def format_table(result: Comparison) -> str:
    """The comparison as a plain-text table with a header line and a legend."""
    bench = result["benchmark"]
    protocol, env = bench["protocol"], bench["environment"]
    rows = result["rows"]
    samples = next((r["samples"] for r in rows if r.get("samples")), None)
    span = next((r["output_range"] for r in rows if r.get("output_range")), None)
    lines = [
        f"{result['source']}: recipe {result['recipe']} ({result['quantization']},"
        f" {result['io'][0]} -> {result['io'][1]})",
        "",
        f"{'model':<8} {'ops':>5} {'p50 ms':>8} {'vs stock':>9} {'Edge TPU mapped':>16}"
        f" {'max |error|':>12} {'mean |error|':>13}",
    ]
    undecided = []
    for r in rows:
        mapped = f"{r['edgetpu_mapped']} / {r['edgetpu_ops']}"
        for other in r.get("edgetpu_other_readings", []):
            undecided.append(
                f"     {r['model']}: or {other['mapped']} / {r['edgetpu_ops']}: {other['reading']}."
            )
            mapped += "*"
        ratio = _num(r["p50_vs_stock"], ".2f") + "x"
        lines.append(
            f"{r['model']:<8} {r['ops']:>5} {r['p50_ms']:>8.3f} {ratio:>9} {mapped:>16}"
            f" {_err(r['max_abs_error']):>12} {_err(r['mean_abs_error']):>13}"
        )
    against = f"{result['source']}"
    if samples:
        against += f" on {samples} inputs"
    if span:
        against += f" (its outputs span {span:.3g})"
    lines += [
        "",
        f"p50: invoke() on this host ({env['machine']}, {env['cpu_count']} cores,"
        f" {env['interpreter']}, delegate {protocol['delegate']}),",
        f"     {protocol['runs']} runs after {protocol['warmup']} warm-up, the three interleaved.",
        "Edge TPU mapped: ops edgetpu_compiler would put on the Edge TPU, predicted by tflfuse;",
        "     the rest run on the CPU." + (" *: the evidence cannot decide:" if undecided else ""),
        *undecided,
        f"error: against {against}.",
    ]
    if result.get("files_checked") is False:
        lines.append(
            f"files: not checked against the conversion (no {files.MANIFEST}: an older tflfuse"
            " wrote them); the errors are the report's, of the models it wrote."
        )
    return "\n".join(lines)
