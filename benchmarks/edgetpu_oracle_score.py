"""Score the Edge TPU mapping predictor on real compiled pairs: `exact K/N` per set and half.

    PYTHONPATH=. python benchmarks/edgetpu_oracle_score.py [--extra DIR ...] [--misses] [--half dev]

Sets: `../shared/oracle/edgetpu`, `../shared/oracle/edgetpu-more`, and with `--extra DIR` (any
number of times, or the environment variable TFLFUSE_EXTRA_ORACLE holding folders separated by
`os.pathsep`) further folders of pairs measured locally only, each a set named by its folder
(their pairs come from repositories without a licence, so this script never prints their paths
unless asked with `--misses`, which is for the local console only).

For each set, split into the "dev" half (rules were built from these) and the "holdout" half (a
fixed hash of each pair's path; checked only at the end), and into the two compiler modes
(single Edge TPU subgraph, the default; several, `-a`), it prints tflfuse's exact count beside the
documented rule's (map in execution order until the first op outside Coral's op table or not
int8/uint8 or not static). "Exact" is defined in `tflfuse.targets.edgetpu.truth.is_exact`. Where a
pair has the compiler's `-s` log, the per-op status strings predicted are compared with the log's.

Parameter memory: each twin's Edge TPU package (`tflfuse.targets.edgetpu.package`) says how many
bytes the compiler caches on chip and streams; the prediction (`check --json`'s `on_chip_bytes`,
`off_chip_bytes`) is exact when both match, "streamed exact" when the bytes streamed on every
inference do (what decides the speed of a model that fits), and the layout alone
(`tflfuse.targets.edgetpu.memory`, applied to the ops the twin maps) when their sum does.
A holdout pair byte for byte a copy of a dev pair (the same model and twin in two sets: Coral's
test data holds 4 of the 5 original dev pairs) is scored as dev: rules were derived from it, so it
is not held out (`fold_dev_copies`; the score prints how many).
A folder holding a `dev.txt` is a set found after the hash split was fixed (issue 27's fourth
round): its pairs are all holdout but those whose key (the CPU model's path in the folder) the
file lists, one a line, the pairs a rule was derived from (`set_pairs`); a hash would put half
of them in dev without any rule drawn from them.
Twins compiled together with another compiled model of the set (a shared caching token,
`tflfuse.targets.edgetpu.package.cocompiled`) are counted apart: their split between the cache
and streaming depends on the models compiled with them, which one model cannot show.
Status strings and memory are split the same way, but a pair whose log a status rule was drawn
from (`STATUS_DEV`, by its CPU model's sha256) counts as dev for status strings (`status_half`),
and one a memory rule was drawn from after the split (`MEMORY_DEV`) as dev for memory
(`memory_half`). `--memory-md` writes each memory miss and how it is flagged.
A twin without a log whose package's form reads 15 may be 2.x's (the same form,
`package.compiler_generation`): where the two layouts differ `mark_compiler_undecided` says so.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from collections import Counter
from pathlib import Path

from tflfuse.ir import flatbuffer
from tflfuse.targets.capabilities import capability
from tflfuse.targets.edgetpu.memory import predicted_memory
from tflfuse.targets.edgetpu.package import cocompiled, package_memory
from tflfuse.targets.edgetpu.pipeline import pipeline_split
from tflfuse.targets.edgetpu.truth import (
    Pair,
    PairScore,
    find_pairs,
    logged_rows,
    logged_statuses,
    score_pair,
)

HERE = Path(__file__).resolve().parent
ORACLE = Path(os.environ.get("TFLFUSE_SHARED") or HERE.parent.parent / "shared") / "oracle"


LICENSED = ("edgetpu", "edgetpu-more")
OLDER_FORM_15 = 2  # the other compiler generation that writes the form read as 15 (2.x)


def extra_sets(extra: list[str] | None = None) -> dict[str, Path]:
    """The local pair folders: `extra`, else $TFLFUSE_EXTRA_ORACLE (os.pathsep-separated), each
    named by its folder's name."""
    listed = os.environ.get("TFLFUSE_EXTRA_ORACLE", "").split(os.pathsep)
    folders = extra or [f for f in listed if f]
    return {Path(f).name: Path(f) for f in folders}


