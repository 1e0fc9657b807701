"""`tflfuse inspect` and `optimize`: output shapes, and bad input handled as one clean line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import flatbuffers
import numpy as np
import pytest
from irgraphs import conv, model_of, unary

from tflfuse.ir import Graph, flatbuffer

TFLFUSE = [sys.executable, "-m", "tflfuse.cli"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TFLFUSE, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def small_model(tmp_path: Path) -> Path:
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 3))
    c = conv(g, x, 4)
    r = unary(g, "RELU", c.output, name="y")
    path = tmp_path / "small.tflite"
    flatbuffer.save(model_of(g, [x], [r.output]), path)
    return path


def not_tflite_flatbuffer() -> bytes:
    """A well-formed flatbuffer with another schema's identifier."""
    b = flatbuffers.Builder(64)
    name = b.CreateString("not a model")
    b.StartObject(1)
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.Finish(b.EndObject(), file_identifier=b"ABCD")
    return bytes(b.Output())


def tflite_identifier_garbage() -> bytes:
    """Right identifier, nonsense behind it."""
    rng = np.random.default_rng(3)
    body = bytearray(rng.integers(0, 256, 400, dtype=np.uint8).tobytes())
    body[4:8] = b"TFL3"
    return bytes(body)


BAD_FILES = {
    "empty": (b"", "file is empty"),
    "truncated": (b"\x1c\x00\x00", "truncated"),
    "wrong identifier": (b"\x1c\x00\x00\x00NOPE" + bytes(40), "not a TFLite model"),
    "random bytes": (np.random.default_rng(0).bytes(2048), "not a TFLite model"),
    "other flatbuffer": (not_tflite_flatbuffer(), "not a TFLite model"),
    "garbage after identifier": (tflite_identifier_garbage(), "not a valid TFLite model"),
}


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tflfuse: error: ")
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_model_files_give_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    data, expected = BAD_FILES[case]
    path = tmp_path / "bad.tflite"
    path.write_bytes(data)
    out = tmp_path / "out.tflite"
    for proc in (run("inspect", str(path)), run("optimize", str(path), "-o", str(out))):
        assert_clean_error(proc, str(path), expected)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [path]  # no temp files left behind


def test_missing_path_and_directory(tmp_path: Path) -> None:
    assert_clean_error(run("inspect", str(tmp_path / "nope.tflite")), "no such file")
    assert_clean_error(run("inspect", str(tmp_path)), "is a directory")


def test_optimize_never_overwrites_its_input_unless_asked(small_model: Path) -> None:
    before = small_model.read_bytes()
    assert_clean_error(run("optimize", str(small_model), "-o", str(small_model)), "--in-place")
    assert small_model.read_bytes() == before
    proc = run("optimize", str(small_model), "-o", str(small_model), "--in-place")
    assert proc.returncode == 0, proc.stderr
    assert [op.type for op in flatbuffer.load(small_model).main.ops] == ["CONV_2D"]


def test_optimize_into_a_missing_folder_fails_cleanly(small_model: Path, tmp_path: Path) -> None:
    proc = run("optimize", str(small_model), "-o", str(tmp_path / "no" / "such" / "out.tflite"))
    assert_clean_error(proc, "does not exist")


def test_unknown_rule_is_named(small_model: Path, tmp_path: Path) -> None:
    proc = run("optimize", str(small_model), "-o", str(tmp_path / "o.tflite"), "--disable", "Nope")
    assert_clean_error(proc, "unknown rule 'Nope'")


def test_inspect_json_shape(small_model: Path) -> None:
    proc = run("inspect", str(small_model), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    (sg,) = report["subgraphs"]
    assert sg["op_count"] == 2 and sg["op_counts"] == {"CONV_2D": 1, "RELU": 1}
    assert sg["parameter_bytes"] == (4 * 3 * 3 * 3 + 4) * 4
    assert sg["activation_bytes"] == 2 * 8 * 8 * 4 * 4
    assert sg["ops"][0]["op"] == "CONV_2D" and sg["ops"][0]["fused_activation"] == "NONE"
    assert sg["ops"][0]["inputs"][1] == {
        "name": "conv/w",
        "shape": [4, 3, 3, 3],
        "dtype": "FLOAT32",
        "constant": True,
    }
    assert sg["quantization"]["kind"] == "float"


def test_inspect_text_lists_every_op(small_model: Path) -> None:
    proc = run("inspect", str(small_model))
    assert proc.returncode == 0
    assert "CONV_2D" in proc.stdout and "RELU" in proc.stdout and "2 ops" in proc.stdout


def test_optimize_level_0_is_a_pure_load_save(small_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "same.tflite"
    proc = run("optimize", str(small_model), "-o", str(out), "--level", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["before"]["op_count"] == report["after"]["op_count"] == 2
    assert report["events"] == []
    assert out.read_bytes() == small_model.read_bytes()  # our own writer: byte-identical


def test_optimize_json_report_file(small_model: Path, tmp_path: Path) -> None:
    out, report_path = tmp_path / "fused.tflite", tmp_path / "report.json"
    proc = run(
        "optimize", str(small_model), "-o", str(out), "--json", str(report_path), "--explain"
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["before"]["op_count"] == 2 and report["after"]["op_count"] == 1
    assert report["fired"]["FuseActivationIntoProducer"] == 1
    assert report["verification"]["verified"] and report["verification"]["ok"]
    assert report["verification"]["varies"]
    assert "fired FuseActivationIntoProducer" in proc.stdout


def test_outputs_get_a_normal_file_mode(small_model: Path, tmp_path: Path) -> None:
    import os
    import stat

    out = tmp_path / "o.tflite"
    assert run("optimize", str(small_model), "-o", str(out)).returncode == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    out.chmod(0o640)
    assert run("optimize", str(small_model), "-o", str(out)).returncode == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640  # an existing file keeps its mode


def test_optimize_warns_when_the_check_cannot_tell(tmp_path: Path) -> None:
    """A model whose output is the same for every input makes equality vacuous: say so."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 4, 4, 2))
    c = conv(g, x, 3)
    c.inputs[2].data = np.full(3, -100.0, np.float32)  # RELU of a large negative bias: all zero
    r = unary(g, "RELU", c.output)
    src = tmp_path / "const.tflite"
    flatbuffer.save(model_of(g, [x], [r.output]), src)
    proc = run("optimize", str(src), "-o", str(tmp_path / "o.tflite"))
    assert proc.returncode == 0, proc.stderr
    assert "the outputs did not change with the input" in proc.stdout
