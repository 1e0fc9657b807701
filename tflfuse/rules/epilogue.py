"""Epilogue fusion: element-wise ops appended to the heavy kernel that produces their input."""

from __future__ import annotations

from tflfuse.rewrite import Match, OpPattern, PatternBuilder, Refusal, Rule, refuse

# Producers whose TFLite kernels apply a fused activation, and the activations they take.
_ACTIVATION_OPS = ("RELU", "RELU6", "RELU_N1_TO_1")
_PRODUCERS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD")


class FuseActivationIntoProducer(Rule):
    """PRODUCER(x...) -> RELU|RELU6|RELU_N1_TO_1  =>  PRODUCER(x..., fused_activation=that).

    PRODUCER is CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED or ADD. Float: exact (the kernel
    clamps the same values). int8: the fused op writes the activation's output tensor, so it
    requantizes once to the activation's scale instead of twice: equal to within one step.
    """

    quantized_ok = True

    def pattern(self, p: PatternBuilder) -> OpPattern:
        return p.any(*_ACTIVATION_OPS)(p.any(*_PRODUCERS)(..., out="y"))

    def check(self, m: Match) -> Refusal | None:
        producer = m.y.op
        if producer.fused_activation != "NONE":
            return refuse(
                f"{producer.type} already has fused activation {producer.fused_activation}"
            )
        if len(m.y.consumers) > 1:
            return refuse(f"{producer.type} output is also read by another op")
        if m.graph.is_graph_output(m.y):
            return refuse(f"{producer.type} output is also a model output")
        if m.y.dtype != m.root.output.dtype:
            return refuse("activation changes the tensor type")
        return None

    def rewrite(self, m: Match) -> None:
        producer, act = m.y.op, m.root
        out = act.output
        m.graph.remove_op(act)
        producer.outputs = [out]
        producer.fused_activation = act.type
