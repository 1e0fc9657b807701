"""Tiny inline IR graphs for the rule tests: build, optimize, compare with the interpreter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tflfuse.convert.rule_sets import pipeline
from tflfuse.ir import Graph, Model, Tensor, flatbuffer
from tflfuse.rewrite import PassManager, PassResult, Rule
from tflfuse.targets import target as target_named
from tflfuse.targets.edgetpu.predict import predict_edgetpu
from tflfuse.verification import verify


class G:
    """A float graph under construction: `g.op("CONV_2D", [x, w, b], shape, padding="SAME")`."""

    def __init__(self, seed: int = 0) -> None:
        self.graph = Graph("main")
        self.rng = np.random.default_rng(seed)

    def input(self, shape: Sequence[int], name: str = "input") -> Tensor:
        t = self.graph.add_tensor(name, shape)
        self.graph.inputs.append(t)
        return t

    def const(self, value: Any, name: str = "c") -> Tensor:
        arr = np.asarray(value)
        if arr.dtype.kind == "f":
            return self.graph.add_constant(name, arr.astype(np.float32), "FLOAT32")
        return self.graph.add_constant(name, arr.astype(np.int32), "INT32")

    def rand(self, *shape: int, low: float = -1.0, high: float = 1.0, name: str = "w") -> Tensor:
        return self.const(self.rng.uniform(low, high, shape).astype(np.float32), name)

    def op(
        self,
        type: str,
        inputs: Sequence[Tensor | None],
        shape: Sequence[int],
        outputs: int = 1,
        **options: Any,
    ) -> Tensor:
        outs = [self.graph.add_tensor(type.lower(), shape) for _ in range(outputs)]
        self.graph.add_op(type, inputs, outs, options)
        return outs[0]

    def multi(
        self,
        type: str,
        inputs: Sequence[Tensor | None],
        shapes: Sequence[Sequence[int]],
        **options: Any,
    ) -> list[Tensor]:
        outs = [self.graph.add_tensor(type.lower(), s) for s in shapes]
        self.graph.add_op(type, inputs, outs, options)
        return outs

    # common layers -------------------------------------------------------------------------
    def conv(
        self,
        x: Tensor,
        out_ch: int,
        k: int = 1,
        stride: int = 1,
        padding: str = "SAME",
        act: str = "NONE",
        bias: bool = True,
    ) -> Tensor:
        n, h, w, c = x.shape
        if padding == "SAME":
            oh, ow = -(-h // stride), -(-w // stride)
        else:
            oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
        inputs = [x, self.rand(out_ch, k, k, c)]
        inputs.append(self.rand(out_ch, name="b") if bias else None)
        return self.op(
            "CONV_2D",
            inputs,
            (n, oh, ow, out_ch),
            padding=padding,
            stride_h=stride,
            stride_w=stride,
            fused_activation_function=act,
        )

    def dwconv(
        self,
        x: Tensor,
        k: int = 3,
        stride: int = 1,
        padding: str = "SAME",
        act: str = "NONE",
        multiplier: int = 1,
    ) -> Tensor:
        n, h, w, c = x.shape
        if padding == "SAME":
            oh, ow = -(-h // stride), -(-w // stride)
        else:
            oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
        return self.op(
            "DEPTHWISE_CONV_2D",
            [x, self.rand(1, k, k, c * multiplier), self.rand(c * multiplier, name="b")],
            (n, oh, ow, c * multiplier),
            padding=padding,
            stride_h=stride,
            stride_w=stride,
            depth_multiplier=multiplier,
            fused_activation_function=act,
        )

    def fc(self, x: Tensor, out: int, act: str = "NONE") -> Tensor:
        rows = int(np.prod(x.shape[:-1]))
        w, b = self.rand(out, x.shape[-1]), self.rand(out, name="b")
        return self.op(
            "FULLY_CONNECTED",
            [x, w, b],
            (rows, out),
            fused_activation_function=act,
            keep_num_dims=False,
        )

    def binary(self, type: str, a: Tensor, b: Tensor, act: str = "NONE") -> Tensor:
        shape = np.broadcast_shapes(a.shape, b.shape)
        if type in ("ADD", "SUB", "MUL", "DIV"):
            return self.op(type, [a, b], shape, fused_activation_function=act)
        return self.op(type, [a, b], shape)

    def unary(self, type: str, x: Tensor) -> Tensor:
        return self.op(type, [x], x.shape)

    def model(self, *outputs: Tensor) -> Model:
        self.graph.outputs = list(outputs)
        self.graph.validate()
        return Model([self.graph])

    def bytes(self, *outputs: Tensor) -> bytes:
        return flatbuffer.to_bytes(self.model(*outputs))


def run_rules(data: bytes, passes: Sequence[Any]) -> tuple[bytes, Model, PassResult]:
    model = flatbuffer.from_bytes(data)
    result = PassManager(list(passes)).run(model)
    return flatbuffer.to_bytes(model), model, result


def optimize(
    data: bytes, level: int = 2, target: str = "xnnpack", rules: Sequence[Rule] | None = None
) -> tuple[bytes, Model, PassResult]:
    return run_rules(data, rules if rules is not None else pipeline(level, target_named(target)))


def ops(model: Model) -> list[str]:
    return [op.type for op in model.main.ops]


def assert_same_function(
    ref: bytes, cand: bytes, atol: float = 1e-5, rtol: float = 1e-5, must_vary: bool = True
) -> verify.Agreement:
    agreement = verify.compare(ref, cand, atol=atol, rtol=rtol)
    assert agreement.ok, agreement
    if must_vary:
        assert agreement.varies, "outputs do not depend on the input: the comparison is vacuous"
    return agreement


def refusals(result: PassResult, rule: str) -> list[str]:
    return [r.reason for r in (*result.refusals, *result.not_applicable) if r.rule == rule]


def apply(data: bytes, *rules: Any) -> tuple[bytes, Model, PassResult]:
    """Run the given rules plus dead-code elimination and ordering to a fixed point."""
    from tflfuse.rewrite import DeadCodeElimination, TopologicalSort

    return run_rules(data, [*rules, DeadCodeElimination(), TopologicalSort()])


def edgetpu_placed(data: bytes) -> tuple[int, int]:
    """(ops predicted on the Edge TPU, on the CPU) in one segment, forms evidence included: an
    op of a form no compiled model shows at its size counts on the CPU."""
    p = predict_edgetpu(flatbuffer.from_bytes(data))
    on = sum(o.status.startswith("Mapped") for o in p.ops)
    return on, len(p.ops) - on
