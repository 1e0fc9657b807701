"""The Python API at the package top: `tflfuse.convert/optimize/check/bench` take what the README
says, return what it says, and refuse bad arguments with one-line errors. Fast: tiny IR models."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import tflfuse
from tflfuse.errors import TflfuseError


@pytest.fixture
def tiny(tiny_tflite: Path) -> Path:
    """CONV_2D -> RELU (conftest's tiny_tflite)."""
    return tiny_tflite


def _python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def test_import_is_light_and_names_resolve_in_any_order() -> None:
    loaded = _python(
        "import sys, tflfuse; print(sorted(m for m in ('numpy', 'tensorflow') if m in sys.modules))"
    )
    assert loaded == "[]"
    # the modules imported first (as the CLI and `from tflfuse.convert.pipeline import ...` do)
    out = _python(
        "import tflfuse.convert.pipeline, tflfuse.device.bench, tflfuse.convert.optimize\n"
        "from tflfuse.convert.pipeline import convert_keras\n"
        "import tflfuse\n"
        "print(all(callable(f) for f in (tflfuse.convert, tflfuse.bench, tflfuse.optimize,"
        " tflfuse.check)), callable(convert_keras), hasattr(tflfuse.convert, 'pipeline'))"
    )
    assert out == "True True True"


def test_signatures_are_the_documented_ones() -> None:
    assert list(inspect.signature(tflfuse.convert).parameters)[:3] == [
        "model",
        "output_dir",
        "recipe",
    ]
    assert "target" in inspect.signature(tflfuse.optimize).parameters
    assert "compiler_version" in inspect.signature(tflfuse.check).parameters
    assert "threads" in inspect.signature(tflfuse.bench).parameters


def test_optimize_returns_the_result_and_writes_output(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "opt.tflite"
    result = tflfuse.optimize(tiny, out, target="xnnpack")
    assert (result.before["op_count"], result.after["op_count"]) == (2, 1)
    assert out.read_bytes() == result.data
    assert result.verification["verified"] and result.verification["ok"]
    same = tflfuse.optimize(tiny.read_bytes(), level=0)
    assert same.after["op_count"] == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target": "tpu"}, "target 'tpu' unknown"),
        ({"level": 3}, "level must be 0, 1 or 2, not 3"),
        ({"level": True}, "level must be 0, 1 or 2"),
        ({"disabled": ["NoSuchRule"]}, "unknown rule 'NoSuchRule'"),
        ({"disabled": "FuseActivation"}, "must be a list of rule names"),
    ],
)
def test_optimize_refuses_unknown_options(tiny: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(TflfuseError, match=message):
        tflfuse.optimize(tiny, **kwargs)
    from tflfuse.convert.optimize import optimize_bytes

    with pytest.raises(TflfuseError, match=message):  # the library function too
        optimize_bytes(tiny.read_bytes(), **kwargs)


def test_check_predicts_and_validates(tiny: Path) -> None:
    tpu = tflfuse.check(tiny, "edgetpu")
    assert tpu.mapped == 0 and tpu.cpu == 2  # a float model: nothing maps
    xnn = tflfuse.check(tiny.read_bytes(), "xnnpack")
    assert xnn.mapped == 2
    json.dumps(xnn.to_dict())
    with pytest.raises(TflfuseError, match="target 'tpu' unknown"):
        tflfuse.check(tiny, "tpu")
    with pytest.raises(TflfuseError, match="'banana' is not a version"):
        tflfuse.check(tiny, "edgetpu", compiler_version="banana")
    with pytest.raises(
        TflfuseError, match=r"absent.tflite: (no such file|not found|does not exist)"
    ):
        tflfuse.check(tiny.with_name("absent.tflite"))


def test_bench_returns_the_json_result(tiny: Path) -> None:
    result = tflfuse.bench([tiny, tiny], runs=3, warmup=0)
    assert len(result["models"]) == 2 and result["protocol"]["runs"] == 3
    assert all(len(m["samples_ms"]) == 3 for m in result["models"])
    assert result["models"][0]["ratio_to_first"]["p50"] == 1.0
    with pytest.raises(TflfuseError, match="must be a list"):
        tflfuse.bench(str(tiny))
    with pytest.raises(TflfuseError, match="threads must be at least 1"):
        tflfuse.bench([tiny], threads=0)


def test_convert_checks_its_arguments_before_loading(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(TflfuseError, match="unknown recipe field 'colour'"):
        tflfuse.convert("absent.keras", out, colour="red")
    with pytest.raises(TflfuseError, match="batch must be an integer of at least 1"):
        tflfuse.convert("absent.keras", out, batch=0)
    with pytest.raises(TflfuseError, match=r"^samples must be at least 1, not 0$"):
        tflfuse.convert("absent.keras", out, recipe="edgetpu", samples=0)
    with pytest.raises(TflfuseError, match="needs calibration data"):
        tflfuse.convert("absent.keras", out, recipe="edgetpu")
    assert list(tmp_path.iterdir()) == []  # not even a temp folder
