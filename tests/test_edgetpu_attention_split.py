"""LegalizeActivationMatmul's split of a softmax operand (attention.split_of, softmax_split): A V
spelled as products calibrated one tensor at a time loses a diffuse softmax's small weights;
split into the ranges [0, 1/n], [1/n, 8/n], [8/n, 1], each product keeps them."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from rulekit import G, apply, assert_same_function, ops

from tflfuse.ir import flatbuffer
from tflfuse.targets.edgetpu import attention, softmax_split
from tflfuse.targets.edgetpu.attention import LegalizeActivationMatmul
from tflfuse.targets.edgetpu.predict import statuses_once_quantized

H, N, D = 2, 64, 8


def _attention(n: int = N, softmax: bool = True) -> bytes:
    """SOFTMAX(s) @ TANH(v): [1, H, n, n] weights over n tokens, [1, H, n, D] values (a TANH
    in place of the SOFTMAX when not `softmax`)."""
    from tflfuse.sources import tflite as tflite_frontend

    g = G()
    s = g.input((1, H, n, n), "s")
    a = g.op("SOFTMAX", [s], (1, H, n, n), beta=1.0) if softmax else g.unary("TANH", s)
    v = g.unary("TANH", g.input((1, H, n, D), "v"))
    out = g.op("BATCH_MATMUL", [a, v], (1, H, n, D), adj_x=False, adj_y=False)
    return tflite_frontend.load(g.bytes(out)).float_tflite(None)


def _inputs(k: int, seed: int, n: int = N) -> list[np.ndarray]:
    """Mostly diffuse rows (logits ~ N(0, 0.5)); a few rows peak, setting the products' range."""
    rng = np.random.default_rng(seed)
    s = rng.normal(0, 0.5, (k, H, n, n)).astype(np.float32)
    s[:, :, :4, :2] += 8
    return [s, rng.normal(0, 1.5, (k, H, n, D)).astype(np.float32)]


def _legalized(data: bytes, split: bool | tuple[float, ...], monkeypatch) -> tuple[bytes, Counter]:
    """The graph after the rule: `split` False (no split), True (the module's points) or the
    points in multiples of 1/n (softmax_split.POINTS)."""
    if split is False:
        monkeypatch.setattr(attention, "split_of", lambda plan: None)
    elif split is not True:
        monkeypatch.setattr(softmax_split, "POINTS", split)
    after, model, result = apply(data, LegalizeActivationMatmul())
    monkeypatch.undo()
    assert result.fired() == {"LegalizeActivationMatmul": 1}
    return after, Counter(ops(model))


def _snr(ref: np.ndarray, got: np.ndarray) -> float:
    return float((ref**2).mean() / ((got - ref) ** 2).mean())


def test_split_softmax_product_keeps_stock_accuracy_once_quantized(monkeypatch) -> None:
    """int8 after calibration: the one-tensor spelling's SNR (103 here) falls far under stock's
    int32 sum (569); split at 8/n it is 379, into three ranges (1/n, 8/n) 405. In float the
    split is exact."""
    pytest.importorskip("litert_quantizer")
    from tflfuse.quantize.quantize import quantize
    from tflfuse.verification.runs import run_float

    data = _attention()
    old, _ = _legalized(data, False, monkeypatch)
    two, _ = _legalized(data, (8.0,), monkeypatch)
    new, counts = _legalized(data, True, monkeypatch)
    assert counts["ADD"] == 4 and counts["MUL"] == 6  # three parts a head
    assert_same_function(data, new, atol=1e-5, rtol=1e-5)
    calib, ev = _inputs(16, 0), _inputs(4, 1)
    ref = run_float(data, ev)[0]

    def snr(model: bytes) -> float:
        return _snr(ref, run_float(quantize(model, "int8", calib, progress=False).data, ev)[0])

    stock, before, split_two, after = snr(data), snr(old), snr(two), snr(new)
    assert before < 0.25 * stock, (before, stock)
    assert split_two > 3 * before, (before, split_two)
    assert after > split_two and after > 0.65 * stock, (split_two, after, stock)


