"""`tflfuse sweep`: plans read into cells, cells run as real conversions (a local pool here, a
real two-node Ray cluster on 127.0.0.1 when Ray is installed), rows, tables and --resume.

The models are tiny IR-built .tflite files (a conversion is ~10 s, mostly imports). A cell must
give the same files as a standalone convert, wherever it ran; a refused, timed-out or killed cell
is one row and the others go on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tests.irgraphs as ig
from tflfuse.cli import main
from tflfuse.convert import sweep_plan
from tflfuse.convert.sweep import sweep
from tflfuse.convert.sweep_cell import remove_stale
from tflfuse.convert.sweep_report import ROW_FIELDS
from tflfuse.ir import Graph, Model, flatbuffer

pytest.importorskip("litert_quantizer")


def tiny(width: int) -> bytes:
    """conv(RELU) -> conv on an 8x8x3 input: an Edge TPU and XNNPACK model in a few ops."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 3))
    g.inputs = [x]
    c1 = ig.conv(g, x, width, act="RELU", name="c1")
    c2 = ig.conv(g, c1.output, 4, name="c2")
    g.outputs = [c2.output]
    model = Model([g])
    model.validate()
    return flatbuffer.to_bytes(model)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sweep-inputs")
    (folder / "a.tflite").write_bytes(tiny(8))
    (folder / "b.tflite").write_bytes(tiny(16))
    (folder / "broken.tflite").write_bytes(b"TFL3" + b"\x00" * 60)
    rng = np.random.default_rng(0)
    np.save(folder / "calib.npy", rng.uniform(-1, 1, (8, 8, 8, 3)).astype(np.float32))
    return folder