def sets(extra: list[str] | None = None) -> dict[str, Path]:
    found = {name: ORACLE / name for name in LICENSED}
    found.update(extra_sets(extra))
    return {name: path for name, path in found.items() if path.is_dir()}


def _miss_line(s: PairScore, show_path: bool) -> str:
    where = (
        s.pair.key if show_path else f"pair {hashlib.sha256(s.pair.key.encode()).hexdigest()[:8]}"
    )
    if s.error:
        return f"    {where}: does not load ({s.error[:120]})"
    t, p = s.truth, s.prediction
    assert t is not None and p is not None
    predicted = Counter(o.op for o in p.ops if o.runs_on == "cpu")
    extra = predicted - t.cpu_types
    missing = t.cpu_types - predicted
    first = next((o for o in p.ops if o.runs_on == "cpu"), None)
    seg = f" segments {getattr(p, 'segments', None)} vs {t.segments}" if s.mode == "multi" else ""
    return (
        f"    {where}: mapped {p.mapped} vs {t.mapped} of {t.total};"
        f" predicted-only CPU {dict(extra)}; compiler-only CPU {dict(missing)}{seg};"
        f" first predicted CPU op: {first.index if first else '-'} {first.op if first else ''}"
        f" ({first.reason if first else ''})"
    )


def _versions(scores: list[PairScore]) -> str:
    found = Counter(s.truth.compiler_version for s in scores if s.truth)
    return ", ".join(f"{v} x{n}" for v, n in sorted(found.items(), key=str))


def _status_misses(s: PairScore, show_path: bool) -> str:
    """The (op, status) rows of the log the prediction does not have, and what it said instead."""
    assert s.truth is not None and s.truth.log is not None and s.prediction is not None
    predicted = logged_statuses(s.prediction, s.truth.model)
    actual = logged_rows(s.truth.log)
    digest = hashlib.sha256(s.pair.key.encode()).hexdigest()[:8]
    where = s.pair.key if show_path else f"pair {digest}"
    missing = ", ".join(f"{op} x{n}: {st}" for (op, st), n in (actual - predicted).items())
    extra = ", ".join(f"{op} x{n}: {st}" for (op, st), n in (predicted - actual).items())
    return f"    {where}: log has [{missing}]; predicted [{extra}]"


def _print_memory(
    name: str, half: str, scores: list[PairScore], show_path: bool
) -> tuple[int, int, int, int]:
    """Parameter memory against the twins' packages: exact on chip and streamed as predicted,
    the streamed bytes alone exact, the total exact, and the layout alone exact (on the ops the
    twin maps); each miss."""
    parsed = [s for s in scores if s.memory is not None]
    if not parsed:
        return 0, 0, 0, 0
    n = len(parsed)
    exact = sum(s.memory["exact"] for s in parsed)
    streamed = sum(
        s.memory["predicted_off_chip_bytes"] == s.memory["off_chip_bytes"] for s in parsed
    )
    total = sum(s.memory["total_exact"] for s in parsed)
    layout = sum(s.memory["layout_exact"] for s in parsed)
    near = sum(
        abs(s.memory["layout_bytes"] - s.memory["on_chip_bytes"] - s.memory["off_chip_bytes"])
        <= 0.01 * (s.memory["on_chip_bytes"] + s.memory["off_chip_bytes"])
        for s in parsed
    )
    together = [s for s in parsed if s.memory.get("cocompiled")]
    together_layout = sum(s.memory["layout_exact"] for s in together)
    confident = sum(
        not s.memory["exact"] and not s.memory["undecided"] and not s.memory.get("cocompiled")
        for s in parsed
    )
    which = sum(bool(s.memory.get("compiler_undecided")) for s in parsed)
    print(
        f"{name:<12} {half:<8} memory: on-chip and streamed exact {exact}/{n},"
        f" streamed exact {streamed}/{n}, total exact {total}/{n},"
        f" layout on the twin's ops exact {layout}/{n}"
        f" (within 1%: {near}/{n}; {len(scores) - n} packages unreadable;"
        f" co-compiled {len(together)}, their layout exact {together_layout};"
        f" compiler 15.0 or 2.x, layouts differing: {which};"
        f" inexact without `check` saying undecided, not co-compiled: {confident})"
    )
    for s in parsed:
        m = s.memory
        if m["exact"]:
            continue
        digest = hashlib.sha256(s.pair.key.encode()).hexdigest()[:8]
        where = s.pair.key if show_path else f"pair {digest}"
        print(
            f"    {where}: package {m['on_chip_bytes']} on chip + {m['off_chip_bytes']} streamed;"
            f" predicted {m['predicted_on_chip_bytes']} + {m['predicted_off_chip_bytes']};"
            f" layout on the twin's ops {m['layout_bytes']}"
            f"{' (co-compiled)' if m.get('cocompiled') else ''}"
            f"{' (15.0 or 2.x)' if m.get('compiler_undecided') else ''}"
        )
    return exact, streamed, layout, n


