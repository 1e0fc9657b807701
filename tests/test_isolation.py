"""Native crashes end in one line, and nothing is left behind (`tflfuse.isolation`).

Every test runs tflfuse in a fresh process, as a user does: the fork that isolates native code
happens only while TensorFlow is not loaded (see the module docstring), which a pytest process
that ran other tests cannot promise. The crashes are real: a model whose int8 scale is inf makes
the interpreter abort in `allocate_tensors`, and injected stages call `os.abort()` or read
address 0. No TensorFlow is imported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from irgraphs import conv, model_of, to_bytes, unary

from tflfuse.ir import Graph, Quantization

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
ENV.pop("TFLFUSE_ISOLATION", None)


def _python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
    )


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tflfuse.cli", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
    )


def _one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The run ended with exit 2 and exactly one line on stderr holding every needle."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("tflfuse: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _leftovers(*folders: Path) -> list[str]:
    """tflfuse's temp folders and files anywhere under `folders` (none may survive a run)."""
    return sorted(
        str(p)
        for folder in folders
        for p in folder.rglob("*")
        if (p.is_dir() and ".tflfuse-" in p.name) or p.name.endswith(".tmp")
    )


def _quant(scale: float) -> Quantization:
    return Quantization(scale=np.array([scale], np.float32), zero_point=np.array([-128], np.int64))


@pytest.fixture
def inf_scale_model(tmp_path: Path) -> Path:
    """An int8 ADD whose input scale is 1e-38 and output scale 1e38: finite and positive, so
    tflfuse's own check of quantization parameters lets it through, but the rescale between them
    is beyond what the interpreter's fixed-point multiplier holds and its plain kernels abort in
    allocate_tensors (SIGABRT; measured with ai-edge-litert 2.3), as a stock model with an inf
    scale from calibration did before calibration ranges were checked (issue 16)."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 4), "INT8", quantization=_quant(1e-38))
    c = g.add_tensor("c", (4,), "INT8", data=np.ones(4, np.int8), quantization=_quant(1.0))
    y = g.add_tensor("y", (1, 8, 8, 4), "INT8", quantization=_quant(1e38))
    g.add_op("ADD", [x, c], [y], options={"fused_activation_function": "NONE"})
    path = tmp_path / "inf_scale.tflite"
    path.write_bytes(to_bytes(model_of(g, [x], [y])))
    return path


@pytest.fixture
def float_model(tmp_path: Path) -> tuple[Path, Path]:
    """CONV_2D -> RELU (float) and calibration data for it."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 3))
    y = unary(g, "RELU", conv(g, x, 4, name="c").outputs[0]).outputs[0]
    path = tmp_path / "tiny.tflite"
    path.write_bytes(to_bytes(model_of(g, [x], [y])))
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).uniform(-1, 1, (16, 8, 8, 3)).astype(np.float32))
    return path, calib


# -- real crashes --------------------------------------------------------------------------------
def test_a_real_interpreter_abort_in_convert_is_one_line(
    tmp_path: Path, inf_scale_model: Path
) -> None:
    out = tmp_path / "out"
    proc = _cli("convert", str(inf_scale_model), "-o", str(out))
    _one_line(
        proc,
        f"{inf_scale_model}: the load stage",
        "crashed in native code (SIGABRT, abort); nothing written",
    )
    assert not out.exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("command", ["bench", "check"])
def test_a_real_interpreter_abort_in_bench_is_one_line(
    tmp_path: Path, inf_scale_model: Path, command: str
) -> None:
    if command == "bench":
        proc = _cli("bench", str(inf_scale_model), "--delegate", "none", "--runs", "2")
        _one_line(proc, f"{inf_scale_model}: the bench command", "(SIGABRT, abort)")
    else:  # check predicts without running the model: no crash, the right answer
        proc = _cli("check", str(inf_scale_model), "--target", "edgetpu")
        assert proc.returncode == 0, proc.stderr
    assert _leftovers(tmp_path) == []


def test_a_real_interpreter_abort_in_compare_is_one_line(
    tmp_path: Path, inf_scale_model: Path
) -> None:
    """`compare` times the three models of a convert folder with the interpreter: a model the
    interpreter aborts on (here all three) ends in one line, like bench, and writes nothing
    (it died with exit 134 and no message before compare ran in the isolated child)."""
    folder = tmp_path / "conversion"
    folder.mkdir()
    for name in ("model.tflite", "model_unfused.tflite", "model_stock.tflite"):
        (folder / name).write_bytes(inf_scale_model.read_bytes())
    (folder / "report.json").write_text("{}")
    before = sorted(p.name for p in folder.iterdir())
    out = tmp_path / "comparison.json"
    proc = _cli("compare", str(folder), "--delegate", "none", "--runs", "2", "--json", str(out))
    _one_line(proc, f"{folder}: the compare command", "crashed in native code (SIGABRT, abort)")
    assert not out.exists() and sorted(p.name for p in folder.iterdir()) == before
    assert _leftovers(tmp_path) == []


