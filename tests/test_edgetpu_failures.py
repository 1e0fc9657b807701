"""Whole-model refusals of edgetpu_compiler (targets/edgetpu/failures.py) and the delegate
search (`-d -k N`, modes.search_prefixes), on synthetic graphs; and no compiled pair of the
oracle predicted to fail (each of them compiled)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ORACLE, needs_oracle

from tflfuse.ir import Graph, Model, Quantization, flatbuffer
from tflfuse.targets.edgetpu.failures import parse_failures, whole_model_failures
from tflfuse.targets.edgetpu.modes import compare_modes, format_modes, search_prefixes
from tflfuse.targets.edgetpu.truth import find_pairs


def _relu(dtype: str = "INT8", version: int = 1, op: str = "RELU") -> Model:
    qp = None
    if dtype in ("INT8", "UINT8"):
        qp = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 4), dtype, quantization=qp)
    y = g.add_tensor("y", (1, 8, 8, 4), dtype, quantization=qp)
    g.add_op(op, [x], [y], version=version)
    g.inputs, g.outputs = [x], [y]
    return Model([g])


def test_an_op_version_newer_than_the_compilers_registry_fails_to_parse():
    # QUANTIZE v3 is first in TFLite 2.7.0: compiler 16 refuses it (gh879)
    failures = whole_model_failures(_relu(op="QUANTIZE", version=3))
    assert [(f.kind, f.decided) for f in failures] == [("parse", True)]
    assert "'QUANTIZE' version '3'" in failures[0].message
    # version 2 (1.15.0) parses with 16; RELU v2 (2.1.0) is undecided for 15 and parses with 16
    assert whole_model_failures(_relu(op="QUANTIZE", version=2)) == []
    assert [f.decided for f in parse_failures(_relu(version=2), "15.0")] == [False]
    assert parse_failures(_relu(version=2), "16.0") == []
    assert [f.decided for f in parse_failures(_relu(version=2), "2.0")] == [True]


def test_a_float_model_is_not_quantized_and_check_says_so():
    failures = whole_model_failures(_relu("FLOAT32"))
    assert [(f.kind, f.decided) for f in failures] == [("not_quantized", True)]
    choice = compare_modes(_relu("FLOAT32"))
    assert any("Model not quantized" in n for n in choice.notes)
    assert "Best mode: none" in "\n".join(format_modes(choice))
    assert whole_model_failures(_relu("INT8")) == []


def test_the_delegate_search_tries_prefixes_by_step():
    assert search_prefixes(534, 1)[:3] == [534, 533, 532]  # gh608
    assert search_prefixes(340, 10)[:3] == [340, 330, 320]  # gh671
    assert search_prefixes(25, 10) == [25, 15, 5]
    with pytest.raises(ValueError):
        search_prefixes(10, 0)


@needs_oracle()
def test_no_compiled_pair_is_predicted_to_fail():
    for root in (ORACLE, ORACLE.parent / "edgetpu-more"):
        for pair in find_pairs(root):
            model = flatbuffer.load(pair.cpu)
            assert [f for f in whole_model_failures(model) if f.decided] == [], pair.key


def test_the_log_reader_names_the_failure_and_the_search_tries():
    from tflfuse.targets.edgetpu.compiler_log import parse_log

    searched = parse_log(
        "Edge TPU Compiler version 16.0.384591198\nSearching for valid delegate with step 10\n"
        "Try to compile segment with 340 ops\n"
        "ERROR: Restored original execution plan after delegate application failure.\n"
        "Compilation failed: Compilation failed due to large activation tensors in model.\n"
        "Compilation failed! \nTry to compile segment with 330 ops\nIntermediate tensors: a,b\n"
        "Model compiled successfully in 2270 ms.\n"
    )
    assert searched.search_tries == [340, 330]
    assert searched.failure is not None and "large activation tensors" in searched.failure
    refused = parse_log(
        "Edge TPU Compiler version 15.0.340273435\nInvalid model: x.tflite\nModel not quantized\n"
    )
    assert refused.failure == "Model not quantized" and refused.search_tries == []
    assert parse_log("Edge TPU Compiler version 16.0.384591198\n").failure is None
