"""Model Explorer node data for a placement prediction: see on the graph where it is cut, and why.

`tflfuse check MODEL --target edgetpu --overlay cut.json` writes a file that
`model-explorer MODEL --node_data_paths cut.json` paints over the graph: every op of the main
subgraph gets a value, "Edge TPU" or "CPU: <the compiler's status> - <the reason>", and a colour
(mapped green, the ops that cut the graph red, ops that would map but sit after the cut amber).

The format is the one `model_explorer.node_data_builder` defines: `ModelNodeData` serialized as
`{graph id: GraphNodeData}`, each `GraphNodeData` holding `results` keyed by node id. Model
Explorer's TFLite adapter (direct_flatbuffer_to_json_graph_convert.cc) names a graph by its
subgraph name (unnamed: "main" for subgraph 0, else "subgraph_<i>") and each op node by the op's
index in its subgraph ("0", "1", ...); tflfuse's IR names subgraphs by the same rule, so the keys
here are `graph.name` and `str(op index)`. No TensorFlow and no Model Explorer import: the file is
plain JSON, and the tests read it back with Model Explorer's own classes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tflfuse.files import atomic_write_bytes
from tflfuse.ir import Model
from tflfuse.json_types import JSONDict
from tflfuse.targets.capabilities import Prediction, capability
from tflfuse.targets.registry import find

MAPPED_COLOR = "#34a853"  # green
CUT_COLOR = "#ea4335"  # red: this op cannot map (it, or something it needs, cuts the graph)
AFTER_CUT_COLOR = "#fbbc04"  # amber: would map, but runs on the CPU because of the cut


def _after_cut_status() -> str | None:
    """The compiler's status for ops that would map but lie after the cut."""
    return capability("edgetpu").get("status", {}).get("after_cut")


def node_data(model: Model, prediction: Prediction) -> JSONDict:
    """The node-data JSON object for the main subgraph: {graph id: {"name", "results", ...}}."""
    graph = model.main
    if len(prediction.ops) != len(graph.ops):
        raise ValueError(
            f"the prediction covers {len(prediction.ops)} ops, the main subgraph has "
            f"{len(graph.ops)}: it was made for another model"
        )
    where = target.label if (target := find(prediction.target_name)) else prediction.target_name
    after_cut = _after_cut_status() if prediction.target_name == "edgetpu" else None
    results: dict[str, dict[str, Any]] = {}
    for op in prediction.ops:
        if op.runs_on != "cpu":
            value, color = where, MAPPED_COLOR
        elif after_cut is not None and op.status == after_cut:
            value, color = f"CPU: {op.status} - {op.reason}", AFTER_CUT_COLOR
        else:
            value, color = f"CPU: {op.status} - {op.reason}", CUT_COLOR
        results[str(op.index)] = {"value": value, "bgColor": color}
    return {
        graph.name: {
            "name": f"{where} placement (tflfuse prediction)",
            "results": results,
            "showExpandedSummaryOnGroupNode": True,
            "showLabelCountColumnsInChildrenStatsTable": True,
        }
    }


def write(path: str | Path, model: Model, prediction: Prediction) -> None:
    """Write the node data as JSON (atomically: a failed write leaves nothing behind)."""
    text = json.dumps(node_data(model, prediction), indent=2) + "\n"
    atomic_write_bytes(Path(path), text.encode("utf-8"))
