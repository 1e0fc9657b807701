"""Which TensorFlow Lite interpreter release can run a model: op codes and versions, offline.

A newer converter writes newer builtin codes and op versions than an older interpreter knows, and
the device refuses the model at load time ("Op builtin_code out of range: 150. Are you using old
TFLite binary with newer model?" for GELU, "Didn't find op for builtin opcode 'TRANSPOSE_CONV'
version '4'"). The interpreter resolves every operator code of the file when it builds, so what
a model needs is what its operator codes say: the builtin code and the `version` the converter
wrote. What each release runs is `delegates/runtimes.toml`, taken from TensorFlow Lite's own
sources (benchmarks/runtimes_data.py says which file and commit): TensorFlow and tflite-runtime
releases by `runtime_version.cc` (op version -> first release), ai-edge-litert releases by their
`register.cc`. Real interpreters check the table (tests/test_runtimes_probe.py).

A runtime is named as pip names it: `tflite-runtime==2.5.0`, `ai-edge-litert==2.3.0`,
`tensorflow==2.21` (its `tf.lite.Interpreter`). No TensorFlow and no interpreter here: the check
reads the model's operator codes and the table.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tflfuse.errors import TflfuseError, UsageError
from tflfuse.ir import Model
from tflfuse.ir.flatbuffer import OP_CODES
from tflfuse.ir.op_versions import required
from tflfuse.json_types import JSONDict
from tflfuse.resources import data_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TABLE = "runtimes.toml"
FAMILIES = ("tflite-runtime", "tensorflow", "ai-edge-litert")
_ALIASES = {
    "tflite-runtime": "tflite-runtime",
    "tflite_runtime": "tflite-runtime",
    "tensorflow": "tensorflow",
    "tensorflow-cpu": "tensorflow",
    "tf": "tensorflow",
    "ai-edge-litert": "ai-edge-litert",
    "ai_edge_litert": "ai-edge-litert",
    "litert": "ai-edge-litert",
}
_SPEC = re.compile(r"\s*([A-Za-z_-]+)\s*(?:==|=|\s)\s*v?(\d+(?:\.\d+){0,2})([.\w+-]*)\s*")
# The interpreter's own words (tflite/core/api/op_resolver / interpreter_builder), for a finding.
OUT_OF_RANGE = (
    "Op builtin_code out of range: {code}. Are you using old TFLite binary with newer model?"
)
NOT_FOUND = (
    "Didn't find op for builtin opcode '{op}' version '{version}'. An older version of this"
    " builtin might be supported. Are you using an old TFLite binary with a newer model?"
)
UNRESOLVED = "Encountered unresolved custom op: {name}."
EDGETPU_CUSTOM_OP = "edgetpu-custom-op"


def version_key(version: str) -> tuple[int, int, int]:
    """'2.9.1' -> (2, 9, 1); '2.5' -> (2, 5, 0)."""
    parts = [int(p) for p in re.findall(r"\d+", version)[:3]]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


# -- the table -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Runtime:
    """One interpreter release: which builtin op versions and custom ops it resolves."""

    name: str  # "tflite-runtime==2.5.0"
    family: str
    version: str
    basis: str  # "runtime_version" or "register"
    source: dict[str, str]  # repo, commit, file
    max_builtin_code: int
    custom_ops: frozenset[str]
    versions: dict[str, tuple[int, ...]]  # op -> the versions it registers
    note: str = ""

    @property
    def label(self) -> str:
        """'tflite-runtime 2.5.0', as a sentence names it."""
        return f"{self.family} {self.version}"

    def cite(self) -> str:
        s = self.source
        return f"{s.get('file', '?')} at {s.get('repo', '?')}@{s.get('commit', '?')[:12]}"

    def top_version(self, op: str) -> int:
        """The highest version of `op` this release registers (0: none)."""
        return max(self.versions.get(op, ()), default=0)


@dataclass(frozen=True)
class Table:
    runtimes: dict[str, Runtime]
    codes: dict[str, int]  # op -> builtin code (ops the sources speak of)
    since: dict[str, list[str]]  # op -> first release of each version (runtime_version, corrected)
    sources: dict[str, dict[str, Any]]

    def family(self, family: str) -> list[Runtime]:
        """The family's releases, oldest first."""
        found = [r for r in self.runtimes.values() if r.family == family]
        return sorted(found, key=lambda r: version_key(r.version))