def test_split_parts_map_once_quantized(monkeypatch) -> None:
    """The split's ops (CONV_2D with a fused RELU6 or RELU, MUL of two same-shaped activations,
    DEPTHWISE_CONV_2D, ADD) all map once quantized: 16 more ops mapped, none more on the CPU."""
    data = _attention()
    old, old_counts = _legalized(data, False, monkeypatch)
    new, new_counts = _legalized(data, True, monkeypatch)
    assert new_counts - old_counts == Counter(CONV_2D=4, MUL=4, DEPTHWISE_CONV_2D=4, ADD=4)
    acts = Counter(
        op.fused_activation for op in flatbuffer.from_bytes(new).main.ops if op.type == "CONV_2D"
    )
    # the ranges' convs of X only: laid out by `spread`, Y is copied (CONCATENATION), no conv
    assert acts == {"RELU6": 4, "RELU": 2}

    def statuses(model: bytes) -> Counter:
        return Counter(s for s, _ in statuses_once_quantized(flatbuffer.from_bytes(model).main))

    before, after = statuses(old), statuses(new)
    assert after["mapped"] == before["mapped"] + 16
    assert after - Counter(mapped=after["mapped"]) == before - Counter(mapped=before["mapped"])


def test_split_points_and_parts() -> None:
    """Points at 1/n and 8/n, none under the int8 softmax's step 1/256 nor at 1 or over; the
    parts' shares add up to A on [0, 1], each within its range."""
    assert softmax_split.split_points(64) == (1 / 64, 8 / 64)
    assert softmax_split.split_points(16) == (1 / 16, 1 / 2)
    assert softmax_split.split_points(2) == (1 / 2,)  # 8/2 > 1: its upper range would be empty
    assert softmax_split.split_points(400) == (8 / 400,)  # 1/400 < 1/256
    assert softmax_split.split_points(1) == () == softmax_split.split_points(4096)
    points = softmax_split.split_points(100)
    a = np.concatenate([np.random.default_rng(0).uniform(0, 1, 1000), [0.0, 0.01, 0.08, 1.0]])
    shares = softmax_split.shares(a, points)
    np.testing.assert_allclose(sum(shares), a, atol=1e-12)
    for share, lo, hi in zip(shares, (0.0, *points), (*points, 1.0), strict=True):
        assert share.min() >= 0 and share.max() <= hi - lo + 1e-12
        np.testing.assert_allclose(share[a <= lo], 0.0, atol=1e-12)
    acts = [p.activation for p in softmax_split.parts(points)]
    assert acts == ["RELU6", "RELU6", "RELU"]


@pytest.mark.parametrize(
    ("n", "softmax", "why"),
    [(N, False, "not a softmax: its range is unknown before calibration"), (N, True, "no point")],
)
def test_the_split_is_refused(n: int, softmax: bool, why: str, monkeypatch) -> None:
    """No split where the operand is not a softmax's output, or where no point lies in
    [1/256, 1) (rows over 2048 tokens; here no points at all); the plain spelling then."""
    if softmax:
        monkeypatch.setattr(softmax_split, "POINTS", ())
    data = _attention(n, softmax)
    _, counts = _legalized(data, True, monkeypatch)
    assert "ADD" not in counts and counts["MUL"] == 2, why


def test_a_softmax_read_through_its_transpose_is_split(monkeypatch) -> None:
    """YOLO11's C2PSA form: v [1, H, D, n] @ TRANSPOSE(A) (keys last in A, contracted): A is the
    right operand, read through the TRANSPOSE; it is split all the same, exactly."""
    from tflfuse.sources import tflite as tflite_frontend

    g = G()
    a = g.op("SOFTMAX", [g.input((1, H, N, N), "s")], (1, H, N, N), beta=1.0)
    at = g.op("TRANSPOSE", [a, g.const(np.array([0, 1, 3, 2]), "perm")], (1, H, N, N))
    v = g.unary("TANH", g.input((1, H, D, N), "v"))
    out = g.op("BATCH_MATMUL", [v, at], (1, H, D, N), adj_x=False, adj_y=False)
    data = tflite_frontend.load(g.bytes(out)).float_tflite(None)
    after, counts = _legalized(data, True, monkeypatch)
    assert counts["ADD"] == 4
    assert_same_function(data, after, atol=1e-5, rtol=1e-5)


def test_the_split_on_the_per_channel_mul_spelling_is_exact(monkeypatch) -> None:
    """Where both operands are not repeated (more than FULL_PIECES pieces a head), the softmax
    as X is split all the same: three repeat convs, three MULs and sums, two ADDs per piece."""
    monkeypatch.setattr(attention, "FULL_PIECES", 0)
    data = _attention()
    after, model, result = apply(data, LegalizeActivationMatmul())
    counts = Counter(ops(model))
    assert result.fired() == {"LegalizeActivationMatmul": 1}
    assert 2 * counts["MUL"] == 3 * counts["ADD"] > 0 and "DEPTHWISE_CONV_2D" not in counts
    assert_same_function(data, after, atol=1e-5, rtol=1e-5)
