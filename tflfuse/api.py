"""The Python API: `tflfuse.convert`, `tflfuse.optimize`, `tflfuse.check`, `tflfuse.bench`.

Each function checks its arguments first and raises `tflfuse.errors.TflfuseError` (one line,
naming the argument) for a bad one, before any heavy work; the CLI is a thin layer over the same
library functions. Nothing here imports TensorFlow until `convert` runs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tflfuse import targets
from tflfuse.convert import recipe as recipe_mod
from tflfuse.convert.optimize import OptimizeResult, check_options, optimize_bytes
from tflfuse.convert.pipeline import CalibrationSource, ConversionResult
from tflfuse.convert.pipeline import convert as convert_any
from tflfuse.convert.recipe import Recipe
from tflfuse.device.bench import run_benchmark
from tflfuse.errors import TflfuseError, UsageError
from tflfuse.files import atomic_write_bytes, same_file
from tflfuse.ir import Model, flatbuffer
from tflfuse.targets import Prediction, Target
from tflfuse.targets.runtimes import resolve

if TYPE_CHECKING:
    from tflfuse.device.bench import BenchResult

ModelSource = str | Path | bytes | bytearray  # a .tflite path or its bytes (`check`: or a Model)
COMPILER_VERSION = re.compile(r"\d+(\.\d+){0,2}")  # "16.0", "14.1", "16.0.384591198"


def check_compiler_exists(version: str, label: str) -> None:
    """A one-line error for an edgetpu_compiler newer than the newest there is (the table's,
    16.0: Coral's last release); older ones are predicted from the rows' `since`."""
    from tflfuse.targets.edgetpu.predict import compiler_version_key, default_compiler_version

    newest = default_compiler_version()
    if compiler_version_key(version) > compiler_version_key(newest):
        major, minor = compiler_version_key(newest)
        raise UsageError(
            f"{label} {version}: there is no such edgetpu_compiler (the newest is {major}.{minor})"
        )


def _integer(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UsageError(f"{name} must be an integer of at least {least}, not {value!r}")


def _seed(value: Any) -> None:
    """Seeds are 32-bit (numpy's RandomState, which the device-side bench uses, takes no more)."""
    _integer("seed", value, 0)
    if value > 2**32 - 1:
        raise UsageError(f"seed must be at most {2**32 - 1}, not {value!r}")


def _model_bytes(model: ModelSource, what: str = "model") -> tuple[bytes, str]:
    """(bytes, name for messages) of a path or bytes."""
    if isinstance(model, (bytes, bytearray)):
        return bytes(model), "<bytes>"
    if isinstance(model, (str, Path)):
        return flatbuffer.read_model_bytes(model), str(model)
    raise UsageError(f"{what} must be a .tflite path or its bytes, not {type(model).__name__}")


def convert(
    model: object,
    output_dir: str | Path,
    *,
    recipe: str | Path | Recipe = "xnnpack-int8",
    calibration: CalibrationSource = None,
    force: bool = False,
    seed: int = 0,
    batch: int = 1,
    allow_lambda: bool = False,
    channels_last: bool = False,
    progress: bool = True,
    notes: bool | None = None,
    verify: bool = True,
    disabled: Sequence[str] = (),
    accept_accuracy_loss: bool = False,
    **overrides: object,
) -> ConversionResult:
    """Convert a Keras model (object, .keras/.h5 file), a SavedModel folder, a tf.function or a
    float or int8 .tflite (a path or its bytes: a PyTorch export by litert-torch, an onnx2tf
    output, a vendor file) into `output_dir`: model.tflite (fused, for the recipe's target),
    model_unfused.tflite, model_stock.tflite, report.json and report.md, all three verified
    against the source.

    `recipe`: a shipped name (edgetpu, xnnpack-int8, cpu-float, gpu-fp16), a .toml file or a
    `tflfuse.convert.recipe.Recipe`; `overrides` replace its fields (quant_mode, input_type,
    output_type, target, level, samples, scale, offset). `calibration` (needed for int8): an array
    (N, H, W, C), a .npy/.npz file, a folder of images or a callable returning samples. An
    existing non-empty `output_dir` is refused unless `force` (then only the files of an earlier
    result go).
    `channels_last` gives a .tflite with NCHW inputs NHWC inputs instead (an interface change).
    `disabled` turns rules off (as `optimize`'s); `verify=False` skips the numeric checks.
    A fused model whose outputs carry nothing of the source's (top-1 agreement 0, or a centered
    cosine under 0.5 where the output varies by 4 int8 steps: `tflfuse.convert.usefulness`) is
    refused, nothing written, unless `accept_accuracy_loss`.
    `notes` prints the pipeline's one-line notes to stderr (default: when `progress`; the CLI
    keeps them under --json, which turns the progress bar off).
    Returns a `ConversionResult`: the three model paths and the report as a dict."""
    if output_dir is None or str(output_dir) == "":
        raise UsageError("output_dir is required")
    _seed(seed)
    _integer("batch", batch, 1)
    rec = recipe_mod.load(recipe)
    if overrides:
        rec = rec.override(None, **overrides)  # (only fields: `labels` is no override)
    return convert_any(
        model,
        recipe=rec,
        calibration=calibration,
        output_dir=Path(output_dir),
        seed=seed,
        batch=batch,
        allow_lambda=allow_lambda,
        progress=progress,
        quiet=not (progress if notes is None else notes),
        force=force,
        channels_last=channels_last,
        verify=verify,
        disabled=tuple(disabled),
        accept_accuracy_loss=bool(accept_accuracy_loss),
    )


def optimize(
    model: ModelSource,
    output: str | Path | None = None,
    *,
    target: Target | str = "xnnpack",
    level: int = 2,
    disabled: Sequence[str] = (),
    verify: bool = True,
    runtime: str | None = None,
    in_place: bool = False,
) -> OptimizeResult:
    """Fuse and simplify a .tflite (path or bytes) for `target` (xnnpack, edgetpu, gpu, cpu) at
    `level` (0: load and save, 1: safe fusions, 2: everything), without the rules named in
    `disabled`; the result is checked on seeded inputs against the input model unless `verify`
    is False (a mismatch raises VerificationError and nothing is written). `runtime` (e.g.
    "tflite-runtime==2.5.0") lowers the result to the op versions that interpreter release has,
    or refuses in one line (TflfuseError) when it cannot. Writes `output` when given;
    `output` may be the input file only with `in_place`. Returns an `OptimizeResult`: `.data`
    (the new .tflite bytes), `.before`/`.after` (op counts, activation bytes, cost), `.result`
    (rules fired, refusals with reasons), `.verification`."""
    found = check_options(level=level, target=target, disabled=disabled)  # the one look-up
    if runtime is not None:
        resolve(runtime)  # a bad name is refused before the model is read
    data, source = _model_bytes(model)
    if (
        output is not None
        and isinstance(model, (str, Path))
        and not in_place
        and same_file(Path(model), output)
    ):
        raise UsageError(f"{output}: output would overwrite the input model")
    result = optimize_bytes(
        data,
        level=level,
        target=found,
        disabled=tuple(disabled),
        verify=verify,
        source=source,
        runtime=runtime,
    )
    if output is not None:
        atomic_write_bytes(Path(output), result.data)
    return result


def check(
    model: ModelSource | Model,
    target: Target | str = "edgetpu",
    *,
    compiler_version: str | None = None,
    multiple_subgraphs: bool = False,
) -> Prediction:
    """Predict which ops of a .tflite (path, bytes or `tflfuse.ir.Model`) run on `target`
    (edgetpu, xnnpack, gpu) and which fall back to the CPU, with the reason for each. For the
    Edge TPU, `compiler_version` (e.g. "14.1") predicts an older edgetpu_compiler and
    `multiple_subgraphs` the compiler's mode that allows several Edge TPU segments. Returns a
    `Prediction`: `.ops` (index, op, target, status, reason), `.mapped`, `.cpu`, `.memory`,
    `.to_dict()`; `tflfuse.targets.format_prediction` prints it as the compiler's table."""
    checkable = targets.names(predicts=True)
    name = target.name if isinstance(target, Target) else target
    if name not in checkable:
        raise UsageError(f"target {target!r} unknown (choose from {', '.join(checkable)})")
    found = targets.target(name)  # the one look-up: below here, a Target
    compiled = found.compiler is not None
    if compiler_version is not None:
        if not compiled:
            raise UsageError(f"compiler_version is for target {_compiled_names()} only")
        if not isinstance(compiler_version, str) or not COMPILER_VERSION.fullmatch(
            compiler_version
        ):
            raise UsageError(f"compiler_version {compiler_version!r} is not a version (e.g. 14.1)")
        check_compiler_exists(compiler_version, "compiler_version")
    if not isinstance(model, Model):
        data, source = _model_bytes(model)
        model = flatbuffer.from_bytes(data, source)
    if multiple_subgraphs and not compiled:
        raise UsageError(f"multiple_subgraphs is for target {_compiled_names()} only")
    return targets.predict(model, found, compiler_version, multiple_subgraphs=multiple_subgraphs)


def _compiled_names() -> str:
    """The targets an ahead-of-time compiler maps, quoted: "'edgetpu'"."""
    return " or ".join(repr(name) for name in targets.names(compiled=True))


def bench(
    models: Sequence[str | Path],
    *,
    delegate: str = "xnnpack",
    runs: int = 100,
    warmup: int = 10,
    threads: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> BenchResult:
    """Time .tflite files interleaved (A B A B ...) under one delegate (xnnpack, none, ref,
    edgetpu[:DEVICE], gpu, external:PATH); the first model is the baseline. Returns the
    JSON-ready result: `protocol`, `environment`, `peak_rss_bytes` and per model `latency_ms`
    (p50/p90/p99, jitter, mean, std), `ratio_to_first`, op count, arena estimate, init and
    first-invoke times, and the raw `samples_ms`."""
    if isinstance(models, (str, Path)):
        raise UsageError("models must be a list of .tflite paths (the first is the baseline)")
    _seed(seed)
    return run_benchmark(
        list(models),
        delegate=delegate,
        runs=runs,
        warmup=warmup,
        threads=threads,
        seed=seed,
        progress=progress,
    )


__all__ = ["TflfuseError", "bench", "check", "convert", "optimize"]
