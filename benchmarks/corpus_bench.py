#!/usr/bin/env python3
"""Run the corpus of other people's models through `tflfuse sweep`; write benchmarks/CORPUS.md.

    .venv/bin/python benchmarks/corpus_bench.py                  # every model x recipe, resumed
    .venv/bin/python benchmarks/corpus_bench.py --only yolo11n --recipes edgetpu
    .venv/bin/python benchmarks/corpus_bench.py --address HOST:PORT  # the cells on a Ray cluster
    .venv/bin/python benchmarks/corpus_bench.py --tflfuse /work/main   # another checkout's venv
    .venv/bin/python benchmarks/corpus_bench.py --report-only    # the tables from the sweep

The corpus is built by `benchmarks/corpus_build.py` (its own venv; see its docstring) into
`$TFLFUSE_CORPUS` (default /work/corpus/models): `NAME.tflite`, its `NAME.json` sidecar and
`NAME.calib.npy`. The cells (model x recipe in edgetpu, xnnpack-int8, each with and without
`--channels-last`) are one plan, run by `tflfuse sweep PLAN -o benchmarks/out/corpus/sweep
--resume` (locally, `--jobs` at a time, or on the Ray cluster at `--address`): each cell is one
`tflfuse convert MODEL --recipe R --calib NAME.calib.npy --json` in its own process with a
timeout, and its row holds the exit code and the one line it printed, whether it left files
behind, the op counts, the Edge TPU mapping, the error of stock and fused against the float
source, the wall and CPU time and peak RSS (the convert and its children, from wait4) and, unless
`--no-latency`, the p50 fused / stock of a short interleaved `tflfuse bench` (XNNPACK, one
thread). The relative error and the rules that fired are read from the cell's report.json. A
crash is rerun here under Python's faulthandler to find where it happened (crash.json beside it).

The sweep's --resume is the cache: a cell is converted again only when its inputs (the model's
and calibration's bytes, the recipe, the options, tflfuse's package files) changed; `--rerun`
redoes the selection. Each cell's folder (benchmarks/out/corpus/sweep/cells/MODEL.RECIPE[.cl])
keeps the conversion's files, which `--retime` times again without converting. Writes
benchmarks/CORPUS.md and benchmarks/out/corpus.json. Latency depends on the machine (shared
here): the ratio between models timed in one run is the number to read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's tflfuse (cell names: its sweep_plan)
DEFAULT_CORPUS = Path(os.environ.get("TFLFUSE_CORPUS", "/work/corpus/models"))
SWEEP = HERE / "out" / "corpus" / "sweep"  # the sweep's folder: its cells are the cache
RECIPES = ("edgetpu", "xnnpack-int8", "edgetpu+cl", "xnnpack-int8+cl")  # +cl: --channels-last


# ---------------------------------------------------------------- running one cell


def tflfuse_command(path: Path) -> tuple[list[str], Path | None]:
    """The tflfuse executable for PATH (a checkout with .venv, a venv, or the executable), and
    the checkout it belongs to (for the cache key), if any."""
    path = path.resolve()
    for candidate in (path / ".venv" / "bin" / "tflfuse", path / "bin" / "tflfuse", path):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            exe = candidate
            break
    else:
        raise SystemExit(f"corpus_bench: no tflfuse executable at {path}")
    checkout = path if (path / ".git").exists() else None
    return [str(exe)], checkout


def checkout_id(checkout: Path | None, exe: list[str]) -> str:
    """A hash of the committed tflfuse package and its data folders in `checkout`, and of their
    uncommitted diff."""
    if checkout is None:
        return hashlib.sha1(Path(exe[0]).read_bytes()).hexdigest()[:12]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(checkout), *args], capture_output=True, text=True, check=False
        ).stdout

    # the trees of what decides a conversion, not the commit: a commit elsewhere keeps the cache
    trees = git("rev-parse", "HEAD:tflfuse", "HEAD:delegates", "HEAD:converters").split()
    head = hashlib.sha1(" ".join(trees).encode()).hexdigest()[:12]
    diff = git("diff", "HEAD", "--", "tflfuse", "delegates", "converters")
    return head + ("+" + hashlib.sha1(diff.encode()).hexdigest()[:8] if diff else "")


def run_limited(cmd: list[str], cwd: Path, timeout: float) -> dict[str, Any]:
    """Run `cmd` in its own process group, killed after `timeout` s (sweep's runner: exit code,
    stdout, stderr, wall time and peak RSS)."""
    from tflfuse.convert.sweep_cell import run_process

    return run_process(cmd, cwd, timeout)


def printed_lines(text: str) -> list[str]:
    """What a user sees: lines after carriage returns (progress bars) resolved, blanks dropped."""
    lines = []
    for raw in text.splitlines():
        shown = raw.split("\r")[-1].strip()
        if shown and not re.match(r"^[\w :-]+?:*\s*\d+%\|", shown):
            lines.append(shown)
    return lines


def classify(run: dict[str, Any]) -> tuple[str, str]:
    """(status, the one line that says why) for a finished convert process."""
    lines = printed_lines(run["stderr"])
    if run["timed_out"]:
        return "timeout", f"killed after {run['seconds']:.0f} s"
    code = run["exit"]
    if code == 0:
        return "converted", ""
    tb = any(ln.startswith("Traceback") for ln in lines)
    errors = [ln for ln in lines if ln.startswith("tflfuse: error")]
    if code < 0 or code in (134, 139) or tb:
        sig = {-6: "SIGABRT", -11: "SIGSEGV", 134: "SIGABRT", 139: "SIGSEGV", -9: "SIGKILL"}
        what = sig.get(code, f"exit {code}")
        if tb:
            return "crash", f"{what}, traceback: {lines[-1]}"[:400]
        last = f'last line printed: "{lines[-1]}"' if lines else "nothing printed"
        return "crash", f"{what}, no message ({last})"[:400]
    if code == 2 and errors and len(errors) == len(lines):
        return "refused", errors[-1][:400]
    msg = errors[-1] if errors else (lines[-1] if lines else "(nothing printed)")
    return "failed", f"exit {code}, {len(lines)} lines: {msg}"[:400]


def leftovers(folder: Path) -> list[str]:
    """What a failed run left in its (fresh, otherwise empty) folder: it should be nothing."""
    return sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())


def summarize_report(rep: dict[str, Any]) -> dict[str, Any]:
    """The numbers the table needs from a report.json."""

    def agreement(kind: str) -> dict[str, Any]:
        a = rep.get("agreement", {}).get(kind) or {}
        outs = a.get("outputs") or []
        worst_rel = None
        for o in outs:
            rng = o.get("reference_range")
            if rng:
                rel = (o.get("max_abs") or 0) / rng
                worst_rel = rel if worst_rel is None else max(worst_rel, rel)
        return {
            "max_abs": a.get("max_abs"),
            "rel_range": worst_rel,
            "top1": outs[0].get("top1_agreement") if len(outs) == 1 else None,
            "varies": all(o.get("varies", True) for o in outs) if outs else None,
            "verified": a.get("verified"),
        }

    models = rep.get("models", {})
    edgetpu = rep.get("edgetpu") or {}
    quant = rep.get("quantization") or {}
    return {
        "ops": {k: (models.get(k) or {}).get("op_count") for k in ("unfused", "stock", "fused")},
        "error": {k: agreement(k) for k in ("stock", "fused")},
        "edgetpu": {
            k: {
                "mapped": v.get("mapped"),
                "ops": v.get("ops"),
                "cut": v.get("cut"),
                "cpu_ops": v.get("cpu_ops"),
            }
            for k, v in edgetpu.items()
            if isinstance(v, dict) and "mapped" in v
        },
        "float_ops_left": quant.get("float_ops_left"),
        "fired": (rep.get("rules") or {}).get("fired"),
        "legalization_fired": (rep.get("legalization") or {}).get("fired"),
        "notices": rep.get("notices"),
        "timings_s": rep.get("timings_s"),
        "stock_route": quant.get("stock_route"),
    }


def bench_pair(
    exe: list[str], folder: Path, runs: int, timeout: float, sub: str = "out"
) -> dict[str, Any]:
    """p50 of stock and fused (in folder/sub), timed interleaved (XNNPACK, one thread), twice
    with the order swapped; the mean ratio of the two passes."""
    ratios, p50 = [], {"stock": [], "fused": []}
    for order in (("stock", "fused"), ("fused", "stock")):
        files = {"stock": f"{sub}/model_stock.tflite", "fused": f"{sub}/model.tflite"}
        cmd = [*exe, "bench", *(files[m] for m in order), "--runs", str(runs)]
        cmd += ["--warmup", "5", "--threads", "1", "--delegate", "xnnpack", "--json", "bench.json"]
        run = run_limited(cmd, folder, timeout)
        if run["exit"] != 0:
            return {"error": classify(run)[1]}
        data = json.loads((folder / "bench.json").read_text())
        got = {order[i]: m["latency_ms"]["p50"] for i, m in enumerate(data["models"])}
        for k in p50:
            p50[k].append(got[k])
        ratios.append(got["fused"] / got["stock"])
    return {
        "load_average": round(os.getloadavg()[0], 1),  # others' work on this machine meanwhile
        "stock_p50_ms": sorted(p50["stock"])[0],
        "fused_p50_ms": sorted(p50["fused"])[0],
        "ratio": sum(ratios) / len(ratios),
        "ratios": ratios,
    }


def write_plan(models: list[Path], recipes: list[str], args: argparse.Namespace) -> Path:
    """PLAN.toml for the selection: per model, one table per --channels-last value asked for."""
    lines = [f"timeout_s = {args.timeout}", f"bench_runs = {0 if args.no_latency else args.runs}"]
    lines.append(f"recipes = {json.dumps(sorted({r.removesuffix('+cl') for r in recipes}))}")
    for model in models:
        calib = model.with_suffix(".calib.npy")
        for cl in (False, True):
            bases = [r.removesuffix("+cl") for r in recipes if r.endswith("+cl") == cl]
            if not bases:
                continue
            lines += ["", "[[model]]", f"name = {json.dumps(model.stem)}"]
            lines += [f"path = {json.dumps(str(model))}", f"recipes = {json.dumps(bases)}"]
            lines += [f"calib = {json.dumps(str(calib))}"] if calib.exists() else []
            lines += ["channels_last = true"] if cl else []
    plan = SWEEP.parent / "plan.toml"
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_text("\n".join(lines) + "\n")
    return plan


def cell_dir(model: Path, recipe: str) -> Path:
    """The sweep's folder of one cell (tflfuse.convert.sweep_plan.cell_name)."""
    from tflfuse.convert.sweep_plan import cell_name

    base, cl = recipe.removesuffix("+cl"), recipe.endswith("+cl")
    return SWEEP / "cells" / cell_name(model.stem, base, {"channels_last": cl})


