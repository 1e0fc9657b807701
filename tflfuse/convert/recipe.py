"""Conversion recipes: one TOML per target in `converters/` (or any file a user names).

A recipe says how `tflfuse convert` turns a model into a deployable .tflite for one target: the
rule pipeline, the quantization mode and I/O types, how calibration images are preprocessed, the
Grappler optimizers, and the delegate the result is checked against. Command-line flags override
single fields (`Recipe.override`). No TensorFlow here.

Every recipe is checked against `SCHEMA` (the TOML layout) before it is used: an unknown key (a
typo such as `[quantisation]`) or a value of the wrong type (`scale = "big"`) is a one-line error
naming the file and the key, never a silent default or a traceback. An override's error names the
override (the CLI passes its flag names as `labels`, so `--samples 0` is blamed on `--samples`).
"""

from __future__ import annotations

import difflib
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tflfuse.errors import TflfuseError
from tflfuse.json_types import JSONDict
from tflfuse.resources import Traversable, data_dir, data_names
from tflfuse.targets import TARGETS, XNNPACK, Target, find
from tflfuse.targets.runtimes import resolve

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

QUANT_MODES = ("int8", "float16", "dynamic", "none")
IO_TYPES = ("float32", "int8", "uint8")
GRAPPLER_OPTIMIZERS = (
    "constfold",
    "arithmetic",
    "dependency",
    "common_subgraph_elimination",
    "shape",
    "debug_stripper",
    "pruning",
    "layout",
    "loop",
    "function",
)
DEFAULT_GRAPPLER = (
    "constfold",
    "dependency",
    "common_subgraph_elimination",
    "shape",
    "debug_stripper",
    "pruning",
)

# TF (Flex) ops: the converter can keep them, but no model with them can be verified here (the
# interpreter tflfuse checks with has no Flex kernels), quantized by litert-quantizer, run by
# XNNPACK, the Edge TPU or the GPU delegate, or by tflite_runtime on a device. So a recipe may
# only say `select_tf_ops = false`; the field stays so existing recipe files keep loading.
_NO_FLEX = (
    "tflfuse converts to TFLite builtin ops only (TF/Flex ops cannot be verified, quantized or"
    " run by the target runtimes); set it to false"
)

# The TOML layout: key -> Recipe field, or a table of such keys.
SCHEMA: dict[str, Any] = {
    "name": "name",
    "description": "description",
    "target": "target",
    "delegate": "delegate",
    "level": "level",
    "runtime": "runtime",
    "quantization": {
        "mode": "quant_mode",
        "input_type": "input_type",
        "output_type": "output_type",
        "samples": "samples",
    },
    "calibration": {"scale": "scale", "offset": "offset"},
    "grappler": {"optimizers": "grappler"},
    "converter": {"select_tf_ops": "select_tf_ops"},
    "legalization": {"attention_sum_after_int8": "attention_sum_after_int8"},
}
# Recipe field -> its TOML key, as error messages name it ("quantization.samples").
TOML_KEYS: dict[str, str] = {}
for _key, _value in SCHEMA.items():
    if isinstance(_value, dict):
        TOML_KEYS.update({f: f"{_key}.{k}" for k, f in _value.items()})
    else:
        TOML_KEYS[_value] = _key

# Recipe field -> the kind of value it holds (checked for files and overrides alike).
_STRING, _INTEGER, _NUMBER, _BOOLEAN, _STRINGS = (
    "a string",
    "an integer",
    "a number",
    "true or false",
    "a list of strings",
)
KINDS: dict[str, str] = {
    "name": _STRING,
    "description": _STRING,
    "target": _STRING,
    "delegate": _STRING,
    "level": _INTEGER,
    "quant_mode": _STRING,
    "input_type": _STRING,
    "output_type": _STRING,
    "samples": _INTEGER,
    "scale": _NUMBER,
    "offset": _NUMBER,
    "grappler": _STRINGS,
    "select_tf_ops": _BOOLEAN,
    "runtime": _STRING,
    "attention_sum_after_int8": _BOOLEAN,
}


def _is_kind(value: Any, kind: str) -> bool:
    if kind == _STRING:
        return isinstance(value, str)
    if kind == _INTEGER:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == _BOOLEAN:
        return isinstance(value, bool)
    return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)


