"""What a sweep writes beside its cells: sweep.json (the rows), sweep.md (the table), sweep.png.

sweep.json is the list of rows, in plan order (the fields: ROW_FIELDS). sweep.md is one table
like benchmarks/CORPUS.md, the failures listed first. sweep.png puts each converted cell's
error against what it bought, stock and fused joined by an arrow: one panel of the Edge TPU
cells against the share of ops the Edge TPU maps, one of the others against the p50 latency
relative to stock (timed sweeps) or the op count relative to unfused. It needs matplotlib (the
`plot` extra); without it the picture is left out and the sweep's summary says so.
"""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tflfuse.files import atomic_write_text
from tflfuse.json_types import JSONDict

if TYPE_CHECKING:
    from tflfuse.convert.sweep_cell import SweepRow

ROW_FIELDS = (
    "model",  # the plan's name of the model
    "recipe",
    "options",  # {option: value} of this cell
    "cell",  # its folder under DIR/cells
    "status",  # converted, refused, crash, timeout, lost
    "exit",  # the conversion's exit code (negative: a signal; None: timed out or lost)
    "line",  # the one line a refusal, crash or timeout printed
    "ops",  # {unfused, stock, fused}
    "edgetpu_mapped",  # {stock, fused}: ops predicted on the Edge TPU (Edge TPU targets)
    "max_error",  # {stock, fused}: max abs error against the float source
    "p50_ratio",  # fused / stock (when timed)
    "seconds",  # the conversion's wall time
    "peak_rss_mib",  # of the conversion and its children
    "node",  # where it ran
    "turnaround_s",  # from handing the cell to the engine to its result back here
    "reused",  # taken from an earlier sweep (--resume)
)


def write_all(rows: list[SweepRow], out_dir: Path, meta: JSONDict) -> bool:
    """sweep.json, sweep.md and (with matplotlib) sweep.png; True when the picture was drawn."""
    atomic_write_text(out_dir / "sweep.json", json.dumps(rows, indent=1, default=str) + "\n")
    atomic_write_text(out_dir / "sweep.md", markdown(rows, meta))
    if importlib.util.find_spec("matplotlib") is None:
        return False
    return plot(rows, out_dir / "sweep.png")


def _g(x: Any, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt)


def _pair(d: dict[str, Any] | None, keys: tuple[str, ...], fmt: str, sep: str = " / ") -> str:
    if not d:
        return "-"
    return sep.join(_g(d.get(k), fmt) for k in keys)


def _options(row: SweepRow) -> str:
    return ", ".join(f"{k}={v}" for k, v in (row.get("options") or {}).items()) or "-"


def markdown(rows: list[SweepRow], meta: JSONDict) -> str:
    """The table of a sweep, failures first (see the module docstring)."""
    counts = Counter(r["status"] for r in rows)
    lines = [
        "# Sweep",
        "",
        f"Plan `{meta.get('plan')}`, run on {meta.get('engine')}: **{len(rows)} cells, "
        + ", ".join(f"{n} {s}" for s, n in counts.most_common())
        + f"** ({sum(1 for r in rows if r.get('reused'))} reused from an earlier sweep).",
        "",
        "Columns: ops unfused/stock/fused; error = max |model - float source| on the report's"
        " check inputs, stock / fused; Edge TPU = ops predicted mapped, stock → fused; p50 ="
        " fused/stock latency ratio (XNNPACK, one thread, interleaved); s = conversion wall"
        " time; RSS = its peak resident memory.",
        "",
        "## Failures",
        "",
    ]
    failed = [r for r in rows if r["status"] != "converted"]
    lines += [f"- {r['cell']}: **{r['status']}** — `{r['line']}`" for r in failed] or ["None."]
    lines += [
        "",
        "## Every cell",
        "",
        "| model | recipe | options | result | ops | error stock / fused | Edge TPU | p50"
        " fused/stock | s | RSS MiB | node |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        result = r["status"] if r["status"] == "converted" else f"**{r['status']}** ({r['exit']})"
        result += " (reused)" if r.get("reused") else ""
        lines.append(
            f"| {r['model']} | {r['recipe']} | {_options(r)} | {result} |"
            f" {_pair(r.get('ops'), ('unfused', 'stock', 'fused'), 'd', '/')} |"
            f" {_pair(r.get('max_error'), ('stock', 'fused'), '.2g')} |"
            f" {_pair(r.get('edgetpu_mapped'), ('stock', 'fused'), 'd', ' → ')} |"
            f" {_g(r.get('p50_ratio'), '.2f')} | {_g(r.get('seconds'), '.0f')} |"
            f" {_g(r.get('peak_rss_mib'), '.0f')} | {r.get('node') or '-'} |"
        )
    return "\n".join(lines) + "\n"


def _mapped_share(r: Mapping[str, Any]) -> dict[str, Any]:
    m, ops = r.get("edgetpu_mapped") or {}, r.get("edgetpu_ops") or r.get("ops") or {}
    return {k: m[k] / ops[k] if m.get(k) is not None and ops.get(k) else None for k in m}


def _latency(r: Mapping[str, Any]) -> dict[str, Any]:
    return {"stock": 1.0, "fused": r.get("p50_ratio")}


def _op_share(r: Mapping[str, Any]) -> dict[str, Any]:
    o = r.get("ops") or {}
    base = o.get("unfused")
    return {k: o[k] / base if base and o.get(k) else None for k in ("stock", "fused")}


def _panels(rows: list[SweepRow]) -> list[tuple[str, Any, list[SweepRow]]]:
    """(x label, row -> {stock, fused} x values, rows): the Edge TPU cells against their mapping,
    the others against their latency ratio (timed sweeps) or op count."""
    tpu = [r for r in rows if r.get("edgetpu_mapped")]
    rest = [r for r in rows if not r.get("edgetpu_mapped")]
    panels = []
    if tpu:
        panels.append(("share of ops mapped to the Edge TPU (predicted)", _mapped_share, tpu))
    if rest and any(r.get("p50_ratio") for r in rest):
        panels.append(("p50 latency, relative to stock", _latency, rest))
    elif rest:
        panels.append(("ops, relative to unfused", _op_share, rest))
    return panels


def _draw(ax: Any, label: str, x_of: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab10")
    for i, r in enumerate(rows):
        xs, err = x_of(r), r["max_error"]
        pts = {k: (xs.get(k), max(err.get(k) or 0.0, 1e-9)) for k in ("stock", "fused")}
        if any(x is None for x, _ in pts.values()):
            continue
        color = colors(i % 10)
        (sx, sy), (fx, fy) = pts["stock"], pts["fused"]
        ax.annotate("", (fx, fy), (sx, sy), arrowprops={"arrowstyle": "->", "color": color})
        ax.scatter([sx], [sy], facecolors="none", edgecolors=[color], s=40)
        ax.scatter([fx], [fy], color=color, s=40)
        ax.annotate(r["cell"], (fx, fy), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlabel(label)
    ax.grid(True, alpha=0.3)


def plot(rows: list[SweepRow], path: Path) -> bool:
    """sweep.png (see the module docstring); False when no cell converted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _panels([r for r in rows if r["status"] == "converted" and r.get("max_error")])
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5.5), dpi=110)
    for ax, (label, x_of, members) in zip(list(np.atleast_1d(axes)), panels):
        _draw(ax, label, x_of, members)
    np.atleast_1d(axes)[0].set_ylabel("max abs error against the float source (log)")
    fig.suptitle("Each cell: stock (hollow) → fused (filled)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
