"""The Edge TPU predictor against every real compiled pair: `exact K/N` per set, and the goal.

Truth is the compiled twin (tflfuse/targets/edgetpu/truth.py); "exact" is defined in
`tflfuse.targets.edgetpu.truth.is_exact`. The goal asserted on each set and on each half of it (dev,
holdout: a fixed hash of the pair's path): at least 95% exact, and never fewer exact pairs than
the documented rule (map in execution order until the first op outside Coral's table or not
int8 / not static). Pairs compiled with several Edge TPU subgraphs are predicted in that mode
(`multiple_subgraphs=True`) and counted the same way.

Sets: ../shared/oracle/edgetpu and ../shared/oracle/edgetpu-more (skipped when absent), and the
local folders named by the environment variable TFLFUSE_EXTRA_ORACLE (separated by os.pathsep;
pairs from repositories without a licence, whose files may not be committed; each is a set named
by its folder, skipped without the variable). A pair that does not load is a miss.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from conftest import SHARED, oracle_models

from tflfuse.ir import flatbuffer
from tflfuse.targets import target as target_named
from tflfuse.targets.edgetpu.compiler_log import parse_log
from tflfuse.targets.edgetpu.truth import PairScore, find_pairs, score_pair, status_agreement

GOAL = 0.95
LICENSED = ("edgetpu", "edgetpu-more")


def _extra() -> dict[str, Path]:
    folders = [f for f in os.environ.get("TFLFUSE_EXTRA_ORACLE", "").split(os.pathsep) if f]
    return {Path(f).name: Path(f) for f in folders}


def _sets() -> dict[str, Path]:
    return {**{name: SHARED / "oracle" / name for name in LICENSED}, **_extra()}


@functools.cache
def _scored(name: str, root: Path) -> list[PairScore]:
    """Every pair of one set scored once per session (the tests share it)."""
    pairs = find_pairs(root, all_dev=name == "edgetpu")
    assert pairs, f"no pairs under {root}"
    return [score_pair(p) for p in pairs]


def _score(name: str, root: Path) -> list[PairScore]:
    if not root.is_dir():
        pytest.skip(f"{root} is absent")
    return _scored(name, root)


def _line(label: str, group: list[PairScore]) -> str:
    k, b = sum(s.exact for s in group), sum(s.baseline_exact for s in group)
    return f"{label}: exact {k}/{len(group)}, documented rule {b}/{len(group)}"


def _check_goal(label: str, group: list[PairScore]) -> None:
    k, b, n = sum(s.exact for s in group), sum(s.baseline_exact for s in group), len(group)
    assert k >= GOAL * n, f"{label}: exact {k}/{n} is below {GOAL:.0%}"
    assert k >= b, f"{label}: exact {k}/{n} is below the documented rule {b}"


@pytest.mark.parametrize("name", LICENSED)
def test_predictor_is_exact_on_the_licensed_pair_sets(name: str) -> None:
    scores = _score(name, _sets()[name])
    _report_and_check(name, scores)


def test_predictor_is_exact_on_the_local_pair_sets() -> None:
    extra = _extra()
    if not extra:
        pytest.skip("set TFLFUSE_EXTRA_ORACLE to local folders of pairs to score them")
    for name, root in extra.items():
        _report_and_check(name, _score(name, root))


def _report_and_check(name: str, scores: list[PairScore]) -> None:
    """Print `exact K/N` beside the documented rule for the set, each half and each mode, and
    hold the set and each half to the goal."""
    lines = [_line(f"{name}", scores)]
    for half in ("dev", "holdout"):
        in_half = [s for s in scores if s.pair.half == half]
        if not in_half:
            continue
        lines.append("  " + _line(half, in_half))
        for mode in ("single", "multi"):
            group = [s for s in in_half if s.mode == mode]
            if group:
                lines.append("    " + _line(mode, group))
    print("", *lines, sep="\n")
    _check_goal(name, scores)
    for half in ("dev", "holdout"):
        in_half = [s for s in scores if s.pair.half == half]
        if len(in_half) >= 20:  # a handful of pairs cannot hold a percentage
            _check_goal(f"{name} {half}", in_half)


def test_predicted_status_strings_agree_with_the_compilers_logs() -> None:
    """Where a pair has the compiler's `-s` log, the predicted status of (nearly) every op is the
    log's: counted per (op type, status) over all logged pairs."""
    scores = [s for name, root in _sets().items() if root.is_dir() for s in _score(name, root)]
    logged = [s for s in scores if s.status]
    if not logged:
        pytest.skip("no pair with a compiler log")
    agree = sum(s.status[0] for s in logged)
    listed = sum(s.status[1] for s in logged)
    print(f"\nstatus strings: {agree}/{listed} ops of {len(logged)} logs")
    assert agree >= GOAL * listed


