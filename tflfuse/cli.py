"""The `tflfuse` command. The only module that parses arguments.

Each subcommand is a pair: `_add_NAME(subparsers)` declares it, `_run_NAME(args)` does it by
calling library functions and printing. Errors the user can fix are `TflfuseError`s: printed as
one line `tflfuse: error: ...`, exit code 2, no traceback.

Each `_run_NAME` imports the machinery it needs when it runs, lazily on purpose: `tflfuse --help`,
`--version` and device_scripts/compile_edgetpu.py (which reads the parser) load none of it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

from tflfuse import quiet
from tflfuse.errors import TflfuseError, UsageError
from tflfuse.files import (
    Terminated,
    atomic_write_text,
    check_destination,
    check_input,
    same_file,
    shown,
    signals_raise,
)
from tflfuse.targets.registry import TARGETS
from tflfuse.targets.registry import names as target_names
from tflfuse.version import __version__


def _emit_json(payload: Any, destination: str | None) -> None:
    """Write JSON to stdout ('-') or atomically to a file."""
    text = json.dumps(payload, indent=2, default=_json_default) + "\n"
    if destination in (None, "-"):
        sys.stdout.write(text)
    else:
        atomic_write_text(Path(destination), text)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return str(value)


_JSON_TAKES_A_PATH = ("optimize", "bench", "compare")  # the commands that use _add_json_option


def _add_json_option(p: argparse.ArgumentParser, metavar: str, what: str) -> None:
    """`--json` alone prints JSON on stdout; `--json PATH` writes it to PATH (not a folder
    or a .tflite: those are the command's operands, see `_unswallowed`)."""
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar=metavar,
        help=f"write the {what} as JSON to {metavar} (or stdout without a path)",
    )


SEED_MAX = 2**32 - 1  # numpy's legacy seeding (and TensorFlow's) takes 32-bit seeds


