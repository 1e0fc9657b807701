"""benchmarks/corpus_bench.py: how a cell's process is run and judged (no models needed).

The corpus benchmark sorts every `tflfuse convert` run into converted / refused in one line /
failed (more lines) / crash / timeout, from the exit status and what a user would see on stderr.
These tests run real child processes that abort, refuse, print tracebacks and hang.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from conftest import benchmark_module

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cb():
    return benchmark_module("corpus_bench")


def _run(cb, tmp_path: Path, code: str, timeout: float = 30) -> dict:
    return cb.run_limited([sys.executable, "-c", code], tmp_path, timeout)


def test_a_native_abort_is_a_crash_with_no_message(cb, tmp_path):
    run = _run(
        cb, tmp_path, "import os, sys; print('tflfuse: a notice', file=sys.stderr); os.abort()"
    )
    assert run["exit"] == -6
    status, why = cb.classify(run)
    assert status == "crash"
    assert why.startswith("SIGABRT, no message")
    assert "tflfuse: a notice" in why
    assert run["peak_rss_mib"] > 1  # wait4's rusage of the child


def test_one_error_line_and_exit_2_is_a_refusal(cb, tmp_path):
    code = "import sys; print('tflfuse: error: m.tflite: no', file=sys.stderr); sys.exit(2)"
    assert cb.classify(_run(cb, tmp_path, code)) == ("refused", "tflfuse: error: m.tflite: no")


def test_a_notice_before_the_error_makes_it_a_failure_of_two_lines(cb, tmp_path):
    code = (
        "import sys; print('tflfuse: the model had no signature', file=sys.stderr);"
        " print('tflfuse: error: m.tflite: no', file=sys.stderr); sys.exit(2)"
    )
    status, why = cb.classify(_run(cb, tmp_path, code))
    assert status == "failed"
    assert why == "exit 2, 2 lines: tflfuse: error: m.tflite: no"


def test_progress_bars_are_not_lines_a_user_reads(cb):
    text = "calibrating fused:   0%|   | 0/32\rcalibrating fused: 100%|###| 32/32\r\n"
    text += "Running Calibration::  50%|#  | 1/2\r\ntflfuse: error: x: no\n"
    assert cb.printed_lines(text) == ["tflfuse: error: x: no"]


def test_a_traceback_is_a_crash_naming_its_last_line(cb, tmp_path):
    status, why = cb.classify(_run(cb, tmp_path, "raise ValueError('seed out of range')"))
    assert status == "crash"
    assert why.endswith("ValueError: seed out of range")


def test_a_hang_is_killed_with_its_children(cb, tmp_path):
    code = (
        "import subprocess, sys, time;"
        " p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        " open('child.pid', 'w').write(str(p.pid)); time.sleep(60)"
    )
    run = _run(cb, tmp_path, code, timeout=3)
    assert run["timed_out"]
    assert run["seconds"] < 30
    assert cb.classify(run)[0] == "timeout"
    grandchild = int((tmp_path / "child.pid").read_text())
    for _ in range(50):  # SIGKILL to the group; the orphan is reaped by init shortly after
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the hung conversion's child process survived the timeout")


def test_a_success_is_converted(cb, tmp_path):
    assert cb.classify(_run(cb, tmp_path, "print('{}')")) == ("converted", "")


def test_crashes_group_by_where_they_happened_and_refusals_by_their_words(cb):
    crash = {
        "status": "crash",
        "why": "SIGABRT, no message (nothing printed)",
        "crash_in_tflfuse": [
            "tflfuse/device/interpreter.py:166 make_interpreter",
            "tflfuse/convert/report.py:59 run_float",
        ],
    }
    assert cb._group(crash) == (
        "crash: SIGABRT, no message, in tflfuse/device/interpreter.py make_interpreter"
        " ← tflfuse/convert/report.py run_float"
    )
    one = {
        "status": "refused",
        "why": "tflfuse: error: /a/b.tflite: differs by 0.014; nothing written",
    }
    two = {
        "status": "failed",
        "why": "exit 2, 2 lines: tflfuse: error: /c/d.tflite: differs by 2e-05; nothing written",
    }
    assert cb._group(one) == cb._group(two)
    rule = {
        "status": "refused",
        "why": "tflfuse: error: /m.tflite: verification failed: output 'y' differs by 1.9e-05"
        " (allowed 1e-05) (rule LegalizeHardSwish at 'a/b;c/d', 'e/f",  # cut mid-name
    }
    assert cb._group(rule).endswith("(rule LegalizeHardSwish")


def test_summary_of_a_report_takes_error_relative_to_the_range(cb):
    report = {
        "models": {k: {"op_count": n} for k, n in (("unfused", 9), ("stock", 7), ("fused", 5))},
        "agreement": {
            "stock": {"max_abs": 2.0, "outputs": [{"max_abs": 2.0, "reference_range": 8.0}]},
            "fused": {"max_abs": 1.0, "outputs": [{"max_abs": 1.0, "reference_range": 8.0}]},
        },
        "edgetpu": {
            "stock": {"mapped": 3, "ops": 7, "cut": {"index": 3, "op": "HARD_SWISH"}},
            "fused": {"mapped": 5, "ops": 5},
            "channels_last": {"changed": True},
        },
        "quantization": {"float_ops_left": ["PRELU"]},
    }
    s = cb.summarize_report(report)
    assert s["ops"] == {"unfused": 9, "stock": 7, "fused": 5}
    assert s["error"]["stock"]["rel_range"] == 0.25
    assert s["error"]["fused"]["rel_range"] == 0.125
    assert set(s["edgetpu"]) == {"stock", "fused"}
    assert s["edgetpu"]["stock"]["cut"]["op"] == "HARD_SWISH"
    assert s["float_ops_left"] == ["PRELU"]


def test_the_corpus_plan_names_the_cells_the_tables_read(cb, tmp_path, monkeypatch):
    """The bench runs the corpus through `tflfuse sweep`: its plan must give one cell per model x
    recipe asked for, in the folder the tables then read (cell_dir), with its calibration."""
    import argparse

    from tflfuse.convert import sweep_plan

    monkeypatch.setattr(cb, "SWEEP", tmp_path / "sweep")
    for name in ("m1", "m2.v2"):  # a dot in a model's name stays in its cells' names
        (tmp_path / f"{name}.tflite").write_bytes(b"TFL3")
    (tmp_path / "m1.calib.npy").write_bytes(b"calib")
    models = sorted(tmp_path.glob("*.tflite"))
    recipes = ["edgetpu", "xnnpack-int8+cl"]
    args = argparse.Namespace(timeout=60.0, runs=5, no_latency=False)
    plan = sweep_plan.load(cb.write_plan(models, recipes, args), tmp_path / "sweep")
    wanted = {cb.cell_dir(m, r).name for m in models for r in recipes}
    assert (
        {c.name for c in plan.cells}
        == wanted
        == {
            "m1.edgetpu",
            "m1.xnnpack-int8.cl",
            "m2.v2.edgetpu",
            "m2.v2.xnnpack-int8.cl",
        }
    )
    assert {c.bench_runs for c in plan.cells} == {5}
    assert plan.models["m1"][1] is not None and plan.models["m2.v2"][1] is None
