"""`optimize` writes nothing broken (issue 11): a candidate the interpreter refuses is an error
naming the rule, and a model that cannot be verified here is written only with --no-verify."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ORACLE, needs_oracle
from irgraphs import conv, model_of, to_bytes, unary

from tflfuse import cli
from tflfuse.convert.optimize import NOT_VERIFIED, optimize_bytes
from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, Model, Quantization, flatbuffer


def q8(scale: float, zero: int = 0) -> Quantization:
    return Quantization(np.array([scale], np.float32), np.array([zero]))


def int8_leaky_relu(shape: tuple[int, ...]) -> bytes:
    """An int8 LEAKY_RELU as the stock converter writes it."""
    g = Graph()
    x = g.add_tensor("x", shape, "INT8", quantization=q8(0.05, 3))
    y = g.add_tensor("y", shape, "INT8", quantization=q8(0.04, -100))
    g.add_op("LEAKY_RELU", [x], [y], {"alpha": 0.1})
    return to_bytes(model_of(g, [x], [y]))


@pytest.mark.parametrize("shape", [(1, 16), (1, 5, 16), (1, 4, 4, 16)])
def test_edgetpu_int8_leaky_relu_of_any_rank_runs_and_stays_within_its_step(shape) -> None:
    """The repro: over a 2-D tensor the PRELU got alpha (1, 1, C), which the interpreter
    refuses; it was written with exit 0 ("not verified")."""
    result = optimize_bytes(int8_leaky_relu(shape), target="edgetpu")
    assert [op.type for op in result.model.main.ops] == ["PRELU"]
    v = result.verification
    assert v["verified"] and v["ok"] and v["varies"], v
    assert v["tolerance"]["int8_steps"] == {"y": 1}  # LegalizeLeakyRelu declares 1 step


def custom_op_model() -> bytes:
    """conv -> RELU (a fusion fires) -> a custom op this interpreter does not have."""
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 2))
    r = unary(g, "RELU", conv(g, x, 3).output)
    y = g.add_tensor("y", (1, 4, 4, 3))
    g.add_op("CUSTOM", [r.output], [y], custom_code="NoSuchKernel")
    return to_bytes(model_of(g, [x], [y]))


def test_a_model_that_cannot_be_verified_needs_no_verify() -> None:
    data = custom_op_model()
    with pytest.raises(TflfuseError, match=r"cannot verify .*NoSuchKernel.*--no-verify"):
        optimize_bytes(data)
    result = optimize_bytes(data, verify=False)
    assert result.verification == {"verified": False, "reason": NOT_VERIFIED}
    assert [op.type for op in flatbuffer.from_bytes(result.data).main.ops] == ["CONV_2D", "CUSTOM"]


def test_cli_writes_an_unverifiable_model_only_with_no_verify(tmp_path, capsys) -> None:
    src, dst = tmp_path / "in.tflite", tmp_path / "out.tflite"
    src.write_bytes(custom_op_model())
    assert cli.main(["optimize", str(src), "-o", str(dst)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--no-verify" in err[0] and not dst.exists()
    assert cli.main(["optimize", str(src), "-o", str(dst), "--no-verify"]) == 0
    assert dst.exists() and f"not verified: {NOT_VERIFIED}" in capsys.readouterr().out


def test_a_fused_model_that_runs_is_verified_and_written() -> None:
    """The ordinary path: conv -> RELU fuses, runs, matches."""
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 2))
    r = unary(g, "RELU", conv(g, x, 3).output)
    data = to_bytes(Model([model_of(g, [x], [r.output]).main]))
    result = optimize_bytes(data)
    assert result.verification["verified"] and result.verification["ok"]
    assert [op.type for op in flatbuffer.from_bytes(result.data).main.ops] == ["CONV_2D"]


@needs_oracle()
def test_re_fused_mobilenet_v1_int8_is_held_to_zero_steps() -> None:
    """Issue 11: 27 re-fusions of conv -> RELU6 were allowed 1 + 27 = 28 steps (about 11% of
    the range) where the real difference is 0. Same-scale fusions declare 0 steps, so the
    output must now match bit for bit."""
    from tflfuse.rewrite import PassManager
    from tflfuse.rules.defuse import Defuse

    model = flatbuffer.load(ORACLE / "mobilenet_v1_0.25_128_quant.tflite")
    PassManager([Defuse()]).run(model)
    result = optimize_bytes(flatbuffer.to_bytes(model), target="xnnpack")
    assert result.result.fired() == {"FuseActivationIntoProducer": 27}
    v = result.verification
    assert v["ok"] and v["varies"] and set(v["tolerance"]["int8_steps"].values()) == {0}, v


def test_cli_refuses_to_write_a_result_the_interpreter_rejects(tmp_path, monkeypatch, capsys):
    """The repro through the command line, with the old (1, 1, C) PRELU alpha put back."""
    from tflfuse.convert import optimize
    from tflfuse.rewrite import DeadCodeElimination
    from tflfuse.targets.edgetpu.rules import LegalizeLeakyRelu

    class OldLegalizeLeakyRelu(LegalizeLeakyRelu):
        def rewrite(self, m, *, x) -> None:
            super().rewrite(m, x=x)
            prelu = m.graph.ops[-1]
            alpha = prelu.inputs[1]
            prelu.set_input(
                1,
                m.graph.add_constant(
                    "alpha_3d", alpha.data.reshape(1, 1, -1), alpha.dtype, alpha.quantization
                ),
            )

    monkeypatch.setattr(
        optimize,
        "pipeline",
        lambda level, target, **_: (OldLegalizeLeakyRelu(), DeadCodeElimination()),
    )
    src, dst = tmp_path / "in.tflite", tmp_path / "out.tflite"
    src.write_bytes(int8_leaky_relu((1, 16)))
    assert cli.main(["optimize", str(src), "-o", str(dst), "--target", "edgetpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not run" in err[0] and "HaveSameShapes" in err[0]
    assert "rule OldLegalizeLeakyRelu" in err[0] and not dst.exists()