def test_no_pair_holds_a_refusal_near_the_input() -> None:
    """What the compiler does with an op it refuses near the input (ahead of every op it maps,
    or right after the input's requantization) is undecided: no pair we hold has one, so the
    predictor gives its reading and the other one (`Prediction.other_readings`). A pair that
    ever has one decides the question: this test then fails and names it, so that the table's
    header and the prediction are revised from it."""
    scores = [s for name, root in _sets().items() if root.is_dir() for s in _score(name, root)]
    if not scores:
        pytest.skip("no pair set present")
    near_input = [  # (a form no compiled model shows mapped is the other undecided reading)
        s
        for s in scores
        if s.prediction
        and any("edgetpu_forms.toml" not in r.reading for r in s.prediction.other_readings)
    ]
    deciding = [s.pair.key for s in near_input]
    assert deciding == [], f"these pairs decide the reading of a refusal near the input: {deciding}"


def test_status_agreement_counts_per_op_type_and_status() -> None:
    """The agreement measure itself, on a hand-written log: a wrong status is not counted."""
    from tflfuse.targets import OpPrediction, Prediction

    log = parse_log(
        "Edge TPU Compiler version 16.0.384591198\n\nOperator  Count  Status\n\n"
        "CONV_2D  2  Mapped to Edge TPU\nSOFTMAX  1  Operation not supported\n"
    )
    ops = [
        OpPrediction(0, "CONV_2D", "edgetpu", "Mapped to Edge TPU", ""),
        OpPrediction(1, "CONV_2D", "edgetpu", "Mapped to Edge TPU", ""),
        OpPrediction(2, "SOFTMAX", "cpu", "Operation version not supported", ""),
    ]
    assert status_agreement(Prediction("edgetpu", ops), log) == (2, 3)


def test_status_agreement_names_a_custom_op_as_the_log_does() -> None:
    """The log lists a custom op as CUSTOM whatever its code (an SSD's postprocess op, compiler
    2.1's log); the prediction labels it by its code: given the model, the two meet."""
    from tflfuse.ir import Graph, Model
    from tflfuse.targets import OpPrediction, Prediction

    g = Graph("main")
    x = g.add_tensor("x", (1, 4), "UINT8")
    y = g.add_tensor("y", (1, 4), "FLOAT32")
    g.add_op("CUSTOM", [x], [y], custom_code="TFLite_Detection_PostProcess")
    status = "Operation is working on an unsupported data type"
    log = parse_log(
        "Edge TPU Compiler version 2.1.302470888\n\nOperator  Count  Status\n\n"
        f"CUSTOM  1  {status}\n"
    )
    ops = [OpPrediction(0, "TFLite_Detection_PostProcess", "cpu", status, "")]
    assert status_agreement(Prediction("edgetpu", ops), log) == (0, 1)
    assert status_agreement(Prediction("edgetpu", ops), log, Model([g])) == (1, 1)


# -- the truth reader and the exact measure, on tiny inline graphs ---------------------------------
def _chain() -> tuple:
    """x -> CONV -> CONV -> DEQUANTIZE, and a twin where the first conv went into the custom op."""
    import numpy as np

    from tflfuse.ir import Graph, Model, Quantization

    q = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))

    def graph(compiled: bool) -> tuple:
        g = Graph("main")
        x = g.add_tensor("x", (1, 4, 4, 2), "INT8", quantization=q)
        a = g.add_tensor("a", (1, 4, 4, 2), "INT8", quantization=q)
        b = g.add_tensor("b", (1, 4, 4, 2), "INT8", quantization=q)
        f = g.add_tensor("f", (1, 4, 4, 2), "FLOAT32")
        w = g.add_constant("w", np.ones((2, 1, 1, 2), np.int8), quantization=q)
        opts = {"padding": "SAME", "stride_w": 1, "stride_h": 1}
        if compiled:
            g.add_op("CUSTOM", [x], [a], custom_code="edgetpu-custom-op")
        else:
            g.add_op("CONV_2D", [x, w, None], [a], opts)
        g.add_op("CONV_2D", [a, w, None], [b], opts)
        g.add_op("DEQUANTIZE", [b], [f])
        g.inputs, g.outputs = [x], [f]
        return Model([g])

    return graph(False), graph(True)


def test_truth_is_the_ops_left_outside_the_custom_op() -> None:
    from tflfuse.targets.edgetpu.truth import truth_of

    model, compiled = _chain()
    truth = truth_of(model, compiled)
    assert truth.cpu_ops == [1, 2] and truth.segments == 1 and truth.unmatched == 0
    assert dict(truth.cpu_types) == {"CONV_2D": 1, "DEQUANTIZE": 1}
    assert truth.mapped == 1


def test_exact_needs_the_same_cpu_ops_and_in_multi_mode_the_same_segments() -> None:
    from tflfuse.targets import predict
    from tflfuse.targets.edgetpu.truth import documented_rule, is_exact, truth_of

    model, compiled = _chain()
    truth = truth_of(model, compiled)
    prediction = predict(
        model, target_named("edgetpu")
    )  # both convs map, only the DEQUANTIZE is left
    assert prediction.cpu_ops() == [2]
    assert not is_exact(prediction, truth)
    assert not is_exact(documented_rule(model), truth)  # documented: the same two convs map
    prediction.ops[1].runs_on = "cpu"
    assert is_exact(prediction, truth)
    truth.segments = 2
    assert is_exact(prediction, truth) and not is_exact(prediction, truth, count_segments=True)