def _read_table_text() -> str:
    path = data_file("delegates", TABLE)
    if path is None:
        raise TflfuseError(f"delegates/{TABLE} is not installed with tflfuse (a broken install?)")
    return path.read_text(encoding="utf-8")


@functools.cache
def table() -> Table:
    """The parsed `delegates/runtimes.toml`."""
    raw = tomllib.loads(_read_table_text())
    ops = raw.get("ops", {})
    codes = {op: int(v["code"]) for op, v in ops.items()}
    since = {op: list(v["since"]) for op, v in ops.items()}
    for key, fix in raw.get("corrections", {}).items():  # measured on real interpreters
        op, _, number = key.rpartition(".")
        firsts = since.setdefault(op, [])
        firsts += [""] * (int(number) - len(firsts))
        firsts[int(number) - 1] = fix["since"]
    sources = raw.get("sources", {})
    runtimes = {}
    for name, entry in raw.get("runtimes", {}).items():
        family, _, version = name.partition("==")
        if entry["basis"] == "register":
            registered = raw["registered"][entry["registered"]]
            versions = {op: tuple(range(lo, hi + 1)) for op, (lo, hi) in registered.items()}
        else:
            key = version_key(entry["tflite"])
            versions = {
                op: tuple(
                    i + 1 for i, first in enumerate(firsts) if first and version_key(first) <= key
                )
                for op, firsts in since.items()
            }
            versions = {op: v for op, v in versions.items() if v}
        source = sources[entry["source"]]
        runtimes[name] = Runtime(
            name=name,
            family=family,
            version=version,
            basis=entry["basis"],
            source={k: str(source[k]) for k in ("repo", "commit", "file")},
            max_builtin_code=int(entry["max_builtin_code"]),
            custom_ops=frozenset(entry.get("custom_ops", ())),
            versions=versions,
            note=entry.get("note", ""),
        )
    return Table(runtimes, codes, since, sources)


def known_runtimes() -> list[str]:
    """Every runtime the table knows, family by family, oldest first."""
    t = table()
    return [r.name for family in FAMILIES for r in t.family(family)]


def resolve(spec: str | Runtime) -> Runtime:
    """The Runtime named by `spec` ('tflite-runtime==2.5.0', 'tflite_runtime 2.5',
    'ai-edge-litert==2.3', 'tensorflow==2.21'); a post or local release (2.5.0.post1) is its
    release. UsageError, one line, for a name the table does not know."""
    if isinstance(spec, Runtime):
        return spec
    match = _SPEC.fullmatch(str(spec))
    family = _ALIASES.get(match.group(1).lower()) if match else None
    if match is None or family is None:
        raise UsageError(
            f"runtime {spec!r} is not PACKAGE==VERSION (e.g. tflite-runtime==2.5.0,"
            " ai-edge-litert==2.3.0, tensorflow==2.21)"
        )
    wanted = version_key(match.group(2))
    releases = table().family(family)
    for runtime in releases:
        if version_key(runtime.version) == wanted:
            return runtime
    # a release between two known ones of this family (2.9.0 when only 2.9.1 is listed) is not
    # guessed: the user names one the table has
    known = ", ".join(r.version for r in releases)
    raise UsageError(f"runtime {spec!r}: no data for that {family} release (known: {known})")


# -- what a model needs ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Need:
    """One operator code of a model: what any op using it needs from the interpreter."""

    op: str  # builtin name, or "CUSTOM"
    code: int
    version: int
    custom: str | None = None
    count: int = 0
    first: tuple[int, int] = (0, 0)  # (subgraph, op index) of its first use
    declared: int = 0  # the version field, when its input type needs more (0: it says enough)

    @property
    def label(self) -> str:
        if self.custom is not None:
            return f"custom op {self.custom!r}"
        if self.declared:
            return (
                f"{self.op} v{self.version} (builtin {self.code}; the file says v{self.declared},"
                f" its input type needs v{self.version})"
            )
        return f"{self.op} v{self.version} (builtin {self.code})"