def write_plan(folder: Path, text: str, name: str = "plan.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def standalone(model: Path, recipe: str, calib: Path, out: Path) -> Path:
    """What `tflfuse convert MODEL --recipe R --calib C -o OUT` writes."""
    assert (
        main(
            [
                "convert",
                str(model),
                "--recipe",
                recipe,
                "--calib",
                str(calib),
                "-o",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    return out


# -- plans ---------------------------------------------------------------------------------------
def test_a_plan_is_models_x_recipes_x_option_values(inputs: Path, tmp_path: Path) -> None:
    plan = write_plan(
        inputs,
        'recipes = ["edgetpu", "xnnpack-int8"]\nchannels_last = [false, true]\n'
        '[[model]]\npath = "a.tflite"\ncalib = "calib.npy"\n'
        '[[model]]\npath = "b.tflite"\nseed = [0, 3]\nrecipes = ["cpu-float"]\n',
        "grid.toml",
    )
    cells = sweep_plan.load(plan, tmp_path).cells
    names = [c.name for c in cells]
    assert names == [
        "a.edgetpu",
        "a.xnnpack-int8",
        "a.edgetpu.cl",
        "a.xnnpack-int8.cl",
        "b.cpu-float",
        "b.cpu-float.seed3",
        "b.cpu-float.cl",
        "b.cpu-float.cl.seed3",
    ]
    flags = {c.name: c.flags for c in cells}
    assert flags["a.edgetpu"] == () and flags["b.cpu-float.cl.seed3"] == (
        "--channels-last",
        "--seed",
        "3",
    )
    assert len({c.key for c in cells}) == len(cells)  # every cell its own inputs
    again = {c.name: c.key for c in sweep_plan.load(plan, tmp_path).cells}
    assert again == {c.name: c.key for c in cells}  # the key is a hash of the inputs, stable


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('recipes = ["edgetpu"]\nmodels = 1\n', "unknown key 'models'"),
        ('recipes = ["edgetpu"]\n', "no [[model]] table"),
        ('recipes = []\n[[model]]\npath = "a.tflite"\n', "recipes must be a non-empty list"),
        ('recipes = ["nope"]\n[[model]]\npath = "a.tflite"\n', "unknown recipe 'nope'"),
        ('recipes = ["edgetpu"]\n[[model]]\npath = "gone.tflite"\n', "path"),
        ('recipes = ["edgetpu"]\n[[model]]\npath = "a.tflite"\nsize = 96\n', "size is for example"),
        (
            'recipes = ["edgetpu"]\nseed = "x"\n[[model]]\npath = "a.tflite"\n',
            "seed must be an integer",
        ),
        (
            'recipes = ["edgetpu"]\n[[model]]\npath = "a.tflite"\n[[model]]\npath = "a.tflite"\n',
            "two cells",
        ),
        ('recipes = ["edgetpu"\n', "not valid TOML"),
    ],
)
def test_a_bad_plan_is_one_line_before_any_work(inputs, tmp_path, capsys, text, words) -> None:
    plan = write_plan(tmp_path, text)
    for name in ("a.tflite", "calib.npy"):
        (tmp_path / name).write_bytes((inputs / name).read_bytes())
    assert main(["sweep", str(plan), "-o", str(tmp_path / "out"), "--engine", "pool"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("tflfuse: error")]
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_folder_that_is_not_a_sweep_is_not_touched(inputs, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    plan = write_plan(
        tmp_path, f'recipes = ["edgetpu"]\n[[model]]\npath = "{inputs / "a.tflite"}"\n'
    )
    assert main(["sweep", str(plan), "-o", str(out), "--engine", "pool"]) == 2
    assert "not a sweep's folder" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


# -- a local sweep -------------------------------------------------------------------------------
LOCAL_PLAN = """
recipes = ["edgetpu"]
[[model]]
path = "a.tflite"
calib = "calib.npy"
[[model]]
path = "broken.tflite"
calib = "calib.npy"
[[model]]
name = "slow"
path = "b.tflite"
calib = "calib.npy"
timeout_s = 1.5
"""


@pytest.fixture(scope="module")
def local_sweep(inputs: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("local") / "sweep"
    plan = write_plan(inputs, LOCAL_PLAN, "local.toml")
    return plan, out, sweep(plan, out, engine="pool", jobs=2, progress=False, quiet=True)


def test_a_local_sweep_writes_a_row_per_cell_and_the_rest_go_on(local_sweep, inputs, tmp_path):
    _, out, result = local_sweep
    rows = {r["cell"]: r for r in result.rows}
    assert list(rows) == ["a.edgetpu", "broken.edgetpu", "slow.edgetpu"]
    assert all(set(ROW_FIELDS) <= set(r) for r in rows.values())
    a, broken, slow = rows.values()
    assert a["status"] == "converted" and a["exit"] == 0 and a["line"] == ""
    assert a["ops"] == {"unfused": 7, "stock": 4, "fused": 4}
    assert a["edgetpu_mapped"] == {"stock": 4, "fused": 4}
    assert 0 < a["max_error"]["fused"] < 0.5 and a["peak_rss_mib"] > 20
    assert broken["status"] == "refused" and broken["exit"] == 2
    assert broken["line"].startswith("tflfuse: error: broken.tflite: ")  # not the temp folder
    assert slow["status"] == "timeout" and slow["line"] == "timed out after 1.5 s"
    assert json.loads((out / "sweep.json").read_text()) == result.rows
    table = (out / "sweep.md").read_text()
    assert "| a | edgetpu | - | converted | 7/4/4 |" in table and "**timeout**" in table
    # the cell's files are those of a standalone convert, byte for byte
    alone = standalone(inputs / "a.tflite", "edgetpu", inputs / "calib.npy", tmp_path / "alone")
    for name in ("model.tflite", "model_stock.tflite", "model_unfused.tflite"):
        assert (out / "cells" / "a.edgetpu" / name).read_bytes() == (alone / name).read_bytes()
    assert sorted(p.name for p in (out / "cells" / "broken.edgetpu").iterdir()) == ["cell.json"]


def test_resume_reuses_cells_whose_inputs_hash_the_same(local_sweep, inputs, tmp_path) -> None:
    plan, out, first = local_sweep
    made = (out / "cells" / "a.edgetpu" / "model.tflite").stat().st_mtime_ns
    again = sweep(plan, out, resume=True, engine="pool", progress=False, quiet=True)
    assert [r["reused"] for r in again.rows] == [True, True, True]
    assert [r["status"] for r in again.rows] == [r["status"] for r in first.rows]
    assert (out / "cells" / "a.edgetpu" / "model.tflite").stat().st_mtime_ns == made
    # other calibration bytes: a cell of its own, converted again
    np.save(tmp_path / "calib.npy", np.load(inputs / "calib.npy")[:4])
    changed = plan.read_text().replace('"calib.npy"', f'"{tmp_path / "calib.npy"}"', 1)
    moved = write_plan(inputs, changed, "changed.toml")
    third = sweep(moved, out, resume=True, engine="pool", progress=False, quiet=True)
    assert [r["reused"] for r in third.rows] == [False, True, True]
    assert third.rows[0]["status"] == "converted"


def test_without_resume_an_earlier_sweep_is_refused(local_sweep, capsys) -> None:
    plan, out, _ = local_sweep
    assert main(["sweep", str(plan), "-o", str(out), "--engine", "pool"]) == 2
    assert "--resume reuses its cells" in capsys.readouterr().err


def test_sweep_png_is_drawn(local_sweep) -> None:
    pytest.importorskip("matplotlib")
    _, out, _ = local_sweep
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_engine_ray_without_an_address_starts_ray_here_and_says_so(inputs, tmp_path) -> None:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (the tflfuse[sweep] extra)")
    plan = write_plan(
        tmp_path, f'recipes = ["cpu-float"]\n[[model]]\npath = "{inputs / "a.tflite"}"\n'
    )
    # a new local Ray cluster writes ~/.ray/auth_token: a HOME of the test's own
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(tmp_path)
    argv = ["sweep", str(plan), "-o", str(tmp_path / "s"), "--engine", "ray", "--json"]
    run = subprocess.run(
        [sys.executable, "-m", "tflfuse.cli", *argv],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == ["tflfuse: sweep: 1 cell on Ray started here (1 CPU)"]
    (row,) = json.loads(run.stdout)
    assert row["status"] == "converted" and row["ops"]["fused"] == 2, row
    assert row["node"].count("/") == 1  # HOST/RAY-NODE-ID: it ran as a Ray task


# -- a real two-node Ray cluster -----------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    if importlib.util.find_spec("ray") is None:  # (not imported: Ray reads its env on import)
        pytest.skip("Ray is not installed (the tflfuse[sweep] extra)")
    from tests.raycluster import Cluster, ray_executable

    if ray_executable() is None:
        pytest.skip("no `ray` command beside this Python")
    with Cluster(nodes=2, cpus=1) as c:
        yield c


CLUSTER_PLAN = """
recipes = ["edgetpu", "xnnpack-int8"]
[[model]]
path = "a.tflite"
calib = "calib.npy"
[[model]]
path = "b.tflite"
calib = "calib.npy"
[[model]]
path = "victim.tflite"
calib = "calib.npy"
recipes = ["edgetpu"]
"""


def _kill_the_worker_converting(marker: str, stop: threading.Event) -> list[int]:
    """Kill (SIGKILL) the Ray worker whose conversion reads a file named `marker`."""
    import psutil

    killed: list[int] = []
    while not stop.is_set() and not killed:
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if "convert" in cmd and any(arg.endswith(marker) for arg in cmd):
                parent = proc.parent()
                if parent is not None:
                    os.kill(parent.pid, signal.SIGKILL)
                    killed.append(parent.pid)
                break
        time.sleep(0.2)
    return killed


@pytest.mark.slow
def test_a_cluster_sweep_runs_on_both_nodes_and_a_killed_worker_loses_only_its_cell(
    cluster, inputs, tmp_path
) -> None:
    """Five cells on two one-CPU nodes; the worker converting `victim` is killed mid-way."""
    (inputs / "victim.tflite").write_bytes(tiny(12))
    plan = write_plan(inputs, CLUSTER_PLAN, "cluster.toml")
    stop, killed = threading.Event(), []
    hunter = threading.Thread(
        target=lambda: killed.extend(_kill_the_worker_converting("victim.tflite", stop))
    )
    hunter.start()
    try:
        # the CLI, as a user runs it (and Ray's driver state stays out of the test process)
        argv = ["sweep", str(plan), "-o", str(tmp_path / "s"), "--address", cluster.address]
        run = subprocess.run(
            [sys.executable, "-m", "tflfuse.cli", *argv, "--json"],
            cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, **cluster.env},
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        stop.set()
        hunter.join()
    assert run.returncode == 0, run.stderr
    said = f"tflfuse: sweep: 5 cells on the Ray cluster at {cluster.address} (2 nodes, 2 CPUs)"
    assert run.stderr.splitlines() == [said]
    rows = {r["cell"]: r for r in json.loads(run.stdout)}
    assert killed, "the victim's worker was never seen"
    victim = rows.pop("victim.edgetpu")
    assert victim["status"] == "lost" and victim["node"] is None
    assert victim["line"] == "the Ray worker running it died (killed, or out of memory)"
    assert [r["status"] for r in rows.values()] == ["converted"] * 4, rows
    assert len({r["node"] for r in rows.values()}) == 2  # both nodes converted cells
    remove_stale()  # (what the next cell on the victim's node does first)
    left = Path(tempfile.gettempdir()).glob("tflfuse-cell-*/in/victim.tflite")
    assert not list(left), "the killed worker's cell folder is still there"
    for row in rows.values():  # each equal to a standalone convert, byte for byte
        model = inputs / f"{row['model']}.tflite"
        alone = standalone(model, row["recipe"], inputs / "calib.npy", tmp_path / row["cell"])
        for name in ("model.tflite", "model_stock.tflite"):
            got = (tmp_path / "s" / "cells" / row["cell"] / name).read_bytes()
            assert got == (alone / name).read_bytes()


def test_an_address_without_ray_or_without_a_cluster_is_one_line(
    inputs, tmp_path, capsys, monkeypatch
):
    from tests.raycluster import free_ports
    from tflfuse.convert import sweep_ray

    plan = write_plan(
        tmp_path, f'recipes = ["edgetpu"]\n[[model]]\npath = "{inputs / "a.tflite"}"\n'
    )
    (port,) = free_ports(1)  # nothing listens there
    argv = ["sweep", str(plan), "-o", str(tmp_path / "out"), "--address", f"127.0.0.1:{port}"]
    with monkeypatch.context() as m:
        m.setattr(sweep_ray, "available", lambda: False)
        assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "tflfuse: error: Ray is not installed: pip install 'tflfuse[sweep]'"
    )
    if importlib.util.find_spec("ray") is None:
        return
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tflfuse: error: --address 127.0.0.1:{port}: no Ray cluster there")
    assert len(err.splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_cells_memory_request_is_its_models_measured_peak(inputs, tmp_path) -> None:
    """Ray places a cell by the peak RSS measured on its model's earlier cells (with a margin),
    a first guess before one is known, never more than the largest node holds."""
    from tflfuse.convert import sweep_ray

    plan = write_plan(
        tmp_path, f'recipes = ["edgetpu"]\n[[model]]\npath = "{inputs / "a.tflite"}"\n'
    )
    (cell,) = sweep_plan.load(plan, tmp_path / "out").cells
    rows = [{"model": "a", "peak_rss_mib": 300.0}, {"model": "a", "peak_rss_mib": 500.0}]
    rows.append({"model": "other", "peak_rss_mib": 9000.0})
    peaks = sweep_ray.measured_peaks(rows)
    assert peaks == {"a": 500.0, "other": 9000.0}
    gib = 2**30
    assert sweep_ray.memory_request(cell, peaks, 64 * gib) == int(500 * sweep_ray.MARGIN * 2**20)
    assert sweep_ray.memory_request(cell, {}, 64 * gib) == sweep_ray.FIRST_GUESS_MIB * 2**20
    assert sweep_ray.memory_request(cell, {"a": 1e6}, 2 * gib) == 2 * gib


def test_a_stale_looking_folder_no_cell_made_is_kept() -> None:
    """remove_stale removes only folders holding the marker a cell writes first: a folder of the
    same name pattern with a dead pid but no marker is someone else's, and stays."""
    import subprocess
    import sys

    from tflfuse.convert import sweep_cell

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    tmp = Path(tempfile.gettempdir())
    theirs, ours = tmp / f"tflfuse-cell-{dead}-theirs", tmp / f"tflfuse-cell-{dead}-ours"
    for folder in (theirs, ours):
        folder.mkdir()
        (folder / "data.txt").write_text("x")
    (ours / sweep_cell._MARKER).touch()
    try:
        remove_stale()
        assert (theirs / "data.txt").is_file() and not ours.exists()
    finally:
        shutil.rmtree(theirs, ignore_errors=True)
        shutil.rmtree(ours, ignore_errors=True)
