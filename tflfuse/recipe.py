"""Conversion recipes: one TOML per target in `converters/` (or any file a user names).

A recipe says how `tflfuse convert` turns a model into a deployable .tflite for one target: the
rule pipeline, the quantization mode and I/O types, how calibration images are preprocessed, the
Grappler optimizers, and the delegate the result is checked against. Command-line flags override
single fields (`Recipe.override`). No TensorFlow here.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tflfuse.errors import TflfuseError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

QUANT_MODES = ("int8", "float16", "dynamic", "none")
IO_TYPES = ("float32", "int8", "uint8")
TARGETS = ("edgetpu", "xnnpack", "cpu", "gpu")
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


@dataclass(frozen=True)
class Recipe:
    """Every field a conversion needs; `converters/NAME.toml` fills it, flags override it."""

    name: str
    description: str = ""
    target: str = "xnnpack"
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
    source: str = ""
    overridden: tuple[str, ...] = field(default=())

    def override(self, **values: Any) -> Recipe:
        """A copy with the given fields replaced (None means 'keep the recipe's value')."""
        known = {f.name for f in fields(self)} - {"source", "overridden"}
        changes = {k: v for k, v in values.items() if v is not None}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TflfuseError(
                f"unknown recipe field {unknown[0]!r} (fields: {', '.join(sorted(known))})"
            )
        if "grappler" in changes:
            changes["grappler"] = tuple(changes["grappler"])
        out = replace(self, **changes, overridden=tuple(sorted({*self.overridden, *changes})))
        out.validate()
        return out

    def validate(self) -> None:
        where = self.source or self.name
        if self.quant_mode not in QUANT_MODES:
            raise TflfuseError(
                f"{where}: quantization mode {self.quant_mode!r} unknown "
                f"(choose from {', '.join(QUANT_MODES)})"
            )
        for kind in ("input_type", "output_type"):
            value = getattr(self, kind)
            if value not in IO_TYPES:
                raise TflfuseError(
                    f"{where}: {kind} {value!r} unknown (choose from {', '.join(IO_TYPES)})"
                )
            if value != "float32" and self.quant_mode != "int8":
                raise TflfuseError(
                    f"{where}: {kind} {value} needs quantization mode int8, not {self.quant_mode}"
                )
        if self.target not in TARGETS:
            raise TflfuseError(
                f"{where}: target {self.target!r} unknown (choose from {', '.join(TARGETS)})"
            )
        if self.select_tf_ops and self.target in ("edgetpu", "gpu"):
            raise TflfuseError(f"{where}: select_tf_ops is for CPU targets only, not {self.target}")
        bad = sorted(set(self.grappler) - set(GRAPPLER_OPTIMIZERS))
        if bad:
            raise TflfuseError(f"{where}: Grappler optimizer {bad[0]!r} unknown or not allowed")
        if self.samples < 1:
            raise TflfuseError(f"{where}: samples must be at least 1")
        if self.level not in (0, 1, 2):
            raise TflfuseError(f"{where}: level must be 0, 1 or 2")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["grappler"] = list(self.grappler)
        out["overridden"] = list(self.overridden)
        return out


def recipe_dir() -> Path:
    """The folder of shipped recipes: `converters/` beside the package (a checkout or editable
    install), else `tflfuse/data/converters/` (a wheel that packages them as data)."""
    here = Path(__file__).resolve().parent
    for folder in (here.parent / "converters", here / "data" / "converters"):
        if folder.is_dir():
            return folder
    return here.parent / "converters"


def available() -> list[str]:
    return sorted(p.stem for p in recipe_dir().glob("*.toml"))


def load(name_or_path: str | Path) -> Recipe:
    """A shipped recipe by name (`edgetpu`) or any recipe file (`my.toml`)."""
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith(".toml") or path.is_file()):
        path = recipe_dir() / f"{text}.toml"
        if not path.is_file():
            raise TflfuseError(
                f"unknown recipe {text!r} (shipped: {', '.join(available()) or 'none'};"
                " or give a .toml file)"
            )
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TflfuseError(f"{path}: recipe file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TflfuseError(f"{path}: cannot read recipe: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TflfuseError(f"{path}: not valid TOML: {exc}") from None
    return from_dict(raw, source=str(path))


def from_dict(raw: dict[str, Any], source: str = "<recipe>") -> Recipe:
    """Build a Recipe from the TOML layout (top level + [quantization] [calibration] ...)."""
    quant = raw.get("quantization", {})
    calib = raw.get("calibration", {})
    values: dict[str, Any] = {
        "name": raw.get("name", Path(source).stem),
        "description": raw.get("description", ""),
        "target": raw.get("target", "xnnpack"),
        "delegate": raw.get("delegate", raw.get("target", "xnnpack")),
        "level": raw.get("level", 2),
        "quant_mode": quant.get("mode", "int8"),
        "input_type": quant.get("input_type", "float32"),
        "output_type": quant.get("output_type", "float32"),
        "samples": quant.get("samples", 100),
        "scale": float(calib.get("scale", 2.0)),
        "offset": float(calib.get("offset", -1.0)),
        "grappler": tuple(raw.get("grappler", {}).get("optimizers", DEFAULT_GRAPPLER)),
        "select_tf_ops": bool(raw.get("converter", {}).get("select_tf_ops", False)),
        "source": source,
    }
    try:
        recipe = Recipe(**values)
    except TypeError as exc:
        raise TflfuseError(f"{source}: bad recipe: {exc}") from None
    recipe.validate()
    return recipe
