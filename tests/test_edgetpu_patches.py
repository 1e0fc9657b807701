"""MovePatchesInShownForms: a patch unfold or fold (MobileViT's, as an NCHW exporter writes it
around NHWC convolutions) through tensors of more than 3 dims > 1, written as SLICEs of windows
of its source joined by CONCATENATIONs: every tensor at most 3 dims > 1, codes copied."""

from __future__ import annotations

import numpy as np
import pytest
from rulekit import apply, ops, refusals

from tflfuse.device.interpreter import make_interpreter
from tflfuse.ir import Graph, Model, Quantization, Tensor, flatbuffer
from tflfuse.targets.edgetpu.patches import (
    Digit,
    MovePatchesInShownForms,
    digits_of,
    plan_gather,
    planned_once_quantized,
)
from tflfuse.targets.edgetpu.predict import predict_edgetpu


def _q(scale: float = 0.05) -> Quantization:
    return Quantization(scale=np.array([scale], np.float32), zero_point=np.array([3], np.int64))


def _mobilevit_block(h: int = 8, c: int = 16, p: int = 2, *, int8: bool = True,
                     requantize: bool = False) -> bytes:  # fmt: skip
    """NHWC x -> TRANSPOSE to NCHW -> timm's unfold (RESHAPE [C nh, p, nw, p], TRANSPOSE,
    RESHAPE [1, C, N, P], TRANSPOSE, RESHAPE [P, N, C]) -> ADD (the transformer) -> timm's fold
    -> TRANSPOSE back to NHWC."""
    g = Graph("main")
    dtype = "INT8" if int8 else "FLOAT32"

    def t(name: str, shape: tuple[int, ...], q: Quantization | None = None) -> Tensor:
        return g.add_tensor(name, shape, dtype, quantization=(q or _q()) if int8 else None)

    def move(kind: str, x: Tensor, arg: list[int], shape: tuple[int, ...], name: str) -> Tensor:
        y = t(name, shape, _q(0.1) if requantize and name == "u2" else None)
        const = g.add_constant(f"{name}/c", np.array(arg, np.int32), "INT32")
        g.add_op(kind, [x, const], [y], {"new_shape": list(arg)} if kind == "RESHAPE" else {})
        return y

    n = h // p
    x = t("x", (1, h, h, c))
    a = move("TRANSPOSE", x, [0, 3, 1, 2], (1, c, h, h), "nchw")
    a = move("RESHAPE", a, [c * n, p, n, p], (c * n, p, n, p), "u1")
    a = move("TRANSPOSE", a, [0, 2, 1, 3], (c * n, n, p, p), "u2")
    a = move("RESHAPE", a, [1, c, n * n, p * p], (1, c, n * n, p * p), "u3")
    a = move("TRANSPOSE", a, [0, 3, 2, 1], (1, p * p, n * n, c), "u4")
    a = move("RESHAPE", a, [p * p, n * n, c], (p * p, n * n, c), "tokens")
    if int8:
        one = g.add_constant("one", np.array([20], np.int8), "INT8", _q())
    else:
        one = g.add_constant("one", np.array([1.0], np.float32))
    y = t("mixed", a.shape)
    g.add_op("ADD", [a, one], [y], {"fused_activation_function": "NONE"})
    a = move("RESHAPE", y, [1, p * p, n * n, c], (1, p * p, n * n, c), "f1")
    a = move("TRANSPOSE", a, [0, 3, 2, 1], (1, c, n * n, p * p), "f2")
    a = move("RESHAPE", a, [c * n, n, p, p], (c * n, n, p, p), "f3")
    a = move("TRANSPOSE", a, [0, 2, 1, 3], (c * n, p, n, p), "f4")
    a = move("RESHAPE", a, [1, c, h, h], (1, c, h, h), "f5")
    a = move("TRANSPOSE", a, [0, 2, 3, 1], (1, h, h, c), "nhwc")
    g.inputs, g.outputs = [x], [a]
    model = Model([g])
    model.validate()
    return flatbuffer.to_bytes(model)


def _run(data: bytes, x: np.ndarray) -> np.ndarray:
    interp = make_interpreter(data, delegate="none")
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def _mapped(data: bytes) -> tuple[int, int]:
    p = predict_edgetpu(flatbuffer.from_bytes(data))
    return sum(o.status.startswith("Mapped") for o in p.ops), len(p.ops)


def test_digits_of_a_patch_unfold() -> None:
    """The unfold of one 2 x 2 patch grid over [1, 8, 8, 16] NHWC: tokens step by 2 C (nw) and
    by 2 W C (nh), the patch by W C (ph) and C (pw)."""
    x = np.arange(8 * 8 * 16).reshape(4, 2, 4, 2, 16)  # nh, ph, nw, pw, c
    g = x.transpose(1, 3, 0, 2, 4)  # [ph, pw, nh, nw, c]
    base, digits = digits_of(g)  # type: ignore[misc]
    assert base == 0
    assert digits == [Digit(2, 128), Digit(2, 16), Digit(4, 256), Digit(4, 32), Digit(16, 1)]
    assert digits_of(np.array([0, 2, 1, 3, 7])) is None  # no mixed-radix gather


def test_the_unfold_is_four_windows_and_one_join() -> None:
    x = np.arange(8 * 8 * 16).reshape(4, 2, 4, 2, 16)
    piece = plan_gather(x.transpose(1, 3, 0, 2, 4), (1, 8, 8, 16))
    assert piece is not None and len(piece.children) == 4
    assert all(c.leaf is not None for c in piece.children)


