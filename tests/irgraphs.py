"""Tiny float graphs built directly in the IR, for rule and engine tests (no TensorFlow needed)."""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Graph, Model, Op, Tensor, flatbuffer

RNG = np.random.default_rng(1234)


def weights(*shape: int, scale: float = 0.5) -> np.ndarray:
    return RNG.normal(0.0, scale, shape).astype(np.float32)


def conv(
    g: Graph, x: Tensor, cout: int, *, k: int = 3, act: str = "NONE", name: str = "conv"
) -> Op:
    cin = x.shape[-1]
    w = g.add_constant(f"{name}/w", weights(cout, k, k, cin))
    b = g.add_constant(f"{name}/b", weights(cout, scale=0.1))
    y = g.add_tensor(name, (*x.shape[:-1], cout))
    return g.add_op(
        "CONV_2D",
        [x, w, b],
        [y],
        {
            "padding": "SAME",
            "stride_w": 1,
            "stride_h": 1,
            "dilation_w_factor": 1,
            "dilation_h_factor": 1,
            "fused_activation_function": act,
        },
    )


def depthwise(g: Graph, x: Tensor, *, act: str = "NONE", name: str = "dw") -> Op:
    c = x.shape[-1]
    w = g.add_constant(f"{name}/w", weights(1, 3, 3, c))
    b = g.add_constant(f"{name}/b", weights(c, scale=0.1))
    y = g.add_tensor(name, x.shape)
    return g.add_op(
        "DEPTHWISE_CONV_2D",
        [x, w, b],
        [y],
        {
            "padding": "SAME",
            "stride_w": 1,
            "stride_h": 1,
            "depth_multiplier": 1,
            "dilation_w_factor": 1,
            "dilation_h_factor": 1,
            "fused_activation_function": act,
        },
    )


def fully_connected(g: Graph, x: Tensor, units: int, *, act: str = "NONE", name: str = "fc") -> Op:
    w = g.add_constant(f"{name}/w", weights(units, x.shape[-1]))
    b = g.add_constant(f"{name}/b", weights(units, scale=0.1))
    y = g.add_tensor(name, (x.shape[0], units))
    return g.add_op("FULLY_CONNECTED", [x, w, b], [y], {"fused_activation_function": act})


def add(g: Graph, a: Tensor, b: Tensor, *, act: str = "NONE", name: str = "add") -> Op:
    y = g.add_tensor(name, a.shape)
    return g.add_op("ADD", [a, b], [y], {"fused_activation_function": act})


def unary(g: Graph, op_type: str, x: Tensor, name: str | None = None) -> Op:
    y = g.add_tensor(name or op_type.lower(), x.shape, x.dtype)
    return g.add_op(op_type, [x], [y])


def model_of(g: Graph, inputs: list[Tensor], outputs: list[Tensor]) -> Model:
    g.inputs, g.outputs = list(inputs), list(outputs)
    m = Model([g])
    m.validate()
    return m


def to_bytes(m: Model) -> bytes:
    return flatbuffer.to_bytes(m)


def op_types(m: Model) -> list[str]:
    return [op.type for op in m.main.ops]
