"""Property: on random valid float graphs, every target pipeline keeps the function.

Hypothesis builds small graphs from the ops the rules touch (conv, depthwise, FC, add, mul, sub,
activations, pad, reshape, concat, transpose; BatchNorm-like affines, pre-activation blocks,
sibling branches, identities; FCs reading NHWC tensors directly) with random shapes and
constants, optimizes them and compares interpreter outputs on seeded inputs within rtol 1e-5,
atol 1e-5.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rulekit import G, optimize

from tflfuse.ir import Tensor
from tflfuse.verification import verify

ACTS = ["NONE", "NONE", "RELU", "RELU6", "RELU_N1_TO_1"]


class RandomNet:
    """Draws layers onto a growing graph; `x` is the current NHWC (or 2-D) tensor."""

    def __init__(self, data: st.DataObject, seed: int) -> None:
        self.d = data
        self.g = G(seed)
        h = data.draw(st.integers(3, 6), "h")
        c = data.draw(st.integers(1, 5), "c")
        self.x = self.g.input((1, h, data.draw(st.integers(3, 6), "w"), c))
        self.extra: list[Tensor] = []

    def draw(self, strategy: st.SearchStrategy, label: str):
        return self.d.draw(strategy, label)

    def weights(self, *shape: int, fan_in: int):
        return self.g.rand(*shape, low=-1.5 / np.sqrt(fan_in), high=1.5 / np.sqrt(fan_in))

    def vector(self, n: int, positive: bool = False) -> Tensor:
        lo = 0.5 if positive or self.draw(st.booleans(), "positive") else -1.5
        shape = self.draw(st.sampled_from([(n,), (1, 1, 1, n)] if self.rank == 4 else [(n,)]), "vs")
        return self.g.const(self.g.rng.uniform(lo, 1.5, shape).astype(np.float32), "v")

    @property
    def rank(self) -> int:
        return len(self.x.shape)

    @property
    def channels(self) -> int:
        return self.x.shape[-1]

    # layers ------------------------------------------------------------------------------------
    def conv(self) -> None:
        x = self.x
        k = self.draw(st.sampled_from([1, 3]), "k")
        stride = self.draw(st.sampled_from([1, 1, 2]), "stride")
        pad = "SAME"
        if min(x.shape[1:3]) >= k:
            pad = self.draw(st.sampled_from(["SAME", "VALID"]), "p")
        out = self.draw(st.integers(1, 6), "out")
        n, h, w, c = x.shape
        oh, ow = (
            (-(-h // stride), -(-w // stride))
            if pad == "SAME"
            else ((h - k) // stride + 1, (w - k) // stride + 1)
        )
        self.x = self.g.op(
            "CONV_2D",
            [x, self.weights(out, k, k, c, fan_in=k * k * c), self.g.rand(out, name="b")],
            (n, oh, ow, out),
            padding=pad,
            stride_h=stride,
            stride_w=stride,
            fused_activation_function=self.draw(st.sampled_from(ACTS), "act"),
        )

    def dwconv(self) -> None:
        m = self.draw(st.sampled_from([1, 1, 2]), "mult")
        self.x = self.g.dwconv(
            self.x, k=3, multiplier=m, act=self.draw(st.sampled_from(ACTS), "act")
        )

    def fc(self) -> None:
        """An FC on a 2-D tensor, or on an NHWC tensor: after a RESHAPE, or reading it directly
        (TFLite flattens it into rows of the weights' width: per pixel, per image row, or the
        whole image; issue 11 found FoldAffineIntoFollowing crashing on the direct form)."""
        x = self.x
        row = x.shape[-1]
        if self.rank == 4:
            n, h, w, c = x.shape
            how = self.draw(st.sampled_from(["reshape", "pixel", "image_row", "image"]), "fc_in")
            row = {"reshape": h * w * c, "pixel": c, "image_row": w * c, "image": h * w * c}[how]
            if how == "reshape":
                x = self.g.op(
                    "RESHAPE", [x, self.g.const(np.array([1, row]))], (1, row), new_shape=[1, row]
                )
        rows = int(np.prod(x.shape)) // row
        out = self.draw(st.integers(1, 8), "fc_out")
        self.x = self.g.op(
            "FULLY_CONNECTED",
            [x, self.weights(out, row, fan_in=row), self.g.rand(out, name="b")],
            (rows, out),
            fused_activation_function=self.draw(st.sampled_from(ACTS), "act"),
            keep_num_dims=False,
        )

    def affine(self) -> None:
        kind = self.draw(st.sampled_from(["MUL", "ADD", "SUB"]), "affine")
        self.x = self.g.binary(
            kind, self.x, self.vector(self.channels), act=self.draw(st.sampled_from(ACTS), "act")
        )

    def batchnorm_relu(self) -> None:
        y = self.g.binary("MUL", self.x, self.vector(self.channels, positive=True))
        y = self.g.binary("ADD", y, self.vector(self.channels))
        self.x = self.g.unary("RELU", y)

    def activation(self) -> None:
        self.x = self.g.unary(self.draw(st.sampled_from(["RELU", "RELU6", "TANH"]), "a"), self.x)

    def pad(self) -> None:
        if self.rank != 4:
            return
        top, bottom, left, right = (self.draw(st.integers(0, 1), "pad") for _ in range(4))
        n, h, w, c = self.x.shape
        pads = self.g.const(
            np.array([[0, 0], [top, bottom], [left, right], [0, 0]], np.int32), "pads"
        )
        self.x = self.g.op("PAD", [self.x, pads], (n, h + top + bottom, w + left + right, c))

    def padded_conv(self) -> None:
        """An explicit PAD (usually what SAME would add) before a VALID 3x3 conv or max pool."""
        from tflfuse.rewrite.common import pads_for_same

        n, h, w, c = self.x.shape
        stride = self.draw(st.sampled_from([1, 2]), "stride")
        ph, pw = pads_for_same(h, 3, stride), pads_for_same(w, 3, stride)
        if self.draw(st.booleans(), "odd_pad"):
            ph = (1, 1)
        pads = self.g.const(np.array([[0, 0], list(ph), list(pw), [0, 0]], np.int32), "pads")
        y = self.g.op("PAD", [self.x, pads], (n, h + sum(ph), w + sum(pw), c))
        oh, ow = (y.shape[1] - 3) // stride + 1, (y.shape[2] - 3) // stride + 1
        if self.draw(st.booleans(), "pool"):
            self.x = self.g.op(
                "MAX_POOL_2D",
                [y],
                (n, oh, ow, c),
                padding="VALID",
                stride_h=stride,
                stride_w=stride,
                filter_height=3,
                filter_width=3,
            )
        else:
            out = self.draw(st.integers(1, 4), "out")
            self.x = self.g.op(
                "CONV_2D",
                [y, self.weights(out, 3, 3, c, fan_in=9 * c), self.g.rand(out, name="b")],
                (n, oh, ow, out),
                padding="VALID",
                stride_h=stride,
                stride_w=stride,
                fused_activation_function="RELU",
            )

    def constant_expression(self) -> None:
        """x + (a * b) with a, b constants: folded by the interpreter."""
        a, b = self.vector(self.channels), self.vector(self.channels)
        self.x = self.g.binary("ADD", self.x, self.g.binary("MUL", a, b))

    def siblings(self) -> None:
        """Two or three 1x1 convs (or FCs) of one input, joined by ADD or CONCATENATION."""
        x, n_sib = self.x, self.draw(st.integers(2, 3), "n_sib")
        join = self.draw(st.sampled_from(["concat", "add", "separate"]), "join")
        outs = []
        for _ in range(n_sib):
            width = self.channels if join == "add" else self.draw(st.integers(1, 4), "sib")
            if self.rank == 4:
                outs.append(
                    self.g.op(
                        "CONV_2D",
                        [
                            x,
                            self.weights(width, 1, 1, self.channels, fan_in=self.channels),
                            self.g.rand(width, name="b"),
                        ],
                        (*x.shape[:3], width),
                        padding="SAME",
                        stride_h=1,
                        stride_w=1,
                        fused_activation_function="NONE",
                    )
                )
            else:
                outs.append(self.g.fc(x, width))
        if join == "add":
            y = outs[0]
            for o in outs[1:]:
                y = self.g.binary("ADD", y, o)
            self.x = y
        elif join == "concat":
            width = sum(o.shape[-1] for o in outs)
            self.x = self.g.op(
                "CONCATENATION", outs, (*outs[0].shape[:-1], width), axis=self.rank - 1
            )
        else:
            self.x = outs[0]
            self.extra.extend(outs[1:])

    def identity(self) -> None:
        kind = self.draw(st.sampled_from(["MUL", "ADD"]), "id")
        value = np.float32(1.0 if kind == "MUL" else 0.0)
        self.x = self.g.binary(kind, self.x, self.g.const(value))

    def transposes(self) -> None:
        if self.rank != 4:
            return
        perm = [0, 2, 1, 3]
        n, h, w, c = self.x.shape
        t = self.g.op("TRANSPOSE", [self.x, self.g.const(np.array(perm))], (n, w, h, c))
        self.x = self.g.op("TRANSPOSE", [t, self.g.const(np.array(perm))], (n, h, w, c))

    def reshape(self) -> None:
        shape = (1, int(np.prod(self.x.shape)))
        r = self.g.op(
            "RESHAPE", [self.x, self.g.const(np.array(shape))], shape, new_shape=list(shape)
        )
        if self.draw(st.booleans(), "back"):
            back = self.x.shape
            r = self.g.op("RESHAPE", [r, self.g.const(np.array(back))], back, new_shape=list(back))
        self.x = r

    LAYERS = (
        "conv",
        "conv",
        "dwconv",
        "fc",
        "fc",
        "affine",
        "affine",
        "batchnorm_relu",
        "activation",
        "pad",
        "siblings",
        "siblings",
        "identity",
        "transposes",
        "reshape",
        "padded_conv",
        "constant_expression",
    )

    def build(self) -> bytes:
        for _ in range(self.draw(st.integers(1, 6), "depth")):
            layer = self.draw(st.sampled_from(self.LAYERS), "layer")
            if self.rank != 4 and layer in ("conv", "dwconv", "pad", "transposes", "padded_conv"):
                layer = "affine"
            getattr(self, layer)()
        outputs = [self.x, *self.extra]
        return self.g.bytes(*dict.fromkeys(outputs))


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=st.data(),
    seed=st.integers(0, 2**16),
    target=st.sampled_from(["xnnpack", "edgetpu", "gpu", "cpu"]),
)
def test_pipeline_keeps_the_function_of_random_graphs(data, seed: int, target: str) -> None:
    original = RandomNet(data, seed).build()
    optimized, model, result = optimize(original, level=2, target=target)
    model.validate()
    agreement = verify.compare(original, optimized, atol=1e-5, rtol=1e-5)
    assert agreement.ok, (agreement, result.fired())
