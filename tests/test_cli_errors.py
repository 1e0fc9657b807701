"""Every user mistake is one line `tflfuse: error: ...`, exit 2, nothing written, and is caught
before any heavy work (a benchmark, training an example). Fast: no TensorFlow, tiny IR models."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tflfuse.cli import main
from tflfuse.device import bench
from tflfuse.errors import TflfuseError
from tflfuse.quantize import calibration

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


# -- issue 26: what a hostile user found ---------------------------------------------------------
def test_check_compiler_version_newer_than_any_compiler(
    tmp_path: Path, model: Path, capsys
) -> None:
    base = ["check", str(model), "--target", "edgetpu", "--compiler-version"]
    _fails([*base, "99"], tmp_path, capsys, "99: there is no such edgetpu_compiler")
    _fails([*base, "16.1"], tmp_path, capsys, "(the newest is 16.0)")
    assert main([*base, "16.0.384591198"]) == 0
    import tflfuse

    with pytest.raises(TflfuseError, match="no such edgetpu_compiler"):
        tflfuse.check(model, "edgetpu", compiler_version="17")


@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        (["--twin", "x_edgetpu.tflite"], "--twin needs --target edgetpu"),
        (["--multiple-subgraphs", "--twin", "x.tflite"], "--multiple-subgraphs and --twin need"),
        (["--target", "xnnpack", "--twin", "x.tflite"], "--twin: for --target edgetpu only"),
    ],
)
def test_check_compiler_flags_without_the_edgetpu_target_are_refused(
    tmp_path: Path, model: Path, capsys, extra: list[str], expect: str
) -> None:
    """`check M --twin T` without --target printed the runtime table and ignored --twin."""
    _fails(["check", str(model), *extra], tmp_path, capsys, expect)


def test_compile_of_a_missing_model_names_the_model_not_the_compiler(
    tmp_path: Path, capsys
) -> None:
    missing = tmp_path / "missing.tflite"
    _fails(["compile", str(missing)], tmp_path, capsys, f"{missing}: ")
    assert "edgetpu_compiler" not in capsys.readouterr().err


def test_bench_threads_beyond_any_machine_are_refused_before_running(model: Path) -> None:
    """`tflfuse.bench([...], threads=100000)` started the interpreter, which aborted the calling
    Python when thread creation failed."""
    import tflfuse

    with pytest.raises(TflfuseError, match=r"^threads must be at most 1024, not 100000"):
        tflfuse.bench([model], threads=100000, runs=1, progress=False)


def test_a_text_file_named_npy_is_not_called_pickled(tmp_path: Path) -> None:
    path = tmp_path / "c.npy"
    path.write_text("hello")
    with pytest.raises(TflfuseError) as info:
        calibration.load(path, [SHAPE], ["x"])
    assert "pickled" not in str(info.value)
    assert (
        str(info.value)
        == f"{path}: not a readable .npy file: no NumPy .npy header (it starts with b'hello')"
    )


def test_compare_of_a_file_says_it_is_a_file(tmp_path: Path, model: Path, capsys) -> None:
    _fails(["compare", str(model)], tmp_path, capsys, f"{model}: is a file, not a folder")


def test_json_before_a_folder_or_model_leaves_the_operand_alone(
    tmp_path: Path, model: Path
) -> None:
    """`compare --json DIR` took DIR as where the JSON goes, then missed its folder."""
    from tflfuse.cli import _unswallowed

    folder = tmp_path / "out"
    folder.mkdir()
    assert _unswallowed(["compare", "--json", str(folder)]) == ["compare", "--json=-", str(folder)]
    assert _unswallowed(["bench", "--json", str(model)]) == ["bench", "--json=-", str(model)]
    assert _unswallowed(["bench", str(model), "--json", "r.json"])[-1] == "r.json"
    assert _unswallowed(["inspect", "--json", str(model)]) == ["inspect", "--json", str(model)]
    assert main(["bench", "--json", str(model), "--runs", "1", "--warmup", "0"]) == 0


def test_help_states_the_recipe_default_and_lists_the_examples(capsys) -> None:
    from tflfuse.cli import build_parser
    from tflfuse.cli.commands import EXAMPLES
    from tflfuse.examples import zoo

    assert set(EXAMPLES) == {"digits_cnn", *zoo.BUILDERS}
    for command, needles in (("convert", ["default xnnpack-int8"]), ("example", list(EXAMPLES))):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for needle in needles:
            assert needle in text, (command, needle)


def test_example_keeps_existing_files_without_force(tmp_path: Path, capsys) -> None:
    """`example -o EXISTING.keras --calib EXISTING.npy` overwrote both; digits_cnn also wrote
    MODEL_test.npz over whatever was there."""
    out, calib, held = tmp_path / "m.keras", tmp_path / "c.npy", tmp_path / "m_test.npz"
    for path in (out, calib, held):
        path.write_text("mine")
        base = ["example", "digits_cnn", "-o", str(out), "--calib", str(calib)]
        _fails(base, tmp_path, capsys, f"{path}: exists (pass --force to replace it)")
        path.unlink()
    with pytest.raises(SystemExit):
        main(["example", "nope", "-o", str(out)])
    assert "choose from 'digits_cnn', 'mobilenet_v2'" in capsys.readouterr().err


@pytest.mark.parametrize("size", ["7", "0", "5000"])
def test_example_size_keras_cannot_build_is_one_line(tmp_path: Path, capsys, size: str) -> None:
    """`example mobilenet_v3_small --size 7` ended in a Keras ValueError traceback."""
    out = tmp_path / "m.keras"
    expect = "cannot be built that small" if size == "7" else "--size must be between 1 and 1024"
    _fails(
        ["example", "mobilenet_v3_small", "-o", str(out), "--size", size], tmp_path, capsys, expect
    )


def test_an_identical_result_still_has_the_figures_of_a_check() -> None:
    """The README's `opt.verification["max_abs"]` raised KeyError when the output came out byte
    for byte the input (no comparison ran)."""
    from types import SimpleNamespace

    from tflfuse.verification import verified

    same = SimpleNamespace(reference=b"model", data=b"model")  # identical: never parsed
    failure, record = verified.within_declared_error(same)  # type: ignore[arg-type]
    assert failure is None
    assert record["max_abs"] == 0.0 and record["max_rel"] == 0.0
    assert record["identical"] and record["verified"]
