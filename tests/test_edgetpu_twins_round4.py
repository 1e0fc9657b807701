"""Issue 27's fourth round: the compiled pairs found then, each rule drawn from them checked on
the pair itself (local folders named by TFLFUSE_EXTRA_ORACLE, separated by os.pathsep; their
repositories carry no licence, so the files are never committed: skipped without them).

- IanisRusitoru/CoralModel (dev): a per-channel MUL and ADD of 3 channels, 64 bytes each,
  streamed beside a wide FULLY_CONNECTED (`memory_elementwise`).
- Octogonapus/edgetpu-test (dev, two commits): the same of 128 channels, 2,048 bytes each.
- HanChangHun/Segments-Runner's iNat birds (dev): 3,947,328 bytes all cached by 16
  (`memory.SPLIT_SURE_BYTES`).
- Sandhya1708/modelnew's YOLOv5n (dev): its decode's anchors and grid widened to the output,
  24,064 bytes streamed (`memory_elementwise`); what it caches beyond the layout is undecided.
- cmpss94068/tensorflowlite's MobileNetV2 (holdout) next to a detector whose log names 2.1: a
  package form read as 15 whose bytes are 2.x's layout (`mark_compiler_undecided`).
"""

from __future__ import annotations

import pytest
from conftest import benchmark_module, local_pair

from tflfuse.targets import capability
from tflfuse.targets.edgetpu.memory import predicted_memory, undecided_line
from tflfuse.targets.edgetpu.truth import PairScore, score_pair


def _scored(key: str) -> PairScore:
    score = score_pair(local_pair(key))
    assert score.exact and score.memory is not None, key
    return score


@pytest.mark.parametrize(
    ("key", "cached", "streamed"),
    [
        ("IanisRusitoru__CoralModel@0aef8c1/quantized_model.tflite", 26_048, 3_686_784),
        ("Octogonapus__edgetpu-test@1adbd85/model.tflite", 102_976, 4_096),
        ("Octogonapus__edgetpu-test@8335c3b/model.tflite", 102_976, 4_096),
        (
            "HanChangHun__Segments-Runner@d910f25/models/"
            "mobilenet_v2_1.0_224_inat_bird_quant.tflite",
            3_947_328,
            0,
        ),
    ],
)
def test_the_pairs_rules_were_drawn_from_are_exact_and_decided(
    key: str, cached: int, streamed: int
) -> None:
    m = _scored(key).memory
    assert m is not None
    assert (m["on_chip_bytes"], m["off_chip_bytes"]) == (cached, streamed)
    assert (m["predicted_on_chip_bytes"], m["predicted_off_chip_bytes"]) == (cached, streamed)
    assert not m["undecided"]


def test_a_form_read_as_15_may_be_2x_and_the_score_says_so() -> None:
    """The MobileNetV2 twin's package reads as 15 and holds 3,094,784 bytes: 2.x's layout (no
    softmax), 256 bytes fewer than 15's; the score marks it rather than count a sure miss."""
    score = _scored("cmpss94068__tensorflowlite@c72e7bf/mobilenet_v2_1.0_224_quant.tflite")
    m = score.memory
    assert m is not None and m["compiler_major"] == 15
    assert m["on_chip_bytes"] + m["off_chip_bytes"] == 3_094_784
    assert m["predicted_on_chip_bytes"] == 3_094_784 + 256
    assert score.truth is not None and score.prediction is not None
    ops = score.truth.model.main.ops
    mapped = [ops[o.index] for o in score.prediction.ops if o.runs_on != "cpu"]
    assert predicted_memory(mapped, capability("edgetpu"), 2)["on_chip_bytes"] == 3_094_784
    assert benchmark_module("edgetpu_oracle_score").mark_compiler_undecided([score]) == 1
    assert m["compiler_undecided"] and m["undecided"]
    # as 15's, the layout is decided; only its split is not (above `SPLIT_SURE_BYTES_15`)
    line = undecided_line(predicted_memory(mapped, capability("edgetpu"), 15))
    assert line is not None and line.count(";") == 0 and "streams although it fits" in line


def test_yolov5ns_decode_streams_its_widened_anchors_and_grid() -> None:
    m = _scored("Sandhya1708__modelnew@ff6dfcb/yolov5n-int8.tflite").memory
    assert m is not None
    assert m["off_chip_bytes"] == m["predicted_off_chip_bytes"] == 24_064
    assert m["on_chip_bytes"] == 1_979_968 and m["undecided"]
