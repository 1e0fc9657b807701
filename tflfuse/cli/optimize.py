"""`tflfuse optimize MODEL -o OUT`: the rewrite pipeline through tflfuse.api, then what it did
(ops, activations, the numeric check, with --explain the rules fired and refused).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tflfuse import api
from tflfuse.cli.common import emit_json, fmt_bytes
from tflfuse.convert.report import rewrites_checked
from tflfuse.convert.rule_sets import pipeline
from tflfuse.errors import UsageError
from tflfuse.files import check_destination, check_input, same_file
from tflfuse.rewrite import FLOAT_ONLY
from tflfuse.targets.registry import every


def run(args: argparse.Namespace) -> int:
    src, dst = check_input(args.model), Path(args.output)
    if same_file(src, dst) and not args.in_place:
        raise UsageError(f"{dst}: output would overwrite the input (pass --in-place to allow it)")
    check_destination(args.output, "optimized model")  # before the work, not after it
    if args.json not in (None, "-"):
        check_destination(args.json, "--json report")
    result = api.optimize(  # validates the options, then runs the pipeline and writes dst
        src,
        dst,
        level=args.level,
        target=args.target,
        disabled=tuple(sorted(set(args.disable))),  # of unknown names, the first sorted is named
        verify=not args.no_verify,
        runtime=args.runtime or None,
        in_place=True,  # same_file(src, dst) was refused above unless --in-place
    )
    report = {
        "input": str(src),
        "output": str(dst),
        "level": args.level,
        "target": args.target,
        **result.to_dict(),
    }
    if args.json == "-":
        emit_json(report, "-")
        return 0
    if args.json:
        emit_json(report, args.json)
    b, a = result.before, result.after
    print(
        f"{dst}: {b['op_count']} -> {a['op_count']} ops, activations "
        f"{fmt_bytes(b['activation_bytes'])} -> {fmt_bytes(a['activation_bytes'])}"
    )
    v = result.verification
    if v.get("verified"):
        print(f"  verified: max abs error {v.get('max_abs', 0.0):.3g}")
        if v.get("varies") is False:
            print("  warning: the outputs did not change with the input, so the check is weak")
    elif args.level > 0:
        print(f"  not verified: {v.get('reason')}")
    if result.runtime:
        print(f"  made for {result.runtime['made_for']}: every op version it needs is there")
    for rule, approx in result.result.approximations().items():
        bound = approx["error_bound"]
        print(f"  approximation: {rule} x{approx['count']} (|error| <= {bound:.2g} in all)")
    for name, steps in v.get("tolerance", {}).get("int8_steps", {}).items():
        if steps:
            seen = v.get("outputs", {}).get(name, {}).get("max_abs", 0.0)
            print(f"  int8 output {name!r}: allowed {steps} steps by the rules, {seen:.3g} seen")
    _print_rewrite_checks(v)
    if args.explain:
        for rule, n in result.result.fired().items():
            print(f"  fired {rule} x{n}")
        for line in _pass_lines(result.result.pass_changes):
            print(f"  {line}")
        float_only: dict[str, int] = {}
        for r in result.result.refusals:
            if r.reason == FLOAT_ONLY:  # one line per rule, not one per int8 op
                float_only[r.rule] = float_only.get(r.rule, 0) + 1
                continue
            print(f"  refused {r.rule} at {r.where!r}: {r.reason}")
        for rule, n in float_only.items():
            print(f"  refused {rule} at {n} op{'s' if n > 1 else ''}: {FLOAT_ONLY}")
    return 0


def _print_rewrite_checks(v: dict) -> None:
    """The per-rewrite int8 check in one line: how many, the closest to its bound."""
    line = rewrites_checked(v)
    if line:
        print(f"  {line}")


def _pass_lines(changes: dict[str, dict[str, int]]) -> list[str]:
    """'pass DeadCodeElimination removed 1 op (MAX_POOL_2D 1): <what the pass does>' for each
    whole-graph pass that changed the op list, so every removed op has a name beside it."""
    docs = {
        p.name: (type(p).__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        for target in every()
        for level in (0, 1, 2)
        for p in pipeline(level, target)
    }
    lines = []
    for name, ops in changes.items():
        removed = {t: n for t, n in ops.items() if n > 0}
        added = {t: -n for t, n in ops.items() if n < 0}
        parts = []
        for verb, group in (("removed", removed), ("added", added)):
            if group:
                total = sum(group.values())
                kinds = ", ".join(f"{t} {n}" for t, n in group.items())
                parts.append(f"{verb} {total} op{'s' if total != 1 else ''} ({kinds})")
        why = docs.get(name, "").rstrip(".")
        lines.append(f"pass {name} {' and '.join(parts)}" + (f": {why}" if why else ""))
    return lines