def _describe(value: Any) -> str:
    """'a string ("big")': what a wrong value is, for an error message."""
    if isinstance(value, bool):
        kind = "a boolean"
    elif isinstance(value, int):
        kind = "an integer"
    elif isinstance(value, float):
        kind = "a number"
    elif isinstance(value, str):
        kind = "a string"
    elif isinstance(value, dict):
        return "a table"
    elif isinstance(value, (list, tuple)):
        kind = "a list"
    else:
        kind = type(value).__name__
    text = repr(value)
    return f"{kind} ({text if len(text) <= 40 else text[:37] + '...'})"


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"


class RecipeError(TflfuseError):
    """A recipe key or override with a wrong name, type or value (one line, naming the key)."""


@dataclass(frozen=True)
class Recipe:
    """Every field a conversion needs; `converters/NAME.toml` fills it, flags override it."""

    name: str
    description: str = ""
    target: Target = XNNPACK  # TOML names it: resolved when the recipe is made (__post_init__)
    delegate: str = "xnnpack"
    level: int = 2
    quant_mode: str = "int8"
    input_type: str = "float32"
    output_type: str = "float32"
    samples: int = 100
    scale: float = 2.0  # folder images: x / 255 * scale + offset
    offset: float = -1.0
    grappler: tuple[str, ...] = DEFAULT_GRAPPLER
    select_tf_ops: bool = False
    runtime: str = ""  # "tflite-runtime==2.5.0": write only op versions that release has
    # int8 follows: the attention's sums are float SUMs, DEPTHWISE_CONV_2D once quantized
    # (`Rule.float_form_waits_for_int8`, tflfuse.targets.edgetpu.sumconv)
    attention_sum_after_int8: bool = False
    source: str = ""
    overridden: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        found = find(self.target)  # a name from the TOML or an override (validate refuses others)
        if found is not None:
            object.__setattr__(self, "target", found)

    def override(self, labels: Mapping[str, str] | None = None, **values: object) -> Recipe:
        """A copy with the given fields replaced (None means 'keep the recipe's value').
        `labels` names each field as the caller's user knows it (e.g. {"samples": "--samples"})
        for error messages; by default an override is named by its field."""
        known = {f.name for f in fields(self)} - {"source", "overridden"}
        # (as given: `validate` below refuses a value of the wrong kind, naming its key)
        changes: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise RecipeError(
                f"unknown recipe field {unknown[0]!r} (fields: {', '.join(sorted(known))})"
            )
        if isinstance(changes.get("grappler"), list):
            changes["grappler"] = tuple(changes["grappler"])
        out = replace(self, **changes, overridden=tuple(sorted({*self.overridden, *changes})))
        out.validate(labels)
        return out

    def _where(self, name: str, labels: Mapping[str, str] | None) -> str:
        """How an error names field `name`: the override that set it, else FILE: toml.key."""
        if name in self.overridden:
            return (labels or {}).get(name, name)
        return f"{self.source or self.name}: {TOML_KEYS.get(name, name)}"

    def validate(self, labels: Mapping[str, str] | None = None) -> None:
        """Raise RecipeError (naming the key or the override) unless every field is usable."""

        def fail(name: str, problem: str) -> RecipeError:
            return RecipeError(f"{self._where(name, labels)} {problem}")

        for name, kind in KINDS.items():
            value = getattr(self, name)
            value = value.name if isinstance(value, Target) else value
            if not _is_kind(value, kind):
                raise fail(name, f"must be {kind}, not {_describe(value)}")
        for name in ("scale", "offset"):  # image calibration: x / 255 * scale + offset
            if not math.isfinite(getattr(self, name)):
                raise fail(name, f"must be a finite number, not {getattr(self, name)}")
        if self.scale == 0:
            raise fail("scale", "must not be 0 (every image would calibrate as one constant)")
        if self.quant_mode not in QUANT_MODES:
            raise fail(
                "quant_mode",
                f"{self.quant_mode!r} is not a quantization mode (choose from"
                f" {', '.join(QUANT_MODES)})",
            )
        for kind in ("input_type", "output_type"):
            value = getattr(self, kind)
            if value not in IO_TYPES:
                raise fail(
                    kind, f"{value!r} is not an I/O type (choose from {', '.join(IO_TYPES)})"
                )
        for kind in ("input_type", "output_type"):
            value = getattr(self, kind)
            if value != "float32" and self.quant_mode != "int8":
                if kind not in self.overridden and "quant_mode" in self.overridden:
                    raise fail(
                        "quant_mode",
                        f"{self.quant_mode}: the recipe's {TOML_KEYS[kind]} {value} needs"
                        " quantization mode int8 (override it to float32 too)",
                    )
                raise fail(kind, f"{value} needs quantization mode int8, not {self.quant_mode}")
        if not isinstance(self.target, Target):
            raise fail(
                "target", f"{self.target!r} is not a target (choose from {', '.join(TARGETS)})"
            )
        if self.select_tf_ops:
            raise fail("select_tf_ops", f"is not supported: {_NO_FLEX}")
        bad = [o for o in self.grappler if o not in GRAPPLER_OPTIMIZERS]
        if bad:
            raise fail(
                "grappler",
                f"names Grappler optimizer {bad[0]!r}, which is unknown or not allowed"
                f" (allowed: {', '.join(GRAPPLER_OPTIMIZERS)})",
            )
        if self.samples < 1:
            raise fail("samples", f"must be at least 1, not {self.samples}")
        if self.runtime:
            try:
                resolve(self.runtime)
            except TflfuseError as exc:
                problem = str(exc).removeprefix(f"runtime {self.runtime!r}: ")
                raise fail("runtime", f"{self.runtime!r}: {problem}") from None
        if self.level not in (0, 1, 2):
            raise fail("level", f"must be 0, 1 or 2, not {self.level}")

    def to_dict(self) -> JSONDict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["target"] = self.target.name  # JSON carries the name
        out["grappler"] = list(self.grappler)
        out["overridden"] = list(self.overridden)
        return out


