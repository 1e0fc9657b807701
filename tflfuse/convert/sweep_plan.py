"""A sweep plan (PLAN.toml) read into cells: models x recipes x option values.

    recipes = ["edgetpu", "xnnpack-int8"]      # shipped names or .toml files (beside the plan)
    channels_last = [false, true]              # option lists: every value is a cell
    size = [96, 160]                           # input sizes of example models
    timeout_s = 1800                           # per conversion
    bench_runs = 0                             # > 0: time stock and fused for p50 fused/stock

    [[model]]
    path = "yolo11n.tflite"                    # a file (or folder) beside the plan
    calib = "yolo11n.calib.npy"

    [[model]]
    example = "mobilenet_v2"                   # `tflfuse example NAME --size S` builds it
    seed = [0, 1]                              # a model's own option values replace the plan's

Option keys (a value or a list of values, at the top or per model): channels_last, size (example
models only), seed, samples, level, batch, quant; `recipes` may be given per model too. Each
cell is named MODEL.RECIPE[.OPTIONS] (options that differ from convert's defaults: `cl`,
`size96`, `seed1`) and keyed by the hash of everything its result depends on: the model's and
calibration's bytes, the recipe (a shipped one's file too), the options and tflfuse (its
version and the hash of its package's files). Every problem with a plan is one line naming it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tflfuse.convert import recipe as recipe_mod
from tflfuse.convert.sweep_cell import CellSpec, Payload, judge, run_limited
from tflfuse.errors import TflfuseError
from tflfuse.version import __version__

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# option -> (type, convert's default, the flag)
OPTIONS: dict[str, tuple[type, Any, str]] = {
    "channels_last": (bool, False, "--channels-last"),
    "size": (int, None, ""),
    "seed": (int, 0, "--seed"),
    "samples": (int, None, "--samples"),
    "level": (int, None, "--level"),
    "batch": (int, 1, "--batch"),
    "quant": (str, None, "--quant"),
}
_KINDS = {bool: "true or false", int: "an integer", str: "a string"}
PLAN_KEYS = {"recipes", "model", "timeout_s", "bench_runs", *OPTIONS}
MODEL_KEYS = {"path", "example", "calib", "name", "recipes", "timeout_s", *OPTIONS}


class PlanError(TflfuseError):
    """A plan that cannot be run, in one line naming the plan and the key."""


@dataclass
class Plan:
    """The cells in plan order and what they send: payloads by model name, recipe files by
    recipe name."""

    path: Path
    cells: list[CellSpec] = field(default_factory=list)
    models: dict[str, tuple[Payload, Payload | None]] = field(default_factory=dict)
    recipe_files: dict[str, Payload] = field(default_factory=dict)


def code_digest() -> str:
    """A hash of tflfuse's package files: a changed tflfuse is a changed cell."""
    root = Path(__file__).resolve().parents[1]  # the tflfuse package
    h = hashlib.sha256(__version__.encode())
    for p in sorted(root.rglob("*")):
        if p.suffix in (".py", ".toml", ".json") and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()[:16]


def _values(where: str, key: str, value: Any) -> list[Any]:
    kind = OPTIONS[key][0]
    values = value if isinstance(value, list) else [value]
    ok = all(isinstance(v, kind) and (kind is bool or not isinstance(v, bool)) for v in values)
    if not values or not ok:
        raise PlanError(f"{where}: {key} must be {_KINDS[kind]} or a list of them, not {value!r}")
    return values


def _read(plan_path: Path) -> dict[str, Any]:
    try:
        raw = tomllib.loads(plan_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{plan_path}: plan not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"{plan_path}: cannot read the plan: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"{plan_path}: not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - PLAN_KEYS)
    if unknown:
        raise PlanError(
            f"{plan_path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(PLAN_KEYS))})"
        )
    if not raw.get("model"):
        raise PlanError(f"{plan_path}: no [[model]] table")
    return raw


def _recipes(where: str, value: Any, base: Path, plan: Plan) -> list[str]:
    """The recipe names of a `recipes` list, each loaded (a bad one is refused now); a .toml's
    bytes go into plan.recipe_files under its name."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise PlanError(f"{where}: recipes must be a non-empty list of names, not {value!r}")
    for name in value:
        if name.endswith(".toml"):
            path = base / name
            try:
                recipe_mod.load(path)
            except TflfuseError as exc:
                raise PlanError(f"{where}: {exc}") from None
            plan.recipe_files[name] = Payload.read(path)
        else:
            try:
                recipe_mod.load(name)
            except TflfuseError as exc:
                raise PlanError(f"{where}: {exc}") from None
    return list(value)


def _recipe_digest(name: str, plan: Plan) -> str:
    if name in plan.recipe_files:
        return plan.recipe_files[name].digest()
    source = Path(str(recipe_mod.load(name).source))
    return hashlib.sha256(source.read_bytes()).hexdigest() if source.is_file() else name


def _input(where: str, base: Path, value: Any, what: str) -> Payload:
    if not isinstance(value, str) or not value:
        raise PlanError(f"{where}: {what} must be a path, not {value!r}")
    path = base / value
    if not path.exists():
        raise PlanError(f"{where}: {what} {path} not found")
    return Payload.read(path)


def _flags(options: dict[str, Any]) -> tuple[str, ...]:
    flags: list[str] = []
    for key, value in options.items():
        kind, default, flag = OPTIONS[key]
        if not flag or value == default:
            continue
        flags += [flag] if kind is bool else [flag, str(value)]
    return tuple(flags)


def cell_name(model: str, recipe: str, options: Mapping[str, object]) -> str:
    """MODEL.RECIPE[.OPTIONS]: the options that differ from convert's defaults."""
    parts = [model, Path(recipe).stem if recipe.endswith(".toml") else recipe]
    for key, value in options.items():
        if value == OPTIONS[key][1]:
            continue
        parts.append("cl" if key == "channels_last" else f"{key}{value}")
    return re.sub(r"[^\w.+-]", "_", ".".join(parts))


