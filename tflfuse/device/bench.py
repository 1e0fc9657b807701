"""The timing protocol shared by the host (`tflfuse bench`) and the device (`bench_on_device.py`).

Protocol: every model gets an interpreter (init time measured, including `allocate_tensors`),
seeded inputs (the same values for models with the same input signature) and one first
inference (timed apart: it pays lazy delegate preparation and cold caches). Then `warmup` and
`runs` rounds, each invoking every model once in the given order (A B C A B C ...), so that
machine drift (frequency scaling, other load) hits all models alike. Only `invoke()` is inside
the timer (`time.perf_counter_ns`). Results are percentiles, jitter (p99 - p50) and ratios
against the first model, never a lone absolute time.

Memory: `peak_rss_bytes` is the process's peak resident set (all models together);
`rss_delta_bytes` is the resident set a model added while its interpreter was built and first
run. The interpreter does not expose its arena size, so `arena_bytes_estimate` replays TFLite's
greedy-by-size arena plan over the tensor lifetimes of the undelegated graph (subgraph 0,
64-byte alignment): a lower bound on the activation arena that leaves out kernel scratch
buffers and delegate-owned memory.

This module is shipped in the device bundle: it must stay Python 3.8 syntax and import only
numpy, the standard library and `tflfuse.device` (tqdm is used when present).
"""

from __future__ import annotations

import io
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tflfuse.device.interpreter import check_delegate_name, interpreter_package, make_interpreter
from tflfuse.errors import TflfuseError

if TYPE_CHECKING:  # the result's shape, for the type checker (a device's Python may lack these)
    from typing import TypedDict

    from tflfuse.device.interpreter import Interpreter, TensorDetails

    class StaticFacts(TypedDict, total=False):  # empty when the plain interpreter cannot build
        op_count: int
        op_counts: dict[str, int]
        arena_bytes_estimate: int

    class ModelBench(StaticFacts, total=False):
        """One model of a result: as `_load` measured it, then its latencies and ratios."""

        name: str
        path: str
        init_ms: float
        first_invoke_ms: float
        rss_delta_bytes: int | None
        latency_ms: dict[str, float]  # latency_stats
        samples_ms: list[float]
        ratio_to_first: dict[str, float | None]

    class BenchProtocol(TypedDict):
        delegate: str
        threads: int | None
        runs: int
        warmup: int
        seed: int
        order: str
        timer: str

    class Environment(TypedDict):
        python: str
        platform: str
        machine: str
        cpu_count: int | None
        interpreter: str
        numpy: str

    class BenchResult(TypedDict):
        """`run_benchmark`'s result (JSON as written)."""

        protocol: BenchProtocol
        environment: Environment
        peak_rss_bytes: int | None
        models: list[ModelBench]


PERCENTILES = (50, 90, 99)
ALIGNMENT = 64


# -- inputs --------------------------------------------------------------------------------------
def seeded_input_values(details: Sequence[TensorDetails], seed: int = 0) -> list[np.ndarray]:
    """One input set matching the interpreter's input details, reproducible from `seed`.
    Uses numpy's legacy `RandomState`, which old device images (numpy 1.16 on Coral's Mendel)
    still have, so host and device generate the same values."""
    rng = np.random.RandomState(seed)
    values = []
    for d in details:
        shape, dtype = tuple(int(s) for s in d["shape"]), np.dtype(d["dtype"])
        if dtype.kind == "f":
            values.append(rng.uniform(-1.0, 1.0, shape).astype(dtype))
        elif dtype == np.bool_:
            values.append(rng.randint(0, 2, shape).astype(bool))
        elif dtype.kind in "iu" and dtype.itemsize == 1:
            info = np.iinfo(dtype)
            values.append(rng.randint(int(info.min), int(info.max) + 1, shape).astype(dtype))
        elif dtype.kind in "iu":
            values.append(rng.randint(0, 10, shape).astype(dtype))
        else:
            raise TflfuseError(f"cannot generate benchmark inputs of dtype {dtype}")
    return values


