"""The compile modes' parameter memory (`targets.edgetpu.modes`, `mode_memory`): bytes cached and
streamed per mode and per `-n` segment, the choice that breaks ties by streamed bytes and says
why, the bounded text of many segments, the JSON fields, the report's streamed bytes of fused
beside stock, and `compile --mode auto` taking the same choice.

Synthetic chains of int8 1x1 convolutions of C channels and zero bias, one per-tensor scale:
each holds C x C bytes in the compiler's layout (`memory.layer_bytes`: no header word, the
inputs in chunks of 4 for every output of whole groups of 64)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import ORACLE, needs_oracle
from test_edgetpu_compiler import _chain_with_a_custom_op, stand_in  # noqa: F401

from tflfuse.cli import main
from tflfuse.convert import report
from tflfuse.ir import Graph, Model, Quantization, flatbuffer
from tflfuse.targets import capability
from tflfuse.targets.edgetpu.compiler import choose_mode
from tflfuse.targets.edgetpu.mode_memory import ParameterMemory, segment_lines
from tflfuse.targets.edgetpu.modes import (
    ModeChoice,
    compare_modes,
    format_modes,
    rank_key,
    why_line,
)
from tflfuse.targets.edgetpu.package import package_memory

CACHE = int(capability("edgetpu")["meta"]["parameter_cache_bytes"])


def _chain(kinds: list[str], channels: int = 64, side: int = 1) -> Model:
    """int8 1x1 convolutions of `channels` channels on a `side` x `side` map (or a custom op
    where `kinds` says "CUSTOM")."""
    qp = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))
    g = Graph("main")
    x = g.add_tensor("x", (1, side, side, channels), "INT8", quantization=qp)
    g.inputs = [x]
    for i, kind in enumerate(kinds):
        y = g.add_tensor(f"t{i}", (1, side, side, channels), "INT8", quantization=qp)
        if kind == "CUSTOM":
            g.add_op("CUSTOM", [x], [y], custom_code="MyOp")
        else:
            w = np.full((channels, 1, 1, channels), i % 7 + 1, np.int8)
            b = np.zeros(channels, np.int32)
            g.add_op(
                "CONV_2D",
                [
                    x,
                    g.add_constant(f"w{i}", w, "INT8", qp),
                    g.add_constant(f"b{i}", b, "INT32", qp),
                ],
                [y],
                {"stride_h": 1, "stride_w": 1, "padding": "SAME"},
            )
        x = y
    g.outputs = [x]
    return Model([g])


# 40 layers of 512 x 512 bytes: 10,485,760 bytes, more than one Edge TPU's 8 MiB cache
BIG = 40 * 512 * 512


def _big(side: int = 1) -> Model:
    return _chain(["CONV_2D"] * 40, channels=512, side=side)


def test_each_mode_carries_the_bytes_of_the_ops_it_maps() -> None:
    """conv, custom, conv, conv (4,096 bytes each): one segment maps the first (4,096 bytes
    cached), -a all three (12,288), -n 2 cuts after the custom op: 4,096 and 8,192 bytes, each
    on its own Edge TPU, all cached."""
    choice = compare_modes(_chain(["CONV_2D", "CUSTOM", "CONV_2D", "CONV_2D"]), None, 2)
    single, multi, piped = (choice.of(m) for m in ("single", "multi", "pipelined"))
    assert single is not None and multi is not None and piped is not None
    assert (single.memory.parameter_bytes, single.memory.cached_bytes) == (4096, 4096)
    assert (multi.memory.parameter_bytes, multi.memory.streamed_bytes) == (12288, 0)
    assert [m.parameter_bytes for m in piped.segment_memory] == [4096, 8192]
    assert [m.cached_bytes for m in piped.segment_memory] == [4096, 8192]
    assert (piped.memory.cached_bytes, piped.memory.streamed_bytes) == (12288, 0)
    assert piped.edgetpus == 2 and multi.edgetpus == 1
    pieces = piped.to_dict()["pieces"]
    assert [p["predicted_parameter_bytes"] for p in pieces] == [4096, 8192]
    assert [p["streamed_bytes"] for p in pieces] == [0, 0]
    # the second segment reads the custom op's [1, 1, 1, 64] output: one tensor through the host
    assert piped.handoffs == (1, 64) and piped.to_dict()["segment_handoff_bytes"] == 64


def test_streamed_bytes_break_the_tie_and_change_the_choice() -> None:
    """40 layers of 262,144 bytes: every mode maps all 40 with no crossing; one segment and -a
    cache 8 MiB and stream the rest on every inference, -n 2 caches each half on its own Edge
    TPU. A user with one Edge TPU gets one segment (the pipeline is offered, with why it was
    not chosen); one who says they have two (`--num-segments 2`) gets -n 2, by streamed bytes,
    which the old order (mapped ops, crossings, then segments) never chose."""
    one_tpu = compare_modes(_big())
    assert [o.mode for o in one_tpu.ranked()] == ["single", "multi", "pipelined"]
    piped_one = one_tpu.of("pipelined")
    assert piped_one is not None and rank_key(piped_one)[3] == 1  # needs 2 of the user's 1
    assert one_tpu.to_dict()["best_flags"] == []
    assert "needs 2 Edge TPUs: chosen only where it maps more or crosses less, or when" in (
        "\n".join(format_modes(one_tpu))
    )
    choice = compare_modes(_big(), num_segments=2)
    single, piped = choice.of("single"), choice.of("pipelined")
    assert single is not None and piped is not None and piped.flags == ["-n", "2"]
    assert single.memory.parameter_bytes == BIG == piped.memory.parameter_bytes
    assert (single.memory.cached_bytes, single.memory.streamed_bytes) == (CACHE, BIG - CACHE)
    assert [m.parameter_bytes for m in piped.segment_memory] == [20 * 512 * 512] * 2
    assert piped.memory.streamed_bytes == 0
    assert rank_key(single, 2)[:4] == rank_key(piped, 2)[:4]  # ops, crossings, bytes, devices
    old = min(choice.outcomes, key=lambda o: (-o.mapped, o.crossings.count, o.segments))
    assert old.mode == "single" and choice.chosen.mode == "pipelined"
    why = why_line(choice)
    assert why.startswith("-n 2: maps as many as one segment with as few crossings")
    assert "moves fewer bytes through the host per inference" in why
    assert "(512 B; one segment: 2.0 MiB)" in why
    assert "every segment's parameters fit its cache; no segment streams" in why
    text = "\n".join(format_modes(choice, "big.tflite"))
    assert "Best mode: edgetpu_compiler -n 2 big.tflite" in text
    assert "Best mode on one Edge TPU: edgetpu_compiler big.tflite (streams 2.0 MiB" in text
    assert "Parameters stream on every inference" not in text  # the best mode streams none


def test_n_does_not_win_by_passing_more_between_segments_than_one_streams() -> None:
    """The same 40 layers on an 80 x 80 map: -n 2 still streams nothing, but its second segment
    reads a 3,276,800-byte tensor from the first through the host, more than the 2 MiB one
    segment streams: one segment is chosen."""
    choice = compare_modes(_big(side=80))
    single, piped = choice.of("single"), choice.of("pipelined")
    assert single is not None and piped is not None
    assert piped.memory.streamed_bytes == 0 and piped.handoffs == (1, 80 * 80 * 512)
    assert single.host_bytes == single.memory.streamed_bytes == BIG - CACHE
    assert choice.chosen.mode == "single"
    assert piped.to_dict()["host_bytes"] == 80 * 80 * 512


def test_the_undecided_layout_travels_with_the_bytes() -> None:
    """Above `memory.SPLIT_SURE_BYTES` the predictor cannot say which layers stream although
    the model fits: each mode carries that count, its JSON says so, its line too."""
    choice = compare_modes(_big())
    single = choice.of("single")
    assert single is not None and single.memory.undecided.get("undecided_split") == 1
    assert single.to_dict()["parameter_memory"]["undecided"] == {"undecided_split": 1}
    line = single.memory.undecided_line()
    assert line is not None and "streams although it fits" in line
    assert "(layout undecided in part)" in single.memory_lines()[0]


def test_when_the_best_mode_streams_it_is_said_plainly() -> None:
    """One segment of 40 layers, -a refused by nothing and -n not asked: a model whose every
    mode streams is told so, with the bytes."""
    choice = compare_modes(_big())
    choice = ModeChoice([o for o in choice.outcomes if o.mode != "pipelined"], 0, [])
    text = "\n".join(format_modes(choice))
    streamed = BIG - CACHE
    assert (
        f"Parameters stream on every inference, even in the best mode: 2.0 MiB ({streamed:,}"
        " bytes) per inference; the model's 10.0 MiB of parameters exceed one Edge TPU's"
        " 8.0 MiB cache"
    ) in text
    assert "it streams 2.0 MiB of its 10.0 MiB of parameters per inference" in text


def test_many_segments_are_summarised_in_lines_of_bounded_length() -> None:
    """200 layers cut 10 and 100 ways: the mode's text is the same few lines whatever N, each
    under 200 characters; the JSON lists every segment."""
    model = _chain(["CONV_2D"] * 200)
    lines = {}
    for n in (10, 100):
        piped = compare_modes(model, None, n).of("pipelined")
        assert piped is not None and len(piped.segment_memory) == n
        assert len(piped.to_dict()["pieces"]) == n
        lines[n] = [ln for ln in format_modes(compare_modes(model, None, n)) if "-n" in ln]
        assert all(len(ln) < 200 for ln in format_modes(compare_modes(model, None, n)))
    assert len(lines[10]) == len(lines[100])
    sizes = [4096] * 3 + [8192] * 2  # min / median / max of segments holding 1 or 2 layers
    head, text = segment_lines([ParameterMemory(s, s, 0, CACHE) for s in sizes])
    assert (
        head == "parameters 28.0 KiB over 5 Edge TPUs: 28.0 KiB cached, 0 B streamed per inference"
    )
    assert text == (
        "per segment min 4.0 KiB, median 4.0 KiB, max 8.0 KiB; every segment's parameters fit"
        " its cache"
    )
    over = [ParameterMemory(CACHE + 1, CACHE, 1, CACHE) for _ in range(9)]
    _, text = segment_lines(over)
    assert "9 exceed the 8.0 MiB cache (0, 1, 2, 3, ...); 9 stream (0, 1, 2, 3, ...)" in text


def test_check_json_adds_the_bytes_and_keeps_the_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "chain.tflite"
    flatbuffer.save(_chain(["CONV_2D", "CUSTOM", "CONV_2D"]), path)
    assert main(["check", str(path), "--target", "edgetpu", "--json", "--num-segments", "2"]) == 0
    modes = json.loads(capsys.readouterr().out)["compile_modes"]
    old = {"mode", "flags", "mapped", "ops", "segments", "crossings", "crossing_bytes"}
    new = {"edgetpus", "cached_bytes", "streamed_bytes", "parameter_memory"}
    for m in modes["modes"]:
        assert old | new <= set(m)
        assert {"parameter_bytes", "cached_bytes", "streamed_bytes"} <= set(m["parameter_memory"])
    assert {"modes", "best", "best_flags", "notes", "why", "best_streamed_bytes"} <= set(modes)
    piped = next(m for m in modes["modes"] if m["mode"] == "pipelined")
    assert [p["cached_bytes"] for p in piped["pieces"]] == [4096, 4096]


def test_the_report_puts_fused_streamed_bytes_beside_stock_and_warns() -> None:
    big = compare_modes(_big(), None, 2).to_dict()  # a user with two Edge TPUs: -n 2
    small = compare_modes(_chain(["CONV_2D"] * 3)).to_dict()
    big_one = compare_modes(_big())
    big_one = ModeChoice([o for o in big_one.outcomes if o.mode != "pipelined"], 0, [])
    streams = big_one.to_dict()
    section = {"fused": {"compile_modes": streams}, "stock": {"compile_modes": small}}
    text = "\n".join(report._mode_lines(section))
    assert (
        f"fused {BIG - CACHE:,} bytes (2.0 MiB, one segment; layout undecided in part), stock 0"
        " bytes (0 B, one segment)."
    ) in text
    assert f"Warning: the fused model streams {BIG - CACHE:,} bytes more parameters" in text
    assert "Why: one segment: " in text
    section = {"fused": {"compile_modes": big}, "stock": {"compile_modes": streams}}
    text = "\n".join(report._mode_lines(section))
    assert "fused 0 bytes (0 B, -n 2; layout undecided in part)" in text
    assert "Warning" not in text
    assert f"| 8,388,608 | {BIG - CACHE:,} |" in text  # stock's one segment: cached, streamed


def test_compile_mode_auto_takes_the_choice_check_names() -> None:
    assert choose_mode(_big(), "auto")[:2] == (False, None)  # one Edge TPU: one segment
    multiple, pieces, choice = choose_mode(_big(), "auto", num_segments=2)
    assert (multiple, pieces) == (False, 2)
    assert choice is not None and choice.chosen.flags == ["-n", "2"]
    multiple, pieces, _ = choose_mode(_chain(["CONV_2D", "CUSTOM", "CONV_2D"]), "auto")
    assert (multiple, pieces) == (True, None)


@needs_oracle()
def test_oracle_modes_carry_the_package_bytes() -> None:
    """Coral's DeepLab (shared oracle): one segment's predicted cached bytes are its compiled
    package's, nothing streamed; cut in two, each segment holds its own layers' bytes and the
    two add up to the whole."""
    cpu = flatbuffer.load(ORACLE / "deeplabv3_mnv2_dm05_pascal_quant.tflite")
    compiled = flatbuffer.load(ORACLE / "deeplabv3_mnv2_dm05_pascal_quant_edgetpu.tflite")
    package = package_memory(compiled)
    assert package is not None
    choice = compare_modes(cpu, None, 2)
    single, piped = choice.of("single"), choice.of("pipelined")
    assert single is not None and piped is not None
    assert single.memory.cached_bytes == package["on_chip_bytes"]
    assert single.memory.streamed_bytes == package["off_chip_bytes"] == 0
    assert sum(m.parameter_bytes for m in piped.segment_memory) == single.memory.parameter_bytes
    assert all(0 < m.parameter_bytes < CACHE for m in piped.segment_memory)
    # -a maps 5 ops more; -n 2 ties one segment on every count but the Edge TPUs it needs
    assert [o.mode for o in choice.ranked()] == ["multi", "single", "pipelined"]


def test_n_is_offered_when_what_a_maps_exceeds_the_cache() -> None:
    """Two layers, a custom op, 38 layers of 262,144 bytes: one segment stops at the custom op
    (2 layers, 512 KiB: fits), -a maps all 40 (10 MiB: exceeds), so -n 2 is offered from what
    -a maps. Its first piece (2 layers, the custom op, 18 layers) stops at the custom op too:
    22 mapped. -a maps the most and is chosen, and it streams: said plainly."""
    choice = compare_modes(_chain(["CONV_2D"] * 2 + ["CUSTOM"] + ["CONV_2D"] * 38, channels=512))
    single, multi, piped = (choice.of(m) for m in ("single", "multi", "pipelined"))
    assert single is not None and multi is not None and piped is not None
    assert (single.mapped, single.memory.streamed_bytes) == (2, 0)
    assert (multi.mapped, multi.memory.parameter_bytes) == (40, BIG)
    assert piped.flags == ["-n", "2"] and piped.mapped == 22
    assert [m.parameter_bytes for m in piped.segment_memory] == [2 * 512 * 512, 20 * 512 * 512]
    assert choice.chosen.mode == "multi"
    text = "\n".join(format_modes(choice))
    assert "why: -a: maps 40/41 ops, 18 more than -n 2; it streams 2.0 MiB of its 10.0 MiB" in text
    assert "Parameters stream on every inference, even in the best mode: 2.0 MiB" in text


def test_compile_mode_auto_prints_why(
    stand_in: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`compile --mode auto` (the compiler stood in for): the chosen flags, and the line `check`
    prints saying why."""
    model = _chain_with_a_custom_op(stand_in)
    assert main(["compile", str(model), "-o", str(stand_in / "auto"), "--mode", "auto"]) == 0
    text = capsys.readouterr().out
    assert "--mode auto chose multi" in text and "0 B of parameters streamed per inference" in text
    assert "  why: -a: maps 2/3 ops, 1 more than one segment; its parameters fit the cache" in text


def test_a_refused_model_names_no_mode_in_the_why_either() -> None:
    from test_edgetpu_failures import _relu

    choice = compare_modes(_relu("FLOAT32"))
    assert choice.refused and choice.to_dict()["why"].startswith("none, the compiler refuses")
    assert not compare_modes(_relu("INT8")).refused
