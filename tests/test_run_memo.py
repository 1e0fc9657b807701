"""A model run (or calibrated) twice on the same inputs within a conversion runs once.

`tflfuse.verification.run_memo` remembers outputs by what decides them (model bytes, inputs,
settings): the checks below count its answers and show that a remembered answer is the one a fresh
run gives, that anything different in the key is run again, and that the budget bounds what is kept.
"""

from __future__ import annotations

import numpy as np
import pytest
from irgraphs import conv, model_of, to_bytes, unary

from tflfuse.ir import Graph, Signature
from tflfuse.verification import run_memo, verify
from tflfuse.verification import runs as runs_module


def _model(act: str = "NONE", bias_shift: float = 0.0) -> bytes:
    """x -> CONV_2D (fused `act`) -> RELU, with the same weights on every call (the bias
    moved by `bias_shift`)."""
    rng = np.random.default_rng(7)
    g = Graph("main")
    x = g.add_tensor("x", (1, 6, 6, 3))
    c = conv(g, x, 4, act=act, name="c")
    c.inputs[1].data = rng.normal(0, 0.5, c.inputs[1].shape).astype(np.float32)
    c.inputs[2].data = rng.normal(0, 0.1, c.inputs[2].shape).astype(np.float32) + bias_shift
    y = unary(g, "RELU", c.outputs[0]).outputs[0]
    m = model_of(g, [x], [y])
    m.signatures = [Signature("serving_default", 0, {"x": x}, {"y": y})]
    return to_bytes(m)


@pytest.fixture(autouse=True)
def _fresh():
    run_memo.clear()
    yield
    run_memo.clear()


def test_a_repeated_run_is_answered_with_the_fresh_runs_outputs() -> None:
    data = _model()
    inputs = verify.seeded_inputs(verify.make_interpreter(data, "none"), 0, 3)
    first = runs_module.run(data, inputs)
    assert run_memo.hits == 0
    again = runs_module.run(data, inputs)
    assert run_memo.hits == 1
    fresh = runs_module.run(data, inputs, remember=False)
    assert run_memo.hits == 1
    for a, b, c in zip(first, again, fresh):
        for x, y, z in zip(a, b, c):
            assert x.tobytes() == y.tobytes() == z.tobytes()
    assert not np.array_equal(first[0][0], first[1][0])  # (the outputs follow the input)


def test_other_bytes_inputs_or_delegate_run_again() -> None:
    data, other = _model(), _model(bias_shift=0.25)
    inputs = verify.seeded_inputs(verify.make_interpreter(data, "none"), 0, 2)
    runs_module.run(data, inputs)
    runs_module.run(other, inputs)
    runs_module.run(data, verify.seeded_inputs(verify.make_interpreter(data, "none"), 5, 2))
    runs_module.run(data, inputs, "ref")
    assert run_memo.hits == 0
    runs_module.run(data, inputs, "ref")
    assert run_memo.hits == 1


def test_the_checks_of_a_conversion_share_the_fused_models_run(monkeypatch) -> None:
    """float -> fused, then fused -> unfused: the fused model (candidate of the first check,
    reference of the second) is run once."""
    float_model, fused, unfused = _model(), _model("RELU"), _model(bias_shift=1e-6)
    runs: list[bytes] = []
    real = runs_module._invoke
    monkeypatch.setattr(runs_module, "_invoke", lambda m, *a: runs.append(m) or real(m, *a))
    assert verify.compare(float_model, fused, atol=0.0, rtol=0.0).identical
    check = verify.compare(fused, unfused, atol=1e-5, rtol=0.0)
    assert check.ok
    # (each check runs its candidate in a worker thread while the reference runs: any order)
    assert sorted(runs) == sorted([float_model, fused, unfused])


def test_the_budget_bounds_what_is_kept(monkeypatch) -> None:
    monkeypatch.setattr(run_memo, "BUDGET", 1000)
    big = [np.zeros(200, np.float32)]  # 800 bytes
    assert run_memo.remembered("k", (1,), lambda: big) is big
    run_memo.remembered("k", (2,), lambda: [np.zeros(200, np.float32)])  # evicts the first
    calls = []
    run_memo.remembered("k", (1,), lambda: calls.append(1) or big)
    assert calls == [1]
    run_memo.remembered("k", (3,), lambda: [np.zeros(400, np.float32)])  # too big to keep
    run_memo.remembered("k", (3,), lambda: calls.append(3) or big)
    assert calls == [1, 3]


def test_a_model_calibrated_twice_on_the_same_data_is_calibrated_once() -> None:
    pytest.importorskip("litert_quantizer")
    from tflfuse.quantize.quantize import quantize

    data = _model()
    calib = [np.random.default_rng(0).uniform(-1, 1, (8, 6, 6, 3)).astype(np.float32)]
    first = quantize(data, "int8", calib, progress=False)
    kept = run_memo.hits
    second = quantize(data, "int8", calib, progress=False)
    assert run_memo.hits == kept + 1
    assert first.data == second.data
    other = quantize(data, "int8", [calib[0] * 2], progress=False)  # other data: calibrated
    assert run_memo.hits == kept + 1
    assert other.data != first.data


def test_the_digest_hashes_each_array_as_its_bytes_without_copying_them() -> None:
    """`digest` reads contiguous arrays through their buffer: the key is the one `tobytes()`
    gave (so nothing remembered changes meaning), for every layout and dtype the runs hand it,
    and arrays differing in contents, dtype or shape get different keys."""
    import hashlib

    def by_copy(model: bytes, arrays: list[np.ndarray]) -> str:
        h = hashlib.sha256(model)
        for a in arrays:
            a = np.ascontiguousarray(a)
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(a.tobytes())
        return h.hexdigest()

    rng = np.random.default_rng(0)
    base = rng.normal(size=(4, 6, 5)).astype(np.float32)
    arrays = [
        base, base[:2], base[:, ::2], base.T, np.asarray(base, ">f4"), base.astype(np.float16),
        base.astype(np.int8), np.array(3.0), np.zeros((0, 3), np.float32), np.ones(3, bool),
    ]  # fmt: skip
    for a in arrays:
        assert run_memo.digest(b"m", [a]) == by_copy(b"m", [a])
    assert run_memo.digest(b"m", arrays) == by_copy(b"m", arrays)
    keys = {run_memo.digest(b"m", [a]) for a in arrays}
    assert len(keys) == len(arrays)
    assert run_memo.digest(b"m", [base]) != run_memo.digest(b"m", [base + 1])
