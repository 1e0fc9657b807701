"""The type of what tflfuse writes as JSON: reports, records' `to_dict()`, benchmark results,
bundle manifests, sweep rows.

A value the standard `json` module writes: None, a bool, a number, a string, a sequence of values
(a list or a tuple) or a mapping from strings to values. The containers are the read-only
`Sequence` and `Mapping`, so that a `list[JSONDict]` is a JSON value as it is, and a
TypedDict of such values (e.g. `ir.summary`'s) too. The device floor
reads it for the type checker only (`if TYPE_CHECKING:`): a bundle does not ship it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    # (a mapping's values are `object` to the checker: a TypedDict is a Mapping[str, object] only)
    JSON: TypeAlias = bool | int | float | str | Sequence["JSON"] | Mapping[str, object] | None
else:  # at run time (typing.get_type_hints) without the self-reference, which it cannot resolve
    JSON: TypeAlias = bool | int | float | str | Sequence[object] | Mapping[str, object] | None
JSONDict: TypeAlias = dict[str, JSON]  # a `to_dict()`: a fresh dict its caller may extend
