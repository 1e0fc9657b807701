"""The target registry (tflfuse.targets.registry): its pieces agree with the files they name,
and what the user sees (the CLI's choices, the error sentences) comes from it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from tflfuse import targets
from tflfuse.cli import build_parser
from tflfuse.convert import recipe
from tflfuse.errors import TflfuseError
from tflfuse.rules import pipeline
from tflfuse.targets import TARGETS, capability, cost, find, names


def test_every_recipe_names_a_target_that_lists_it_and_every_listed_recipe_exists() -> None:
    shipped = recipe.available()
    listed = {name: t for t in map(targets.target, TARGETS) for name in t.recipes}
    assert sorted(listed) == sorted(shipped)  # no recipe without its target, none made up
    for name in shipped:
        assert recipe.load(name).target == listed[name].name, name


def test_tables_and_predictors_are_the_ones_the_files_and_check_have() -> None:
    for t in map(targets.target, TARGETS):
        if t.table is not None:
            assert t.capabilities() is capability(t.table)  # delegates/TABLE.toml parses
        else:
            with pytest.raises(TflfuseError, match="no capability table"):
                t.capabilities()
    assert names(predicts=True) == ("edgetpu", "xnnpack", "gpu")
    assert names(compiled=True) == ("edgetpu",)
    with pytest.raises(TflfuseError, match=r"unknown target 'cpu' \(choose from edgetpu, xnnpack"):
        targets.predict(None, "cpu")  # type: ignore[arg-type]  # refused before the model
    assert find(["edgetpu"]) is None and find("EDGETPU") is None  # any value: no TypeError
    with pytest.raises(TflfuseError, match="unknown target 'tpu'"):
        targets.target("tpu")


def test_pipeline_traits_decide_what_differs_by_target() -> None:
    edgetpu = targets.target("edgetpu")
    legalization = edgetpu.legalization_rules()
    assert legalization and all(find(n).legalization_rules() == () for n in TARGETS[1:])
    tpu = [p.name for p in pipeline(2, "edgetpu")]
    assert tpu[: len(legalization)] == [p.name for p in legalization]
    activations = {"RecognizeHardSwish", "RecognizeLeakyRelu", "RecognizeGelu"}
    assert not activations & set(tpu)
    assert "MeanKeepDims" not in tpu
    for name in TARGETS[1:]:
        rules = [p.name for p in pipeline(2, name)]
        assert activations <= set(rules) and "MeanKeepDims" in rules, name
        assert pipeline(2, name, quantized=True) == ()
    with pytest.raises(TflfuseError, match="unknown target"):
        pipeline(2, "tpu")


def test_cost_profiles_answer_the_cost_questions() -> None:
    assert cost.fits_on_chip("edgetpu", 8 * cost.MIB) and not cost.fits_on_chip("gpu", 5 << 20)
    cpu = targets.cost_profile("cpu")
    assert cpu.runtime == "none" and targets.cost_profile("xnnpack").runtime == "xnnpack"
    # a name the registry does not know: a plain CPU's budgets, and no measured table
    assert targets.cost_profile("no such target") == dataclasses.replace(cpu, runtime=None)
    assert cost.horizontal_pays("xnnpack", 5, 1024, absorbs_concat=False, equal_parts=True) == (
        "xnnpack splits into at most 4 parts"
    )


def test_the_cli_lists_the_registry_and_loads_no_machinery_to_do_so() -> None:
    parser = build_parser()
    for name in TARGETS:
        assert parser.parse_args(["optimize", "m.tflite", "-o", "o.tflite", "--target", name])
        assert parser.parse_args(["convert", "m.keras", "--target", name, "-o", "out"])
    for command, allowed in (("check", names(predicts=True)), ("compile", names(compiled=True))):
        for name in TARGETS:
            argv = [command, "m.tflite", "--target", name]
            if name in allowed:
                assert parser.parse_args(argv).target == name
            else:
                with pytest.raises(SystemExit):
                    parser.parse_args(argv)
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tflfuse.cli import build_parser; build_parser();"
            " print(sorted(m for m in ('numpy', 'tflfuse.ir', 'tflfuse.rules')"
            " if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert loaded == "[]"
