"""Issue 27, round 5: the status strings and compiler labels drawn from compiled pairs' logs.

Unit tests on synthetic packages here; the checks on the pairs themselves need the local sets
(folders named by TFLFUSE_EXTRA_ORACLE, separated by os.pathsep; their repositories carry no
licence, so the files are never committed) and are skipped without them:

- ml-const/edgeTPU's fp16 YOLOv5n-seg (its log, 16.0): 60 DEQUANTIZE "Tensor has unsupported
  rank", the rest of its 386 logged ops as predicted.
- cmpss94068/tensorflowlite's SSD detector (its log, 2.1): the postprocess op logged as CUSTOM,
  "working on an unsupported data type"; its twin's package has the form 15.0 writes.
- MarcelloCeresini/Franco (its log, 15.0): a twin of runtime 12 without a cycle estimate, the
  form read as 16's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import local_pair

from tflfuse.ir import flatbuffer
from tflfuse.targets.edgetpu.truth import (
    compiled_summary,
    compiler_label,
    find_pairs,
    score_pair,
)


def test_the_compiler_label_says_what_the_package_form_cannot_tell() -> None:
    """Runtime 14 is 16's; runtime 12 with a cycle estimate is 15.0 or 2.x (a 2.1 log beside
    one), without one 16 asked for -m 12 or 15.0 (a 15.0 log beside one); older is older."""
    assert compiler_label(14, 16) == "edgetpu_compiler 16 or later (runtime 14: its default)"
    with_estimate = compiler_label(12, 15)
    assert with_estimate.startswith("edgetpu_compiler 15.0 or 2.x (runtime 12")
    without = compiler_label(12, 16)
    assert without.startswith("edgetpu_compiler 16 asked for runtime 12 (-m 12), or 15.0")
    assert compiler_label(10, None).startswith("edgetpu_compiler 15.0 or older (runtime 10)")
    assert compiler_label(None, None) == "unknown (no readable package)"


FP16_SEG = "ml-const__edgeTPU@ba0cf05/tflite_fp32/5nano_seg-fp16.tflite"
SSD = "cmpss94068__tensorflowlite@c72e7bf/detect.tflite"
FRANCO = "MarcelloCeresini__Franco@b89d84b/model.tflite"


@pytest.mark.parametrize(("key", "logged"), [(FP16_SEG, 386), (SSD, 115)])
def test_every_logged_status_is_predicted(key: str, logged: int) -> None:
    score = score_pair(local_pair(key))
    assert score.exact and score.status == (logged, logged)


def test_the_fp16_models_filters_are_an_unsupported_rank() -> None:
    score = score_pair(local_pair(FP16_SEG))
    assert score.prediction is not None
    rank = [o for o in score.prediction.ops if o.status.startswith("Tensor has unsupported rank")]
    assert len(rank) == 60 and {o.op for o in rank} == {"DEQUANTIZE"}


@pytest.mark.parametrize(
    ("key", "version", "label"),
    [
        (SSD, "2.1.302470888", "edgetpu_compiler 15.0 or 2.x"),
        (FRANCO, "15.0.340273435", "edgetpu_compiler 16 asked for runtime 12 (-m 12), or 15.0"),
    ],
)
def test_the_label_holds_the_compiler_the_log_names(key: str, version: str, label: str) -> None:
    pair = local_pair(key)
    assert pair.log is not None and version in pair.log.read_text().splitlines()[0]
    summary = compiled_summary(flatbuffer.load(pair.compiled))
    assert summary["runtime_version"] == 12 and str(summary["compiler"]).startswith(label)


def test_every_logged_status_at_hand_is_predicted() -> None:
    """Every op of every compiler log at hand (the shared sets, and the local ones when named)
    has its predicted status: 327/327 on the shared sets alone, 4,962/4,962 with the local sets
    of issue 27's fifth round. A new log that disagrees fails here, naming the pair."""
    from conftest import SHARED

    folders = [SHARED / "oracle" / name for name in ("edgetpu", "edgetpu-more")]
    folders += [Path(f) for f in os.environ.get("TFLFUSE_EXTRA_ORACLE", "").split(os.pathsep) if f]
    logged = [
        score
        for root in folders
        if root.is_dir()
        for pair in find_pairs(root)
        if pair.log is not None
        if (score := score_pair(pair)).status
    ]
    if not logged:
        pytest.skip("no pair with a compiler log at hand")
    wrong = [s.pair.key for s in logged if s.status is not None and s.status[0] != s.status[1]]
    assert wrong == []
