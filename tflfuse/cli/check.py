"""`tflfuse check MODEL`: where a model's ops run on a target (its prediction, for the Edge TPU
its compiler's modes side by side, or the compile beside it), and on which interpreter release.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tflfuse import targets
from tflfuse.api import COMPILER_VERSION, check_compiler_exists
from tflfuse.cli.common import emit_json
from tflfuse.errors import UsageError
from tflfuse.files import check_destination, check_input, same_file
from tflfuse.ir import flatbuffer
from tflfuse.targets import op_label, runtimes
from tflfuse.targets.edgetpu import overlay, twin_match
from tflfuse.targets.edgetpu import truth as edgetpu_truth
from tflfuse.targets.edgetpu.compiler_log import parse_log
from tflfuse.targets.edgetpu.modes import compare_modes, format_modes
from tflfuse.targets.registry import names as target_names

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


def run(args: argparse.Namespace) -> int:
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
        emit_json(payload, "-")
    else:
        if prediction is not None:
            print(targets.format_prediction(prediction, args.model))
        if modes is not None:
            print("\n".join(format_modes(modes, Path(args.model).name)))
        print(text)
    if args.overlay and prediction is not None:  # (--overlay needs --target: refused above)
        overlay.write(args.overlay, model, prediction)
        if not args.json:
            print(f"node data for Model Explorer: {args.overlay}")
    return 1 if runtime is not None and not payload.get("runtime_ok", True) else 0


def _compile_modes(model: Any, args: argparse.Namespace) -> Any:
    """The compiler's modes predicted side by side (`targets.edgetpu.modes`), for a model with
    something to map or a predicted refusal of the whole model ("Model not quantized"); None
    otherwise."""
    choice = compare_modes(model, args.compiler_version, args.num_segments)
    return choice if any(o.mapped for o in choice.outcomes) or choice.notes else None


def _compare_with_twin(model: Any, args: argparse.Namespace) -> int:
    """`check --twin`: the prediction in the mode the twin was compiled in, compared with it."""
    twin = flatbuffer.load(check_input(args.twin))
    why = twin_match.mismatch(model, twin)  # (a compile that mapped nothing matches, as such)
    if why is not None:
        raise UsageError(f"{args.twin}: not a compile of {args.model}: {why}")
    prediction, comparison = edgetpu_truth.compare_with_twin(model, twin, args.compiler_version)
    if args.json:
        emit_json({**prediction.to_dict(), "twin": comparison}, "-")
    else:
        print(targets.format_prediction(prediction, args.model))
        print(edgetpu_truth.format_twin_comparison(comparison, model))
    if args.overlay:
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
    if args.overlay is not None:
        raise UsageError(
            f"{path}: already compiled for the Edge TPU; --overlay needs the CPU model to"
            " place its ops"
        )
    summary: dict[str, Any] = edgetpu_truth.compiled_summary(model)
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
        emit_json(out, "-")
    else:
        print("\n".join(lines))
    return ok
