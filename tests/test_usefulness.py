"""What convert writes must be usable: a fused model that carries nothing of the source's is refused
(tflfuse.convert.usefulness), and `--runtime R` fits every model tflfuse writes (issue 26).

The end-to-end cases convert a small float .tflite built here (FULLY_CONNECTED, GELU,
FULLY_CONNECTED, SOFTMAX: no TensorFlow; a RELU6 on the first for the 1e30 case: int8 loses the
clamp's whole range at that scale), about ten seconds each.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rulekit import G

from tflfuse.cli import main
from tflfuse.convert import usefulness
from tflfuse.convert.report import centered_cosine
from tflfuse.ir import flatbuffer
from tflfuse.targets import runtimes

STEP = 1 / 256


def _row(**kw: object) -> dict:
    return {"varies": True, "max_abs": 0.1, **kw}


@pytest.mark.parametrize(
    ("row", "refused"),
    [
        (_row(top1_agreement=0.0, cosine=0.9, spread=10 * STEP), "top-1 agreement 0.000"),
        (_row(top1_agreement=0.5, cosine=0.2, spread=10 * STEP), "centered cosine 0.200"),
        (_row(top1_agreement=0.5, cosine=0.2, spread=3 * STEP), None),  # int8 cannot follow
        (_row(top1_agreement=0.5, cosine=0.6, spread=10 * STEP), None),
        ({"varies": False, "top1_agreement": 0.0}, None),  # a constant source: nothing to say
        # the source gives one class for every input: its top-1 says nothing, the cosine judges
        (_row(top1_agreement=0.0, reference_classes=1, cosine=0.85, spread=10 * STEP), None),
        (_row(top1_agreement=0.0, reference_classes=1, cosine=0.2, spread=10 * STEP), "cosine"),
        (
            _row(top1_agreement=0.0, reference_classes=2, cosine=0.9, spread=10 * STEP),
            "top-1 agreement 0.000",
        ),
        (_row(cosine=0.0, spread=50 * STEP), "centered cosine 0.000"),  # no class scores
    ],
)
def test_the_signs_of_a_useless_output(row: dict, refused: str | None) -> None:
    agreement = {"verified": True, "samples": 16, "outputs": [row]}
    verdict = usefulness.useless(agreement, [STEP], ["scores"], "model.tflite")
    if refused is None:
        assert verdict is None
    else:
        assert verdict is not None and verdict.startswith("model.tflite: output 'scores' ")
        assert refused in verdict
    assert usefulness.useless({"verified": False}, [STEP], ["scores"], "m") is None
    no_step = usefulness.useless(agreement, [None], ["scores"], "m")  # a float output
    assert (no_step is not None) == (refused == "top-1 agreement 0.000")  # top-1 only


@pytest.mark.parametrize(
    ("fused", "stock", "said"),
    [
        # stock fails the same sign: the user learns the model fails for stock too
        (
            _row(top1_agreement=0.0, cosine=0.9, spread=10 * STEP),
            _row(top1_agreement=0.0, cosine=0.9, spread=10 * STEP),
            "(top-1 agreement 0.000; stock int8: top-1 agreement 0.000, fails the same way)",
        ),
        (
            _row(top1_agreement=0.0, cosine=0.9, spread=10 * STEP),
            _row(top1_agreement=0.625, cosine=0.9, spread=10 * STEP),
            "(top-1 agreement 0.000; stock int8: top-1 agreement 0.625)",
        ),
        (
            _row(cosine=0.1, spread=50 * STEP),
            _row(cosine=0.3, spread=50 * STEP),
            "50 int8 steps; stock int8: centered cosine 0.300, fails the same way)",
        ),
        (
            _row(cosine=0.1, spread=50 * STEP),
            _row(cosine=0.3, spread=2 * STEP),  # under 4 steps for stock: no verdict on it
            "50 int8 steps; stock int8: centered cosine 0.300)",
        ),
    ],
)
def test_the_refusal_gives_stocks_own_figure(fused: dict, stock: dict, said: str) -> None:
    """The line ends with stock's figure for the same output, and says when stock fails too;
    nothing of stock where it was not verified."""
    agreement = {"verified": True, "samples": 8, "outputs": [fused]}
    stock_agreement = {"verified": True, "samples": 8, "outputs": [stock]}
    verdict = usefulness.useless(agreement, [STEP], ["y"], "m", stock_agreement, [STEP])
    assert verdict is not None and verdict.endswith(said), verdict
    alone = usefulness.useless(agreement, [STEP], ["y"], "m", {"verified": False}, [STEP])
    assert alone is not None and "stock" not in alone
    assert alone == usefulness.useless(agreement, [STEP], ["y"], "m")


def test_centered_cosine_tells_a_follower_from_noise() -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(0.5, 0.1, (16, 10))
    assert centered_cosine(ref, ref + 0.3) == pytest.approx(1.0)  # an offset is no error here
    assert abs(centered_cosine(ref, np.full_like(ref, 0.2))) < 1e-9  # a constant output
    noisy = ref + rng.normal(0, 0.1, ref.shape)  # noise as large as the signal: ~0.7
    assert 0.55 < centered_cosine(ref, noisy) < 0.8
    assert abs(centered_cosine(ref, rng.normal(0.5, 0.1, ref.shape))) < 0.3


def _gelu_classifier(tmp_path: Path, act: str = "NONE") -> Path:
    np.random.seed(0)  # (rulekit's random weights)
    g = G()
    x = g.input((1, 16))
    h = g.op("GELU", [g.fc(x, 32, act=act)], (1, 32), approximate=False)
    y = g.op("SOFTMAX", [g.fc(h, 4)], (1, 4), beta=1.0)
    path = tmp_path / "gelu.tflite"
    path.write_bytes(g.bytes(y))
    return path


def _calib(tmp_path: Path, scale: float) -> Path:
    path = tmp_path / f"calib_{scale:g}.npy"
    data = np.random.default_rng(1).uniform(-1, 1, (32, 1, 16)) * scale
    np.save(path, data.astype(np.float32))
    return path


def test_a_calibration_scaled_by_1e30_is_refused_unless_accepted(tmp_path: Path, capsys) -> None:
    """It converted with top-1 agreement 0.000 on 16 of 16 inputs, exit 0."""
    model, calib = _gelu_classifier(tmp_path, "RELU6"), _calib(tmp_path, 1e30)
    out = tmp_path / "out"
    argv = ["convert", str(model), "--calib", str(calib), "-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.split("\r")[-1]  # (after the progress bars)
    assert err.count("\n") == 1 and err.startswith("tflfuse: error: model.tflite: output ")
    assert "(top-1 agreement 0.000" in err or "centered cosine 0.0" in err
    assert "; stock int8: " in err  # stock's own figure for that output
    assert "--accept-accuracy-loss keeps the model" in err and not out.exists()
    assert main([*argv, "--accept-accuracy-loss"]) == 0
    capsys.readouterr()
    assert (
        "kept with --accept-accuracy-loss: model.tflite: output" in (out / "report.md").read_text()
    )


def test_runtime_fits_the_fused_and_the_unfused_model(tmp_path: Path, capsys) -> None:
    """`convert --runtime tflite-runtime==2.7` fitted model.tflite only: model_unfused.tflite
    kept GELU (builtin 150, first in TensorFlow Lite 2.9) and failed the 2.7 check. Both run
    there now; stock stays as its route writes it, and the report says it does not."""
    model, calib, out = _gelu_classifier(tmp_path), _calib(tmp_path, 1.0), tmp_path / "out"
    runtime = "tflite-runtime==2.7"
    argv = ["convert", str(model), "--calib", str(calib), "-o", str(out), "--runtime", runtime]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "every op version the fused and unfused models need is there" in printed
    assert "The stock model (model_stock.tflite, as the plain route writes it) does not" in printed
    for name, runs in (("model", True), ("model_unfused", True), ("model_stock", False)):
        written = flatbuffer.load(out / f"{name}.tflite")
        assert runtimes.check(written, runtime).runtime_ok is runs, name
        assert ("GELU" in written.main.op_counts()) is not runs, name
    report = (out / "report.md").read_text()
    assert "every op version model.tflite and model_unfused.tflite need is there" in report
    import json

    r = json.loads((out / "report.json").read_text())
    assert "for tflite-runtime==2.7.0: SpellOutGelu x1" in r["unfused_route"]
    assert r["agreement"]["fused"]["outputs"][0]["cosine"] > usefulness.COSINE_BOUND
