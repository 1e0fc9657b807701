"""Baselines that do not flatter, and checks the user can steer (issue 16).

- `stock` of a .tflite is litert-quantizer's own output in the op order it writes: the recipe's
  I/O types are set in place, nothing is appended and re-sorted (a re-sort once moved an
  input-independent op to position 0 and made the stock YOLO map 0 ops on the Edge TPU);
- the defused baseline is checked on the reference kernels, where it is bit-identical;
- `convert --disable RULE` turns a rule off as `optimize --disable` does, and `--no-verify`
  skips every numeric check it names.
IR graphs built here; no TensorFlow model conversion needed (the quantizer imports it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from irgraphs import add, conv, model_of, to_bytes

from tflfuse import cli
from tflfuse.convert.pipeline import convert
from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, Model, Quantization, Signature, flatbuffer
from tflfuse.quantize.quantize import set_io_types
from tflfuse.rules.defuse import Defuse as _Defuse

pytest.importorskip("litert_quantizer")


def _ops(data: bytes) -> list[str]:
    return [op.type for op in flatbuffer.from_bytes(data).main.ops]


def with_constant_branch() -> bytes:
    """conv(x) + reshape(constant): the reshape reads no input, and sits after the conv."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 6, 6, 3))
    c = conv(g, x, 4, act="RELU").output
    k = g.add_constant("k", np.linspace(-1, 1, 144, dtype=np.float32))
    r = g.add_tensor("r", (1, 6, 6, 4))
    g.add_op("RESHAPE", [k, g.add_constant("s", np.array([1, 6, 6, 4], np.int32))], [r])
    y = add(g, c, r).output
    m = model_of(g, [x], [y])
    m.signatures = [Signature("serving_default", 0, {"x": x}, {"y": y})]
    return to_bytes(m)


def calib(n: int = 16) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (n, 6, 6, 3)).astype(np.float32)


# -- stock: the quantizer's op order, I/O set in place -----------------------------------------
def _int8_with_float_boundaries() -> Model:
    """QUANTIZE(x) -> ADD(., RESHAPE(constant)) -> DEQUANTIZE: the quantizer's float-I/O form,
    with an op that reads no input between the two boundaries."""
    q = Quantization(np.array([0.02], np.float32), np.array([3]))
    g = Graph("main")
    x = g.add_tensor("x", (1, 4))
    xq = g.add_tensor("xq", (1, 4), "INT8", quantization=q)
    g.add_op("QUANTIZE", [x], [xq])
    k = g.add_constant("k", np.arange(4, dtype=np.int8), "INT8", q)
    kr = g.add_tensor("kr", (1, 4), "INT8", quantization=q)
    g.add_op("RESHAPE", [k, g.add_constant("s", np.array([1, 4], np.int32))], [kr])
    yq = g.add_tensor("yq", (1, 4), "INT8", quantization=q)
    g.add_op("ADD", [xq, kr], [yq], {"fused_activation_function": "NONE"})
    y = g.add_tensor("y", (1, 4))
    g.add_op("DEQUANTIZE", [yq], [y])
    m = model_of(g, [x], [y])
    m.signatures = [Signature("serving_default", 0, {"x": x}, {"y": y})]
    return m


@pytest.mark.parametrize(
    ("io", "expect"),
    [
        ("uint8", ["QUANTIZE", "RESHAPE", "ADD", "QUANTIZE"]),
        ("int8", ["RESHAPE", "ADD"]),
        ("float32", ["QUANTIZE", "RESHAPE", "ADD", "DEQUANTIZE"]),
    ],
)
def test_io_types_are_set_in_place_without_moving_an_op(io: str, expect: list[str]) -> None:
    m = _int8_with_float_boundaries()
    set_io_types(m, io, io)
    g = m.main
    assert [op.type for op in g.ops] == expect  # a re-sort would put the RESHAPE first
    assert {t.dtype for t in (*g.inputs, *g.outputs)} == {io.upper()}
    assert m.signatures[0].inputs["x"] is g.inputs[0]
    if io == "uint8":
        assert int(g.inputs[0].quantization.zero_point[0]) == 3 + 128
    flatbuffer.to_bytes(m)  # still a valid model


def test_stock_is_the_quantizers_model_in_its_own_order(tmp_path: Path) -> None:
    from tflfuse.quantize.quantize import quantize

    data = with_constant_branch()
    own = _ops(quantize(data, "int8", [calib()], progress=False).data)  # float I/O, as it writes
    res = convert(data, "edgetpu", calib(), tmp_path / "o", progress=False)
    stock = _ops(res.stock.read_bytes())
    assert own[0] == "QUANTIZE" and own[-1] == "DEQUANTIZE"
    assert stock == [*own[:-1], "QUANTIZE"]  # the same order; only the output boundary retyped
    g = flatbuffer.load(res.stock).main
    assert [t.dtype for t in (*g.inputs, *g.outputs)] == ["UINT8", "UINT8"]
    route = res.report["quantization"]["stock_route"]
    assert "static_wi8_ai8" in route and "in the order the quantizer wrote them" in route
    assert "replaced in place" in route
    assert "Stock baseline: litert-quantizer" in (tmp_path / "o" / "report.md").read_text()