# -- injected crashes in named stages ------------------------------------------------------------
_CRASHING_STAGE = """
    import ctypes, os, sys
    from tflfuse.convert import pipeline as convert
    from tflfuse.cli import main

    how = sys.argv[1]

    def quantize(rec, ctx):  # the quantize stage, crashing
        (ctx.folder / "model.tflite").write_bytes(b"half-written")
        if how == "abort":
            os.abort()
        if how == "segfault":
            ctypes.string_at(0)
        if how == "exit":
            os._exit(3)

    convert.STAGES = tuple(quantize if s.__name__ == "quantize" else s for s in convert.STAGES)
    sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize(
    ("how", "status"),
    [
        ("abort", "SIGABRT, abort"),
        ("segfault", "SIGSEGV, segmentation fault"),
        ("exit", "exit status 3"),
    ],
)
def test_a_crash_names_the_stage_and_the_model(
    tmp_path: Path, float_model: tuple[Path, Path], how: str, status: str
) -> None:
    model, calib = float_model
    out = tmp_path / "out"
    args = ("convert", str(model), "--calib", str(calib), "-o", str(out))
    proc = _python(_CRASHING_STAGE, how, *args)
    line = _one_line(proc, f"{model}: the quantize stage", f"({status}); nothing written")
    assert line.endswith("(-v shows what it printed)")
    assert not out.exists() and _leftovers(tmp_path) == []


def test_a_crash_over_an_earlier_result_keeps_it_byte_for_byte(
    tmp_path: Path, float_model: tuple[Path, Path]
) -> None:
    model, calib = float_model
    out = tmp_path / "out"
    proc = _cli("convert", str(model), "--calib", str(calib), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    (out / "notes.md").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    args = ("convert", str(model), "--calib", str(calib), "-o", str(out), "--force")
    _one_line(_python(_CRASHING_STAGE, "abort", *args), "crashed in native code")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _leftovers(tmp_path) == []


# -- killed children and parents -----------------------------------------------------------------
_SLOW_STAGE = """
    import os, signal, sys, time
    from pathlib import Path
    from tflfuse.convert import pipeline as convert
    from tflfuse.cli import main

    # Ctrl-C as a terminal delivers it: a job a non-interactive shell starts in the background
    # (`pytest &`, a CI runner) inherits SIGINT ignored (POSIX), Python keeps an inherited
    # SIG_IGN, and tflfuse rightly leaves an ignored signal ignored (a nohup'd run).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def quantize(rec, ctx):  # the quantize stage, slow
        (ctx.folder / "model.tflite").write_bytes(b"x" * 1000)
        Path(sys.argv[1]).write_text(f"{os.getpid()} {ctx.folder}")
        time.sleep(120)

    convert.STAGES = tuple(quantize if s.__name__ == "quantize" else s for s in convert.STAGES)
    sys.exit(main(sys.argv[2:]))