def run_sweep(exe: list[str], plan: Path, args: argparse.Namespace) -> int:
    """`tflfuse sweep PLAN -o SWEEP --resume`, its progress bar on this terminal."""
    cmd = [*exe, "sweep", str(plan), "-o", str(SWEEP), "--resume", "--jobs", str(args.jobs)]
    cmd += ["--address", args.address] if args.address else []
    return subprocess.run(cmd, check=False).returncode


def cell_of(model: Path, recipe: str, exe: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """A cell of the tables from the sweep's row (cell.json) and report.json; a crash rerun
    under faulthandler once (crash.json)."""
    folder = cell_dir(model, recipe)
    row = json.loads((folder / "cell.json").read_text())
    status = row["status"]
    if status == "refused" and row.get("lines_printed", 1) > 1:
        status = "failed"  # a refusal said in more than one line
    cell: dict[str, Any] = {
        "model": model.name,
        "recipe": recipe,
        "status": "crash" if status == "lost" else status,
        "exit": row["exit"],
        "why": row["line"]
        if status != "failed"
        else f"exit {row['exit']}, {row.get('lines_printed')} lines: {row['line']}",
        "lines_printed": row.get("lines_printed", 0),
        "seconds": row["seconds"] or 0.0,
        "peak_rss_mib": row["peak_rss_mib"] or 0.0,
        "cpu_s": row.get("cpu_s"),
        "left_behind": row.get("left_behind", []),
        "node": row.get("node"),
    }
    report = folder / "report.json"
    if status == "converted" and report.exists():
        cell.update(summarize_report(json.loads(report.read_text())))
        cell["latency"] = _latency(row, folder)
    elif status == "crash" and not args.no_crash_rerun:
        cell.update(_crash(model, recipe, exe, args, folder))
    return cell


def _latency(row: dict[str, Any], folder: Path) -> dict[str, Any]:
    retimed = folder / "retime.json"
    if retimed.exists():
        return json.loads(retimed.read_text())
    bench = row.get("bench") or {}
    if row.get("p50_ratio") is None:
        return {"error": bench["line"]} if "line" in bench else {}
    return {**bench, "ratio": row["p50_ratio"]}


def _crash(
    model: Path, recipe: str, exe: list[str], args: argparse.Namespace, folder: Path
) -> dict[str, Any]:
    saved = folder / "crash.json"
    if saved.exists():
        return json.loads(saved.read_text())
    argv = ["convert", str(model), "--recipe", recipe.removesuffix("+cl"), "-o", "out", "--json"]
    calib = model.with_suffix(".calib.npy")
    argv += ["--calib", str(calib)] if calib.exists() else []
    argv += ["--channels-last"] if recipe.endswith("+cl") else []
    with tempfile.TemporaryDirectory(prefix="corpus-crash-", dir=args.workdir) as tmp:
        found = crash_stack(exe, argv, Path(tmp), args.timeout)
    saved.write_text(json.dumps(found, indent=1))
    return found


FAULT_SNIPPET = """
import faulthandler, sys
faulthandler.enable(file=open(sys.argv.pop(1), "w"), all_threads=False)
from tflfuse.cli import main
sys.argv[0] = "tflfuse"
sys.exit(main())
"""


def crash_stack(exe: list[str], argv: list[str], folder: Path, timeout: float) -> dict[str, Any]:
    """Rerun a crashed conversion with -v and Python's faulthandler writing to a file (tflfuse
    captures fd 2, so the usual faulthandler output would be swallowed): the Python stack at the
    native crash, innermost first, and the last lines that -v shows from native code."""
    for p in folder.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    python = Path(exe[0]).with_name("python")
    trace = folder.parent / f"{folder.name}.fault"
    run = run_limited([str(python), "-c", FAULT_SNIPPET, str(trace), *argv, "-v"], folder, timeout)
    frames = []
    if trace.exists():
        for ln in trace.read_text(errors="replace").splitlines():
            m = re.match(r'\s*File "(.+)", line (\d+) in (\S+)', ln)
            if m and "threading.py" not in m[1] and "tqdm" not in m[1]:
                frames.append(f"{m[1].split('site-packages/')[-1]}:{m[2]} {m[3]}")
        trace.unlink()
    tflfuse_frames = [f for f in frames if f.startswith(("tflfuse/", "/")) and "tflfuse/" in f]
    return {
        "crash_rerun_exit": run["exit"],
        "crash_stack": frames[:12],
        "crash_in_tflfuse": [f[f.index("tflfuse/") :] for f in tflfuse_frames][:6],
        "verbose_tail": printed_lines(run["stderr"])[-8:],
    }


# ---------------------------------------------------------------- the corpus and the cache


def corpus(folder: Path, only: list[str] | None) -> list[Path]:
    models = sorted(folder.glob("*.tflite"))
    models = [m for m in models if not m.name.startswith(".")]
    if only:
        models = [m for m in models if any(o in m.name for o in only)]
    return models


def sidecar(model: Path) -> dict[str, Any]:
    path = model.with_suffix(".json")
    return json.loads(path.read_text()) if path.exists() else {}


# ---------------------------------------------------------------- the tables


def _g(x: float | None, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt)


def _ops(cell: dict[str, Any]) -> str:
    o = cell.get("ops") or {}
    return "/".join(
        _g(o.get(k), "d") if o.get(k) is not None else "-" for k in ("unfused", "stock", "fused")
    )


def _err(cell: dict[str, Any]) -> str:
    e = cell.get("error") or {}
    parts = []
    for k in ("stock", "fused"):
        v = e.get(k) or {}
        parts.append(_g(v.get("rel_range"), ".2g"))
    return " / ".join(parts)


def _tpu(cell: dict[str, Any]) -> str:
    t = cell.get("edgetpu") or {}
    if not t:
        return "-"

    def one(k: str) -> str:
        v = t.get(k) or {}
        return f"{v.get('mapped')}/{v.get('ops')}" if v else "-"

    return f"{one('stock')} → {one('fused')}"


def _lat(cell: dict[str, Any]) -> str:
    lat = cell.get("latency") or {}
    if "ratio" not in lat:
        return "-" if not lat else "**refused**"
    return f"{lat['fused_p50_ms']:.2f}/{lat['stock_p50_ms']:.2f} ({lat['ratio']:.2f})"


def _cause(why: str) -> str:
    """A short group name for a failure line (numbers and names taken out)."""
    text = re.sub(r" at '.*", "", why)  # a rule's location: op names, cut at any length
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"/\S+", "PATH", text)
    text = re.sub(r"[-+]?\d[\d.e+-]*", "N", text)
    return text[:160]