def needs(model: Model) -> list[Need]:
    """The operator codes the model's ops use, in order of first use (every subgraph): the
    version field the converter wrote, raised where the op's operands need more (the table's
    [versions], op_version.cc's rules, `ir.op_versions`: litert-quantizer writes version 1 for
    an int8 GELU)."""
    seen: dict[tuple, list] = {}
    for g_index, graph in enumerate(model.subgraphs):
        for o_index, op in enumerate(graph.ops):
            custom = op.custom_code if op.type == "CUSTOM" else None
            need = 0 if custom is not None else required(op)
            key = (op.type, max(op.version, need), custom, op.version if need > op.version else 0)
            if key in seen:
                seen[key][0] += 1
            else:
                seen[key] = [1, (g_index, o_index)]
    return [
        Need(t, OP_CODES.get(t, -1), v, c, count, first, declared)
        for (t, v, c, declared), (count, first) in seen.items()
    ]


# -- the check -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Finding:
    need: Need
    ok: bool
    reason: str = ""  # the interpreter's words when not ok (and what to do)
    highest: int = 0  # the highest version of the op the runtime has (0: none)
    delegate: str | None = None  # an op only a delegate resolves (edgetpu)

    def to_dict(self) -> JSONDict:
        n = self.need
        return {
            "op": n.custom if n.custom is not None else n.op,
            "builtin_code": n.code,
            "version": n.version,
            **({"version_field": n.declared} if n.declared else {}),
            "custom": n.custom is not None,
            "count": n.count,
            "first_use": {"subgraph": n.first[0], "op": n.first[1]},
            "ok": self.ok,
            "runtime_highest_version": self.highest,
            "reason": self.reason,
            **({"needs_delegate": self.delegate} if self.delegate else {}),
        }


@dataclass
class RuntimeCheck:
    """Whether `runtime` resolves every operator code of a model, op by op."""

    runtime: Runtime
    findings: list[Finding] = field(default_factory=list)
    source: str = ""

    @property
    def runtime_ok(self) -> bool:
        return all(f.ok for f in self.findings)

    @property
    def refused(self) -> list[Finding]:
        return [f for f in self.findings if not f.ok]

    def refusal(self) -> str:
        """One line: why the runtime refuses the model ('' when it does not)."""
        bad = self.refused
        if not bad:
            return ""
        first = bad[0]
        more = f" (and {len(bad) - 1} more op code{'s' if len(bad) > 2 else ''})" if bad[1:] else ""
        return f"{first.need.label} cannot run on {self.runtime.label}: {first.reason}{more}"

    def to_dict(self) -> JSONDict:
        r = self.runtime
        return {
            "runtime": r.name,
            "runtime_ok": self.runtime_ok,
            "basis": r.basis,
            "source": r.source,
            **({"note": r.note} if r.note else {}),
            "ops": [f.to_dict() for f in self.findings],
            "refusal": self.refusal() or None,
        }


def check_needs(
    items: Iterable[Need], runtime: Runtime | str, delegate: str | None = None
) -> RuntimeCheck:
    rt = resolve(runtime)
    return RuntimeCheck(rt, [_finding(n, rt, delegate) for n in items])


def check(model: Model, runtime: Runtime | str, delegate: str | None = None) -> RuntimeCheck:
    """Per operator code of `model`: does `runtime` resolve it, and if not, why (its words).
    `delegate="edgetpu"`: the Edge TPU delegate is loaded, so it resolves edgetpu-custom-op."""
    return check_needs(needs(model), runtime, delegate)


def _finding(n: Need, rt: Runtime, delegate: str | None = None) -> Finding:
    if n.custom is not None:
        if n.custom in rt.custom_ops:
            return Finding(n, True)
        if n.custom == EDGETPU_CUSTOM_OP and delegate == "edgetpu":
            return Finding(n, True, delegate="edgetpu")
        words = UNRESOLVED.format(name=n.custom)
        if n.custom == EDGETPU_CUSTOM_OP:
            return Finding(
                n,
                False,
                f"{words} (a compiled Edge TPU model: it runs only with the Edge TPU delegate,"
                " libedgetpu)",
                delegate="edgetpu",
            )
        return Finding(n, False, f"{words} (register it or load the delegate that provides it)")
    top = rt.top_version(n.op)
    if n.version in rt.versions.get(n.op, ()):
        return Finding(n, True, highest=top)
    if n.declared and n.declared in rt.versions.get(n.op, ()):
        first = _first_release(n.op, n.version)
        when = f" (TensorFlow Lite {first})" if first else ""
        return Finding(
            n,
            False,
            f"{rt.label} resolves {n.op} v{n.declared}, the version the file says, but its kernel"
            f" lacks the input type that needs v{n.version}{when}: it fails when the op runs",
            highest=top,
        )
    if n.code > rt.max_builtin_code or n.code < 0:
        words = OUT_OF_RANGE.format(code=n.code)
        why = f"{n.op} is newer than {rt.label}"
    else:
        words = NOT_FOUND.format(op=n.op, version=n.version)
        why = (
            f"{rt.label} has {n.op} up to version {top}"
            if top
            else f"{rt.label} has no {n.op} kernel"
        )
    first = _first_release(n.op, n.version)
    when = f"; first in TensorFlow Lite {first}" if first else ""
    return Finding(n, False, f"{words} ({why}{when})", highest=top)


