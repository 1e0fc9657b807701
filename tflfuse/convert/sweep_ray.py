"""The sweep's Ray engine (the `tflfuse[sweep]` extra): cells as Ray tasks, here or on a cluster.

Without an address Ray is started in this process (`ray.init(address="local")`, `jobs` CPUs, its
own temp folder, shut down at the end); with one, the sweep joins that cluster as a driver. Each
cell is a task asking for one CPU and the memory its model was measured to need (the largest
peak RSS of its earlier cells, with a margin; a first guess until one is known), so Ray places
no more conversions on a node than it holds. The model's, calibration's and recipe's bytes go
into Ray's object store once and reach whichever node runs the task: no shared filesystem is
assumed. The task runs the cell's conversion in a process of its own (tflfuse.convert.sweep_cell),
so TensorFlow's memory ends with each conversion, as `max_calls=1` would give without starting a
worker per cell. A task is not retried: a cell whose worker or node dies, or that overruns its
timeout (then cancelled), is one row saying so, and the other cells go on. Results (the row and
the conversion's files) come back to the driver, which writes them into DIR.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tflfuse.convert.sweep_cell import CellResult, CellSpec, Payload, SweepRow, lost, run_cell
from tflfuse.errors import TflfuseError

if TYPE_CHECKING:  # (the type only: the Ray workers need not read plans)
    from tflfuse.convert.sweep_plan import Plan

FIRST_GUESS_MIB = 1024  # a cell's memory request before its model's peak is measured
MARGIN = 1.25  # on a measured peak
GRACE_S = 60  # beyond a cell's own timeout (its process is killed then) before Ray cancels it
Done = Callable[[CellSpec, CellResult], None]


def available() -> bool:
    """True when Ray can be imported."""
    return importlib.util.find_spec("ray") is not None


def _reachable(address: str) -> None:
    """A one-line error now when nothing listens at HOST:PORT (ray.init would retry a while)."""
    host, _, port = address.rpartition(":")
    if "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as exc:
        raise TflfuseError(f"--address {address}: no Ray cluster there ({exc})") from None


def _connect_problem(exc: BaseException) -> str:
    """Why ray.init could not join a cluster, in one line (a missing auth token named)."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None:
        chain.append(cause)
        cause = cause.__cause__
    if any("InvalidAuthToken" in str(e) or "auth" in type(e).__name__.lower() for e in chain):
        return (
            "the cluster wants an auth token: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN"
            " (or RAY_AUTH_TOKEN_PATH) as its nodes have them"
        )
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@contextlib.contextmanager
def connected(address: str | None, jobs: int) -> Iterator[str]:
    """Ray started here (`jobs` CPUs) or joined at `address`; yields how it is described."""
    import ray

    temp = None
    if address is None:
        temp = tempfile.mkdtemp(prefix="tfs-ray-", dir="/tmp")  # short: Ray's socket paths
        ray.init(
            address="local",
            num_cpus=jobs,
            include_dashboard=False,
            _temp_dir=temp,
            log_to_driver=False,
            # ray annotates an int but takes a level's name (its own default is "info")
            logging_level="ERROR",  # type: ignore[arg-type]
        )
        name = f"Ray started here ({jobs} CPU{'s' if jobs > 1 else ''})"
    else:
        _reachable(address)
        try:
            ray.init(
                address=address,
                log_to_driver=False,
                logging_level="ERROR",  # type: ignore[arg-type]  # (a level's name, as above)
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise TflfuseError(f"--address {address}: {_connect_problem(exc)}") from None
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        cpus = int(ray.cluster_resources().get("CPU", 0))
        name = f"the Ray cluster at {address} ({nodes} nodes, {cpus} CPUs)"
    try:
        yield name
    finally:
        ray.shutdown()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


def measured_peaks(rows: Iterable[SweepRow]) -> dict[str, float]:
    """model -> the largest peak RSS (MiB) its cells were measured at."""
    peaks: dict[str, float] = {}
    for row in rows:
        peak = row.get("peak_rss_mib")
        if peak:
            peaks[row["model"]] = max(peaks.get(row["model"], 0.0), float(peak))
    return peaks


def memory_request(cell: CellSpec, peaks: dict[str, float], largest_node: float) -> int:
    """Bytes of memory to ask for: the model's measured peak with a margin, else a first guess;
    never more than the largest node has (the task could never be placed)."""
    mib = peaks[cell.model] * MARGIN if cell.model in peaks else FIRST_GUESS_MIB
    wanted = int(mib * 2**20)
    return min(wanted, int(largest_node)) if largest_node else wanted


def _on_node(
    spec: CellSpec, model: Payload, calib: Payload | None, recipe_file: Payload | None
) -> CellResult:
    """The task: the cell on this node, its row naming the node (host and Ray node id)."""
    import ray

    result = run_cell(spec, model, calib, recipe_file)
    node = ray.get_runtime_context().get_node_id()
    result.row["node"] = f"{socket.gethostname()}/{node[:8]}"
    return result


def why_lost(exc: BaseException, cell: CellSpec, cancelled: bool) -> str:
    """The one line of a task that did not return."""
    import ray.exceptions as rex

    if cancelled:
        return f"timed out: still running {cell.timeout_s + GRACE_S:g} s after it started"
    if isinstance(exc, rex.OutOfMemoryError):
        return "Ray's memory monitor killed its worker (out of memory)"
    if isinstance(exc, rex.WorkerCrashedError):
        return "the Ray worker running it died (killed, or out of memory)"
    if isinstance(exc, rex.NodeDiedError):
        return "the node running it died"
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
    return f"its Ray task failed: {type(exc).__name__}: {first}"


def _largest_node() -> float:
    import ray

    return max((n["Resources"].get("memory", 0) for n in ray.nodes() if n.get("Alive")), default=0)


def run_cells(cells: list[CellSpec], plan: Plan, done: Done, peaks: dict[str, float]) -> None:
    """Submit the cells as tasks, no more at once than the cluster has CPUs (so later cells ask
    for the memory measured on earlier ones), and hand each result to `done` as it arrives."""
    import ray

    scheduler = _Scheduler(plan, done, peaks, deque(cells))
    try:
        scheduler.run()
    except BaseException:  # interrupted: the cluster stops converting for this sweep
        for ref in scheduler.running:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise


@dataclass
class _Scheduler:
    """The cells waiting (`queue`) and running (task ref -> cell, when submitted)."""

    plan: Plan
    done: Done
    peaks: dict[str, float]
    queue: deque[CellSpec]
    running: dict[Any, tuple[CellSpec, float]] = field(default_factory=dict)
    cancelled: set[Any] = field(default_factory=set)
    stored: dict[int, Any] = field(default_factory=dict)  # id(payload) -> its object ref

    def run(self) -> None:
        import ray

        task = ray.remote(num_cpus=1, max_retries=0)(_on_node)
        capacity = max(1, int(ray.cluster_resources().get("CPU", 1)))
        largest = _largest_node()
        while self.queue or self.running:
            while self.queue and len(self.running) < capacity:
                cell = self.queue.popleft()
                model, calib = self.plan.models[cell.payload]
                args = [
                    self.put(p) for p in (model, calib, self.plan.recipe_files.get(cell.recipe))
                ]
                memory = memory_request(cell, self.peaks, largest)
                ref = task.options(memory=memory).remote(cell, *args)
                self.running[ref] = (cell, time.monotonic())
            ready, _ = ray.wait(list(self.running), num_returns=1, timeout=5)
            for ref in ready:
                self.collect(ref)
            self.cancel_overdue()

    def put(self, payload: Payload | None) -> Any:
        """The payload in Ray's object store, once per payload (None stays None)."""
        import ray

        if payload is None:
            return None
        if id(payload) not in self.stored:
            self.stored[id(payload)] = ray.put(payload)
        return self.stored[id(payload)]

    def collect(self, ref: Any) -> None:
        import ray

        cell, started = self.running.pop(ref)
        try:
            result = ray.get(ref)
        except Exception as exc:  # the task did not return: one row says why
            result = lost(cell, why_lost(exc, cell, ref in self.cancelled))
        result.row["turnaround_s"] = round(time.monotonic() - started, 2)
        peak = result.row.get("peak_rss_mib")
        if peak:
            self.peaks[cell.model] = max(self.peaks.get(cell.model, 0.0), peak)
        self.done(cell, result)

    def cancel_overdue(self) -> None:
        """Cancel a task still running GRACE_S after its cell's own timeout (a hung node)."""
        import ray

        now = time.monotonic()
        for ref, (cell, started) in self.running.items():
            if ref not in self.cancelled and now - started > cell.timeout_s + GRACE_S:
                self.cancelled.add(ref)
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