def cell_key(parts: Mapping[str, object]) -> str:
    """The hash of a cell's inputs (see the module docstring)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def load(plan_path: Path | str, out_dir: Path) -> Plan:
    """Read and check PLAN.toml; example models are built into out_dir/examples (once)."""
    plan_path = Path(plan_path)
    raw = _read(plan_path)
    plan, base = Plan(plan_path), plan_path.parent
    recipes = _recipes(f"{plan_path}", raw.get("recipes"), base, plan)
    common = {k: _values(str(plan_path), k, raw[k]) for k in OPTIONS if k in raw}
    limits = {"timeout_s": raw.get("timeout_s", 1800.0), "bench_runs": raw.get("bench_runs", 0)}
    _check_limits(str(plan_path), limits)
    code = code_digest()
    for i, table in enumerate(raw["model"]):
        where = f"{plan_path}: [[model]] {i + 1}"
        if not isinstance(table, dict):
            raise PlanError(f"{where}: not a table")
        _model_cells(where, table, base, plan, out_dir, recipes, common, limits, code)
    names = [c.name for c in plan.cells]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PlanError(f"{plan_path}: two cells named {twice[0]} (give the models a `name`)")
    return plan


def _check_limits(where: str, limits: dict[str, Any]) -> None:
    timeout, runs = limits["timeout_s"], limits["bench_runs"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise PlanError(f"{where}: timeout_s must be a positive number, not {timeout!r}")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 0:
        raise PlanError(f"{where}: bench_runs must be an integer of at least 0, not {runs!r}")


def _model_cells(
    where: str,
    table: dict[str, Any],
    base: Path,
    plan: Plan,
    out_dir: Path,
    recipes: list[str],
    common: dict[str, list[Any]],
    limits: dict[str, Any],
    code: str,
) -> None:
    """The cells of one [[model]] table, appended to plan.cells."""
    unknown = sorted(set(table) - MODEL_KEYS)
    if unknown:
        raise PlanError(
            f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(MODEL_KEYS))})"
        )
    if ("path" in table) == ("example" in table):
        raise PlanError(f"{where}: give either `path` or `example`")
    if "recipes" in table:
        recipes = _recipes(where, table["recipes"], base, plan)
    limits = {**limits, **{k: table[k] for k in ("timeout_s",) if k in table}}
    _check_limits(where, limits)
    axes = {**common, **{k: _values(where, k, table[k]) for k in OPTIONS if k in table}}
    example = table.get("example")
    if example is None and "size" in table:
        raise PlanError(f"{where}: size is for example models (a file has its own input size)")
    if example is None:
        axes.pop("size", None)
    name = table.get("name") or (example or Path(str(table["path"])).stem)
    calib = _input(where, base, table["calib"], "calib") if "calib" in table else None
    for values in itertools.product(*axes.values()):
        options = dict(zip(axes, values))
        source = name + (f".size{options['size']}" if "size" in options else "")
        made = _model_payloads(where, table, base, out_dir, options, calib)
        if plan.models.setdefault(source, made) != made:
            raise PlanError(f"{where}: another model is named {name!r} (give each a `name`)")
        model, given_calib = made
        for recipe in recipes:
            parts = {
                "model": model.digest(),
                "calib": given_calib.digest() if given_calib else None,
                "recipe": [recipe, _recipe_digest(recipe, plan)],
                "options": options,
                "bench_runs": limits["bench_runs"],
                "tflfuse": [__version__, code],
            }
            plan.cells.append(
                CellSpec(
                    name=cell_name(name, recipe, options),
                    model=name,
                    recipe=recipe,
                    options=options,
                    flags=_flags(options),
                    key=cell_key(parts),
                    timeout_s=float(limits["timeout_s"]),
                    bench_runs=int(limits["bench_runs"]),
                    payload=source,
                )
            )


def _model_payloads(
    where: str,
    table: dict[str, Any],
    base: Path,
    out_dir: Path,
    options: dict[str, Any],
    calib: Payload | None,
) -> tuple[Payload, Payload | None]:
    if "path" in table:
        return _input(where, base, table["path"], "path"), calib
    model, made_calib = build_example(where, str(table["example"]), options.get("size"), out_dir)
    return model, calib or made_calib


def build_example(
    where: str, name: str, size: int | None, out_dir: Path
) -> tuple[Payload, Payload]:
    """`tflfuse example NAME [--size S]` into out_dir/examples (kept: a rerun reuses it)."""
    folder = out_dir / "examples"
    stem = name + (f".size{size}" if size is not None else "")
    model, calib = folder / f"{stem}.keras", folder / f"{stem}.calib.npy"
    if not (model.is_file() and calib.is_file()):
        folder.mkdir(parents=True, exist_ok=True)
        argv = ["example", name, "-o", str(model.resolve()), "--calib", str(calib.resolve())]
        argv += ["--force"]  # our own folder: a half-built pair from an interrupted run is replaced
        argv += ["--size", str(size)] if size is not None else []
        run = run_limited(argv, folder, 1800)
        if run["exit"] != 0:
            model.unlink(missing_ok=True)
            calib.unlink(missing_ok=True)
            raise PlanError(f"{where}: example {name}: {judge(run, 1800)[1]}")
    return Payload.read(model), Payload.read(calib)