def _group(cell: dict[str, Any]) -> str:
    """The cause a failed cell is listed under: for a crash, where it happened (the innermost
    tflfuse functions on the stack); otherwise its error line with paths and numbers taken out
    (a refusal printed with extra lines joins its one-line twins, marked with the line count)."""
    if cell["status"] == "crash":
        signal_name = cell["why"].split(",")[0]
        frames = [re.sub(r":\d+ ", " ", f) for f in (cell.get("crash_in_tflfuse") or [])[:2]]
        where = " ← ".join(frames) if frames else "(no Python stack)"
        return f"crash: {signal_name}, no message, in {where}"
    why = cell["why"]
    if cell["status"] == "failed":
        why = re.sub(r"^exit \d+, \d+ lines: ", "", why)
    return (
        f"{'refused' if cell['status'] in ('refused', 'failed') else cell['status']}: {_cause(why)}"
    )


def _load_note(cells: list[dict[str, Any]]) -> str:
    loads = [
        c["latency"]["load_average"] for c in cells if "load_average" in (c.get("latency") or {})
    ]
    timed = [c for c in cells if "ratio" in (c.get("latency") or {})]
    text = (
        f"Latency: {len(timed)} cells timed. This machine is shared: the p50 ratios are only as"
        " good as the quiet around them (a ratio far from 1 between identical graphs, stock ="
        " fused op for op, is noise)."
    )
    if loads:
        text += f" Load average while timing: {min(loads):.1f}–{max(loads):.1f} (2 cores)."
    return text


