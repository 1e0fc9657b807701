"""Defuse: undo the converter's epilogue fusion to get an honest unfused baseline from any .tflite.

Every fused activation becomes its own op, and (float models) every conv/FC bias becomes its
own ADD: one kernel per framework op, the same maths, no identities or copies padding the count.
Weights that the converter already folded (BatchNorm into conv) cannot be unfolded and stay.

int8 ops keep their int32 bias (an int8 ADD would need a scale the model never had); their
activation moves to its own op writing the same quantized tensor, with the pre-activation tensor
given the same scale — exact, since the activation only clamps.
"""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Graph, Op
from tflfuse.rewrite import Builder, Pass, common

# Ops whose fused activation is applied to their output (LSTM/RNN-style ops use it inside).
_EPILOGUE_OPS = frozenset(
    {
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "FULLY_CONNECTED",
        "TRANSPOSE_CONV",
        "CONV_3D",
        "ADD",
        "SUB",
        "MUL",
        "DIV",
        "AVERAGE_POOL_2D",
        "MAX_POOL_2D",
        "L2_POOL_2D",
        "CONCATENATION",
    }
)
_ACTIVATION_OPS = {"RELU": "RELU", "RELU6": "RELU6", "RELU_N1_TO_1": "RELU_N1_TO_1", "TANH": "TANH"}


class Defuse(Pass):
    """OP(x, fused=ACT)  =>  OP(x) -> ACT;  W(x, b)  =>  W(x, 0) -> ADD(b)  (float W only).

    `bias=False` keeps biases inside their op (only activations are split off).
    """

    def __init__(self, *, bias: bool = True) -> None:
        self.bias = bias

    def run(self, graph: Graph) -> int:
        changed = 0
        for op in list(graph.ops):
            if op.type not in _EPILOGUE_OPS:
                continue
            act = op.options.get("fused_activation_function", "NONE")
            if act in _ACTIVATION_OPS:
                self._split_activation(graph, op, act)
                changed += 1
            if self.bias and op.type in common.WEIGHTED and self._split_bias(graph, op):
                changed += 1
        return changed

    @staticmethod
    def _split_activation(graph: Graph, op: Op, act: str) -> None:
        out = op.output
        b = Builder(graph, op, prefix="", after=op)
        pre = b.tensor(out.name + "_preact", out.shape, out)
        b.set_output(op, 0, pre)
        b.op(_ACTIVATION_OPS[act], pre, out=out)
        b.commit()
        pre.made.shape_signature = out.shape_signature
        op.fused_activation = "NONE"

    @staticmethod
    def _split_bias(graph: Graph, op: Op) -> bool:
        if not common.has_float_params(op) or not common.is_float(common.data_input(op)):
            return False
        b = common.bias(op)
        index = 3 if op.type == "TRANSPOSE_CONV" else 2
        if len(op.inputs) <= index or op.inputs[index] is None or not np.any(b):
            return False
        bias_const, out = op.input(index), op.output
        bld = Builder(graph, op, prefix="", after=op)
        bld.set_bias(op, np.zeros_like(b))
        pre = bld.tensor(out.name + "_prebias", out.shape, dtype=out.dtype)
        bld.set_output(op, 0, pre)
        bld.ADD(pre, bias_const, out=out)
        bld.commit()
        pre.made.shape_signature = out.shape_signature
        return True
