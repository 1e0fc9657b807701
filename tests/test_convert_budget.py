"""benchmarks/convert_budget.py's table: the budget verdict, the mapped count and error kept
beside the time and memory, and this tree's ratios against the tree it is compared with."""

from __future__ import annotations

from conftest import benchmark_module

budget = benchmark_module("convert_budget")


def _row(wall: float, cpu: float, rss: float) -> dict:
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mib": rss, "mapped": 2423,
            "max_abs": 0.987, "fused_mib": 2.9, "stages": {"report": wall / 2}}  # fmt: skip


def test_the_table_says_the_verdict_and_the_ratios() -> None:
    runs = {
        ("m", "tflfuse"): [_row(80, 100, 1600), _row(100, 110, 1700)],
        ("m", "before"): [_row(100, 120, 3700), _row(120, 140, 3800)],
    }
    text = budget.markdown(runs, repeats=2, load=1.0)
    assert "| m | tflfuse | 90.0 | 105.0 | 1650 | no | 2423 | 0.987 | 2.9 |" in text
    assert "| m | before | 110.0 | 130.0 | 3750 | no | 2423 | 0.987 | 2.9 |" in text
    # 90 / 110, 105 / 130, 1650 / 3750
    assert "| m | 0.82 | 0.81 | 0.44 |" in text
    assert "| report | 45.00 | 55.00 |" in text


def test_a_cut_short_run_is_read_back_from_its_lines() -> None:
    log = (
        "yolo26n-640.litert tflfuse #0: 264.0 s wall, 125.7 s CPU, 1495 MiB, mapped 2423,"
        " max error 0.987\n"
        "yolo26n-640.litert --channels-last before #1: 416.5 s wall, 150.5 s CPU, 4005 MiB,"
        " mapped 2297, max error None\n"
        "noise\n"
    )
    runs, repeats = budget.from_log(log + log)  # (two logs)
    assert repeats == 2 and len(runs[("yolo26n-640.litert", "tflfuse")]) == 2
    assert runs[("yolo26n-640.litert", "tflfuse")][0]["peak_rss_mib"] == 1495
    row = runs[("yolo26n-640.litert --channels-last", "before")][0]
    assert (row["wall_s"], row["mapped"], row["max_abs"]) == (416.5, "2297", None)
