"""The report's per-tensor quantization error, computed with one interpreter per model
(tflfuse/quantize/layer_error.py), gives litert-quantizer's validator's numbers exactly."""

from __future__ import annotations

import irgraphs
import numpy as np

from tflfuse.ir import Graph, Signature, flatbuffer
from tflfuse.quantize import layer_error
from tflfuse.quantize.quantize import quantize


def _conv_chain() -> bytes:
    g = Graph("main")
    x = g.add_tensor("input", (1, 6, 6, 3))
    c = irgraphs.conv(g, x, 8, name="a").output
    d = irgraphs.conv(g, c, 4, name="b").output
    m = irgraphs.model_of(g, [x], [d])
    m.signatures = [Signature("serving_default", 0, {"input": x}, {"out": d})]
    return flatbuffer.to_bytes(m)


def test_one_interpreter_per_model_gives_the_validators_numbers() -> None:
    from litert_quantizer import model_validator
    from litert_quantizer.utils import validation_utils

    data = _conv_chain()
    rng = np.random.default_rng(0)
    calib = rng.uniform(-1, 1, (6, 1, 6, 6, 3)).astype(np.float32)
    int8 = quantize(data, "int8", [calib.reshape(6, 6, 6, 3)], progress=False).data
    samples = [{"input": s} for s in calib[:4]]
    metrics = [validation_utils.ValidationErrorMetric.MSE]
    snr = getattr(validation_utils.ValidationErrorMetric, "SNR", None)
    metrics += [snr] if snr is not None else []
    theirs = model_validator.compare_model(  # what Quantizer.validate runs
        data, int8, {"serving_default": samples}, metrics, use_xnnpack=True, num_threads=1
    )
    single = theirs.get_signature_comparison_result("serving_default")
    outputs, intermediates = layer_error.compare(data, int8, "serving_default", samples, metrics)
    assert outputs == single.output_tensors
    assert intermediates == single.intermediate_tensors
    assert len(intermediates) >= 1 and all(v["mse"] > 0 for v in outputs.values())
    assert not layer_error.stateful(flatbuffer.from_bytes(data))


def test_a_model_over_the_activation_budget_gets_a_sentence_not_a_table(monkeypatch) -> None:
    """Over BUDGET bytes of float activations the table is not computed: one row saying why
    (the report prints it as a sentence), and the int8 model is the same bytes."""
    data = _conv_chain()
    calib = np.random.default_rng(0).uniform(-1, 1, (6, 6, 6, 3)).astype(np.float32)
    full = quantize(data, "int8", [calib], progress=False, layer_error=True)
    assert full.layer_error and "error" not in full.layer_error[0]
    monkeypatch.setattr(layer_error, "BUDGET", 100)
    held = layer_error.activation_bytes(flatbuffer.from_bytes(data))
    assert held > 100
    cut = quantize(data, "int8", [calib], progress=False, layer_error=True)
    assert cut.layer_error == [{"error": layer_error.skipped(held)}]
    assert "not computed" in cut.layer_error[0]["error"]
    assert cut.data == full.data
