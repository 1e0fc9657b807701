"""The target registry (tflfuse.targets.registry): its pieces agree with the files they name,
and what the user sees (the CLI's choices, the error sentences) comes from it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from rulekit import G, apply, ops, refusals

from tflfuse import targets
from tflfuse.cli import build_parser
from tflfuse.convert import recipe
from tflfuse.convert.rule_sets import pipeline
from tflfuse.errors import TflfuseError
from tflfuse.rules.epilogue import FuseActivationIntoProducer
from tflfuse.rules.exporter import exporter_rules
from tflfuse.targets import TARGETS, capability, cost, find, names
from tflfuse.targets import target as target_named


def test_every_recipe_names_a_target_that_lists_it_and_every_listed_recipe_exists() -> None:
    shipped = recipe.available()
    listed = {name: t for t in map(targets.target, TARGETS) for name in t.recipes}
    assert sorted(listed) == sorted(shipped)  # no recipe without its target, none made up
    for name in shipped:
        assert recipe.load(name).target == listed[name], name  # resolved when read


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
        targets.predict(None, target_named("cpu"))  # type: ignore[arg-type]  # before the model
    assert find(["edgetpu"]) is None and find("EDGETPU") is None  # any value: no TypeError
    with pytest.raises(TflfuseError, match="unknown target 'tpu'"):
        targets.target("tpu")


def test_pipeline_traits_decide_what_differs_by_target() -> None:
    edgetpu = targets.target("edgetpu")
    legalization = edgetpu.legalization_rules()
    assert legalization and all(find(n).legalization_rules() == () for n in TARGETS[1:])
    tpu = [p.name for p in pipeline(2, target_named("edgetpu"))]
    assert tpu[: len(legalization)] == [p.name for p in legalization]
    activations = {"RecognizeHardSwish", "RecognizeLeakyRelu", "RecognizeGelu"}
    assert not activations & set(tpu)
    assert "MeanKeepDims" not in tpu
    for name in TARGETS[1:]:
        rules = [p.name for p in pipeline(2, target_named(name))]
        assert activations <= set(rules) and "MeanKeepDims" in rules, name
        assert pipeline(2, target_named(name), quantized=True) == ()


def test_the_rules_ask_the_traits_not_the_name() -> None:
    def exporter(target: str | targets.Target) -> dict[str, object]:
        found = target if isinstance(target, targets.Target) else target_named(target)
        return {r.name: r for r in exporter_rules(found)}

    for name in TARGETS:  # as measured: a constant BATCH_MATMUL as FC everywhere but the GPU
        t, rules = find(name), exporter(name)
        assert ("BatchMatmulToFullyConnected" in rules) == t.batch_matmul_as_fully_connected
        assert rules["CanonicalizeLayoutChain"].max_nontrivial_dims == t.cost.max_nontrivial_dims
    assert not find("gpu").batch_matmul_as_fully_connected
    assert exporter("edgetpu")["CanonicalizeLayoutChain"].max_nontrivial_dims == 3
    pool = "the Edge TPU maps MAX_POOL_2D only with fused activation NONE: RELU stays a separate op"
    assert str(find("edgetpu").fused_activation_refusal("MAX_POOL_2D", "RELU")).startswith(pool)
    assert find("edgetpu").fused_activation_refusal("CONV_2D", "RELU") is None
    assert all(find(n).fused_activation_refusal("MAX_POOL_2D", "RELU") is None for n in TARGETS[1:])
    # another target with the same traits gets the same rules: nothing asks for the name
    tpu = find("edgetpu")
    as_tpu = dataclasses.replace(
        find("gpu"), cost=tpu.cost, batch_matmul_as_fully_connected=True,
        fused_activation_limit=tpu.fused_activation_limit,
    )  # fmt: skip
    fused = ["CONV_2D", "MAX_POOL_2D"]
    assert (
        ops(apply(_conv_pool_relu(), FuseActivationIntoProducer(target_named("gpu")))[1]) == fused
    )
    assert "BatchMatmulToFullyConnected" in exporter(as_tpu)
    assert exporter(as_tpu)["CanonicalizeLayoutChain"].max_nontrivial_dims == 3
    _, model, result = apply(_conv_pool_relu(), FuseActivationIntoProducer(as_tpu))
    assert ops(model) == [*fused, "RELU"]
    assert refusals(result, "FuseActivationIntoProducer")[0].startswith(pool)


def _conv_pool_relu() -> bytes:
    g = G()
    pool = {"padding": "VALID", "stride_h": 2, "stride_w": 2, "filter_height": 2, "filter_width": 2}
    pooled = g.op("MAX_POOL_2D", [g.conv(g.input((1, 8, 8, 4)), 8, 3)], (1, 4, 4, 8), **pool)
    return g.bytes(g.unary("RELU", pooled))


def test_cost_profiles_answer_the_cost_questions() -> None:
    assert cost.fits_on_chip(target_named("edgetpu"), 8 * cost.MIB) and not cost.fits_on_chip(
        target_named("gpu"), 5 << 20
    )
    cpu = target_named("cpu").cost
    assert cpu.runtime == "none" and target_named("xnnpack").cost.runtime == "xnnpack"
    # a target is resolved once, at the door: below it, every layer asks the `Target`
    assert targets.every() == tuple(map(target_named, TARGETS))
    assert (target_named("xnnpack"), target_named("edgetpu")) == (targets.XNNPACK, targets.EDGETPU)
    assert cost.horizontal_pays(
        target_named("xnnpack"), 5, 1024, absorbs_concat=False, equal_parts=True
    ) == ("xnnpack splits into at most 4 parts")


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
