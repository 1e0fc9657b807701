"""`tflfuse sweep PLAN.toml -o DIR`: many conversions (models x recipes x options), one table.

An edge team picks its model by converting candidates and comparing mapping, error and latency;
the sweep does that for every cell of a plan (tflfuse.convert.sweep_plan) and writes:
  DIR/cells/MODEL.RECIPE[.OPTIONS]/  the conversion's files and cell.json (its row)
  DIR/sweep.json, DIR/sweep.md, DIR/sweep.png  (tflfuse.convert.sweep_report)
Each cell is one `tflfuse convert` in a process of its own (tflfuse.convert.sweep_cell), so a
cell that crashes or times out is one row with its line, and the rest go on. The engine (the
sweep says which ran):
  - on this machine, by default, a local pool: `jobs` cells at a time, each its own process.
    Nothing to set up, and what it adds is within the noise (benchmarks/SWEEP.md);
  - Ray (the `tflfuse[sweep]` extra, tflfuse.convert.sweep_ray): the cluster at --address, or
    with engine="ray" a Ray started in this process. Locally that buys memory-aware placement
    at the price of Ray's start (15-20 s on this shared 2-core machine: 1.15 x the standalone
    conversions for 8 small cells, against the pool's 0.98), so it is not the default.
A finished cell is written at once, so an interrupted sweep loses only what was running;
`resume` reuses every cell of DIR whose inputs hash the same (sweep_plan.cell_key).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from tflfuse.convert import sweep_plan, sweep_report
from tflfuse.convert.sweep_cell import CellResult, CellSpec, SweepRow, lost, run_cell, stop_all
from tflfuse.convert.sweep_plan import Plan
from tflfuse.errors import TflfuseError, UsageError

ENGINES = ("auto", "ray", "pool")
Done = Callable[[CellSpec, CellResult], None]


@dataclass
class SweepResult:
    """The rows in plan order, where they were written and what ran them."""

    output_dir: Path
    rows: list[SweepRow] = field(default_factory=list)
    engine: str = ""


def _note(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"tflfuse: {message}", file=sys.stderr)


def check_output(out_dir: Path, resume: bool) -> None:
    """DIR may be new, empty, or (with resume) an earlier sweep's; nothing else is touched."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir}: not a folder")
    entries = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if not entries:
        return
    is_sweep = "cells" in entries or "sweep.json" in entries
    if not is_sweep:
        raise UsageError(f"{out_dir}: not empty and not a sweep's folder (choose another -o)")
    if not resume:
        raise UsageError(f"{out_dir}: holds a sweep already (--resume reuses its cells)")


def reused_row(out_dir: Path, cell: CellSpec) -> SweepRow | None:
    """The row of DIR/cells/NAME when it was made from the same inputs, else None."""
    path = out_dir / "cells" / cell.name / "cell.json"
    with contextlib.suppress(OSError, ValueError):
        row = json.loads(path.read_text())
        if isinstance(row, dict) and row.get("key") == cell.key:
            return {**row, "reused": True}
    return None


def write_cell(out_dir: Path, result: CellResult) -> None:
    """DIR/cells/NAME: the conversion's files and cell.json, replacing an earlier one whole."""
    cells = out_dir / "cells"
    cells.mkdir(parents=True, exist_ok=True)
    final = cells / result.row["cell"]
    tmp = cells / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, data in result.files.items():
        (tmp / Path(name).name).write_bytes(data)
    (tmp / "cell.json").write_text(json.dumps(result.row, indent=1, default=str) + "\n")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)


def run_pool(cells: list[CellSpec], plan: Plan, done: Done, jobs: int) -> None:
    """The cells on this machine, `jobs` at a time (each in its own process, see sweep_cell)."""

    def one(cell: CellSpec) -> CellResult:
        started = time.monotonic()
        model, calib = plan.models[cell.payload]
        result = run_cell(cell, model, calib, plan.recipe_files.get(cell.recipe))
        result.row["turnaround_s"] = round(time.monotonic() - started, 2)
        return result

    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = {pool.submit(one, c): c for c in cells}
        for future in as_completed(futures):
            cell = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # (the cell's process is the one that can crash)
                result = lost(cell, f"the cell failed before converting: {exc}")
            done(cell, result)
    except BaseException:  # interrupted: the running cells' processes go, the queued never start
        pool.shutdown(wait=False, cancel_futures=True)
        stop_all()
        raise
    pool.shutdown()