def recipe_dir() -> Traversable:
    """The folder of shipped recipes (`converters/`, as package data: `tflfuse.resources`)."""
    return data_dir("converters")


def available() -> list[str]:
    """Names of the shipped recipes."""
    return [name[: -len(".toml")] for name in data_names("converters", ".toml")]


def load(name_or_path: str | Path | Recipe) -> Recipe:
    """A shipped recipe by name (`edgetpu`), any recipe file (`my.toml`), or a Recipe (as is)."""
    if isinstance(name_or_path, Recipe):
        return name_or_path
    text = str(name_or_path)
    path: Path | Traversable = Path(text)
    if not (text.endswith(".toml") or Path(text).is_file()):
        path = recipe_dir() / f"{text}.toml"
        if not path.is_file():
            raise RecipeError(
                f"unknown recipe {text!r} (shipped: {', '.join(available()) or 'none'};"
                " or give a .toml file)"
            )
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"{path}: recipe file not found") from None
    except IsADirectoryError:
        raise RecipeError(f"{path}: is a folder, not a recipe file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"{path}: cannot read recipe: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{path}: not valid TOML: {exc}") from None
    return from_dict(raw, source=str(path))


def _flatten(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Recipe fields from the TOML layout; RecipeError for an unknown key or a misplaced table."""
    values: dict[str, Any] = {}
    for key, value in raw.items():
        spec = SCHEMA.get(key)
        if spec is None:
            raise RecipeError(f"{source}: unknown key {key!r} ({_suggest(key, list(SCHEMA))})")
        if isinstance(spec, dict):
            if not isinstance(value, dict):
                raise RecipeError(
                    f"{source}: {key} must be a table ([{key}] with {', '.join(spec)}),"
                    f" not {_describe(value)}"
                )
            for sub, sub_value in value.items():
                if sub not in spec:
                    raise RecipeError(
                        f"{source}: unknown key {key}.{sub!r} ({_suggest(sub, list(spec))})"
                    )
                values[spec[sub]] = sub_value
        elif isinstance(value, dict):
            raise RecipeError(f"{source}: {key} must be a value, not a table")
        else:
            values[spec] = value
    return values


def from_dict(raw: Mapping[str, object], source: str = "<recipe>") -> Recipe:
    """Build a Recipe from the TOML layout (top level + [quantization] [calibration] ...)."""
    values = _flatten(raw, source)
    values.setdefault("name", Path(source).stem)
    values.setdefault("delegate", values.get("target", Recipe.delegate))
    for name in ("scale", "offset"):
        if _is_kind(values.get(name), _NUMBER):
            values[name] = float(values[name])
    if isinstance(values.get("grappler"), list):
        values["grappler"] = tuple(values["grappler"])
    recipe = Recipe(**values, source=source)
    recipe.validate()
    return recipe