def write_markdown(cells: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    by_status = Counter(c["status"] for c in cells)
    lines = [
        "# The corpus: other people's models through `tflfuse convert`",
        "",
        "Written by `benchmarks/corpus_bench.py` (the models: `benchmarks/corpus_build.py`, kept"
        " out of git). Each model is converted with each recipe, with and without"
        " `--channels-last` (`+cl`), in its own process with a timeout, calibrated with its own"
        " `NAME.calib.npy` (32 varied samples in the model's layout; weights are random,"
        " BatchNorm statistics calibrated, outputs checked to vary with the input).",
        "",
        f"tflfuse: `{meta['tflfuse']}`, commit `{meta['tflfuse_commit']}` (package tree"
        f" `{meta['tflfuse_id']}`); {meta['when']}; corpus"
        f" `{meta['corpus']}` ({meta['models']} models); export versions:"
        f" {', '.join(f'{k} {v}' for k, v in meta['export_versions'].items())}.",
        "",
        f"**{len(cells)} cells: {by_status.get('converted', 0)} converted,"
        f" {by_status.get('refused', 0)} refused in one line (exit 2),"
        f" {by_status.get('crash', 0)} crashed (a signal or a traceback),"
        f" {by_status.get('failed', 0)} failed otherwise (a refusal printed in more than one"
        " line, or another exit code),"
        f" {by_status.get('timeout', 0)} timed out.**"
        f" Cells that left files behind: {sum(1 for c in cells if c.get('left_behind'))}.",
        "",
        "Columns: ops unfused/stock/fused; error = max |model - float source| over the source"
        " output's range on the report's check inputs, stock / fused; Edge TPU = ops predicted"
        " mapped, stock → fused (edgetpu recipes); p50 = fused/stock ms on XNNPACK, one thread,"
        " interleaved (ratio fused/stock; shared machine, read the ratio); s = conversion wall"
        " time; RSS = peak resident memory of the conversion.",
        "",
        _load_note(cells),
        "",
        "## Failures by cause",
        "",
    ]
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in cells:
        if c["status"] != "converted":
            groups[_group(c)].append(c)
    if not groups:
        lines.append("None.")
    for cause, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"- **{len(members)}×** {cause}")
        names = ", ".join(
            f"{c['model'].removesuffix('.tflite')} {c['recipe']}"
            + (f" ({c['lines_printed']} lines)" if c["status"] == "failed" else "")
            for c in members
        )
        lines.append(f"  - {names}")
        lines.append(f"  - e.g. `{members[0]['why']}`")
        stack = next((c["crash_in_tflfuse"] for c in members if c.get("crash_in_tflfuse")), None)
        if stack:
            lines.append(f"  - where (innermost first): {' ← '.join(stack)}")
        left = sum(1 for c in members if c.get("left_behind"))
        if left:
            lines.append(
                f"  - {left} of these left files behind (e.g. `{members[0]['left_behind']}`)"
            )
    lines += [
        "",
        "## Every cell",
        "",
        "| model | recipe | result | ops | error stock / fused | Edge TPU | p50 fused/stock"
        " | s | RSS MiB |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        result = c["status"] if c["status"] == "converted" else f"**{c['status']}** ({c['exit']})"
        lines.append(
            f"| {c['model'].removesuffix('.tflite')} | {c['recipe']} | {result} | {_ops(c)} |"
            f" {_err(c)} | {_tpu(c)} | {_lat(c)} | {c['seconds']:.0f} | {c['peak_rss_mib']:.0f} |"
        )
    big = [  # the large exports that got past loading (a quick refusal says nothing of speed)
        c
        for c in cells
        if (meta["sidecars"].get(c["model"].removesuffix(".tflite")) or {}).get("ops", 0) >= 250
        and (c["status"] == "converted" or c["seconds"] >= 5)
    ]
    if big:
        lines += [
            "",
            "## Speed and memory on the large exports (goal: under 30 s and 4 GiB)",
            "",
            "Cells that got past loading. Wall time depends on the load of this shared machine;"
            " CPU time (user + system of the conversion and its children) much less: the goal"
            " is judged on CPU time and peak RSS.",
            "",
            "| model | source ops | recipe | result | wall s | CPU s | peak RSS MiB | in goal |",
            "|---|---:|---|---|---:|---:|---:|---|",
        ]
        for c in big:
            ops = meta["sidecars"][c["model"].removesuffix(".tflite")].get("ops")
            cpu = c.get("cpu_s")
            ok = (cpu if cpu is not None else c["seconds"]) < 30 and c["peak_rss_mib"] < 4096
            lines.append(
                f"| {c['model'].removesuffix('.tflite')} | {ops} | {c['recipe']} | {c['status']} |"
                f" {c['seconds']:.0f} | {_g(cpu, '.0f')} | {c['peak_rss_mib']:.0f} |"
                f" {'yes' if ok else '**no**'} |"
            )
    lines += [
        "",
        "## The models",
        "",
        "| model | route | input | ops | output spread | export error |",
    ]
    lines.append("|---|---|---|---:|---:|---:|")
    for name, info in meta["sidecars"].items():
        spread = info.get("output_spread") or []
        sp = min((s["spread"] for s in spread), default=None)
        shape = f"{info.get('input_shape')} {info.get('input_layout', '')}"
        export = _g(info.get("export_max_abs_error_vs_torch"), ".2g")
        lines.append(
            f"| {name} | {info.get('route', '?')} | {shape} | {info.get('ops', '?')} |"
            f" {_g(sp, '.2g')} | {export} |"
        )
    lines += [
        "",
        "Output spread: the smallest over the model's outputs of (largest difference between two"
        " inputs' outputs) / (largest |output|), over 4 calibration samples; near 0 would make"
        " every agreement check vacuous. Export error: the exported float model against PyTorch"
        " on the same inputs (max abs).",
    ]
    path.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- driver


def retime(selection: list[tuple[Path, str]], args: argparse.Namespace, exe: list[str]) -> None:
    """Time again, one after the other, the converted cells' stock and fused models (kept in
    their sweep folders): retime.json beside each, which the tables then read."""
    from tqdm import tqdm

    todo = [(m, r) for m, r in selection if (cell_dir(m, r) / "model.tflite").exists()]
    for model, recipe in tqdm(todo, unit="cell", desc="retime"):
        folder = cell_dir(model, recipe)
        latency = bench_pair(exe, folder.parent, args.runs, args.timeout, folder.name)
        (folder / "retime.json").write_text(json.dumps(latency, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument(
        "--tflfuse", type=Path, default=HERE.parent, help="checkout, venv or executable"
    )
    ap.add_argument("--only", nargs="+", help="model name substrings")
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=RECIPES)
    ap.add_argument("--jobs", type=int, default=1, help="cells converted at once (default 1)")
    ap.add_argument("--address", help="run the cells on this Ray cluster (tflfuse[sweep])")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per conversion")
    ap.add_argument("--runs", type=int, default=40, help="bench runs per model and pass")
    ap.add_argument("--no-latency", action="store_true", help="skip the p50 timing")
    ap.add_argument(
        "--no-crash-rerun",
        action="store_true",
        help="do not rerun a crash under faulthandler to find where it happened",
    )
    ap.add_argument("--rerun", action="store_true", help="ignore cached cells of the selection")
    ap.add_argument(
        "--retime",
        action="store_true",
        help="time the kept stock and fused models of cached converted cells again (no convert)",
    )
    ap.add_argument("--report-only", action="store_true", help="write the tables from the sweep")
    ap.add_argument(
        "--workdir", type=Path, default=None, help="where crashes rerun (default: TMPDIR)"
    )
    ap.add_argument("--out", type=Path, default=HERE / "CORPUS.md")
    args = ap.parse_args()

    exe, checkout = tflfuse_command(args.tflfuse)
    tool = checkout_id(checkout, exe)
    models = corpus(args.corpus, args.only)
    if not models:
        print(f"corpus_bench: no models in {args.corpus} (build them: benchmarks/corpus_build.py)")
        return 2
    selection = [(m, r) for r in args.recipes for m in models]  # recipe-major: all models early
    if args.rerun:
        for m, r in selection:
            shutil.rmtree(cell_dir(m, r), ignore_errors=True)
    if not args.report_only:
        plan = write_plan(models, args.recipes, args)
        if run_sweep(exe, plan, args) != 0:
            print("corpus_bench: the sweep failed (its error above)")
            return 1
    if args.retime:
        retime(selection, args, exe)
    results = {
        (m.name, r): cell_of(m, r, exe, args)
        for m, r in selection
        if (cell_dir(m, r) / "cell.json").exists()
    }
    ordered = [results[(m.name, r)] for m in models for r in args.recipes if (m.name, r) in results]
    sidecars = {m.stem: sidecar(m) for m in models}
    index = args.corpus / "index.json"
    export_versions = (json.loads(index.read_text()) if index.exists() else {}).get("versions", {})
    keep = ("torch", "torchvision", "litert-torch", "onnx", "onnx2tf", "onnxsim", "ultralytics")
    commit = "?"
    if checkout is not None:
        commit = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    meta = {
        "tflfuse": str(exe[0]),
        "tflfuse_commit": commit,
        "tflfuse_id": tool,
        "when": time.strftime("%Y-%m-%d"),
        "corpus": str(args.corpus),
        "models": len(models),
        "export_versions": {k: v for k, v in export_versions.items() if k in keep},
        "sidecars": sidecars,
    }
    out_json = HERE / "out" / "corpus.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps({"meta": meta, "cells": ordered}, indent=1))
    write_markdown(ordered, meta, args.out)
    status = Counter(c["status"] for c in ordered)
    print(f"{len(ordered)} cells: " + ", ".join(f"{v} {k}" for k, v in status.most_common()))
    print(f"wrote {args.out} and {out_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
