"""The command line's grammar: every command and its options, and nothing that runs them.

`tflfuse --help`, `--version` and device_scripts/compile_edgetpu.py (which asks whether this
tflfuse has `compile`) load only this, the standard library and the target registry: no NumPy,
no TensorFlow. What a command does is tflfuse/cli/COMMAND.py's `run(args)` (tflfuse.cli).
"""

from __future__ import annotations

import argparse
from typing import Any

from tflfuse.targets.registry import TARGETS
from tflfuse.targets.registry import names as target_names

JSON_TAKES_A_PATH = ("optimize", "bench", "compare")  # the commands that use _add_json_option


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


def _add_inspect(sub: Any) -> None:
    p = sub.add_parser("inspect", help="op table, counts, bytes and quantization of a .tflite")
    p.add_argument("model", help=".tflite file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


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


def _add_runtime_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runtime",
        metavar="PKG==VER",
        help="write only op versions this interpreter release has (e.g. tflite-runtime==2.5.0),"
        " rewriting where the function allows, else refuse",
    )


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
        " crossings, then one Edge TPU unless --num-segments N says N, then the fewest"
        " parameter bytes streamed per inference)",
    )
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")


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


ADDERS = (  # each declares one command (tflfuse/cli/COMMAND.py runs it)
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
