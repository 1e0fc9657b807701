"""Channels-last interface (`convert --channels-last`) for models exported from PyTorch.

litert-torch keeps PyTorch's NCHW interface: an image input `[1, 3, H, W]` is read through a
TRANSPOSE (perm 0,2,3,1) into the NHWC layout TFLite computes in, and a 4-D output may be
transposed back (perm 0,3,1,2). On request, the model instead takes (and gives) NHWC tensors:
those TRANSPOSEs are dropped, which changes the model's interface (reported as such) and not its
function. `LayoutChange` keeps what changed so that data given in the original layout can be fed
to the new model and its outputs compared with the original's. No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, Model, Op, Tensor, flatbuffer
from tflfuse.json_types import JSONDict
from tflfuse.rewrite import DeadCodeElimination
from tflfuse.verification.runs import run_float

if TYPE_CHECKING:
    from tflfuse.targets.capabilities import Prediction

TO_NHWC = (0, 2, 3, 1)  # NCHW -> NHWC, the TRANSPOSE an NCHW input is read through
TO_NCHW = (0, 3, 1, 2)  # NHWC -> NCHW, the TRANSPOSE an NCHW output is written through


@dataclass
class LayoutChange:
    """The channels-last model and which of its inputs and outputs changed layout."""

    data: bytes
    inputs: list[int] = field(default_factory=list)  # positions of inputs now NHWC
    outputs: list[int] = field(default_factory=list)  # positions of outputs now NHWC
    removed_ops: int = 0
    details: list[str] = field(default_factory=list)

    def adapt_inputs(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Arrays (sample axis first) in the original NCHW layout, laid out for the new model."""
        return [
            np.ascontiguousarray(a.transpose(TO_NHWC)) if i in self.inputs else a
            for i, a in enumerate(arrays)
        ]

    def restore_inputs(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The inverse of `adapt_inputs`: NHWC arrays back to the original layout."""
        return [
            np.ascontiguousarray(a.transpose(TO_NCHW)) if i in self.inputs else a
            for i, a in enumerate(arrays)
        ]

    def adapt_outputs(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The new model's outputs (sample axis first) back in the original layout."""
        return [
            np.ascontiguousarray(a.transpose(TO_NCHW)) if i in self.outputs else a
            for i, a in enumerate(arrays)
        ]

    def to_dict(self) -> JSONDict:
        return {
            "interface_change": True,
            "inputs_now_nhwc": list(self.inputs),
            "outputs_now_nhwc": list(self.outputs),
            "removed_transposes": self.removed_ops,
            "details": list(self.details),
        }


def _perm(op: Op) -> tuple[int, ...] | None:
    if op.type != "TRANSPOSE" or len(op.inputs) < 2 or op.inputs[1] is None:
        return None
    p = op.inputs[1]
    return tuple(int(v) for v in np.asarray(p.data).ravel()) if p.is_constant else None


def _drop_input_transposes(graph: Graph, t: Tensor) -> tuple[Tensor, int] | None:
    """The NHWC tensor that replaces input `t`, when every reader of `t` is an NCHW->NHWC
    TRANSPOSE (several such readers become one), and how many ops were removed."""
    readers = t.consumers
    if len(t.shape) != 4 or not readers or any(_perm(op) != TO_NHWC for op in readers):
        return None
    new = readers[0].outputs[0]
    for op in readers[1:]:
        graph.replace_uses(op.outputs[0], new)
    for op in readers:
        graph.remove_op(op)
    new.shape_signature = tuple(new.shape)
    return new, len(readers)


def _drop_output_transpose(graph: Graph, t: Tensor) -> Tensor | None:
    """The NHWC tensor written through an NHWC->NCHW TRANSPOSE into output `t`, if any."""
    op = t.producer
    if op is None or _perm(op) != TO_NCHW or len(t.consumers) or graph.outputs.count(t) > 1:
        return None
    src = op.inputs[0]
    if src is None or src in graph.inputs or graph.is_graph_output(src):
        return None
    graph.remove_op(op)
    return src


def channels_last(data: bytes, source: str = "<bytes>") -> LayoutChange:
    """`data` with NHWC inputs (and NHWC outputs where the model transposed back to NCHW).

    Raises a one-line error when no input is read through an NCHW->NHWC TRANSPOSE (there is
    nothing to drop: the model already takes what it computes in)."""
    model = flatbuffer.from_bytes(data, source)
    graph = model.main
    change = LayoutChange(b"")
    renamed: dict[Tensor, Tensor] = {}
    for i, t in enumerate(list(graph.inputs)):
        dropped = _drop_input_transposes(graph, t)
        if dropped is None:
            continue
        new, n = dropped
        graph.inputs[i] = new
        renamed[t] = new
        change.inputs.append(i)
        change.removed_ops += n
        change.details.append(f"input {i}: {list(t.shape)} (NCHW) -> {list(new.shape)} (NHWC)")
    if not change.inputs:
        raise TflfuseError(
            f"{source}: --channels-last: no input is read through an NCHW->NHWC TRANSPOSE"
            " (perm 0,2,3,1), so the model already takes the layout it computes in"
        )
    for i, t in enumerate(list(graph.outputs)):
        src = _drop_output_transpose(graph, t)
        if src is None:
            continue
        graph.outputs[i] = src
        renamed[t] = src
        change.outputs.append(i)
        change.removed_ops += 1
        change.details.append(f"output {i}: {list(t.shape)} (NCHW) -> {list(src.shape)} (NHWC)")
    model.retarget_signatures(renamed)
    DeadCodeElimination().run(graph)
    graph.toposort()
    model.validate()
    change.data = flatbuffer.to_bytes(model)
    return change


def verify(original: bytes, change: LayoutChange, inputs: list[np.ndarray]) -> float:
    """Largest difference between the original model and the channels-last one on `inputs`
    (original layout, sample axis first), outputs compared in the original layout."""
    want = run_float(original, inputs)
    got = change.adapt_outputs(run_float(change.data, change.adapt_inputs(inputs)))
    worst = 0.0
    for a, b in zip(want, got):
        if a.shape != b.shape:
            return float("inf")
        if a.size:
            worst = max(worst, float(np.max(np.abs(a - b))))
    return worst


def _input_transposes(model: Model) -> list[int]:
    """Indices of the TRANSPOSEs that read a graph input (directly or through its QUANTIZE)."""
    graph = model.main
    found = []
    for i, op in enumerate(graph.ops):
        if op.type != "TRANSPOSE" or op.inputs[0] is None:
            continue
        src = op.inputs[0]
        if src.producer is not None and src.producer.type == "QUANTIZE":
            src = src.producer.input(0)
        if src in graph.inputs:
            found.append(i)
    return found


def edgetpu_effect(
    stock_model: Model, stock: Prediction, fused: Prediction, change: LayoutChange
) -> str:
    """What dropping the input TRANSPOSEs means for the Edge TPU mapping, from the predictions
    of the stock model (NCHW interface, TRANSPOSE kept) and the fused one (channels-last)."""
    indices = _input_transposes(stock_model)
    if not indices:
        return "the stock model reads no input through a TRANSPOSE; no change to the mapping"
    first = stock.ops[indices[0]]
    where = "maps it" if first.runs_on != "cpu" else f"leaves it on the CPU: {first.reason}"
    return (
        f"the stock model reads its input through the NCHW->NHWC TRANSPOSE (op {first.index}; the"
        f" Edge TPU prediction {where}); with --channels-last that op is gone"
        f" ({change.removed_ops} TRANSPOSE removed) and the fused model maps"
        f" {fused.mapped}/{len(fused.ops)} ops against the stock model's"
        f" {stock.mapped}/{len(stock.ops)}"
    )
