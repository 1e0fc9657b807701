"""Each int8 rewrite checked where it stands: the ops it made against the ops it replaced, on the
same activations at its boundary, within the steps its rule declares.

The end-to-end check holds an int8 output to the worst-case bound of every rewrite on its
paths (`rewrite.int8_error`), and that bound grows through every layer after a rewrite: deep in
a network it reaches the whole int8 range, and a wrong rewrite there would pass. Here each
int8 rewrite is judged alone. Its site (the tensor the rewritten op wrote, which keeps its name,
type and quantization) exists before and after. Walking back from the site in the rewritten
model, the walk stops at tensors whose value is the same in both by construction (a graph input,
or a tensor written by an op of the same type and options from the same tensors and constants):
the region between is what the rewrites changed. One run of the reference, keeping every tensor
(on the seeded inputs the end-to-end check uses), gives those tensors' values and the site's;
the region runs alone as a small model fed those values, so it sees exactly the activations the
replaced ops saw, and its site may differ from the reference's by the bound of the rewrites
placed in the region (`int8_error.output_bounds` on the region: a region holding one rewrite
allows exactly its declared steps). A site whose tensor a later rewrite replaced, or whose
region reaches a variable, a subgraph call or an input the other model lacks, is listed as not
checked, with the reason; the end-to-end check still covers it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, Model, Op, Tensor, flatbuffer
from tflfuse.json_types import JSONDict
from tflfuse.rewrite.int8_error import output_bounds
from tflfuse.rewrite.rule import RewriteEvent
from tflfuse.verification import run_memo
from tflfuse.verification import verify as verify_mod
from tflfuse.verification.runs import run

_NO_UNIQUE_NAME = "a tensor it reads or writes has no name of its own in the model"
_STATEFUL = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"})


class UncheckedError(Exception):
    """A site that cannot be checked alone (the reason is the message)."""


@dataclass
class Region:
    """The ops between a site and the tensors both models agree on, in one model."""

    ops: list[Op]
    frontier: list[Tensor]


@dataclass
class Site:
    tensor: str
    events: list[RewriteEvent]
    region: Region  # in the candidate


@dataclass
class _Group:
    """Sites whose regions run together in one small model per side."""

    sites: list[Site] = field(default_factory=list)


def _unique_names(graph: Graph) -> dict[str, Tensor]:
    seen: dict[str, Tensor] = {}
    twice: set[str] = set()
    for t in graph.tensors:
        if t.name in seen:
            twice.add(t.name)
        seen[t.name] = t
    return {n: t for n, t in seen.items() if n not in twice}


def _same_tensor(a: Tensor, b: Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.quantization is None or b.quantization is None:
        return (a.quantization is None or a.quantization.is_empty()) and (
            b.quantization is None or b.quantization.is_empty()
        )
    return a.quantization.same_as(b.quantization)


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(np.array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object)))
    except (ValueError, TypeError):
        return a == b


def _same_constant(a: Tensor, b: Tensor) -> bool:
    if not (b.is_constant and _same_tensor(a, b)):
        return False
    return a.data is b.data or (
        a.data is not None and b.data is not None and a.data.tobytes() == b.data.tobytes()
    )


def _same_op(p: Op, q: Op) -> bool:
    """Same type, options, constants and input tensors (by name): the same value from the
    same inputs."""
    if (p.type, p.custom_code, len(p.inputs), len(p.outputs)) != (
        q.type,
        q.custom_code,
        len(q.inputs),
        len(q.outputs),
    ):
        return False
    if p.options.keys() != q.options.keys() or p.custom_options != q.custom_options:
        return False
    if not all(_equal(p.options[k], q.options[k]) for k in p.options):
        return False
    for a, b in zip(p.inputs, q.inputs):
        if a is None or b is None:
            if a is not b:
                return False
        elif a.name != b.name or (a.is_constant and not _same_constant(a, b)):
            return False
    return all(a.name == b.name for a, b in zip(p.outputs, q.outputs))


class _Side:
    """One model's main graph, seen against the other's: which tensors the two agree on."""

    def __init__(self, graph: Graph, other: Graph) -> None:
        self.graph = graph
        self.other = other
        self.by_name = _unique_names(graph)
        self.other_by_name = _unique_names(other)
        self.position = {id(op): i for i, op in enumerate(graph.ops)}
        self._agreed: dict[int, bool] = {}

    def agreed(self, t: Tensor) -> bool:
        """Both models hold this tensor with the same value by construction."""
        if id(t) not in self._agreed:
            o = self.other_by_name.get(t.name)
            ok = o is not None and self.by_name.get(t.name) is t and _same_tensor(t, o)
            if ok and o is not None:
                if t.producer is None or o.producer is None:
                    ok = any(x is t for x in self.graph.inputs) and any(
                        x is o for x in self.other.inputs
                    )
                else:
                    ok = _same_op(t.producer, o.producer)
            self._agreed[id(t)] = ok
        return self._agreed[id(t)]

    def region(self, site: Tensor) -> Region:
        """The ops from `site` back to tensors both models agree on; UncheckedError when the walk
        reaches something a small model cannot be fed."""
        ops: dict[int, Op] = {}
        frontier: dict[int, Tensor] = {}
        stack = [site]
        while stack:
            t = stack.pop()
            op = t.producer
            if op is None or id(op) not in self.position:
                raise UncheckedError(f"{t.name!r} is not computed in this model")
            if id(op) in ops:
                continue
            if op.type in _STATEFUL or any("subgraph" in k for k in op.options):
                raise UncheckedError(
                    f"the region reaches {op.type}, which a small model cannot hold"
                )
            ops[id(op)] = op
            for x in op.inputs:
                if x is None or x.is_constant:
                    continue
                if x.is_variable:
                    raise UncheckedError(f"the region reads the variable {x.name!r}")
                if self.agreed(x):
                    frontier[id(x)] = x
                else:
                    stack.append(x)
        ordered = sorted(ops.values(), key=lambda o: self.position[id(o)])
        return Region(ordered, sorted(frontier.values(), key=lambda x: x.name))


def _sites(
    candidate: _Side, events: Sequence[RewriteEvent]
) -> tuple[list[Site], list[dict[str, Any]]]:
    """The checkable sites of the int8 rewrites, and the rest with the reason."""
    by_site: dict[str, list[RewriteEvent]] = {}
    skipped = []
    for e in events:
        if not e.quantized or e.subgraph != 0:
            continue
        for s in e.sites:
            by_site.setdefault(s, []).append(e)
    sites = []
    for name, evs in by_site.items():
        c, r = candidate.by_name.get(name), candidate.other_by_name.get(name)
        try:
            if c is None or r is None or not _same_tensor(c, r):
                raise UncheckedError("a later rewrite replaced the tensor it wrote")
            if c.dtype not in ("INT8", "UINT8", "INT16") or c.quantization is None:
                raise UncheckedError("it wrote a float tensor (the end-to-end check holds it)")
            sites.append(Site(name, evs, candidate.region(c)))
        except UncheckedError as why:
            skipped += [{"rule": e.rule, "tensor": name, "reason": str(why)} for e in evs]
    return sites, skipped


def _groups(sites: list[Site]) -> list[_Group]:
    """Sites packed into as few small models as can hold them: a tensor one site is fed must
    not be one another site in the same model computes."""
    groups: list[tuple[_Group, set[str], set[str]]] = []
    for site in sites:
        fed = {t.name for t in site.region.frontier}
        made = {t.name for o in site.region.ops for t in o.outputs}
        for group, g_fed, g_made in groups:
            if not (fed & g_made or made & g_fed):
                group.sites.append(site)
                g_fed |= fed
                g_made |= made
                break
        else:
            groups.append((_Group([site]), fed, made))
    return [g for g, _, _ in groups]


def _small_graph(regions: list[Region], outputs: list[str], side: _Side) -> Graph:
    """One graph of the regions' ops (shared, not copied: it is only serialized), fed by their
    frontiers, writing the sites."""
    ops = {id(o): o for r in regions for o in r.ops}
    ordered = sorted(ops.values(), key=lambda o: side.position[id(o)])
    inputs = list({t.name: t for r in regions for t in r.frontier}.values())
    outs = [side.by_name[n] for n in outputs]
    made = (x for o in ordered for x in (*o.inputs, *o.outputs) if x is not None)
    tensors = list({id(t): t for t in [*inputs, *made]}.values())
    return Graph("region", ordered, tensors, inputs, outs)


def _run_group(group: _Group, candidate: _Side, values: list[dict]) -> tuple[Graph, list]:
    """(the group's small graph, the value of each site per input set)."""
    graph = _small_graph(
        [s.region for s in group.sites], [s.tensor for s in group.sites], candidate
    )
    feeds = [[v[t.name] for t in graph.inputs] for v in values]
    return graph, run(flatbuffer.to_bytes(Model([graph])), feeds, "none", remember=False)


def _reference_model(reference: bytes) -> Model:
    return run_memo.remembered(
        "rewrite_check.reference",
        (run_memo.digest(reference),),
        lambda: flatbuffer.from_bytes(reference, "<reference>"),
    )


@dataclass
class Plan:
    """What the check will run: the sites, those it cannot check, the tensors it reads."""

    sites: list[Site]
    skipped: list[dict[str, Any]]
    candidate: _Side
    events: Sequence[RewriteEvent]

    @property
    def names(self) -> set[str]:
        """The reference tensors the check needs: each region's frontier, each site, and the
        outputs (so the end-to-end check's run of the reference can keep them all)."""
        graph = self.candidate.other
        return (
            {t.name for s in self.sites for t in s.region.frontier}
            | {s.tensor for s in self.sites}
            | {t.name for t in graph.outputs}
        )


def plan(
    reference: bytes, model: Model, events: Sequence[RewriteEvent], *, before: Graph | None = None
) -> Plan | None:
    """The check of `model`'s int8 rewrites against `reference` (None: no int8 rewrite).
    `before`: the reference's main graph as the passes found it (else `reference` is parsed)."""
    if not any(e.quantized and e.subgraph == 0 for e in events):
        return None
    ref_graph = before if before is not None else _reference_model(reference).main
    candidate = _Side(model.main, ref_graph)
    sites, skipped = _sites(candidate, events)
    return Plan(sites, skipped, candidate, events)


def check(
    reference: bytes,
    model: Model,
    events: Sequence[RewriteEvent],
    *,
    before: Graph | None = None,
    seed: int = 0,
    runs: int = 3,
) -> tuple[str | None, JSONDict]:
    """(why an int8 rewrite moved its site by more than it declares, or None; the record:
    `rewrites`, one entry per checked rewrite, and `rewrites_not_checked` with reasons)."""
    made = plan(reference, model, events, before=before)
    if made is None:
        return None, {"rewrites": []}
    values = (
        verify_mod.activations(reference, made.names, seed=seed, runs=runs) if made.sites else []
    )
    return judge(made, values)


def judge(made: Plan, values: list[dict[str, np.ndarray]]) -> tuple[str | None, JSONDict]:
    """Each site of `made` run alone on `values` (the reference's tensors, per input set)."""
    kept = set(values[0]) if values else set()
    sites, skipped = [], list(made.skipped)
    for site in made.sites:
        if {t.name for t in site.region.frontier} | {site.tensor} <= kept:
            sites.append(site)
        else:
            skipped += [_skip(e, site, _NO_UNIQUE_NAME) for e in site.events]
    record: dict[str, Any] = {"rewrites": [], "rewrites_not_checked": skipped}
    present = {t.name for t in made.candidate.graph.tensors}
    events = made.events
    vanished = [e for e in events if e.int8_steps > 0 and not set(e.sites) & present]
    failure = None
    for group in _groups(sites):
        try:
            small, cand_out = _run_group(group, made.candidate, values)
        except TflfuseError as exc:  # a region that does not run alone: the end-to-end check
            why = f"its region does not run as a model of its own ({exc})"
            skipped += [_skip(e, site, why) for site in group.sites for e in site.events]
            continue
        held = {t.name for t in small.tensors}
        placed = [e for e in events if set(e.sites) & held]
        bounds = output_bounds(Model([small]), placed + vanished)
        for k, site in enumerate(group.sites):
            seen = max(
                int(np.abs(c[k].astype(np.int64) - v[site.tensor].astype(np.int64)).max(initial=0))
                for c, v in zip(cand_out, values)
            )
            allowed = int(bounds.get(site.tensor, 0))
            record["rewrites"] += [_entry(e, site, allowed, seen) for e in site.events]
            if seen > allowed and failure is None:
                rules = " and ".join(dict.fromkeys(e.rule for e in site.events))
                failure = (
                    f"{rules} moved {site.tensor!r} by {seen} quantization steps from what the"
                    f" ops it replaced compute on the same activations (allowed {allowed})"
                )
    return failure, record


def _skip(e: RewriteEvent, site: Site, reason: str) -> dict[str, Any]:
    return {"rule": e.rule, "tensor": site.tensor, "reason": reason}


def _entry(e: RewriteEvent, site: Site, allowed: int, seen: int) -> dict[str, Any]:
    return {
        "rule": e.rule,
        "tensor": site.tensor,
        "where": e.where,
        "boundary": [t.name for t in site.region.frontier],
        "allowed_steps": allowed,
        "seen_steps": seen,
        "ok": seen <= allowed,
    }