@pytest.mark.parametrize(("h", "c"), [(8, 16), (16, 24)])
def test_unfold_and_fold_are_rewritten_bit_identically_and_map(h: int, c: int) -> None:
    before = _mobilevit_block(h, c)
    after, model, result = apply(before, MovePatchesInShownForms())
    assert result.fired() == {"MovePatchesInShownForms": 2}
    assert "TRANSPOSE" not in ops(model)
    assert set(ops(model)) == {"RESHAPE", "SLICE", "CONCATENATION", "ADD"}
    assert all(sum(d > 1 for d in t.shape) <= 3 for t in model.main.tensors)
    x = np.random.default_rng(0).integers(-128, 128, (1, h, h, c)).astype(np.int8)
    assert np.array_equal(_run(before, x), _run(after, x))  # codes copied: int8 error 0
    assert MovePatchesInShownForms.int8_error_steps == 0
    mapped, total = _mapped(after)
    assert _mapped(before) == (1, 13) and mapped == total


def test_a_chain_that_requantizes_is_refused() -> None:
    _, model, result = apply(_mobilevit_block(requantize=True), MovePatchesInShownForms())
    assert "TRANSPOSE" in ops(model)
    assert "an op of the chain requantizes" in refusals(result, "MovePatchesInShownForms")


def test_float_chains_wait_for_int8_and_are_no_cut_before() -> None:
    """On the float graph the rule waits (one scale for every piece once quantized), and the
    float legalizations' gate does not read the chain's ops as a cut."""
    data = _mobilevit_block(int8=False)
    _, model, result = apply(data, MovePatchesInShownForms())
    assert not result.fired() and "TRANSPOSE" in ops(model)
    graph = flatbuffer.from_bytes(data).main
    deep = [op for op in graph.ops if sum(d > 1 for d in op.outputs[0].shape) > 3]
    assert deep and all(planned_once_quantized(op, graph) for op in deep)
    add = next(op for op in graph.ops if op.type == "ADD")
    assert not planned_once_quantized(add, graph)


def test_a_join_no_compiled_model_shows_at_its_size_is_not_written() -> None:
    """MobileViT-xxs's first unfold (32 x 32 x 64, 2 x 2 patches) joins 4 rows of 16384: the
    largest 4-way join compiled models show holds 10240 in its two innermost dims. The chain
    stays whole, and says why (the predictor does not gate joins: none is written unshown); so
    does the fold, whose view RESHAPE holds more than compiled models show."""
    _, model, result = apply(_mobilevit_block(32, 64), MovePatchesInShownForms())
    assert not result.fired() and "TRANSPOSE" in ops(model)
    reasons = [r for r in refusals(result, "MovePatchesInShownForms") if "not a reshape" not in r]
    assert len(reasons) == 2  # the unfold and the fold
    assert all("it would write is not shown mapped (undecided" in r for r in reasons)
    assert any("CONCATENATION(a:INT8) -> INT8 n=4 axis=inner: shown mapped only up to" in r
               for r in reasons)  # fmt: skip


def _xca_split(tokens: int = 64, heads: int = 2, d: int = 4) -> bytes:
    """EdgeNeXt's cross-covariance attention: qkv [1, N, 3 h d] -> RESHAPE [1, N, 3, h, d] ->
    TRANSPOSE (2, 0, 3, 4, 1) [3, 1, h, d, N] -> SLICE q, k -> [1, 1, h, d, N] -> RESHAPE
    [1, h, d, N] -> ADD (q + k, each head's tokens innermost)."""
    g = Graph("main")

    def t(name: str, shape: tuple[int, ...]) -> Tensor:
        return g.add_tensor(name, shape, "INT8", quantization=_q())

    def const(name: str, values: list[int]) -> Tensor:
        return g.add_constant(name, np.array(values, np.int32), "INT32")

    x = t("qkv", (1, tokens, 3 * heads * d))
    five = t("five", (1, tokens, 3, heads, d))
    g.add_op("RESHAPE", [x, const("s5", list(five.shape))], [five])
    moved = t("moved", (3, 1, heads, d, tokens))
    g.add_op("TRANSPOSE", [five, const("perm", [2, 0, 3, 4, 1])], [moved])
    parts = []
    for i, name in enumerate(("q", "k")):
        sliced = t(f"{name}5", (1, 1, heads, d, tokens))
        g.add_op("SLICE", [moved, const(f"{name}/b", [i, 0, 0, 0, 0]),
                           const(f"{name}/s", [1, 1, heads, d, tokens])], [sliced])  # fmt: skip
        four = t(name, (1, heads, d, tokens))
        g.add_op("RESHAPE", [sliced, const(f"{name}/shape", list(four.shape))], [four])
        parts.append(four)
    y = t("y", parts[0].shape)
    g.add_op("ADD", parts, [y], {"fused_activation_function": "NONE"})
    g.inputs, g.outputs = [x], [y]
    model = Model([g])
    model.validate()
    return flatbuffer.to_bytes(model)


def test_a_head_split_moving_tokens_innermost_is_a_window_and_a_transpose() -> None:
    """No set of windows writes q (its tokens step by 3 h d in x, innermost in q): each end is
    one window of x, [N, h d], and one 2-D TRANSPOSE, bit-identical."""
    before = _xca_split()
    after, model, result = apply(before, MovePatchesInShownForms())
    assert result.fired() == {"MovePatchesInShownForms": 1}
    assert ops(model).count("TRANSPOSE") == 2 and ops(model).count("SLICE") == 2
    assert all(sum(d > 1 for d in t.shape) <= 3 for t in model.main.tensors)
    x = np.random.default_rng(1).integers(-128, 128, (1, 64, 24)).astype(np.int8)
    assert np.array_equal(_run(before, x), _run(after, x))