def _seed(text: str) -> int:
    """An argparse type: an integer seed in [0, 2**32 - 1] (a one-line error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be between 0 and {SEED_MAX}, not {text}")
    return value


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _shape(t: dict | None) -> str:
    if t is None:
        return "-"
    mark = "c" if t.get("constant") else ""
    return f"{mark}{t['dtype'].lower()}{t['shape']}"


# -- inspect -------------------------------------------------------------------------------------
def _add_inspect(sub: Any) -> None:
    p = sub.add_parser("inspect", help="op table, counts, bytes and quantization of a .tflite")
    p.add_argument("model", help=".tflite file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    from tflfuse.ir import flatbuffer
    from tflfuse.ir.summary import model_summary

    summary = model_summary(flatbuffer.load(check_input(args.model)))
    if args.json:
        _emit_json({"model": args.model, **summary}, "-")
        return 0
    print(f"{args.model}")
    for g in summary["subgraphs"]:
        q = g["quantization"]
        print(
            f"\nsubgraph {g['index']} {g['name']!r}: {g['op_count']} ops,"
            f" {g['tensor_count']} tensors,"
            f" parameters {_fmt_bytes(g['parameter_bytes'])},"
            f" activations {_fmt_bytes(g['activation_bytes'])}, quantization {q['kind']}"
        )
        print(f"  {'#':>4}  {'op':<24} {'act':<6} {'inputs':<46} outputs")
        for row in g["ops"]:
            ins = ", ".join(_shape(t) for t in row["inputs"])
            outs = ", ".join(_shape(t) for t in row["outputs"])
            act = row.get("fused_activation", "")
            act = "" if act == "NONE" else act
            print(f"  {row['index']:>4}  {row['op']:<24} {act:<6} {ins:<46} {outs}")
        counts = ", ".join(f"{k} {v}" for k, v in g["op_counts"].items())
        print(f"  op counts: {counts}")
    return 0


# -- optimize ------------------------------------------------------------------------------------
def _add_optimize(sub: Any) -> None:
    p = sub.add_parser("optimize", help="fuse and simplify a .tflite for a target, verified")
    p.add_argument("model", help="input .tflite")
    p.add_argument("-o", "--output", required=True, help="output .tflite")
    p.add_argument(
        "--level",
        type=int,
        choices=(0, 1, 2),
        default=2,
        help="0: load and save only; 1: safe fusions; 2: everything (default)",
    )
    p.add_argument(
        "--target",
        default="xnnpack",
        choices=TARGETS,
        help="runtime the model is for (default xnnpack)",
    )
    p.add_argument(
        "--disable",
        action="append",
        default=[],
        metavar="RULE",
        help="turn one rule off (repeatable)",
    )
    p.add_argument(
        "--explain", action="store_true", help="list rules fired and refusals with reasons"
    )
    _add_json_option(p, "REPORT", "report")
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the numeric check (needed for models this host cannot run, e.g. custom ops)",
    )
    p.add_argument("--in-place", action="store_true", help="allow OUTPUT to be the input file")
    _add_runtime_option(p)
    p.set_defaults(func=_run_optimize)


def _add_runtime_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runtime",
        metavar="PKG==VER",
        help="write only op versions this interpreter release has (e.g. tflite-runtime==2.5.0),"
        " rewriting where the function allows, else refuse",
    )


def _run_optimize(args: argparse.Namespace) -> int:
    from tflfuse import api
    from tflfuse.rewrite import FLOAT_ONLY

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
        _emit_json(report, "-")
        return 0
    if args.json:
        _emit_json(report, args.json)
    b, a = result.before, result.after
    print(
        f"{dst}: {b['op_count']} -> {a['op_count']} ops, activations "
        f"{_fmt_bytes(b['activation_bytes'])} -> {_fmt_bytes(a['activation_bytes'])}"
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
    from tflfuse.convert.report import rewrites_checked

    line = rewrites_checked(v)
    if line:
        print(f"  {line}")


def _pass_lines(changes: dict[str, dict[str, int]]) -> list[str]:
    """'pass DeadCodeElimination removed 1 op (MAX_POOL_2D 1): <what the pass does>' for each
    whole-graph pass that changed the op list, so every removed op has a name beside it."""
    from tflfuse.rules import pipeline
    from tflfuse.targets import every

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


# -- check ---------------------------------------------------------------------------------------
def _add_check(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="which ops run on the Edge TPU / XNNPACK / GPU, and on which interpreter release",
    )
    p.add_argument("model", help=".tflite file")
    p.add_argument("--target", choices=target_names(predicts=True))
    p.add_argument(
        "--runtime",
        metavar="PKG==VER",
        help="check the op versions against an interpreter release (tflite-runtime==2.5.0,"
        " ai-edge-litert==2.3.0, tensorflow==2.21; exit status 1 when it cannot run the model);"
        " without it, the oldest release that runs it",
    )
    p.add_argument(
        "--compiler-version",
        metavar="V",
        help="with --target edgetpu: the edgetpu_compiler to predict, 16 (default) or an older one"
        " (15, 14.1)",
    )
    p.add_argument(
        "--multiple-subgraphs",
        action="store_true",
        help="with --target edgetpu: predict a compile that allows several Edge TPU subgraphs"
        " (edgetpu_compiler -a)",
    )
    p.add_argument(
        "--num-segments",
        type=int,
        metavar="N",
        help="with --target edgetpu: also predict edgetpu_compiler -n N (where it cuts the model"
        " into N pipelined segments, and what each maps)",
    )
    p.add_argument(
        "--twin",
        metavar="X_edgetpu.tflite",
        help="with --target edgetpu: the model compiled by edgetpu_compiler from MODEL; predict in"
        " the mode it was compiled in and compare",
    )
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")
    p.add_argument(
        "--overlay",
        metavar="FILE.json",
        help="also write the placement as Model Explorer node data"
        " (model-explorer MODEL --node_data_paths FILE.json)",
    )
    p.set_defaults(func=_run_check)


# `check` flags that describe an ahead-of-time compile (the Edge TPU's): meaningless without it
_COMPILER_FLAGS = {
    "--compiler-version": "compiler_version",
    "--multiple-subgraphs": "multiple_subgraphs",
    "--num-segments": "num_segments",
    "--twin": "twin",
}


def _compiled_choices() -> str:
    """The --target values an ahead-of-time compiler maps: "edgetpu"."""
    return " or ".join(target_names(compiled=True))


def _run_check(args: argparse.Namespace) -> int:
    from tflfuse import targets
    from tflfuse.api import COMPILER_VERSION, check_compiler_exists
    from tflfuse.ir import flatbuffer

    compiled = args.target in target_names(compiled=True)  # its compiler decides the mapping
    if args.num_segments is not None and args.num_segments < 2:
        raise UsageError("--num-segments must be at least 2")
    flags = (args.compiler_version, args.multiple_subgraphs, args.num_segments, args.twin)
    if not compiled and any(flags):
        given = [f for f, v in _COMPILER_FLAGS.items() if getattr(args, v)]
        if args.target is not None:
            raise UsageError(f"{' and '.join(given)}: for --target {_compiled_choices()} only")
        verb = "needs" if len(given) == 1 else "need"
        raise UsageError(f"{' and '.join(given)} {verb} --target {_compiled_choices()}")
    if args.compiler_version is not None:
        if not compiled:
            raise UsageError(f"--compiler-version is for --target {_compiled_choices()} only")
        if not COMPILER_VERSION.fullmatch(args.compiler_version):
            raise UsageError(
                f"--compiler-version {args.compiler_version!r} is not a version (e.g. 14.1, 16.0)"
            )
        check_compiler_exists(args.compiler_version, "--compiler-version")
    model_path = check_input(args.model)
    if args.overlay is not None:  # checked before any output: writes and prints nothing
        if args.target is None:
            raise UsageError("--overlay shows a target's placement: give --target")
        _check_overlay_destination(model_path, args.overlay)
    from tflfuse.targets import runtimes
    from tflfuse.targets.edgetpu import truth as edgetpu_truth

    runtime = runtimes.resolve(args.runtime) if args.runtime else None
    model = flatbuffer.load(model_path)
    delegate = args.target if compiled else None  # its delegate runs the compiled custom op
    text, payload = runtimes.describe(model, runtime, args.model, delegate)
    if compiled and edgetpu_truth.is_compiled(model):  # the Edge TPU: the one compiled target
        ok = _report_compiled(model, model_path, args, (text, payload) if runtime else None)
        return 0 if ok else 1
    if compiled and args.twin:
        return _compare_with_twin(model, args)
    prediction = None
    if args.target is not None:
        prediction = targets.predict(
            model,
            targets.target(args.target),  # the door: a name from --target, resolved once
            args.compiler_version,
            multiple_subgraphs=args.multiple_subgraphs,
        )
        payload = {**prediction.to_dict(), "runtime": payload}
        if runtime is not None:
            payload["runtime_ok"] = payload["runtime"]["runtime_ok"]
    modes = _compile_modes(model, args) if compiled else None
    if modes is not None:
        payload["compile_modes"] = modes.to_dict()
    if args.json:
        _emit_json(payload, "-")
    else:
        if prediction is not None:
            print(targets.format_prediction(prediction, args.model))
        if modes is not None:
            from tflfuse.targets.edgetpu.modes import format_modes

            print("\n".join(format_modes(modes, Path(args.model).name)))
        print(text)
    if args.overlay:
        from tflfuse.targets.edgetpu import overlay

        overlay.write(args.overlay, model, prediction)
        if not args.json:
            print(f"node data for Model Explorer: {args.overlay}")
    return 1 if runtime is not None and not payload.get("runtime_ok", True) else 0


def _compile_modes(model: Any, args: argparse.Namespace) -> Any:
    """The compiler's modes predicted side by side (`targets.edgetpu.modes`), for a model with
    something to map or a predicted refusal of the whole model ("Model not quantized"); None
    otherwise."""
    from tflfuse.targets.edgetpu.modes import compare_modes

    choice = compare_modes(model, args.compiler_version, args.num_segments)
    return choice if any(o.mapped for o in choice.outcomes) or choice.notes else None


def _compare_with_twin(model: Any, args: argparse.Namespace) -> int:
    """`check --twin`: the prediction in the mode the twin was compiled in, compared with it."""
    from tflfuse import targets
    from tflfuse.ir import flatbuffer
    from tflfuse.targets.edgetpu import truth as edgetpu_truth
    from tflfuse.targets.edgetpu import twin_match

    twin = flatbuffer.load(check_input(args.twin))
    why = twin_match.mismatch(model, twin)  # (a compile that mapped nothing matches, as such)
    if why is not None:
        raise UsageError(f"{args.twin}: not a compile of {args.model}: {why}")
    prediction, comparison = edgetpu_truth.compare_with_twin(model, twin, args.compiler_version)
    if args.json:
        _emit_json({**prediction.to_dict(), "twin": comparison}, "-")
    else:
        print(targets.format_prediction(prediction, args.model))
        print(edgetpu_truth.format_twin_comparison(comparison, model))
    if args.overlay:
        from tflfuse.targets.edgetpu import overlay

        overlay.write(args.overlay, model, prediction)
    return 0


def _check_overlay_destination(model: Path, out: str) -> None:
    check_destination(out, "--overlay output")
    if same_file(model, Path(out)):
        raise UsageError(f"{out}: --overlay would overwrite the model")


def _report_compiled(
    model: Any, path: Path, args: argparse.Namespace, runtime: tuple[str, dict] | None
) -> bool:
    """`check --target edgetpu` on a model edgetpu_compiler already compiled: there is nothing
    to predict. Say so, how it was compiled (`edgetpu_truth.compiled_summary`: mode, segments,
    the Edge TPU runtime it needs, the ops outside its segments) and, when its CPU model sits
    beside it (X.tflite beside X_edgetpu.tflite), the compiler's placement per op of that model
    (`edgetpu_truth.truth_of`). With `runtime` ((text, payload) of `runtimes.describe`), that
    verdict too; returns whether that runtime runs the model."""
    from tflfuse.ir import flatbuffer
    from tflfuse.targets import op_label
    from tflfuse.targets.edgetpu import truth as edgetpu_truth
    from tflfuse.targets.edgetpu.compiler_log import parse_log

    if args.overlay is not None:
        raise UsageError(
            f"{path}: already compiled for the Edge TPU; --overlay needs the CPU model to"
            " place its ops"
        )
    summary = edgetpu_truth.compiled_summary(model)
    segments = summary["segments"]
    suffix = edgetpu_truth.COMPILED_SUFFIX
    stem = path.name[: -len(".tflite")] if path.name.endswith(".tflite") else path.stem
    twin = path.with_name(stem[: -len(suffix)] + ".tflite")
    out: dict[str, Any] = {"model": str(path), "compiled": summary, "segments": segments}
    lines = [
        f"{path}: already compiled for the Edge TPU ({segments} Edge TPU subgraph"
        f"{'s' if segments != 1 else ''}); nothing to predict",
    ]
    if stem.endswith(suffix) and twin.is_file() and not same_file(twin, path):
        log_path = path.with_suffix(".log")
        log = parse_log(log_path.read_text(errors="replace")) if log_path.is_file() else None
        truth = edgetpu_truth.truth_of(flatbuffer.load(check_input(twin)), model, log)
        cpu = [truth.model.main.ops[i] for i in truth.cpu_ops]
        out.update(
            cpu_model=str(twin),
            total=truth.total,
            mapped=truth.mapped,
            cpu=len(truth.cpu_ops),
            cpu_ops=[{"index": i, "op": op_label(op)} for i, op in zip(truth.cpu_ops, cpu)],
        )
        if truth.compiler_version:
            out["compiler_version"] = truth.compiler_version
        lines.append(
            f"The compiler's placement of {twin.name}: {truth.mapped} of {truth.total}"
            f" operations on the Edge TPU, {len(truth.cpu_ops)} on the CPU"
        )
        lines += [f"  #{i:<4} {op_label(op)}" for i, op in zip(truth.cpu_ops, cpu)]
    else:
        outside = [str(o["op"]) for o in summary["cpu_ops"]]
        if outside:
            lines.append(f"Operations it runs on the CPU: {', '.join(outside)}")
        else:
            lines.append("Every operation runs on the Edge TPU")
    lines += edgetpu_truth.format_compiled(summary, str(path)).splitlines()[1:]
    ok = True
    if runtime is not None:
        text, payload = runtime
        ok = bool(payload.get("runtime_ok", True))
        out.update(runtime=payload, runtime_ok=ok)
        lines.append(text)
    if args.json:
        _emit_json(out, "-")
    else:
        print("\n".join(lines))
    return ok


# -- convert -------------------------------------------------------------------------------------
def _add_convert(sub: Any) -> None:
    p = sub.add_parser(
        "convert",
        help="Keras/SavedModel/.tflite -> fused, quantized .tflite + unfused and stock baselines"
        " + report",
    )
    p.add_argument(
        "model",
        help=".tflite (e.g. from litert-torch or onnx2tf), .keras or .h5 file (checked for code"
        " before loading), or a SavedModel folder (a TF graph that TensorFlow runs to load and"
        " convert it: code by nature, not checked)",
    )
    p.add_argument(
        "--recipe",
        default="xnnpack-int8",
        help="recipe name (edgetpu, xnnpack-int8, cpu-float, gpu-fp16) or a .toml file"
        " (default xnnpack-int8: full int8 for XNNPACK, int8 I/O)",
    )
    p.add_argument(
        "--calib",
        metavar="DATA",
        help="calibration data: .npy, .npz (FILE.npz:NAME picks one array) or image folder",
    )
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="output folder")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier tflfuse result in OUTDIR: only the files it wrote (as it wrote"
        " them); every other file there is kept",
    )
    p.add_argument("--seed", type=_seed, default=0, help="seed for sampling and checks (default 0)")
    p.add_argument("--batch", type=int, default=1, help="size a dynamic batch is pinned to")
    p.add_argument(
        "--allow-lambda",
        action="store_true",
        help="load files that carry code (Lambda layers, custom objects; trusted files only)."
        " A SavedModel folder is code by nature: convert only SavedModels you trust",
    )
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the numeric checks (the fused model, the baselines, --channels-last) for"
        " models this host cannot run; the report says what was not checked",
    )
    p.add_argument(
        "--disable",
        action="append",
        default=[],
        metavar="RULE",
        help="turn one rule off, float and int8 alike (repeatable)",
    )
    p.add_argument("--quant", choices=("int8", "float16", "dynamic", "none"), help="override mode")
    p.add_argument("--input-type", choices=("float32", "int8", "uint8"), help="override I/O type")
    p.add_argument("--output-type", choices=("float32", "int8", "uint8"), help="override I/O type")
    p.add_argument("--target", choices=TARGETS, help="override rules")
    p.add_argument("--level", type=int, choices=(0, 1, 2), help="override the rule level")
    p.add_argument("--samples", type=int, help="override the number of calibration samples")
    p.add_argument("--scale", type=float, help="image calibration: x / 255 * SCALE + OFFSET")
    p.add_argument("--offset", type=float, help="image calibration offset")
    p.add_argument(
        "--channels-last",
        action="store_true",
        help=".tflite with NCHW inputs (PyTorch exports): give the model NHWC inputs (and"
        " outputs) instead, dropping the layout TRANSPOSEs (an interface change)",
    )
    p.add_argument(
        "--accept-accuracy-loss",
        action="store_true",
        help="keep a fused model whose outputs carry nothing of the source's (top-1 agreement 0,"
        " or a centered cosine under 0.5 on an output that varies by 4 int8 steps), refused"
        " otherwise",
    )
    _add_runtime_option(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_run_convert)


# recipe field -> the flag that overrides it (recipe errors name the flag, not the file)
_RECIPE_FLAGS = {
    "quant_mode": "--quant",
    "input_type": "--input-type",
    "output_type": "--output-type",
    "target": "--target",
    "level": "--level",
    "samples": "--samples",
    "scale": "--scale",
    "offset": "--offset",
    "runtime": "--runtime",
}


def _recipe_from_args(args: argparse.Namespace) -> Any:
    """The recipe named by --recipe with the override flags applied (errors name the flag)."""
    from tflfuse.convert import recipe as recipe_mod

    overrides = {f: getattr(args, flag[2:].replace("-", "_")) for f, flag in _RECIPE_FLAGS.items()}
    return recipe_mod.load(args.recipe).override(labels=_RECIPE_FLAGS, **overrides)


def _run_convert(args: argparse.Namespace) -> int:
    from tflfuse import api

    if args.batch < 1:
        raise UsageError(f"--batch must be at least 1, not {args.batch}")
    if args.output == "":
        raise UsageError("-o: the output folder name is empty")
    recipe = _recipe_from_args(args)
    model = check_input(args.model, folder_ok=True)
    if args.calib is not None:
        from tflfuse.convert.calibration import split_pick

        check_input(split_pick(args.calib)[0], "calibration", folder_ok=True)
    result = api.convert(
        str(model),
        Path(args.output),
        recipe=recipe,
        calibration=args.calib,
        force=args.force,
        seed=args.seed,
        batch=args.batch,
        allow_lambda=args.allow_lambda,
        channels_last=args.channels_last,
        progress=not args.json,
        notes=True,  # the pipeline's notes go to stderr even under --json
        verify=not args.no_verify,
        disabled=tuple(args.disable),
        accept_accuracy_loss=args.accept_accuracy_loss,
    )
    r = result.report
    if args.json:  # (files of OUTDIR tflfuse did not write, and kept, under "kept")
        _emit_json({**r, "kept": result.kept} if result.kept else r, "-")
        return 0
    print(f"{result.output_dir}: recipe {r['recipe']['name']}, {r['quantization']['fused_route']}")
    for name, m in r["models"].items():
        a = r["agreement"][name]
        err = f"max abs error {a['max_abs']:.3g}" if a.get("verified") else "not verified"
        print(
            f"  {r['files'][name]:<22} {m['op_count']:>4} ops, activations"
            f" {_fmt_bytes(m['activation_bytes'])}, {m['quantization']}, {err}"
        )
    d = r["delegate_check"]
    if d.get("checked"):
        print(f"  {d['delegate']}: {d['mapped']} ops mapped, {d['cpu']} on the CPU")
    if r.get("runtime"):
        from tflfuse.convert.report import stock_on_runtime

        made_for = r["runtime"]["made_for"]
        print(f"  made for {made_for}: every op version the fused and unfused models need is there")
        print(f"  {stock_on_runtime(r)}")
    cut = r.get("edgetpu", {}).get("fused", {}).get("cut")
    if cut:
        print(f"  Edge TPU cut at op {cut['index']} {cut['op']}: {cut['reason']}")
    print(f"  report: {result.output_dir / 'report.md'}")
    if result.kept:
        print(f"  kept {len(result.kept)} files tflfuse did not write: {', '.join(result.kept)}")
    return 0


# -- bench ---------------------------------------------------------------------------------------
def _add_bench(sub: Any) -> None:
    p = sub.add_parser("bench", help="time models interleaved: percentiles, jitter, memory, ratios")
    p.add_argument("models", nargs="+", metavar="MODEL", help=".tflite files (first = baseline)")
    p.add_argument(
        "--delegate",
        default="xnnpack",
        help="xnnpack (default), none, ref, edgetpu[:DEVICE], gpu or external:PATH",
    )
    p.add_argument("--runs", type=int, default=100, help="timed rounds (default 100)")
    p.add_argument("--warmup", type=int, default=10, help="untimed rounds first (default 10)")
    p.add_argument("--threads", type=int, default=None, help="interpreter threads")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the random inputs")
    _add_json_option(p, "OUT", "result")
    p.add_argument("--plot", metavar="OUT.png", help="plot the latency distributions")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_bench)


def _run_bench(args: argparse.Namespace) -> int:
    from tflfuse.runtime.bench import check_arguments, format_table, plot_latencies, run_benchmark
    from tflfuse.runtime.interpreter import check_delegate_name

    # everything that could fail after the benchmark is checked before it
    check_arguments(runs=args.runs, warmup=args.warmup, threads=args.threads, prefix="--")
    check_delegate_name(args.delegate)
    for m in args.models:  # a FIFO or a device would block or never end (missing: bench says)
        if os.path.lexists(m):
            check_input(m)
    for flag, out in (("--json", args.json), ("--plot", args.plot)):
        if out is not None and out != "-":
            if any(same_file(Path(m), Path(out)) for m in args.models):
                raise UsageError(f"{out}: output would overwrite a model")
            check_destination(Path(out), f"{flag} output")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install 'tflfuse[plot]'")
    result = run_benchmark(
        args.models,
        delegate=args.delegate,
        runs=args.runs,
        warmup=args.warmup,
        threads=args.threads,
        seed=args.seed,
        progress=not args.no_progress,
    )
    if args.plot:
        plot_latencies(result, args.plot)
    if args.json == "-":
        _emit_json(result, "-")
        return 0
    if args.json:
        _emit_json(result, args.json)
    print(format_table(result))
    return 0


# -- compare -------------------------------------------------------------------------------------
def _add_compare(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="a conversion's unfused / stock / fused: ops, latency here, Edge TPU mapping, error",
    )
    p.add_argument("folder", help="the -o folder of tflfuse convert")
    p.add_argument(
        "--delegate", default="xnnpack", help="what times them: xnnpack (default), none, ref, ..."
    )
    p.add_argument("--runs", type=int, default=300, help="timed rounds (default 300)")
    p.add_argument("--warmup", type=int, default=10, help="untimed rounds first (default 10)")
    p.add_argument("--threads", type=int, default=None, help="interpreter threads")
    _add_json_option(p, "OUT", "comparison")
    p.add_argument("--plot", metavar="OUT.png", help="plot the three latency distributions")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_compare)


def _run_compare(args: argparse.Namespace) -> int:
    from tflfuse.convert.compare import compare, format_table, read_conversion
    from tflfuse.runtime.bench import check_arguments, plot_latencies
    from tflfuse.runtime.interpreter import check_delegate_name

    # everything that could fail after the benchmark is checked before it
    check_arguments(runs=args.runs, warmup=args.warmup, threads=args.threads, prefix="--")
    check_delegate_name(args.delegate)
    _, paths = read_conversion(args.folder)
    for flag, out in (("--json", args.json), ("--plot", args.plot)):
        if out and out != "-":
            if any(same_file(p, Path(out)) for p in paths.values()):
                raise UsageError(f"{out}: output would overwrite a model")
            check_destination(Path(out), f"{flag} output")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install 'tflfuse[plot]'")
    result = compare(
        args.folder,
        delegate=args.delegate,
        runs=args.runs,
        warmup=args.warmup,
        threads=args.threads,
        progress=not args.no_progress,
    )
    if args.plot:
        plot_latencies(result["benchmark"], args.plot)
    if args.json == "-":
        _emit_json(result, "-")
        return 0
    if args.json:
        _emit_json(result, args.json)
    print(format_table(result))
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


# -- compile -------------------------------------------------------------------------------------
def _add_compile(sub: Any) -> None:
    p = sub.add_parser("compile", help="run edgetpu_compiler and compare with the prediction")
    p.add_argument("model", help="quantized .tflite")
    compiled = target_names(compiled=True)
    p.add_argument("--target", default=compiled[0], choices=compiled)
    p.add_argument("-o", "--out-dir", help="where the compiled model and logs go (default: beside)")
    p.add_argument("--num-segments", type=int, metavar="N", help="split for N pipelined TPUs")
    p.add_argument("--search-delegate", action="store_true", help="compiler's delegate search")
    p.add_argument(
        "--multiple-subgraphs",
        action="store_true",
        help="let the compiler build several Edge TPU subgraphs (edgetpu_compiler -a)"
        " and compare with that prediction",
    )
    p.add_argument(
        "--mode",
        choices=("single", "multi", "auto"),
        help="one Edge TPU subgraph (single, the default), several (multi: -a), or the one"
        " `check` predicts best (auto: the most ops mapped, then the fewest CPU<->Edge TPU"
        " crossings)",
    )
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=_run_compile)


def _run_compile(args: argparse.Namespace) -> int:
    from tflfuse.targets.edgetpu import compiler as edgetpu_compiler

    result = edgetpu_compiler.compile_model(
        Path(args.model),
        Path(args.out_dir) if args.out_dir else None,
        num_segments=args.num_segments,
        search_delegate=args.search_delegate,
        multiple_subgraphs=args.multiple_subgraphs,
        mode=args.mode,
    )
    if args.json:
        _emit_json(result.to_dict(), "-")
    else:
        print(edgetpu_compiler.format_comparison(result))
    return 0


# -- example -------------------------------------------------------------------------------------
# the zoo's architectures (tflfuse.examples.zoo.BUILDERS; not imported here: it needs numpy)
EXAMPLES = (
    "digits_cnn",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "resnet_v2_style",
    "inception_style",
    "transformer_encoder",
    "ds_cnn",
    "yolo_style",
)
_UNSIZED = ("digits_cnn", "transformer_encoder", "ds_cnn")  # fixed input shapes
SIZE_MAX = 1024  # an image zoo model at 1024x1024 is already ~1 GiB of activations


def _add_example(sub: Any) -> None:
    p = sub.add_parser(
        "example", help="build an offline example Keras model (and calibration data) to try tflfuse"
    )
    p.add_argument(
        "name",
        choices=EXAMPLES,
        metavar="NAME",
        help=f"{', '.join(EXAMPLES)}: digits_cnn is trained on scikit-learn's digits (and also"
        " writes its held-out set to MODEL_test.npz), the others are Keras architectures with"
        " weights=None from seed 0",
    )
    p.add_argument("-o", "--output", required=True, help="where to save the model (.keras)")
    p.add_argument("--calib", metavar="NPY", help="also write calibration inputs to this .npy")
    p.add_argument(
        "--size",
        type=int,
        default=96,
        help=f"input size of the image zoo models (default 96, at most {SIZE_MAX})",
    )
    p.add_argument("--force", action="store_true", help="replace files that already exist")
    p.set_defaults(func=_run_example)


def _example_outputs(args: argparse.Namespace) -> dict[str, Path]:
    """{what: path} of the files `example` writes, checked before any work: a one-line error
    for a wrong suffix, a destination that cannot be written, or (without --force) a file
    that exists."""
    out = Path(args.output)
    if out.suffix != ".keras":
        raise UsageError(f"{out}: the example is saved as a .keras file")
    outputs = {"model": out}
    if args.calib:
        if Path(args.calib).suffix != ".npy":
            raise UsageError(f"{args.calib}: --calib writes a .npy file")
        outputs["calibration data"] = Path(args.calib)
    if args.name == "digits_cnn":
        outputs["held-out set"] = out.with_name(out.stem + "_test.npz")
    for what, path in outputs.items():
        check_destination(path, what)
        if not args.force and (path.exists() or path.is_symlink()):
            raise UsageError(f"{path}: exists (pass --force to replace it)")
    return outputs


def _run_example(args: argparse.Namespace) -> int:
    import numpy as np

    if args.name not in _UNSIZED and not 1 <= args.size <= SIZE_MAX:
        raise UsageError(f"--size must be between 1 and {SIZE_MAX}, not {args.size}")
    outputs = _example_outputs(args)
    out = outputs["model"]
    if args.name == "digits_cnn" and importlib.util.find_spec("sklearn") is None:
        raise UsageError(
            "example digits_cnn trains on scikit-learn's digits: pip install scikit-learn"
        )
    if args.name == "digits_cnn":
        from tflfuse.examples import digits

        split = digits.load_split()
        model = digits.train_cnn(split)
        calib = split.x_train
        test_npz = outputs["held-out set"]
        with test_npz.open("wb") as f:  # np.savez would add .npz to a name without it
            np.savez(f, x=split.x_test, y=split.y_test)
        acc = digits.accuracy(model.predict(split.x_test, verbose=0), split.y_test)
        print(f"trained on sklearn digits: test accuracy {acc:.3f}; held-out set in {test_npz}")
    else:
        model = _zoo_example(args.name, args.size)
        from tflfuse.examples import zoo

        calib = zoo.sample_inputs(tuple(model.input_shape[1:]), n=64, seed=3)
    model.save(out)
    print(f"{out}: {args.name}, input {list(model.input_shape)}")
    if args.calib:
        np.save(args.calib, calib)
        print(f"{args.calib}: {len(calib)} calibration samples")
    return 0


# -- sweep ---------------------------------------------------------------------------------------
def _add_sweep(sub: Any) -> None:
    p = sub.add_parser(
        "sweep", help="convert models x recipes x options (PLAN.toml) into one table, or on Ray"
    )
    p.add_argument("plan", help="PLAN.toml: recipes, option lists and [[model]] tables")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the sweep's folder")
    p.add_argument("--address", help="a Ray cluster (HOST:PORT) to run the cells on")
    p.add_argument("--resume", action="store_true", help="reuse DIR's cells whose inputs match")
    p.add_argument("--jobs", type=int, default=1, help="cells at once on this machine")
    p.add_argument(
        "--engine",
        choices=("auto", "ray", "pool"),
        default="auto",
        help="auto: Ray with --address, else a local pool; ray: Ray started here without --address",
    )
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=_run_sweep)


def _run_sweep(args: argparse.Namespace) -> int:
    from tflfuse.convert import sweep

    result = sweep.sweep(
        args.plan,
        args.output,
        address=args.address,
        resume=args.resume,
        jobs=args.jobs,
        engine=args.engine,
        progress=not args.json,
    )
    if args.json:
        _emit_json(result.rows, "-")
    else:
        print("\n".join(sweep.summary(result)))
    return 0


def _zoo_example(name: str, size: int) -> Any:
    """The zoo model, or a one-line error where Keras cannot build it at `size`."""
    from tflfuse.examples import zoo

    zoo.seed(0)  # weights=None: the same example on every run
    try:
        return zoo.build(name, **({} if name in _UNSIZED else {"input_size": size}))
    except ValueError as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--size {size}: {name} cannot be built that small ({why})") from None


# -- entry point ---------------------------------------------------------------------------------
_COMMANDS = (
    _add_inspect,
    _add_optimize,
    _add_check,
    _add_convert,
    _add_bench,
    _add_compare,
    _add_compile,
    _add_example,
    _add_sweep,
)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line like every other error (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"tflfuse: error: {message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tflfuse",
        description="Fused, quantized, target-aware TensorFlow Lite models for edge devices.",
    )
    parser.add_argument("--version", action="version", version=f"tflfuse {__version__}")
    verbose_help = "also show what TensorFlow, the converter and the interpreter print"
    parser.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
    for command in sub.choices.values():  # `tflfuse convert ... -v` works too
        command.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help
        )
    return parser


# Commands whose native code (the interpreter; TFLite's GPU analyzer) runs in a child process,
# so that a crash there is one line (tflfuse.isolation); convert isolates its own stages.
_ISOLATED = {
    "optimize": "the optimize command (the interpreter, verifying)",
    "bench": "the bench command (the interpreter)",
    "compare": "the compare command (the interpreter)",
    "check": "the check command",
}
BROKEN_PIPE = 128 + int(getattr(signal, "SIGPIPE", 13))  # what a shell shows for `... | head -1`


def _os_error_text(exc: OSError) -> str:
    """An OSError from the user's environment (a name too long, a full disk) as one line."""
    if exc.filename is not None:
        return f"{shown(exc.filename)}: {exc.strerror or exc}"
    return exc.strerror or str(exc)