"""


def _start_slow(
    tmp_path: Path, model: Path, calib: Path, *, session: bool = False
) -> tuple[subprocess.Popen, int, Path]:
    ready = tmp_path / "ready"
    args = ("convert", str(model), "--calib", str(calib), "-o", str(tmp_path / "out"))
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_SLOW_STAGE), str(ready), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        start_new_session=session,
    )
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text()) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    pid, folder = ready.read_text().split(" ", 1)
    assert int(pid) != proc.pid  # the stage runs in a child
    return proc, int(pid), Path(folder)


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return True  # a zombie: dead, waiting to be reaped by its (dead) parent's reaper
        time.sleep(0.05)
    return False


def test_sigkill_of_the_child_is_one_line_and_leaves_nothing(
    tmp_path: Path, float_model: tuple[Path, Path]
) -> None:
    proc, child, folder = _start_slow(tmp_path, *float_model)
    assert folder.is_dir()
    os.kill(child, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and "the quantize stage" in err
    assert "(SIGKILL, killed; out of memory?)" in err
    assert not folder.exists() and _leftovers(tmp_path) == []


def test_sigterm_of_the_parent_stops_the_child_and_cleans_up(
    tmp_path: Path, float_model: tuple[Path, Path]
) -> None:
    proc, child, folder = _start_slow(tmp_path, *float_model)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err == f"tflfuse: terminated by signal {int(signal.SIGTERM)}\n"
    assert _gone(child)
    assert not folder.exists() and _leftovers(tmp_path) == []


def test_ctrl_c_reaches_parent_and_child_and_leaves_nothing(
    tmp_path: Path, float_model: tuple[Path, Path]
) -> None:
    """Ctrl-C signals the whole foreground process group: the child unwinds, the parent waits
    for it, removes the temp folder and says "interrupted"."""
    proc, child, folder = _start_slow(tmp_path, *float_model, session=True)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err == "tflfuse: interrupted\n"
    assert _gone(child)
    assert not folder.exists() and _leftovers(tmp_path) == []


def test_sigkill_of_the_parent_takes_the_child_and_the_next_run_cleans_up(
    tmp_path: Path, float_model: tuple[Path, Path]
) -> None:
    proc, child, folder = _start_slow(tmp_path, *float_model)
    proc.kill()
    proc.communicate(timeout=60)
    assert _gone(child), "the child outlived its parent"
    assert folder.is_dir()  # nobody was left to remove it ...
    from tflfuse import files

    tmp = files.prepare_output(tmp_path / "out")  # ... so the next run into the place does
    assert not folder.exists()
    files.discard(tmp)
    assert _leftovers(tmp_path) == []


# -- what crosses the fork -----------------------------------------------------------------------
_ACROSS = """
    import io, os, sys
    from contextlib import redirect_stdout
    from tflfuse import isolation
    from tflfuse.errors import ModelError

    assert isolation.available()
    shown = io.StringIO()
    with redirect_stdout(shown):
        value = isolation.run(lambda: print("from the child", os.getpid()) or os.getpid(), what="m")
    assert value != os.getpid(), "it ran in-process"
    assert shown.getvalue() == f"from the child {value}\\n", shown.getvalue()

    def model_error():
        raise ModelError("m.tflite", "not a valid TFLite model")

    def os_error():
        open("/nonexistent/folder/file")

    def bug():
        return {}["missing"]

    for work, expect in ((model_error, ModelError), (os_error, FileNotFoundError)):
        try:
            isolation.run(work, what="m")
        except expect as exc:
            print(type(exc).__name__, exc)
    try:
        isolation.run(bug, what="m")
    except isolation.IsolatedBugError as exc:
        print("bug", "KeyError: 'missing'" in str(exc))
"""


def test_results_errors_and_output_cross_the_fork() -> None:
    proc = _python(_ACROSS)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "ModelError m.tflite: not a valid TFLite model",
        "FileNotFoundError [Errno 2] No such file or directory: '/nonexistent/folder/file'",
        "bug True",
    ]


def test_no_fork_once_tensorflow_is_loaded_or_when_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tflfuse import isolation

    monkeypatch.delenv("TFLFUSE_ISOLATION", raising=False)
    monkeypatch.setitem(sys.modules, "tensorflow", object())
    assert not isolation.available()
    assert isolation.run(os.getpid, what="m") == os.getpid()  # in-process
    monkeypatch.delitem(sys.modules, "tensorflow")
    monkeypatch.setenv("TFLFUSE_ISOLATION", "0")
    assert not isolation.available()


def test_the_describing_of_a_status() -> None:
    from tflfuse.isolation import describe_status

    assert describe_status(signal.SIGSEGV) == "SIGSEGV, segmentation fault"
    assert describe_status(signal.SIGKILL) == "SIGKILL, killed; out of memory?"
    assert describe_status(3 << 8) == "exit status 3"


_LEFTOVERS = """
import os, tempfile
from tflfuse import isolation

def leave():  # what TensorFlow's AutoGraph does: a temp file removed only at exit (os._exit skips)
    fd, path = tempfile.mkstemp(prefix="__autograph_generated_file", suffix=".py")
    os.close(fd)
    return path, os.environ["TMPDIR"]

def leave_and_crash():
    leave()
    os.abort()

path, env = isolation.run(leave, what="m")
print(os.path.exists(path), os.path.dirname(os.path.dirname(path)) == tempfile.gettempdir())
try:
    isolation.run(leave_and_crash, what="m")
except isolation.NativeCrashError:
    print("crash")
"""


def test_an_isolated_child_leaves_nothing_in_tmpdir(tmp_path: Path) -> None:
    """Every Keras/SavedModel convert left `__autograph_generated_file*.py` in $TMPDIR: the child
    ends with os._exit, which skips the atexit hook that removes them. Each child now has its
    own temp folder inside $TMPDIR, removed by the parent however the child ended."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp / "users-file").write_text("mine")
    proc = subprocess.run(
        [sys.executable, "-c", _LEFTOVERS],
        capture_output=True,
        text=True,
        env={**ENV, "TMPDIR": str(tmp)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["False True", "crash"]
    assert sorted(p.name for p in tmp.iterdir()) == ["users-file"]
