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
