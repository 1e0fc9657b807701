"""`edgetpu_compiler -n N` cut points (tflfuse.targets.edgetpu.pipeline): the parameter heuristic on
synthetic chains, and on Coral's SSD MobileNet pipeline twins (local evidence; skipped when absent)
with the sources rebuilt from the published layer sizes (the sources themselves are not at hand)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tflfuse.ir import Graph, Model, Quantization, flatbuffer
from tflfuse.targets.edgetpu.modes import compare_modes
from tflfuse.targets.edgetpu.pipeline import parameter_bytes, pipeline_split, segment_graph

PIPELINE = Path("/work/evidence/twins/google-coral__test_data@104342d/pipeline")


class _Builder:
    """A graph of convolutions whose constants have the real layers' byte sizes."""

    def __init__(self, input_name: str = "input") -> None:
        self.graph = Graph("main")
        self.x = self.graph.add_tensor(input_name, [1, 1, 1, 3], "INT8")
        self.graph.inputs.append(self.x)

    def conv(self, name: str, k: int, cin: int, cout: int, x=None, depthwise: bool = False):
        g = self.graph
        w_shape = [1, k, k, cin] if depthwise else [cout, k, k, cin]
        w = g.add_constant(f"{name}/w", np.zeros(w_shape, np.int8), "INT8")
        b = g.add_constant(f"{name}/b", np.zeros([cout], np.int32), "INT32")
        out = g.add_tensor(name, [1, 1, 1, cout], "INT8")
        kind = "DEPTHWISE_CONV_2D" if depthwise else "CONV_2D"
        g.add_op(kind, [self.x if x is None else x, w, b], [out])
        if x is None:
            self.x = out
        return out

    def heads(self, maps: list, classes: int = 91) -> None:
        outs = []
        for i, (t, c, anchors) in enumerate(maps):
            outs.append(self.conv(f"box{i}", 1, c, anchors * 4, x=t))
            outs.append(self.conv(f"class{i}", 1, c, anchors * classes, x=t))
        joined = self.graph.add_tensor("concat", [1, 1, 1, 1], "INT8")
        self.graph.add_op("CONCATENATION", outs, [joined], {"axis": 3})
        self.graph.outputs.append(joined)


def ssd_mobilenet_v1() -> Graph:
    b = _Builder("normalized_input_image_tensor")
    p = "FeatureExtractor/MobilenetV1/MobilenetV1"
    b.conv(f"{p}/Conv2d_0/Relu6", 3, 3, 32)
    chans = [32, 64, 128, 128, 256, 256, 512, 512, 512, 512, 512, 512, 1024, 1024]
    maps = []
    for i in range(1, 14):
        b.conv(f"{p}/Conv2d_{i}_depthwise/Relu6", 3, chans[i - 1], chans[i - 1], depthwise=True)
        out = b.conv(f"{p}/Conv2d_{i}_pointwise/Relu6", 1, chans[i - 1], chans[i])
        if i in (11, 13):
            maps.append((out, chans[i], 3 if i == 11 else 6))
    e = "FeatureExtractor/MobilenetV1/Conv2d_13_pointwise"
    for j, (cin, mid, out_c) in enumerate([(1024, 256, 512), (512, 128, 256), (256, 128, 256)]):
        b.conv(f"{e}_1_Conv2d_{j + 2}_1x1_{mid}/Relu6", 1, cin, mid)
        maps.append((b.conv(f"{e}_2_Conv2d_{j + 2}_3x3_s2_{out_c}/Relu6", 3, mid, out_c), out_c, 6))
    b.conv(f"{e}_1_Conv2d_5_1x1_64/Relu6", 1, 256, 64)
    maps.append((b.conv(f"{e}_2_Conv2d_5_3x3_s2_128/Relu6", 3, 64, 128), 128, 6))
    b.heads(maps)
    return b.graph


def ssd_mobilenet_v2() -> Graph:
    b = _Builder("normalized_input_image_tensor")
    p = "FeatureExtractor/MobilenetV2"
    b.conv(f"{p}/Conv/Relu6", 3, 3, 32)
    b.conv(f"{p}/expanded_conv/depthwise/Relu6", 3, 32, 32, depthwise=True)
    b.conv(f"{p}/expanded_conv/project/add_fold", 1, 32, 16)
    cin, k, maps = 16, 1, []
    for cout, reps in [(24, 2), (32, 3), (64, 4), (96, 3), (160, 3), (320, 1)]:
        for _ in range(reps):
            expand = b.conv(f"{p}/expanded_conv_{k}/expand/Relu6", 1, cin, cin * 6)
            if k == 13:
                maps.append((expand, cin * 6, 3))
            b.conv(f"{p}/expanded_conv_{k}/depthwise/Relu6", 3, cin * 6, cin * 6, depthwise=True)
            b.conv(f"{p}/expanded_conv_{k}/project/add_fold", 1, cin * 6, cout)
            cin, k = cout, k + 1
    maps.append((b.conv(f"{p}/Conv_1/Relu6", 1, 320, 1280), 1280, 6))
    e = f"{p}/layer_19"
    for j, (ci, mid, out_c) in enumerate(
        [(1280, 256, 512), (512, 128, 256), (256, 128, 256), (256, 64, 128)]
    ):
        b.conv(f"{e}_1_Conv2d_{j + 2}_1x1_{mid}/Relu6", 1, ci, mid)
        maps.append((b.conv(f"{e}_2_Conv2d_{j + 2}_3x3_s2_{out_c}/Relu6", 3, mid, out_c), out_c, 6))
    b.heads(maps)
    return b.graph


