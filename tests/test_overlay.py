"""`tflfuse check --overlay`: node data Model Explorer reads, keyed the way it names TFLite ops.

The file is parsed back with `model_explorer.node_data_builder` (field names checked strictly) and
written out again by that package: our fields unchanged, the rest its defaults. Node ids are
compared with the graph that Model Explorer's own TFLite adapter builds from the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import ORACLE

from tflfuse.cli import main
from tflfuse.ir import Graph, Model, Quantization, flatbuffer
from tflfuse.targets import predict
from tflfuse.targets import target as target_named
from tflfuse.targets.edgetpu import overlay

DEEPLAB = ORACLE / "deeplabv3_mnv2_dm05_pascal_quant.tflite"


def _q(scale: float) -> Quantization:
    return Quantization(scale=np.array([scale], np.float32), zero_point=np.array([0], np.int64))


def cut_model(path: Path) -> Path:
    """int8 RELU -> LEAKY_RELU (not in the Edge TPU table) -> RELU6: mapped, cut, after the cut."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 4, 4, 8), "INT8", quantization=_q(0.05))
    a = g.add_tensor("relu", x.shape, "INT8", quantization=_q(0.05))
    b = g.add_tensor("leaky", x.shape, "INT8", quantization=_q(0.05))
    c = g.add_tensor("relu6", x.shape, "INT8", quantization=_q(0.05))
    g.add_op("RELU", [x], [a])
    g.add_op("LEAKY_RELU", [a], [b], {"alpha": 0.1})
    g.add_op("RELU6", [b], [c])
    g.inputs, g.outputs = [x], [c]
    flatbuffer.save(Model([g]), path)
    return path


def assert_model_explorer_reads(data: dict) -> None:
    """Read the file with Model Explorer's classes, let them write it again: our fields come
    back unchanged and the others are the package's defaults."""
    ndb = pytest.importorskip("model_explorer.node_data_builder")
    from dacite import Config, from_dict

    # strict: every key must be a field of GraphNodeData / NodeDataResult. Types unchecked: the
    # classes annotate `value` as a number, while the web app shows any value (strValue) and
    # the GraphNodeData docs speak of string values, which carry the reason here.
    config = Config(strict=True, check_types=False)
    parsed = ndb.ModelNodeData(
        graphsData={gid: from_dict(ndb.GraphNodeData, g, config=config) for gid, g in data.items()}
    )
    for graph in parsed.graphsData.values():
        assert all(isinstance(r, ndb.NodeDataResult) for r in graph.results.values())
    written = json.loads(parsed.to_json_string())
    defaults = json.loads(ndb.GraphNodeData(results={}).to_json_string())
    assert set(written) == set(data)
    for gid, graph in data.items():
        assert {k: written[gid][k] for k in graph} == graph
        assert {k: v for k, v in written[gid].items() if k not in graph} == {
            k: v for k, v in defaults.items() if k not in graph
        }


def adapter_op_nodes(path: Path) -> dict[str, dict[str, str]]:
    """{graph id: {node id: label}} for the op nodes of Model Explorer's TFLite adapter graph."""
    pytest.importorskip("model_explorer")
    from model_explorer.builtin_tflite_flatbuffer_adapter import BuiltinTfliteFlatbufferAdapter

    out: dict[str, dict[str, str]] = {}
    for collection in BuiltinTfliteFlatbufferAdapter().convert(str(path), {})["graphCollections"]:
        for graph in collection.graphs:
            nodes = {n["id"]: n["label"] for n in graph["nodes"]}
            out[graph["id"]] = {
                k: v
                for k, v in nodes.items()
                if v not in ("GraphInputs", "GraphOutputs", "pseudo_const", "pseudo_qconst")
            }
    return out


def test_check_writes_node_data_model_explorer_reads(tmp_path: Path, capsys) -> None:
    model_path = cut_model(tmp_path / "cut.tflite")
    out = tmp_path / "cut.json"
    assert main(["check", str(model_path), "--target", "edgetpu", "--overlay", str(out)]) == 0
    assert f"node data for Model Explorer: {out}" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert_model_explorer_reads(data)
    results = data["main"]["results"]
    assert sorted(results) == ["0", "1", "2"]
    assert results["0"] == {"value": "Edge TPU", "bgColor": overlay.MAPPED_COLOR}
    assert results["1"]["bgColor"] == overlay.CUT_COLOR
    assert results["1"]["value"].startswith("CPU: Operation not supported - ")
    assert "LEAKY_RELU" in results["1"]["value"]
    assert results["2"]["bgColor"] == overlay.AFTER_CUT_COLOR
    assert results["2"]["value"].startswith("CPU: More than one subgraph is not supported - ")
    # the keys are the ids Model Explorer gives these ops, in that order
    nodes = adapter_op_nodes(model_path)
    assert nodes == {"main": {"0": "relu", "1": "leaky_relu", "2": "relu6"}}


@pytest.mark.skipif(not DEEPLAB.is_file(), reason="../shared/oracle is absent")
def test_overlay_of_a_real_model_names_every_op_node(tmp_path: Path) -> None:
    model = flatbuffer.load(DEEPLAB)
    prediction = predict(model, target_named("edgetpu"))
    out = tmp_path / "deeplab.json"
    overlay.write(out, model, prediction)
    data = json.loads(out.read_text())
    assert_model_explorer_reads(data)
    nodes = adapter_op_nodes(DEEPLAB)["main"]
    results = data["main"]["results"]
    assert set(results) == set(nodes) and len(nodes) == len(model.main.ops)
    for index, op in enumerate(model.main.ops):
        assert nodes[str(index)] == op.type.lower()  # the same op under the same id
    colors = [results[str(i)]["bgColor"] for i in range(len(model.main.ops))]
    assert colors.count(overlay.MAPPED_COLOR) == prediction.mapped
    assert colors.count(overlay.MAPPED_COLOR) < len(colors)  # deeplab's tail runs on the CPU


def test_overlay_with_json_keeps_stdout_json(tmp_path: Path, capsys) -> None:
    model_path = cut_model(tmp_path / "cut.tflite")
    out = tmp_path / "o.json"
    args = ["check", str(model_path), "--target", "edgetpu", "--json", "--overlay", str(out)]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["mapped"] == 1 and out.is_file()


def test_overlay_refuses_to_overwrite_the_model(tmp_path: Path, capsys) -> None:
    model_path = cut_model(tmp_path / "cut.tflite")
    before = model_path.read_bytes()
    args = ["check", str(model_path), "--target", "edgetpu", "--overlay", str(model_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("tflfuse: error: ") and "would overwrite the model" in err
    assert model_path.read_bytes() == before


def test_overlay_into_a_missing_folder_is_a_clean_error(tmp_path: Path, capsys) -> None:
    model_path = cut_model(tmp_path / "cut.tflite")
    args = [
        "check",
        str(model_path),
        "--target",
        "edgetpu",
        "--overlay",
        str(tmp_path / "no/x.json"),
    ]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "does not exist" in captured.err and captured.out == ""  # nothing printed either


def test_a_prediction_for_another_model_is_refused(tmp_path: Path) -> None:
    three_ops = flatbuffer.load(cut_model(tmp_path / "cut.tflite"))
    g = Graph("main")
    x = g.add_tensor("x", (1, 4), "INT8", quantization=_q(0.1))
    y = g.add_tensor("y", (1, 4), "INT8", quantization=_q(0.1))
    g.add_op("RELU", [x], [y])
    g.inputs, g.outputs = [x], [y]
    with pytest.raises(ValueError, match="made for another model"):
        overlay.node_data(Model([g]), predict(three_ops, target_named("edgetpu")))
