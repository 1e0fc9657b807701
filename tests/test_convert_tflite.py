"""`tflfuse convert MODEL.tflite`: a float .tflite from anywhere (litert-torch, onnx2tf) enters at
the float stage; an int8 one goes to the int8 rules only; what tflfuse cannot convert is one line.

Small models are built here (a TF function with PyTorch's NCHW interface, IR graphs); the real
litert-torch export in ../shared/models/pytorch is converted once per session (skips without it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("litert_quantizer")

from tflfuse.cli import main
from tflfuse.convert.pipeline import convert
from tflfuse.ir import Graph, Model, flatbuffer
from tflfuse.quantize import calibration
from tflfuse.verification.runs import run_float

PYTORCH = Path(__file__).resolve().parents[1].parent / "shared" / "models" / "pytorch"
RNG = np.random.default_rng(7)


def _nchw_tflite(channels_out_nchw: bool = True) -> bytes:
    """What litert-torch gives for a small conv net: NCHW input read through a TRANSPOSE, two
    convolutions (the first with RELU6, which litert-quantizer has no int8 config for once
    defused), and (optionally) an NCHW output written through a TRANSPOSE."""
    import tensorflow as tf

    w1 = tf.constant(RNG.normal(0, 0.5, (3, 3, 3, 8)).astype(np.float32))
    w2 = tf.constant(RNG.normal(0, 0.3, (3, 3, 8, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([1, 3, 16, 16], tf.float32, name="x")])
    def net(x):
        y = tf.transpose(x, [0, 2, 3, 1])
        y = tf.nn.relu6(tf.nn.conv2d(y, w1, 1, "SAME") + 0.1)
        y = tf.nn.conv2d(y, w2, 1, "SAME")
        return tf.transpose(y, [0, 3, 1, 2]) if channels_out_nchw else y

    converter = tf.lite.TFLiteConverter.from_concrete_functions([net.get_concrete_function()], net)
    return bytes(converter.convert())


@pytest.fixture(scope="session")
def nchw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("nchw") / "nchw.tflite"
    path.write_bytes(_nchw_tflite())
    return path


def _calib(shape: tuple[int, ...], n: int = 16) -> np.ndarray:
    return RNG.uniform(-1, 1, (n, *shape)).astype(np.float32)


def _ops(path_or_bytes: Path | bytes) -> list[str]:
    data = path_or_bytes if isinstance(path_or_bytes, bytes) else path_or_bytes.read_bytes()
    return [op.type for op in flatbuffer.from_bytes(data).main.ops]


# -- the float route -------------------------------------------------------------------------------
def test_bytes_in_float_recipe_out(nchw: Path, tmp_path: Path) -> None:
    res = convert(nchw.read_bytes(), "cpu-float", output_dir=tmp_path / "o", progress=False)
    r = res.report
    assert r["source_kind"]["entered_at"] == "float .tflite" and r["grappler"] == {}
    for name in ("fused", "unfused", "stock"):
        a = r["agreement"][name]
        assert a["verified"] and a["outputs"][0]["varies"] and a["max_abs"] <= 1e-5
    # unfused: the input defused (RELU6 and the bias ADD split off the first conv)
    assert _ops(res.unfused).count("RELU6") == 1 and "RELU6" not in _ops(res.fused)
    assert r["models"]["unfused"]["op_count"] > r["models"]["fused"]["op_count"]
    assert (tmp_path / "o" / "report.md").read_text().count("Not run: the source is a .tflite")


def test_a_tflite_is_recognised_by_its_identifier(nchw: Path, tmp_path: Path) -> None:
    from tflfuse.sources.keras import source_kind

    renamed = tmp_path / "model.bin"
    renamed.write_bytes(nchw.read_bytes())
    assert source_kind(renamed) == source_kind(nchw.read_bytes()) == "tflite"
    assert source_kind(tmp_path) == source_kind(tmp_path / "m.keras") == "tensorflow"
    res = convert(renamed, "cpu-float", output_dir=tmp_path / "o", progress=False)
    assert res.report["source_kind"]["kind"] == "tflite"


def test_channels_last_drops_the_layout_transposes(nchw: Path, tmp_path: Path) -> None:
    calib = _calib((3, 16, 16))  # the model's own (NCHW) layout, as given
    res = convert(nchw, "edgetpu", calib, tmp_path / "o", progress=False, channels_last=True)
    r = res.report
    fused, stock = flatbuffer.load(res.fused).main, flatbuffer.load(res.stock).main
    assert fused.inputs[0].shape == (1, 16, 16, 3) and fused.outputs[0].shape == (1, 16, 16, 4)
    assert "TRANSPOSE" not in _ops(res.fused) and "TRANSPOSE" not in _ops(res.unfused)
    assert stock.inputs[0].shape == (1, 3, 16, 16) and _ops(res.stock).count("TRANSPOSE") == 2
    assert r["interface"]["interface_change"] and r["interface"]["removed_transposes"] == 2
    assert "interface change" in (tmp_path / "o" / "report.md").read_text().lower()
    assert "TRANSPOSE removed" in r["edgetpu"]["channels_last"]
    # the unfused baseline (RELU6 split off: litert-quantizer route unavailable) has the new
    # interface too, and is fully int8
    unfused = flatbuffer.load(res.unfused).main
    assert unfused.inputs[0].shape == (1, 16, 16, 3) and "RELU6" in _ops(res.unfused)
    assert r["models"]["unfused"]["quantization"] == "int8"
    assert r["agreement"]["unfused"]["verified"]
    # measured in the source's layout: the channels-last model computes the same function
    assert r["float_agreement"]["fused"]["max_abs"] <= 1e-5
    q_err = r["agreement"]["fused"]["max_abs"]
    assert r["agreement"]["fused"]["outputs"][0]["varies"]
    assert q_err <= 1.5 * r["agreement"]["stock"]["max_abs"] + 1e-3


def test_channels_last_cli_accepts_nhwc_calibration(nchw: Path, tmp_path: Path, capsys) -> None:
    data = tmp_path / "nhwc.npy"
    np.save(data, _calib((16, 16, 3), 8))
    out = tmp_path / "o"
    args = ["convert", str(nchw), "--recipe", "cpu-float", "--calib", str(data), "-o", str(out)]
    assert main([*args, "--channels-last", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["quantization"]["calibration_samples"] == 8
    assert r["agreement"]["fused"]["max_abs"] <= 1e-5


def test_folder_images_are_laid_out_for_an_nchw_input(tmp_path: Path) -> None:
    import tensorflow as tf

    for i in range(2):
        image = RNG.integers(0, 255, (8, 8, 3), dtype=np.uint8)
        (tmp_path / f"{i}.png").write_bytes(tf.io.encode_png(image).numpy())
    (nhwc,) = calibration.load(tmp_path, [(8, 8, 3)], ["x"])
    (nchw,) = calibration.load(tmp_path, [(3, 8, 8)], ["x"])
    assert nchw.shape == (2, 3, 8, 8)
    np.testing.assert_array_equal(nchw, nhwc.transpose(0, 3, 1, 2))
    assert calibration.image_layout((3, 224, 224)) == "NCHW"
    assert calibration.image_layout((224, 224, 3)) == "NHWC"


# -- the int8 legalization runs on the quantized model ---------------------------------------------
def _side_head_model() -> bytes:
    """conv -> conv (output 0) and, placed first, a side output x @ x^T (BATCH_MATMUL of two
    activations, which the Edge TPU cannot map; nothing mapped depends on it)."""
    import tests.irgraphs as ig

    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 3))
    g.inputs = [x]
    side = g.add_tensor("side", (1, 8, 8, 8))
    g.add_op("BATCH_MATMUL", [x, x], [side], {"adj_x": False, "adj_y": True})
    c1 = ig.conv(g, x, 8, act="RELU", name="c1")
    c2 = ig.conv(g, c1.output, 4, name="c2")
    g.outputs = [side, c2.output]
    model = Model([g])
    model.validate()
    return flatbuffer.to_bytes(model)


def _oversized_transpose_model() -> bytes:
    """conv -> a channels-first TRANSPOSE of [1, 32, 32, 80] (81920 elements, over the 69696
    the Edge TPU is seen to map): only the int8 legalization can split it (each piece must keep
    one scale, so it waits for the quantized model)."""
    import tests.irgraphs as ig

    g = Graph("main")
    x = g.add_tensor("x", (1, 32, 32, 3))
    g.inputs = [x]
    c = ig.conv(g, x, 80, act="RELU", name="c1")
    y = g.add_tensor("y", (1, 80, 32, 32))
    perm = g.add_constant("perm", np.array([0, 3, 1, 2], np.int32))
    g.add_op("TRANSPOSE", [c.output, perm], [y])
    g.outputs = [y]
    model = Model([g])
    model.validate()
    return flatbuffer.to_bytes(model)


def test_edgetpu_int8_legalization_fires_on_the_quantized_model(tmp_path: Path) -> None:
    calib = _calib((32, 32, 3))
    res = convert(_oversized_transpose_model(), "edgetpu", calib, tmp_path / "o", progress=False)
    r = res.report
    leg = r["legalization"]
    assert leg["ran"] and leg["kept"] and leg["verification"]["ok"]
    assert leg["edgetpu_mapped"][1] > leg["edgetpu_mapped"][0]
    tpu = r["edgetpu"]
    assert tpu["fused"]["mapped"] > tpu["stock"]["mapped"]
    assert tpu["stock"]["cut"]["op"] == "TRANSPOSE" and "elements" in tpu["stock"]["cut"]["reason"]
    assert "cut" not in tpu["fused"]  # the pieces and their join map
    assert "Edge TPU mapping" in (tmp_path / "o" / "report.md").read_text()


def test_int8_input_goes_to_the_int8_rules_only(nchw: Path, tmp_path: Path) -> None:
    first = convert(nchw, "xnnpack-int8", _calib((3, 16, 16)), tmp_path / "a", progress=False)
    given = first.stock.read_bytes()
    res = convert(given, "edgetpu", output_dir=tmp_path / "b", progress=False)
    r = res.report
    assert r["source_kind"]["quantized_input"] and any("already int8" in n for n in r["notices"])
    assert r["quantization"]["calibration_samples"] == 0
    assert "not re-quantized" in r["quantization"]["fused_route"]
    assert res.stock.read_bytes() == flatbuffer.to_bytes(flatbuffer.from_bytes(given))
    assert [t.dtype for t in flatbuffer.load(res.fused).main.inputs] == ["UINT8"]
    assert r["agreement"]["fused"]["verified"] and r["agreement"]["fused"]["outputs"][0]["varies"]
    x = [_calib((3, 16, 16), 4)]
    ref, got = run_float(given, x)[0], run_float(res.fused.read_bytes(), x)[0]
    step = float(flatbuffer.from_bytes(given).main.outputs[0].quantization.scale[0])
    assert np.max(np.abs(ref - got)) <= 3 * step


# -- what tflfuse cannot convert -------------------------------------------------------------------
def _two_subgraphs() -> bytes:
    model = flatbuffer.from_bytes(_side_head_model())
    extra = Graph("second")
    a = extra.add_tensor("a", (1, 4))
    b = extra.add_tensor("b", (1, 4))
    extra.add_op("RELU", [a], [b])
    extra.inputs, extra.outputs = [a], [b]
    model.subgraphs.append(extra)
    return flatbuffer.to_bytes(model)


def _dynamic() -> bytes:
    model = flatbuffer.from_bytes(_side_head_model())
    model.main.inputs[0].shape_signature = (1, -1, -1, 3)
    return flatbuffer.to_bytes(model)


def _custom_op() -> bytes:
    g = Graph("main")
    x, y = g.add_tensor("x", (1, 4)), g.add_tensor("y", (1, 4))
    g.add_op("CUSTOM", [x], [y], custom_code="NotARealOp")
    g.inputs, g.outputs = [x], [y]
    return flatbuffer.to_bytes(Model([g]))


def _xnnpack_only_custom_op() -> bytes:
    """MediaPipe's Convolution2DTransposeBias (selfie segmentation): XNNPACK has a kernel for it
    (float), the built-in kernels have none. Options: TfLiteTransposeConvParams (VALID,
    stride 2, 2)."""
    g = Graph("main")
    x, y = g.add_tensor("x", (1, 4, 4, 8)), g.add_tensor("y", (1, 8, 8, 4))
    w = g.add_constant("w", np.random.default_rng(0).normal(size=(4, 2, 2, 8)).astype(np.float32))
    b = g.add_constant("b", np.zeros(4, np.float32))
    options = np.array([2, 2, 2], np.int32).tobytes()
    g.add_op("CUSTOM", [x, w, b], [y], custom_code="Convolution2DTransposeBias",
             custom_options=options)  # fmt: skip
    g.inputs, g.outputs = [x], [y]
    return flatbuffer.to_bytes(Model([g]))


def test_a_custom_op_only_xnnpack_runs_is_refused_saying_so(tmp_path, capsys) -> None:
    """The default interpreter runs the model (XNNPACK takes the op); the built-in kernels, on
    which convert checks everything it writes, do not: one line that says both."""
    from tflfuse.device.interpreter import make_interpreter

    data = _xnnpack_only_custom_op()
    interp = make_interpreter(data, delegate="xnnpack")  # runs, and computes something
    interp.set_tensor(interp.get_input_details()[0]["index"], np.ones((1, 4, 4, 8), np.float32))
    interp.invoke()
    assert np.ptp(interp.get_tensor(interp.get_output_details()[0]["index"])) > 0
    with pytest.raises(Exception, match="unresolved custom op"):
        make_interpreter(data, delegate="none")
    path = tmp_path / "selfie_like.tflite"
    path.write_bytes(data)
    rc = main(["convert", str(path), "--recipe", "xnnpack-int8", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0] == (
        f"tflfuse: error: {path}: cannot convert it: custom op Convolution2DTransposeBias has a"
        " kernel only in XNNPACK (the default interpreter runs the model; the built-in and"
        " reference kernels cannot), and tflfuse checks every model it writes on those kernels"
    )
    assert not (tmp_path / "out").exists()


def _float16(nchw_bytes: bytes) -> bytes:
    """The model with float16 conv weights read through DEQUANTIZE, as the converter's float16
    quantization writes them."""
    model = flatbuffer.from_bytes(nchw_bytes)
    for t in model.main.tensors:
        if t.is_constant and t.dtype == "FLOAT32" and t.data.ndim == 4:
            t.data = t.data.astype(np.float16)
            t.dtype = "FLOAT16"
    g = model.main
    for op in list(g.ops):
        for i, t in enumerate(op.inputs):
            if t is not None and t.dtype == "FLOAT16":
                f = g.add_tensor(t.name + "_f32", t.shape)
                g.add_op("DEQUANTIZE", [t], [f], before=op)
                op.set_input(i, f)
    return flatbuffer.to_bytes(model)


@pytest.mark.parametrize(
    ("problem", "expect"),
    [
        ("subgraphs", "has 2 subgraphs"),
        ("dynamic", "dynamic dimensions"),
        ("custom", "custom op NotARealOp without a kernel in ai-edge-litert"),
        ("corrupt", "not a valid TFLite model"),
    ],
)
def test_what_tflfuse_cannot_convert_is_one_line(problem, expect, nchw, tmp_path, capsys) -> None:
    path = tmp_path / f"{problem}.tflite"
    make = {
        "subgraphs": _two_subgraphs,
        "dynamic": _dynamic,
        "custom": _custom_op,
        "corrupt": lambda: b"\x18\x00\x00\x00TFL3" + b"\x07" * 64,
    }[problem]
    path.write_bytes(make())
    before = sorted(p.name for p in tmp_path.iterdir())
    rc = main(["convert", str(path), "--recipe", "cpu-float", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith(f"tflfuse: error: {path}: ") and expect in err[-1], err[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_float16_weights_make_a_float_model(nchw: Path, tmp_path: Path) -> None:
    """Weights stored as float16 behind DEQUANTIZE (the converter's float16 option, MediaPipe):
    widened exactly to float32 and converted as the float model it is; the report says so."""
    given = _float16(nchw.read_bytes())
    res = convert(given, "xnnpack-int8", _calib((3, 16, 16)), tmp_path / "o", progress=False)
    r = res.report
    assert r["source_kind"]["float16_weights"] == {"constants": 2, "sparse": 0}
    assert any("stores its weights as float16" in n for n in r["notices"])
    assert r["quantization"]["float_ops_left"] == []
    # litert-quantizer on the float16 form writes conv weights with zero points the interpreter
    # refuses: stock is its recipe on the widened input, and says why
    assert "float16 weights widened to float32" in r["quantization"]["stock_route"]
    assert "FLOAT16" not in flatbuffer.load(res.fused).main.op_counts()
    # measured against the model as given (float16 weights): the widening changed nothing
    assert r["float_agreement"]["fused"]["max_abs"] <= 1e-5
    a = r["agreement"]["fused"]
    assert a["verified"] and a["outputs"][0]["varies"]


@pytest.mark.parametrize("pad_value", [-np.inf, -3.4028235e38], ids=["torch", "onnx2tf"])
def test_a_padded_max_pool_converts_with_every_baseline(pad_value: float, tmp_path: Path) -> None:
    """torch's MaxPool2d(3, 2, padding=1) after conv + ReLU (ResNet's stem) exports as PADV2 with
    -inf (onnx2tf: -3.4e38): the unfused and stock models keep it, and their calibration gave
    scale inf, which aborted the interpreter. Now every scale is usable and all three run."""
    from tests.test_calibrated_ranges import _padded_pool

    g = _padded_pool(pad_value, relu=True)
    calib = _calib((8, 8, 3), 32)
    res = convert(g.bytes(g.out), "edgetpu", calib, tmp_path / "o", progress=False)
    r = res.report
    assert "PADV2" in _ops(res.stock) and "PADV2" in _ops(res.unfused)
    assert "PADV2" not in _ops(res.fused)  # the exporter rule: a max over x >= 0 pads with 0
    for name in ("fused", "unfused", "stock"):
        a = r["agreement"][name]
        assert a["verified"] and a["outputs"][0]["varies"], name
        spread = a["outputs"][0]["reference_range"]
        spread = spread[1] - spread[0] if isinstance(spread, list) else spread
        assert a["max_abs"] <= 0.05 * spread, (name, a["max_abs"], spread)
        for pad in flatbuffer.load(res.output_dir / r["files"][name]).main.ops_of("PADV2"):
            assert pad.inputs[2].data.reshape(-1).tolist() == [-128]  # the lowest int8


def test_channels_last_on_an_nhwc_model_is_refused(tmp_path: Path) -> None:
    from tflfuse.errors import TflfuseError

    with pytest.raises(TflfuseError, match="no input is read through an NCHW->NHWC TRANSPOSE"):
        convert(_side_head_model(), "cpu-float", output_dir=tmp_path / "o", channels_last=True)
    assert not (tmp_path / "o").exists()


# -- a real litert-torch export --------------------------------------------------------------------
@pytest.fixture(scope="session")
def torch_mobilenet(tmp_path_factory: pytest.TempPathFactory):
    path = PYTORCH / "mobilenet_v2.tflite"
    if not path.is_file():
        pytest.skip("../shared/models/pytorch is absent")
    out = tmp_path_factory.mktemp("pt") / "out"
    calib = np.random.default_rng(0).uniform(-2, 2, (16, 3, 128, 128)).astype(np.float32)
    return convert(path, "edgetpu", calib, out, progress=False)


def test_litert_torch_mobilenet_to_edgetpu(torch_mobilenet) -> None:
    r = torch_mobilenet.report
    assert r["source_kind"]["kind"] == "tflite"
    assert "on the input as given" in r["quantization"]["stock_route"]
    assert r["quantization"]["edgetpu_valid"] and r["quantization"]["float_ops_left"] == []
    for name in ("fused", "unfused", "stock"):
        a = r["agreement"][name]
        assert a["verified"] and a["outputs"][0]["varies"]
        assert a["outputs"][0]["top1_agreement"] >= 0.9
        g = flatbuffer.load(torch_mobilenet.output_dir / r["files"][name]).main
        assert [t.dtype for t in g.inputs] == ["UINT8"] and g.inputs[0].shape == (1, 3, 128, 128)
    assert r["models"]["unfused"]["op_count"] > r["models"]["fused"]["op_count"]
    assert r["legalization"]["ran"] and r["legalization"]["kept"]
    tpu = r["edgetpu"]
    assert tpu["fused"]["mapped"] >= tpu["stock"]["mapped"]
    # The NCHW -> NHWC input TRANSPOSE (perm 120 over its non-trivial dims) is a form no compiled
    # model shows mapped; the layout legalization spells it per channel (SLICE, RESHAPE,
    # CONCATENATION along the channels: forms shown mapped), so every op of the fused model maps
    # on the evidence reading (`--channels-last` removes the transpose instead).
    assert r["legalization"]["fired"].get("CutTransposeIntoShownForms", 0) >= 1
    assert tpu["fused"]["mapped"] == tpu["fused"]["ops"]
    assert not tpu["fused"].get("other_readings")


# -- ONNX, through onnx2tf -------------------------------------------------------------------------
def test_onnx_model_through_onnx2tf(tmp_path: Path) -> None:
    """An NCHW ONNX model (as PyTorch exports them; made here with tf2onnx) converted by onnx2tf,
    which gives the .tflite an NHWC input, then `tflfuse convert` on that .tflite. Four channels:
    onnx2tf 1.28 downloads sample images from GitHub for any 3-channel 4-D input (no network
    in tests)."""
    pytest.importorskip("tf2onnx")
    onnx2tf = pytest.importorskip("onnx2tf")
    import keras
    import tensorflow as tf
    import tf2onnx

    keras.utils.set_random_seed(3)
    inp = keras.Input((12, 12, 4), batch_size=1, name="x")
    y = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    y = keras.layers.GlobalAveragePooling2D()(y)
    model = keras.Model(inp, keras.layers.Dense(5)(y))
    spec = (tf.TensorSpec((1, 4, 12, 12), tf.float32, name="x"),)
    fn = tf.function(lambda x: model(tf.transpose(x, [0, 2, 3, 1])), input_signature=spec)
    onnx_path = tmp_path / "m.onnx"
    tf2onnx.convert.from_function(fn, input_signature=spec, opset=13, output_path=str(onnx_path))
    onnx2tf.convert(
        input_onnx_file_path=str(onnx_path),
        output_folder_path=str(tmp_path / "o2t"),
        non_verbose=True,
    )
    tflite = tmp_path / "o2t" / "m_float32.tflite"
    shape = flatbuffer.load(tflite).main.inputs[0].shape
    assert shape == (1, 12, 12, 4)  # onnx2tf lays the input out NHWC
    x = _calib((12, 12, 4), 4)
    want = fn(tf.constant(x[:1].transpose(0, 3, 1, 2))).numpy()
    got = run_float(tflite.read_bytes(), [x[:1]])[0]
    assert np.max(np.abs(want - got)) <= 1e-4  # onnx2tf kept the function
    res = convert(tflite, "xnnpack-int8", _calib((12, 12, 4)), tmp_path / "o", progress=False)
    r = res.report
    assert r["float_agreement"]["fused"]["max_abs"] <= 1e-5
    assert r["agreement"]["fused"]["verified"] and r["agreement"]["fused"]["outputs"][0]["varies"]
    assert r["quantization"]["float_ops_left"] == []
