"""Property: on random int8 graphs of rank 2 to 4, every target pipeline writes a model that runs
and stays within its declared int8 tolerance (issue 11).

Hypothesis draws a float graph (conv, depthwise, FC, LEAKY_RELU, PRELU, max/average pools,
MEAN, ADD/MUL with constants or a second branch, RELU/RELU6, HARD_SWISH, reshapes between
ranks), calibrates it by running it in the interpreter with every tensor as an output, and
quantizes it the way the stock converter would (per-tensor activations from the observed
ranges, per-channel conv and depthwise weights, int32 biases, pools and data movement keep
their input's parameters), with int8 or float inputs and outputs. The int8 graph is then
optimized for each target by `optimize_bytes`, whose verification fails if the result does not
run or an output moves by more than the steps the fired rules declare on the paths to it
(`tflfuse.rewrite.int8_error_bounds`). 300 graphs, 4 targets each, about 10-15 s.

What it found while it was built: MeanToAveragePool declared 2 steps but moved a 3x3 mean by 5
(the pool rounds at the input's coarser scale), FuseActivationIntoProducer declared 1 but moved
an FC -> RELU by 8 (same reason): both now declare their error per match from the scale ratio;
and summing steps along a path without the ops' gains was exceeded by LEAKY_RELU -> FC ->
LEAKY_RELU (4 steps seen, 3 allowed): the bound now carries errors through each op's gain.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rulekit import G

from tflfuse.convert.optimize import optimize_bytes
from tflfuse.device.interpreter import make_interpreter
from tflfuse.ir import Graph, Model, Op, Quantization, Tensor, flatbuffer
from tflfuse.verification.runs import run

TARGETS = ("xnnpack", "edgetpu", "gpu", "cpu")
ACTS = ["NONE", "NONE", "RELU", "RELU6"]
INPUT_SCALE = 1.0 / 128  # int8 inputs span [-1, 1): the float graph is calibrated on that range
# outputs keep their input's quantization (the int8 kernels do not rescale these)
SAME_AS_INPUT = {
    "MAX_POOL_2D",
    "AVERAGE_POOL_2D",
    "RESHAPE",
    "TRANSPOSE",
    "PAD",
}
WEIGHT_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": None}


class RandomInt8Net:
    """Draws layers on a float graph; `x` is the current tensor, of rank 2, 3 or 4."""

    def __init__(self, data: st.DataObject, seed: int) -> None:
        self.d = data
        self.g = G(seed)
        rank = data.draw(st.sampled_from([2, 3, 4]), "rank")
        c = data.draw(st.integers(1, 6), "c")
        dims = [data.draw(st.integers(2, 6), f"d{i}") for i in range(rank - 2)]
        self.x = self.g.input((1, *dims, c))
        self.extra: list[Tensor] = []

    def draw(self, strategy: st.SearchStrategy, label: str):
        return self.d.draw(strategy, label)

    @property
    def rank(self) -> int:
        return len(self.x.shape)

    @property
    def channels(self) -> int:
        return self.x.shape[-1]

    def _weights(self, *shape: int, fan_in: int) -> Tensor:
        bound = 1.5 / np.sqrt(fan_in)
        return self.g.rand(*shape, low=-bound, high=bound)

    # layers ------------------------------------------------------------------------------------
    def conv(self) -> None:
        k = self.draw(st.sampled_from([1, 3]), "k")
        stride = self.draw(st.sampled_from([1, 1, 2]), "stride")
        pad = self.draw(st.sampled_from(["SAME", "VALID"]), "pad")
        if min(self.x.shape[1:3]) < k:
            pad = "SAME"
        out = self.draw(st.integers(1, 6), "out")
        n, h, w, c = self.x.shape
        if pad == "SAME":
            oh, ow = -(-h // stride), -(-w // stride)
        else:
            oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
        self.x = self.g.op(
            "CONV_2D",
            [self.x, self._weights(out, k, k, c, fan_in=k * k * c), self.g.rand(out, name="b")],
            (n, oh, ow, out),
            padding=pad,
            stride_h=stride,
            stride_w=stride,
            fused_activation_function=self.draw(st.sampled_from(ACTS), "act"),
        )

    def dwconv(self) -> None:
        self.x = self.g.dwconv(self.x, k=3, act=self.draw(st.sampled_from(ACTS), "act"))

    def fc(self) -> None:
        """On the last axis (rank 2 and 3: one row per leading position), or an NHWC tensor read
        directly per pixel or as a whole image."""
        row = self.channels
        if self.rank == 4 and self.draw(st.booleans(), "whole"):
            row = int(np.prod(self.x.shape[1:]))
        rows = int(np.prod(self.x.shape)) // row
        out = self.draw(st.integers(1, 8), "fc_out")
        self.x = self.g.op(
            "FULLY_CONNECTED",
            [self.x, self._weights(out, row, fan_in=row), self.g.rand(out, name="b")],
            (rows, out),
            fused_activation_function=self.draw(st.sampled_from(ACTS), "act"),
            keep_num_dims=False,
        )

    def leaky_relu(self) -> None:
        alpha = self.draw(st.sampled_from([0.01, 0.1, 0.2, 0.5]), "alpha")
        self.x = self.g.op("LEAKY_RELU", [self.x], self.x.shape, alpha=alpha)

    def prelu(self) -> None:
        c = self.channels
        shape = self.draw(st.sampled_from([(c,), (*[1] * (self.rank - 2), c)]), "alpha_shape")
        alpha = self.g.const(self.g.rng.uniform(0.05, 0.5, shape).astype(np.float32), "alpha")
        self.x = self.g.op("PRELU", [self.x, alpha], self.x.shape)

    def pool(self) -> None:
        if self.rank != 4 or min(self.x.shape[1:3]) < 2:
            return self.activation()
        kind = self.draw(st.sampled_from(["MAX_POOL_2D", "AVERAGE_POOL_2D"]), "pool")
        n, h, w, c = self.x.shape
        if self.draw(st.booleans(), "global"):
            size, stride, pad, out = (h, w), 1, "VALID", (n, 1, 1, c)
        else:
            size, stride, pad, out = (2, 2), 2, "VALID", (n, h // 2, w // 2, c)
        self.x = self.g.op(
            kind,
            [self.x],
            out,
            padding=pad,
            stride_h=stride,
            stride_w=stride,
            filter_height=size[0],
            filter_width=size[1],
            fused_activation_function="NONE",
        )

    def mean(self) -> None:
        if self.rank != 4:
            return self.activation()
        n, _, _, c = self.x.shape
        axes = self.g.const(np.array([1, 2], np.int32), "axes")
        self.x = self.g.op("MEAN", [self.x, axes], (n, 1, 1, c), keep_dims=True)

    def binary(self) -> None:
        kind = self.draw(st.sampled_from(["ADD", "MUL"]), "binary")
        if self.draw(st.booleans(), "with_const"):
            other = self.g.rand(self.channels, low=0.2 if kind == "MUL" else -1.0, high=1.5)
        else:  # a second branch of the same tensor
            other = self.g.unary("RELU", self.x)
        act = self.draw(st.sampled_from(ACTS), "act")
        self.x = self.g.binary(kind, self.x, other, act=act)

    def activation(self) -> None:
        self.x = self.g.unary(self.draw(st.sampled_from(["RELU", "RELU6"]), "a"), self.x)

    def hard_swish(self) -> None:
        scaled = self.g.binary("MUL", self.x, self.g.const(np.float32(4.0), "four"))
        self.x = self.g.unary("HARD_SWISH", scaled)  # reach past +-3

    def reshape(self) -> None:
        """Flatten to rank 2, or lift a rank-2 tensor to NHWC (1, 1, 1, C)."""
        size = int(np.prod(self.x.shape))
        lift = self.rank == 2 and self.x.shape[0] == 1
        shape = (1, 1, 1, size) if lift else (1, size)
        self.x = self.g.op(
            "RESHAPE", [self.x, self.g.const(np.array(shape))], shape, new_shape=list(shape)
        )

    def branch_out(self) -> None:
        """The current tensor also becomes a model output (rules must keep it)."""
        self.extra.append(self.x)
        self.activation()

    LAYERS = (
        "conv",
        "conv",
        "dwconv",
        "fc",
        "leaky_relu",
        "leaky_relu",
        "prelu",
        "pool",
        "mean",
        "binary",
        "binary",
        "activation",
        "hard_swish",
        "reshape",
        "branch_out",
    )

    def build(self) -> Graph:
        for _ in range(self.draw(st.integers(1, 5), "depth")):
            layer = self.draw(st.sampled_from(self.LAYERS), "layer")
            if self.rank != 4 and layer in ("conv", "dwconv"):
                layer = "leaky_relu"
            getattr(self, layer)()
        self.g.graph.outputs = list(dict.fromkeys([self.x, *self.extra]))
        self.g.graph.validate()
        return self.g.graph


# -- calibration and quantization ------------------------------------------------------------------
def observed_ranges(graph: Graph, runs: int = 4) -> dict[str, tuple[float, float]]:
    """min/max of every activation tensor over `runs` inputs uniform in [-1, 1)."""
    activations = [t for t in graph.tensors if not t.is_constant and t not in graph.inputs]
    saved = graph.outputs
    graph.outputs = activations
    data = flatbuffer.to_bytes(Model([graph]))
    graph.outputs = saved
    names = [d["name"] for d in make_interpreter(data, delegate="none").get_output_details()]
    rng = np.random.default_rng(0)
    inputs = [
        [rng.uniform(-1, 1 - INPUT_SCALE, t.shape).astype(np.float32) for t in graph.inputs]
        for _ in range(runs)
    ]
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for outs in run(data, inputs):
        for name, value in zip(names, outs):
            lo[name] = min(lo.get(name, 0.0), float(value.min()))
            hi[name] = max(hi.get(name, 0.0), float(value.max()))
    return {name: (lo[name], hi[name]) for name in names}


def per_tensor(lo: float, hi: float) -> Quantization:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max(hi - lo, 1e-3) / 255.0
    zero = int(np.clip(round(-128 - lo / scale), -128, 127))
    return Quantization(np.array([scale], np.float32), np.array([zero]))


def quantize_constant(value: np.ndarray, axis: int | None) -> tuple[np.ndarray, Quantization]:
    """Symmetric int8 (zero point 0), per channel along `axis` or per tensor."""
    if axis is None:
        scale = np.array([max(float(np.abs(value).max()), 1e-6) / 127.0], np.float32)
        q = np.clip(np.round(value / scale[0]), -127, 127).astype(np.int8)
        return q, Quantization(scale, np.zeros(1, np.int64))
    reduce = tuple(i for i in range(value.ndim) if i != axis)
    scale = (np.maximum(np.abs(value).max(axis=reduce), 1e-6) / 127.0).astype(np.float32)
    shape = [1] * value.ndim
    shape[axis] = -1
    q = np.clip(np.round(value / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, Quantization(scale, np.zeros(scale.size, np.int64), axis=axis)


def quantize_graph(
    graph: Graph, ranges: dict[str, tuple[float, float]], float_io: bool = False
) -> bytes:
    """The int8 twin of a float graph: int8 inputs and outputs, or float ones with a QUANTIZE
    after each input and a DEQUANTIZE before each output (the converter's two forms)."""
    q = Graph("main")
    tensors: dict[int, Tensor] = {}
    for t in graph.inputs:
        quant = Quantization(np.array([INPUT_SCALE]), np.zeros(1))
        tensors[id(t)] = q.add_tensor(t.name, t.shape, "INT8", quantization=quant)
        if float_io:
            real = q.add_tensor(t.name + "_float", t.shape)
            q.add_op("QUANTIZE", [real], [tensors[id(t)]])
            q.inputs.append(real)
        else:
            q.inputs.append(tensors[id(t)])
    for op in graph.ops:
        inputs = [_quantized_input(q, op, i, t, tensors) for i, t in enumerate(op.inputs)]
        outputs = []
        for t in op.outputs:
            if op.type in SAME_AS_INPUT:
                quant = inputs[0].quantization
            else:
                quant = per_tensor(*ranges[t.name])
            tensors[id(t)] = q.add_tensor(t.name, t.shape, "INT8", quantization=quant)
            outputs.append(tensors[id(t)])
        q.add_op(op.type, inputs, outputs, dict(op.options))
    q.outputs = [tensors[id(t)] for t in graph.outputs]
    if float_io:
        reals = []
        for t in q.outputs:
            reals.append(q.add_tensor(t.name + "_float", t.shape))
            q.add_op("DEQUANTIZE", [t], [reals[-1]])
        q.outputs = reals
    q.validate()
    return flatbuffer.to_bytes(Model([q]))


def _quantized_input(q: Graph, op: Op, i: int, t: Tensor | None, tensors: dict) -> Tensor | None:
    if t is None:
        return None
    if id(t) in tensors and not t.is_constant:
        return tensors[id(t)]
    if t.dtype != "FLOAT32":
        return q.add_constant(t.name, t.data, t.dtype)  # shapes, axes, paddings
    value = np.asarray(t.data, np.float32)
    if op.type in WEIGHT_AXIS and i == 1:
        data, quant = quantize_constant(value, WEIGHT_AXIS[op.type])
        return q.add_constant(t.name, data, "INT8", quant)
    if op.type in WEIGHT_AXIS and i == 2:  # bias: int32 at input scale x weight scale
        x_scale = float(tensors[id(op.inputs[0])].quantization.scale[0])
        w_scale = q.tensors[-1].quantization.scale.astype(np.float64) * x_scale
        data = np.round(value / w_scale).astype(np.int32)
        return q.add_constant(
            t.name, data, "INT32", Quantization(w_scale.astype(np.float32), np.zeros(w_scale.size))
        )
    data, quant = quantize_constant(value, None)
    return q.add_constant(t.name, data, "INT8", quant)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_every_target_pipeline_keeps_random_int8_graphs_running_and_within_tolerance(
    data, seed: int
) -> None:
    graph = RandomInt8Net(data, seed).build()
    int8 = quantize_graph(graph, observed_ranges(graph), data.draw(st.booleans(), "float_io"))
    make_interpreter(int8, delegate="none")  # the generator's own graph must run
    for target in TARGETS:
        result = optimize_bytes(int8, target=target)  # raises when it breaks or drifts
        v = result.verification
        assert v["verified"] and v.get("ok", False), (target, v, result.result.fired())


def int8_twin(data: bytes) -> bytes:
    """The int8 twin of a float model's bytes, at the ranges `observed_ranges` sees."""
    graph = flatbuffer.from_bytes(data).main
    return quantize_graph(graph, observed_ranges(graph))