def test_parameter_heuristic_on_a_chain():
    b = _Builder()
    for i, c in enumerate([8, 8, 64, 64, 8]):
        b.conv(f"c{i}", 1, c if i == 0 else 64, c)
    g = b.graph
    g.outputs.append(b.x)
    sizes = [parameter_bytes(op) for op in g.ops]
    assert sizes == [8 * 8 + 32, 64 * 8 + 32, 64 * 64 + 256, 64 * 64 + 256, 64 * 8 + 32]
    split = pipeline_split(g, 2)
    assert split is not None
    # total 9888: the first segment stops before passing 4945 bytes (640 + 4352 would)
    assert [len(s) for s in split.ops] == [2, 3]
    assert split.parameter_bytes == [sum(sizes[:2]), sum(sizes[2:])]
    assert split.inputs == [[], ["c1"]]
    assert pipeline_split(g, 6) is None  # more segments than ops


def test_each_segment_keeps_an_op_before_the_first_sink():
    b = _Builder()
    b.conv("big", 1, 3, 4096)
    b.conv("small", 1, 4096, 1)
    b.graph.outputs.append(b.x)
    split = pipeline_split(b.graph, 2)
    assert split is None  # the first op alone is over the average: libcoral refuses too


@pytest.mark.parametrize("version,build", [("v1", ssd_mobilenet_v1), ("v2", ssd_mobilenet_v2)])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_cuts_of_corals_pipeline_twins(version, build, n):
    twins = [
        PIPELINE
        / f"ssd_mobilenet_{version}_coco_quant_postprocess_segment_{k}_of_{n}_edgetpu.tflite"
        for k in range(n)
    ]
    if not all(t.is_file() for t in twins):
        pytest.skip("Coral's pipeline twins are not in /work/evidence")
    split = pipeline_split(build(), n)
    assert split is not None
    for k in range(1, n):
        twin = flatbuffer.load(twins[k])
        read = {t.name.split(";")[0] for t in twin.main.inputs}
        assert set(split.inputs[k]) == read, (k, split.inputs[k], read)


def _quantized_chain(kinds: list[str]) -> Graph:
    """int8 1x1 convolutions of 64 channels (or a custom op where `kinds` says "CUSTOM")."""
    qp = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 64), "INT8", quantization=qp)
    g.inputs = [x]
    for i, kind in enumerate(kinds):
        y = g.add_tensor(f"t{i}", (1, 8, 8, 64), "INT8", quantization=qp)
        if kind == "CUSTOM":
            g.add_op("CUSTOM", [x], [y], custom_code="MyOp")
        else:
            w = g.add_constant(f"w{i}", np.ones((64, 1, 1, 64), np.int8), "INT8", qp)
            b = g.add_constant(f"b{i}", np.zeros(64, np.int32), "INT32", qp)
            g.add_op("CONV_2D", [x, w, b], [y], {"stride_h": 1, "stride_w": 1, "padding": "SAME"})
        x = y
    g.outputs = [x]
    return g


def test_each_piece_is_compiled_on_its_own():
    """conv, custom, conv, conv: one segment stops at the custom op (1 of 4 mapped); cut in two
    after the custom op, the second piece starts afresh and maps both its convolutions."""
    model = Model([_quantized_chain(["CONV_2D", "CUSTOM", "CONV_2D", "CONV_2D"])])
    split = pipeline_split(model.main, 2)
    assert split is not None and [len(s) for s in split.ops] == [2, 2]
    first, second = (segment_graph(model.main, split, k) for k in (0, 1))
    assert [t.name for t in first.inputs] == ["x"] and [t.name for t in first.outputs] == ["t1"]
    assert [t.name for t in second.inputs] == ["t1"] and [t.name for t in second.outputs] == ["t3"]
    assert [op.type for op in second.ops] == ["CONV_2D", "CONV_2D"] and len(model.main.ops) == 4
    choice = compare_modes(model, None, 2)
    single, piped = choice.of("single"), choice.of("pipelined")
    assert single is not None and piped is not None
    assert single.mapped == 1 and piped.mapped == 3 and piped.segments == 2
    assert piped.flags == ["-n", "2"] and "parameter heuristic" in piped.note
    assert choice.chosen.mode == "multi"  # -a maps as much on one Edge TPU: ranked first