def _engine(engine: str, address: str | None) -> str:
    """'ray' (an --address, or asked for) or 'pool' (the local default, see the docstring)."""
    from tflfuse.convert import sweep_ray

    if engine not in ENGINES:
        raise UsageError(f"engine {engine!r} unknown (choose from {', '.join(ENGINES)})")
    if address is None and engine != "ray":
        return "pool"
    if engine == "pool":
        raise UsageError("--address runs on a Ray cluster, not in a local pool")
    if not sweep_ray.available():
        raise UsageError("Ray is not installed: pip install 'tflfuse[sweep]'")
    return "ray"


def sweep(
    plan_path: Path | str,
    output_dir: Path | str,
    *,
    address: str | None = None,
    resume: bool = False,
    jobs: int = 1,
    engine: str = "auto",
    progress: bool = True,
    quiet: bool = False,
) -> SweepResult:
    """Run the plan's cells into `output_dir` (see the module docstring). `jobs`: cells at once
    on this machine (a cluster runs as many as it has CPUs for). Returns a SweepResult."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"jobs must be an integer of at least 1, not {jobs!r}")
    out_dir = Path(output_dir)
    check_output(out_dir, resume)
    kind = _engine(engine, address)
    plan = sweep_plan.load(plan_path, out_dir)  # (a bad plan: nothing written)
    rows: dict[str, SweepRow] = {}
    for cell in plan.cells:
        row = reused_row(out_dir, cell) if resume else None
        if row is not None:
            rows[cell.name] = row
    todo = [c for c in plan.cells if c.name not in rows]
    bars: list[tqdm] = []

    def start(engine_name: str) -> None:  # the engine is ready: say which, then the bar
        reused = f" ({len(rows)} reused)" if rows else ""
        cells = f"{len(todo)} cell{'' if len(todo) == 1 else 's'}"
        _note(f"sweep: {cells}{reused} on {engine_name}", quiet)
        shown = None if progress else True  # (None: tqdm's own choice, off when not a terminal)
        bar = tqdm(
            total=len(plan.cells), initial=len(rows), unit="cell", desc="sweep", disable=shown
        )
        bars.append(bar)

    def done(cell: CellSpec, result: CellResult) -> None:
        write_cell(out_dir, result)
        rows[cell.name] = result.row
        bars[0].set_postfix_str(f"{cell.name}: {result.row['status']}", refresh=False)
        bars[0].update()

    try:
        name = _run(kind, todo, plan, done, start, address=address, jobs=jobs, rows=rows)
    finally:
        for bar in bars:
            bar.close()
    ordered = [rows[c.name] for c in plan.cells if c.name in rows]
    out_dir.mkdir(parents=True, exist_ok=True)  # (the cells made it, unless all were reused)
    sweep_report.write_all(ordered, out_dir, {"plan": str(plan_path), "engine": name})
    return SweepResult(out_dir, ordered, name)


def _run(
    kind: str,
    todo: list[CellSpec],
    plan: Plan,
    done: Done,
    start: Callable[[str], None],
    *,
    address: str | None,
    jobs: int,
    rows: dict[str, SweepRow],
) -> str:
    """Run `todo` on the engine (`start` is told its name first); returns the name."""
    if kind == "pool":
        name = f"a local pool of {jobs} process{'es' if jobs > 1 else ''}"
        start(name)
        run_pool(todo, plan, done, jobs)
        return name
    from tflfuse.convert import sweep_ray

    peaks = sweep_ray.measured_peaks(rows.values())
    with sweep_ray.connected(address, jobs) as name:
        start(name)
        sweep_ray.run_cells(todo, plan, done, peaks)
    return name


def summary(result: SweepResult) -> list[str]:
    """The lines `tflfuse sweep` prints: counts by status and the files written."""
    counts: dict[str, int] = {}
    for row in result.rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    reused = sum(1 for r in result.rows if r.get("reused"))
    text = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    out = result.output_dir
    cells = f"{len(result.rows)} cell{'' if len(result.rows) == 1 else 's'}"
    lines = [f"{out}: {cells} ({text}; {reused} reused) on {result.engine}"]
    written = [out / n for n in ("sweep.json", "sweep.md", "sweep.png") if (out / n).exists()]
    lines.append("  " + ", ".join(str(p) for p in written))
    if importlib.util.find_spec("matplotlib") is None:
        lines.append("  (no sweep.png: it needs matplotlib, pip install 'tflfuse[plot]')")
    return lines


__all__ = ["ENGINES", "SweepResult", "TflfuseError", "summary", "sweep"]