# -- the defused baseline: bit-identical on the reference kernels ------------------------------
def test_defused_baseline_is_bit_identical_on_the_reference_kernels(tmp_path: Path) -> None:
    res = convert(with_constant_branch(), "cpu-float", output_dir=tmp_path / "o", progress=False)
    route = res.report["unfused_route"]
    assert "verified bit-identical to it on the reference kernels" in route
    assert _ops(res.unfused.read_bytes()).count("RELU") == 1  # the conv's RELU split off


class _BrokenDefuse:
    """Defuse, then one bias made 1e-3 larger: a baseline that no longer computes the input."""

    name = "Defuse"

    def __init__(self, **_: object) -> None:
        self.inner = _Defuse()

    def run(self, graph: Graph) -> int:
        changed = self.inner.run(graph)
        if changed:
            add_op = next(op for op in graph.ops if op.type == "ADD" and op.inputs[1].is_constant)
            add_op.inputs[1].data = add_op.inputs[1].data * np.float32(1.001) + np.float32(1e-3)
        return changed


def test_a_failed_baseline_check_says_which_and_what_it_measured(tmp_path, monkeypatch) -> None:
    import tflfuse.rules.defuse as defuse

    monkeypatch.setattr(defuse, "Defuse", _BrokenDefuse)
    with pytest.raises(TflfuseError) as caught:
        convert(with_constant_branch(), "cpu-float", output_dir=tmp_path / "o", progress=False)
    message = str(caught.value)
    assert "the defused baseline check" in message and "reference kernels" in message
    assert "differs by" in message and "is allowed" in message and "--no-verify" in message
    assert not (tmp_path / "o").exists()
    # --no-verify: written, and the report says the baseline was not checked
    res = convert(
        with_constant_branch(), "cpu-float", output_dir=tmp_path / "o", progress=False, verify=False
    )
    assert "not checked (--no-verify)" in res.report["unfused_route"]
    assert res.report["baseline_check"] == {"verified": False, "reason": "--no-verify"}


def test_no_verify_runs_no_numeric_check_at_all(tmp_path, monkeypatch) -> None:
    from tflfuse.sources import layout
    from tflfuse.verification import verify

    def refuse(*args, **kwargs):
        raise AssertionError("a numeric check ran under --no-verify")

    monkeypatch.setattr(verify, "compare", refuse)
    monkeypatch.setattr(layout, "verify", refuse)
    res = convert(
        with_constant_branch(), "edgetpu", calib(), tmp_path / "o", progress=False, verify=False
    )
    assert res.report["rules"]["verification"]["verified"] is False
    assert res.report["legalization"].get("verification", {}).get("verified") is not True


# -- convert --disable --------------------------------------------------------------------------
def test_convert_disable_turns_a_rule_off(tiny_tflite: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "on"
    assert cli.main(["convert", str(tiny_tflite), "--recipe", "cpu-float", "-o", str(out)]) == 0
    assert _ops((out / "model.tflite").read_bytes()) == ["CONV_2D"]
    off = tmp_path / "off"
    argv = ["convert", str(tiny_tflite), "--recipe", "cpu-float", "-o", str(off)]
    assert cli.main([*argv, "--disable", "FuseActivationIntoProducer"]) == 0
    assert _ops((off / "model.tflite").read_bytes()) == ["CONV_2D", "RELU"]
    report = json.loads((off / "report.json").read_text())
    assert "FuseActivationIntoProducer" not in report["rules"]["fired"]
    capsys.readouterr()


def test_convert_disable_refuses_an_unknown_rule_first(tiny_tflite, tmp_path, capsys) -> None:
    out = tmp_path / "o"
    argv = ["convert", str(tiny_tflite), "--recipe", "cpu-float", "-o", str(out)]
    assert cli.main([*argv, "--disable", "NoSuchRule"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown rule 'NoSuchRule'" in err[0] and not out.exists()


def test_convert_disable_reaches_the_int8_rules(tmp_path: Path) -> None:
    """A rule of the int8 legalization is turned off too (one --disable for both)."""
    data = with_constant_branch()
    on = convert(data, "edgetpu", calib(), tmp_path / "on", progress=False)
    assert "SplitOversizedTranspose" in on.report["legalization"]["rules"]
    off = convert(
        data,
        "edgetpu",
        calib(),
        tmp_path / "off",
        progress=False,
        disabled=("SplitOversizedTranspose",),
    )
    leg = off.report["legalization"]
    assert leg["ran"] and leg["disabled"] == ["SplitOversizedTranspose"]
    assert "SplitOversizedTranspose" not in leg["rules"]