# -- what a twin says about its compile ------------------------------------------------------------
def _package(runtime: int) -> bytes:
    """Custom options as the compiler writes them: a few leading bytes, then a DarwiNN `Package`
    flatbuffer (identifier DWN1) whose field 0 is min_runtime_version."""
    import flatbuffers

    b = flatbuffers.Builder(64)
    b.StartObject(2)
    b.PrependInt32Slot(0, runtime, 0)
    b.PrependInt32Slot(1, 7, 0)  # another field, to be skipped
    b.Finish(b.EndObject(), file_identifier=b"DWN1")
    return b"\x31\x00\x34\x00\x00\x00\x00\x00" + bytes(b.Output())


def test_the_runtime_version_is_read_from_the_package_in_the_custom_op() -> None:
    from tflfuse.targets.edgetpu.truth import package_runtime_version

    assert package_runtime_version(_package(14)) == 14
    assert package_runtime_version(_package(12)) == 12
    assert package_runtime_version(b"beagle and no package") is None


def test_a_compiled_model_reports_its_mode_runtime_and_cpu_ops() -> None:
    from tflfuse.targets.edgetpu.truth import compiled_summary, is_compiled, truth_of

    model, compiled = _chain()
    compiled.main.ops[0].custom_options = _package(14)
    assert is_compiled(compiled) and not is_compiled(model)
    summary = compiled_summary(compiled)
    assert summary["segments"] == 1 and not summary["multiple_subgraphs"]
    assert summary["runtime_version"] == 14 and "16 or later" in summary["compiler"]
    assert [o["op"] for o in summary["cpu_ops"]] == ["CONV_2D", "DEQUANTIZE"]
    truth = truth_of(model, compiled)
    assert truth.runtime_version == 14 and truth.mode.startswith("one Edge TPU subgraph")
    compiled.main.ops[0].custom_options = _package(12)
    assert "15.0 or older" in compiled_summary(compiled)["compiler"]


def _oracle_twin(name: str) -> tuple[Path, Path]:
    root = SHARED / "oracle" / "edgetpu"
    if not root.is_dir():
        pytest.skip(f"{root} is absent")
    return root / f"{name}.tflite", root / f"{name}_edgetpu.tflite"


def test_check_describes_a_compiled_model_and_compares_with_a_twin(capsys) -> None:
    import json

    from tflfuse.cli import main

    cpu, twin = _oracle_twin("deeplabv3_mnv2_dm05_pascal_quant")
    assert main(["check", str(twin), "--target", "edgetpu", "--json"]) == 0
    compiled = json.loads(capsys.readouterr().out)["compiled"]
    assert compiled["segments"] == 1 and compiled["runtime_version"] == 12
    assert compiled["cpu_ops"][0]["op"] == "RESIZE_BILINEAR"
    assert main(["check", str(cpu), "--target", "edgetpu", "--twin", str(twin)]) == 0
    text = capsys.readouterr().out
    assert "(edgetpu_compiler 16.0" in text.splitlines()[0]
    assert "The prediction for that mode is exact" in text
    # a compile that mapped nothing holds no custom op: the model itself, op for op
    assert main(["check", str(cpu), "--target", "edgetpu", "--twin", str(cpu), "--json"]) == 0
    twin_record = json.loads(capsys.readouterr().out)["twin"]
    assert twin_record["segments"] == 0 and twin_record["mode"].startswith("nothing mapped")
    assert twin_record["compiler_only_cpu"] == list(range(64))  # the 64 ops predicted mapped
    assert not twin_record["exact"]


def test_check_twin_refuses_a_compile_of_another_network(capsys) -> None:
    """`check mobilenet_v1_0.25_128_quant.tflite --twin split_concat_edgetpu.tflite` said
    "exact"."""
    from tflfuse.cli import main

    cpu, _ = _oracle_twin("mobilenet_v1_0.25_128_quant")
    _, other = _oracle_twin("split_concat")
    assert main(["check", str(cpu), "--target", "edgetpu", "--twin", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{other}: not a compile of {cpu}: its inputs and outputs are ['input1'," in err


def test_every_real_pair_is_a_compile_of_its_model() -> None:
    """twin_match accepts each pair of the oracle (the compiler keeps the names, shapes and
    quantization of every tensor it leaves) and refuses every twin of another pair."""
    from tflfuse.targets.edgetpu import twin_match

    pairs = [
        (flatbuffer.load(cpu), flatbuffer.load(cpu.with_name(cpu.stem + "_edgetpu.tflite")))
        for cpu in oracle_models(compiled=False)
        if cpu.with_name(cpu.stem + "_edgetpu.tflite").is_file()
    ]
    if not pairs:
        pytest.skip("../shared/oracle is absent")
    for i, (model, _) in enumerate(pairs):
        for j, (_, twin) in enumerate(pairs):
            assert (twin_match.mismatch(model, twin) is None) == (i == j), (i, j)
