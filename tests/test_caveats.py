"""Accuracy checks that say when they cannot tell (tflfuse.convert.caveats), in report.json,
report.md and on stderr, one line each: outputs that do not vary, a reference class that never
changes, no top-1 on outputs that are not class scores, degenerate calibration data, errors larger
than
the output's range."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from irgraphs import fully_connected, model_of, to_bytes

from tflfuse import cli
from tflfuse.convert import caveats
from tflfuse.convert.pipeline import convert
from tflfuse.ir import Graph

RNG = np.random.default_rng(5)


# -- the rules, one by one ------------------------------------------------------------------------
def test_calibration_data_that_cannot_be_trusted() -> None:
    good = RNG.uniform(-1, 1, (32, 8, 8, 3)).astype(np.float32)
    assert caveats.calibration_warnings([good], ["x"]) == []
    images = RNG.integers(0, 256, (8, 16, 16, 3)).astype(np.float32)
    assert caveats.calibration_warnings([images], ["x"]) == []
    outlier = good.copy()
    outlier[3, 2, 2, 1] = 1e20
    (w,) = caveats.calibration_warnings([outlier], ["x"])
    assert "'x'" in w and "dominated by outliers" in w and "1e+20" in w
    (w,) = caveats.calibration_warnings([np.zeros_like(good)], ["x"])
    assert "all zeros" in w
    (w,) = caveats.calibration_warnings([np.full_like(good, 0.5)], ["x"])
    assert "the single value 0.5" in w


@pytest.mark.parametrize(
    ("shape", "producer", "inputs", "only", "expect"),
    [
        ((1, 1000), "FULLY_CONNECTED", [150528], True, True),  # logits (PyTorch heads)
        ((4, 10), "SOFTMAX", [784], True, True),  # probabilities (Keras heads)
        ((4, 10), "SOFTMAX", [784], False, True),  # beside other outputs too
        ((1, 640), "FULLY_CONNECTED", [640], True, False),  # an autoencoder's reconstruction
        ((1, 63), "FULLY_CONNECTED", [150528], False, False),  # hand landmarks beside flags
        ((1, 63), "CONV_2D", [150528], True, False),  # landmarks written by a conv
        ((1, 84, 1344), "CONCATENATION", [196608], True, False),  # detections
        ((1, 1), "FULLY_CONNECTED", [100], True, False),  # one score
    ],
)
def test_what_a_class_score_output_is(shape, producer, inputs, only, expect) -> None:
    assert caveats.class_scores(shape, producer, inputs, only) is expect


def test_checks_that_say_nothing_are_named() -> None:
    varied = RNG.normal(size=(8, 5))
    constant = np.tile(RNG.normal(size=(1, 5)), (8, 1))
    one_class = varied + np.array([50.0, 0, 0, 0, 0])
    warnings = caveats.reference_warnings(
        [varied, constant, one_class], ["a", "b", "c"], [True, True, True]
    )
    assert len(warnings) == 2
    assert "'b'" in warnings[0] and "does not vary over the 8 check inputs" in warnings[0]
    assert "'c'" in warnings[1] and "class 0 for all 8 check inputs" in warnings[1]
    assert caveats.reference_warnings([one_class], ["c"], [False]) == []  # not class scores


def test_an_error_beyond_the_outputs_range_is_named() -> None:
    agreement = {
        "fused": {"verified": True, "outputs": [{"max_abs": 0.01, "reference_range": 2.0}]},
        "stock": {"verified": True, "outputs": [{"max_abs": 2.4e18, "reference_range": 2.0}]},
    }
    (w,) = caveats.error_warnings(agreement, ["y"])
    assert w.startswith("output 'y' moves by 2 over the check inputs, less than the error of")
    assert "the stock model(s) (2.4e+18)" in w


# -- through convert -------------------------------------------------------------------------------
def _fc_model(widths: tuple[int, ...], bias0: float = 0.0) -> bytes:
    g = Graph("main")
    x = g.add_tensor("x", (1, widths[0]))
    y = x
    for i, w in enumerate(widths[1:]):
        last = i == len(widths) - 2
        op = fully_connected(g, y, w, act="NONE" if last else "RELU", name=f"fc{i}")
        if last and bias0:
            b = op.inputs[2]
            b.data = b.data + np.eye(1, w, dtype=np.float32)[0] * np.float32(bias0)
        y = op.output
    return to_bytes(model_of(g, [x], [y]))


def test_no_top1_on_an_autoencoder(tmp_path: Path) -> None:
    res = convert(_fc_model((64, 16, 64)), "cpu-float", output_dir=tmp_path / "o", progress=False)
    r = res.report
    assert r["class_score_outputs"] == []
    assert all("top1_agreement" not in a["outputs"][0] for a in r["agreement"].values())
    assert "Here: none." in (tmp_path / "o" / "report.md").read_text()


def test_a_classifier_gets_top1(tmp_path: Path) -> None:
    res = convert(_fc_model((64, 16, 10)), "cpu-float", output_dir=tmp_path / "o", progress=False)
    r = res.report
    assert len(r["class_score_outputs"]) == 1 and r["warnings"] == []
    row = r["agreement"]["fused"]["outputs"][0]
    assert row["top1_agreement"] == 1.0 and row["reference_classes"] > 1


def test_one_reference_class_is_a_warning_everywhere(tmp_path: Path, capsys) -> None:
    src = tmp_path / "m.tflite"
    src.write_bytes(_fc_model((64, 16, 10), bias0=100.0))
    out = tmp_path / "o"
    assert cli.main(["convert", str(src), "--recipe", "cpu-float", "-o", str(out)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(err) == 1 and err[0].startswith("tflfuse: warning: output ")
    assert "the source gives class 0 for all" in err[0]
    report = json.loads((out / "report.json").read_text())
    assert report["warnings"] == [err[0].removeprefix("tflfuse: warning: ")]
    md = (out / "report.md").read_text()
    assert "## Warnings" in md and "(one class: says nothing)" in md


def test_an_outlier_in_the_calibration_data_is_a_warning(tmp_path: Path, capsys) -> None:
    pytest.importorskip("litert_quantizer")
    data = RNG.uniform(-1, 1, (32, 64)).astype(np.float32)
    data[5, 7] = 1e20
    res = convert(_fc_model((64, 16, 10)), "xnnpack-int8", data, tmp_path / "o", progress=False)
    (warning,) = res.report["warnings"]  # the repro: exit 0, no word of it before
    assert "dominated by outliers" in warning and "[-1, 1]" in warning
    assert res.report["agreement"]["fused"]["max_abs"] > 1e10  # what the outlier did


def test_all_zero_calibration_is_a_warning(tmp_path: Path) -> None:
    pytest.importorskip("litert_quantizer")
    data = np.zeros((16, 64), np.float32)
    res = convert(_fc_model((64, 16, 10)), "xnnpack-int8", data, tmp_path / "o", progress=False)
    warnings = res.report["warnings"]
    assert any("is all zeros" in w for w in warnings), warnings
    assert any("does not vary" in w for w in warnings), warnings


def test_an_int8_legalization_that_fails_its_check_is_a_warning(tmp_path, monkeypatch) -> None:
    """The fused model stays as quantized, and the reason is a warning, not a silent drop."""
    pytest.importorskip("litert_quantizer")
    from tflfuse.convert import pipeline as convert_mod
    from tflfuse.rewrite import Pass

    class ShiftBias(Pass):
        """A broken int8 'rewrite': the last layer's int32 bias moved by many steps."""

        def run(self, graph) -> int:
            if graph.extra.get("shifted"):
                return 0
            fc = [op for op in graph.ops if op.type == "FULLY_CONNECTED"][-1]
            fc.inputs[2].data = fc.inputs[2].data + np.int32(5000)
            graph.extra["shifted"] = True
            return 1

    monkeypatch.setattr(convert_mod, "int8_rules", lambda rec, pending: (ShiftBias(),))
    data = RNG.uniform(-1, 1, (32, 64)).astype(np.float32)
    res = convert(_fc_model((64, 16, 10)), "xnnpack-int8", data, tmp_path / "o", progress=False)
    leg = res.report["legalization"]
    assert leg["ran"] and not leg["kept"] and "verification failed" in leg["reason"]
    (warning,) = res.report["warnings"]
    assert warning.startswith("the int8 legalization was not kept: verification failed: output")
