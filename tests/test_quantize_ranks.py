"""Calibration statistics handed to litert-quantizer in each tensor's own rank.

A ViT's patch embedding (CONV_2D -> RESHAPE to tokens) followed by the class token's
CONCATENATION: the form tflfuse leaves once the exporter's transposes around the RESHAPE are gone
(timm deit_tiny through litert-torch). With the profiler calibration's (1,)-shaped ranges the
quantizer gave the constant class token a rank-4 scale and refused it (a crash in the quantize
stage); in the tensors' ranks it quantizes, and the result follows the float model.
"""

from __future__ import annotations

import irgraphs
import numpy as np
import pytest

from tflfuse.ir import Graph, Signature, flatbuffer


def _patch_embed_with_class_token() -> bytes:
    g = Graph("main")
    x = g.add_tensor("input", (1, 4, 4, 3))
    c = irgraphs.conv(g, x, 8, name="patch_embed").output
    shape = g.add_constant("tokens/shape", np.array([1, 16, 8], np.int32), "INT32")
    tokens = g.add_tensor("tokens", (1, 16, 8))
    g.add_op("RESHAPE", [c, shape], [tokens], {"new_shape": [1, 16, 8]})
    cls = g.add_constant("cls_token", irgraphs.weights(1, 1, 8, scale=0.3))
    cat = g.add_tensor("with_cls", (1, 17, 8))
    options = {"axis": 1, "fused_activation_function": "NONE"}
    g.add_op("CONCATENATION", [cls, tokens], [cat], options)
    pos = g.add_constant("pos_embed", irgraphs.weights(1, 17, 8, scale=0.3))
    out = g.add_tensor("out", (1, 17, 8))
    g.add_op("ADD", [cat, pos], [out], {"fused_activation_function": "NONE"})
    m = irgraphs.model_of(g, [x], [out])
    m.signatures = [Signature("serving_default", 0, {"input": x}, {"out": out})]
    return flatbuffer.to_bytes(m)


def test_statistics_take_their_tensors_rank() -> None:
    from tflfuse.quantize.quantize import in_tensor_ranks

    g = flatbuffer.from_bytes(_patch_embed_with_class_token()).main
    stats = {
        "patch_embed": {"min": np.array([-1.0]), "max": np.array([2.0])},
        "tokens": {"min": np.array([-1.0]), "max": np.array([2.0])},
        "elsewhere": {"min": np.array([-3.0]), "max": np.array([3.0])},
        "per_channel": {"min": np.array([-1.0, -2.0]), "max": np.array([1.0, 2.0])},
    }
    shaped = in_tensor_ranks(g, stats)
    assert shaped["patch_embed"]["min"].shape == (1, 1, 1, 1)
    assert shaped["tokens"]["max"].shape == (1, 1, 1)
    assert float(shaped["tokens"]["max"].reshape(-1)[0]) == 2.0
    assert shaped["elsewhere"]["min"].shape == (1,)  # not a tensor of this graph: as given
    assert shaped["per_channel"]["min"].shape == (2,)  # several values: as given
    assert stats["tokens"]["min"].shape == (1,)  # the input is not modified


def test_class_token_after_patch_embedding_quantizes() -> None:
    pytest.importorskip("litert_quantizer")
    from tflfuse.quantize.quantize import quantize
    from tflfuse.verification.runs import run_float

    data = _patch_embed_with_class_token()
    rng = np.random.default_rng(0)
    calib = rng.uniform(0, 1, (16, 4, 4, 3)).astype(np.float32)
    q = quantize(data, "int8", [calib], progress=False)  # raised ValueError (ranks 4 vs 3)
    model = flatbuffer.from_bytes(q.data)
    (cat,) = model.main.ops_of("CONCATENATION")
    assert all(t.dtype == "INT8" for t in (*cat.inputs, *cat.outputs))
    x = rng.uniform(0, 1, (4, 4, 4, 3)).astype(np.float32)
    want, got = run_float(data, [x])[0], run_float(q.data, [x])[0]
    spread = float(want.max() - want.min())
    assert spread > 1.0  # the outputs vary: the comparison means something
    assert float(np.abs(got - want).max()) <= 0.03 * spread