def mark_cocompiled(root: Path, scores: list[PairScore]) -> None:
    """Set `memory["cocompiled"]` on the pairs whose twin was compiled together with another
    compiled model under `root` (`package.cocompiled`: a shared caching token): how much of it
    is cached depends on the models compiled with it, which one model cannot show, so its
    prediction (as compiled alone) is scored apart."""
    memories = {str(s.pair.compiled): s.truth.memory for s in scores if s.truth and s.truth.memory}
    for twin in sorted(root.rglob("*_edgetpu.tflite")):
        if str(twin) not in memories:
            try:
                memory = package_memory(flatbuffer.load(twin))
            except Exception:  # an unreadable twin holds no token to share
                continue
            if memory is not None:
                memories[str(twin)] = memory
    together = cocompiled(memories)
    for s in scores:
        if s.memory is not None:
            s.memory["cocompiled"] = str(s.pair.compiled) in together


def mark_compiler_undecided(scores: list[PairScore]) -> int:
    """Set `memory["compiler_undecided"]` (and `undecided`) on the pairs whose twin has no log
    and whose package's form reads 15 (`package.compiler_generation`: 15.0, or 2.x, which writes
    the same form) when the layout for 2.x gives other bytes than 15's: which compiler made the
    twin, and so which layout is right, one twin cannot show. The number marked."""
    table = capability("edgetpu")
    marked = 0
    for s in scores:
        t, p, m = s.truth, s.prediction, s.memory
        if t is None or p is None or m is None or t.compiler_version or not p.ops:
            continue
        if m.get("compiler_major") != 15:
            continue
        mapped = [t.model.main.ops[o.index] for o in p.ops if o.runs_on != "cpu"]
        older = predicted_memory(mapped, table, OLDER_FORM_15)
        if (older["on_chip_bytes"], older["off_chip_bytes"]) != (
            m["predicted_on_chip_bytes"],
            m["predicted_off_chip_bytes"],
        ):
            m["compiler_undecided"] = m["undecided"] = True
            marked += 1
    return marked


def memory_miss_row(name: str, s: PairScore, shown: bool) -> dict[str, object] | None:
    """One row of the memory misses' table (`write_memory_md`) for a parsed pair whose cached
    or streamed bytes are not the prediction's, else None: the pair (its path in a licensed
    set, else a hash of it), its half, the compiler (its log's, else the package's form), the
    package's bytes and the prediction's, the bytes off, the layout on the twin's own ops, and
    how the miss is flagged: what `check` says it cannot decide (`memory.undecided_line`), a
    co-compile (scored apart) or a twin whose compiler the form does not name."""
    m = s.memory
    if m is None or m["exact"] or s.truth is None:
        return None
    digest = hashlib.sha256(s.pair.key.encode()).hexdigest()[:8]
    flags = []
    if m["undecided_reasons"]:
        flags.append("check: undecided (" + ", ".join(m["undecided_reasons"]) + ")")
    if m.get("cocompiled"):
        flags.append("co-compiled (its split depends on the models compiled with it)")
    if m.get("compiler_undecided"):
        flags.append("no log: 15.0 or 2.x, whose layouts differ here")
    package = m["on_chip_bytes"] + m["off_chip_bytes"]
    return {
        "set": name,
        "half": memory_half(s.pair),
        "pair": s.pair.key if shown else f"pair {digest}",
        "compiler": s.truth.compiler_version or f"form {m.get('compiler_major')}, no log",
        "package": (m["on_chip_bytes"], m["off_chip_bytes"]),
        "predicted": (m["predicted_on_chip_bytes"], m["predicted_off_chip_bytes"]),
        "off": (
            m["predicted_on_chip_bytes"] - m["on_chip_bytes"],
            m["predicted_off_chip_bytes"] - m["off_chip_bytes"],
        ),
        "layout": m["layout_bytes"] - package,
        "flags": flags,
    }


