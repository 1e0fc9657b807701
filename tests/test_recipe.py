"""Recipes are checked against their schema: unknown keys and wrong types are one-line errors
naming the key; an override's error names the override (the CLI's flag). Fast: no TensorFlow."""

from __future__ import annotations

from pathlib import Path

import pytest

from tflfuse.cli import main
from tflfuse.convert import recipe
from tflfuse.convert.recipe import RecipeError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mine.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # a typo'd table used to be ignored, silently giving int8
        (
            '[quantisation]\nmode = "none"\n',
            "unknown key 'quantisation' (did you mean 'quantization'?)",
        ),
        ('[quantization]\nmod = "none"\n', "unknown key quantization.'mod' (did you mean 'mode'?)"),
        ("quantization = 5\n", "quantization must be a table ([quantization] with mode"),
        (
            '[calibration]\nscale = "big"\n',
            "calibration.scale must be a number, not a string ('big')",
        ),
        ('[grappler]\noptimizers = "constfold"\n', "grappler.optimizers must be a list of strings"),
        ("level = true\n", "level must be an integer, not a boolean (True)"),
        ("[quantization]\nsamples = 2.5\n", "quantization.samples must be an integer"),
        ('[converter]\nselect_tf_ops = "yes"\n', "converter.select_tf_ops must be true or false"),
        ('target = {name = "gpu"}\n', "target must be a value, not a table"),
        ('target = "tpu"\n', "target 'tpu' is not a target"),
        ("[quantization]\nsamples = 0\n", "quantization.samples must be at least 1, not 0"),
        ('[grappler]\noptimizers = ["remapper"]\n', "names Grappler optimizer 'remapper'"),
        ('[quantization]\nmode = "none"\ninput_type = "uint8"\n', "input_type uint8 needs"),
    ],
)
def test_recipe_file_errors_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(RecipeError) as info:
        recipe.load(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ")
    assert message in text
    assert "\n" not in text


def test_a_valid_file_with_every_table(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        'name = "m"\ntarget = "cpu"\nlevel = 1\n[quantization]\nmode = "dynamic"\nsamples = 7\n'
        '[calibration]\nscale = 1\noffset = 0\n[grappler]\noptimizers = ["constfold"]\n'
        "[converter]\nselect_tf_ops = false\n",
    )
    r = recipe.load(path)
    assert (r.target.name, r.level, r.quant_mode, r.samples) == ("cpu", 1, "dynamic", 7)
    assert (r.scale, r.offset, r.grappler) == (1.0, 0.0, ("constfold",))
    assert isinstance(r.scale, float)  # an integer in TOML is a number too
    assert r.delegate == "cpu"  # defaults to the target


def test_shipped_recipes_are_listed_and_valid() -> None:
    assert recipe.available() == ["cpu-float", "edgetpu", "gpu-fp16", "xnnpack-int8"]
    for name in recipe.available():
        assert recipe.load(name).name == name


def test_override_errors_name_the_override_or_its_label() -> None:
    base = recipe.load("edgetpu")
    with pytest.raises(RecipeError, match=r"^samples must be at least 1, not 0$"):
        base.override(samples=0)
    with pytest.raises(RecipeError, match=r"^--samples must be at least 1, not 0$"):
        base.override(labels={"samples": "--samples"}, samples=0)
    with pytest.raises(RecipeError, match=r"^scale must be a number, not a string \('big'\)$"):
        base.override(scale="big")
    # the recipe's uint8 I/O conflicts with an overridden mode: the override is blamed
    with pytest.raises(
        RecipeError, match=r"^--quant float16: the recipe's quantization.input_type"
    ):
        base.override(labels={"quant_mode": "--quant"}, quant_mode="float16")
    # both overridden: the I/O type is the one that needs int8
    with pytest.raises(RecipeError, match=r"^input_type uint8 needs quantization mode int8"):
        recipe.load("cpu-float").override(input_type="uint8")


def test_flex_ops_are_refused_with_the_reason() -> None:
    with pytest.raises(RecipeError, match="TFLite builtin ops only"):
        recipe.load("cpu-float").override(select_tf_ops=True)


def test_load_passes_a_recipe_through() -> None:
    r = recipe.load("gpu-fp16")
    assert recipe.load(r) is r


def test_cli_blames_the_flag_not_the_recipe(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    code = main(["convert", "m.keras", "--recipe", "edgetpu", "--samples", "0", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err == "tflfuse: error: --samples must be at least 1, not 0\n"
    assert not out.exists()


def test_cli_typo_table_in_recipe_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _write(tmp_path, '[quantisation]\nmode = "none"\n')
    out = tmp_path / "out"
    code = main(["convert", "m.keras", "--recipe", str(path), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"{path}: unknown key 'quantisation'" in err
    assert not out.exists()
