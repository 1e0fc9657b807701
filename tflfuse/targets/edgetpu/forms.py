"""The form of one op as `edgetpu_compiler` sees it, and what compiled models show of each form.

The op table (`delegates/edgetpu.toml`) says which op *types* map; whether a given *form* of a type
maps (a MUL of two activations broadcast against each other, a SUM over the innermost axis, a
SOFTMAX over many rows, a depthwise conv with depth_multiplier 2) is a separate question, and only
a compiled model can answer it. This module names forms and answers it from
`delegates/edgetpu_forms.toml`, the table `benchmarks/edgetpu_forms.py` writes from compiled pairs
and twins.

Stable API (other modules and helpers build on it):

- `form_of(op, as_quantized=False) -> Form`: op type; per input its kind ("a" activation, "c"
  constant) and data type, with for binary elementwise ops (`BINARY`) and BROADCAST_TO / TILE the
  broadcast pattern over the output's non-trivial dimensions; the output's data type; and
  `detail`, the op's own part of the form (`Form` documents each). `as_quantized` judges a float op
  as it will be once quantized (float tensors read as INT8, a conv's or FC's bias as INT32): what
  a legalization that writes into a float graph asks.
- `size_of(op) -> Size`: elements of the largest activation and of its two innermost dimensions.
- `FormTable` (`load_table()`; `FormTable.from_dict` / `to_toml` round-trip): per form, how many
  compiled models map it and how many refuse it on their own, the largest sizes seen mapped and
  the smallest seen refused, and the sources.
- `gate(op, table=None, as_quantized=False) -> Verdict`: "mapped" (form and size covered by a
  mapped example), "refused" (form seen refused on its own at this size or smaller, never mapped
  as large), or "undecided" (no compiled model shows it).
- `gated(form) -> bool`: whether the Edge TPU predictor consults the gate for that form (the forms
  of issue 25: see `gated`); `gate` answers for any op.
- `shown_sizes(form, table=None) -> list[Size]`: the largest sizes seen mapped (to chunk to).
- `observe_pair` / `observe_twin`: what one compiled model shows (the table's input).

Non-trivial dimensions are those of size > 1, in order; a pattern string has one letter per
non-trivial dimension of the tensor it describes, outermost first. No TensorFlow here.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

import numpy as np

from tflfuse.errors import TflfuseError
from tflfuse.ir import Op, Tensor
from tflfuse.json_types import JSONDict
from tflfuse.targets.capabilities import (
    FLOAT_TYPES,
    CapabilityTable,
    _axes,
    _const_ints,
    capability,
    op_label,
)

BINARY = frozenset(
    {
        "ADD",
        "SUB",
        "MUL",
        "DIV",
        "MAXIMUM",
        "MINIMUM",
        "SQUARED_DIFFERENCE",
        "POW",
        "FLOOR_DIV",
        "FLOOR_MOD",
    }
)
REDUCTIONS = frozenset({"MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"})
EIGHT_BIT = frozenset({"INT8", "UINT8"})
ANSWERS = ("mapped", "refused", "undecided")


@dataclass(frozen=True)
class Form:
    """One op's form. `operands`: per input tensor "a:DTYPE" or "c:DTYPE" (activation or
    constant), with "[pattern]" for binary elementwise ops, BROADCAST_TO and TILE: one letter per
    non-trivial output dimension, "x" where the operand spans it, "1" where it is broadcast, "t"
    where it is tiled. `output`: the output data types. `detail`:

    - binary: "same" (no operand broadcast), "scalar" (one operand is a single value),
      "one-sided" (one operand broadcast), "two-sided" (each operand broadcast somewhere)
    - reductions: "axes=PATTERN" over the input's non-trivial dims, "r" reduced, "k" kept (so
      "kkr" reduces the innermost, "rrk" a plane), then " keep" when keep_dims
    - SOFTMAX: "nt=N" non-trivial input dims and "last=x|1" (whether the softmax axis is one)
    - DEPTHWISE_CONV_2D: "dm=N"; CONV_2D: "k=HxW"
    - TRANSPOSE: "perm=P", the permutation restricted to the non-trivial dims, renumbered
    - RESHAPE: "nt=I>O" non-trivial dims in and out, and "squeeze" when only size-1 dims move
    - CONCATENATION / PACK: "n=N axis=inner|middle|outer|trivial" over the output's non-trivial dims
    - RESIZE_*: "f=HxW" (output/input per axis) and " align" / " half" for the two options
    """

    op: str
    operands: tuple[str, ...]
    output: str
    detail: str = ""

    @property
    def key(self) -> str:
        """The form as one line: `MUL(a:INT8[xxx], a:INT8[11x]) -> INT8 one-sided`."""
        text = f"{self.op}({', '.join(self.operands)}) -> {self.output}"
        return f"{text} {self.detail}" if self.detail else text

    def eight_bit(self) -> Form:
        """The same form with INT8 and UINT8 not told apart (the Edge TPU computes both)."""

        def one(text: str) -> str:
            return text.replace("UINT8", "INT8")

        return Form(self.op, tuple(one(o) for o in self.operands), one(self.output), self.detail)

    def matching(self) -> Form:
        """What the evidence is looked up by: `eight_bit`, and a reduction's keep_dims dropped.
        keep_dims adds only size-1 dimensions to the output, so the reduction over the same
        non-trivial dims is the same computation either way (a MEAN over the plane of
        [1, 7, 7, 1280] mapped without keep_dims stands for one that keeps them)."""
        form = self.eight_bit()
        if self.op in REDUCTIONS and form.detail.endswith(" keep"):
            return Form(form.op, form.operands, form.output, form.detail.removesuffix(" keep"))
        return form


@dataclass(frozen=True, order=True)
class Size:
    """How big an op is: elements of its largest activation, and of the largest activation's two
    innermost dimensions (the compiler's row limit counts those)."""

    elements: int
    inner: int

    def covers(self, other: Size) -> bool:
        return self.elements >= other.elements and self.inner >= other.inner


def _nontrivial(shape: Iterable[int]) -> list[int]:
    return [i for i, d in enumerate(shape) if d > 1]


_BIAS_AT = {"CONV_2D": 2, "DEPTHWISE_CONV_2D": 2, "FULLY_CONNECTED": 2, "TRANSPOSE_CONV": 3}


def _dtype(t: Tensor, as_quantized: bool, bias: bool = False) -> str:
    """`t`'s data type; `as_quantized` gives a float tensor the type quantization gives it (INT8;
    a float bias of a conv or FC: INT32)."""
    if as_quantized and t.dtype in FLOAT_TYPES:
        return "INT32" if bias and t.is_constant else "INT8"
    return t.dtype


def _kind(t: Tensor, as_quantized: bool, bias: bool = False) -> str:
    return f"{'c' if t.is_constant else 'a'}:{_dtype(t, as_quantized, bias)}"


def broadcast_pattern(operand: Iterable[int], output: Iterable[int]) -> str:
    """ "x"/"1"/"t" per non-trivial dimension of `output`, the operand right-aligned against it."""
    out = list(output)
    shape = [1] * (len(out) - len(list(operand))) + list(operand)
    letters = []
    for i in _nontrivial(out):
        d = shape[i] if i < len(shape) else 1
        letters.append("x" if d == out[i] else "1" if d == 1 else "t")
    return "".join(letters)


def _binary_detail(patterns: list[str], operands: list[Tensor]) -> str:
    if all("1" not in p and "t" not in p for p in patterns):
        return "same"
    if any(t.size == 1 for t in operands):
        return "scalar"
    sided = sum(1 for p in patterns if "1" in p or "t" in p)
    return "two-sided" if sided > 1 else "one-sided"


def _axis_kind(axis: int, dims: list[int]) -> str:
    if axis not in dims:
        return "trivial"
    at = dims.index(axis)
    return "inner" if at == len(dims) - 1 else "outer" if at == 0 else "middle"


def _detail(op: Op) -> str:
    """The op's own part of its form (see `Form`)."""
    x = op.inputs[0] if op.inputs and op.inputs[0] is not None else None
    out = op.outputs[0] if op.outputs and op.outputs[0] is not None else None
    t = op.type
    if t in REDUCTIONS and x is not None:
        axes = _axes(op)
        if axes is None:
            return "axes=?"
        pattern = "".join("r" if i in axes else "k" for i in _nontrivial(x.shape))
        return f"axes={pattern}" + (" keep" if op.options.get("keep_dims") else "")
    if t == "SOFTMAX" and x is not None:
        last = "x" if x.shape and x.shape[-1] > 1 else "1"
        return f"nt={len(_nontrivial(x.shape))} last={last}"
    if t == "DEPTHWISE_CONV_2D":
        return f"dm={int(op.options.get('depth_multiplier', 1) or 1)}"
    if t == "CONV_2D" and len(op.inputs) > 1 and op.inputs[1] is not None:
        w = op.inputs[1].shape
        return f"k={w[1]}x{w[2]}" if len(w) == 4 else ""
    if t == "TRANSPOSE" and x is not None:
        perm = _const_ints(op.inputs[1] if len(op.inputs) > 1 else None)
        if perm is None:
            return "perm=?"
        dims = _nontrivial(x.shape)
        return "perm=" + "".join(str(dims.index(p)) for p in perm if p in dims)
    if t == "RESHAPE" and x is not None and out is not None:
        a, b = (
            [x.shape[i] for i in _nontrivial(x.shape)],
            [out.shape[i] for i in _nontrivial(out.shape)],
        )
        return f"nt={len(a)}>{len(b)}" + (" squeeze" if a == b else "")
    if t in ("CONCATENATION", "PACK") and out is not None:
        axis = int(op.options.get("axis", 0)) % max(1, len(out.shape))
        n = sum(1 for i in op.inputs if i is not None)
        return f"n={n} axis={_axis_kind(axis, _nontrivial(out.shape))}"
    if t.startswith("RESIZE_") and x is not None and out is not None and len(x.shape) == 4:
        f = [out.shape[i] / max(1, x.shape[i]) for i in (1, 2)]
        text = "f=" + "x".join(f"{v:g}" for v in f)
        text += " align" if op.options.get("align_corners") else ""
        return text + (" half" if op.options.get("half_pixel_centers") else "")
    return ""


def form_of(op: Op, as_quantized: bool = False) -> Form:
    """The form of `op` (see `Form`); `as_quantized` reads float tensors as quantization will
    write them (INT8; a conv's or FC's float bias INT32), for ops written into a float graph."""
    ins = [t for t in op.inputs if t is not None]
    outs = [t for t in op.outputs if t is not None]
    out_shape = outs[0].shape if outs else ()
    at = _BIAS_AT.get(op.type)
    bias = op.inputs[at] if at is not None and len(op.inputs) > at else None
    operands = [_kind(t, as_quantized, t is bias) for t in ins]
    detail = _detail(op)
    if op.type in BINARY and len(ins) == 2:
        patterns = [broadcast_pattern(t.shape, out_shape) for t in ins]
        operands = [f"{k}[{p}]" for k, p in zip(operands, patterns)]
        detail = _binary_detail(patterns, ins)
    elif op.type in ("BROADCAST_TO", "TILE") and ins:
        operands[0] += f"[{broadcast_pattern(ins[0].shape, out_shape)}]"
    elif op.type in ("CONCATENATION", "PACK"):
        operands = sorted(set(operands))
    output = ",".join(_dtype(t, as_quantized) for t in outs)
    return Form(op_label(op), tuple(operands), output, detail)


def size_of(op: Op) -> Size:
    """`Size` of `op` over its activations (inputs and outputs that are not constants)."""
    acts = [t for t in (*op.inputs, *op.outputs) if t is not None and not t.is_constant]
    if not acts:
        return Size(0, 0)
    biggest = max(acts, key=lambda t: t.size)
    inner = max(int(np.prod(t.shape[-2:])) if t.shape else 1 for t in acts)
    return Size(int(biggest.size), int(inner))


def gated(form: Form) -> bool:
    """Whether the Edge TPU predictor asks compiled evidence about this form before counting it
    mapped (issue 25: the forms attention and big heads need, which few compiled models show):
    binary elementwise ops of two activations broadcast against each other; every reduction;
    SOFTMAX over more than one non-trivial dimension; DEPTHWISE_CONV_2D with depth_multiplier
    > 1; TILE and BROADCAST_TO; TRANSPOSE; RESHAPE between tensors of 2 or more non-trivial
    dimensions that moves them (head splits and merges; a flatten to one dimension is not
    gated); RESIZE_BILINEAR with half_pixel_centers (one compiled model maps it, at 64 channels
    and fewer; one refuses it at 1280, by a compiler whose version its twin does not tell: the
    sky-detection UNet, see "Not decided" in delegates/edgetpu.toml); L2_NORMALIZATION (listed
    by Coral's documentation; no compiled model shows it, so it is undecided)."""
    if form.op in BINARY:
        acts = [o for o in form.operands if o.startswith("a:")]
        return len(acts) >= 2 and form.detail not in ("same", "")
    if form.op in REDUCTIONS or form.op in ("TILE", "BROADCAST_TO", "TRANSPOSE"):
        return True
    if form.op == "SOFTMAX":
        return not form.detail.startswith(("nt=0", "nt=1"))
    if form.op == "DEPTHWISE_CONV_2D":
        return form.detail != "dm=1"
    if form.op == "RESIZE_BILINEAR":
        return form.detail.endswith(" half")
    if form.op == "L2_NORMALIZATION":  # in Coral's op list; no compiled model shows it mapped
        return True
    if form.op == "RESHAPE":  # a head split or merge: both sides keep 2+ non-trivial dims
        nt = form.detail.split()[0].removeprefix("nt=").split(">")
        return "squeeze" not in form.detail and min(int(n) for n in nt) >= 2
    return False


def _frontier(sizes: Iterable[Size], *, largest: bool) -> list[Size]:
    """The sizes no other dominates: the largest (mapped) or the smallest (refused)."""
    found = sorted(set(sizes), reverse=largest)
    keep: list[Size] = []
    for s in found:
        if largest and any(k.covers(s) for k in keep):
            continue
        if not largest and any(s.covers(k) for k in keep):
            continue
        keep.append(s)
    return sorted(keep)


class _FormRow(TypedDict):
    op: str
    operands: list[str]
    output: str


class FormRow(_FormRow, total=False):
    """One `[[form]]` of delegates/edgetpu_forms.toml (`FormEntry.to_dict` writes it)."""

    key: str  # Form.key (`from_dict` rebuilds it from the fields)
    detail: str
    mapped: int
    refused: int
    mapped_sizes: list[list[int]]  # [elements, inner] per compiled size
    refused_sizes: list[list[int]]
    sources: list[str]


@dataclass
class FormEntry:
    """What compiled models show of one form: `mapped` / `refused` count the compiled models
    (not ops) mapping it / refusing it on their own; `mapped_sizes` are the largest sizes seen
    mapped (none dominating another), `refused_sizes` the smallest seen refused; `sources` name
    where (licensed pairs by folder, local-only sets by count)."""

    form: Form
    mapped: int = 0
    refused: int = 0
    mapped_sizes: list[Size] = field(default_factory=list)
    refused_sizes: list[Size] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def to_dict(self) -> JSONDict:
        return {
            "key": self.form.key,
            "op": self.form.op,
            "operands": list(self.form.operands),
            "output": self.form.output,
            "detail": self.form.detail,
            "mapped": self.mapped,
            "refused": self.refused,
            "mapped_sizes": [[s.elements, s.inner] for s in self.mapped_sizes],
            "refused_sizes": [[s.elements, s.inner] for s in self.refused_sizes],
            "sources": list(self.sources),
        }

    @classmethod
    def from_dict(cls, d: FormRow) -> FormEntry:
        form = Form(d["op"], tuple(d["operands"]), d["output"], d.get("detail", ""))
        return cls(
            form,
            int(d.get("mapped", 0)),
            int(d.get("refused", 0)),
            [Size(int(e), int(i)) for e, i in d.get("mapped_sizes", [])],
            [Size(int(e), int(i)) for e, i in d.get("refused_sizes", [])],
            list(d.get("sources", [])),
        )


@dataclass
class FormTable:
    """Forms by key (`Form.key`), each with what compiled models show of it."""

    entries: dict[str, FormEntry] = field(default_factory=dict)
    header: str = ""
    # (number of entries it was built from, {8-bit key: entries}): `lookup`'s index
    _index: tuple[int, dict[str, list[FormEntry]]] | None = field(
        default=None, repr=False, compare=False
    )

    @classmethod
    def from_dict(cls, d: CapabilityTable) -> FormTable:
        entries = [FormEntry.from_dict(cast(FormRow, e)) for e in d.get("form", [])]
        return cls({e.form.key: e for e in entries})

    def lookup(self, form: Form) -> list[FormEntry]:
        """The entry of `form`, and those of the same form in the other 8-bit type or with the
        other keep_dims (`Form.matching`)."""
        if self._index is None or self._index[0] != len(self.entries):
            index: dict[str, list[FormEntry]] = {}
            for e in self.entries.values():
                index.setdefault(e.form.matching().key, []).append(e)
            self._index = (len(self.entries), index)
        exact = self.entries.get(form.key)
        same = [e for e in self._index[1].get(form.matching().key, []) if e is not exact]
        return ([exact] if exact else []) + same

    def to_toml(self) -> str:
        """The table as TOML (`header` as leading comment lines), forms sorted by key."""
        lines = [f"# {h}".rstrip() for h in self.header.splitlines()]
        for key in sorted(self.entries):
            e = self.entries[key].to_dict()
            lines += ["", "[[form]]"]
            for name, value in e.items():
                lines.append(f"{name} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)


@functools.cache
def load_table() -> FormTable:
    """`delegates/edgetpu_forms.toml`, parsed once (an empty table when it is absent)."""
    try:
        return FormTable.from_dict(capability("edgetpu_forms"))
    except TflfuseError:  # no table installed: every gated form is undecided
        return FormTable()


def shown_sizes(form: Form, table: FormTable | None = None) -> list[Size]:
    """The largest sizes at which compiled models show `form` mapped (INT8 and UINT8 alike; none
    dominating another, sorted): what a rewrite that chunks an op can size its pieces to."""
    table = table if table is not None else load_table()
    return _frontier((s for e in table.lookup(form) for s in e.mapped_sizes), largest=True)


@dataclass(frozen=True)
class Verdict:
    """The gate's answer for one op: `answer` in ANSWERS, the form and size asked about, and a
    sentence saying what the evidence shows."""

    answer: str
    form: Form
    size: Size
    reason: str


def gate(op: Op, table: FormTable | None = None, as_quantized: bool = False) -> Verdict:
    """Whether compiled models show `op`'s form mapped at its size (see the module's doc).

    "mapped": an entry of the form (INT8 and UINT8 alike) has a mapped size covering the op's;
    "refused": none does, and a compiled model refused the form on its own at a size the op's
    covers; "undecided" otherwise."""
    table = table if table is not None else load_table()
    form, size = form_of(op, as_quantized), size_of(op)
    entries = table.lookup(form)
    shown = f"{size.elements} elements, {size.inner} in the two innermost dims"
    mapped = [s for e in entries for s in e.mapped_sizes if s.covers(size)]
    if mapped:
        models = sum(e.mapped for e in entries)
        return Verdict(
            "mapped", form, size, f"{form.key}: shown mapped by {models} compiled models"
        )
    refused = [s for e in entries for s in e.refused_sizes if size.covers(s)]
    if refused:
        s = min(refused)
        return Verdict(
            "refused",
            form,
            size,
            f"{form.key}: a compiled model refuses it on its own at {s.elements} elements"
            f" ({shown} here)",
        )
    if entries and any(e.mapped_sizes for e in entries):
        top = max(s for e in entries for s in e.mapped_sizes)
        why = (
            f"shown mapped only up to {top.elements} elements ({top.inner} innermost); {shown} here"
        )
    else:
        why = "no compiled model shows it mapped"
    return Verdict("undecided", form, size, f"{form.key}: {why}")


# -- what a compiled model shows ----------------------------------------------------------------
@dataclass(frozen=True)
class Observation:
    """One op of a compiled model: its form and size, and its outcome: "mapped", "accepted" (left
    on the CPU with the after-the-cut status: the compiler took it on its own) or "refused" (on
    its own)."""

    index: int
    form: Form
    size: Size
    outcome: str


LogRows = Iterable[tuple[str, int, str]]  # (op type, count, status) of a compiler's `-s` log


def _log_outcomes(cpu: dict[int, Op], log_rows: LogRows | None) -> dict[int, str]:
    """What the compiler's own log says of the ops left on the CPU, where it says it of every op
    of a type: all of them with the after-the-cut status ("More than one subgraph is not
    supported": accepted on their own, "accepted"), or all with a refusal status ("refused").
    Mixed statuses of one type tell nothing per op."""
    if not log_rows:
        return {}
    status = capability("edgetpu")["status"]
    after, mapped = status["after_cut"], status["mapped"]
    rows: dict[str, dict[str, int]] = {}
    for op_type, count, text in log_rows:
        rows.setdefault(op_type, {}).setdefault(text, 0)
        rows[op_type][text] += count
    out: dict[int, str] = {}
    for op_type in {op_label(op) for op in cpu.values()}:
        mine = [i for i, op in cpu.items() if op_label(op) == op_type]
        seen = {k: v for k, v in rows.get(op_type, {}).items() if k != mapped}
        if set(seen) == {after} and seen[after] == len(mine):
            out.update({i: "accepted" for i in mine})
        elif seen and after not in seen and sum(seen.values()) == len(mine):
            out.update({i: "refused" for i in mine})
    return out


def observe_pair(
    ops: list[Op],
    cpu_ops: Iterable[int],
    graph_inputs: Iterable[Tensor],
    log_rows: LogRows | None = None,
) -> list[Observation]:
    """What a CPU model and its compiled twin show, given the indices of the ops the compiler left
    on the CPU (`tflfuse.targets.edgetpu.truth.Truth.cpu_ops`): every other op maps; an op left on
    the CPU is refused *on its own* when every activation it reads is a model input or the output
    of a mapped op, one at least a mapped op's (nothing on the CPU could have cut it). Where the
    compiler's log gives every CPU op of a type one status (`_log_outcomes`), that decides:
    "accepted" (on its own, cut by another) or "refused". The other CPU ops tell nothing."""
    cpu = set(cpu_ops)
    made_by = {id(t): i for i, op in enumerate(ops) for t in op.outputs if t is not None}
    inputs = {id(t) for t in graph_inputs}
    logged = _log_outcomes({i: ops[i] for i in cpu}, log_rows)
    found = []
    for i, op in enumerate(ops):
        outcome = "mapped" if i not in cpu else logged.get(i)
        if outcome is None:
            reads = [t for t in op.inputs if t is not None and not t.is_constant]
            own = all(id(t) in inputs or made_by.get(id(t), i) not in cpu for t in reads)
            outcome = "refused" if own and any(id(t) in made_by for t in reads) else None
        if outcome:
            found.append(Observation(i, form_of(op), size_of(op), outcome))
    return found


def observe_twin(
    ops: list[Op],
    custom_code: str,
    graph_inputs: Iterable[Tensor] = (),
    log_rows: LogRows | None = None,
) -> list[Observation]:
    """What a compiled model shows without its source: an op outside the Edge TPU custom ops
    whose activations all come from a custom op or a model input, one at least from a custom op,
    was refused on its own (the compiler copies such ops unchanged, tensors included); with the
    compiler's log, `_log_outcomes` decides where it can. The mapped ops are inside the package,
    unseen."""
    custom = {id(t) for op in ops if op.custom_code == custom_code for t in op.outputs if t}
    inputs = {id(t) for t in graph_inputs}
    outside = {i: op for i, op in enumerate(ops) if op.custom_code != custom_code}
    logged = _log_outcomes(outside, log_rows)
    found = []
    for i, op in outside.items():
        reads = [t for t in op.inputs if t is not None and not t.is_constant]
        own = any(id(t) in custom for t in reads) and all(
            id(t) in custom or id(t) in inputs for t in reads
        )
        outcome = logged.get(i, "refused" if own else None)
        if outcome:
            found.append(Observation(i, form_of(op), size_of(op), outcome))
    return found
