"""Which op forms compiled Edge TPU models show mapped or refused -> delegates/edgetpu_forms.toml.

    PYTHONPATH=. python benchmarks/edgetpu_forms.py [--extra DIR ...] [--dev-only] [--out PATH]

Scans the pair sets of `benchmarks/edgetpu_oracle_score.py` (../shared/oracle/edgetpu and
edgetpu-more; `--extra DIR` or $TFLFUSE_EXTRA_ORACLE for local sets such as /work/evidence/*):
every `X.tflite` beside its compiled twin `X_edgetpu.tflite` tells, for each op of X, its form
(`tflfuse.targets.edgetpu.forms.form_of`) and whether the compiler mapped it or refused it on its
own (`observe_pair`); a compiled model without its source tells the refusals only
(`observe_twin`). Licensed sets are cited by folder, local-only sets (repositories without a
licence) by count; a local set is licensed when its folder holds a `LICENSED` file.
`--dev-only` keeps the holdout half of every set out (to measure the gate on pairs it was not
built from); `--print` lists the forms instead of writing the table.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from edgetpu_oracle_score import LICENSED, sets  # noqa: E402

from tflfuse.ir import flatbuffer  # noqa: E402
from tflfuse.targets.edgetpu.compiler_log import CUSTOM_OP, CompilerLog, parse_log  # noqa: E402
from tflfuse.targets.edgetpu.forms import (  # noqa: E402
    Form,
    FormEntry,
    FormTable,
    Observation,
    Size,
    _frontier,
    observe_pair,
    observe_twin,
)
from tflfuse.targets.edgetpu.predict import compiler_version_key  # noqa: E402
from tflfuse.targets.edgetpu.truth import (  # noqa: E402
    COMPILED_SUFFIX,
    compiled_runtime_version,
    find_pairs,
    read_truth,
)

HEADER = """\
Coral Edge TPU: the op forms compiled models show mapped or refused (written by
benchmarks/edgetpu_forms.py; read by tflfuse/targets/edgetpu/forms.py, whose Form documents
the key).
A form: op type, per input its kind (a: activation, c: constant) and data type, the broadcast
pattern of binary elementwise operands over the output's non-trivial dims ("x" spans, "1"
broadcast), and the op's own detail (reduced axes, depth multiplier, perm, softmax shape, ...).
mapped / refused: compiled models (not ops) that map the form (or accept it on its own: left on
the CPU with the log status "More than one subgraph is not supported") / refuse it on its own (an
op on the CPU reading only model inputs and mapped ops' outputs, or, in a twin without its
source, an edgetpu-custom-op's outputs; or every op of its type refused in the compiler's log).
mapped_sizes: the largest [elements, innermost-two-dims elements] seen mapped; refused_sizes: the
smallest seen refused. Refusals count only from models compiled by edgetpu_compiler 16 (the
log says so, or the twin's package needs runtime 14); mapped ops from any compiler.
Sources: edgetpu = ../shared/oracle/edgetpu (by file stem), edgetpu-more = ../shared/oracle/
edgetpu-more (by folder); local sets fetched from public repositories (/work/evidence/SOURCES.tsv
names each repository and commit, to fetch again): those of licensed repositories ("lic":
Apache-2.0, MIT, BSD) cited by folder OWNER__REPO@COMMIT, the others (no licence, or GPL) measured
locally only and cited by count ("SET xN": N models of that set).
{counts}"""


def _licensed(set_name: str, root: Path) -> bool:
    """A set whose repositories carry a licence (Apache-2.0, MIT or BSD): the shared sets, and a
    local set whose folder holds a `LICENSED` file (its pairs may be cited by folder)."""
    return set_name in LICENSED or (root / "LICENSED").is_file()


def _source(set_name: str, key: str, licensed: bool) -> str:
    """Where an observation comes from: a licensed pair by folder, a local one by set only."""
    if not licensed:
        return set_name
    parts = key.split("/")
    if set_name == "edgetpu":
        return f"oracle {Path(parts[-1]).stem}"
    return f"{'more' if set_name == 'edgetpu-more' else set_name} {parts[0]}"


def _by_compiler_16(seen: list[Observation], log: CompilerLog | None, runtime: int | None) -> list:
    """The observations that speak for compiler 16 (the one the predictor describes): every op
    mapped (a later compiler maps what an earlier one did), refusals only from a model compiled
    by 16 (its log says so, or, without a log, its package needs runtime 14: see truth.py)."""
    version = log.header.get("version") if log else None
    newest = compiler_version_key(version) >= (16, 0) if version else (runtime or 0) >= 14
    return [o for o in seen if newest or o.outcome != "refused"]


def _observations(root: Path, name: str, dev_only: bool) -> list[tuple[str, str, list]]:
    """(model id, source, observations) for every pair and sourceless twin under `root`."""
    found = []
    licensed = _licensed(name, root)
    pairs = find_pairs(root, all_dev=name == "edgetpu")
    paired = {p.compiled for p in pairs}
    for pair in pairs:
        if dev_only and pair.half != "dev":
            continue
        try:
            truth = read_truth(pair)
        except Exception:  # an unloadable pair shows nothing
            continue
        graph = truth.model.main
        rows = truth.log.rows if truth.log else None
        seen = observe_pair(graph.ops, truth.cpu_ops, graph.inputs, rows)
        seen = _by_compiler_16(seen, truth.log, truth.runtime_version)
        found.append((f"{name}/{pair.key}", _source(name, pair.key, licensed), seen))
    for twin in sorted(root.rglob(f"*{COMPILED_SUFFIX}.tflite")):
        if twin in paired:
            continue
        try:
            model = flatbuffer.load(twin)
        except Exception:
            continue
        key = twin.relative_to(root).as_posix()
        log = twin.with_suffix(".log")
        parsed = parse_log(log.read_text(errors="replace")) if log.is_file() else None
        rows = parsed.rows if parsed else None
        seen = observe_twin(model.main.ops, CUSTOM_OP, model.main.inputs, rows)
        seen = _by_compiler_16(seen, parsed, compiled_runtime_version(model))
        found.append((f"{name}/{key}", _source(name, key, licensed), seen))
    return found


def build(found: list[tuple[str, str, list[Observation]]]) -> FormTable:
    """The table from every model's observations."""
    forms: dict[str, Form] = {}
    models: dict[tuple[str, str], set[str]] = defaultdict(set)
    sizes: dict[tuple[str, str], list[Size]] = defaultdict(list)
    sources: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for model, source, seen in found:
        for o in seen:
            forms[o.form.key] = o.form
            outcome = "mapped" if o.outcome == "accepted" else o.outcome
            models[(o.form.key, outcome)].add(model)
            sizes[(o.form.key, outcome)].append(o.size)
            sources[o.form.key][source].add(model)
    table = FormTable()
    for key, form in forms.items():
        cited = [s if " " in s else f"{s} x{len(m)}" for s, m in sorted(sources[key].items())]
        table.entries[key] = FormEntry(
            form,
            len(models[(key, "mapped")]),
            len(models[(key, "refused")]),
            _frontier(sizes[(key, "mapped")], largest=True),
            _frontier(sizes[(key, "refused")], largest=False),
            cited,
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", action="append", help="a further folder of pairs and twins")
    parser.add_argument("--dev-only", action="store_true", help="leave every holdout pair out")
    parser.add_argument("--out", default=str(HERE.parent / "delegates" / "edgetpu_forms.toml"))
    parser.add_argument("--print", action="store_true", help="list the forms, write nothing")
    args = parser.parse_args(argv)
    found_sets = sets(args.extra)
    if not found_sets:
        print("no pair sets found (../shared/oracle is absent)", file=sys.stderr)
        return 1
    found = []
    counts = []
    for name, root in found_sets.items():
        seen = _observations(root, name, args.dev_only)
        found += seen
        counts.append(f"{name}: {len(seen)} compiled models")
    table = build(found)
    table.header = HEADER.format(counts="Scanned: " + "; ".join(counts) + ".")
    if args.print:
        for key, e in sorted(table.entries.items()):
            print(f"{e.mapped:4d} mapped {e.refused:4d} refused  {key}  {e.mapped_sizes[-1:]}")
        return 0
    Path(args.out).write_text(table.to_toml())
    print(f"{len(table.entries)} forms from {len(found)} compiled models -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