# -- static facts from an undelegated interpreter ------------------------------------------------
def _tensor_bytes(detail: TensorDetails) -> int:
    try:
        itemsize = np.dtype(detail["dtype"]).itemsize
    except TypeError:
        return 0
    return int(np.prod([max(int(s), 1) for s in detail["shape"]])) * itemsize


def plan_arena(sizes: dict[int, int], lifetimes: dict[int, tuple[int, int]]) -> int:
    """Arena bytes of a greedy-by-size plan: tensors in decreasing size, each at the lowest
    64-byte-aligned offset that does not overlap a placed tensor alive at the same time."""
    placed: list[tuple[int, int, int, int]] = []  # offset, end, first, last
    high = 0
    order = sorted(sizes, key=lambda t: (-sizes[t], lifetimes[t][0], t))
    for t in order:
        size = -(-sizes[t] // ALIGNMENT) * ALIGNMENT
        first, last = lifetimes[t]
        busy = sorted((o, e) for o, e, f, lst in placed if f <= last and first <= lst)
        offset = 0
        for o, e in busy:
            if offset + size <= o:
                break
            offset = max(offset, e)
        placed.append((offset, offset + size, first, last))
        high = max(high, offset + size)
    return high


def static_facts(model: bytes | str | Path) -> StaticFacts:
    """Op count, op types and the arena estimate, from an interpreter with plain kernels (the
    graph as written, before any delegate replaces nodes). Empty when that cannot be built
    (e.g. an `_edgetpu` model, whose custom op only the Edge TPU delegate resolves)."""
    try:
        interp = make_interpreter(model, delegate="none")
        ops = interp._get_ops_details()
        tensors = {d["index"]: d for d in interp.get_tensor_details()}
    except (TflfuseError, AttributeError, ValueError, RuntimeError):
        return {}  # old tflite_runtime builds lack _get_ops_details; facts are optional
    inputs = [int(d["index"]) for d in interp.get_input_details()]
    outputs = [int(d["index"]) for d in interp.get_output_details()]
    lifetimes: dict[int, list[int]] = {t: [0, 0] for t in inputs}
    for i, op in enumerate(ops):
        for t in op["outputs"]:
            lifetimes.setdefault(int(t), [i, i])
        for t in op["inputs"]:
            if int(t) in lifetimes:
                lifetimes[int(t)][1] = max(lifetimes[int(t)][1], i)
    for t in outputs:
        if t in lifetimes:
            lifetimes[t][1] = len(ops)
    sizes = {t: _tensor_bytes(tensors[t]) for t in lifetimes if t in tensors}
    counts: dict[str, int] = {}
    for op in ops:
        counts[op["op_name"]] = counts.get(op["op_name"], 0) + 1
    return {
        "op_count": len(ops),
        "op_counts": dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        "arena_bytes_estimate": plan_arena(
            sizes, {t: cast("tuple[int, int]", tuple(lifetimes[t])) for t in sizes}
        ),
    }


# -- memory --------------------------------------------------------------------------------------
def current_rss_bytes() -> int | None:
    """Resident set size now (Linux /proc), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def peak_rss_bytes() -> int | None:
    """Peak resident set size of this process so far, else None where unsupported."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


# -- statistics ----------------------------------------------------------------------------------
def latency_stats(samples_ms: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/min/max/mean/std and jitter (p99 - p50) of latencies in milliseconds."""
    a = np.asarray(samples_ms, dtype=np.float64)
    stats = {f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES}
    stats.update(min=float(a.min()), max=float(a.max()), mean=float(a.mean()), std=float(a.std()))
    stats["jitter"] = stats["p99"] - stats["p50"]
    return stats


def ratios(models: list[ModelBench]) -> None:
    """Add `ratio_to_first` (this model's statistic / the first model's) to every model."""
    base = models[0]["latency_ms"]
    for m in models:
        m["ratio_to_first"] = {
            k: (m["latency_ms"][k] / base[k] if base[k] > 0 else None)
            for k in ("p50", "p90", "p99", "mean")
        }
        for key in ("op_count", "arena_bytes_estimate"):
            if m.get(key) and models[0].get(key):
                m["ratio_to_first"][key] = m[key] / models[0][key]


# -- the protocol --------------------------------------------------------------------------------
def environment() -> Environment:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "interpreter": interpreter_package(),
        "numpy": np.__version__,
    }


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="bench", unit="inv", file=sys.stderr, leave=False)


# more interpreter threads than this is a typo: the pool starts every one of them (100000 aborts
# the process when thread creation fails), and no machine tflfuse targets has the cores
THREADS_MAX = 1024


def check_arguments(*, runs: int, warmup: int, threads: int | None, prefix: str = "") -> None:
    """One-line errors for counts the interpreter would refuse or misread (before any work);
    `prefix` "--" names them as the command line does."""
    for name, value, least in (("runs", runs, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise TflfuseError(f"{prefix}{name} must be at least {least}, not {value!r}")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise TflfuseError(
            f"{prefix}threads must be at least 1, not {threads!r} (leave it out for the default)"
        )
    if threads is not None and threads > THREADS_MAX:
        raise TflfuseError(
            f"{prefix}threads must be at most {THREADS_MAX}, not {threads} (the interpreter"
            " starts that many threads; past the system's limit it aborts)"
        )


def run_benchmark(
    models: Sequence[str | Path],
    *,
    delegate: str = "xnnpack",
    runs: int = 100,
    warmup: int = 10,
    threads: int | None = None,
    seed: int = 0,
    names: Sequence[str] | None = None,
    progress: bool = True,
    on_round: Callable[[int], None] | None = None,
) -> BenchResult:
    """Benchmark `models` interleaved under one delegate; a JSON-ready result dict."""
    if not models:
        raise TflfuseError("no models to benchmark")
    check_arguments(runs=runs, warmup=warmup, threads=threads)
    check_delegate_name(delegate)
    paths = _model_files(models)
    labels = list(names) if names else [p.name for p in paths]
    if len(set(labels)) != len(labels):
        labels = [str(p) for p in paths]

    entries: list[ModelBench] = []
    interps, feeds = [], []
    for label, path in zip(labels, paths):
        entry, interp, feed = _load(label, path, delegate=delegate, threads=threads, seed=seed)
        entries.append(entry)
        interps.append(interp)
        feeds.append(feed)

    samples = _interleaved_rounds(interps, feeds, runs, warmup, progress, on_round)
    for entry, s in zip(entries, samples):
        entry["latency_ms"] = latency_stats(s)
        entry["samples_ms"] = s
    ratios(entries)
    return {
        "protocol": {
            "delegate": delegate,
            "threads": threads,
            "runs": runs,
            "warmup": warmup,
            "seed": seed,
            "order": "interleaved",
            "timer": "time.perf_counter_ns around invoke()",
        },
        "environment": environment(),
        "peak_rss_bytes": peak_rss_bytes(),
        "models": entries,
    }


def _model_files(models: Sequence[str | Path]) -> list[Path]:
    """The model paths, refused in one line when one is missing or empty (before any loading)."""
    paths = [Path(m) for m in models]
    for p in paths:
        if not p.is_file():
            raise TflfuseError(f"{p}: no such model file")
        if p.stat().st_size == 0:
            raise TflfuseError(f"{p}: the model file is empty")
    return paths


def _load(
    label: str, path: Path, *, delegate: str, threads: int | None, seed: int
) -> tuple[ModelBench, Interpreter, list[tuple[TensorDetails, np.ndarray]]]:
    """(entry, interpreter, feed) of one model: its static facts, init time, first invoke time and
    resident memory growth, measured as it loads; the feed is its seeded inputs, set each round."""
    entry: ModelBench = {"name": label, "path": str(path)}
    entry.update(static_facts(path))
    rss0 = current_rss_bytes()
    t0 = time.perf_counter_ns()
    try:
        interp = make_interpreter(path, delegate=delegate, threads=threads)
    except TflfuseError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise TflfuseError(f"{path}: {exc}") from None
    entry["init_ms"] = (time.perf_counter_ns() - t0) / 1e6
    try:
        details = interp.get_input_details()
    except UnicodeDecodeError:  # the interpreter decodes the names strictly
        raise TflfuseError(
            f"{path}: an input's name is not valid UTF-8 (a damaged file?)"
        ) from None
    values = seeded_input_values(details, seed)
    for d, v in zip(details, values):
        interp.set_tensor(d["index"], v)
    t0 = time.perf_counter_ns()
    interp.invoke()
    entry["first_invoke_ms"] = (time.perf_counter_ns() - t0) / 1e6
    rss1 = current_rss_bytes()
    entry["rss_delta_bytes"] = rss1 - rss0 if rss0 is not None and rss1 is not None else None
    return entry, interp, list(zip(details, values))


def _interleaved_rounds(
    interps: list[Interpreter],
    feeds: list[list[tuple[TensorDetails, np.ndarray]]],
    runs: int,
    warmup: int,
    progress: bool,
    on_round: Callable[[int], None] | None,
) -> list[list[float]]:
    """Milliseconds of each model's timed invokes: every round invokes every model once, in turn,
    so drift in the machine's load falls on all of them alike; warm-up rounds are not kept."""
    samples: list[list[float]] = [[] for _ in interps]
    bar = _progress((warmup + runs) * len(interps), progress)
    try:
        for r in range(warmup + runs):
            for i, interp in enumerate(interps):
                for d, v in feeds[i]:
                    interp.set_tensor(d["index"], v)
                t0 = time.perf_counter_ns()
                interp.invoke()
                elapsed = time.perf_counter_ns() - t0
                if r >= warmup:
                    samples[i].append(elapsed / 1e6)
            if bar is not None:
                bar.update(len(interps))
            if on_round is not None:
                on_round(r)
    finally:
        if bar is not None:
            bar.close()
    return samples


# -- output --------------------------------------------------------------------------------------
def format_table(result: BenchResult) -> str:
    """A plain-text table of one benchmark result (milliseconds, ratios to the first model)."""
    p = result["protocol"]
    lines = [
        f"delegate {p['delegate']}, threads {p['threads'] or 'default'}, "
        f"{p['runs']} runs after {p['warmup']} warm-up, interleaved",
        f"{'model':<36} {'ops':>5} {'p50':>8} {'p90':>8} {'p99':>8} {'jitter':>8} "
        f"{'init':>8} {'first':>8} {'arena':>9} {'x p50':>6}",
    ]
    for m in result["models"]:
        lat = m["latency_ms"]
        arena = m.get("arena_bytes_estimate")
        lines.append(
            f"{m['name'][:36]:<36} {m.get('op_count', '-')!s:>5} {lat['p50']:8.3f} "
            f"{lat['p90']:8.3f} {lat['p99']:8.3f} {lat['jitter']:8.3f} {m['init_ms']:8.1f} "
            f"{m['first_invoke_ms']:8.3f} {(f'{arena / 1024:.0f}K' if arena else '-'):>9} "
            f"{m['ratio_to_first']['p50']:6.2f}"
        )
    peak = result.get("peak_rss_bytes")
    if peak:
        lines.append(f"peak RSS {peak / 2**20:.1f} MiB (all models); times in ms")
    return "\n".join(lines)


def plot_latencies(result: BenchResult, path: str | Path) -> None:
    """Violin + box plot of every model's latency samples, written atomically as PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TflfuseError("--plot needs matplotlib: pip install 'tflfuse[plot]'") from None
    from tflfuse.files import atomic_write_bytes  # host only: a bundle ships no files.py

    models = result["models"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(models) + 2), 4.5))
    data = [m["samples_ms"] for m in models]
    ax.violinplot(data, showextrema=False)
    ax.boxplot(data, whis=(1, 99), showfliers=False, widths=0.15)
    ax.set_xticks(range(1, len(models) + 1))
    ax.set_xticklabels([m["name"] for m in models], rotation=20, ha="right", fontsize=8)
    p = result["protocol"]
    medians = [float(np.median(d)) for d in data if len(d)]
    if medians and min(medians) > 0 and max(medians) / min(medians) > 20:
        ax.set_yscale("log")  # models of very different size stay readable
    ax.set_ylabel("invoke() latency, ms")
    ax.set_title(
        f"{p['delegate']}, {p['runs']} interleaved runs\n(box: p25-p75, whiskers: p1-p99)",
        fontsize=10,
    )
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(Path(path), buffer.getvalue())
