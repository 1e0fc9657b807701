"""Untrusted Keras files: code is found in the parsed config (any JSON formatting, any nesting,
.h5 and .keras) and refused before any loader runs; the end-to-end tests prove the refused code
would really have run (its function creates a marker file) and did not."""

from __future__ import annotations

import json
import zipfile

import pytest

from tflfuse.errors import TflfuseError
from tflfuse.sources.safety import check_keras_file, find_code, read_config

h5py = pytest.importorskip("h5py")


def layer(cls: str, name: str, module: str | None = "keras.layers", **config) -> dict:
    return {
        "module": module,
        "class_name": cls,
        "config": {"name": name, **config},
        "registered_name": None,
    }


def functional(*layers: dict, cls: str = "Functional", name: str = "m") -> dict:
    return {"module": "keras", "class_name": cls, "config": {"name": name, "layers": list(layers)}}


LAMBDA_K2 = layer("Lambda", "lam", function=["4wEAAAAAAA==\n", None, None], function_type="lambda")
CLEAN = functional(layer("InputLayer", "in"), layer("Dense", "d", units=3, activation="relu"))


# -- what counts as code ---------------------------------------------------------------------------
def test_clean_config_has_no_code() -> None:
    assert find_code(CLEAN) == []


def test_lambda_nested_in_sequential_in_functional_is_found_with_its_path() -> None:
    inner = functional(layer("Dense", "d"), LAMBDA_K2, cls="Sequential", name="inner")
    outer = functional(layer("InputLayer", "in"), functional(inner, name="mid"))
    findings = find_code(outer)
    assert [str(f) for f in findings] == [
        "Lambda layer 'lam' at config/layers[1]/config/layers[0]/config/layers[1]"
    ]


@pytest.mark.parametrize(
    "obj, what",
    [
        (
            layer("Dense", "d", activation={"class_name": "__lambda__", "config": {"code": "x"}}),
            "serialized Python function (__lambda__)",
        ),
        (
            {"module": None, "class_name": "L", "config": {}, "registered_name": "mine>L"},
            "custom object 'mine>L'",
        ),
        (layer("Evil", "e", module="evil.layers"), "Evil from module 'evil.layers'"),
        (
            layer("TFOpLambda", "w", module="tf_keras.layers", function="io.write_file"),
            "TFOpLambda layer 'w' calling tf.io.write_file",
        ),
        (layer("TorchModuleWrapper", "t"), "TorchModuleWrapper layer 't'"),
        ({"function_type": "function", "module": "os"}, "serialized Python function"),
    ],
)
def test_each_kind_of_code_is_found(obj: dict, what: str) -> None:
    findings = find_code(functional(layer("InputLayer", "in"), obj))
    assert len(findings) == 1 and findings[0].what.startswith(what), findings


def test_pure_tf_op_layers_are_not_code() -> None:
    """What `x + 3`, `x[:, 0]` and tf.reshape become in a tf.keras model (legacy MobileNetV3)."""
    ops = [
        layer("TFOpLambda", f"op{i}", module="tf_keras.src.layers", function=f)
        for i, f in enumerate(["__operators__.add", "math.multiply", "nn.relu6", "reshape"])
    ]
    sliced = layer(
        "SlicingOpLambda", "s", module="tf_keras.layers", function="__operators__.getitem"
    )
    assert find_code(functional(*ops, sliced)) == []


# -- reading configs: formats and formatting ------------------------------------------------------
def _h5(path, config_text: str) -> None:
    with h5py.File(path, "w") as f:
        f.attrs["model_config"] = config_text


MODEL = functional(layer("InputLayer", "in"), layer("ThresholdedReLU", "t", theta=0.1), LAMBDA_K2)


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(MODEL, separators=(",", ":")),  # compact: the old text check missed it
        json.dumps(MODEL, indent="\t"),
        json.dumps(MODEL).replace(": ", " :  \n "),
    ],
    ids=["compact", "tabs", "odd-whitespace"],
)
def test_h5_lambda_found_in_any_json_formatting(tmp_path, text: str) -> None:
    path = tmp_path / "m.h5"
    _h5(path, text)
    assert read_config(path) == MODEL
    with pytest.raises(TflfuseError, match=r"carries code \(Lambda layer 'lam' .*--allow-lambda"):
        check_keras_file(path)


