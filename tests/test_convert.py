"""`tflfuse convert` end to end on a small CNN trained here on sklearn's digits (real labelled
images, no download): the three models, their agreement, recipes, I/O types and bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("sklearn")

from tflfuse.cli import main
from tflfuse.ir import flatbuffer
from tflfuse.verification.runs import run_float
from tflfuse.verification.verify import compare


@pytest.fixture(scope="session")
def digits() -> dict[str, np.ndarray]:
    from tflfuse.examples.digits import load_split

    split = load_split()
    return {"xtr": split.x_train, "ytr": split.y_train, "xte": split.x_test, "yte": split.y_test}


@pytest.fixture(scope="session")
def cnn(digits: dict[str, np.ndarray]) -> object:
    """Conv-BN-ReLU x2, pooling, dense softmax: unfused it is ~3x the ops of the fused model."""
    from tflfuse.examples.digits import DigitsSplit, train_cnn

    return train_cnn(DigitsSplit(digits["xtr"], digits["ytr"], digits["xte"], digits["yte"]))


def _accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(probs.argmax(-1) == labels))


@pytest.fixture(scope="session")
def int8_run(cnn: object, digits: dict[str, np.ndarray], tmp_path_factory: pytest.TempPathFactory):
    from tflfuse.convert.pipeline import convert_keras

    out = tmp_path_factory.mktemp("int8") / "out"
    return convert_keras(
        cnn, "xnnpack-int8", calibration=digits["xtr"], output_dir=out, progress=False
    )


@pytest.fixture(scope="session")
def float_run(cnn: object, tmp_path_factory: pytest.TempPathFactory):
    from tflfuse.convert.pipeline import convert_keras

    out = tmp_path_factory.mktemp("float") / "out"
    return convert_keras(cnn, "cpu-float", output_dir=out, progress=False)


def test_int8_fused_accuracy_within_1_5_points_of_keras(int8_run, cnn, digits) -> None:
    keras_acc = _accuracy(cnn.predict(digits["xte"], verbose=0), digits["yte"])
    assert keras_acc > 0.85, "the test CNN did not learn; the comparison would mean nothing"
    probs = run_float(int8_run.fused.read_bytes(), [digits["xte"]])[0]
    assert abs(_accuracy(probs, digits["yte"]) - keras_acc) <= 0.015


def test_fused_and_unfused_float_models_agree_to_1e_5(float_run, digits) -> None:
    fused, unfused = float_run.fused.read_bytes(), float_run.unfused.read_bytes()
    a = run_float(fused, [digits["xte"][:64]])[0]
    b = run_float(unfused, [digits["xte"][:64]])[0]
    assert not np.allclose(a, a[:1]), "outputs do not vary with the input"
    assert np.max(np.abs(a - b)) <= 1e-5
    assert compare(fused, unfused, atol=1e-5, rtol=0).ok


def test_unfused_blocks_fusion_without_padding(float_run) -> None:
    r = float_run.report
    fused, unfused = r["models"]["fused"], r["models"]["unfused"]
    assert unfused["op_count"] > fused["op_count"]
    # every unfused op does arithmetic: no identities or copies to inflate the count
    assert not {"RESHAPE", "QUANTIZE", "DEQUANTIZE"} & set(unfused["op_counts"])
    assert unfused["op_counts"]["CONV_2D"] == fused["op_counts"]["CONV_2D"] == 2
    assert unfused["activation_bytes"] > fused["activation_bytes"]


def test_three_models_share_one_signature(int8_run) -> None:
    sigs = []
    for path in (int8_run.fused, int8_run.unfused, int8_run.stock):
        model = flatbuffer.load(path)
        (sig,) = model.signatures
        sigs.append(
            (
                sig.key,
                [(k, t.shape, t.dtype) for k, t in sig.inputs.items()],
                [(k, t.shape, t.dtype) for k, t in sig.outputs.items()],
            )
        )
        assert list(sig.outputs.values()) == model.main.outputs
    assert sigs[0] == sigs[1] == sigs[2]
    assert sigs[0][1] == [("digits", (1, 8, 8, 1), "INT8")]


def test_int8_report_contents(int8_run) -> None:
    r = json.loads((int8_run.output_dir / "report.json").read_text())
    assert (int8_run.output_dir / "report.md").read_text().startswith("# tflfuse conversion")
    assert r["quantization"]["float_ops_left"] == []
    assert r["quantization"]["calibration_samples"] == 100
    assert r["grappler"]["nodes_after"] < r["grappler"]["nodes_before"]
    assert "remapper" not in r["grappler"]["optimizers"]
    assert r["quantization"]["layer_error"], "no per-tensor quantization error"
    for name in ("fused", "unfused", "stock"):
        a = r["agreement"][name]
        assert a["verified"] and a["outputs"][0]["varies"]
        assert a["outputs"][0]["top1_agreement"] >= 0.9
        assert a["max_abs"] < 0.25
    assert r["float_agreement"]["fused"]["max_abs"] <= 1e-5
    assert any("pinned to 1" in n for n in r["notices"])


def test_edgetpu_recipe_gives_full_int8_with_uint8_io(cnn, digits, tmp_path) -> None:
    from tflfuse.convert.pipeline import convert_keras

    res = convert_keras(
        cnn, "edgetpu", calibration=digits["xtr"][:32], output_dir=tmp_path / "o", progress=False
    )
    for path in (res.fused, res.stock):
        g = flatbuffer.load(path).main
        assert [t.dtype for t in g.inputs] == ["UINT8"]
        assert [t.dtype for t in g.outputs] == ["UINT8"]
    assert res.report["quantization"]["edgetpu_valid"]
    assert res.report["agreement"]["fused"]["outputs"][0]["top1_agreement"] >= 0.9
    d = res.report["delegate_check"]
    if d["checked"]:
        assert d["cpu"] == 0


def test_cli_convert_with_recipe_file_and_override(cnn, digits, tmp_path) -> None:
    model = tmp_path / "cnn.keras"
    cnn.save(model)
    calib = tmp_path / "calib.npy"
    np.save(calib, digits["xtr"][:20])
    recipe = tmp_path / "mine.toml"
    recipe.write_text('name = "mine"\ntarget = "xnnpack"\n[quantization]\nmode = "dynamic"\n')
    out = tmp_path / "out"
    rc = main(
        [
            "convert",
            str(model),
            "--recipe",
            str(recipe),
            "--calib",
            str(calib),
            "-o",
            str(out),
            "--quant",
            "float16",
        ]
    )
    assert rc == 0
    r = json.loads((out / "report.json").read_text())
    assert r["recipe"]["name"] == "mine" and r["recipe"]["quant_mode"] == "float16"
    assert r["models"]["fused"]["quantization"] == "float16"
    assert sorted(p.name for p in out.iterdir()) == [
        ".tflfuse-manifest.json",  # what tflfuse wrote: all --force may replace (tflfuse.files)
        "model.tflite",
        "model_stock.tflite",
        "model_unfused.tflite",
        "report.json",
        "report.md",
    ]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize(
    "problem",
    [
        "no_calib",
        "wrong_shape",
        "int_dtype",
        "nan",
        "empty_folder",
        "no_parent",
        "output_is_file",
        "bad_recipe",
        "empty_npy",
        "truncated_npz",
        "output_not_empty",
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(problem, cnn, digits, tmp_path, capsys) -> None:
    model = tmp_path / "cnn.keras"
    cnn.save(model)
    calib = tmp_path / "calib.npy"
    args = ["convert", str(model), "-o", str(tmp_path / "out")]
    data = digits["xtr"][:8]
    expect = {
        "no_calib": "needs calibration data",
        "wrong_shape": "the model input needs (N, 8, 8, 1)",
        "int_dtype": "dtype int64",
        "nan": "NaN or Inf",
        "empty_folder": "no images",
        "no_parent": "does not exist",
        "output_is_file": "is not a folder",
        "bad_recipe": "unknown recipe",
        "empty_npy": "calib.npy: not a readable .npy file: the file is empty",
        "truncated_npz": "calib.npz: not a readable .npz file: truncated or corrupt",
        "output_not_empty": "out: folder is not empty and holds no tflfuse result",
    }[problem]
    if problem == "wrong_shape":
        np.save(calib, np.zeros((4, 9, 9, 1), np.float32))
    elif problem == "int_dtype":
        np.save(calib, np.zeros((4, 8, 8, 1), np.int64))
    elif problem == "nan":
        data = data.copy()
        data[0, 0, 0, 0] = np.nan
        np.save(calib, data)
    else:
        np.save(calib, data)
    if problem != "no_calib":
        args += ["--calib", str(calib)]
    if problem == "empty_folder":
        (tmp_path / "images").mkdir()
        args[-1] = str(tmp_path / "images")
    if problem == "no_parent":
        args[3] = str(tmp_path / "missing" / "out")
    if problem == "output_is_file":
        (tmp_path / "out").write_text("x")
    if problem == "bad_recipe":
        args += ["--recipe", "tpu9000"]
    if problem == "empty_npy":
        calib.write_bytes(b"")
    if problem == "truncated_npz":
        np.savez(tmp_path / "calib.npz", digits=data)
        whole = (tmp_path / "calib.npz").read_bytes()
        (tmp_path / "calib.npz").write_bytes(whole[: len(whole) // 2])
        args[-1] = str(tmp_path / "calib.npz")
    if problem == "output_not_empty":
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "bench.json").write_text("{}")
    before = _leftovers(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("tflfuse: error: ") and expect in err[-1]
    assert _leftovers(tmp_path) == before


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores modes")
def test_unwritable_output_folder(cnn, tmp_path, capsys) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        from tflfuse.convert.pipeline import convert_keras
        from tflfuse.errors import TflfuseError

        with pytest.raises(TflfuseError, match="cannot write"):
            convert_keras(cnn, "cpu-float", output_dir=locked / "out", progress=False)
    finally:
        locked.chmod(0o700)


def test_lambda_layer_refused_in_safe_mode(tmp_path) -> None:
    import keras

    inp = keras.Input((4,))
    model = keras.Model(inp, keras.layers.Lambda(lambda x: x * 2.0)(inp))
    path = tmp_path / "lam.keras"
    model.save(path)
    from tflfuse.convert.pipeline import load_model
    from tflfuse.errors import TflfuseError

    with pytest.raises(TflfuseError, match="--allow-lambda"):
        load_model(path)
    assert load_model(path, allow_lambda=True).input_shapes == [(4,)]


def test_tf_op_without_builtin_is_named(tmp_path) -> None:
    import tensorflow as tf

    from tflfuse.convert.pipeline import convert_keras
    from tflfuse.errors import TflfuseError

    @tf.function(input_signature=[tf.TensorSpec([1, 4, 4], tf.float32)])
    def det(x):
        return tf.linalg.det(tf.raw_ops.MatrixInverse(input=x)) + 1.0

    with pytest.raises(TflfuseError, match=r"MatrixInverse.*TFLite builtins only"):
        convert_keras(det, "cpu-float", output_dir=tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()


def test_savedmodel_and_tf_function_inputs(tmp_path) -> None:
    import tensorflow as tf

    from tflfuse.convert.pipeline import convert_keras

    class Affine(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32)])
        def __call__(self, x):
            return {"y": tf.nn.relu(tf.matmul(x, self.w) + 0.5)}

    module = Affine()
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures=module.__call__)
    res = convert_keras(tmp_path / "sm", "cpu-float", output_dir=tmp_path / "o", progress=False)
    r = res.report
    assert r["inputs"][0]["shape"] == [1, 6] and r["outputs"] == ["y"]
    assert r["agreement"]["fused"]["max_abs"] <= 1e-5
    assert r["agreement"]["unfused"]["max_abs"] <= 1e-5
    assert r["models"]["unfused"]["op_count"] >= r["models"]["fused"]["op_count"]


def test_same_seed_gives_the_same_int8_model(int8_run, cnn, digits, tmp_path) -> None:
    from tflfuse.convert.pipeline import convert_keras

    again = convert_keras(
        cnn, "xnnpack-int8", calibration=digits["xtr"], output_dir=tmp_path / "o", progress=False
    )
    # tensor names carry TF's per-trace counters; ops, quantization and outputs must match
    for a, b in ((again.fused, int8_run.fused), (again.unfused, int8_run.unfused)):
        ga, gb = flatbuffer.load(a).main, flatbuffer.load(b).main
        assert [op.type for op in ga.ops] == [op.type for op in gb.ops]
        for ta, tb in zip(ga.tensors, gb.tensors):
            assert ta.quantization is None or ta.quantization.same_as(tb.quantization)
        xs = [digits["xte"][:32]]
        np.testing.assert_array_equal(
            run_float(a.read_bytes(), xs)[0], run_float(b.read_bytes(), xs)[0]
        )


def test_legacy_h5_from_tf_keras(tmp_path, capsys) -> None:
    tf_keras = pytest.importorskip("tf_keras")
    tf_keras.utils.set_random_seed(1)
    model = tf_keras.Sequential(
        [
            tf_keras.layers.InputLayer((6, 6, 2)),
            tf_keras.layers.DepthwiseConv2D(3, padding="same"),
            tf_keras.layers.BatchNormalization(
                moving_mean_initializer="random_normal", moving_variance_initializer="ones"
            ),
            tf_keras.layers.ReLU(6.0),
            tf_keras.layers.Flatten(),
            tf_keras.layers.Dense(3),
        ]
    )
    path = tmp_path / "legacy.h5"
    model.save(path, save_format="h5")
    out = tmp_path / "out"
    assert main(["convert", str(path), "--recipe", "cpu-float", "-o", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["agreement"]["fused"]["max_abs"] <= 1e-5
    assert r["agreement"]["unfused"]["outputs"][0]["varies"]
    assert r["models"]["unfused"]["op_count"] > r["models"]["fused"]["op_count"]


def test_legacy_h5_lambda_refused_before_loading(tmp_path) -> None:
    tf_keras = pytest.importorskip("tf_keras")
    from tflfuse.convert.pipeline import load_model
    from tflfuse.errors import TflfuseError

    model = tf_keras.Sequential(
        [tf_keras.layers.InputLayer((4,)), tf_keras.layers.Lambda(lambda x: x + 1.0)]
    )
    path = tmp_path / "lam.h5"
    model.save(path, save_format="h5")
    with pytest.raises(TflfuseError, match=r"Lambda layer.*--allow-lambda"):
        load_model(path)


def test_dynamic_range_recipe_override(cnn, digits, tmp_path) -> None:
    from tflfuse.convert.pipeline import convert_keras

    res = convert_keras(
        cnn, "cpu-float", output_dir=tmp_path / "o", progress=False, quant_mode="dynamic"
    )
    r = res.report
    assert r["recipe"]["overridden"] == ["quant_mode"]
    assert r["models"]["fused"]["quantization"] == "dynamic-range"
    assert r["models"]["fused"]["parameter_bytes"] < r["float_models"]["fused"]["parameter_bytes"]
    assert r["agreement"]["fused"]["outputs"][0]["top1_agreement"] >= 0.9


def test_batch_flag_pins_another_size(cnn, digits, tmp_path) -> None:
    from tflfuse.convert.pipeline import convert_keras

    res = convert_keras(
        cnn,
        "xnnpack-int8",
        calibration=digits["xtr"][:40],
        output_dir=tmp_path / "o",
        progress=False,
        batch=4,
    )
    for path in (res.fused, res.unfused, res.stock):
        assert flatbuffer.load(path).main.inputs[0].shape == (4, 8, 8, 1)
    assert any("pinned to 4" in n for n in res.report["notices"])
    a = res.report["agreement"]["fused"]
    assert a["verified"] and a["samples"] == 16 and a["outputs"][0]["top1_agreement"] >= 0.9


def test_int8_fused_error_is_no_worse_than_stock_ptq(int8_run) -> None:
    """Calibration keeps the data's whole range (TFLite's rule); litert-quantizer's default
    moving average clipped outputs and made the fused model ~15x worse than stock here."""
    agreement = int8_run.report["agreement"]
    fused, stock = agreement["fused"]["max_abs"], agreement["stock"]["max_abs"]
    assert agreement["fused"]["outputs"][0]["varies"]
    assert fused <= 1.5 * stock + 1e-3


def test_exact_gelu_converts_to_the_builtin(tmp_path) -> None:
    """Grappler's CSE reorders commutative inputs and hides Keras' exact GELU from the converter
    (it stays a tf.Erfc); convert drops that pass for such a model and says so."""
    import keras

    from tflfuse.convert.pipeline import convert_keras

    keras.utils.set_random_seed(1)
    inp = keras.Input((8,), batch_size=1)
    x = keras.layers.Dense(8)(inp)
    out = keras.layers.Dense(8, activation="gelu")(x)
    result = convert_keras(
        keras.Model(inp, out), "cpu-float", output_dir=tmp_path / "o", progress=False
    )
    ops = [op.type for op in flatbuffer.load(result.fused).main.ops]
    assert "GELU" in ops and "CUSTOM" not in ops
    assert result.report["grappler"]["dropped"]["optimizers"] == ["common_subgraph_elimination"]
    assert result.report["agreement"]["fused"]["max_abs"] < 1e-5
