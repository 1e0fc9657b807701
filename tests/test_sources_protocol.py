"""Both sources of `tflfuse convert` implement `tflfuse.sources.protocol.Source` structurally:
every declared attribute present with a value of its declared type, every declared method with
the same parameters (names, kinds, defaults) and compatible annotations (a parameter accepts at
least what the protocol passes, a result is at most what the protocol promises). A
`runtime_checkable` isinstance would only check the names."""

from __future__ import annotations

import inspect
import types
import typing
from pathlib import Path
from typing import Any, Union

import numpy as np
import pytest

from tflfuse.convert.records import LegalizeRecord
from tflfuse.sources import tflite
from tflfuse.sources.protocol import Source


def _arms(hint: Any) -> set[Any]:
    """A union's members (one member for anything else)."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return set(typing.get_args(hint))
    return {hint}


def _covers(wide: Any, narrow: Any) -> bool:
    """Whether every value of type `narrow` is of type `wide` (Any covers and is covered)."""
    if Any in (wide, narrow):
        return True
    return _arms(narrow) <= _arms(wide)


def _has_type(value: Any, hint: Any) -> bool:
    """isinstance for the annotations the protocol uses (unions, list/dict/tuple generics)."""
    if hint is Any:
        return True
    if typing.get_origin(hint) in (Union, types.UnionType):
        return any(_has_type(value, arm) for arm in typing.get_args(hint))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is None:
        return value is None if hint is type(None) else isinstance(value, hint)
    if not isinstance(value, origin):
        return False
    if origin is list or (origin is tuple and args[-1:] == (Ellipsis,)):
        return all(_has_type(v, args[0]) for v in value)
    if origin is dict:
        return all(_has_type(k, args[0]) and _has_type(v, args[1]) for k, v in value.items())
    return True


def _protocol_methods() -> dict[str, Any]:
    return {n: f for n, f in vars(Source).items() if inspect.isfunction(f) and n[0] != "_"}


def conformance_problems(source: object) -> list[str]:
    """What `source` lacks or gets wrong of the Source protocol, one sentence each."""
    problems = []
    for name, hint in typing.get_type_hints(Source).items():
        if not hasattr(source, name):
            problems.append(f"no attribute {name}")
        elif not _has_type(getattr(source, name), hint):
            problems.append(f"{name} = {getattr(source, name)!r} is not {hint}")
    for name, declared in _protocol_methods().items():
        given = getattr(type(source), name, None)
        if not inspect.isfunction(given):
            problems.append(f"no method {name}")
            continue
        want, got = inspect.signature(declared), inspect.signature(given)
        shape = [(p.name, p.kind, p.default) for p in want.parameters.values()]
        if shape != [(p.name, p.kind, p.default) for p in got.parameters.values()]:
            problems.append(f"{name}{got} does not take the parameters of {name}{want}")
            continue
        want_hints, got_hints = typing.get_type_hints(declared), typing.get_type_hints(given)
        for param in list(want.parameters)[1:]:  # (self)
            if not _covers(got_hints.get(param, Any), want_hints[param]):
                problems.append(f"{name}: {param} is {got_hints[param]}, not {want_hints[param]}")
        if not _covers(want_hints["return"], got_hints.get("return", Any)):
            problems.append(f"{name} returns {got_hints['return']}, not {want_hints['return']}")
    return problems


def test_the_protocol_declares_what_convert_asks_of_a_source() -> None:
    declared = set(typing.get_type_hints(Source)) | set(_protocol_methods())
    for member in ("layout", "graph_info", "unfused_float", "stock"):
        assert member in declared


def test_the_tflite_source_implements_the_protocol(tiny_tflite: Path) -> None:
    source = tflite.load(tiny_tflite)
    assert conformance_problems(source) == []
    assert source.layout is None and source.graph_info == {}


def test_the_keras_source_implements_the_protocol() -> None:
    keras = pytest.importorskip("keras")
    from tflfuse.sources.keras import load_model
    from tflfuse.sources.keras_route import KerasSource

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    source = KerasSource(load_model(model))
    assert conformance_problems(source) == []
    assert source.layout is None


def test_the_check_finds_a_missing_member_and_a_changed_signature(tiny_tflite: Path) -> None:
    class Drifted(tflite.TfliteSource):
        def stock(self, rec: Any, calib: Any, progress: bool = False) -> tuple[bytes, str]:
            return b"", ""  # a default the protocol does not declare

        def eval_inputs(self, calib: Any, seed: int) -> list[np.ndarray] | None:  # type: ignore[override]
            return None  # promises less than the protocol: None is not a list of arrays

        def reference(self, inputs: list[int]) -> list[np.ndarray]:  # type: ignore[override]
            return []  # accepts less than the protocol passes

    source = tflite.load(tiny_tflite)
    drifted = Drifted.__new__(Drifted)
    drifted.__dict__.update(vars(source))
    del drifted.__dict__["graph_info"]
    drifted.batch = "1"  # type: ignore[assignment]
    problems = conformance_problems(drifted)
    assert "no attribute graph_info" in problems
    assert any(p.startswith("batch = '1' is not") for p in problems)
    assert any(p.startswith("stock(self, rec") for p in problems)
    assert any(p.startswith("eval_inputs returns") for p in problems)
    assert any(p.startswith("reference: inputs is") for p in problems)
    assert len(problems) == 5, problems


def test_the_legalization_record_writes_the_reports_section_in_its_order() -> None:
    details = {"rules": ["A"], "fired": {"A": 1}}
    assert LegalizeRecord(ran=False, reason="none").to_dict() == {"ran": False, "reason": "none"}
    kept = LegalizeRecord(ran=True, kept=True, details=details)
    assert list(kept.to_dict()) == ["ran", "rules", "fired", "kept"] and kept.dropped is None
    dropped = LegalizeRecord(ran=True, kept=False, reason="verification failed", details=details)
    assert list(dropped.to_dict()) == ["ran", "rules", "fired", "kept", "reason"]
    assert dropped.dropped == "verification failed"