def test_keras_zip_config_is_read_and_checked(tmp_path) -> None:
    path = tmp_path / "m.keras"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("config.json", json.dumps(MODEL, separators=(",", ":")))
        z.writestr("metadata.json", "{}")
    with pytest.raises(TflfuseError, match="Lambda layer 'lam'"):
        check_keras_file(path)
    clean = tmp_path / "clean.keras"
    with zipfile.ZipFile(clean, "w") as z:
        z.writestr("config.json", json.dumps(CLEAN))
    check_keras_file(clean)  # no error


def test_what_cannot_be_checked_is_refused(tmp_path) -> None:
    bad_json = tmp_path / "bad.h5"
    _h5(bad_json, '{"class_name": "Functional", "config": ')
    with pytest.raises(TflfuseError, match="not valid JSON"):
        check_keras_file(bad_json)
    no_config = tmp_path / "nocfg.keras"
    with zipfile.ZipFile(no_config, "w") as z:
        z.writestr("model.weights.h5", b"")
    with pytest.raises(TflfuseError, match=r"without config\.json"):
        check_keras_file(no_config)
    text = tmp_path / "x.h5"
    text.write_text("not a model")
    with pytest.raises(TflfuseError, match=r"neither a \.keras archive nor an HDF5"):
        check_keras_file(text)


def test_deep_nesting_does_not_overflow(tmp_path) -> None:
    deep: dict = LAMBDA_K2
    for _ in range(5000):
        deep = {"class_name": "Wrapper", "config": {"layer": deep}}
    assert len(find_code(deep)) == 1


# -- end to end: the code would run, and does not --------------------------------------------------
def _marker_lambda(tf_keras, marker):
    # the default argument is serialized with the function, so the loaded Lambda knows the path
    return tf_keras.layers.Lambda(
        lambda t, path=str(marker): (open(path, "w").close(), t)[1], name="lam"
    )


def _legacy_h5_with_marker(tmp_path, nested: bool):
    """A Keras 2 .h5 Keras 3 cannot load (ThresholdedReLU) with a Lambda that creates a marker
    file, its config rewritten as compact JSON."""
    tf_keras = pytest.importorskip("tf_keras")
    marker = tmp_path / "code_ran"
    inp = tf_keras.Input((4,))
    x = tf_keras.layers.ThresholdedReLU(0.1)(inp)
    lam = _marker_lambda(tf_keras, marker)
    y = tf_keras.Sequential([tf_keras.layers.Dense(4), lam])(x) if nested else lam(x)
    path = tmp_path / "legacy.h5"
    tf_keras.Model(inp, y).save(path, save_format="h5")
    marker.unlink()  # building the model ran the Lambda once
    with h5py.File(path, "r+") as f:
        config = json.loads(f.attrs["model_config"])
        f.attrs["model_config"] = json.dumps(config, separators=(",", ":"))
        assert '"class_name": "Lambda"' not in f.attrs["model_config"]
    return path, marker


@pytest.mark.parametrize("nested", [False, True], ids=["top-level", "nested-sequential"])
def test_legacy_h5_lambda_is_refused_and_its_code_does_not_run(tmp_path, nested: bool) -> None:
    from tflfuse.sources.keras import load_model

    path, marker = _legacy_h5_with_marker(tmp_path, nested)
    with pytest.raises(TflfuseError, match=r"carries code \(Lambda layer 'lam'"):
        load_model(path)
    assert not marker.exists()
    load_model(path, allow_lambda=True)  # trusted: it loads, and the code runs
    assert marker.exists()


def test_keras3_nested_lambda_is_refused_before_loading(tmp_path) -> None:
    keras = pytest.importorskip("keras")
    from tflfuse.sources.keras import load_model

    inp = keras.Input((4,))
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(lambda t: t * 2.0)])
    path = tmp_path / "nested.keras"
    keras.Model(inp, keras.layers.Dense(2)(inner(inp))).save(path)
    with pytest.raises(TflfuseError, match=r"carries code \(Lambda layer"):
        load_model(path)