def write_memory_md(
    rows: list[dict[str, object]],
    totals: dict[str, list[int]],
    out: Path,
    exact_flagged: dict[str, int] | None = None,
) -> None:
    """benchmarks/EDGETPU_MEMORY_MISSES.md: every parsed pair whose bytes on chip or streamed
    are not predicted, and whether it is flagged (issue 27: each pair exact or flagged);
    `exact_flagged`: per half, the exact pairs `check` says undecided all the same."""
    unflagged = [r for r in rows if not r["flags"]]
    lines = [
        "# Edge TPU parameter memory: the pairs not predicted exactly (issue 27)",
        "",
        "Written by `PYTHONPATH=. python benchmarks/edgetpu_oracle_score.py --memory-md"
        " benchmarks/EDGETPU_MEMORY_MISSES.md` with the local pair sets in"
        " `$TFLFUSE_EXTRA_ORACLE`; pairs of unlicensed sets are named by a hash of their path.",
        "Bytes off: predicted minus the package's, on chip / streamed; layout: the layout of the"
        " ops the twin maps minus the package's total (0: the bytes are right, their split is"
        " not). Flagged: `check` says the layout or split is undecided (the keys of"
        " `memory.undecided_counts`), or the twin is co-compiled, or its compiler is not named.",
        "",
    ]
    for half, (exact, _, _, n) in totals.items():
        if n:
            flagged = sum(1 for r in rows if r["half"] == half and r["flags"])
            lines.append(
                f"- {half}: on chip and streamed exact {exact}/{n}; of the {n - exact} others,"
                f" flagged {flagged}, not flagged {n - exact - flagged}; exact yet said"
                f" undecided by `check`: {(exact_flagged or {}).get(half, 0)}"
            )
    lines += [
        "",
        "| set | half | pair | compiler | package (on chip + streamed) | predicted"
        " | bytes off | layout | flagged |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        (pon, poff), (qon, qoff) = r["package"], r["predicted"]  # type: ignore[misc]
        don, doff = r["off"]  # type: ignore[misc]
        flags = "; ".join(r["flags"]) or "**no**"  # type: ignore[arg-type]
        lines.append(
            f"| {r['set']} | {r['half']} | {r['pair']} | {r['compiler']} | {pon:,} + {poff:,}"
            f" | {qon:,} + {qoff:,} | {don:+,} / {doff:+,} | {r['layout']:+,} | {flags} |"
        )
    lines += ["", f"Not flagged: {len(unflagged)}."]
    out.write_text("\n".join(lines) + "\n")


_SEGMENT = re.compile(r"^(?P<stem>.+)_segment_(?P<k>\d+)_of_(?P<n>\d+)_edgetpu\.tflite$")


def _digest(pair: Pair) -> bytes:
    return hashlib.sha256(pair.cpu.read_bytes() + pair.compiled.read_bytes()).digest()


DEV_LIST = "dev.txt"
# Pairs whose compiler log a status-string rule was derived from, by the sha256 of their CPU model
# (paths of unlicensed pairs are not printed): dev for status strings, whatever their half for
# the rest (their placement and memory were predicted before these rules, and did not move).
STATUS_DEV = {
    # ml-const/edgeTPU tflite_fp32/5nano_seg-fp16 (held out): "Tensor has unsupported rank"
    "ad66cc70c568b0eb571d2549011e619e7d15fb99b32cf3ff387047c3a6485260": "unsupported rank",
    # cmpss94068/tensorflowlite detect (dev already): a custom op's data type, logged as CUSTOM
    "644e821f2d1960b16454b6939a702ffa0bd461a7fe317daff1bc5195c75d111e": "custom op data type",
}


# Pairs a memory rule was derived from after the split was fixed, by the same digest: dev for
# parameter memory, whatever their half for the rest.
MEMORY_DEV = {
    # google-coral/demo-manufacturing models/classifier (held out): compiler 15 splits one
    # MobileNetV2 graph two ways, `memory.SPLIT_SURE_BYTES_15`
    "1e6b9a23a1c9c5cbaeeafd4a92af8a04d9b152df56343c7528b65a385947b476": "compiler 15's split",
}


def _half_with(pair: Pair, derived: dict[str, str]) -> str:
    if pair.half == "dev" or hashlib.sha256(pair.cpu.read_bytes()).hexdigest() in derived:
        return "dev"
    return "holdout"


def status_half(pair: Pair) -> str:
    """The half a pair's status strings are scored in: dev when a status rule was derived from
    its log (`STATUS_DEV`), else the pair's own half."""
    return _half_with(pair, STATUS_DEV)


def memory_half(pair: Pair) -> str:
    """The half a pair's parameter memory is scored in: dev when a memory rule was derived from
    it after the split (`MEMORY_DEV`), else the pair's own half."""
    return _half_with(pair, MEMORY_DEV)


class ListedPair(Pair):
    """A pair of a set with a `DEV_LIST`: dev when listed there (`listed_dev`), else holdout."""

    listed_dev = False

    @property
    def half(self) -> str:
        return "dev" if self.all_dev or self.listed_dev else "holdout"


def set_pairs(name: str, root: Path) -> list[Pair]:
    """The pairs of one set with their halves: the original 5-pair set all dev; a folder with a
    `DEV_LIST` all holdout but the keys listed there; any other by the fixed hash."""
    pairs = find_pairs(root, all_dev=name == "edgetpu")
    listing = root / DEV_LIST
    if not listing.is_file():
        return pairs
    keys = {line.strip() for line in listing.read_text().splitlines() if line.strip()}
    listed = []
    for p in pairs:
        pair = ListedPair(p.root, p.cpu, p.compiled, p.log, p.all_dev)
        pair.listed_dev = p.key in keys
        listed.append(pair)
    return listed


def fold_dev_copies(pairs: list[Pair]) -> int:
    """Put into the dev half every holdout pair whose model and twin are byte for byte a dev
    pair's (a copy in another set is not held out); the number moved."""
    dev = {_digest(p) for p in pairs if p.half == "dev"}
    moved = 0
    for p in pairs:
        if p.half == "holdout" and _digest(p) in dev:
            p.all_dev = True
            moved += 1
    return moved


def pipelines(root: Path) -> dict[tuple[Path, int], dict[int, Path]]:
    """Every `X_segment_K_of_N_edgetpu.tflite` under `root` (edgetpu_compiler -n N), grouped
    by (X.tflite, N): the segment twins of one pipelined compile."""
    found: dict[tuple[Path, int], dict[int, Path]] = {}
    for twin in sorted(root.rglob("*_segment_*_of_*_edgetpu.tflite")):
        m = _SEGMENT.match(twin.name)
        if m:
            key = (twin.with_name(f"{m['stem']}.tflite"), int(m["n"]))
            found.setdefault(key, {})[int(m["k"])] = twin
    return found


def pipeline_cuts_exact(source: Path, n: int, twins: dict[int, Path]) -> tuple[int, int]:
    """(cuts predicted exactly, cuts): a cut is exact when the tensors segment k reads from the
    earlier ones are the ones its twin takes as inputs (names up to the compiler's first ';')."""
    split = pipeline_split(flatbuffer.load(source).main, n)
    exact = 0
    for k in range(1, n):
        read = {t.name.split(";")[0] for t in flatbuffer.load(twins[k]).main.inputs}
        predicted = {name.split(";")[0] for name in split.inputs[k]} if split else set()
        exact += predicted == read
    return exact, n - 1


def _print_pipelines(name: str, root: Path) -> None:
    """`-n N` cuts against pipelined twins whose source is at hand; the sets without one are
    counted (Coral's SSD MobileNet twins: checked on rebuilt sources in tests)."""
    found = pipelines(root)
    if not found:
        return
    complete = {key: t for key, t in found.items() if len(t) == key[1]}
    scored = [pipeline_cuts_exact(src, n, t) for (src, n), t in complete.items() if src.is_file()]
    exact, cuts = sum(e for e, _ in scored), sum(c for _, c in scored)
    print(
        f"{name:<12} pipelined (-n): cuts exact {exact}/{cuts} on {len(scored)} compiles with"
        f" their source; {len(found) - len(scored)} compiles without it"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--extra", action="append", help="a further folder of pairs (default $TFLFUSE_EXTRA_ORACLE)"
    )
    parser.add_argument("--misses", action="store_true", help="list each miss with its path")
    parser.add_argument("--half", choices=("dev", "holdout"), help="score one half only")
    parser.add_argument(
        "--memory-md", type=Path, help="write the memory misses' table (EDGETPU_MEMORY_MISSES.md)"
    )
    args = parser.parse_args(argv)
    found = sets(args.extra)
    if not found:
        print("no oracle sets found (../shared/oracle is absent)", file=sys.stderr)
        return 1
    total_status = {"dev": [0, 0], "holdout": [0, 0]}
    memory_totals: dict[str, list[int]] = {"dev": [0, 0, 0, 0], "holdout": [0, 0, 0, 0]}
    pairs = {name: set_pairs(name, root) for name, root in found.items()}
    moved = fold_dev_copies([p for listed in pairs.values() for p in listed])
    miss_rows: list[dict[str, object]] = []
    exact_flagged = {"dev": 0, "holdout": 0}
    print(f"holdout pairs that copy a dev pair byte for byte, scored as dev: {moved}")
    for name, root in found.items():
        licensed = name in LICENSED
        shown = licensed or args.misses
        scores = [score_pair(p) for p in pairs[name]]
        mark_cocompiled(root, scores)
        mark_compiler_undecided(scores)
        miss_rows += [r for s in scores if (r := memory_miss_row(name, s, licensed))]
        for s in scores:
            if s.memory is not None and s.memory["exact"] and s.memory["undecided"]:
                exact_flagged[memory_half(s.pair)] += 1
        for half in ("dev", "holdout"):
            if args.half and half != args.half:
                continue
            for mode in ("single", "multi"):
                group = [s for s in scores if s.pair.half == half and s.mode == mode]
                if not group:
                    continue
                k = sum(s.exact for s in group)
                b = sum(s.baseline_exact for s in group)
                print(
                    f"{name:<12} {half:<8} {mode:<6} tflfuse exact {k}/{len(group)}"
                    f"   documented rule {b}/{len(group)}"
                )
                for s in group:
                    if not s.exact:
                        print(_miss_line(s, licensed or args.misses))
        for half in ("dev", "holdout"):
            if not args.half or half == args.half:
                counts = _print_memory(
                    name, half, [s for s in scores if memory_half(s.pair) == half], shown
                )
                memory_totals[half] = [a + b for a, b in zip(memory_totals[half], counts)]
        for half in ("dev", "holdout"):
            logged = [s for s in scores if s.status and status_half(s.pair) == half]
            if not logged or (args.half and half != args.half):
                continue
            agree = sum(s.status[0] for s in logged)
            listed = sum(s.status[1] for s in logged)
            total_status[half][0] += agree
            total_status[half][1] += listed
            print(
                f"{name:<12} {half:<8} status strings {agree}/{listed} logged ops"
                f" ({len(logged)} logs, compilers {_versions(logged)})"
            )
            for s in logged:
                if s.status[0] != s.status[1]:
                    print(_status_misses(s, licensed or args.misses))
        _print_pipelines(name, root)
        if not args.half and scores:
            k = sum(s.exact for s in scores)
            b = sum(s.baseline_exact for s in scores)
            n = len(scores)
            print(f"{name:<12} all      both   tflfuse exact {k}/{n}   documented rule {b}/{n}")
    for half, (exact, streamed, layout, n) in memory_totals.items():
        if n:
            print(
                f"memory, every set, {half}: on-chip and streamed exact {exact}/{n},"
                f" streamed exact {streamed}/{n}, layout total exact {layout}/{n}"
            )
    if args.memory_md and not args.half:
        write_memory_md(miss_rows, memory_totals, args.memory_md, exact_flagged)
    for half, (agree, listed) in total_status.items():
        if listed:
            print(
                f"status strings, every set, {half}: {agree}/{listed} ops of the compiler logs"
                " have the predicted status"
            )
    agree, listed = (sum(c) for c in zip(*total_status.values()))
    if listed:
        print(
            f"status strings: {agree}/{listed} ops of the compiler logs have the predicted status"
            f" (dev: also the logs a status rule was drawn from, STATUS_DEV)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
