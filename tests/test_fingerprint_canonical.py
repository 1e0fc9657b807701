"""benchmarks/fingerprint.py's canonical form: the same for a model whose tensors sit in another
order, another for a model that computes something else; `--compare --canonical` accepts the
first and reports the second."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import benchmark_module
from irgraphs import conv, model_of, unary

from tflfuse.ir import Graph, flatbuffer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fp():
    return benchmark_module("fingerprint")


def test_canonical_form_ignores_tensor_order_and_sees_the_function(fp, tmp_path, capsys) -> None:
    g = Graph()
    x = g.add_tensor("x", (1, 4, 4, 3))
    c = conv(g, x, 4)
    r = unary(g, "RELU", c.output)
    m = model_of(g, [x], [r.output])
    plain, moved, changed = (tmp_path / f"{n}.tflite" for n in ("plain", "moved", "changed"))
    plain.write_bytes(flatbuffer.to_bytes(m))
    g.tensors.reverse()  # the same model, its tensors (and buffers) in another order
    c.output.name = "conv_1"  # and an inner tensor's label (a de-duplicated name) another
    moved.write_bytes(flatbuffer.to_bytes(m))
    w = c.inputs[1]
    w.data = w.data + np.float32(0.5)
    changed.write_bytes(flatbuffer.to_bytes(m))
    assert fp.sha256(plain) != fp.sha256(moved)
    assert fp.canonical(plain) == fp.canonical(moved) != fp.canonical(changed)
    r.output.name = "renamed_output"  # the interface's names count
    renamed = tmp_path / "renamed.tflite"
    renamed.write_bytes(flatbuffer.to_bytes(m))
    assert fp.canonical(renamed) != fp.canonical(changed)

    def runs(path: Path) -> dict:
        entry = {"sha256": fp.sha256(path), "canonical": fp.canonical(path)}
        return {"case": {"exit": 0, "models": {"m.tflite": entry}}}

    for after, want, found in ((moved, 0, "1 models"), (changed, 1, "0 models")):
        a, b = tmp_path / "a.json", tmp_path / "b.json"
        a.write_text(json.dumps(runs(plain)))
        b.write_text(json.dumps(runs(after)))
        assert fp.compare(a, b) == 1  # the plain comparison sees the bytes
        assert fp.compare(a, b, canonically=True) == want
        assert f"{found} with another sha256 and the same canonical form" in capsys.readouterr().out