def _run_command(args: argparse.Namespace) -> int:
    """The command. A reader that closes stdout early (`| head -1`) ends it quietly, as it ends
    any Unix tool; an OSError becomes one line."""
    try:
        return args.func(args)
    except BrokenPipeError:
        return BROKEN_PIPE
    except OSError as exc:
        raise TflfuseError(_os_error_text(exc)) from None


def _dispatch(args: argparse.Namespace) -> int:
    what = _ISOLATED.get(args.command)
    if what is None:
        return _run_command(args)
    from tflfuse import isolation

    def work() -> int:
        isolation.stage(what)
        return _run_command(args)

    subject = (
        getattr(args, "model", None)
        or getattr(args, "folder", None)
        or ", ".join(getattr(args, "models", []))
    )
    try:
        return isolation.run(work, what=subject)
    except BrokenPipeError:  # the child's output, written here, found the reader gone
        return BROKEN_PIPE


def _stdout_gone() -> None:
    """After a broken pipe: stdout to /dev/null, so the final flush at exit raises nothing."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _stdout_closed() -> bool:
    """`tflfuse ... >&-`: Python then has no sys.stdout, and fd 1 is free for the next file
    opened (C++ code writing to fd 1 would write into it)."""
    if sys.stdout is None:
        return True
    try:
        os.fstat(1)
    except OSError:
        return True
    return False


def _json_value_is_positional(value: str) -> bool:
    """`--json [OUT]` takes the word after it; an existing folder or .tflite file is the
    command's operand (`compare --json OUT_DIR`, `bench --json m.tflite`), never where JSON
    goes."""
    try:
        return os.path.isdir(value) or (value.lower().endswith(".tflite") and os.path.isfile(value))
    except (OSError, ValueError):  # (a NUL in the name: the command says so)
        return False


def _unswallowed(argv: list[str]) -> list[str]:
    """argv with `--json X` read as `--json` (stdout) and X where X is an operand."""
    out = list(argv)
    command = next((w for w in out if not w.startswith("-")), None)
    if command not in _JSON_TAKES_A_PATH:
        return out
    for i, word in enumerate(out[:-1]):
        if word == "--":
            break
        follows = out[i + 1]
        if word == "--json" and not follows.startswith("-") and _json_value_is_positional(follows):
            out[i] = "--json=-"
    return out


def main(argv: list[str] | None = None) -> int:
    if _stdout_closed():
        if sys.stderr is not None:
            print(
                "tflfuse: error: standard output is closed (send it to /dev/null instead)",
                file=sys.stderr,
            )
        return 2
    argv = _unswallowed(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    log = None
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(signals_raise())  # SIGTERM/SIGHUP unwind: temp files removed
            if not args.verbose:  # library chatter goes to a temp file (tflfuse.quiet)
                log = stack.enter_context(quiet.captured())
            code = _dispatch(args)
    except TflfuseError as exc:
        from tflfuse.isolation import NativeCrashError

        hint = " (-v shows what it printed)" if isinstance(exc, NativeCrashError) else ""
        _end_progress_line()
        print(f"tflfuse: error: {exc}{hint if not args.verbose else ''}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # outside a command's own work (e.g. a fork refused)
        print(f"tflfuse: error: {_os_error_text(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _end_progress_line()
        print("tflfuse: interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"tflfuse: terminated by signal {exc.signum}", file=sys.stderr)
        return 128 + exc.signum
    except Exception:  # a bug: what the libraries said may explain it, so show it first
        if log is not None and log.text():
            sys.stderr.write("tflfuse: library output before the failure:\n" + log.text())
        raise
    if code == BROKEN_PIPE:
        _stdout_gone()
    return code


def _end_progress_line() -> None:
    """On a terminal, clear a progress bar a crashed or interrupted step left on the line."""
    with contextlib.suppress(Exception):
        if sys.stderr.isatty():
            sys.stderr.write("\r\x1b[K")


if __name__ == "__main__":
    sys.exit(main())
