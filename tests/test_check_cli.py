"""`tflfuse check`: JSON in the agreed shape, the compiler-style table, one-line errors."""

from __future__ import annotations

import json

import pytest
from conftest import ORACLE, needs_oracle

from tflfuse.cli import main

DEEPLAB = ORACLE / "deeplabv3_mnv2_dm05_pascal_quant.tflite"


@needs_oracle()
def test_check_json_has_the_agreed_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(DEEPLAB), "--target", "edgetpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"ops", "mapped", "cpu"} <= set(out)
    assert (out["mapped"], out["cpu"]) == (64, 8)
    assert set(out["ops"][0]) == {"index", "op", "target", "status", "reason"}
    assert {o["target"] for o in out["ops"]} == {"edgetpu", "cpu"}
    assert out["memory"]["cache_bytes"] == 8 * 2**20


@needs_oracle()
def test_check_text_is_the_compiler_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(DEEPLAB), "--target", "edgetpu"]) == 0
    text = capsys.readouterr().out
    assert "Operator                       Count      Status" in text
    assert "Number of operations that will run on Edge TPU: 64" in text
    row = f"{'RESIZE_BILINEAR':<30} {1:<10} More than one subgraph is not supported"
    assert row in text


@needs_oracle()
def test_check_xnnpack(capsys: pytest.CaptureFixture[str]) -> None:
    model = str(ORACLE / "split_concat.tflite")
    assert main(["check", model, "--target", "xnnpack", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["mapped"], out["cpu"]) == (2, 1)


def test_check_missing_file_is_one_line(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(tmp_path / "nope.tflite"), "--target", "edgetpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tflfuse: error:") and err.count("\n") == 1


@needs_oracle()
def test_check_gpu_comes_from_the_analyzer_or_says_why_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tflfuse.targets.probe import analyzer_checks_gpu

    code = main(["check", str(ORACLE / "split_concat.tflite"), "--target", "gpu", "--json"])
    captured = capsys.readouterr()
    if analyzer_checks_gpu():
        assert code == 0 and json.loads(captured.out)["ops"]
    else:  # this build's analyzer passes everything (TOPK_V2 included): no fake report
        assert code == 2 and "does not check GPU compatibility" in captured.err