def _first_release(op: str, version: int) -> str:
    firsts = table().since.get(op, ())
    return firsts[version - 1] if 0 < version <= len(firsts) else ""


def oldest(model: Model | Iterable[Need], delegate: str | None = None) -> dict[str, str | None]:
    """Per family, the oldest release the table knows that resolves every operator code of the
    model (None: no release of that family does). A compiled Edge TPU model is judged with the
    Edge TPU delegate loaded (nothing else runs it)."""
    items = needs(model) if isinstance(model, Model) else list(model)
    if delegate is None and any(n.custom == EDGETPU_CUSTOM_OP for n in items):
        delegate = "edgetpu"
    out: dict[str, str | None] = {}
    for family in FAMILIES:
        out[family] = next(
            (r.name for r in table().family(family) if check_needs(items, r, delegate).runtime_ok),
            None,
        )
    return out


def verdicts(model: Model, delegate: str | None = None) -> dict[str, str | None]:
    """{runtime name: None when it runs the model, else the one-line refusal} for every runtime
    in the table: what a device bundle carries so the device can refuse early without tflfuse."""
    items = needs(model)
    return {name: check_needs(items, name, delegate).refusal() or None for name in known_runtimes()}


def format_check(result: RuntimeCheck, source: str = "") -> str:
    """The human report: one line per operator code, then the verdict."""
    rt = result.runtime
    head = f"{source}: " if source else ""
    lines = [f"{head}runtime {rt.label} ({rt.basis}: {rt.cite()})"]
    for f in result.findings:
        n = f.need
        mark = "ok " if f.ok else "NO "
        what = n.label
        uses = f"{n.count} op{'s' if n.count != 1 else ''}"
        tail = "" if f.ok else f"  {f.reason}"
        lines.append(f"  {mark} {what:<40} {uses:>7}{tail}")
    if result.runtime_ok:
        lines.append(f"runtime_ok: {rt.label} resolves every op of this model")
    else:
        lines.append(f"runtime_ok: no: {result.refusal()}")
    if rt.note:
        lines.append(f"note: {rt.note}")
    return "\n".join(lines)


def format_oldest(found: dict[str, str | None]) -> str:
    """One line: the oldest release of each family that runs the model."""
    parts = [
        f"{fam} {name.partition('==')[2]}" if name else f"no {fam} release"
        for fam, name in found.items()
    ]
    return "oldest runtime that runs it: " + ", ".join(parts)


def describe(
    model: Model, runtime: str | Runtime | None, source: str = "", delegate: str | None = None
) -> tuple[str, dict]:
    """(text, JSON-ready dict) of `tflfuse check --runtime`: the per-op check against `runtime`,
    or without one the oldest release of each family that runs the model."""
    found = oldest(model, delegate)
    payload: dict[str, Any] = {"oldest_runtime": found}
    if runtime is None:
        items = needs(model)
        lines = [f"{source}: {len(items)} operator codes" if source else "operator codes:"]
        lines += [f"  {n.label:<40} {n.count:>5} op{'s' if n.count != 1 else ''}" for n in items]
        lines.append(format_oldest(found))
        if any(n.custom == EDGETPU_CUSTOM_OP for n in items):
            lines[-1] += " (with the Edge TPU delegate, libedgetpu, which runs edgetpu-custom-op)"
        payload["ops"] = [
            {"op": n.custom or n.op, "builtin_code": n.code, "version": n.version} for n in items
        ]
        return "\n".join(lines), payload
    result = check(model, runtime, delegate)
    payload.update(result.to_dict())
    return format_check(result, source) + "\n" + format_oldest(found), payload
