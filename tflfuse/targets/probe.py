"""Ask the real software what a delegate takes: XNNPACK through the interpreter, GPU through
TFLite's own analyzer.

`delegates/xnnpack.toml` is a table; this module is how it is checked. With XNNPACK applied, the
interpreter's node list ends with one DELEGATE node per partition; the original ops inside a
partition are those between the partition's inputs and outputs. GPU compatibility comes from
TFLite's model analyzer with GPU checks on (the engine behind `tf.lite.experimental.Analyzer`,
`gpu_compatibility=True`; ai_edge_litert ships the same wrapper, so no TensorFlow is needed)
rather than a hand-written table. Checked on this machine: the analyzer in ai-edge-litert 2.3 and in
TensorFlow 2.21 reports every model "compatible" (TOPK_V2, 5-D TRANSPOSE, CUMSUM included), i.e.
its GPU check is compiled out; `analyzer_checks_gpu()` detects that and the GPU report refuses to
pretend.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tflfuse.device.interpreter import make_interpreter
from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, Model, flatbuffer
from tflfuse.targets.capabilities import OpPrediction, Prediction, op_label


def xnnpack_delegated_ops(model: bytes) -> set[int]:
    """Indices (in the main subgraph) of the ops the interpreter handed to XNNPACK."""
    plain = make_interpreter(model, delegate="none")
    n_ops = len(plain._get_ops_details())
    nodes = make_interpreter(model, delegate="xnnpack")._get_ops_details()
    originals, delegates = nodes[:n_ops], nodes[n_ops:]
    producer = {int(t): node["index"] for node in originals for t in node["outputs"]}
    taken: set[int] = set()
    for node in delegates:
        if node["op_name"] != "DELEGATE":
            continue
        boundary = {int(t) for t in node["inputs"]}
        stack = [int(t) for t in node["outputs"]]
        while stack:
            tensor = stack.pop()
            index = producer.get(tensor)
            if index is None or index in taken or tensor in boundary:
                continue
            taken.add(index)
            stack.extend(int(t) for t in originals[index]["inputs"] if int(t) >= 0)
    return taken


_SUBGRAPH = re.compile(r"^Subgraph#(\d+)\b")
_OP_LINE = re.compile(r"^Op#(\d+)\s+\S+\(")
_GPU_WARNING = re.compile(r"^GPU COMPATIBILITY WARNING:\s*(?!Subgraph#)(.*)$")
_GPU_OK = "looks compatible with GPU delegate"


def _analyzer() -> Any:
    """TFLite's model analyzer, ai_edge_litert's build (native code: imported when asked)."""
    try:
        from ai_edge_litert import _pywrap_analyzer_wrapper as wrapper
    except ImportError:
        raise TflfuseError(
            "GPU compatibility comes from TFLite's analyzer: pip install ai-edge-litert"
        ) from None
    return wrapper


def gpu_analyzer_report(model: bytes) -> str:
    """The analyzer's text report with GPU delegate compatibility checks on."""
    wrapper = _analyzer()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.tflite"
        path.write_bytes(model)
        return str(wrapper.ModelAnalyzer(str(path), True, True))


@functools.lru_cache(maxsize=1)
def analyzer_checks_gpu() -> bool:
    """Does this build's analyzer really check? It must reject TOPK_V2, which the GPU lacks."""
    return _GPU_OK not in gpu_analyzer_report(_topk_model())


def _topk_model() -> bytes:
    graph = Graph("probe")
    x = graph.add_tensor("x", (1, 16))
    k = graph.add_constant("k", np.array(3, np.int32))
    values, indices = (
        graph.add_tensor("values", (1, 3)),
        graph.add_tensor("indices", (1, 3), "INT32"),
    )
    graph.add_op(
        "TOPK_V2", [x, k], [values, indices], options_type=flatbuffer.options_type_for("TOPK_V2")
    )
    graph.inputs, graph.outputs = [x], [values, indices]
    return flatbuffer.to_bytes(Model([graph]))


def parse_gpu_report(text: str) -> dict[int, str]:
    """{op index: reason} for the main subgraph's ops the analyzer says the GPU cannot run.

    The analyzer prints each op (`  Op#3 CUMSUM(T#0, T#1) -> [T#5]`) and, right after an op the
    GPU delegate cannot take, `GPU COMPATIBILITY WARNING: <why>`; a summary line per subgraph
    (`GPU COMPATIBILITY WARNING: Subgraph#0 has ... issues at nodes 3, 5 ...`) follows.
    """
    failures: dict[int, str] = {}
    subgraph, op_index = -1, None
    for line in text.splitlines():
        stripped = line.strip()
        sub = _SUBGRAPH.match(stripped)
        if sub:
            subgraph, op_index = int(sub.group(1)), None
            continue
        op = _OP_LINE.match(stripped)
        if op:
            op_index = int(op.group(1))
            continue
        warning = _GPU_WARNING.match(stripped)
        if warning and op_index is not None and subgraph == 0:
            failures[op_index] = warning.group(1).strip() or "not supported by the GPU delegate"
            op_index = None
    return failures


def predict_gpu(model: Model, model_bytes: bytes) -> Prediction:
    """Per-op GPU compatibility of the main subgraph, from TFLite's analyzer."""
    if not analyzer_checks_gpu():
        raise TflfuseError(
            "this build of TFLite's analyzer does not check GPU compatibility (it passes TOPK_V2,"
            " which the GPU delegate lacks), so there is no trustworthy GPU report on this machine"
        )
    failures = parse_gpu_report(gpu_analyzer_report(model_bytes))
    ops = []
    for index, op in enumerate(model.main.ops):
        if index in failures:
            ops.append(
                OpPrediction(index, op_label(op), "cpu", "Not GPU compatible", failures[index])
            )
        else:
            ops.append(
                OpPrediction(
                    index, op_label(op), "gpu", "GPU compatible", "the analyzer found no problem"
                )
            )
    return Prediction("gpu", ops)


def observable_ops(model: Model) -> set[int]:
    """Ops of the main subgraph whose results reach a model output.

    `xnnpack_delegated_ops` finds delegated ops by walking back from each partition's outputs, so
    ops that only feed output-less ops (ASSIGN_VARIABLE in streaming models) cannot be attributed;
    comparisons with a table are meaningful on these ops only.
    """
    graph = model.main
    index = {op: i for i, op in enumerate(graph.ops)}
    seen: set[int] = set()
    stack = [t for t in graph.outputs]
    while stack:
        t = stack.pop()
        op = t.producer
        if op is None or op not in index or index[op] in seen:
            continue
        seen.add(index[op])
        stack.extend(i for i in op.inputs if i is not None)
    return seen
