"""The version an op's operands need: what TensorFlow Lite's converter would write for it.

An interpreter picks an op's kernel by its builtin code and the `version` of its operator code;
a version lower than its operand types need lets an older interpreter take the op and fail when
it runs (an int8 GELU labelled v1: a float-only kernel). litert-quantizer writes version 1 for
every op and rules make new ops, so the writer (`ir.flatbuffer.to_bytes`) gives every op at least
`required(op)`, and `targets.runtimes` reads a file's ops the same way.

The rules are data: `[versions]` in `delegates/runtimes.toml`, transcribed from
`GetBuiltinOperatorVersion` (op_version.cc) by `benchmarks/runtimes_data.py`, which says what
each word of a test means. Per op, [version, test] pairs in the source's order; the first test
that holds gives the version, none gives 1. An op the table does not name is 1.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import cast

import numpy as np

from tflfuse.ir.graph import Op, Tensor
from tflfuse.resources import data_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

Test = tuple[tuple[bool, str], ...]  # (negated, word) pairs, all of which must hold


@functools.cache
def _raw() -> dict:
    path = data_file("delegates", "runtimes.toml")
    if path is None:
        return {}
    return tomllib.loads(path.read_text(encoding="utf-8")).get("versions", {})


@functools.cache
def table() -> dict[str, tuple[tuple[int, Test], ...]]:
    """{op: ((version, test), ...)} from `delegates/runtimes.toml` ({} when not installed:
    ops keep the version they carry)."""
    out = {}
    for op, tests in _raw().items():
        if op == "always_1":
            continue
        out[op] = tuple(
            (int(v), tuple((w.startswith("!"), w.lstrip("!")) for w in str(t).split()))
            for v, t in tests
        )
    return out


def known() -> frozenset[str]:
    """Every op the table speaks of: those with tests and those it lists as always 1."""
    return frozenset(table()) | frozenset(_raw().get("always_1", ()))


def required(op: Op) -> int:
    """The version `op`'s operands and options need (1 when the table has no test for it)."""
    for version, test in table().get(op.type, ()):
        if all(_holds(op, word) != negated for negated, word in test):
            return version
    return 1


def _tensor(op: Op, side: str, k: int) -> Tensor | None:
    tensors = op.inputs if side == "in" else op.outputs
    return tensors[k] if k < len(tensors) else None


def _scale(t: Tensor | None) -> float | None:
    q = t.quantization if t is not None else None
    if q is None or q.scale is None or q.scale.size != 1:
        return None
    return float(q.scale[0])


def _rank(op: Op) -> int:
    t = _tensor(op, "in", 0)
    return len(t.shape) if t is not None else 0


def _broadcast_over_4(op: Op) -> bool:
    shapes = [t.shape for t in op.inputs[:2] if t is not None]
    return len(shapes) == 2 and shapes[0] != shapes[1] and max(len(s) for s in shapes) > 4


def _grouped(op: Op) -> bool:
    x, w = _tensor(op, "in", 0), _tensor(op, "in", 1)
    return (
        x is not None and w is not None and len(x.shape) == 4 and len(w.shape) == 4
        and w.shape[3] > 0 and x.shape[3] != w.shape[3]
    )  # fmt: skip


def _rescale_at_least_1(op: Op) -> bool:
    s = [_scale(_tensor(op, "in", 0)), _scale(_tensor(op, "in", 1)), _scale(_tensor(op, "out", 0))]
    if any(v is None or v == 0 for v in s):
        return False
    scales = cast("list[float]", s)
    return scales[0] * scales[1] / scales[2] >= 1.0


_FEATURES: dict[str, Callable[[Op], bool]] = {
    "activation": lambda op: op.options.get("fused_activation_function", "NONE") != "NONE",
    "dilated": lambda op: any(
        op.options.get(k, 1) != 1 for k in ("dilation_h_factor", "dilation_w_factor")
    ),
    "grouped": _grouped,
    "broadcast>4": _broadcast_over_4,
    "rescale>=1": _rescale_at_least_1,
    "per_channel_out0": lambda op: _per_channel(_tensor(op, "out", 0)),
}


def _per_channel(t: Tensor | None) -> bool:
    q = t.quantization if t is not None else None
    return q is not None and q.scale is not None and q.scale.size > 1


def _holds(op: Op, word: str) -> bool:
    if word in _FEATURES:
        return _FEATURES[word](op)
    key, _, value = word.partition("=")
    if value:
        if key == "inputs":
            return len(op.inputs) == int(value)
        if key == "rank0":
            return _rank(op) == int(value)
        side, k = ("out", key[3:]) if key.startswith("out") else ("in", key[2:])
        t = _tensor(op, side, int(k))
        return t is not None and t.dtype in value.split("|")
    if word.startswith("opt:"):
        return bool(np.any(op.options.get(word[4:], False)))
    if word.startswith("rank0>"):
        return _rank(op) > int(word[6:])
    for prefix, check in (
        ("quantized", lambda t: _scale(t) is not None or _per_channel(t)),
        ("per_channel", _per_channel),
        ("has", lambda t: t is not None),
    ):
        if word.startswith(prefix) and word[len(prefix) :].isdigit():
            return check(_tensor(op, "in", int(word[len(prefix) :])))
    raise ValueError(f"unknown test word {word!r} in delegates/runtimes.toml [versions]")
