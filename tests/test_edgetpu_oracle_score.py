"""benchmarks/edgetpu_oracle_score.py: a holdout pair that copies a dev pair byte for byte is
scored as dev (rules were derived from it), on files made here (no oracle needed)."""

from __future__ import annotations

from pathlib import Path

from conftest import benchmark_module

from tflfuse.targets.edgetpu.truth import Pair, find_pairs


def _pair(root: Path, stem: str, model: bytes, twin: bytes) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{stem}.tflite").write_bytes(model)
    (root / f"{stem}_edgetpu.tflite").write_bytes(twin)


def _stem(root: Path, half: str) -> str:
    """A file stem whose pair under `root` falls into `half` by the score's fixed hash."""
    for k in range(100):
        if Pair(root, root / f"m{k}.tflite", root / f"m{k}_edgetpu.tflite", None).half == half:
            return f"m{k}"
    raise AssertionError("no stem of that half")


def test_a_holdout_copy_of_a_dev_pair_is_scored_as_dev(tmp_path: Path) -> None:
    score = benchmark_module("edgetpu_oracle_score")
    original, copies = tmp_path / "original", tmp_path / "copies"
    _pair(original, "net", b"model", b"twin")
    held, other = _stem(copies, "holdout"), _stem(copies, "dev")
    _pair(copies, held, b"model", b"twin")  # the same model and twin under another name
    _pair(copies, f"{held}_other", b"model", b"another twin")  # another compile
    _pair(copies, other, b"model2", b"twin2")
    pairs = find_pairs(original, all_dev=True) + find_pairs(copies)
    halves_before = {p.key: p.half for p in pairs}
    assert halves_before[f"{held}.tflite"] == "holdout"
    assert score.fold_dev_copies(pairs) == 1
    after = {p.key: p.half for p in pairs}
    assert after[f"{held}.tflite"] == "dev"
    moved = [k for k in after if after[k] != halves_before[k]]
    assert moved == [f"{held}.tflite"]


def test_a_set_with_a_dev_list_is_holdout_but_the_pairs_listed(tmp_path: Path) -> None:
    """A set found after the split was fixed holds a `dev.txt`: its pairs are holdout, whatever
    the hash says, except those listed there (the ones a rule was derived from); a folder
    without it keeps the hash."""
    score = benchmark_module("edgetpu_oracle_score")
    new = tmp_path / "new"
    dev, held = _stem(new, "dev"), _stem(new, "holdout")
    for stem in (dev, held, "derived"):
        _pair(new, stem, stem.encode(), b"twin " + stem.encode())
    (new / score.DEV_LIST).write_text("derived.tflite\n")
    halves = {p.key: p.half for p in score.set_pairs("new", new)}
    assert halves == {f"{dev}.tflite": "holdout", f"{held}.tflite": "holdout",
                      "derived.tflite": "dev"}  # fmt: skip
    (new / score.DEV_LIST).unlink()
    assert {p.key: p.half for p in score.set_pairs("new", new)}[f"{dev}.tflite"] == "dev"


def test_a_pair_a_rule_was_drawn_from_is_dev_for_that_measure_only(tmp_path: Path) -> None:
    """A held-out pair whose log a status rule came from is dev for status strings, one a memory
    rule came from dev for memory; each keeps its own half for the rest (by its CPU model's
    sha256: unlicensed paths are not written down)."""
    import hashlib

    score = benchmark_module("edgetpu_oracle_score")
    root = tmp_path / "set"
    held = _stem(root, "holdout")
    _pair(root, held, b"a held-out model", b"twin")
    pair = find_pairs(root)[0]
    assert (score.status_half(pair), score.memory_half(pair)) == ("holdout", "holdout")
    digest = hashlib.sha256(b"a held-out model").hexdigest()
    score.STATUS_DEV[digest] = "a test"
    try:
        assert (score.status_half(pair), score.memory_half(pair)) == ("dev", "holdout")
        assert pair.half == "holdout"
    finally:
        del score.STATUS_DEV[digest]
    score.MEMORY_DEV[digest] = "a test"
    try:
        assert (score.status_half(pair), score.memory_half(pair)) == ("holdout", "dev")
    finally:
        del score.MEMORY_DEV[digest]


def test_the_memory_misses_table_says_how_each_miss_is_flagged(tmp_path: Path) -> None:
    """Each inexact pair is a row with its bytes off and its flags; one without any is counted
    as not flagged; an exact pair is no row."""
    from types import SimpleNamespace

    score = benchmark_module("edgetpu_oracle_score")
    root = tmp_path / "set"
    _pair(root, "m", b"model", b"twin")
    pair = find_pairs(root)[0]

    def scored(on: int, off: int, predicted: tuple[int, int], reasons: list[str]) -> object:
        memory = {
            "on_chip_bytes": on,
            "off_chip_bytes": off,
            "predicted_on_chip_bytes": predicted[0],
            "predicted_off_chip_bytes": predicted[1],
            "layout_bytes": sum(predicted),
            "exact": (on, off) == predicted,
            "undecided_reasons": reasons,
            "compiler_major": 15,
        }
        truth = SimpleNamespace(compiler_version="15.0.340273435")
        return SimpleNamespace(pair=pair, memory=memory, truth=truth)

    assert score.memory_miss_row("set", scored(10, 0, (10, 0), []), True) is None
    flagged = score.memory_miss_row("set", scored(64, 128, (192, 0), ["undecided_split"]), True)
    bare = score.memory_miss_row("set", scored(64, 0, (128, 0), []), False)
    assert flagged is not None and bare is not None
    assert flagged["off"] == (128, -128) and flagged["layout"] == 0
    assert flagged["flags"] == ["check: undecided (undecided_split)"]
    assert bare["pair"].startswith("pair ") and bare["flags"] == []
    out = tmp_path / "misses.md"
    score.write_memory_md([flagged, bare], {"dev": [1, 0, 0, 3], "holdout": [0, 0, 0, 0]}, out)
    text = out.read_text()
    assert "of the 2 others, flagged 1, not flagged 1" in text
    assert "| +128 / -128 | +0 | check: undecided (undecided_split) |" in text
    assert "Not flagged: 1." in text
