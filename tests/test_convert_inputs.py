"""Recipes and calibration data for `tflfuse convert`: loading, overrides, checks, determinism.
Fast: no model conversion here (images are decoded with TensorFlow where it is installed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tflfuse.convert import recipe
from tflfuse.errors import TflfuseError
from tflfuse.quantize import calibration

SHAPE = (8, 8, 1)


@pytest.mark.parametrize("name", ["edgetpu", "xnnpack-int8", "cpu-float", "gpu-fp16"])
def test_shipped_recipes_load(name: str) -> None:
    r = recipe.load(name)
    assert r.name == name
    assert "remapper" not in r.grappler
    assert Path(r.source).parent == recipe.recipe_dir()


def test_recipe_fields_per_target() -> None:
    tpu, cpu, gpu = recipe.load("edgetpu"), recipe.load("cpu-float"), recipe.load("gpu-fp16")
    assert (tpu.quant_mode, tpu.input_type, tpu.output_type, tpu.target.name) == (
        "int8",
        "uint8",
        "uint8",
        "edgetpu",
    )
    assert recipe.load("xnnpack-int8").input_type == "int8"
    assert cpu.quant_mode == "none" and gpu.quant_mode == "float16"
    assert cpu.target.name == cpu.delegate == "xnnpack"  # rules for the runtime that will run it
    assert not tpu.select_tf_ops


def test_override_replaces_fields_and_records_them() -> None:
    r = recipe.load("edgetpu").override(input_type="int8", samples=10, target=None)
    assert (r.input_type, r.samples, r.target.name) == ("int8", 10, "edgetpu")
    assert r.overridden == ("input_type", "samples")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"quant_mode": "int4"}, "quantization mode"),
        ({"quant_mode": "none"}, "needs quantization mode int8"),  # edgetpu keeps uint8 I/O
        ({"select_tf_ops": True}, "builtin ops only"),
        ({"grappler": ["remapper"]}, "Grappler optimizer 'remapper'"),
        ({"colour": "red"}, "unknown recipe field"),
    ],
)
def test_bad_overrides_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(TflfuseError, match=message):
        recipe.load("edgetpu").override(**changes)


def test_recipe_file_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "mine.toml"
    good.write_text('name = "mine"\ntarget = "gpu"\n[quantization]\nmode = "float16"\n')
    r = recipe.load(good)
    assert (r.name, r.target.name, r.delegate, r.quant_mode) == ("mine", "gpu", "gpu", "float16")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(TflfuseError, match="not valid TOML"):
        recipe.load(bad)
    with pytest.raises(TflfuseError, match="unknown recipe 'nope'"):
        recipe.load("nope")


def _load(source, **kw):
    return calibration.load(source, [SHAPE], ["digits"], **kw)


def test_npy_npz_array_and_callable_give_the_same_samples(tmp_path: Path) -> None:
    data = np.random.default_rng(0).uniform(-1, 1, (12, *SHAPE)).astype(np.float32)
    np.save(tmp_path / "c.npy", data)
    np.savez(tmp_path / "c.npz", digits=data)
    outs = [
        _load(data),
        _load(tmp_path / "c.npy"),
        _load(tmp_path / "c.npz"),
        _load(lambda: iter(list(data))),
        _load(data[:, None]),  # (N, 1, H, W, C): batches of one
    ]
    for out in outs:
        assert len(out) == 1 and out[0].dtype == np.float32
        np.testing.assert_array_equal(out[0], data)


def test_subset_is_seeded(tmp_path: Path) -> None:
    data = np.random.default_rng(1).normal(size=(50, *SHAPE)).astype(np.float32)
    a = _load(data, samples=10, seed=3)[0]
    b = _load(data, samples=10, seed=3)[0]
    c = _load(data, samples=10, seed=4)[0]
    assert a.shape == (10, *SHAPE)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (np.zeros((3, 9, 9, 1), np.float32), r"needs \(N, 8, 8, 1\)"),
        (np.zeros((3, 8, 8, 1), np.uint8), "dtype uint8"),
        (np.full((3, 8, 8, 1), np.inf, np.float32), "192 NaN or Inf"),
        (np.zeros((0, 8, 8, 1), np.float32), "empty"),
        (np.array(["a"]), "not numeric"),
    ],
)
def test_bad_arrays(data: np.ndarray, message: str) -> None:
    with pytest.raises(TflfuseError, match=message):
        _load(data)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(TflfuseError, match="not found"):
        _load(tmp_path / "missing.npy")
    (tmp_path / "x.csv").write_text("1,2")
    with pytest.raises(TflfuseError, match=r"must be \.npy"):
        _load(tmp_path / "x.csv")
    np.savez(tmp_path / "two.npz", a=np.zeros((2, *SHAPE)), b=np.zeros((2, *SHAPE)))
    with pytest.raises(TflfuseError, match="2 arrays"):
        _load(tmp_path / "two.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TflfuseError, match="no images"):
        _load(tmp_path / "empty")
    (tmp_path / "broken.npy").write_bytes(b"not numpy")
    with pytest.raises(TflfuseError, match="not a readable"):
        _load(tmp_path / "broken.npy")


def test_image_folder_is_resized_and_scaled(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    folder = tmp_path / "imgs"
    folder.mkdir()
    for value in (0, 255):
        png = tf.io.encode_png(tf.fill((16, 16, 1), tf.constant(value, tf.uint8)))
        (folder / f"{value}.png").write_bytes(png.numpy())
    (folder / "notes.txt").write_text("ignored")
    (out,) = _load(folder, scale=2.0, offset=-1.0)
    assert out.shape == (2, *SHAPE)
    np.testing.assert_allclose(out[0], -1.0)  # files sorted: "0.png" then "255.png"
    np.testing.assert_allclose(out[1], 1.0, atol=1e-6)
