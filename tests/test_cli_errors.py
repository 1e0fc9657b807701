"""Every user mistake is one line `tflfuse: error: ...`, exit 2, nothing written, and is caught
before any heavy work (a benchmark, training an example). Fast: no TensorFlow, tiny IR models."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tflfuse.cli import main
from tflfuse.convert import calibration
from tflfuse.errors import TflfuseError
from tflfuse.runtime import bench

SHAPE = (8, 8, 1)


@pytest.fixture
def model(tiny_tflite: Path) -> Path:
    """CONV_2D -> RELU (conftest's tiny_tflite)."""
    return tiny_tflite


def _fails(argv: list[str], folder: Path, capsys: pytest.CaptureFixture, expect: str) -> None:
    """`argv` exits 2 with one line naming `expect`, and `folder` is left as it was."""
    before = sorted(p.name for p in folder.rglob("*"))
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("tflfuse: error: ") and captured.err.count("\n") == 1
    assert expect in captured.err, captured.err
    assert sorted(p.name for p in folder.rglob("*")) == before


def _no_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the benchmark ran before the arguments were checked")

    monkeypatch.setattr(bench, "run_benchmark", refuse)


# -- calibration files ---------------------------------------------------------------------------
def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize(
    ("name", "make", "expect"),
    [
        ("c.npy", lambda p: p.write_bytes(b""), "not a readable .npy file: the file is empty"),
        (
            "c.npz",
            lambda p: (np.savez(p, x=np.ones((40, *SHAPE), np.float32)), _truncate(p, 3000)),
            "not a readable .npz file: truncated or corrupt",
        ),
        (
            "c.npy",
            lambda p: (np.save(p, np.ones((40, *SHAPE), np.float32)), _truncate(p, 1000)),
            "not a readable .npy file: Failed to read all data",
        ),
        ("c.npy", lambda p: p.write_text("hello"), "not a readable .npy file"),
        ("c.npy", lambda p: np.save(p, np.ones((0, *SHAPE), np.float32)), "data is empty"),
    ],
)
def test_bad_calibration_files_are_one_line(tmp_path: Path, name, make, expect) -> None:
    path = tmp_path / name
    make(path)
    with pytest.raises(TflfuseError) as info:
        calibration.load(path, [SHAPE], ["x"])
    assert str(info.value).startswith(f"{path}: ") and expect in str(info.value)
    assert "\n" not in str(info.value)


# -- bench ---------------------------------------------------------------------------------------
def test_bench_names_the_bad_file(tmp_path: Path, model: Path, capsys) -> None:
    bad = tmp_path / "bad.tflite"
    bad.write_text("garbage")
    _fails(["bench", str(model), str(bad), "--runs", "1"], tmp_path, capsys, f"{bad}: ")
    empty = tmp_path / "empty.tflite"
    empty.write_bytes(b"")
    _fails(["bench", str(empty)], tmp_path, capsys, f"{empty}: the model file is empty")


@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        (["--threads", "0"], "--threads must be at least 1, not 0"),
        (["--runs", "0"], "--runs must be at least 1, not 0"),
        (["--warmup", "-1"], "--warmup must be at least 0, not -1"),
        (["--delegate", "tpu"], "unknown delegate 'tpu'"),
        (["--json", "missing/r.json"], "missing/r.json: folder missing does not exist"),
        (["--plot", "missing/p.png"], "missing/p.png: folder missing does not exist"),
        (["--plot", "."], "is a folder; the --plot output needs a file name"),
    ],
)
def test_bench_arguments_are_checked_before_the_benchmark(
    tmp_path: Path, model: Path, monkeypatch, capsys, extra: list[str], expect: str
) -> None:
    monkeypatch.chdir(tmp_path)
    _no_benchmark(monkeypatch)
    _fails(["bench", str(model), *extra], tmp_path, capsys, expect)


def test_bench_plot_without_matplotlib_fails_first(
    tmp_path: Path, model: Path, monkeypatch, capsys
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a)
    )
    _no_benchmark(monkeypatch)
    _fails(
        ["bench", str(model), "--plot", str(tmp_path / "p.png")],
        tmp_path,
        capsys,
        "--plot needs matplotlib",
    )


def test_bench_threads_zero_through_the_api(model: Path) -> None:
    with pytest.raises(TflfuseError, match=r"^threads must be at least 1, not 0"):
        bench.run_benchmark([model], threads=0)


# -- check ---------------------------------------------------------------------------------------
def test_check_compiler_version_is_validated(tmp_path: Path, model: Path, capsys) -> None:
    base = ["check", str(model), "--target"]
    _fails([*base, "edgetpu", "--compiler-version", "banana"], tmp_path, capsys, "'banana' is not")
    _fails([*base, "xnnpack", "--compiler-version", "14.1"], tmp_path, capsys, "edgetpu only")
    assert main([*base, "edgetpu", "--compiler-version", "14.1"]) == 0


# -- example -------------------------------------------------------------------------------------
def test_example_checks_its_destinations_before_training(tmp_path: Path, capsys) -> None:
    out = str(tmp_path / "d.keras")
    missing = str(tmp_path / "missing" / "c.npy")
    _fails(["example", "digits_cnn", "-o", out, "--calib", missing], tmp_path, capsys, "missing")
    _fails(["example", "digits_cnn", "-o", out, "--calib", "c.txt"], tmp_path, capsys, ".npy")
    _fails(["example", "digits_cnn", "-o", str(tmp_path / "d.h5")], tmp_path, capsys, ".keras")


def test_example_without_scikit_learn_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "sklearn" else real(n, *a)
    )
    _fails(
        ["example", "digits_cnn", "-o", str(tmp_path / "d.keras")],
        tmp_path,
        capsys,
        "pip install scikit-learn",
    )


# -- convert (no model is loaded: these are refused first) ---------------------------------------
def test_convert_refuses_a_non_empty_output_folder_first(
    tmp_path: Path, model: Path, capsys
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    base = ["convert", str(model), "--recipe", "cpu-float", "-o", str(out)]
    _fails(base, tmp_path, capsys, "folder is not empty and holds no tflfuse result")
    _fails([*base, "--force"], tmp_path, capsys, "holds no tflfuse result; it holds notes.txt")
    assert (out / "notes.txt").read_text() == "mine"


def test_argument_errors_are_one_line_too(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["convert", "m.keras", "-o", str(tmp_path / "o"), "--level", "5"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("tflfuse: error: argument --level: invalid choice: 5")
    _fails(
        ["convert", "m.keras", "-o", str(tmp_path / "o"), "--batch", "0"],
        tmp_path,
        capsys,
        "--batch",
    )
